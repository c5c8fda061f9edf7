//! The memory guard: before a grid point allocates its inputs, its runner estimates the bytes
//! the point will hold (inputs, outputs, workspace, K/V, weights) and skips it with a note
//! when the estimate exceeds a budget — by default 80% of the memory the kernel reports
//! available when the run starts (`MemAvailable` of /proc/meminfo), or `--mem-budget` —
//! rather than aborting on a failed allocation or being killed by the OOM killer.
//! Shared layer: families import it; it imports no family.

use crate::error::{HarnessError, Result};

/// The share of available memory a run may plan to use by default.
const DEFAULT_SHARE: f64 = 0.8;

/// How many bytes a point may plan to hold, and where the number came from.
#[derive(Debug, Clone, PartialEq)]
pub struct MemBudget {
    pub bytes: u64,
    /// `--mem-budget 8GiB`, `80% of 22.9 GiB available`, or `no limit (...)`.
    pub origin: String,
}

impl Default for MemBudget {
    /// The machine's default (see `MemBudget::parse(None)`).
    fn default() -> Self {
        MemBudget::share_of_available(DEFAULT_SHARE, "80%")
    }
}

impl MemBudget {
    /// `--mem-budget`: a size (`12GiB`, `800MiB`, `2G`, `500M`, `4096` bytes; K/M/G/T are
    /// powers of 1024, as `free -h` shows) or a share of the memory available now (`50%`);
    /// `None` is 80% of the memory available now.
    pub fn parse(text: Option<&str>) -> Result<MemBudget> {
        let Some(text) = text else {
            return Ok(MemBudget::default());
        };
        let bad = |why: &str| {
            HarnessError::Usage(format!(
                "--mem-budget '{text}': {why} (a size such as 8GiB, 500M or 4096, or a share \
                 such as 50%)"
            ))
        };
        let t = text.trim();
        if let Some(pct) = t.strip_suffix('%') {
            let p: f64 = pct.trim().parse().map_err(|_| bad("not a percentage"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(bad("a share must be above 0% and at most 100%"));
            }
            return Ok(MemBudget::share_of_available(p / 100.0, t));
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num.parse().map_err(|_| bad("not a number"))?;
        let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" | "kib" => 1024.0,
            "m" | "mb" | "mib" => 1024.0 * 1024.0,
            "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
            "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return Err(bad("unknown unit")),
        };
        let bytes = n * scale;
        if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
            return Err(bad("out of range"));
        }
        Ok(MemBudget {
            bytes: bytes as u64,
            origin: format!("--mem-budget {t}"),
        })
    }

    /// `share` of the memory available now; no limit where the kernel does not say.
    fn share_of_available(share: f64, label: &str) -> MemBudget {
        match available_bytes() {
            Some(avail) => MemBudget {
                bytes: (avail as f64 * share) as u64,
                origin: format!("{label} of {} available", human(avail)),
            },
            None => MemBudget {
                bytes: u64::MAX,
                origin: "no limit (available memory unknown: no /proc/meminfo)".into(),
            },
        }
    }

    /// The note of a point that needs `need` bytes (`what`: the estimate's parts) when that is
    /// over the budget; `None` when it fits.
    pub fn refuse(&self, need: u64, what: &str) -> Option<String> {
        (need > self.bytes).then(|| {
            format!(
                "needs about {} ({what}), over the memory budget of {} ({}); --mem-budget \
                 raises it",
                human(need),
                human(self.bytes),
                self.origin
            )
        })
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
pub fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes as `1.5 GiB`, `12.0 MiB`, `900 B`.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    let units = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (name, shift) in units {
        let unit = (1u64 << shift) as f64;
        if b >= unit {
            return format!("{:.1} {name}", b / unit);
        }
    }
    format!("{bytes} B")
}

/// `a × b × ...` in u64, saturating (a grid's sizes multiplied for an estimate never wrap).
pub fn product(factors: &[usize]) -> u64 {
    factors
        .iter()
        .fold(1u64, |acc, &f| acc.saturating_mul(f as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_shares_parse() {
        assert_eq!(MemBudget::parse(Some("4096")).unwrap().bytes, 4096);
        assert_eq!(MemBudget::parse(Some("2K")).unwrap().bytes, 2048);
        assert_eq!(MemBudget::parse(Some("1.5GiB")).unwrap().bytes, 3 << 29);
        assert_eq!(MemBudget::parse(Some("500 MB")).unwrap().bytes, 500 << 20);
        if let Some(avail) = available_bytes() {
            let half = MemBudget::parse(Some("50%")).unwrap().bytes;
            assert!(half > 0 && half <= avail, "{half} of {avail}");
            assert!(MemBudget::default().bytes <= avail);
        }
        for bad in ["", "x", "12Q", "-3G", "0", "0%", "150%", "1e999"] {
            let e = MemBudget::parse(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("--mem-budget"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_point_over_the_budget_is_refused_with_both_numbers() {
        let b = MemBudget::parse(Some("1GiB")).unwrap();
        assert_eq!(b.refuse(1 << 30, "inputs"), None);
        let note = b.refuse(100 << 30, "inputs 100 GiB").unwrap();
        assert!(
            note.contains("100.0 GiB") && note.contains("1.0 GiB"),
            "{note}"
        );
        assert_eq!(product(&[usize::MAX, 4]), u64::MAX);
        assert_eq!(human(1536), "1.5 KiB");
    }
}
