//! Drafters for speculative decoding, behind one interface so a researcher can add one: a
//! smaller model (any preset or checkpoint, or the target's own weights in a cheaper format,
//! e.g. SmolLM2 with q4_0 weights drafting for SmolLM2 in f32), which grows the tree level by
//! level with tree-masked passes over its own paged KV cache and keeps the accepted path's K/V
//! between rounds; and prompt lookup (n-gram drafting from the context, no second model).

use crate::model::forward::{SeqChunk, TreeChunk};
use crate::model::kv::KvPools;
use crate::model::llama::{Llama, Result};
use crate::serve::sampler::{Sampler, SamplerConfig};
use kernel_speculative::DraftTree;

/// What a drafter proposes after a node.
#[derive(Debug, Clone, PartialEq)]
pub enum DraftDist {
    /// A distribution over the vocabulary.
    Probs(Vec<f32>),
    /// Candidate tokens, best first, without probabilities (may be empty).
    Candidates(Vec<u32>),
}

/// The drafted tokens on the path from the root's child to node `n` of `tree` (`tokens[i]` is
/// node i's token; the root is the last committed token, already in a drafter's context).
pub(crate) fn drafted_path(tree: &DraftTree, tokens: &[u32], n: usize) -> Vec<u32> {
    tree.path_to(n).iter().skip(1).map(|&p| tokens[p]).collect()
}

/// A source of draft tokens.
pub trait Drafter {
    fn name(&self) -> String;
    /// Must equal the target's.
    fn vocab(&self) -> usize;
    /// A round starts: `committed` is every token so far; its last (the root) has not been run.
    fn begin(&mut self, committed: &[u32]) -> Result<()>;
    /// Distributions after `nodes` of the tree (tokens `tokens[node]`); their ancestors were
    /// expanded earlier in this round.
    fn expand(
        &mut self,
        tree: &DraftTree,
        tokens: &[u32],
        nodes: &[usize],
    ) -> Result<Vec<DraftDist>>;
    /// The round ends with `accepted` (path nodes, root excluded).
    fn accept(&mut self, tree: &DraftTree, accepted: &[usize]) -> Result<()>;
    /// The sequence ended with `committed` (every token); nothing to do for most drafters.
    fn finish(&mut self, _committed: &[u32]) -> Result<()> {
        Ok(())
    }
}

/// A draft model with its own KV cache.
pub struct ModelDrafter {
    pub model: Llama,
    label: String,
    kv: KvPools,
    table: Vec<u32>,
    /// The tokens whose K/V are in the draft cache, positions 0.. (a new sequence keeps only
    /// the prefix it shares with them).
    cached: Vec<u32>,
    /// This round's tree tokens as of the last `expand`.
    round: Vec<u32>,
    /// Turns logits into the draft distribution (the target's temperature, or 1 when greedy).
    probs: Sampler,
    /// Tree nodes whose K/V this round has written (levels are expanded in order, so these
    /// are the nodes below the tree size at the last `expand`; the last level is proposed,
    /// never run).
    expanded: usize,
}

impl ModelDrafter {
    /// Room for `capacity` positions (prompt + output + tree).
    pub fn new(
        model: Llama,
        label: &str,
        capacity: usize,
        sampler: SamplerConfig,
    ) -> Result<ModelDrafter> {
        let bs = 16;
        let blocks = capacity.div_ceil(bs);
        let temperature = if sampler.temperature == 0.0 {
            1.0
        } else {
            sampler.temperature
        };
        Ok(ModelDrafter {
            kv: KvPools::new(&model, blocks, bs)?,
            table: (0..blocks as u32).collect(),
            model,
            label: label.into(),
            cached: vec![],
            round: vec![],
            expanded: 0,
            probs: Sampler::new(SamplerConfig {
                temperature,
                ..sampler
            })?,
        })
    }
}

impl Drafter for ModelDrafter {
    fn name(&self) -> String {
        self.label.clone()
    }
    fn vocab(&self) -> usize {
        self.model.cfg.vocab
    }
    fn begin(&mut self, committed: &[u32]) -> Result<()> {
        self.expanded = 0;
        let upto = committed.len() - 1;
        let shared = self
            .cached
            .iter()
            .zip(&committed[..upto])
            .take_while(|(a, b)| a == b)
            .count();
        if shared < upto {
            let chunk = SeqChunk {
                tokens: &committed[shared..upto],
                start: shared,
                table: &self.table,
                all_logits: false,
                verify: false,
                tree: None,
            };
            self.model.forward(&mut self.kv, &[chunk])?;
        }
        self.cached = committed[..upto].to_vec();
        Ok(())
    }
    fn expand(
        &mut self,
        tree: &DraftTree,
        tokens: &[u32],
        nodes: &[usize],
    ) -> Result<Vec<DraftDist>> {
        let toks: Vec<u32> = nodes.iter().map(|&n| tokens[n]).collect();
        self.expanded = tree.len();
        self.round = tokens.to_vec();
        let chunk = SeqChunk {
            tokens: &toks,
            start: self.cached.len(),
            table: &self.table,
            all_logits: true,
            verify: false,
            tree: Some(TreeChunk { tree, nodes }),
        };
        let logits = self.model.forward(&mut self.kv, &[chunk])?.remove(0);
        Ok(logits
            .chunks(self.model.cfg.vocab)
            .map(|row| DraftDist::Probs(self.probs.probs(row)))
            .collect())
    }
    fn accept(&mut self, _tree: &DraftTree, accepted: &[usize]) -> Result<()> {
        // The root sits at `cached`; accepted nodes move after it. Nodes the draft never ran
        // (the deepest level) are recomputed next round.
        let ctx = self.cached.len();
        self.cached.push(self.round[0]);
        for (j, &node) in accepted.iter().enumerate() {
            if node >= self.expanded {
                break;
            }
            self.kv
                .move_position(&self.table, ctx + node, ctx + 1 + j)?;
            self.cached.push(self.round[node]);
        }
        let kept = self.cached.len() - ctx;
        self.kv
            .poison_positions(&self.table, ctx + kept, ctx + self.expanded.max(kept))?;
        Ok(())
    }
}

/// Prompt lookup: the tokens that followed the most recent earlier occurrence of the last n
/// context tokens (n from `max_n` down to 1).
pub struct NgramDrafter {
    pub max_n: usize,
    pub vocab: usize,
    history: Vec<u32>,
}

impl NgramDrafter {
    pub fn new(max_n: usize, vocab: usize) -> NgramDrafter {
        NgramDrafter {
            max_n: max_n.max(1),
            vocab,
            history: vec![],
        }
    }

    /// Candidates after `context`: distinct continuations, most recent match first.
    fn lookup(&self, context: &[u32]) -> Vec<u32> {
        let mut out = vec![];
        for n in (1..=self.max_n.min(context.len().saturating_sub(1))).rev() {
            let key = &context[context.len() - n..];
            // Earlier occurrences, latest first, that have a following token.
            for start in (0..context.len() - n).rev() {
                if &context[start..start + n] == key {
                    let next = context[start + n];
                    if !out.contains(&next) {
                        out.push(next);
                    }
                }
            }
            if !out.is_empty() {
                break;
            }
        }
        out
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> String {
        format!("ngram:{}", self.max_n)
    }
    fn vocab(&self) -> usize {
        self.vocab
    }
    fn begin(&mut self, committed: &[u32]) -> Result<()> {
        self.history = committed.to_vec();
        Ok(())
    }
    fn expand(
        &mut self,
        tree: &DraftTree,
        tokens: &[u32],
        nodes: &[usize],
    ) -> Result<Vec<DraftDist>> {
        Ok(nodes
            .iter()
            .map(|&n| {
                let mut ctx = self.history.clone();
                ctx.extend(drafted_path(tree, tokens, n));
                DraftDist::Candidates(self.lookup(&ctx))
            })
            .collect())
    }
    fn accept(&mut self, _tree: &DraftTree, _accepted: &[usize]) -> Result<()> {
        Ok(())
    }
}
