//! `harness plan NAME --shards n`: how a sweep would split. The family's runner enumerates
//! its grid exactly as `harness exp` would (same validation, nothing measured, nothing
//! written); each point goes to the shard its key hashes to; rows per point are the run's
//! row count over its points, and the time estimate is the spec's `seconds_per_point` — the
//! timing budget of one row — times the rows. That is the budget of a timed family's rows
//! (at least 3 repetitions each, so a row slower than a third of the budget takes longer;
//! untimed checks and set-up come on top); families that time nothing (`kv`, `kv_alloc`)
//! finish far sooner.

use super::key::PointKey;
use crate::Format;
use serde::Serialize;
use std::fmt::Write as _;

/// The plan of one shard.
#[derive(Debug, Clone, Serialize)]
pub struct ShardPlan {
    pub shard: String,
    pub points: usize,
    pub rows: usize,
    pub seconds: f64,
}

/// The plan of a sweep.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub experiment: String,
    pub sweep_id: String,
    pub points: usize,
    pub rows: usize,
    pub seconds_per_row: f64,
    pub shards: Vec<ShardPlan>,
}

impl Plan {
    /// The plan of `points` (keys in grid order) and `rows` rows over `count` shards.
    pub fn new(
        experiment: &str,
        sweep_id: &str,
        points: &[String],
        rows: usize,
        count: usize,
        seconds_per_row: f64,
    ) -> Plan {
        let per_point = rows as f64 / points.len().max(1) as f64;
        let mut owned = vec![0usize; count];
        for k in points {
            owned[PointKey::from_text(k).shard(count)] += 1;
        }
        let shards = owned
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let rows = (n as f64 * per_point).round() as usize;
                ShardPlan {
                    shard: format!("{i}/{count}"),
                    points: n,
                    rows,
                    seconds: rows as f64 * seconds_per_row,
                }
            })
            .collect();
        Plan {
            experiment: experiment.into(),
            sweep_id: sweep_id.into(),
            points: points.len(),
            rows,
            seconds_per_row,
            shards,
        }
    }

    /// The plan as a table (or JSON); the table's last line is `sweep id: ID`, which
    /// `scripts/slurm/submit.sh` reads.
    pub fn render(&self, format: Format) -> String {
        if format == Format::Json {
            return serde_json::to_string_pretty(self).unwrap_or_default();
        }
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: {} points, {} rows; estimate = rows x seconds_per_point ({} s)\n",
            self.experiment, self.points, self.rows, self.seconds_per_row
        );
        let _ = writeln!(
            out,
            "| shard | points | rows | estimate |\n|---|---|---|---|"
        );
        for s in &self.shards {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                s.shard,
                s.points,
                s.rows,
                duration(s.seconds)
            );
        }
        let longest = self.shards.iter().map(|s| s.seconds).fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "\nlongest shard {} (the whole sweep on one machine: {})",
            duration(longest),
            duration(self.rows as f64 * self.seconds_per_row)
        );
        let _ = write!(out, "sweep id: {}", self.sweep_id);
        out
    }
}

/// `42 s`, `7 min`, `2.5 h`.
fn duration(seconds: f64) -> String {
    if seconds < 120.0 {
        format!("{seconds:.0} s")
    } else if seconds < 7200.0 {
        format!("{:.0} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_lands_in_one_shard_of_the_plan() {
        let points: Vec<String> = (0..50)
            .map(|i| PointKey::of(&[("kv_len", &i)]).as_str().to_string())
            .collect();
        let plan = Plan::new("e", "e-1", &points, 200, 3, 1.5);
        assert_eq!(plan.shards.iter().map(|s| s.points).sum::<usize>(), 50);
        for s in &plan.shards {
            assert_eq!(s.rows, s.points * 4);
            assert_eq!(s.seconds, s.rows as f64 * 1.5);
        }
        let text = plan.render(Format::Table);
        assert!(
            text.ends_with("sweep id: e-1") && text.contains("| 2/3 |"),
            "{text}"
        );
        assert_eq!(duration(90.0), "90 s");
        assert_eq!(duration(600.0), "10 min");
        assert_eq!(duration(9000.0), "2.5 h");
    }
}
