//! Which grid points a run measures, decided in one place for every family: a runner asks
//! `owns(key)` before it makes a point's inputs and hands the point's rows to `written`.
//! A whole run owns every point; a shard the points whose key hashes to it, less those its
//! CSV already holds complete (`--resume`); `harness plan` owns none and only counts them.
//! Every key asked about is recorded in order (the grid's points, for `plan` and for the
//! merged CSV's row order), and a key written twice in one run is refused: it means a
//! family's key leaves out a coordinate, so two points would be merged as one.

use super::key::{PointKey, Shard};
use crate::error::{HarnessError, Result};
use std::collections::HashSet;

/// What a run does with the points of its grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Role {
    /// Measures every point (a plain `harness exp`).
    Whole,
    /// Measures the points of this shard.
    Shard(Shard),
    /// Measures nothing: counts points for `harness plan --shards n`.
    Plan(usize),
}

/// The points of a run: asked about, already done, written.
#[derive(Debug)]
pub struct PointBook {
    pub role: Role,
    done: HashSet<String>,
    seen: Vec<String>,
    seen_set: HashSet<String>,
    written: HashSet<String>,
}

impl PointBook {
    /// A book for `role`, with `done` the points already complete in the CSV.
    pub fn new(role: Role, done: HashSet<String>) -> PointBook {
        PointBook {
            role,
            done,
            seen: vec![],
            seen_set: HashSet::new(),
            written: HashSet::new(),
        }
    }

    /// Whether this run measures the point `key` (records it among the grid's points).
    pub fn owns(&mut self, key: &PointKey) -> bool {
        if self.seen_set.insert(key.as_str().to_string()) {
            self.seen.push(key.as_str().to_string());
        }
        match self.role {
            Role::Whole => true,
            Role::Shard(shard) => shard.owns(key) && !self.done.contains(key.as_str()),
            Role::Plan(_) => false,
        }
    }

    /// Records that the rows of `key` are written; refuses a point written before.
    pub fn written(&mut self, key: &PointKey) -> Result<()> {
        if self.done.contains(key.as_str()) || !self.written.insert(key.as_str().to_string()) {
            return Err(HarnessError::Usage(format!(
                "internal: the point '{key}' was measured twice in one sweep (its family's point key leaves out a coordinate)"
            )));
        }
        Ok(())
    }

    /// Every point key asked about, in order.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// Points complete before this run.
    pub fn done(&self) -> usize {
        self.done.len()
    }

    /// Points of the grid this shard (or whole run) measures, done ones included.
    pub fn owned(&self) -> usize {
        match self.role {
            Role::Whole => self.seen.len(),
            Role::Shard(shard) => self
                .seen
                .iter()
                .filter(|k| shard.owns(&PointKey::from_text(k)))
                .count(),
            Role::Plan(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> PointKey {
        PointKey::of(&[("kv_len", &i)])
    }

    #[test]
    fn shards_split_the_points_and_skip_done_ones() {
        let shards = 3;
        let mut owners = vec![];
        for index in 0..shards {
            let mut book = PointBook::new(
                Role::Shard(Shard {
                    index,
                    count: shards,
                }),
                HashSet::new(),
            );
            owners.push((0..30).filter(|&i| book.owns(&key(i))).collect::<Vec<_>>());
            assert_eq!(book.seen().len(), 30);
            assert_eq!(book.owned(), owners[index].len());
        }
        let mut all: Vec<usize> = owners.concat();
        all.sort();
        assert_eq!(
            all,
            (0..30).collect::<Vec<_>>(),
            "each point in exactly one shard"
        );

        let shard = Shard {
            index: 0,
            count: shards,
        };
        let first = owners[0][0];
        let mut resumed = PointBook::new(
            Role::Shard(shard),
            HashSet::from([key(first).as_str().to_string()]),
        );
        assert!(
            !resumed.owns(&key(first)),
            "done points are not measured again"
        );
        assert!(resumed.written(&key(first)).is_err());
        assert_eq!(resumed.done(), 1);

        let mut plan = PointBook::new(Role::Plan(4), HashSet::new());
        assert!(!plan.owns(&key(1)) && !plan.owns(&key(1)) && !plan.owns(&key(2)));
        assert_eq!(plan.seen().len(), 2, "asked twice, recorded once");
    }

    #[test]
    fn a_point_written_twice_is_refused() {
        let mut book = PointBook::new(Role::Whole, HashSet::new());
        assert!(book.owns(&key(1)));
        book.written(&key(1)).unwrap();
        let e = book.written(&key(1)).unwrap_err().to_string();
        assert!(e.contains("kv_len=1") && e.contains("twice"), "{e}");
    }
}
