//! Equivalences of the generation pipeline on the random presets: greedy tokens do not depend
//! on the attention variant or the block size; a request's greedy output does not depend on
//! the requests batched with it (continuous, chunked, static, dynamic batching); preemption by
//! recompute and prefix sharing do not change outputs; a KV pool too small for the offered load
//! preempts instead of failing; under load (500 requests, 2-token blocks, a pool that holds a
//! few of them) no request is lost, every block's reference count matches the sequences
//! holding it at every step, every block comes back, and every output is the request's alone.

use models::{
    load, BatchingMode, Engine, Llama, LoadOptions, Request, SamplerConfig, SchedulerConfig,
};
use std::collections::BTreeMap;

fn model(name: &str, attention: &str) -> Llama {
    load(
        name,
        &LoadOptions {
            attention: attention.into(),
            ..LoadOptions::default()
        },
    )
    .unwrap()
    .model
}

const GREEDY: SamplerConfig = SamplerConfig {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    seed: 0,
};

/// Seeded prompts of different lengths; the first `shared` tokens of each are one system
/// prompt.
fn requests(n: usize, shared: usize, max_new: usize, spacing_s: f64) -> Vec<Request> {
    let system: Vec<u32> = (0..shared as u32).map(|i| (i * 37 + 11) % 512).collect();
    (0..n as u64)
        .map(|id| {
            let own = 3 + (id as usize * 7) % 29;
            let mut prompt = system.clone();
            prompt.extend((0..own as u32).map(|i| (i * 101 + id as u32 * 13 + 5) % 512));
            Request {
                id,
                prompt,
                max_new: max_new - (id as usize % 3),
                arrival: id as f64 * spacing_s,
                sampler: GREEDY,
                eos: None,
            }
        })
        .collect()
}

fn cfg(mode: BatchingMode, num_blocks: usize, block_size: usize, sharing: bool) -> SchedulerConfig {
    SchedulerConfig {
        mode,
        max_batch: 6,
        token_budget: 64,
        num_blocks,
        block_size,
        prefix_sharing: sharing,
    }
}

/// Runs `reqs` through an engine; returns generated ids by request and the preemption count.
fn serve(m: &Llama, c: SchedulerConfig, reqs: &[Request]) -> (BTreeMap<u64, Vec<u32>>, usize) {
    let mut e = Engine::new(m, c).unwrap();
    e.submit(reqs.to_vec()).unwrap();
    e.run(|_| {}).unwrap();
    assert_eq!(e.finished.len(), reqs.len());
    assert_eq!(
        e.blocks.free_blocks(),
        c.num_blocks,
        "every block comes back"
    );
    let out = e
        .finished
        .iter()
        .map(|f| (f.id, f.generated.clone()))
        .collect();
    (out, e.preemptions)
}

/// Each request alone through a batch-1 session.
fn alone(m: &Llama, reqs: &[Request]) -> BTreeMap<u64, Vec<u32>> {
    reqs.iter()
        .map(|r| (r.id, m.greedy(&r.prompt, r.max_new, None).unwrap()))
        .collect()
}

#[test]
fn attention_variants_and_block_sizes_agree() {
    let prompt: Vec<u32> = (0..40).map(|i| (i * 31 + 7) % 512).collect();
    for preset in ["tiny-gqa", "tiny-mqa", "tiny-mha", "tiny-moe"] {
        let want = model(preset, "naive").greedy(&prompt, 20, None).unwrap();
        for attention in ["flash2", "paged", "paged:split=auto"] {
            let m = model(preset, attention);
            for bs in [1, 3, 16, 64] {
                let got = m.greedy_with_blocks(&prompt, 20, None, bs).unwrap();
                assert_eq!(got, want, "{preset} {attention} block size {bs}");
            }
        }
    }
}

#[test]
fn outputs_do_not_depend_on_batch_mates() {
    for preset in ["tiny-gqa", "tiny-moe"] {
        let m = model(preset, "paged");
        let reqs = requests(9, 0, 12, 0.0005);
        let want = alone(&m, &reqs);
        for mode in [
            BatchingMode::Continuous {
                chunked_prefill: false,
            },
            BatchingMode::Continuous {
                chunked_prefill: true,
            },
            BatchingMode::Static,
            BatchingMode::Dynamic { window_s: 0.002 },
        ] {
            let (got, _) = serve(&m, cfg(mode, 256, 16, false), &reqs);
            assert_eq!(got, want, "{preset} {mode:?}");
        }
    }
}

#[test]
fn preemption_and_prefix_sharing_keep_outputs() {
    let m = model("tiny-gqa", "paged");
    let reqs = requests(8, 40, 24, 0.0);
    let want = alone(&m, &reqs);
    let continuous = BatchingMode::Continuous {
        chunked_prefill: true,
    };
    // 8 requests of up to ~95 tokens in 24 blocks of 8: the pool cannot hold them all.
    let (got, preempted) = serve(&m, cfg(continuous, 24, 8, false), &reqs);
    assert!(preempted > 0, "the small pool must preempt");
    assert_eq!(got, want, "preemption by recompute");
    let (got, _) = serve(&m, cfg(continuous, 256, 8, true), &reqs);
    assert_eq!(got, want, "prefix sharing");
    let (got, preempted) = serve(&m, cfg(continuous, 24, 8, true), &reqs);
    assert!(preempted > 0);
    assert_eq!(got, want, "prefix sharing with preemption");
}

#[test]
fn prefix_sharing_stores_the_system_prompt_once() {
    let m = model("tiny-gqa", "paged");
    let reqs = requests(6, 64, 4, 0.0);
    let peak = |sharing| {
        let mut e = Engine::new(&m, cfg(BatchingMode::Static, 256, 16, sharing)).unwrap();
        e.submit(reqs.clone()).unwrap();
        e.run(|_| {}).unwrap();
        e.steps.iter().map(|s| s.kv.blocks_used).max().unwrap()
    };
    let (with, without) = (peak(true), peak(false));
    // The first request stores the 4 system blocks; the other five reuse them.
    assert_eq!(without - with, 5 * 4, "with {with}, without {without}");
}

#[test]
fn bad_requests_are_errors() {
    let m = model("tiny-gqa", "paged");
    let mut e = Engine::new(&m, cfg(BatchingMode::Static, 4, 16, false)).unwrap();
    let mut r = requests(1, 0, 8, 0.0);
    r[0].max_new = 100;
    let err = e.submit(r.clone()).unwrap_err().to_string();
    assert!(err.contains("more than the 4 KV blocks"), "{err}");
    r[0].max_new = 3000;
    assert!(e
        .submit(r.clone())
        .unwrap_err()
        .to_string()
        .contains("context"));
    r[0].max_new = 4;
    r[0].prompt[0] = 512;
    assert!(e.submit(r).unwrap_err().to_string().contains("vocabulary"));
    assert!("dynamic:x".parse::<BatchingMode>().is_err());
}

#[test]
fn five_hundred_requests_through_tiny_blocks_and_preemption_lose_nothing() {
    // One thread: the test is about the scheduler's bookkeeping, and the tiny model's
    // per-step kernels only pay for a spinning team on a shared machine.
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(serve_five_hundred);
}

fn serve_five_hundred() {
    let m = model("tiny-gqa", "paged");
    // Prompts of 4 to 44 tokens, a third of them behind one 12-token system prompt, 3 to 10
    // new tokens, arriving 0.2 ms apart.
    let system: Vec<u32> = (0..12u32).map(|i| (i * 37 + 11) % 512).collect();
    let reqs: Vec<Request> = (0..500u64)
        .map(|id| {
            let own = 4 + (id as usize * 13) % 33;
            let mut prompt = if id % 3 == 0 { system.clone() } else { vec![] };
            prompt.extend((0..own as u32).map(|i| (i * 101 + id as u32 * 29 + 3) % 512));
            Request {
                id,
                prompt,
                max_new: 3 + (id as usize % 8),
                arrival: id as f64 * 0.0002,
                sampler: GREEDY,
                eos: None,
            }
        })
        .collect();
    let want = alone(&m, &reqs);
    for sharing in [false, true] {
        // 2-token blocks; 40 blocks hold about three requests of the 16 the batch admits.
        let c = SchedulerConfig {
            mode: BatchingMode::Continuous {
                chunked_prefill: true,
            },
            max_batch: 16,
            token_budget: 48,
            num_blocks: 40,
            block_size: 2,
            prefix_sharing: sharing,
        };
        let mut e = Engine::new(&m, c).unwrap();
        e.submit(reqs.clone()).unwrap();
        let mut steps = 0;
        e.run(|e| {
            steps += 1;
            // Conservation: each block's count is the number of sequences holding it, and a
            // block is free exactly when none does.
            let mut holders = vec![0u32; c.num_blocks];
            for r in &reqs {
                if let Some(s) = e.blocks.seq(r.id) {
                    for &b in &s.table {
                        holders[b as usize] += 1;
                    }
                }
            }
            for (b, &h) in holders.iter().enumerate() {
                assert_eq!(e.blocks.refs(b as u32), h, "block {b} at step {steps}");
            }
            let held = holders.iter().filter(|&&h| h > 0).count();
            assert_eq!(held + e.blocks.free_blocks(), c.num_blocks, "step {steps}");
        })
        .unwrap();
        let mut ids: Vec<u64> = e.finished.iter().map(|f| f.id).collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            (0..500).collect::<Vec<_>>(),
            "every request finishes, once"
        );
        assert_eq!(
            e.blocks.free_blocks(),
            c.num_blocks,
            "every block comes back"
        );
        assert!(reqs.iter().all(|r| e.blocks.seq(r.id).is_none()));
        let got: BTreeMap<u64, Vec<u32>> = e
            .finished
            .iter()
            .map(|f| (f.id, f.generated.clone()))
            .collect();
        for r in &reqs {
            assert_eq!(
                got[&r.id], want[&r.id],
                "request {} (sharing {sharing})",
                r.id
            );
        }
        let preempted = e.finished.iter().filter(|f| f.preemptions > 0).count();
        println!(
            "500 requests, sharing {sharing}: {steps} steps, {} preemptions over {preempted} requests",
            e.preemptions
        );
        assert!(
            e.preemptions >= 50,
            "the pool must force preemption: {}",
            e.preemptions
        );
    }
}
