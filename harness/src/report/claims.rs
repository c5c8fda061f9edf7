//! Verdicts as data: `experiments/claims.toml` declares, per claim, which run's rows (an
//! experiment, a run id or its newest finished run, a filter) give which number (a column, or
//! the ratio of a column between two sets of rows joined on their grid point) and the rule the
//! claim's number sets (`>= 2`, `~ 40` within a tolerance, `between 2 3`). Evaluating a check
//! gives `holds` (every value passes), `refuted` (none does), `depends` (the `by` columns say
//! where it holds), or `untested` with the reason (run missing, unfinished, failed rows, no
//! matching rows). Nothing here knows a family: rows are read as text by column name.

use crate::error::{HarnessError, Result};
use crate::report::table::{key_columns, newest_run_csv, point_of, Table};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The declarations file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declarations {
    #[serde(default)]
    pub claim: Vec<ClaimDecl>,
    #[serde(default)]
    pub finding: Vec<FindingDecl>,
}

/// One claim of `claims.md` and the checks that judge it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimDecl {
    pub id: String,
    /// The claim in one English sentence.
    pub text: String,
    #[serde(default)]
    pub check: Vec<CheckDecl>,
    /// What it would take to test the part of the claim no check covers.
    pub untested: Option<String>,
}

/// Rows of one run, and the number each gives.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    pub experiment: String,
    /// A run id under results/<experiment>/; default: the newest finished run.
    pub run: Option<String>,
    /// column = value (`a|b` for either, a trailing `*` for a prefix).
    #[serde(default)]
    pub filter: BTreeMap<String, String>,
    pub column: String,
    /// The value is `column` of the rows matching `of` over the same column of the rows
    /// matching `over` at the same values of `on`.
    pub ratio: Option<Ratio>,
    /// Unit printed after the numbers.
    #[serde(default)]
    pub unit: String,
    /// The columns that name a value's condition (for `depends` and the findings tables).
    #[serde(default)]
    pub by: Vec<String>,
}

impl Evidence {
    /// "`column`", or "`column` of a=x over b=y" for a ratio.
    pub fn describe_value(&self) -> String {
        match &self.ratio {
            Some(r) => format!(
                "`{}` of {} over {}",
                self.column,
                describe_filter(&r.of),
                describe_filter(&r.over)
            ),
            None => format!("`{}`", self.column),
        }
    }
}

/// Two sets of rows whose values are divided, paired on the columns `on`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ratio {
    pub of: BTreeMap<String, String>,
    pub over: BTreeMap<String, String>,
    /// The columns a pair shares (the grid point without the columns `of` and `over` set).
    pub on: Vec<String>,
}

/// One part of a claim: the evidence and the rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckDecl {
    /// The part of the claim this checks, in words.
    pub what: String,
    #[serde(flatten)]
    pub evidence: Evidence,
    /// `>= x`, `<= x`, `> x`, `< x`, `~ x` (within `tolerance`), `between x y`.
    pub expect: String,
    /// Relative tolerance of `~` (default 0.1).
    pub tolerance: Option<f64>,
    /// `each` (default: every value must pass), `max`, `min` or `median` of the values.
    pub stat: Option<String>,
}

/// A findings table: the values of some rows, grouped by their `by` columns.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FindingDecl {
    pub title: String,
    #[serde(flatten)]
    pub evidence: Evidence,
}

/// A verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    Refuted,
    /// Where it holds and where not.
    Depends(String),
    /// Why not, or what it would take.
    Untested(String),
}

impl Verdict {
    /// `holds`, `refuted`, `depends`, `untested`.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Refuted => "refuted",
            Verdict::Depends(_) => "depends",
            Verdict::Untested(_) => "untested",
        }
    }
}

/// The run a piece of evidence was read from.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRef {
    pub experiment: String,
    pub run_id: String,
    pub dirty: bool,
    /// Machine, ISA, threads, device from the provenance.
    pub machine: String,
}

/// One value with the point it was measured at.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    /// The value's `by` columns, `name=value` (its group in a findings table).
    pub group: String,
    /// Every column that names its point.
    pub condition: String,
    pub value: f64,
}

/// The values of a piece of evidence, or why there are none.
pub type Values = std::result::Result<(RunRef, Vec<Value>), String>;

/// An evaluated check.
#[derive(Debug, Clone)]
pub struct Judged {
    pub verdict: Verdict,
    /// The numbers, in words.
    pub measured: String,
    pub run: Option<RunRef>,
    /// The values judged (empty when untested).
    pub values: Vec<f64>,
    /// The statistic judged: `max`/`min`/`median` when the check names one, else the median.
    pub marker: Option<f64>,
}

/// Reads and parses the declarations; a bad file is one line.
pub fn read(path: &Path) -> Result<Declarations> {
    let text = std::fs::read_to_string(path)
        .map_err(HarnessError::io(format!("reading {}", path.display())))?;
    let decl: Declarations = toml::from_str(&text)
        .map_err(|e| HarnessError::Usage(format!("{}: {e}", path.display())))?;
    for c in &decl.claim {
        for k in &c.check {
            Rule::parse(&k.expect, k.tolerance)
                .map_err(|e| HarnessError::Usage(format!("{}: {}: {e}", path.display(), c.id)))?;
        }
    }
    Ok(decl)
}

/// A parsed `expect`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    AtLeast(f64),
    AtMost(f64),
    Above(f64),
    Below(f64),
    Near(f64, f64),
    Between(f64, f64),
}

impl Rule {
    fn parse(text: &str, tolerance: Option<f64>) -> std::result::Result<Rule, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let num = |s: &str| {
            s.parse::<f64>()
                .map_err(|_| format!("expect \"{text}\": {s} is not a number"))
        };
        Ok(match words.as_slice() {
            [">=", x] => Rule::AtLeast(num(x)?),
            ["<=", x] => Rule::AtMost(num(x)?),
            [">", x] => Rule::Above(num(x)?),
            ["<", x] => Rule::Below(num(x)?),
            ["~", x] => Rule::Near(num(x)?, tolerance.unwrap_or(0.1)),
            ["between", x, y] => Rule::Between(num(x)?, num(y)?),
            _ => {
                return Err(format!(
                    "expect \"{text}\": use >= x, <= x, > x, < x, ~ x or between x y"
                ))
            }
        })
    }

    fn passes(self, v: f64) -> bool {
        match self {
            Rule::AtLeast(x) => v >= x,
            Rule::AtMost(x) => v <= x,
            Rule::Above(x) => v > x,
            Rule::Below(x) => v < x,
            Rule::Near(x, tol) => (v - x).abs() <= tol * x.abs(),
            Rule::Between(x, y) => v >= x && v <= y,
        }
    }
}

/// Whether a cell matches a filter value (`a|b`, `prefix*`).
fn matches(cell: &str, want: &str) -> bool {
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

/// The run's CSV and provenance, or why it cannot be used.
fn find_run(results: &Path, ev: &Evidence) -> std::result::Result<(PathBuf, RunRef), String> {
    let dir = results.join(&ev.experiment);
    let csv = match &ev.run {
        Some(id) => dir.join(format!("{id}.csv")),
        None => newest_run_csv(&dir)
            .ok()
            .flatten()
            .ok_or_else(|| format!("no run of {} in results/ yet", ev.experiment))?,
    };
    let id = csv
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !csv.is_file() {
        return Err(format!("run {}/{id} is not in results/", ev.experiment));
    }
    let json = csv.with_extension("json");
    let prov: serde_json::Value = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("run {}/{id} has no readable provenance", ev.experiment))?;
    let field = |k: &str| {
        prov.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let status = field("status");
    if status != "finished" {
        return Err(format!(
            "run {}/{id} did not finish (status: {status})",
            ev.experiment
        ));
    }
    let isa = match field("isa") {
        s if s.is_empty() => "ISA not recorded".to_string(),
        s => format!("isa {s}"),
    };
    let threads = prov.get("threads").and_then(|v| v.as_u64()).unwrap_or(0);
    let machine = format!(
        "{}, {isa}, {threads} threads, {}",
        field("cpu_model"),
        field("device")
    );
    let run = RunRef {
        experiment: ev.experiment.clone(),
        run_id: id,
        dirty: prov
            .get("git_dirty")
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
        machine,
    };
    Ok((csv, run))
}

/// The values a piece of evidence gives, from `results`.
pub fn values(results: &Path, ev: &Evidence) -> Values {
    let (csv, run) = find_run(results, ev)?;
    let t = Table::read(&csv).map_err(|e| e.one_line())?;
    let mut wanted: Vec<&str> = ev.filter.keys().map(String::as_str).collect();
    wanted.push(&ev.column);
    wanted.extend(ev.by.iter().map(String::as_str));
    if let Some(r) = &ev.ratio {
        wanted.extend(
            r.of.keys()
                .chain(r.over.keys())
                .chain(&r.on)
                .map(String::as_str),
        );
    }
    if let Some(missing) = wanted.iter().find(|c| t.col(c).is_none()) {
        return Err(format!(
            "run {}/{} has no column {missing}",
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
    let rows: Vec<&[String]> = rows
        .into_iter()
        .filter(|r| matches!(t.get(r, "status"), "ok" | ""))
        .collect();
    let condition = |row: &[String], keys: &[String], value: f64| -> Value {
        let mut named = ev.by.clone();
        named.extend(keys.iter().filter(|k| !ev.by.contains(k)).cloned());
        Value {
            group: point_of(&t, row, &ev.by),
            condition: point_of(&t, row, &named),
            value,
        }
    };
    let values: Vec<Value> = match &ev.ratio {
        None => {
            let keys = key_columns(&[(&t, rows.clone())], &[], &[&ev.column]);
            rows.iter()
                .filter_map(|r| t.number(r, &ev.column).map(|v| condition(r, &keys, v)))
                .collect()
        }
        Some(ratio) => ratio_values(&t, &rows, ev, ratio, condition),
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
                "no row of run {}/{} matching {} has one partner matching {} on {}",
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

/// `of` / `over` per pair of rows with the same values of `ratio.on`; an `of` row with no
/// partner, or with two, gives no value (the pairing would be a guess).
fn ratio_values(
    t: &Table,
    rows: &[&[String]],
    ev: &Evidence,
    ratio: &Ratio,
    condition: impl Fn(&[String], &[String], f64) -> Value,
) -> Vec<Value> {
    let mut by_point: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in rows.iter().filter(|r| matches_all(t, r, &ratio.over)) {
        if let Some(v) = t.number(r, &ev.column) {
            by_point
                .entry(point_of(t, r, &ratio.on))
                .or_default()
                .push(v);
        }
    }
    rows.iter()
        .filter(|r| matches_all(t, r, &ratio.of))
        .filter_map(|r| {
            let [den] = by_point.get(&point_of(t, r, &ratio.on))?.as_slice() else {
                return None;
            };
            let num = t.number(r, &ev.column)?;
            Some(condition(r, &ratio.on, num / den))
        })
        .collect()
}

/// `a=x, b=y|z` (or "all rows").
pub fn describe_filter(filter: &BTreeMap<String, String>) -> String {
    if filter.is_empty() {
        return "all rows".into();
    }
    filter
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A number for a table: 3 significant digits, no exponent for ordinary magnitudes.
pub fn num(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let mag = v.abs().log10().floor() as i32;
    if !(-3..6).contains(&mag) {
        return format!("{v:.2e}");
    }
    let digits = (2 - mag).max(0) as usize;
    format!("{v:.digits$}")
}

/// min–max over the values, with their count.
pub fn range(values: &[Value], unit: &str) -> String {
    let lo = values.iter().map(|v| v.value).fold(f64::INFINITY, f64::min);
    let hi = values
        .iter()
        .map(|v| v.value)
        .fold(f64::NEG_INFINITY, f64::max);
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    if values.len() == 1 {
        format!("{}{unit} (1 row)", num(lo))
    } else {
        format!("{}–{}{unit} ({} rows)", num(lo), num(hi), values.len())
    }
}

/// The median of the values.
pub fn median(values: &[Value]) -> f64 {
    let mut v: Vec<f64> = values.iter().map(|x| x.value).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Judges one check against `results`.
pub fn judge(results: &Path, check: &CheckDecl) -> Judged {
    let rule = Rule::parse(&check.expect, check.tolerance).expect("validated when read");
    let (run, values) = match values(results, &check.evidence) {
        Ok(v) => v,
        Err(reason) => {
            return Judged {
                verdict: Verdict::Untested(reason),
                measured: String::new(),
                run: None,
                values: vec![],
                marker: None,
            }
        }
    };
    let unit = &check.evidence.unit;
    let stat = check.stat.as_deref().unwrap_or("each");
    let single = |name: &str, v: f64| Judged {
        verdict: if rule.passes(v) {
            Verdict::Holds
        } else {
            Verdict::Refuted
        },
        measured: format!("{name} {} over {}", num(v), range(&values, unit)),
        run: Some(run.clone()),
        values: values.iter().map(|v| v.value).collect(),
        marker: Some(v),
    };
    let fold = |f: fn(f64, f64) -> f64, start: f64| values.iter().map(|v| v.value).fold(start, f);
    match stat {
        "max" => return single("max", fold(f64::max, f64::NEG_INFINITY)),
        "min" => return single("min", fold(f64::min, f64::INFINITY)),
        "median" => return single("median", median(&values)),
        _ => {}
    }
    let passing = values.iter().filter(|v| rule.passes(v.value)).count();
    let verdict = if passing == values.len() {
        Verdict::Holds
    } else if passing == 0 {
        Verdict::Refuted
    } else {
        Verdict::Depends(where_it_holds(&values, rule, &check.evidence.by))
    };
    Judged {
        verdict,
        measured: range(&values, unit),
        run: Some(run),
        marker: (!values.is_empty()).then(|| median(&values)),
        values: values.iter().map(|v| v.value).collect(),
    }
}

/// The number a check's rule states and the band that passes, in units of that number
/// (`>= x`: (1, 1); `~ x` within t: (1 − t, 1 + t); `between x y`: (1, y / x)).
pub fn claimed(check: &CheckDecl) -> (f64, (f64, f64)) {
    match Rule::parse(&check.expect, check.tolerance).expect("validated when read") {
        Rule::AtLeast(x) | Rule::AtMost(x) | Rule::Above(x) | Rule::Below(x) => (x, (1.0, 1.0)),
        Rule::Near(x, t) => (x, (1.0 - t, 1.0 + t)),
        Rule::Between(x, y) => (x, (1.0, y / x)),
    }
}

/// "holds at a=1, a=2; not at a=3" over the `by` columns (the row count without them).
fn where_it_holds(values: &[Value], rule: Rule, by: &[String]) -> String {
    let passing = values.iter().filter(|v| rule.passes(v.value)).count();
    if by.is_empty() {
        return format!("holds on {passing} of {} rows", values.len());
    }
    let mut groups: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for v in values {
        let g = groups.entry(v.group.clone()).or_default();
        g.0 += usize::from(rule.passes(v.value));
        g.1 += 1;
    }
    let list = |pick: &dyn Fn(&(usize, usize)) -> bool| {
        groups
            .iter()
            .filter(|(_, c)| pick(c))
            .map(|(k, _)| k.clone())
            .collect::<Vec<_>>()
            .join("; ")
    };
    let all = list(&|c| c.0 == c.1);
    let none = list(&|c| c.0 == 0);
    let some = list(&|c| c.0 > 0 && c.0 < c.1);
    let mut parts = vec![];
    if !all.is_empty() {
        parts.push(format!("holds at {all}"));
    }
    if !some.is_empty() {
        parts.push(format!("partly at {some}"));
    }
    if !none.is_empty() {
        parts.push(format!("not at {none}"));
    }
    parts.join("; ")
}

/// The verdict of a claim from its checks' and its untested part.
pub fn combine(claim: &ClaimDecl, judged: &[Judged]) -> Verdict {
    let tested: Vec<&Judged> = judged
        .iter()
        .filter(|j| !matches!(j.verdict, Verdict::Untested(_)))
        .collect();
    if tested.is_empty() {
        let mut reasons: Vec<String> = judged
            .iter()
            .filter_map(|j| match &j.verdict {
                Verdict::Untested(r) => Some(r.clone()),
                _ => None,
            })
            .collect();
        reasons.extend(claim.untested.clone());
        return Verdict::Untested(reasons.join("; "));
    }
    if tested.iter().all(|j| j.verdict == Verdict::Holds) {
        Verdict::Holds
    } else if tested.iter().all(|j| j.verdict == Verdict::Refuted) {
        Verdict::Refuted
    } else {
        let parts: Vec<String> = claim
            .check
            .iter()
            .zip(judged)
            .filter(|(_, j)| !matches!(j.verdict, Verdict::Untested(_)))
            .map(|(c, j)| match &j.verdict {
                Verdict::Depends(cond) => format!("{}: {cond}", c.what),
                v => format!("{}: {}", c.what, v.word()),
            })
            .collect();
        Verdict::Depends(parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_judge() {
        assert!(Rule::parse(">= 2", None).unwrap().passes(2.0));
        assert!(!Rule::parse("< 2", None).unwrap().passes(2.0));
        assert!(Rule::parse("~ 40", Some(0.05)).unwrap().passes(41.9));
        assert!(!Rule::parse("~ 40", Some(0.05)).unwrap().passes(42.1));
        assert!(Rule::parse("between 2 3", None).unwrap().passes(2.5));
        assert!(Rule::parse("= 2", None).is_err());
        assert!(Rule::parse(">= two", None).is_err());
        assert!(matches("flash2:br=64", "flash2*"));
        assert!(matches("paged", "naive|paged"));
        assert!(!matches("paged2", "paged"));
        assert!(matches("2.21", ">2") && !matches("2", ">2") && matches("2", ">=2"));
        assert!(matches("-0.3", "<0.5") && !matches("", "<0.5") && !matches("NaN", ">2"));
        assert!(
            matches(">2x", ">2x"),
            "not a number's bound: compared as text"
        );
        assert_eq!(num(2.0938), "2.09");
        assert_eq!(num(1234.5), "1234");
        assert_eq!(num(0.000123), "1.23e-4");
    }
}
