//! The workbench harness as a library, in three layers: the shared layer (specs, rows, run
//! files, rendering, timing, the roofline, provenance, the variant registry), the families
//! (`families/<name>/`: each family's check, experiment runner, tables and replay, listed in
//! one table), and the commands that dispatch through that table. `main.rs` is only the CLI.

// The shared layer: imports no family and no command.
/// Counting global allocator (peak scratch memory of a call).
pub mod alloc;
/// Atomic writes (temporary file, then rename) of the files under results/ not streamed.
pub mod atomic;
/// Case files (safetensors with a family and fixed tensor names) for `harness replay`.
pub mod case_file;
/// The jobs a family's replay preparation gives the replay command, and tensor helpers.
pub mod case_job;
/// What every family's check shares: options, the check row, the recording context.
pub mod checking;
/// The harness error type (one line, exit 2).
pub mod error;
/// The `Family` record and `VariantInfo`: what a family gives the harness.
pub mod family;
/// The load flags (--attention, --weights, --capacity, --matmul, --kv-cache): one parsing route.
pub mod load_flags;
/// Host, CPU, git and rustc facts for provenance.
pub mod machine;
/// The machine's load around a run (load average, other processes' CPU) for provenance.
pub mod machine_load;
/// Warm-up, cache flushing, repetitions and percentiles.
pub mod measure;
/// The memory guard: points whose estimated memory exceeds a budget are skipped.
pub mod mem_guard;
/// Models as experiments name them (`smollm2`, presets, paths) and speculative drafters.
pub mod model_source;
/// External peers (PyTorch SDPA, ...): manifests, the JSON-lines protocol, case files.
pub mod peer;
/// The JSON provenance beside every run's CSV.
pub mod provenance;
/// Perplexity runs with KL against a reference run; reference-logits files.
pub mod quality;
/// Variant lookup by spec string across the kernel crates' tables, and where a variant runs.
pub mod registry;
/// Markdown reports and SVG plots of a run, from its CSV.
pub mod render;
/// The paper: claims judged by declared rules against result CSVs, findings, machines.
pub mod report;
/// Read bandwidth and FMA peak of this machine (and a GPU's).
pub mod roofline;
/// Result rows: the shared head, a family's columns, the CSV writer and reader.
pub mod row;
/// The toolkit of every experiment runner: request, grid values, run files, progress.
pub mod run_files;
/// Experiment specs (TOML): parsing, validation against a family, `--quick` and `--set`.
pub mod spec;
/// Sweeps split into shards: point keys, shard assignment, resume, plans.
pub mod sweep;
/// The texts model quality is measured on (Debian's licences, this repository's sources,
/// the seeds), with their sha256.
pub mod texts;
/// Where the workspace is: the default experiments/ and results/ folders.
pub mod workspace;

// Above the shared layer: one folder per family, and the table of them.
/// The family table and one module per family.
pub mod families;

// The commands: look families up in the table.
/// `harness check`, `exp`, `plan`, `merge`, `render`, `replay`, `generate`, `eval`.
pub mod commands;

#[global_allocator]
static GLOBAL: alloc::CountingAlloc = alloc::CountingAlloc;

/// How a command prints its result on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

pub use families::cuda_sources;

/// ARCHITECTURE.md, whose worked examples are compiled and run as doctests so the files and
/// fields they name stay the real ones.
#[doc = include_str!("../../ARCHITECTURE.md")]
#[cfg(doctest)]
pub struct ArchitectureExamples;
