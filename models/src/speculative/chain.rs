//! Model-free drafters as the continuous-batching engine takes them (`serve::speculate`):
//! any `Drafter` proposes a chain (the first candidate of each level), and `EngineSpec` names
//! the drafter and the chain length (`ngram[:N][:k=K]`, `suffix[:D][:k=K][:global]`).

use crate::model::llama::{argmax, Result};
use crate::serve::speculate::{ChainDrafter, EngineSpeculation};
use crate::speculative::draft::{DraftDist, Drafter, NgramDrafter};
use crate::speculative::suffix::{GlobalSuffixTree, SpecLimits, SuffixDrafter};
use kernel_common::KernelError;
use kernel_speculative::DraftTree;
use std::sync::Arc;

/// Which model-free drafter each sequence gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EngineDrafter {
    /// Prompt lookup: the continuation of the longest earlier match of the last 1..=n tokens.
    Ngram { max_n: usize },
    /// The suffix tree of the sequence so far, `depth` tokens deep; with `global`, also
    /// SuffixDecoding's global tree of the outputs of the requests that finished before;
    /// `limits`, the paper's adaptive speculation length.
    Suffix {
        depth: usize,
        global: bool,
        limits: SpecLimits,
    },
}

/// Speculation in the engine: the drafter and the longest chain one step drafts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSpec {
    pub drafter: EngineDrafter,
    pub max_draft: usize,
}

impl EngineSpec {
    /// Parses `ngram[:N][:k=K]` or `suffix[:D][:k=K][:global][:factor=F][:min_prob=P]`
    /// (defaults: N 3, D 24, K 4, no limits; colons, not commas, so a spec is one value of a
    /// `--set` list).
    pub fn parse(text: &str) -> Result<EngineSpec> {
        let bad = |why: &str| {
            KernelError::Unsupported(format!(
                "speculation '{text}': {why} (want ngram[:N][:k=K] or suffix[:D][:k=K][:global][:factor=F][:min_prob=P])"
            ))
        };
        let positive = |a: &str| -> Result<usize> {
            a.parse::<usize>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(&format!("'{a}' is not a positive integer")))
        };
        let mut parts = text.split(':');
        let kind = parts.next().unwrap_or("");
        let (mut arg, mut max_draft, mut global) = (None, 4, false);
        let mut limits = SpecLimits::default();
        for (i, p) in parts.enumerate() {
            let suffix = kind == "suffix";
            if let Some(k) = p.strip_prefix("k=") {
                max_draft = positive(k)?;
            } else if let Some(read) = limits.read_option(p).filter(|_| suffix) {
                read.map_err(|why| bad(&why))?;
            } else if p == "global" && suffix {
                global = true;
            } else if i == 0 {
                arg = Some(positive(p)?);
            } else {
                return Err(bad(&format!("unknown option '{p}'")));
            }
        }
        let drafter = match kind {
            "ngram" => EngineDrafter::Ngram {
                max_n: arg.unwrap_or(3),
            },
            "suffix" => EngineDrafter::Suffix {
                depth: arg.unwrap_or(24),
                global,
                limits,
            },
            other => return Err(bad(&format!("unknown drafter '{other}'"))),
        };
        if max_draft > 32 {
            return Err(bad("k must be at most 32 draft tokens per step"));
        }
        Ok(EngineSpec { drafter, max_draft })
    }

    /// The engine's speculation: a fresh drafter per sequence over `vocab` tokens (with a
    /// global tree, one tree for the engine's sequences, each adding its output as it ends).
    pub fn speculation(&self, vocab: usize) -> EngineSpeculation {
        let kind = self.drafter;
        let shared = match kind {
            EngineDrafter::Suffix {
                depth,
                global: true,
                ..
            } => Some(Arc::new(GlobalSuffixTree::new(depth))),
            _ => None,
        };
        EngineSpeculation {
            max_draft: self.max_draft,
            label: self.label(),
            new_drafter: Box::new(move || -> Box<dyn ChainDrafter> {
                match (kind, &shared) {
                    (EngineDrafter::Ngram { max_n }, _) => {
                        Box::new(NgramDrafter::new(max_n, vocab))
                    }
                    (EngineDrafter::Suffix { depth, limits, .. }, Some(g)) => Box::new(
                        SuffixDrafter::with_global(depth, vocab, g.clone()).with_limits(limits),
                    ),
                    (EngineDrafter::Suffix { depth, limits, .. }, None) => {
                        Box::new(SuffixDrafter::new(depth, vocab).with_limits(limits))
                    }
                }
            }),
        }
    }

    /// A label for results: `ngram:3:k=4` (parses back to the same spec).
    pub fn label(&self) -> String {
        match self.drafter {
            EngineDrafter::Ngram { max_n } => format!("ngram:{max_n}:k={}", self.max_draft),
            EngineDrafter::Suffix {
                depth,
                global,
                limits,
            } => format!(
                "suffix:{depth}:k={}{}{}",
                self.max_draft,
                if global { ":global" } else { "" },
                limits.label()
            ),
        }
    }
}

/// Up to `k` chain tokens after `committed` (its last token is the chain's root), the first
/// candidate of each level; fewer when the drafter has nothing to propose.
pub fn draft_chain(drafter: &mut dyn Drafter, committed: &[u32], k: usize) -> Result<Vec<u32>> {
    if k == 0 {
        return Ok(vec![]);
    }
    drafter.begin(committed)?;
    let mut tree = DraftTree::root();
    let mut tokens = vec![*committed.last().expect("a root token")];
    let mut last = 0;
    for _ in 0..k {
        let next = match drafter.expand(&tree, &tokens, &[last])?.pop() {
            Some(DraftDist::Candidates(c)) => c.first().copied(),
            Some(DraftDist::Probs(q)) => Some(argmax(&q)),
            None => None,
        };
        let Some(t) = next else { break };
        last = tree.push(last);
        tokens.push(t);
    }
    // The drafter learns the outcome at the next `begin` (model-free drafters read the
    // committed tokens there); no tree node is kept.
    drafter.accept(&tree, &[])?;
    Ok(tokens[1..].to_vec())
}

impl<D: Drafter + Send> ChainDrafter for D {
    fn chain(&mut self, committed: &[u32], k: usize) -> Result<Vec<u32>> {
        draft_chain(self, committed, k)
    }
    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        Drafter::finish(self, committed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_one_line_errors() {
        let s = EngineSpec::parse("ngram").unwrap();
        assert_eq!(
            s,
            EngineSpec {
                drafter: EngineDrafter::Ngram { max_n: 3 },
                max_draft: 4
            }
        );
        assert_eq!(
            EngineSpec::parse("suffix:16:k=8").unwrap().label(),
            "suffix:16:k=8"
        );
        assert_eq!(
            EngineSpec::parse("ngram:k=2").unwrap().label(),
            "ngram:3:k=2"
        );
        assert_eq!(
            EngineSpec::parse("suffix:global:k=2").unwrap().label(),
            "suffix:24:k=2:global"
        );
        assert_eq!(
            EngineSpec::parse("suffix:8:min_prob=0.1:global:factor=2")
                .unwrap()
                .label(),
            "suffix:8:k=4:global:factor=2:min_prob=0.1"
        );
        for bad in [
            "model",
            "ngram:0",
            "ngram:x",
            "suffix:k=0",
            "suffix:j=2",
            "ngram:k=99",
            "ngram:3:4",
            "ngram:global",
            "ngram:factor=1",
            "suffix:min_prob=2",
            "suffix:factor=x",
        ] {
            let e = EngineSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && !e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn a_chain_follows_the_first_candidates_and_stops_when_none() {
        let mut d = NgramDrafter::new(2, 16);
        // 3 4 → 5 (the earlier 3 4 5), then 4 5 → 6, then 5 6 → 7; nothing follows 9 8.
        let committed = [1, 3, 4, 5, 6, 7, 2, 3, 4];
        assert_eq!(draft_chain(&mut d, &committed, 3).unwrap(), vec![5, 6, 7]);
        assert_eq!(
            draft_chain(&mut d, &committed, 0).unwrap(),
            Vec::<u32>::new()
        );
        assert_eq!(draft_chain(&mut d, &[9, 8], 4).unwrap(), Vec::<u32>::new());
    }
}
