//! Verification: greedy follows the target's argmax; stochastic verification is lossless —
//! over many seeded draws the first emitted token is distributed as the target's p (chi-square
//! at p = 0.001) for sampled, deterministic and chain proposals, while a verifier told the
//! wrong draft distribution fails the same test.

use kernel_common::inputs::rng;
use rand::Rng;
use spec_kernels::{verify_greedy, verify_stochastic, DraftTree, Proposal};

const V: usize = 6;

fn normalise(v: Vec<f32>) -> Vec<f32> {
    let s: f32 = v.iter().sum();
    v.into_iter().map(|x| x / s).collect()
}

/// Chi-square statistic of `counts` against probabilities `p`.
fn chi2(counts: &[usize], p: &[f32]) -> f64 {
    let n: usize = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .filter(|(_, &pi)| pi > 0.0)
        .map(|(&c, &pi)| {
            let e = n as f64 * pi as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// Draws `n` verifications of a root with `k` children (grandchildren too when `deep`) and
/// returns the counts of the first emitted token.
fn first_tokens(p: &[f32], q: &[f32], k: usize, mode: &str, n: usize, seed: u64) -> Vec<usize> {
    let mut r = rng(seed);
    let mut counts = vec![0usize; V];
    let draw = |r: &mut rand::rngs::StdRng, d: &[f32]| -> u32 {
        let mut u: f32 = r.gen();
        for (i, &x) in d.iter().enumerate() {
            if u < x {
                return i as u32;
            }
            u -= x;
        }
        (V - 1) as u32
    };
    let mut top: Vec<usize> = (0..V).collect();
    top.sort_by(|&a, &b| q[b].total_cmp(&q[a]));
    for _ in 0..n {
        let mut tree = DraftTree::root();
        let mut tokens = vec![0u32];
        for &best in top.iter().take(k) {
            tree.push(0);
            tokens.push(match mode {
                "deterministic" => best as u32,
                _ => draw(&mut r, q),
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
    // 5 degrees of freedom: P(chi2 > 20.5) = 0.001.
    for (mode, k) in [
        ("sampled", 3),
        ("sampled", 1),
        ("deterministic", 2),
        ("deterministic", 1),
    ] {
        let counts = first_tokens(&p, &q, k, mode, 40_000, 17);
        let x = chi2(&counts, &p);
        assert!(x < 20.5, "{mode} k={k}: chi2 {x:.1}, counts {counts:?}");
    }
    let counts = first_tokens(&p, &q, 3, "broken", 40_000, 17);
    let x = chi2(&counts, &p);
    assert!(
        x > 1000.0,
        "a verifier with the wrong q must fail: chi2 {x:.1}"
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
