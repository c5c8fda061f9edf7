//! Retrieval drafting from a corpus (REST, He et al. 2023; SuffixDecoding's global tree over
//! earlier outputs, Oliaro et al. 2024): a token corpus indexed by a suffix array, so the
//! tokens that followed the longest suffix of the context anywhere in the corpus come out of
//! a binary search, ranked by how often they followed it. The suffix drafter consults it
//! beside its tree of the sequence itself and takes whichever matched the longer suffix.
//!
//! A suffix array (REST's datastore) rather than a suffix tree: 4 bytes a corpus token for
//! the index besides the tokens themselves, where a depth-limited tree holds a node (~80
//! bytes) for each new string; a megabyte of source is ~300k tokens.

use rayon::prelude::*;

/// What followed the longest matching suffix of a context (in a corpus or a suffix tree):
/// its length, the followers best first with their counts, and the count of every follower
/// (ranked or not).
#[derive(Debug, Clone, PartialEq)]
pub struct Followers {
    pub len: usize,
    pub next: Vec<(u32, u32)>,
    pub total: u32,
}

impl Followers {
    /// The match length and the followers' tokens, without their counts.
    pub fn tokens(self) -> (usize, Vec<u32>) {
        (self.len, self.next.into_iter().map(|(t, _)| t).collect())
    }
}

/// A token corpus and its suffixes sorted by their first `depth` tokens (ties by position).
#[derive(Debug, Clone)]
pub struct CorpusIndex {
    depth: usize,
    text: Vec<u32>,
    /// Start positions of the suffixes, in the order of their first `depth` tokens.
    order: Vec<u32>,
}

impl CorpusIndex {
    /// Indexes `text` for matches of up to `depth` − 1 tokens (`depth` at least 2). Panics
    /// if the corpus has 2³² tokens or more (positions are u32).
    pub fn new(text: Vec<u32>, depth: usize) -> CorpusIndex {
        let depth = depth.max(2);
        assert!(u32::try_from(text.len()).is_ok(), "corpus of 2^32 tokens");
        let mut order: Vec<u32> = (0..text.len() as u32).collect();
        let key = |p: u32| &text[p as usize..(p as usize + depth).min(text.len())];
        order.par_sort_unstable_by(|&a, &b| key(a).cmp(key(b)).then(a.cmp(&b)));
        CorpusIndex { depth, text, order }
    }

    /// The indexed tokens.
    pub fn len(&self) -> usize {
        self.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The suffixes (as a range of `order`) that start with `key`, followers or not.
    fn range(&self, key: &[u32]) -> std::ops::Range<usize> {
        let m = key.len();
        let head = |p: u32| &self.text[p as usize..(p as usize + m).min(self.text.len())];
        let lo = self.order.partition_point(|&p| head(p) < key);
        let hi = lo + self.order[lo..].partition_point(|&p| head(p) == key);
        lo..hi
    }

    /// The longest suffix of `context` (at most `depth` − 1 tokens) that occurs in the corpus
    /// followed by a token: its length, and the tokens that followed it with their counts,
    /// most frequent first (ties: the lower token id), at most `limit`; None when no suffix
    /// occurs.
    ///
    /// Inside a key's range the followers are sorted (the suffixes are sorted past the key),
    /// so each distinct follower is one run found by a binary search: a lookup costs
    /// O(depth · log n + distinct followers · log n), never a scan of the occurrences.
    pub fn longest_match(&self, context: &[u32], limit: usize) -> Option<Followers> {
        let longest = context.len().min(self.depth - 1);
        for m in (1..=longest).rev() {
            let key = &context[context.len() - m..];
            let range = self.range(key);
            let follower = |i: usize| self.text.get(self.order[i] as usize + m).copied();
            // A suffix that ends with the key has no follower and sorts first in its range.
            let mut at = range.start;
            while at < range.end && follower(at).is_none() {
                at += 1;
            }
            if at == range.end {
                continue;
            }
            let mut runs: Vec<(u32, usize)> = vec![];
            while at < range.end {
                let t = follower(at).expect("only the first suffixes lack followers");
                let len = self.order[at..range.end]
                    .partition_point(|&p| self.text.get(p as usize + m).is_some_and(|&f| f == t));
                runs.push((t, len));
                at += len;
            }
            runs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let total = runs.iter().map(|r| r.1 as u32).sum();
            return Some(Followers {
                len: m,
                next: runs
                    .into_iter()
                    .take(limit)
                    .map(|(t, n)| (t, n as u32))
                    .collect(),
                total,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// By brute force: the followers of the longest suffix of `ctx` (≤ depth − 1) that
    /// occurs with a follower in `text`, ranked as the index ranks them.
    fn brute(text: &[u32], ctx: &[u32], depth: usize) -> Option<Followers> {
        for m in (1..=ctx.len().min(depth - 1)).rev() {
            let key = &ctx[ctx.len() - m..];
            let mut seen: HashMap<u32, usize> = HashMap::new();
            for s in 0..text.len().saturating_sub(m) {
                if &text[s..s + m] == key {
                    *seen.entry(text[s + m]).or_default() += 1;
                }
            }
            if !seen.is_empty() {
                let mut v: Vec<(u32, usize)> = seen.into_iter().collect();
                v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                return Some(Followers {
                    len: m,
                    total: v.iter().map(|f| f.1 as u32).sum(),
                    next: v.into_iter().map(|(t, n)| (t, n as u32)).collect(),
                });
            }
        }
        None
    }

    #[test]
    fn continuations_equal_a_brute_force_count() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut draw = |k: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % k) as u32
        };
        for (len, alphabet) in [(0, 3), (1, 3), (7, 2), (500, 3), (2000, 6)] {
            let text: Vec<u32> = (0..len).map(|_| draw(alphabet)).collect();
            for depth in [2, 3, 5, 9] {
                let index = CorpusIndex::new(text.clone(), depth);
                assert_eq!(index.len(), len);
                for _ in 0..40 {
                    // Contexts from the text's own alphabet and one token beyond it.
                    let n = draw(12) as usize;
                    let ctx: Vec<u32> = (0..n).map(|_| draw(alphabet + 1)).collect();
                    for limit in [1, 2, usize::MAX] {
                        let want = brute(&text, &ctx, depth).map(|mut f| {
                            f.next.truncate(limit);
                            f
                        });
                        assert_eq!(
                            index.longest_match(&ctx, limit),
                            want,
                            "len {len}, depth {depth}, ctx {ctx:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_suffix_at_the_corpus_end_has_no_follower() {
        // "5 6" occurs only at the end; "6" alone is followed by 7 earlier on.
        let index = CorpusIndex::new(vec![6, 7, 1, 5, 6], 4);
        let tokens = |ctx: &[u32]| index.longest_match(ctx, 8).map(Followers::tokens);
        assert_eq!(tokens(&[5, 6]), Some((1, vec![7])));
        assert_eq!(tokens(&[9]), None);
        assert_eq!(tokens(&[]), None);
    }
}
