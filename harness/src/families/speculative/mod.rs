//! The speculative family: speculative decoding with draft trees (SpecInfer, Medusa, EAGLE-2 shapes).
//! Its check is tree attention (queries of tree nodes over the paged context and their own
//! paths) against f64; its experiments run the speculative driver end to end on a real model
//! against plain decoding in the same process.

use crate::family::{listed, one_of, ExpFamily, Family, VariantInfo};

/// `harness check --family speculative`: tree attention.
pub mod check;
/// `harness exp` for spec specs: the driver against plain decoding.
pub mod exp;

pub const FAMILY: Family = Family {
    name: "speculative",
    about: "speculative decoding: tree attention, and the draft-verify driver",
    variants,
    check: Some(check::check),
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| one_of("speculative", DRIVER, v),
        run: exp::run,
        render: exp::render,
        peers: false,
    }),
    cuda: &[kernel_speculative::cuda::SOURCE],
    replay: None,
};

/// The variant of spec experiments.
const DRIVER: &[kernel_common::VariantInfo] = &[kernel_common::VariantInfo::cpu(
    "driver",
    "the speculative decoding driver on a real model (draft, one tree-masked target pass, verify), against plain decoding; the variant of spec experiments",
)];

fn variants() -> Vec<VariantInfo> {
    let mut v = listed("speculative", kernel_speculative::VARIANTS);
    v.extend(listed("speculative", DRIVER));
    v
}

/// Grid keys a spec (speculative decoding) experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    (
        "model",
        "smollm2 (the fetched GGUF) | a checkpoint with a tokenizer (one value)",
    ),
    (
        "drafter",
        "ngram[:N] | suffix[:D] | self:FORMAT | self-layers:N | a preset or checkpoint",
    ),
    (
        "tree",
        "chain:K | static:B1,B2,... (in --set: static:B1/B2/...) | dynamic:N",
    ),
    ("temperature", "0 (greedy) or a sampling temperature"),
    ("prompt", "prose | code | repetitive"),
    ("max_new", "tokens generated per run (one value)"),
    (
        "adaptive",
        "off | on (threshold): adapt the draft depth to the running acceptance (70%) | cost: each round the depth with the most expected tokens per decode step (pass costs measured on the target)",
    ),
];
