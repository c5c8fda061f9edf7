//! Verification: greedy follows the target's argmax; stochastic verification is lossless.
//! One level: over many seeded draws of a root with k children the first emitted token is
//! distributed as the target's p (chi-square at p = 0.001) for sampled and deterministic
//! proposals, while a verifier told the wrong draft distribution fails the same test. Deep
//! trees (static 2,2,1 and EAGLE-2-style dynamic trees, sampled or deterministic, over a toy
//! language model whose target and draft depend on the last two tokens): the joint of the
//! first three emitted tokens, across as many rounds as it takes, is the target's
//! p(a)·p(b | a)·p(c | a, b) by a chi-square test over the 64 cells, and a verifier told the
//! drafts came from the target's own distribution fails the same test.

use kernel_common::inputs::rng;
use kernel_speculative::{verify_greedy, verify_stochastic, DraftTree, Proposal};
use kernel_test_support::stats::{chi_square, ChiSquare};
use rand::rngs::StdRng;
use rand::Rng;

const V: usize = 6;

/// One draw from the distribution `d`.
fn sample(r: &mut StdRng, d: &[f32]) -> u32 {
    let mut u: f32 = r.gen();
    for (i, &x) in d.iter().enumerate() {
        if u < x {
            return i as u32;
        }
        u -= x;
    }
    (d.len() - 1) as u32
}

fn probs(p: &[f32]) -> Vec<f64> {
    p.iter().map(|&x| x as f64).collect()
}

fn normalise(v: Vec<f32>) -> Vec<f32> {
    let s: f32 = v.iter().sum();
    v.into_iter().map(|x| x / s).collect()
}

/// Draws `n` verifications of a root with `k` children and returns the counts of the first
/// emitted token.
fn first_tokens(p: &[f32], q: &[f32], k: usize, mode: &str, n: usize, seed: u64) -> Vec<u64> {
    let mut r = rng(seed);
    let mut counts = vec![0u64; V];
    let mut top: Vec<usize> = (0..V).collect();
    top.sort_by(|&a, &b| q[b].total_cmp(&q[a]));
    for _ in 0..n {
        let mut tree = DraftTree::root();
        let mut tokens = vec![0u32];
        for &best in top.iter().take(k) {
            tree.push(0);
            tokens.push(match mode {
                "deterministic" => best as u32,
                _ => sample(&mut r, q),
            });
        }
        // Every node's target distribution is p (the first token only depends on the root's).
        let probs: Vec<f32> = (0..tree.len()).flat_map(|_| p.iter().copied()).collect();
        let proposal = match mode {
            "deterministic" => Proposal::Deterministic,
            "broken" => Proposal::Sampled(p.to_vec()), // claims the children came from p
            _ => Proposal::Sampled(q.to_vec()),
        };
        let proposals = vec![proposal; tree.len()];
        let v = verify_stochastic(&tree, &tokens, &probs, V, &proposals, &mut r);
        let first = match v.accepted.first() {
            Some(&c) => tokens[c],
            None => v.next_token,
        };
        counts[first as usize] += 1;
    }
    counts
}

#[test]
fn stochastic_verification_preserves_the_target_distribution() {
    let p = normalise(vec![0.30, 0.05, 0.25, 0.10, 0.20, 0.10]);
    let q = normalise(vec![0.05, 0.40, 0.10, 0.30, 0.05, 0.10]);
    for (mode, k) in [
        ("sampled", 3),
        ("sampled", 1),
        ("deterministic", 2),
        ("deterministic", 1),
    ] {
        let counts = first_tokens(&p, &q, k, mode, 40_000, 17);
        let fit = chi_square(&counts, &probs(&p));
        assert!(
            fit.p_value > 1e-3,
            "{mode} k={k}: {fit:?}, counts {counts:?}"
        );
    }
    let counts = first_tokens(&p, &q, 3, "broken", 40_000, 17);
    let fit = chi_square(&counts, &probs(&p));
    assert!(
        fit.p_value < 1e-9,
        "a verifier with the wrong q must fail: {fit:?}"
    );
}

#[test]
fn greedy_accepts_the_longest_matching_path() {
    // root → {1: a, 2: b}; 1 → {3: c}; 2 → {4: d}. Target argmax: after root b, after 2 d, after 4 e.
    let tree = DraftTree::from_parents(&[None, Some(0), Some(0), Some(1), Some(2)]).unwrap();
    let (a, b, c, d, e) = (1u32, 2, 3, 4, 5);
    let tokens = [0, a, b, c, d];
    let mut logits = vec![0.0f32; 5 * V];
    let want = [b, c, d, a, e];
    for (i, &w) in want.iter().enumerate() {
        logits[i * V + w as usize] = 1.0;
    }
    let v = verify_greedy(&tree, &tokens, &logits, V);
    assert_eq!(v.accepted, vec![2, 4]);
    assert_eq!(v.next_token, e);
    // Nothing matches: the target's token alone.
    logits[b as usize] = 0.0;
    logits[e as usize] = 2.0;
    let v = verify_greedy(&tree, &tokens, &logits, V);
    assert!(v.accepted.is_empty());
    assert_eq!(v.next_token, e);
}

/// Vocabulary of the deep-tree tests: 4³ = 64 cells for three tokens.
const W: usize = 4;

/// A toy language model: the next token's distribution given the last two tokens, from a
/// seeded table (every probability at least `floor` / W before normalising).
struct Toy(Vec<[f32; W]>);

impl Toy {
    fn new(seed: u64, floor: f32) -> Toy {
        let mut r = rng(seed);
        Toy((0..W * W)
            .map(|_| {
                let mut row = [0.0f32; W];
                for x in row.iter_mut() {
                    *x = r.gen_range(floor..1.0);
                }
                let s: f32 = row.iter().sum();
                row.map(|x| x / s)
            })
            .collect())
    }

    fn next(&self, ctx: &[u32]) -> [f32; W] {
        let n = ctx.len();
        self.0[ctx[n - 2] as usize * W + ctx[n - 1] as usize]
    }
}

/// How the tree is shaped and its children proposed.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// Each node at depth d gets branching[d] children, independent draws from q.
    Static(&'static [usize]),
    /// The same shape, children the most probable tokens of q (deterministic proposals).
    StaticTop(&'static [usize]),
    /// EAGLE-2 as the driver grows it: per level, the 4 frontier nodes of highest path
    /// probability get 2 sampled children each, within `budget` nodes and `depth` levels.
    Dynamic { budget: usize, depth: usize },
}

/// What the verifier is told the sampled children were drawn from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Told {
    /// The truth: q after the node's own path.
    Draft,
    /// Planted: the target's own p (every draft then looks perfect).
    Target,
    /// Planted: q after the root for every node — right at depth 1, wrong below, so a
    /// one-level test cannot see it.
    RootsQ,
}

/// One round: a tree drafted after `ctx` with `q`, scored with `p`, verified with the
/// proposals `told` says. Returns the emitted tokens (accepted path, then the target's own)
/// and the tree's height.
fn round(
    ctx: &[u32],
    shape: Shape,
    p: &Toy,
    q: &Toy,
    told: Told,
    r: &mut StdRng,
) -> (Vec<u32>, usize) {
    let mut tree = DraftTree::root();
    let mut tokens = vec![*ctx.last().expect("a context")];
    let mut contexts = vec![ctx.to_vec()];
    let mut proposals = vec![Proposal::Deterministic];
    // (node, path probability under q) of the last level.
    let mut frontier = vec![(0usize, 1.0f64)];
    let levels = match shape {
        Shape::Static(b) | Shape::StaticTop(b) => b.len(),
        Shape::Dynamic { depth, .. } => depth,
    };
    for level in 0..levels {
        let plan: Vec<(usize, usize)> = match shape {
            Shape::Static(b) | Shape::StaticTop(b) => {
                frontier.iter().map(|&(n, _)| (n, b[level])).collect()
            }
            Shape::Dynamic { budget, .. } => {
                let mut by_prob = frontier.clone();
                by_prob.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let mut left = budget - (tree.len() - 1);
                let mut plan = vec![];
                for (n, _) in by_prob.into_iter().take(4) {
                    let k = left.min(2);
                    if k == 0 {
                        break;
                    }
                    plan.push((n, k));
                    left -= k;
                }
                plan
            }
        };
        let mut next = vec![];
        for (node, k) in plan {
            let qd = q.next(&contexts[node]);
            let prob = frontier
                .iter()
                .find(|f| f.0 == node)
                .expect("a frontier node")
                .1;
            let kids: Vec<u32> = match shape {
                Shape::StaticTop(_) => {
                    let mut order: Vec<u32> = (0..W as u32).collect();
                    order.sort_by(|&a, &b| qd[b as usize].total_cmp(&qd[a as usize]));
                    order.truncate(k);
                    proposals[node] = Proposal::Deterministic;
                    order
                }
                _ => {
                    let said = match told {
                        Told::Draft => qd,
                        Told::Target => p.next(&contexts[node]),
                        Told::RootsQ => q.next(&contexts[0]),
                    };
                    proposals[node] = Proposal::Sampled(said.to_vec());
                    (0..k).map(|_| sample(r, &qd)).collect()
                }
            };
            for t in kids {
                let c = tree.push(node);
                let mut cc = contexts[node].clone();
                cc.push(t);
                tokens.push(t);
                contexts.push(cc);
                proposals.push(Proposal::Deterministic);
                next.push((c, prob * qd[t as usize] as f64));
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    let probs: Vec<f32> = contexts.iter().flat_map(|c| p.next(c)).collect();
    let v = verify_stochastic(&tree, &tokens, &probs, W, &proposals, r);
    let mut out: Vec<u32> = v.accepted.iter().map(|&n| tokens[n]).collect();
    out.push(v.next_token);
    (out, tree.height())
}

/// `n` speculative generations of three tokens after the context [0, 1]: the chi-square of
/// their joint against the target's, and the share of rounds that accepted two or more drafts.
fn three_token_fit(shape: Shape, told: Told, n: usize, seed: u64) -> (ChiSquare, f64) {
    let (p, q) = (Toy::new(101, 0.15), Toy::new(202, 0.15));
    let start = [0u32, 1];
    let mut expected = vec![0.0f64; W * W * W];
    let p1 = p.next(&start);
    for a in 0..W {
        let p2 = p.next(&[1, a as u32]);
        for b in 0..W {
            let p3 = p.next(&[a as u32, b as u32]);
            for c in 0..W {
                expected[(a * W + b) * W + c] = p1[a] as f64 * p2[b] as f64 * p3[c] as f64;
            }
        }
    }
    let mut r = rng(seed);
    let mut counts = vec![0u64; W * W * W];
    let (mut rounds, mut deep, mut height) = (0usize, 0usize, 0usize);
    for _ in 0..n {
        let mut ctx = start.to_vec();
        while ctx.len() < start.len() + 3 {
            let (emitted, h) = round(&ctx, shape, &p, &q, told, &mut r);
            rounds += 1;
            deep += (emitted.len() > 2) as usize;
            height = height.max(h);
            ctx.extend(emitted);
        }
        let t = &ctx[2..5];
        counts[(t[0] as usize * W + t[1] as usize) * W + t[2] as usize] += 1;
    }
    assert!(
        height >= 2,
        "{shape:?}: the trees must be at least two deep"
    );
    (chi_square(&counts, &expected), deep as f64 / rounds as f64)
}

#[test]
fn deep_trees_keep_the_joint_of_three_tokens_and_a_wrong_q_does_not() {
    let n = 40_000;
    for shape in [
        Shape::Static(&[2, 2, 1]),
        Shape::Dynamic {
            budget: 6,
            depth: 3,
        },
        Shape::StaticTop(&[2, 2, 1]),
    ] {
        let (fit, deep) = three_token_fit(shape, Told::Draft, n, 7);
        println!(
            "{shape:?}: chi2 {:.1} over {} dof, p = {:.3}; {:.0}% of rounds accepted 2+ drafts",
            fit.statistic,
            fit.dof,
            fit.p_value,
            100.0 * deep
        );
        assert!(fit.p_value > 1e-3, "{shape:?} is not lossless: {fit:?}");
        assert!(
            deep > 0.1,
            "{shape:?}: too few deep acceptances ({deep:.3})"
        );
    }
    // Planted bugs: the verifier told the wrong draft distribution.
    for told in [Told::Target, Told::RootsQ] {
        for shape in [
            Shape::Static(&[2, 2, 1]),
            Shape::Dynamic {
                budget: 6,
                depth: 3,
            },
        ] {
            let (fit, _) = three_token_fit(shape, told, n, 7);
            println!(
                "{shape:?} told {told:?} (planted): chi2 {:.1} over {} dof, p = {:.1e}",
                fit.statistic, fit.dof, fit.p_value
            );
            assert!(fit.p_value < 1e-9, "a wrong q must fail: {told:?} {fit:?}");
        }
    }
}
