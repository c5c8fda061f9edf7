//! `harness exp` for the kv_alloc family (claims C4, C5): contiguous vs paged KV allocation
//! under one fixed budget of token slots, simulated step by step by `models::serve::kvsim` on a seeded
//! ShareGPT-shaped workload (log-normal prompt and output lengths, all requests queued at once:
//! a saturated server), block size swept, with and without a shared system prompt and prefix
//! sharing. No model runs: the numbers are the allocators' arithmetic, exactly reproducible.

use crate::error::{HarnessError, Result};
use crate::family::{listed, one_of, ExpFamily, Family};
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::row::{Head, Row};
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use models::serve::kvsim::{simulate, Allocator, SimResult};
use models::serve::workload::Workload;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

pub const FAMILY: Family = Family {
    name: "kv_alloc",
    about: "KV-cache allocation simulated under a budget: contiguous vs paged, prefix sharing",
    variants: || listed("kv_alloc", VARIANTS),
    check: None,
    exp: Some(ExpFamily {
        grid_keys: GRID_KEYS,
        variant: |v| one_of("kv_alloc", VARIANTS, v),
        run,
        render,
        peers: false,
    }),
    cuda: &[],
    replay: None,
};

/// The variants of this family's experiments.
pub const VARIANTS: &[kernel_common::VariantInfo] = &[
    kernel_common::VariantInfo::cpu(
        "contiguous",
        "one max-length region per request (reserve prompt + max_new)",
    ),
    kernel_common::VariantInfo::cpu("paged", "blocks on demand from a shared pool"),
    kernel_common::VariantInfo::cpu(
        "paged+sharing",
        "paged, with the system prompt's blocks shared copy-on-write",
    ),
];

/// Grid keys a kv_alloc (allocation simulation) experiment understands.
pub const GRID_KEYS: &[(&str, &str)] = &[
    ("block_size", "paged block size in tokens (swept)"),
    (
        "system_prompt",
        "tokens of a system prompt shared by every request (swept)",
    ),
    ("budget_tokens", "KV slots of the budget (one value)"),
    (
        "max_new",
        "most output tokens per request; contiguous reserves prompt + this (swept)",
    ),
    ("requests", "requests queued at once"),
    ("prompt_mean", "mean prompt tokens (log-normal, sigma 1)"),
    ("output_mean", "mean output tokens (log-normal, sigma 1)"),
];

/// One allocator × block size × sharing × system prompt. Column names are stable.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct KvAllocCols {
    /// contiguous | paged | paged+sharing
    pub allocator: String,
    /// Paged block size; for contiguous the row repeats its one simulation as a reference.
    pub block_size: usize,
    pub system_prompt: usize,
    pub budget_tokens: usize,
    pub max_new: usize,
    pub requests: usize,
    pub prompt_mean: f64,
    pub output_mean: f64,
    pub steps: usize,
    pub mean_running: f64,
    pub max_running: usize,
    pub fragmentation_pct: f64,
    pub utilisation_pct: f64,
    /// Tokens held per physical slot filled (prefix sharing > 1).
    pub sharing_factor: f64,
    pub mean_latency_steps: f64,
    pub p99_latency_steps: f64,
    pub preemptions: usize,
    pub tokens_per_step: f64,
    /// tokens_per_step over the contiguous allocator's, same system prompt.
    pub throughput_vs_contiguous: f64,
}

/// A row: the shared head, these columns, the note.
pub type KvAllocRow = Row<KvAllocCols>;

/// Runs a kv_alloc experiment.
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, spec_path, grid, names) = (
        req.opts,
        req.spec,
        req.spec_path,
        req.grid.clone(),
        &req.names,
    );
    let g = GridValues(&grid);
    let block_sizes = g.counts("block_size", &["16"])?;
    let systems = g.parsed("system_prompt", &["0"], "a token count", |_: usize| true)?;
    let budget = g.one(
        "budget_tokens",
        "32768",
        "a positive integer",
        |n: usize| n > 0,
    )?;
    let max_news = g.counts("max_new", &["1024"])?;
    // max_new is a key of the point only when it is swept (older specs keep their keys).
    let swept_max_new = max_news.len() > 1;
    let requests = g.one("requests", "1000", "a positive integer", |n: usize| n > 0)?;
    let prompt_mean = g.one("prompt_mean", "161", "a mean ≥ 1", |x: f64| x >= 1.0)?;
    let output_mean = g.one("output_mean", "338", "a mean ≥ 1", |x: f64| x >= 1.0)?;
    let max_prompt = 4 * prompt_mean.ceil() as usize;
    for n in names {
        if !["contiguous", "paged", "paged+sharing"].contains(&n.as_str()) {
            return Err(HarnessError::Usage(format!(
                "kv_alloc variant '{n}' is not contiguous, paged or paged+sharing"
            )));
        }
    }
    // One request must fit with the paged allocator's 1% watermark and a block of rounding
    // per part to spare.
    let largest_block = block_sizes.iter().copied().max().unwrap_or(1);
    let largest_new = max_news.iter().copied().max().unwrap_or(1);
    if let Some(s) = systems
        .iter()
        .find(|&&s| (s + max_prompt + largest_new + 2 * largest_block) * 100 > budget * 98)
    {
        return Err(HarnessError::Usage(format!(
            "budget_tokens {budget} cannot hold one request of {s} + {max_prompt} + {largest_new} tokens with room to spare"
        )));
    }
    let mut run = RunFiles::start(opts, spec, spec_path, grid.clone())?;
    let bar = run.progress_bar(max_news.len() * systems.len() * names.len() * block_sizes.len());
    for (&max_new, &system) in max_news
        .iter()
        .flat_map(|m| systems.iter().map(move |s| (m, s)))
    {
        let key = |name: &str, bs: usize| {
            let mut parts: Vec<(&str, &dyn std::fmt::Display)> = vec![
                ("system_prompt", &system),
                ("allocator", &name),
                ("block_size", &bs),
            ];
            if swept_max_new {
                parts.push(("max_new", &max_new));
            }
            PointKey::of(&parts)
        };
        let mut keys = names
            .iter()
            .flat_map(|n| block_sizes.iter().map(move |&bs| (n, bs)));
        if !keys.any(|(n, bs)| run.owns(&key(n, bs))) {
            continue;
        }
        // The memory guard: the drawn prompts, the simulation's copy of each growing to
        // max_new more tokens, and the allocators' per-slot and per-block tables.
        let need = workload_bytes(requests, system + max_prompt, max_new, budget);
        if let Some(note) = opts.mem_budget.refuse(
            need,
            &format!(
                "{requests} requests of up to {} tokens",
                system + max_prompt + max_new
            ),
        ) {
            for name in names {
                for &bs in &block_sizes {
                    if !run.owns(&key(name, bs)) {
                        continue;
                    }
                    let row = Row::skipped(
                        run.head(name, opts.seed),
                        KvAllocCols {
                            allocator: name.clone(),
                            block_size: bs,
                            system_prompt: system,
                            budget_tokens: budget,
                            max_new,
                            requests,
                            prompt_mean,
                            output_mean,
                            ..KvAllocCols::default()
                        },
                        note.clone(),
                    );
                    run.write_point(&key(name, bs), [&row])?;
                    bar.inc(1);
                }
            }
            continue;
        }
        let w = Workload {
            requests,
            prompt_mean,
            output_mean,
            sigma: 1.0,
            max_new,
            system_prompt: system,
            max_prompt,
            rate: 0.0,
            vocab: 32000,
            seed: opts.seed,
        };
        let reqs = w.draw();
        let contiguous = simulate(&reqs, max_new, budget, Allocator::Contiguous);
        for name in names {
            for &bs in &block_sizes {
                if !run.owns(&key(name, bs)) {
                    continue;
                }
                let r: SimResult = match name.as_str() {
                    "contiguous" => contiguous,
                    n => simulate(
                        &reqs,
                        max_new,
                        budget,
                        Allocator::Paged {
                            block_size: bs,
                            sharing: n == "paged+sharing",
                        },
                    ),
                };
                let row = Row {
                    head: Head {
                        status: "ok".into(),
                        ..run.head(name, opts.seed)
                    },
                    cols: KvAllocCols {
                        allocator: name.clone(),
                        block_size: bs,
                        system_prompt: system,
                        budget_tokens: budget,
                        max_new,
                        requests,
                        prompt_mean,
                        output_mean,
                        steps: r.steps,
                        mean_running: r.mean_running,
                        max_running: r.max_running,
                        fragmentation_pct: r.fragmentation_pct,
                        utilisation_pct: r.utilisation_pct,
                        sharing_factor: r.sharing_factor,
                        mean_latency_steps: r.mean_latency_steps,
                        p99_latency_steps: r.p99_latency_steps,
                        preemptions: r.preemptions,
                        tokens_per_step: r.tokens_per_step,
                        throughput_vs_contiguous: r.tokens_per_step / contiguous.tokens_per_step,
                    },
                    note: String::new(),
                };
                run.write_point(&key(name, bs), [&row])?;
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, 0, render)
}

/// What one system-prompt setting's simulations hold at most: each request's drawn prompt
/// (u32 tokens) twice — the workload's and the simulation's copy, which grows by up to
/// `max_new` tokens — plus the allocators' tables, a few words per token slot.
fn workload_bytes(requests: usize, max_prompt: usize, max_new: usize, slots: usize) -> u64 {
    use crate::mem_guard::product;
    let per_request = product(&[max_prompt.saturating_mul(2).saturating_add(max_new), 4]) + 96;
    per_request
        .saturating_mul(requests as u64)
        .saturating_add(product(&[slots, 32]))
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<KvAllocCols>(spec, csv, prov, |_, rows| tables(rows))
}

/// The markdown table of a kv_alloc run.
pub fn tables(rows: &[KvAllocRow]) -> String {
    let mut md = String::from("## Allocation under one KV budget\n\n| allocator | block | max_new | system prompt | mean running | max running | fragmentation % | utilisation % | sharing × | mean / p99 latency (steps) | preemptions | throughput vs contiguous |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut seen = std::collections::BTreeSet::new();
    for r in rows {
        if r.allocator == "contiguous" && !seen.insert((r.system_prompt, r.max_new)) {
            continue; // the same simulation, repeated per block size for the plot
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {} | {:.1} | {:.1} | {:.2} | {:.0} / {:.0} | {} | {:.2}× |",
            r.allocator,
            if r.allocator == "contiguous" {
                "–".to_string()
            } else {
                r.block_size.to_string()
            },
            r.max_new,
            r.system_prompt,
            r.mean_running,
            r.max_running,
            r.fragmentation_pct,
            r.utilisation_pct,
            r.sharing_factor,
            r.mean_latency_steps,
            r.p99_latency_steps,
            r.preemptions,
            r.throughput_vs_contiguous
        );
    }
    md.push('\n');
    md
}
