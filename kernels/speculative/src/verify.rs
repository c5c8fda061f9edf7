//! Verification of a scored draft tree.
//!
//! Greedy: from the root, follow the child whose token equals the target's argmax at the
//! current node, while one exists; the accepted path, then the target's argmax at its end
//! (the token the target produces anyway) — the output equals plain greedy decoding.
//!
//! Stochastic, lossless (Leviathan et al. 2023 for one child; SpecInfer's multi-step
//! speculative sampling for several): at node u with target distribution p, try the children
//! in order; a child with token x proposed from draft distribution q is accepted with
//! probability min(1, p(x)/q(x)); on rejection p becomes norm(max(p − q, 0)) and the next child
//! is tried; if every child is rejected the next token is drawn from the residual p, and
//! verification stops. Children must be independent draws from q (or deterministic proposals,
//! q = a point mass on x, whose residual is p with x removed). The emitted tokens are then
//! distributed exactly as the target's.

use crate::tree::DraftTree;
use kernel_common::inputs::pick;
use rand::Rng;

/// What a node's children were proposed from.
#[derive(Debug, Clone, PartialEq)]
pub enum Proposal {
    /// Independent draws from this distribution over the vocabulary.
    Sampled(Vec<f32>),
    /// Chosen without sampling (top-k of a draft, n-gram lookup): each a point mass.
    Deterministic,
}

/// The outcome: accepted draft nodes (root excluded, root to leaf order) and the token the
/// target adds after them.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub accepted: Vec<usize>,
    pub next_token: u32,
}

fn argmax(row: &[f32]) -> u32 {
    row.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i as u32)
}

/// Greedy verification; `tokens[i]` is node i's token, `logits` is nodes × vocab.
pub fn verify_greedy(tree: &DraftTree, tokens: &[u32], logits: &[f32], vocab: usize) -> Verdict {
    let mut at = 0;
    let mut accepted = vec![];
    loop {
        let want = argmax(&logits[at * vocab..(at + 1) * vocab]);
        match tree.children(at).into_iter().find(|&c| tokens[c] == want) {
            Some(c) => {
                accepted.push(c);
                at = c;
            }
            None => {
                return Verdict {
                    accepted,
                    next_token: want,
                }
            }
        }
    }
}

/// One draw from `p`, which need not be normalised (a residual).
fn draw(p: &[f32], rng: &mut impl Rng) -> u32 {
    let total: f64 = p.iter().map(|&x| x as f64).sum();
    pick(p, rng.gen::<f64>() * total) as u32
}

/// Lossless stochastic verification. `probs` is nodes × vocab: the target's distribution
/// after each node (temperature, top-k, top-p applied); `proposals[i]` says how node i's
/// children were drawn.
pub fn verify_stochastic(
    tree: &DraftTree,
    tokens: &[u32],
    probs: &[f32],
    vocab: usize,
    proposals: &[Proposal],
    rng: &mut impl Rng,
) -> Verdict {
    let mut at = 0;
    let mut accepted = vec![];
    loop {
        let mut p: Vec<f32> = probs[at * vocab..(at + 1) * vocab].to_vec();
        let mut next = None;
        for c in tree.children(at) {
            let x = tokens[c] as usize;
            let (px, qx) = match &proposals[at] {
                Proposal::Sampled(q) => (p[x], q[x]),
                Proposal::Deterministic => (p[x], 1.0),
            };
            let total: f32 = p.iter().sum();
            // p may be an unnormalised residual: compare its normalised mass.
            let ratio = if qx > 0.0 { px / total / qx } else { 0.0 };
            if rng.gen::<f32>() < ratio.min(1.0) {
                next = Some(c);
                break;
            }
            match &proposals[at] {
                Proposal::Sampled(q) => {
                    for (pi, qi) in p.iter_mut().zip(q) {
                        *pi = (*pi / total - qi).max(0.0);
                    }
                }
                Proposal::Deterministic => p[x] = 0.0,
            }
            if p.iter().all(|&v| v <= 0.0) {
                // Only possible through rounding: p ≤ q everywhere means p = q was accepted.
                p = probs[at * vocab..(at + 1) * vocab].to_vec();
            }
        }
        match next {
            Some(c) => {
                accepted.push(c);
                at = c;
            }
            None => {
                return Verdict {
                    accepted,
                    next_token: draw(&p, rng),
                }
            }
        }
    }
}
