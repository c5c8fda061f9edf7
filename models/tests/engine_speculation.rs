//! Speculative decoding inside the continuous-batching engine (`serve::speculate`): with
//! greedy sampling every request's output equals plain greedy decoding of it alone, for the
//! n-gram and suffix drafters, under decode-first and prefill-first budgets, with prefix
//! sharing and under a KV pool small enough to preempt; every block comes back. With sampling
//! the joint of a request's first three tokens keeps the target's distribution while its
//! drafts are verified in steps shared with other requests (chi-square on the vocabulary-8
//! preset).

mod common;

use kernel_test_support::stats::chi_square;
use models::serve::speculate::EngineSpeculation;
use models::speculative::chain::EngineSpec;
use models::{
    load, BatchingMode, Engine, Llama, LoadOptions, Request, SamplerConfig, SchedulerConfig,
};
use std::collections::BTreeMap;

fn model(name: &str) -> Llama {
    load(
        name,
        &LoadOptions {
            attention: "paged".into(),
            ..LoadOptions::default()
        },
    )
    .unwrap()
    .model
}

fn sampler(temperature: f32, top_k: usize, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p: 1.0,
        seed,
    }
}

fn spec(text: &str, vocab: usize) -> EngineSpeculation {
    EngineSpec::parse(text).unwrap().speculation(vocab)
}

/// Prompts that repeat themselves (so the drafters find matches), some sharing a prefix.
fn requests() -> Vec<Request> {
    (0..7u64)
        .map(|id| {
            let base: Vec<u32> = (0..5 + id as u32 * 2)
                .map(|i| (i * 37 + id as u32 * 11 + 5) % 500)
                .collect();
            let mut prompt: Vec<u32> = if id % 3 == 0 {
                (0..16).map(|i| (i * 7 + 1) % 500).collect() // a shared system prompt
            } else {
                vec![]
            };
            prompt.extend(base.iter().chain(&base).chain(&base[..3]));
            Request {
                id,
                prompt,
                max_new: 10 + 3 * id as usize,
                arrival: 0.0,
                sampler: sampler(0.0, 0, 0),
                eos: None,
            }
        })
        .collect()
}

#[test]
fn greedy_speculation_in_the_batch_equals_plain_greedy() {
    let m = model("tiny-gqa");
    let reqs = requests();
    let want: BTreeMap<u64, Vec<u32>> = reqs
        .iter()
        .map(|r| (r.id, m.greedy(&r.prompt, r.max_new, None).unwrap()))
        .collect();
    let cfg = |mode, num_blocks, block_size, prefix_sharing| SchedulerConfig {
        mode,
        max_batch: 4,
        token_budget: 48,
        num_blocks,
        block_size,
        prefix_sharing,
    };
    let continuous = BatchingMode::Continuous {
        chunked_prefill: false,
    };
    let mut preempted = false;
    for (c, drafter) in [
        (cfg(continuous, 128, 16, false), "ngram:3:k=4"),
        (cfg(continuous, 128, 16, false), "suffix:16:k=6"),
        (cfg(continuous, 128, 4, true), "suffix:k=3"),
        (
            cfg(BatchingMode::PrefillFirst, 128, 16, false),
            "ngram:2:k=8",
        ),
        // Blocks for about two requests at once: sequences are preempted and recomputed.
        (cfg(continuous, 24, 4, false), "ngram:k=4"),
        // SuffixDecoding's global tree: earlier requests' outputs draft later ones.
        (cfg(continuous, 24, 4, false), "suffix:8:k=4:global"),
        // With the paper's adaptive length (vLLM's defaults).
        (
            cfg(continuous, 128, 16, false),
            "suffix:8:k=8:global:factor=1:min_prob=0.1",
        ),
    ] {
        let e = common::serve(&m, c, Some(spec(drafter, m.cfg.vocab)), &reqs);
        let got: BTreeMap<u64, Vec<u32>> = e
            .finished
            .iter()
            .map(|f| (f.id, f.generated.clone()))
            .collect();
        assert_eq!(got, want, "{drafter} {c:?}");
        let st = e.spec_stats;
        assert!(
            st.accepted > 0 && st.drafted > st.accepted,
            "{drafter}: drafts both accepted and rejected: {st:?}"
        );
        for f in &e.finished {
            assert_eq!(f.token_times.len(), f.generated.len());
        }
        preempted |= e.preemptions > 0;
    }
    assert!(preempted, "the small pool preempts");
}

#[test]
fn bad_speculation_is_an_error() {
    let m = model("tiny-gqa");
    let c = SchedulerConfig {
        mode: BatchingMode::Continuous {
            chunked_prefill: false,
        },
        max_batch: 2,
        token_budget: 16,
        num_blocks: 16,
        block_size: 16,
        prefix_sharing: false,
    };
    let mut s = spec("ngram", m.cfg.vocab);
    s.max_draft = 0;
    let err = Engine::new(&m, c)
        .unwrap()
        .with_speculation(s)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("at least one draft token"),
        "{err}"
    );
}

/// Sampled speculation in the batch: 4000 requests of one prompt (seeds 0..4000, top-k 3 at
/// temperature 1, three tokens each) served 16 at a time with the suffix drafter's chains of
/// 2, with and without the global tree (which then drafts the most frequent of the earlier
/// requests' samples); the joint of the three tokens against the target's p(t1)·p(t2 | t1)·
/// p(t3 | t1 t2).
#[test]
fn sampled_speculation_in_the_batch_keeps_the_joint_of_three_tokens() {
    for drafter in ["suffix:4:k=2", "suffix:4:k=2:global"] {
        sampled_joint_with(drafter);
    }
}

fn sampled_joint_with(drafter: &str) {
    let target = model("micro");
    let prompt = [1u32, 5, 2, 7, 3];
    let probs = models::Sampler::new(sampler(1.0, 3, 0)).unwrap();
    let expected = common::target_joint(&target, &prompt, &probs, 3);
    let n = 4000u64;
    let reqs: Vec<Request> = (0..n)
        .map(|id| Request {
            id,
            prompt: prompt.to_vec(),
            max_new: 3,
            arrival: 0.0,
            sampler: sampler(1.0, 3, id),
            eos: None,
        })
        .collect();
    let c = SchedulerConfig {
        mode: BatchingMode::Continuous {
            chunked_prefill: false,
        },
        max_batch: 16,
        token_budget: 256,
        num_blocks: 64,
        block_size: 16,
        prefix_sharing: false,
    };
    // One thread: the test measures a distribution.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let e = pool.install(|| common::serve(&target, c, Some(spec(drafter, 8)), &reqs));
    let mut counts = vec![0u64; 512];
    for f in &e.finished {
        counts[f.generated.iter().fold(0, |c, &t| c * 8 + t as usize)] += 1;
    }
    let fit = chi_square(&counts, &expected);
    let st = e.spec_stats;
    println!(
        "engine {drafter}: chi2 {:.1} over {} dof, p = {:.3}; {st:?}",
        fit.statistic, fit.dof, fit.p_value
    );
    assert!(fit.p_value > 1e-3, "{drafter}: {fit:?}");
    assert!(
        st.accepted > 100 && st.drafted > st.accepted + 100,
        "{drafter}: the rule was exercised both ways: {st:?}"
    );
}
