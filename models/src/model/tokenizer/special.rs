//! The special-token partition before tokenizing, as llama.cpp's
//! `llama_vocab::impl::tokenizer_st_partition` does it with `parse_special`: the control,
//! user-defined and unknown tokens, longest first, each cut out of every stretch of text still
//! left at its occurrences from left to right, so a longer special wins over a shorter one
//! wherever they overlap, whatever their positions. What is left is plain text for the
//! tokenizer proper.
//!
//! llama.cpp scans the whole text once per special token (Gemma-3 has 6,414). Since a piece left
//! over is a substring of the text, only the specials that occur in the text can ever match: a
//! walk over the specials sorted by their bytes (a trie by binary search) finds those first,
//! and the partition then runs over them alone, in llama.cpp's order.

use std::ops::Range;

/// One piece of a partitioned text.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fragment {
    /// Bytes of the text (never empty) that hold no special token.
    Text(Range<usize>),
    /// A special token.
    Token(u32),
}

/// The special tokens of a vocabulary, in the order the partition takes them.
pub(super) struct Specials {
    /// (text, id), longest text first; equal lengths by id (llama.cpp's `std::sort` leaves their
    /// order unspecified; it matters only where two specials of one length overlap).
    by_length: Vec<(Box<str>, u32)>,
    /// Indices into `by_length`, sorted by the text's bytes.
    by_bytes: Vec<usize>,
}

impl Specials {
    /// The partition over `tokens` (text, id); empty texts are never matched.
    pub(super) fn new(mut tokens: Vec<(Box<str>, u32)>) -> Specials {
        tokens.retain(|(t, _)| !t.is_empty());
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut by_bytes: Vec<usize> = (0..tokens.len()).collect();
        by_bytes.sort_by(|&a, &b| tokens[a].0.as_bytes().cmp(tokens[b].0.as_bytes()));
        Specials {
            by_length: tokens,
            by_bytes,
        }
    }

    /// The specials that occur in `text`, as indices into `by_length`, ascending.
    fn present(&self, text: &[u8]) -> Vec<usize> {
        let byte = |k: usize, at: usize| self.by_length[k].0.as_bytes().get(at).copied();
        let mut seen = vec![false; self.by_length.len()];
        for start in 0..text.len() {
            let (mut lo, mut hi) = (0, self.by_bytes.len());
            for (depth, &b) in text[start..].iter().enumerate() {
                // `lo..hi` holds the specials that begin with text[start..start + depth].
                let range = &self.by_bytes[lo..hi];
                let first = range.partition_point(|&k| byte(k, depth) < Some(b));
                let end = range.partition_point(|&k| byte(k, depth) <= Some(b));
                (lo, hi) = (lo + first, lo + end);
                if lo == hi {
                    break;
                }
                // A special equal to the prefix sorts before every longer one it begins.
                let k = self.by_bytes[lo];
                if self.by_length[k].0.len() == depth + 1 {
                    seen[k] = true;
                }
            }
        }
        (0..seen.len()).filter(|&k| seen[k]).collect()
    }

    /// `text` cut into plain stretches and special tokens, in order.
    pub(super) fn partition(&self, text: &str) -> Vec<Fragment> {
        if text.is_empty() {
            return vec![];
        }
        let mut pieces = vec![Fragment::Text(0..text.len())];
        for k in self.present(text.as_bytes()) {
            let (special, id) = (&*self.by_length[k].0, self.by_length[k].1);
            let mut cut = Vec::with_capacity(pieces.len() + 2);
            for piece in pieces {
                let Fragment::Text(range) = piece else {
                    cut.push(piece);
                    continue;
                };
                let mut at = range.start;
                while let Some(found) = text[at..range.end].find(special) {
                    if found > 0 {
                        cut.push(Fragment::Text(at..at + found));
                    }
                    cut.push(Fragment::Token(id));
                    at += found + special.len();
                }
                if at < range.end {
                    cut.push(Fragment::Text(at..range.end));
                }
            }
            pieces = cut;
        }
        pieces
    }
}

#[cfg(test)]
mod tests {
    use super::{Fragment, Specials};

    fn specials(list: &[(&str, u32)]) -> Specials {
        Specials::new(list.iter().map(|(t, i)| ((*t).into(), *i)).collect())
    }

    /// The partition written back as text, a special as `[id]`.
    fn show(s: &Specials, text: &str) -> String {
        s.partition(text)
            .iter()
            .map(|f| match f {
                Fragment::Text(r) => text[r.clone()].to_string(),
                Fragment::Token(id) => format!("[{id}]"),
            })
            .collect::<Vec<_>>()
            .join("|")
    }

    #[test]
    fn longer_specials_are_cut_first_wherever_they_are() {
        let s = specials(&[("xy", 1), ("yzw", 2), ("\n", 3), ("\n\n", 4), ("<a>", 5)]);
        // Leftmost-first would take "xy" here; llama.cpp takes the longer "yzw" first.
        assert_eq!(show(&s, "xyzw"), "x|[2]");
        assert_eq!(show(&s, "a\n\n\nb<a><a"), "a|[4]|[3]|b|[5]|<a");
        assert_eq!(show(&s, "<a>"), "[5]");
        assert_eq!(show(&s, "plain"), "plain");
        assert!(s.partition("").is_empty());
    }

    #[test]
    fn only_specials_in_the_text_are_found() {
        let s = specials(&[("<ab>", 1), ("<a", 2), ("<abc>", 3), ("b", 4), ("", 5)]);
        assert_eq!(s.present(b"x<ab>"), vec![1, 2, 3]); // "<ab>", "<a", "b"
        assert_eq!(s.present(b"<abc"), vec![2, 3]);
        assert_eq!(s.present(b"zzz"), Vec::<usize>::new());
        assert_eq!(show(&s, "<abc>b<ab"), "[3]|[4]|[2]|[4]");
    }
}
