//! The reference generation pipeline (placeholder crate): its module plan is in README.md;
//! the code arrives with the pipeline issue, on top of the attention and paged kernel crates.
