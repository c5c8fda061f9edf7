//! Speculative decoding end to end on the presets: greedy speculative output equals plain
//! greedy output token for token for every drafter (another preset, the target's own weights
//! in q8_0, n-gram lookup) and tree shape, adaptive or not; a tree pass scores each node as a
//! plain pass over its root-to-node path would; sampled speculation leaves the target's
//! distribution unchanged (chi-square on a vocabulary-8 preset: the first two tokens with a
//! one-level tree, the first three with trees two and three deep — static 2,2,1 and dynamic —
//! under top-k 3); bad configurations are errors. (The planted wrong draft distributions that
//! the same deep-tree test rejects are in `kernels/speculative/tests/verify.rs`.)

mod common;

use kernel_speculative::{DraftTree, TreeShape};
use kernel_test_support::stats::{chi_square, ChiSquare};
use models::speculative::draft::{Drafter, ModelDrafter, NgramDrafter};
use models::speculative::driver::{generate, generate_plain, SpecConfig};
use models::speculative::suffix::SuffixDrafter;
use models::{load, KvPools, Llama, LoadOptions, SamplerConfig, SeqChunk, Session};

fn model(name: &str, weights: Option<&str>) -> Llama {
    load(
        name,
        &LoadOptions {
            attention: "paged".into(),
            weights: weights.map(|w| kernel_quant::WeightFormat::parse(w).unwrap()),
            ..LoadOptions::default()
        },
    )
    .unwrap()
    .model
}

fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 1,
    }
}

fn cfg(shape: &str, adaptive: bool, sampler: SamplerConfig) -> SpecConfig {
    SpecConfig {
        shape: TreeShape::parse(shape).unwrap(),
        adaptive,
        threshold: 0.7,
        sampler,
        cost: None,
    }
}

#[test]
fn greedy_speculation_equals_plain_greedy() {
    let target = model("tiny-gqa", None);
    // A prompt that repeats itself, so n-gram lookup finds something.
    let base: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 512).collect();
    let prompt: Vec<u32> = base
        .iter()
        .chain(&base)
        .chain(&base[..6])
        .copied()
        .collect();
    let want = generate_plain(&target, &prompt, 40, None, greedy()).unwrap();
    let mut drafters: Vec<Box<dyn Drafter>> = vec![
        Box::new(ModelDrafter::new(model("tiny-mqa", None), "tiny-mqa", 256, greedy()).unwrap()),
        Box::new(
            ModelDrafter::new(model("tiny-gqa", Some("q8_0")), "self:q8_0", 256, greedy()).unwrap(),
        ),
        Box::new(NgramDrafter::new(3, 512)),
        Box::new(SuffixDrafter::new(8, 512)),
    ];
    for d in drafters.iter_mut() {
        for shape in ["chain:1", "chain:4", "static:3,2,1", "dynamic:12"] {
            for adaptive in [false, true] {
                let out = generate(
                    &target,
                    d.as_mut(),
                    &prompt,
                    40,
                    None,
                    &cfg(shape, adaptive, greedy()),
                )
                .unwrap();
                assert_eq!(out.tokens, want, "{} {shape} adaptive={adaptive}", d.name());
                assert!(out.stats.rounds >= 1 && out.stats.rounds <= 39);
            }
        }
    }
    // The cost-aware depth policy (measured pass costs on this machine) changes only how
    // deep each round drafts, never the output.
    let cost = models::speculative::cost::PassCost::measure(&target, 13, 16, 1).unwrap();
    assert_eq!(cost.steps.len(), 13);
    for d in drafters.iter_mut() {
        for shape in ["chain:4", "dynamic:12"] {
            let mut c = cfg(shape, true, greedy());
            c.cost = Some(cost.clone());
            let out = generate(&target, d.as_mut(), &prompt, 40, None, &c).unwrap();
            assert_eq!(out.tokens, want, "{} {shape} cost policy", d.name());
        }
    }
    // The target's own weights draft almost perfectly: most passes accept several tokens.
    let mut selfd =
        ModelDrafter::new(model("tiny-gqa", Some("q8_0")), "self", 256, greedy()).unwrap();
    let out = generate(
        &target,
        &mut selfd,
        &prompt,
        40,
        None,
        &cfg("chain:4", false, greedy()),
    )
    .unwrap();
    assert!(out.stats.acceptance_rate() > 0.8, "{:?}", out.stats);
    assert!(out.stats.tokens_per_pass() > 3.0);
}

#[test]
fn a_tree_pass_scores_each_path_like_a_plain_pass() {
    let m = model("tiny-moe", None);
    let prompt: Vec<u32> = (0..19).map(|i| (i * 53 + 1) % 512).collect();
    let tree = DraftTree::from_parents(&[
        None,
        Some(0),
        Some(0),
        Some(1),
        Some(1),
        Some(2),
        Some(3),
        Some(6),
    ])
    .unwrap();
    let tokens: Vec<u32> = vec![7, 100, 200, 300, 301, 400, 500, 511];
    let mut kv = KvPools::new(&m, 4, 16).unwrap();
    let table = [3u32, 0, 2, 1];
    let chunk = SeqChunk {
        tokens: &prompt,
        start: 0,
        table: &table,
        all_logits: false,
        verify: false,
        tree: None,
    };
    m.forward(&mut kv, &[chunk]).unwrap();
    let nodes: Vec<usize> = (0..tree.len()).collect();
    let tree_logits = m
        .forward(
            &mut kv,
            &[SeqChunk {
                tokens: &tokens,
                start: prompt.len(),
                table: &table,
                all_logits: true,
                verify: false,
                tree: Some(models::model::forward::TreeChunk {
                    tree: &tree,
                    nodes: &nodes,
                }),
            }],
        )
        .unwrap()
        .remove(0);
    for node in 0..tree.len() {
        let mut s = Session::new(&m, 64, 16).unwrap();
        s.forward(&prompt).unwrap();
        let path: Vec<u32> = tree.path_to(node).iter().map(|&n| tokens[n]).collect();
        let want = s.forward(&path).unwrap();
        let got = &tree_logits[node * 512..(node + 1) * 512];
        let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let err = want
            .iter()
            .zip(got)
            .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(err / scale < 1e-4, "node {node}: {err} / {scale}");
    }
}

/// `n` sampled speculative runs of `shape` on the micro presets (vocabulary 8, temperature 1,
/// `top_k`): the chi-square of the first `tokens` tokens' joint against the target's own
/// p(t1)·p(t2 | t1)·..., and how many runs accepted two drafts or more.
fn joint_fit(shape: &str, top_k: usize, tokens: usize, n: u64) -> (ChiSquare, usize) {
    let seed0 = SamplerConfig {
        temperature: 1.0,
        top_k,
        top_p: 1.0,
        seed: 0,
    };
    let mut drafter =
        ModelDrafter::new(model("micro-draft", None), "micro-draft", 64, seed0).unwrap();
    joint_fit_with(&mut drafter, shape, top_k, tokens, n)
}

/// `joint_fit` with any drafter.
fn joint_fit_with<D: Drafter + Send>(
    drafter: &mut D,
    shape: &str,
    top_k: usize,
    tokens: usize,
    n: u64,
) -> (ChiSquare, usize) {
    let target = model("micro", None);
    let prompt = [1u32, 5, 2, 7, 3];
    let t = |seed| SamplerConfig {
        temperature: 1.0,
        top_k,
        top_p: 1.0,
        seed,
    };
    let sampler = models::Sampler::new(t(0)).unwrap();
    // The target's joint over 8^tokens cells.
    let expected = common::target_joint(&target, &prompt, &sampler, tokens);
    let mut counts = vec![0u64; expected.len()];
    let mut deep = 0;
    // One thread: the test measures a distribution, and a spinning team on a busy machine
    // only makes it slower.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        for seed in 0..n {
            let out = generate(
                &target,
                drafter,
                &prompt,
                tokens,
                None,
                &cfg(shape, false, t(seed)),
            )
            .unwrap();
            counts[out.tokens.iter().fold(0, |c, &t| c * 8 + t as usize)] += 1;
            deep += (out.stats.accepted >= 2) as usize;
        }
    });
    (chi_square(&counts, &expected), deep)
}

#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    // The joint of the first two tokens; t2 comes out of verification (draft tree static:3).
    let (fit, _) = joint_fit("static:3", 0, 2, 6000);
    assert!(fit.p_value > 1e-3, "{fit:?}");
}

#[test]
fn sampled_speculation_through_deep_trees_keeps_the_joint_of_three_tokens() {
    // The driver's own trees (its children drawn independently from the drafter, dynamic
    // trees grown by path probability): the first three tokens, with top-k 3 so that 27
    // cells hold all the mass.
    for shape in ["static:2,2,1", "dynamic:6"] {
        let (fit, deep) = joint_fit(shape, 3, 3, 4000);
        println!(
            "{shape}: chi2 {:.1} over {} dof, p = {:.3}; {deep} of 4000 runs accepted 2 drafts",
            fit.statistic, fit.dof, fit.p_value
        );
        assert!(fit.p_value > 1e-3, "{shape}: {fit:?}");
        assert!(deep > 0, "{shape}: no run accepted two drafts in a row");
    }
}

#[test]
fn sampled_speculation_with_the_suffix_drafter_keeps_the_joint_of_three_tokens() {
    // Model-free candidates (no probabilities: the deterministic-proposal rejection rule)
    // from the suffix tree of the prompt and the sampled tokens: a sampled token that
    // occurred in the prompt gets its follower proposed, accepted or rejected by the rule.
    let mut d = SuffixDrafter::new(4, 8);
    for shape in ["chain:2", "static:2,2"] {
        let (fit, _) = joint_fit_with(&mut d, shape, 3, 3, 4000);
        println!(
            "suffix {shape}: chi2 {:.1} over {} dof, p = {:.3}",
            fit.statistic, fit.dof, fit.p_value
        );
        assert!(fit.p_value > 1e-3, "{shape}: {fit:?}");
    }
    // The rule was exercised: over the same runs, drafts were both accepted and rejected.
    let (mut accepted, mut rejected) = (0, 0);
    let target = model("micro", None);
    for seed in 0..400 {
        let sampler = SamplerConfig {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            seed,
        };
        let out = generate(
            &target,
            &mut d,
            &[1, 5, 2, 7, 3],
            3,
            None,
            &cfg("chain:2", false, sampler),
        )
        .unwrap();
        accepted += out.stats.accepted;
        rejected += out.stats.drafted_depth - out.stats.accepted;
    }
    assert!(
        accepted > 0 && rejected > 0,
        "{accepted} accepted, {rejected} rejected"
    );
}

#[test]
fn bad_speculation_requests_are_errors() {
    let target = model("tiny-gqa", None);
    let mut other = ModelDrafter::new(model("micro", None), "micro", 64, greedy()).unwrap();
    let e = generate(
        &target,
        &mut other,
        &[1, 2],
        4,
        None,
        &cfg("chain:2", false, greedy()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("vocabulary of 8"), "{e}");
    let mut ng = NgramDrafter::new(2, 512);
    let e = generate(
        &target,
        &mut ng,
        &[1, 2],
        2040,
        None,
        &cfg("chain:16", false, greedy()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("exceed the context"), "{e}");
    assert!(TreeShape::parse("static:2,0").is_err());
}

#[test]
fn one_drafter_serves_different_prompts() {
    // The draft cache keeps only the prefix a new sequence shares with what it holds.
    let target = model("tiny-gqa", None);
    let mut d =
        ModelDrafter::new(model("tiny-gqa", Some("q8_0")), "self:q8_0", 256, greedy()).unwrap();
    let a: Vec<u32> = (0..30).map(|i| (i * 37 + 5) % 512).collect();
    let mut b = a.clone();
    b[20] = 7; // shares 20 tokens with a
    let c: Vec<u32> = (0..9).map(|i| (i * 11 + 3) % 512).collect(); // shorter, shares nothing
                                                                    // c first and short, so a, longer, starts with a cache shorter than itself but holding c.
    for (prompt, n) in [(&c, 4), (&a, 24), (&b, 24), (&c, 24), (&a, 24)] {
        let want = generate_plain(&target, prompt, n, None, greedy()).unwrap();
        let out = generate(
            &target,
            &mut d,
            prompt,
            n,
            None,
            &cfg("chain:4", false, greedy()),
        )
        .unwrap();
        assert_eq!(out.tokens, want);
        assert!(out.stats.acceptance_rate() > 0.5, "{:?}", out.stats);
    }
}
