//! How busy the machine was around a run, for its provenance: the load average at the start
//! and the end, and the CPU other processes took meanwhile (from `/proc/stat` less this
//! process's own time in `/proc/self/stat`), so a result measured beside a compile says so.
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
    /// All CPUs' busy and total jiffies, and this process's (user + system).
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
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = own.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let own = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Sample {
        loadavg,
        busy: total - idle,
        total,
        own,
        cpus,
    })
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

    #[cfg(target_os = "linux")]
    #[test]
    fn a_reading_of_this_machine_parses() {
        let s = sample().expect("/proc readable");
        assert!(s.cpus >= 1 && s.total >= s.busy && s.loadavg[0] >= 0.0);
    }
}
