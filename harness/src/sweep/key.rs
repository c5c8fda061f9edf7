//! A grid point's identity and the shard it belongs to. A `PointKey` is the point's
//! coordinates written `name=value name=value ...` in its family's order; its shard is the
//! XXH3 64-bit hash (seed 0) of those bytes reduced to `0..n` by the high bits (Lemire's
//! multiply-shift). XXH3's output is fixed by the xxHash specification, so every machine,
//! build and Rust release assigns a point to the same shard — unlike std's `DefaultHasher`,
//! whose keys are random per process and whose algorithm may change (an HPC benchmark's
//! Slurm sharding lost points that way) — and the assignment depends on the key alone,
//! never on the point's position: adding a point to a grid moves no other point. (FNV-1a,
//! tried first, leaves its high bits nearly blind to the last bytes: `kv_len=1` … `kv_len=9`
//! all landed in one shard.)

use crate::error::{HarnessError, Result};
use std::fmt;

/// A grid point's coordinates as text: what the CSV's `point` column holds, what a shard
/// is chosen by and what resume and merge match rows on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PointKey(String);

impl PointKey {
    /// The key of the point with these coordinates, in this order:
    /// `PointKey::of(&[("shape", &"64x96"), ("batch", &4)])` is `shape=64x96 batch=4`.
    pub fn of(parts: &[(&str, &dyn fmt::Display)]) -> PointKey {
        let text: Vec<String> = parts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        PointKey(text.join(" "))
    }

    /// A key read back from a CSV's `point` column.
    pub fn from_text(text: &str) -> PointKey {
        PointKey(text.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shard of `count` this point belongs to.
    pub fn shard(&self, count: usize) -> usize {
        let reduced = (u128::from(digest(self.0.as_bytes())) * count as u128) >> 64;
        reduced as usize
    }
}

impl fmt::Display for PointKey {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// XXH3-64 of `bytes`: stable across processes, machines and builds.
pub fn digest(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// `--shard i/n`: the i-th of n shards, counted from 0 (Slurm's `SLURM_ARRAY_TASK_ID` of
/// `--array=0-(n-1)`, Kubernetes' `JOB_COMPLETION_INDEX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// The whole grid as one shard (`--resume` or `--sweep-id` without `--shard`).
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Parses `i/n`: one line naming the problem otherwise.
    pub fn parse(text: &str) -> Result<Shard> {
        let bad = |why: &str| HarnessError::Usage(format!("--shard {text}: {why}"));
        let (i, n) = text
            .split_once('/')
            .and_then(|(i, n)| {
                Some((
                    i.trim().parse::<usize>().ok()?,
                    n.trim().parse::<usize>().ok()?,
                ))
            })
            .ok_or_else(|| bad("want INDEX/COUNT, e.g. 0/4 (the first of four shards)"))?;
        if n == 0 {
            return Err(bad("the shard count must be at least 1"));
        }
        if i >= n {
            return Err(bad(&format!(
                "the index counts from 0, so it must be below the count (0..={})",
                n - 1
            )));
        }
        Ok(Shard { index: i, count: n })
    }

    /// Whether `key` is this shard's.
    pub fn owns(&self, key: &PointKey) -> bool {
        key.shard(self.count) == self.index
    }

    /// `shard-<i>-of-<n>`, the part of the file names after the sweep id.
    pub fn label(&self) -> String {
        format!("shard-{}-of-{}", self.index, self.count)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_xxh3_and_fixed() {
        // XXH3-64 of the empty input, from the xxHash specification; a build or machine that
        // hashed differently would put points in other shards than those already written.
        assert_eq!(digest(b""), 0x2d06_8005_38d3_94c2);
        let key = PointKey::of(&[("mode", &"decode"), ("kv_len", &1024)]);
        assert_eq!(key.as_str(), "mode=decode kv_len=1024");
        assert_eq!(key.shard(1), 0);
        // Pinned: shard files written today must be read the same way by later builds.
        assert_eq!(digest(key.as_str().as_bytes()), 0x5d8c_12a5_ee27_c8a1);
        assert_eq!((key.shard(4), key.shard(7)), (1, 2));
    }

    #[test]
    fn keys_spread_over_shards_and_stay_put_when_the_grid_grows() {
        // Keys that differ only in their last characters, as grid keys do.
        let keys: Vec<PointKey> = (0..400)
            .map(|i| PointKey::of(&[("batch", &(i % 3)), ("kv_len", &(i / 3))]))
            .collect();
        for n in [2, 3, 4, 8] {
            let mut counts = vec![0usize; n];
            for k in &keys {
                counts[k.shard(n)] += 1;
            }
            let even = keys.len() / n;
            assert!(
                counts.iter().all(|&c| c > even * 2 / 3 && c < even * 4 / 3),
                "{n} shards: {counts:?}"
            );
        }
        // A point's shard depends on its key only: the same key in a larger grid keeps it.
        let before: Vec<usize> = keys[..100].iter().map(|k| k.shard(4)).collect();
        let after: Vec<usize> = keys.iter().take(100).map(|k| k.shard(4)).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn shard_arguments_are_checked() {
        assert_eq!(Shard::parse("2/4").unwrap(), Shard { index: 2, count: 4 });
        assert_eq!(Shard::parse("0/1").unwrap(), Shard::WHOLE);
        for (bad, why) in [
            ("3/2", "below the count"),
            ("2/2", "below the count"),
            ("0/0", "at least 1"),
            ("1", "INDEX/COUNT"),
            ("-1/2", "INDEX/COUNT"),
            ("a/b", "INDEX/COUNT"),
        ] {
            let e = Shard::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(why) && e.starts_with(&format!("--shard {bad}")),
                "{bad}: {e}"
            );
        }
        assert_eq!(Shard { index: 1, count: 3 }.label(), "shard-1-of-3");
    }
}
