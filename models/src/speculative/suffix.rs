//! Suffix drafting (SuffixDecoding, Oliaro et al. 2024): a suffix tree over the prompt and
//! everything generated so far — every substring of up to `depth` tokens is a path from the
//! root, each node counting the occurrences of its string — so the continuations of the
//! longest suffix of the context that occurred before come out of one walk, ranked by how
//! often they followed it (ties: the most recent first). Model-free like n-gram lookup, but
//! it matches the longest suffix up to `depth` tokens (n-gram lookup stops at its `n`), ranks
//! by frequency rather than recency, and is built incrementally: a new token costs `depth`
//! child lookups, a lookup `depth`² at most, where n-gram lookup scans the whole context for
//! every proposal. The paper's global tree over earlier requests' outputs is
//! `GlobalSuffixTree` (the batching engine's `:global`), its adaptive speculation length
//! `SpecLimits`; a static corpus (`corpus`, a suffix array, as REST's datastore) can be
//! consulted beside them.

use crate::model::llama::Result;
use crate::speculative::corpus::CorpusIndex;
use crate::speculative::corpus::Followers;
use crate::speculative::draft::{drafted_path, DraftDist, Drafter};
use kernel_speculative::DraftTree;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One node: the string spelled by the path from the root.
#[derive(Debug, Clone, Default)]
struct Node {
    /// Occurrences of the string in the indexed text.
    count: u32,
    /// Where its latest occurrence ends (a token position), for ties.
    last: usize,
    /// Its children, in the order they first occurred.
    next: Vec<usize>,
    /// The token that leads here from its parent.
    token: u32,
}

/// A depth-limited suffix tree over one token sequence, grown token by token.
#[derive(Debug, Clone)]
pub struct SuffixTree {
    depth: usize,
    nodes: Vec<Node>,
    /// (parent, token) → child (each node also lists its children, for the ranking).
    children: HashMap<(usize, u32), usize>,
    /// The indexed tokens.
    text: Vec<u32>,
    /// The nodes of the text's suffixes of 1..depth − 1 tokens (those a new token extends).
    open: Vec<usize>,
}

impl SuffixTree {
    /// An empty tree over substrings of at most `depth` tokens (at least 1).
    pub fn new(depth: usize) -> SuffixTree {
        SuffixTree {
            depth: depth.max(1),
            nodes: vec![Node::default()],
            children: HashMap::new(),
            text: vec![],
            open: vec![],
        }
    }

    /// The indexed tokens.
    pub fn text(&self) -> &[u32] {
        &self.text
    }

    /// Appends `t`: every suffix of the text that ends at it, up to `depth` tokens, gains
    /// an occurrence.
    pub fn push(&mut self, t: u32) {
        let end = self.text.len();
        self.text.push(t);
        let mut next = Vec::with_capacity(self.open.len() + 1);
        for parent in std::iter::once(0).chain(self.open.iter().copied()) {
            let n = self.nodes.len();
            let child = *self.children.entry((parent, t)).or_insert(n);
            if child == n {
                self.nodes.push(Node {
                    token: t,
                    ..Node::default()
                });
                self.nodes[parent].next.push(n);
            }
            let node = &mut self.nodes[child];
            node.count += 1;
            node.last = end;
            next.push(child);
        }
        // Suffixes of `depth` tokens are complete: nothing extends them.
        next.truncate(self.depth - 1);
        self.open = next;
    }

    /// Ends a document: the next token starts new suffixes, none spanning the boundary (a
    /// global tree holds many requests' outputs one after another).
    pub fn end_document(&mut self) {
        self.open.clear();
    }

    /// The node of `s`, if it occurred.
    fn find(&self, s: &[u32]) -> Option<usize> {
        s.iter()
            .try_fold(0, |at, &t| self.children.get(&(at, t)).copied())
    }

    /// The tokens that followed the longest suffix of `context` (at most `depth` − 1
    /// tokens) that occurred with a continuation in the indexed text, most frequent first
    /// (ties: the most recent), at most `limit`; empty when no suffix did.
    pub fn continuations(&self, context: &[u32], limit: usize) -> Vec<u32> {
        self.longest_match(context, limit)
            .map_or_else(Vec::new, |f| f.tokens().1)
    }

    /// As [`SuffixTree::continuations`], with the length of the suffix that matched, how
    /// often each follower followed it and how often any did; None when no suffix did.
    pub fn longest_match(&self, context: &[u32], limit: usize) -> Option<Followers> {
        let longest = context.len().min(self.depth - 1);
        for m in (1..=longest).rev() {
            let Some(node) = self.find(&context[context.len() - m..]) else {
                continue;
            };
            let mut next: Vec<&Node> = self.nodes[node]
                .next
                .iter()
                .map(|&c| &self.nodes[c])
                .collect();
            if next.is_empty() {
                continue;
            }
            next.sort_by(|a, b| b.count.cmp(&a.count).then(b.last.cmp(&a.last)));
            let total = next.iter().map(|c| c.count).sum();
            return Some(Followers {
                len: m,
                next: next
                    .into_iter()
                    .take(limit)
                    .map(|c| (c.token, c.count))
                    .collect(),
                total,
            });
        }
        None
    }
}

/// SuffixDecoding's global tree: the outputs of the requests that finished before, one
/// document each, shared by the drafters of an engine's sequences (each adds its own output
/// when its sequence finishes, or, failing that, when it is dropped).
#[derive(Debug)]
pub struct GlobalSuffixTree(Mutex<SuffixTree>);

impl GlobalSuffixTree {
    pub fn new(depth: usize) -> GlobalSuffixTree {
        GlobalSuffixTree(Mutex::new(SuffixTree::new(depth)))
    }

    fn tree(&self) -> std::sync::MutexGuard<'_, SuffixTree> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Outputs are added until the tree holds this many tokens: a token adds up to `depth`
    /// nodes (~80 bytes each), so the cap bounds the tree at ~0.5 GB at depth 24 (an
    /// experiment's few thousand output tokens are far below it).
    pub const MAX_TOKENS: usize = 1 << 18;

    /// Adds one request's output as a document (nothing once `MAX_TOKENS` are held).
    pub fn add_output(&self, tokens: &[u32]) {
        let mut tree = self.tree();
        let room = Self::MAX_TOKENS.saturating_sub(tree.text().len());
        for &t in &tokens[..tokens.len().min(room)] {
            tree.push(t);
        }
        tree.end_document();
    }

    /// Tokens indexed so far (every output added).
    pub fn len(&self) -> usize {
        self.tree().text().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The suffix drafter: candidates after each tree node from the suffix tree of the
/// committed tokens, extended by the node's path in the draft tree; with a corpus or a
/// global tree of earlier outputs, from whichever matched the longest suffix (at equal
/// length: the sequence's, then the global tree's, then the corpus's).
pub struct SuffixDrafter {
    pub depth: usize,
    pub vocab: usize,
    tree: SuffixTree,
    corpus: Option<Arc<CorpusIndex>>,
    global: Option<Arc<GlobalSuffixTree>>,
    /// Where the output starts: the first round's root (the token the prompt's pass chose).
    output_from: Option<usize>,
    limits: SpecLimits,
    /// This round's root match length, and the path probability of each drafted child
    /// (parent node, token).
    root_len: usize,
    path_prob: HashMap<(usize, u32), f64>,
}

/// SuffixDecoding's adaptive speculation (vLLM's `suffix_decoding_max_spec_factor` and
/// `suffix_decoding_min_token_prob`, there 1.0 and 0.1): a path is at most `factor` × the
/// length of the suffix the round's root matched, and a token is drafted only if its path
/// probability — the follower frequencies (count / all followers' counts) multiplied along
/// the path — is at least `min_prob`. Zero turns either off (the default: every candidate,
/// as deep as the tree shape asks).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecLimits {
    pub factor: f64,
    pub min_prob: f64,
}

impl SpecLimits {
    /// Reads a `factor=F` (≥ 0) or `min_prob=P` (in [0, 1]) spec option into these limits:
    /// None when `part` is neither, the reason when its value is out of range. The one
    /// parser of `harness generate`'s drafter specs and the engine's.
    pub fn read_option(&mut self, part: &str) -> Option<std::result::Result<(), String>> {
        let (slot, v, max, want) = if let Some(v) = part.strip_prefix("factor=") {
            (&mut self.factor, v, 1e6, "a number ≥ 0")
        } else if let Some(v) = part.strip_prefix("min_prob=") {
            (&mut self.min_prob, v, 1.0, "in [0, 1]")
        } else {
            return None;
        };
        let x = v.parse::<f64>().ok().filter(|x| (0.0..=max).contains(x));
        Some(match x {
            Some(x) => {
                *slot = x;
                Ok(())
            }
            None => Err(format!("{part} is not {want}")),
        })
    }

    /// The limits as a spec writes them (`:factor=1:min_prob=0.1`; empty when both are off).
    pub fn label(&self) -> String {
        let mut label = String::new();
        if self.factor > 0.0 {
            label += &format!(":factor={}", self.factor);
        }
        if self.min_prob > 0.0 {
            label += &format!(":min_prob={}", self.min_prob);
        }
        label
    }
}

impl Drop for SuffixDrafter {
    /// The sequence ended: its output joins the global tree, if there is one.
    fn drop(&mut self) {
        self.output_to_global();
    }
}

impl SuffixDrafter {
    /// Matches suffixes of up to `depth` − 1 tokens (the tree holds substrings of `depth`).
    pub fn new(depth: usize, vocab: usize) -> SuffixDrafter {
        SuffixDrafter {
            depth: depth.max(2),
            vocab,
            tree: SuffixTree::new(depth.max(2)),
            corpus: None,
            global: None,
            output_from: None,
            limits: SpecLimits::default(),
            root_len: 0,
            path_prob: HashMap::new(),
        }
    }

    /// Also drafts from `global`, the outputs of the sequences that ended before, and adds
    /// its own when its sequence finishes (or when it is dropped).
    pub fn with_global(depth: usize, vocab: usize, global: Arc<GlobalSuffixTree>) -> SuffixDrafter {
        let mut d = SuffixDrafter::new(depth, vocab);
        d.global = Some(global);
        d
    }

    /// Also drafts from `corpus` (shared: one index serves every sequence of an engine);
    /// matches in it are as long as the drafter's own (`depth` − 1 tokens at most).
    pub fn with_corpus(depth: usize, vocab: usize, corpus: Arc<CorpusIndex>) -> SuffixDrafter {
        let mut d = SuffixDrafter::new(depth, vocab);
        d.corpus = Some(corpus);
        d
    }

    /// What followed `context`: of the sequence's tree, the global tree and the corpus, the
    /// one that matched the longest suffix (the first of them at a tie).
    fn best_match(&self, context: &[u32]) -> Option<Followers> {
        let own = self.tree.longest_match(context, Self::LIMIT);
        let global = self
            .global
            .as_ref()
            .and_then(|g| g.tree().longest_match(context, Self::LIMIT));
        let corpus = self
            .corpus
            .as_ref()
            .and_then(|c| c.longest_match(context, Self::LIMIT));
        [own, global, corpus]
            .into_iter()
            .flatten()
            .fold(None::<Followers>, |best, m| match best {
                Some(b) if b.len >= m.len => Some(b),
                _ => Some(m),
            })
    }

    /// With SuffixDecoding's adaptive speculation limits.
    pub fn with_limits(mut self, limits: SpecLimits) -> SuffixDrafter {
        self.limits = limits;
        self
    }

    /// Adds this sequence's output to the global tree (once).
    fn output_to_global(&mut self) {
        if let (Some(g), Some(from)) = (&self.global, self.output_from.take()) {
            let text = self.tree.text();
            g.add_output(&text[from.min(text.len())..]);
        }
    }

    /// Candidates that keep a node's proposal list short (the driver takes as many as its
    /// tree shape has children).
    const LIMIT: usize = 16;
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> String {
        let mut name = format!("suffix:{}{}", self.depth, self.limits.label());
        if let Some(c) = &self.corpus {
            name += &format!("+corpus({} tokens)", c.len());
        }
        if self.global.is_some() {
            name += "+global";
        }
        name
    }
    fn vocab(&self) -> usize {
        self.vocab
    }
    fn begin(&mut self, committed: &[u32]) -> Result<()> {
        // The same sequence grows between rounds; any other starts a new tree.
        if !committed.starts_with(self.tree.text()) {
            self.output_to_global();
            self.tree = SuffixTree::new(self.depth);
            self.output_from = None;
        }
        self.output_from
            .get_or_insert(committed.len().saturating_sub(1));
        self.path_prob.clear();
        self.root_len = 0;
        for &t in &committed[self.tree.text().len()..] {
            self.tree.push(t);
        }
        Ok(())
    }
    fn expand(
        &mut self,
        tree: &DraftTree,
        tokens: &[u32],
        nodes: &[usize],
    ) -> Result<Vec<DraftDist>> {
        let mut out = Vec::with_capacity(nodes.len());
        for &n in nodes {
            // The context's last depth − 1 tokens: the committed tail, then the path.
            let path = drafted_path(tree, tokens, n);
            let text = self.tree.text();
            let keep = (self.depth - 1).saturating_sub(path.len()).min(text.len());
            let mut ctx = text[text.len() - keep..].to_vec();
            ctx.extend(&path);
            let found = self.best_match(&ctx);
            if path.is_empty() {
                self.root_len = found.as_ref().map_or(0, |f| f.len);
            }
            let Some(found) = found else {
                out.push(DraftDist::Candidates(vec![]));
                continue;
            };
            // SuffixDecoding's adaptive speculation: no deeper than factor × the root's match,
            // and only tokens whose path probability (follower frequencies multiplied along
            // it) reaches min_prob.
            let lim = self.limits;
            if lim.factor > 0.0 && path.len() as f64 >= lim.factor * self.root_len as f64 {
                out.push(DraftDist::Candidates(vec![]));
                continue;
            }
            let p_node = tree
                .parent(n)
                .and_then(|p| self.path_prob.get(&(p, tokens[n])).copied())
                .unwrap_or(1.0);
            let mut next = vec![];
            for (t, count) in found.next {
                let p = p_node * count as f64 / found.total.max(1) as f64;
                if p >= lim.min_prob {
                    self.path_prob.insert((n, t), p);
                    next.push(t);
                }
            }
            out.push(DraftDist::Candidates(next));
        }
        Ok(out)
    }
    fn accept(&mut self, _tree: &DraftTree, _accepted: &[usize]) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        self.begin(committed)?;
        self.output_to_global();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts by brute force: the tokens after each occurrence of the longest suffix of
    /// `ctx` (≤ depth − 1) that occurred with a follower in `text`, ranked as the tree ranks,
    /// with their counts.
    fn brute(text: &[u32], ctx: &[u32], depth: usize) -> Option<Followers> {
        for m in (1..=ctx.len().min(depth - 1)).rev() {
            let key = &ctx[ctx.len() - m..];
            let mut seen: HashMap<u32, (u32, usize)> = HashMap::new();
            for s in 0..text.len().saturating_sub(m) {
                if &text[s..s + m] == key {
                    let e = seen.entry(text[s + m]).or_default();
                    e.0 += 1;
                    e.1 = s + m;
                }
            }
            if !seen.is_empty() {
                let mut v: Vec<(u32, (u32, usize))> = seen.into_iter().collect();
                v.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(b.1 .1.cmp(&a.1 .1)));
                return Some(Followers {
                    len: m,
                    total: v.iter().map(|f| f.1 .0).sum(),
                    next: v.into_iter().map(|(t, (n, _))| (t, n)).collect(),
                });
            }
        }
        None
    }

    #[test]
    fn continuations_equal_a_brute_force_count() {
        // A small alphabet, so suffixes of every length repeat.
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let text: Vec<u32> = (0..600)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % 4) as u32
            })
            .collect();
        for depth in [2, 3, 5, 9] {
            let mut tree = SuffixTree::new(depth);
            for (i, &t) in text.iter().enumerate() {
                tree.push(t);
                if i % 37 == 0 || i + 1 == text.len() {
                    let done = &text[..=i];
                    for cut in [0, 1, 3] {
                        let ctx = &done[..done.len().saturating_sub(cut)];
                        let want = brute(done, ctx, depth);
                        assert_eq!(
                            tree.continuations(ctx, usize::MAX),
                            want.as_ref()
                                .map_or(vec![], |f| f.next.iter().map(|n| n.0).collect())
                        );
                        assert_eq!(
                            tree.longest_match(ctx, usize::MAX),
                            want,
                            "depth {depth}, {} tokens, ctx {}",
                            done.len(),
                            ctx.len()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_drafter_proposes_what_followed_and_restarts_on_a_new_sequence() {
        let tree = DraftTree::root();
        // "1 2 3 1 2 4 1 2 3 1 2": after "1 2" came 3 twice, 4 once (depth 3: suffixes of up
        // to 2 tokens are matched).
        let text = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2];
        let mut d = SuffixDrafter::new(3, 16);
        d.begin(&text).unwrap();
        let got = d.expand(&tree, &[2], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![3, 4])]);
        // Depth 4 matches the longer suffix "3 1 2", which was followed by 4 alone.
        let mut d = SuffixDrafter::new(4, 16);
        d.begin(&text).unwrap();
        let got = d.expand(&tree, &[2], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![4])]);
        // Another sequence: nothing of the first is proposed ("7" was followed by 8).
        d.begin(&[7, 8, 7]).unwrap();
        let got = d.expand(&tree, &[7], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![8])]);
    }

    #[test]
    fn a_global_tree_drafts_from_earlier_outputs_and_not_across_them() {
        let tree = DraftTree::root();
        let global = Arc::new(GlobalSuffixTree::new(8));
        // Sequence 1: prompt 1 2, output 3 4 5 (the first round's root is 3); it finishes
        // with 5, which no round saw, and the output goes in once, not again when dropped.
        {
            let mut d = SuffixDrafter::with_global(8, 16, global.clone());
            assert_eq!(d.name(), "suffix:8+global");
            d.begin(&[1, 2, 3]).unwrap();
            d.begin(&[1, 2, 3, 4]).unwrap();
            d.finish(&[1, 2, 3, 4, 5]).unwrap();
            assert_eq!(global.len(), 3);
        }
        assert_eq!(global.len(), 3);
        // Sequence 2: after its own "9 3" it drafts 4 from sequence 1's output ("3" → 4),
        // which its own text does not have; the prompt 1 2 of sequence 1 is not indexed.
        let mut d = SuffixDrafter::with_global(8, 16, global.clone());
        d.begin(&[9, 3]).unwrap();
        let got = d.expand(&tree, &[3], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![4])]);
        // A new sequence: the old one's output (its root 3) goes in first.
        d.begin(&[7, 2]).unwrap();
        assert_eq!(global.len(), 4);
        let got = d.expand(&tree, &[2], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![])]);
        drop(d);
        // Sequence 3's output 6 7 after sequence 1's 3 4 5: "5 6" spans two documents and
        // was never a suffix, so after 5 nothing is drafted.
        global.add_output(&[6, 7]);
        let mut d = SuffixDrafter::new(8, 16);
        d.global = Some(global.clone());
        d.begin(&[8, 5]).unwrap();
        let got = d.expand(&tree, &[5], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![])]);
    }

    #[test]
    fn adaptive_limits_cut_paths_by_match_length_and_path_probability() {
        // After "7" came 1 three times, 2 and 3 once each (3 the later: ranked first of the
        // two; the root matches "7": length 1;
        // "8 7" occurs only at the end); after "7 1" came 7 each time.
        let text = [7, 1, 7, 1, 7, 2, 7, 1, 7, 3, 8, 7];
        let mut tree = DraftTree::root();
        let child = tree.push(0);
        let tokens = [7, 1];
        let run = |limits: SpecLimits| {
            let mut d = SuffixDrafter::new(8, 16).with_limits(limits);
            d.begin(&text).unwrap();
            let root = d.expand(&tree, &tokens, &[0]).unwrap();
            let below = d.expand(&tree, &tokens, &[child]).unwrap();
            (root, below)
        };
        let c = |v: Vec<u32>| vec![DraftDist::Candidates(v)];
        // Off: every follower, any depth.
        assert_eq!(run(SpecLimits::default()), (c(vec![1, 3, 2]), c(vec![7])));
        // min_prob 0.25 drops 2 and 3 (0.2 each); 1 (0.6) then 7 (0.6 · 1) stay.
        let p = SpecLimits {
            factor: 0.0,
            min_prob: 0.25,
        };
        assert_eq!(run(p), (c(vec![1]), c(vec![7])));
        // 0.7 drops everything at the root; below it (its parent's token never drafted, so
        // its path probability is not known) the conditional alone counts.
        let p = SpecLimits {
            factor: 0.0,
            min_prob: 0.7,
        };
        assert_eq!(run(p), (c(vec![]), c(vec![7])));
        // factor 1 × a 1-token match: one token a path; factor 2: two.
        let f = |factor| SpecLimits {
            factor,
            min_prob: 0.0,
        };
        assert_eq!(run(f(1.0)), (c(vec![1, 3, 2]), c(vec![])));
        assert_eq!(run(f(2.0)), (c(vec![1, 3, 2]), c(vec![7])));
        let named = SuffixDrafter::new(8, 16).with_limits(SpecLimits {
            factor: 1.0,
            min_prob: 0.1,
        });
        assert_eq!(named.name(), "suffix:8:factor=1:min_prob=0.1");
    }

    #[test]
    fn the_global_tree_stops_growing_at_its_cap() {
        let global = GlobalSuffixTree::new(2);
        let long: Vec<u32> = (0..GlobalSuffixTree::MAX_TOKENS as u32 + 10)
            .map(|i| i % 7)
            .collect();
        global.add_output(&long);
        assert_eq!(global.len(), GlobalSuffixTree::MAX_TOKENS);
        global.add_output(&[1, 2, 3]);
        assert_eq!(global.len(), GlobalSuffixTree::MAX_TOKENS);
    }

    #[test]
    fn with_a_corpus_the_longer_match_drafts_and_the_sequence_wins_ties() {
        let tree = DraftTree::root();
        // The corpus saw "1 2 3" then 9, and "2 3" then 5; the sequence saw "2 3" then 4.
        let corpus = Arc::new(CorpusIndex::new(vec![1, 2, 3, 9, 0, 2, 3, 5, 2, 3, 5], 8));
        let mut d = SuffixDrafter::with_corpus(8, 16, corpus);
        assert_eq!(d.name(), "suffix:8+corpus(11 tokens)");
        // Context "... 1 2 3": the corpus matches 3 tokens, the sequence 2.
        d.begin(&[2, 3, 4, 1, 2, 3]).unwrap();
        let got = d.expand(&tree, &[3], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![9])]);
        // Context "... 8 2 3": both match 2 tokens ("2 3"): the sequence's follower drafts.
        d.begin(&[2, 3, 4, 8, 2, 3]).unwrap();
        let got = d.expand(&tree, &[3], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![4])]);
        // Nothing in the sequence: the corpus alone ("3" → 5 twice, 9 once).
        d.begin(&[7, 3]).unwrap();
        let got = d.expand(&tree, &[3], &[0]).unwrap();
        assert_eq!(got, vec![DraftDist::Candidates(vec![5, 9])]);
    }
}
