//! The values a piece of evidence gives: the cited run found (by id, or the newest finished
//! run) and refused when it is missing, unfinished or has failed rows among the matching
//! ones; the rows filtered; per row a value (a column, or an expression over its columns and
//! the provenance) with its noise interval; then optionally the best row per group, or ratios
//! between two sets of rows paired on their grid point (one partner, or the max / min /
//! median of several, or each set's best within a common reach of another column). No rows
//! left: the reason, which makes a check untested. Nothing here knows a family.

use crate::report::claims::{describe_filter, Evidence, Noise, Ratio, Stat};
use crate::report::expr::Expr;
use crate::report::pages::{machine_id, setting};
use crate::report::table::{key_columns, point_of, run_csvs, Table};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The run a piece of evidence was read from.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRef {
    pub experiment: String,
    pub run_id: String,
    pub dirty: bool,
    /// The machine (`machines.md`'s name: CPU, widest ISA, cores).
    pub machine: String,
    /// The ISA tier and threads the run used.
    pub setting: String,
}

/// One value with the point it was measured at.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    /// The value's `by` columns, `name=value` (its group in a findings table).
    pub group: String,
    /// Every column that names its point.
    pub condition: String,
    pub value: f64,
    /// Its noise interval, when the evidence declares one and the row has it.
    pub interval: Option<(f64, f64)>,
}

/// The values of a piece of evidence, or why there are none.
pub type Values = std::result::Result<(RunRef, Vec<Value>), String>;

/// Whether a cell matches a filter value (`a|b`, `prefix*`, `>2`).
pub fn matches(cell: &str, want: &str) -> bool {
    want.split('|').any(|w| {
        if let Some(hit) = compares(cell, w) {
            return hit;
        }
        match w.strip_suffix('*') {
            Some(prefix) => cell.starts_with(prefix),
            None => cell == w,
        }
    })
}

/// A numeric filter (`>2`, `<=0.5`): whether the cell passes it; `None` when `want` is not one.
/// A cell that is not a number passes no numeric filter.
fn compares(cell: &str, want: &str) -> Option<bool> {
    type Compare = fn(f64, f64) -> bool;
    let ops: [(&str, Compare); 4] = [
        (">=", |a, b| a >= b),
        ("<=", |a, b| a <= b),
        (">", |a, b| a > b),
        ("<", |a, b| a < b),
    ];
    let (op, bound) = ops.iter().find_map(|(p, op)| {
        let x: f64 = want.strip_prefix(p)?.trim().parse().ok()?;
        Some((op, x))
    })?;
    Some(cell.trim().parse::<f64>().is_ok_and(|v| op(v, bound)))
}

fn matches_all(t: &Table, row: &[String], filter: &BTreeMap<String, String>) -> bool {
    filter.iter().all(|(c, want)| matches(t.get(row, c), want))
}

/// The run's CSV, provenance and reference, or why it cannot be used.
fn find_run(
    results: &Path,
    ev: &Evidence,
) -> std::result::Result<(PathBuf, serde_json::Value, RunRef), String> {
    let dir = results.join(&ev.experiment);
    let csv = match &ev.run {
        Some(id) => dir.join(format!("{id}.csv")),
        None => newest_run_on(&dir, &ev.device).ok_or_else(|| {
            format!(
                "no run of {} on {} in results/ yet",
                ev.experiment, ev.device
            )
        })?,
    };
    let id = csv
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !csv.is_file() {
        return Err(format!("run {}/{id} is not in results/", ev.experiment));
    }
    let prov: serde_json::Value = std::fs::read_to_string(csv.with_extension("json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("run {}/{id} has no readable provenance", ev.experiment))?;
    let status = prov.get("status").and_then(|v| v.as_str()).unwrap_or("");
    if status != "finished" {
        return Err(format!(
            "run {}/{id} did not finish (status: {status})",
            ev.experiment
        ));
    }
    let run = RunRef {
        experiment: ev.experiment.clone(),
        run_id: id,
        dirty: prov
            .get("git_dirty")
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
        machine: machine_id(&prov),
        setting: setting(&prov),
    };
    Ok((csv, prov, run))
}

/// The newest run under `dir` whose provenance names `device` (`cpu`, or `cuda` for any
/// `cuda:N`; a provenance without a device is a CPU run's).
fn newest_run_on(dir: &Path, device: &str) -> Option<PathBuf> {
    run_csvs(dir).ok()?.into_iter().rev().find(|csv| {
        let ran_on = std::fs::read_to_string(csv.with_extension("json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("device").and_then(|d| d.as_str()).map(String::from))
            .unwrap_or_else(|| "cpu".into());
        ran_on.split(':').next() == Some(device)
    })
}

/// A provenance number by dotted path (`roofline.read_gbps`).
fn provenance_number(prov: &serde_json::Value, path: &str) -> Option<f64> {
    path.split('.')
        .try_fold(prov, |v, k| v.get(k))
        .and_then(|v| v.as_f64())
}

/// What a row gives: its value and noise interval.
struct RowValue<'r> {
    row: &'r [String],
    value: f64,
    interval: Option<(f64, f64)>,
}

/// The values a piece of evidence gives, from `results`.
pub fn values(results: &Path, ev: &Evidence) -> Values {
    let (csv, prov, run) = find_run(results, ev)?;
    let t = Table::read(&csv).map_err(|e| e.one_line())?;
    let expr = Expr::parse(&ev.column).map_err(|e| format!("column {e}"))?;
    let mut wanted: Vec<&str> = ev.filter.keys().map(String::as_str).collect();
    wanted.extend(expr.names().into_iter().filter(|n| !n.contains('.')));
    wanted.extend(ev.by.iter().map(String::as_str));
    if let Some(r) = &ev.ratio {
        wanted.extend(
            r.of.keys()
                .chain(r.over.keys())
                .chain(&r.on)
                .map(String::as_str),
        );
        wanted.extend(r.at_equal.as_deref());
    }
    if let Some(b) = &ev.best {
        wanted.push(&b.max);
        wanted.extend(b.per.iter().map(String::as_str));
    }
    if let Some(missing) = wanted.iter().find(|c| t.col(c).is_none()) {
        return Err(format!(
            "run {}/{} has no column {missing}",
            run.experiment, run.run_id
        ));
    }
    if let Some(p) = expr
        .names()
        .into_iter()
        .find(|n| n.contains('.') && provenance_number(&prov, n).is_none())
    {
        return Err(format!(
            "run {}/{} records no {p} in its provenance",
            run.experiment, run.run_id
        ));
    }
    let rows: Vec<&[String]> = t
        .rows
        .iter()
        .map(Vec::as_slice)
        .filter(|r| matches_all(&t, r, &ev.filter))
        .collect();
    let failed = rows
        .iter()
        .filter(|r| matches!(t.get(r, "status"), "fail" | "error"))
        .count();
    if failed > 0 {
        return Err(format!(
            "{failed} of its rows failed in run {}/{}",
            run.experiment, run.run_id
        ));
    }
    let mut rows: Vec<RowValue> = rows
        .into_iter()
        .filter(|r| matches!(t.get(r, "status"), "ok" | ""))
        .filter_map(|row| {
            let lookup = |n: &str| {
                if n.contains('.') {
                    provenance_number(&prov, n)
                } else {
                    t.number(row, n)
                }
            };
            let value = expr.eval(&lookup).filter(|v| v.is_finite())?;
            Some(RowValue {
                row,
                value,
                interval: interval(&t, row, value, ev.noise.as_ref()),
            })
        })
        .collect();
    if let Some(b) = &ev.best {
        let mut best: BTreeMap<String, RowValue> = BTreeMap::new();
        for r in rows {
            let score = t.number(r.row, &b.max).unwrap_or(f64::NEG_INFINITY);
            let key = point_of(&t, r.row, &b.per);
            let better = best
                .get(&key)
                .is_none_or(|old| score > t.number(old.row, &b.max).unwrap_or(f64::NEG_INFINITY));
            if better {
                best.insert(key, r);
            }
        }
        rows = best.into_values().collect();
    }
    let named = |keys: &[String]| {
        let mut n = ev.by.clone();
        n.extend(keys.iter().filter(|k| !ev.by.contains(k)).cloned());
        n
    };
    let values: Vec<Value> = match &ev.ratio {
        None => {
            let plain: Vec<&[String]> = rows.iter().map(|r| r.row).collect();
            let keys = key_columns(&[(&t, plain)], &[], &[&ev.column]);
            let cond = named(&keys);
            rows.iter()
                .map(|r| Value {
                    group: point_of(&t, r.row, &ev.by),
                    condition: point_of(&t, r.row, &cond),
                    value: r.value,
                    interval: r.interval,
                })
                .collect()
        }
        Some(ratio) => ratio_values(&t, &rows, ev, ratio, &named(&ratio.on)),
    };
    if values.is_empty() {
        return Err(match &ev.ratio {
            None => format!(
                "no row of run {}/{} matches {}",
                run.experiment,
                run.run_id,
                describe_filter(&ev.filter)
            ),
            Some(r) => format!(
                "no row of run {}/{} matching {} has a partner matching {} on {}",
                run.experiment,
                run.run_id,
                describe_filter(&r.of),
                describe_filter(&r.over),
                r.on.join(", ")
            ),
        });
    }
    Ok((run, values))
}

/// A row's noise interval for `value`.
fn interval(t: &Table, row: &[String], value: f64, noise: Option<&Noise>) -> Option<(f64, f64)> {
    match noise? {
        Noise::Named(kind) => {
            let median = t.number(row, "median_ms")?;
            let (p10, p90) = (t.number(row, "p10_ms")?, t.number(row, "p90_ms")?);
            let (lo, hi) = (p10 / median, p90 / median);
            if kind == "timing" {
                Some((value * lo, value * hi))
            } else {
                Some((value / hi, value / lo))
            }
        }
        Noise::Columns { lo, hi } => Some((t.number(row, lo)?, t.number(row, hi)?)),
        Noise::Stderr { stderr, k } => {
            let se = t.number(row, stderr)?;
            Some((value - k * se, value + k * se))
        }
    }
    .filter(|(a, b)| a.is_finite() && b.is_finite())
}

/// The row `stat` picks among `rows` (the lower middle for an even median).
fn pick<'a, 'r>(rows: &'a [&'a RowValue<'r>], stat: Stat) -> &'a RowValue<'r> {
    let mut sorted: Vec<&&RowValue> = rows.iter().collect();
    sorted.sort_by(|a, b| a.value.total_cmp(&b.value));
    match stat {
        Stat::Min => sorted[0],
        Stat::Max => sorted[sorted.len() - 1],
        Stat::Median => sorted[(sorted.len() - 1) / 2],
    }
}

/// `num / den` with the interval of a ratio of two noisy positive values.
fn divide(num: &RowValue, den: &RowValue) -> (f64, Option<(f64, f64)>) {
    let v = num.value / den.value;
    let i = match (num.interval, den.interval) {
        (Some((a, b)), Some((c, d))) => Some((a / d, b / c)),
        (Some((a, b)), None) => Some((a / den.value, b / den.value)),
        (None, Some((c, d))) => Some((num.value / d, num.value / c)),
        (None, None) => None,
    };
    (v, i.filter(|(a, b)| a.is_finite() && b.is_finite()))
}

/// The best `y` of a curve of (x, y) points, in the order given, with x within `reach`: the
/// points inside it and, on a segment that crosses it, y interpolated where x = reach.
fn best_within(points: &[(f64, f64)], reach: f64) -> Option<f64> {
    let mut best: Option<f64> = None;
    let mut take = |y: f64| best = Some(best.map_or(y, |b: f64| b.max(y)));
    for (i, &(x, y)) in points.iter().enumerate() {
        if x <= reach {
            take(y);
        }
        if let Some(&(x2, y2)) = points.get(i + 1) {
            if (x - reach) * (x2 - reach) < 0.0 {
                take(y + (y2 - y) * (reach - x) / (x2 - x));
            }
        }
    }
    best
}

/// `of` / `over` per point of `ratio.on`: each `of` row over its one partner (with `over_stat`,
/// the partner it picks; with `of_stat`, one `of` row per point), or with `at_equal` each set's
/// best within the reach both sets have. An `of` row with no partner, or with two and no
/// stat, gives no value (the pairing would be a guess).
fn ratio_values(
    t: &Table,
    rows: &[RowValue],
    ev: &Evidence,
    ratio: &Ratio,
    named: &[String],
) -> Vec<Value> {
    let mut over: BTreeMap<String, Vec<&RowValue>> = BTreeMap::new();
    let mut of: BTreeMap<String, Vec<&RowValue>> = BTreeMap::new();
    for r in rows {
        let point = point_of(t, r.row, &ratio.on);
        if matches_all(t, r.row, &ratio.over) {
            over.entry(point.clone()).or_default().push(r);
        }
        if matches_all(t, r.row, &ratio.of) {
            of.entry(point).or_default().push(r);
        }
    }
    let value = |row: &[String], v: f64, interval| Value {
        group: point_of(t, row, &ev.by),
        condition: point_of(t, row, named),
        value: v,
        interval,
    };
    let mut out = vec![];
    for (point, nums) in &of {
        let Some(dens) = over.get(point) else {
            continue;
        };
        if let Some(x) = &ratio.at_equal {
            let curve = |set: &[&RowValue]| -> Vec<(f64, f64)> {
                set.iter()
                    .filter_map(|r| Some((t.number(r.row, x)?, r.value)))
                    .collect()
            };
            let (a, b) = (curve(nums), curve(dens));
            let reach = |c: &[(f64, f64)]| c.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
            let r = reach(&a).min(reach(&b));
            if let (Some(ya), Some(yb)) = (best_within(&a, r), best_within(&b, r)) {
                out.push(value(nums[0].row, ya / yb, None));
            }
            continue;
        }
        let nums: Vec<&RowValue> = match ratio.of_stat {
            Some(s) => vec![pick(nums, s)],
            None => nums.clone(),
        };
        for num in nums {
            let partners: Vec<&RowValue> = dens
                .iter()
                .copied()
                .filter(|d| !std::ptr::eq(d.row, num.row))
                .collect();
            let den = match (ratio.over_stat, partners.as_slice()) {
                (_, []) => continue,
                (Some(s), _) => pick(&partners, s),
                (None, [one]) => one,
                (None, _) => continue,
            };
            let (v, i) = divide(num, den);
            if v.is_finite() {
                out.push(value(num.row, v, i));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_curves() {
        assert!(matches("flash2:br=64", "flash2*"));
        assert!(matches("paged", "naive|paged"));
        assert!(!matches("paged2", "paged"));
        assert!(matches("2.21", ">2") && !matches("2", ">2") && matches("2", ">=2"));
        assert!(matches("-0.3", "<0.5") && !matches("", "<0.5") && !matches("NaN", ">2"));
        assert!(
            matches(">2x", ">2x"),
            "not a number's bound: compared as text"
        );
        // Throughput along load, p95 latency as x: the best within a p95 of 150.
        let curve = [(100.0, 10.0), (140.0, 14.0), (200.0, 15.0)];
        assert_eq!(best_within(&curve, 140.0), Some(14.0));
        let at = best_within(&curve, 170.0).unwrap();
        assert!((at - 14.5).abs() < 1e-12, "{at}");
        assert_eq!(best_within(&curve, 50.0), None);
    }
}
