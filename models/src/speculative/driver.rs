//! Speculative decoding (Leviathan et al. 2023; trees as in SpecInfer and Medusa, dynamic
//! trees as in EAGLE-2): a drafter proposes a tree of tokens after the last produced token
//! (the root), the target scores every node in one tree-masked pass over its paged KV cache,
//! verification keeps the longest acceptable path plus one token of the target's own, the
//! accepted nodes' K/V are moved into place and the rest are dropped (NaN-poisoned until later
//! tokens overwrite them, so a leak would show). Greedy verification reproduces plain greedy decoding; stochastic
//! verification (multi-candidate rejection sampling) reproduces the target's distribution.
//! Adaptive depth: the draft depth shrinks while the running acceptance rate is under a
//! threshold (C21: 70%) and grows while above; or, with measured pass costs (`cost`), each
//! round takes the depth with the most expected tokens per decode step.

use crate::model::forward::{SeqChunk, TreeChunk};
use crate::model::kv::KvPools;
use crate::model::llama::{argmax, Llama, Result};
use crate::serve::sampler::{Sampler, SamplerConfig};
use crate::speculative::cost::PassCost;
use crate::speculative::draft::{DraftDist, Drafter};
use kernel_common::inputs::pick;
use kernel_common::KernelError;
use kernel_speculative::{verify_greedy, verify_stochastic, DraftTree, Proposal, TreeShape};
use std::time::Instant;

/// How the driver drafts.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    pub shape: TreeShape,
    pub adaptive: bool,
    /// Acceptance rate under which the depth shrinks (over it, it grows).
    pub threshold: f64,
    pub sampler: SamplerConfig,
    /// With `adaptive`: pick each round's depth from these measured pass costs, the running
    /// acceptance and the drafter's measured time (`cost::PassCost::best_depth`) instead of
    /// the threshold rule.
    pub cost: Option<PassCost>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    /// Target passes after the prompt (rounds).
    pub rounds: usize,
    /// Draft tokens proposed along the deepest path, summed over rounds.
    pub drafted_depth: usize,
    /// Draft tokens accepted, summed.
    pub accepted: usize,
    /// Tree nodes scored by the target (root included), summed.
    pub nodes_scored: usize,
    pub prefill_s: f64,
    pub draft_s: f64,
    pub verify_s: f64,
    /// Depth limit of each round (adaptive runs change it).
    pub depths: Vec<usize>,
}

impl SpecStats {
    /// Accepted / proposed draft depth: 1 − rejected / total draft tokens along the path.
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / self.drafted_depth.max(1) as f64
    }
    /// Tokens produced per target pass (accepted + the target's own).
    pub fn tokens_per_pass(&self) -> f64 {
        (self.accepted + self.rounds) as f64 / self.rounds.max(1) as f64
    }
}

/// The generated tokens and the statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecOutput {
    pub tokens: Vec<u32>,
    pub stats: SpecStats,
}

/// One drafted tree: its tokens and how each node's children were proposed.
struct Draft {
    tree: DraftTree,
    tokens: Vec<u32>,
    proposals: Vec<Proposal>,
}

/// Children per frontier node at `level` (1-based) and which frontier nodes get them.
fn plan_level(
    shape: &TreeShape,
    level: usize,
    frontier: &[(usize, f64)],
    used: usize,
) -> Vec<(usize, usize)> {
    match shape {
        TreeShape::Chain(_) => frontier.iter().map(|&(n, _)| (n, 1)).collect(),
        TreeShape::Static(b) => frontier.iter().map(|&(n, _)| (n, b[level - 1])).collect(),
        TreeShape::Dynamic(budget) => {
            // EAGLE-2: expand the most probable paths, two children each, within the budget.
            let mut by_prob = frontier.to_vec();
            by_prob.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut left = budget.saturating_sub(used);
            let mut out = vec![];
            for (n, _) in by_prob.into_iter().take(4) {
                let k = left.min(2);
                if k == 0 {
                    break;
                }
                out.push((n, k));
                left -= k;
            }
            out
        }
    }
}

/// `k` children from a draft distribution: the k most probable (greedy), or k independent
/// draws (sampling, what lossless verification needs); candidates are taken in order.
fn children(
    dist: &DraftDist,
    k: usize,
    greedy: bool,
    sampler: &mut Sampler,
) -> (Vec<(u32, f64)>, Proposal) {
    match dist {
        DraftDist::Candidates(c) => (
            c.iter().take(k).map(|&t| (t, 1.0)).collect(),
            Proposal::Deterministic,
        ),
        DraftDist::Probs(q) if greedy => {
            let mut order: Vec<usize> = (0..q.len()).collect();
            order.sort_by(|&a, &b| q[b].total_cmp(&q[a]).then(a.cmp(&b)));
            (
                order
                    .iter()
                    .take(k)
                    .map(|&t| (t as u32, q[t] as f64))
                    .collect(),
                Proposal::Deterministic,
            )
        }
        DraftDist::Probs(q) => {
            use rand::Rng;
            let draws = (0..k)
                .map(|_| {
                    let t = pick(q, sampler.rng().gen::<f32>() as f64);
                    (t as u32, q[t] as f64)
                })
                .collect();
            (draws, Proposal::Sampled(q.clone()))
        }
    }
}

/// Drafts a tree of at most `depth` levels after `root`.
fn draft(
    drafter: &mut dyn Drafter,
    committed: &[u32],
    shape: &TreeShape,
    depth: usize,
    greedy: bool,
    sampler: &mut Sampler,
) -> Result<Draft> {
    drafter.begin(committed)?;
    let mut d = Draft {
        tree: DraftTree::root(),
        tokens: vec![*committed.last().expect("a root token")],
        proposals: vec![Proposal::Deterministic],
    };
    let mut frontier = vec![(0usize, 1.0f64)];
    for level in 1..=depth {
        let nodes: Vec<usize> = frontier.iter().map(|f| f.0).collect();
        let dists = drafter.expand(&d.tree, &d.tokens, &nodes)?;
        let prob: std::collections::HashMap<usize, f64> = frontier.iter().copied().collect();
        let plan = plan_level(shape, level, &frontier, d.tree.len() - 1);
        let mut next = vec![];
        for (node, k) in plan {
            let at = nodes
                .iter()
                .position(|&x| x == node)
                .expect("a frontier node");
            let (kids, proposal) = children(&dists[at], k, greedy, sampler);
            d.proposals[node] = proposal;
            for (tok, p) in kids {
                let c = d.tree.push(node);
                d.tokens.push(tok);
                d.proposals.push(Proposal::Deterministic);
                next.push((c, prob[&node] * p));
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    Ok(d)
}

/// Generates up to `max_new` tokens of `prompt` with `target`, drafting with `drafter`.
pub fn generate(
    target: &Llama,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    max_new: usize,
    eos: Option<u32>,
    cfg: &SpecConfig,
) -> Result<SpecOutput> {
    let vocab = target.cfg.vocab;
    if drafter.vocab() != vocab {
        return Err(KernelError::Unsupported(format!(
            "drafter {} has a vocabulary of {}, the target {vocab}",
            drafter.name(),
            drafter.vocab()
        )));
    }
    let max_depth = cfg.shape.max_depth();
    let slots = prompt
        .len()
        .saturating_add(max_new)
        .saturating_add(cfg.shape.max_nodes())
        .saturating_add(1);
    // The last round's tree is stored after the committed tokens: all of it must fit.
    if prompt.is_empty() || max_new == 0 || slots > target.cfg.context {
        return Err(KernelError::InvalidShape(format!(
            "{} prompt tokens + {max_new} new + a draft tree of {} nodes exceed the context of {}",
            prompt.len(),
            cfg.shape.max_nodes(),
            target.cfg.context
        )));
    }
    let mut sampler = Sampler::new(cfg.sampler)?;
    let greedy = cfg.sampler.temperature == 0.0;
    let bs = 16;
    let mut kv = KvPools::new(target, slots.div_ceil(bs), bs)?;
    let table: Vec<u32> = (0..slots.div_ceil(bs) as u32).collect();
    let mut stats = SpecStats::default();
    let t0 = Instant::now();
    let first = target.forward(
        &mut kv,
        &[SeqChunk {
            tokens: prompt,
            start: 0,
            table: &table,
            all_logits: false,
            verify: false,
            tree: None,
        }],
    )?;
    let mut generated = vec![sampler.sample(&first[0])];
    stats.prefill_s = t0.elapsed().as_secs_f64();
    let mut committed: Vec<u32> = prompt.iter().copied().chain(generated.clone()).collect();
    let mut ctx = prompt.len(); // tokens with K/V in the cache (the root is not)
    let mut depth = max_depth;
    let mut rate = cfg.threshold; // running acceptance, starts neutral
    let mut draft_level_s = 0.0; // running draft time per level
    while generated.len() < max_new && Some(*generated.last().expect("a token")) != eos {
        let t = Instant::now();
        let limit = depth.min(max_new - generated.len()).max(1);
        let d = draft(drafter, &committed, &cfg.shape, limit, greedy, &mut sampler)?;
        let drafted_s = t.elapsed().as_secs_f64();
        stats.draft_s += drafted_s;
        let t = Instant::now();
        let nodes: Vec<usize> = (0..d.tree.len()).collect();
        let logits = target
            .forward(
                &mut kv,
                &[SeqChunk {
                    tokens: &d.tokens,
                    start: ctx,
                    table: &table,
                    all_logits: true,
                    verify: true,
                    tree: Some(TreeChunk {
                        tree: &d.tree,
                        nodes: &nodes,
                    }),
                }],
            )?
            .remove(0);
        let verdict = if greedy {
            verify_greedy(&d.tree, &d.tokens, &logits, vocab)
        } else {
            let probs: Vec<f32> = logits
                .chunks(vocab)
                .flat_map(|row| sampler.probs(row))
                .collect();
            verify_stochastic(
                &d.tree,
                &d.tokens,
                &probs,
                vocab,
                &d.proposals,
                sampler.rng(),
            )
        };
        // Accepted nodes move to the positions after the root; the rest is left to be
        // overwritten.
        for (j, &node) in verdict.accepted.iter().enumerate() {
            kv.move_position(&table, ctx + node, ctx + 1 + j)?;
        }
        // Rejected branches are gone: their positions are poisoned until overwritten, so a
        // read of them would show as NaN logits.
        kv.poison_positions(&table, ctx + 1 + verdict.accepted.len(), ctx + d.tree.len())?;
        drafter.accept(&d.tree, &verdict.accepted)?;
        stats.verify_s += t.elapsed().as_secs_f64();
        ctx += 1 + verdict.accepted.len();
        let new: Vec<u32> = verdict
            .accepted
            .iter()
            .map(|&n| d.tokens[n])
            .chain([verdict.next_token])
            .collect();
        for tok in new {
            if generated.len() == max_new || Some(*generated.last().expect("a token")) == eos {
                break;
            }
            generated.push(tok);
            committed.push(tok);
        }
        let height = d.tree.height();
        stats.rounds += 1;
        stats.drafted_depth += height;
        stats.accepted += verdict.accepted.len();
        stats.nodes_scored += d.tree.len();
        stats.depths.push(limit);
        if cfg.adaptive && height > 0 {
            rate = 0.7 * rate + 0.3 * verdict.accepted.len() as f64 / height as f64;
            draft_level_s = 0.7 * draft_level_s + 0.3 * drafted_s / height as f64;
            depth = match &cfg.cost {
                Some(c) => c.best_depth(&cfg.shape, max_depth, rate, draft_level_s / c.step_s),
                None if rate < cfg.threshold => (depth - 1).max(1),
                None => (depth + 1).min(max_depth),
            };
        }
    }
    // The committed context must match what was produced (a cheap consistency check).
    debug_assert_eq!(committed.len(), prompt.len() + generated.len());
    Ok(SpecOutput {
        tokens: generated,
        stats,
    })
}

/// Plain greedy or sampled decoding with the same sampler, for speed-ups measured in one run.
pub fn generate_plain(
    target: &Llama,
    prompt: &[u32],
    max_new: usize,
    eos: Option<u32>,
    sampler: SamplerConfig,
) -> Result<Vec<u32>> {
    let mut s = crate::serve::session::Session::new(target, prompt.len() + max_new, 16)?;
    let mut sampler = Sampler::new(sampler)?;
    let mut out = vec![];
    let mut logits = s.forward(prompt)?;
    loop {
        let next = if sampler.cfg.temperature == 0.0 {
            argmax(&logits)
        } else {
            sampler.sample(&logits)
        };
        out.push(next);
        if out.len() == max_new || Some(next) == eos {
            return Ok(out);
        }
        logits = s.forward(&[next])?;
    }
}
