//! How busy the machine was around a run, for its provenance: the load average at the start
//! and the end, and the CPU other processes took meanwhile (from `/proc/stat` less the time of
//! this process and its descendants — peers and the tools they run, reaped or alive — from
//! `/proc/<pid>/stat`), so a result measured beside a compile says so, and one measured
//! beside its own peers does not.
//! Linux only; elsewhere the record is absent.

use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// Other processes' average use above this many cores makes the run warn.
pub const WARN_OTHER_CORES: f64 = 0.25;

/// The machine's load around a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoadRecord {
    /// `/proc/loadavg`'s 1, 5 and 15-minute averages when the run started.
    pub loadavg_start: [f64; 3],
    /// The same when it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loadavg_end: Option<[f64; 3]>,
    /// Cores' worth of CPU time other processes used on average during the run (0 on a quiet
    /// machine; 1.0 is one core kept busy throughout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_cores: Option<f64>,
}

/// A reading of the counters.
#[derive(Debug, Clone, Copy)]
struct Sample {
    loadavg: [f64; 3],
    /// All CPUs' busy and total jiffies, and this process tree's (user + system).
    busy: u64,
    total: u64,
    own: u64,
    cpus: usize,
}

fn sample() -> Option<Sample> {
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut avg = loadavg.split_whitespace().map(|v| v.parse::<f64>().ok());
    let loadavg = [avg.next()??, avg.next()??, avg.next()??];
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = cpu
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    let own = tree_jiffies(std::process::id())?;
    Some(Sample {
        loadavg,
        busy: total - idle,
        total,
        own,
        cpus,
    })
}

/// The parent pid and the user + system jiffies of a `/proc/<pid>/stat` line, its reaped
/// children's included (fields after the command's closing parenthesis: ppid 2nd, utime,
/// stime, cutime, cstime 12th–15th).
fn stat_fields(stat: &str) -> Option<(u32, u64)> {
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let n = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some((f.get(1)?.parse().ok()?, n(11)? + n(12)? + n(13)? + n(14)?))
}

/// CPU jiffies of process `root` and every live descendant, each with its reaped children.
fn tree_jiffies(root: u32) -> Option<u64> {
    let own = stat_fields(&std::fs::read_to_string(format!("/proc/{root}/stat")).ok()?)?.1;
    let mut procs: Vec<(u32, u32, u64)> = vec![];
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit between the listing and the read: it is skipped.
        if let Some((ppid, j)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| stat_fields(&s))
        {
            procs.push((pid, ppid, j));
        }
    }
    let (mut tree, mut total) = (vec![root], own);
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        for &(pid, ppid, j) in &procs {
            if ppid == parent && pid != root {
                tree.push(pid);
                total += j;
            }
        }
        i += 1;
    }
    Some(total)
}

static START: OnceLock<Option<Sample>> = OnceLock::new();

/// The record for a run starting now (read once per process: the first call's reading).
pub fn at_start() -> Option<LoadRecord> {
    let s = (*START.get_or_init(sample))?;
    Some(LoadRecord {
        loadavg_start: s.loadavg,
        loadavg_end: None,
        other_cores: None,
    })
}

/// Completes `record` at the end of the run, and returns a warning line when other
/// processes used more than [`WARN_OTHER_CORES`].
pub fn at_end(record: &mut Option<LoadRecord>) -> Option<String> {
    let start = (*START.get()?)?;
    let end = sample()?;
    let rec = record.as_mut()?;
    rec.loadavg_end = Some(end.loadavg);
    let other = other_cores(&start, &end);
    rec.other_cores = Some((other * 100.0).round() / 100.0);
    (other > WARN_OTHER_CORES).then(|| {
        format!(
            "warning: other processes used {other:.2} cores on average during this run (load average {:.2} at the start, {:.2} at the end); its times may be slower than on a quiet machine",
            start.loadavg[0], end.loadavg[0]
        )
    })
}

/// Cores' worth of busy time not spent by this process between two readings.
fn other_cores(start: &Sample, end: &Sample) -> f64 {
    let total = end.total.saturating_sub(start.total);
    if total == 0 {
        return 0.0;
    }
    let busy = end.busy.saturating_sub(start.busy);
    let own = end.own.saturating_sub(start.own);
    (busy.saturating_sub(own) as f64 / total as f64 * start.cpus as f64).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_cores_is_busy_time_less_our_own_over_the_elapsed_cpu_time() {
        let s = |busy, total, own| Sample {
            loadavg: [0.0; 3],
            busy,
            total,
            own,
            cpus: 2,
        };
        // 200 jiffies elapsed over 2 CPUs (1 s at 100 Hz): 150 busy, 50 of them ours.
        assert!((other_cores(&s(0, 0, 0), &s(150, 200, 50)) - 1.0).abs() < 1e-12);
        assert_eq!(other_cores(&s(0, 0, 0), &s(50, 200, 50)), 0.0);
        assert_eq!(other_cores(&s(5, 5, 5), &s(5, 5, 5)), 0.0);
    }

    #[test]
    fn a_stat_line_gives_the_parent_and_the_jiffies_with_reaped_children() {
        // A command name with spaces and a parenthesis, as /proc allows.
        let line = "4242 (peer (py) x) S 17 4242 4242 0 -1 4194560 1 0 0 0 30 7 100 20 20 0";
        assert_eq!(stat_fields(line), Some((17, 30 + 7 + 100 + 20)));
        assert_eq!(stat_fields("garbage"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_childs_cpu_time_counts_as_ours() {
        // A child that burns about 0.3 s of CPU: alive or reaped, its time is the tree's.
        let me = std::process::id();
        let before = tree_jiffies(me).unwrap();
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let after = tree_jiffies(me).unwrap();
        assert!(after >= before + 5, "{before} -> {after} jiffies");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_reading_of_this_machine_parses() {
        let s = sample().expect("/proc readable");
        assert!(s.cpus >= 1 && s.total >= s.busy && s.loadavg[0] >= 0.0);
    }
}
