//! Verdicts as data: the declarations of `experiments/claims.toml`. Each claim is quoted as
//! `../shared/claims.md` writes it, with its seed section and the seed's own words, the
//! regime it is about (hardware, model), the strongest objection to its verdict, its parts no
//! check covers (each with what it would need), and its checks. A check names the part of
//! the claim it tests, what the claim states and what is measured, why those are the same
//! quantity (or the regime difference), its kind — `arithmetic` (machine-independent),
//! `analogue` (a CPU measurement of a mechanism that carries over) or `not-in-regime` (a GPU
//! or 7B claim: the CPU result is evidence on the mechanism, never its verdict) — and its
//! evidence: a calculation, or one run's rows (an experiment, a run or its newest finished
//! run, a filter, a column or an expression over columns, or the ratio of a column between
//! two sets of rows joined on their grid point), with the rule the claim's number sets.

use crate::error::{HarnessError, Result};
use crate::report::expr::Expr;
use crate::report::rule::{Direction, Rule};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

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
    /// The claim as `../shared/claims.md` writes it.
    pub claim: String,
    /// The seed document and section (`000 §2.1`).
    pub seed: String,
    /// The seed's own words the claim comes from.
    pub source: String,
    /// The hardware and model the claim is about.
    pub regime: String,
    /// How this verdict could be wrong: the strongest objection, and whether the data answer it.
    pub objection: String,
    #[serde(default)]
    pub check: Vec<CheckDecl>,
    /// Parts of the claim no check covers.
    #[serde(default)]
    pub untested: Vec<UntestedPart>,
}

/// A part of a claim no check covers, and what testing it would need.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UntestedPart {
    pub part: String,
    pub needs: String,
}

/// How a check's measurement relates to the claim's regime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Machine-independent: a calculation, or a count the hardware does not change.
    Arithmetic,
    /// A CPU measurement of a mechanism that carries over (the check says why).
    Analogue,
    /// The claim is about a GPU or a 7B model: the CPU result is evidence, not a verdict.
    NotInRegime,
}

impl Kind {
    pub fn word(self) -> &'static str {
        match self {
            Kind::Arithmetic => "arithmetic",
            Kind::Analogue => "CPU analogue",
            Kind::NotInRegime => "not in regime",
        }
    }
}

fn cpu_device() -> String {
    "cpu".into()
}

/// Rows of one run, and the number each gives.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    #[serde(default)]
    pub experiment: String,
    /// A run id under results/<experiment>/; default: the newest finished run on `device`.
    pub run: Option<String>,
    /// Where the default run ran: `cpu` (the default) or `cuda` (any GPU). A claim's CPU
    /// evidence is not replaced by a newer GPU run of the same experiment, nor the reverse.
    #[serde(default = "cpu_device")]
    pub device: String,
    /// column = value (`a|b` for either, a trailing `*` for a prefix, `>2` for a bound).
    #[serde(default)]
    pub filter: BTreeMap<String, String>,
    /// A column, or an expression over columns and provenance values (`roofline.read_gbps`).
    #[serde(default)]
    pub column: String,
    /// The value is `column` of the rows matching `of` over the same of the rows matching
    /// `over` at the same values of `on`.
    pub ratio: Option<Ratio>,
    /// Keep only the row with the largest `max` per group of `per` (the best configuration).
    pub best: Option<Best>,
    /// Unit printed after the numbers.
    #[serde(default)]
    pub unit: String,
    /// The columns that name a value's condition (for `depends` and the findings tables).
    #[serde(default)]
    pub by: Vec<String>,
    /// The noise a value carries; with it, a value whose interval crosses the rule is a tie.
    pub noise: Option<Noise>,
}

/// Two sets of rows whose values are divided, paired on the columns `on`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ratio {
    pub of: BTreeMap<String, String>,
    pub over: BTreeMap<String, String>,
    /// The columns a pair shares (the grid point without the columns `of` and `over` set).
    pub on: Vec<String>,
    /// With several `over` rows at a point: divide by their `max`, `min` or `median` row.
    pub over_stat: Option<Stat>,
    /// With several `of` rows at a point: take their `max`, `min` or `median` row.
    pub of_stat: Option<Stat>,
    /// Divide the two sets' best `column` among points whose `at_equal` column stays within
    /// the smaller of the two sets' largest values of it (throughput at equal latency).
    pub at_equal: Option<String>,
}

/// Which row of several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stat {
    Max,
    Min,
    Median,
}

/// The best row per group.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Best {
    pub max: String,
    pub per: Vec<String>,
}

/// Where a value's noise interval comes from.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Noise {
    /// `timing`: the rows' p10–p90 of `median_ms`, the value a time (or a ratio of times);
    /// `timing-rate`: the same for a value inversely proportional to time.
    Named(String),
    /// Columns holding the value's interval (a ratio divides the intervals).
    Columns { lo: String, hi: String },
    /// ± k standard errors from a column.
    Stderr { stderr: String, k: f64 },
}

/// One part of a claim: what it says, what is measured, and the rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckDecl {
    /// The part of the claim this checks, in the claim's words.
    pub part: String,
    pub kind: Kind,
    /// What the claim states: the quantity, its condition, its number.
    pub states: String,
    /// What is measured (or calculated).
    pub measures: String,
    /// Why that is the same quantity, or (not in regime) how the regimes differ.
    pub why: String,
    #[serde(flatten)]
    pub evidence: Evidence,
    /// An arithmetic check's calculation (instead of a run's rows).
    pub calc: Option<String>,
    /// `>= x`, `<= x`, `> x`, `< x`, `~ x` (within `tolerance`), `between x y`.
    pub expect: String,
    /// Relative tolerance of `~` (default 0.1).
    pub tolerance: Option<f64>,
    /// The side on which a value beyond the rule's band says the claim more strongly.
    pub stronger: Option<Direction>,
    /// `each` (default: every value must pass), `some` (an existence claim: one value
    /// suffices), or the `max`, `min` or `median` of the values.
    pub stat: Option<String>,
}

impl CheckDecl {
    /// The parsed rule (validated when read).
    pub fn rule(&self) -> Rule {
        Rule::parse(&self.expect, self.tolerance).expect("validated when read")
    }
}

/// A findings table: the values of some rows, grouped by their `by` columns.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FindingDecl {
    pub title: String,
    #[serde(flatten)]
    pub evidence: Evidence,
}

/// Reads, parses and checks the declarations; a bad file is one line naming the claim.
pub fn read(path: &Path) -> Result<Declarations> {
    let text = std::fs::read_to_string(path)
        .map_err(HarnessError::io(format!("reading {}", path.display())))?;
    let decl: Declarations = toml::from_str(&text)
        .map_err(|e| HarnessError::Usage(format!("{}: {e}", path.display())))?;
    let bad = |id: &str, e: String| HarnessError::Usage(format!("{}: {id}: {e}", path.display()));
    for c in &decl.claim {
        for k in &c.check {
            validate_check(k).map_err(|e| bad(&c.id, e))?;
        }
    }
    for f in &decl.finding {
        validate_evidence(&f.evidence).map_err(|e| bad(&f.title, e))?;
    }
    Ok(decl)
}

fn validate_check(k: &CheckDecl) -> std::result::Result<(), String> {
    let what = &k.part;
    Rule::parse(&k.expect, k.tolerance).map_err(|e| format!("{what}: {e}"))?;
    if let Some(s) = &k.stat {
        if !["each", "some", "max", "min", "median"].contains(&s.as_str()) {
            return Err(format!(
                "{what}: stat \"{s}\" is not each, some, max, min or median"
            ));
        }
    }
    match &k.calc {
        Some(calc) => {
            if k.kind != Kind::Arithmetic {
                return Err(format!("{what}: a calc check is arithmetic"));
            }
            if !k.evidence.experiment.is_empty() {
                return Err(format!(
                    "{what}: a check has a calc or an experiment, not both"
                ));
            }
            let e = Expr::parse(calc).map_err(|e| format!("{what}: calc {e}"))?;
            if let Some(n) = e.names().first() {
                return Err(format!(
                    "{what}: calc \"{calc}\" reads {n}: a calc is numbers only"
                ));
            }
            Ok(())
        }
        None => validate_evidence(&k.evidence).map_err(|e| format!("{what}: {e}")),
    }
}

fn validate_evidence(ev: &Evidence) -> std::result::Result<(), String> {
    if ev.experiment.is_empty() || ev.column.is_empty() {
        return Err("evidence needs an experiment and a column (or a calc)".into());
    }
    let e = Expr::parse(&ev.column).map_err(|e| format!("column {e}"))?;
    if let Some(Noise::Named(n)) = &ev.noise {
        if !["timing", "timing-rate"].contains(&n.as_str()) {
            return Err(format!("noise \"{n}\" is not timing or timing-rate"));
        }
    }
    if let (Some(r), Some(_)) = (&ev.ratio, &ev.best) {
        return Err(format!(
            "a ratio ({} over {}) and a best row cannot be combined",
            describe_filter(&r.of),
            describe_filter(&r.over)
        ));
    }
    if let Some(r) = &ev.ratio {
        if r.at_equal.is_some() && (r.of_stat.is_some() || r.over_stat.is_some()) {
            return Err("at_equal takes the best of each set: no of_stat or over_stat".into());
        }
        if r.at_equal.is_some() && e.column().is_none() {
            return Err("at_equal compares a column, not an expression".into());
        }
    }
    Ok(())
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

impl Evidence {
    /// "`column`", or "`column` of a=x over b=y" for a ratio.
    pub fn describe_value(&self) -> String {
        let best = self.best.as_ref().map_or(String::new(), |b| {
            format!(
                " of the row with the largest `{}` per {}",
                b.max,
                b.per.join(", ")
            )
        });
        match &self.ratio {
            Some(r) => {
                let stat = |s: Option<Stat>| match s {
                    Some(Stat::Max) => "the largest of ",
                    Some(Stat::Min) => "the smallest of ",
                    Some(Stat::Median) => "the median of ",
                    None => "",
                };
                let at = r.at_equal.as_ref().map_or(String::new(), |x| {
                    format!(" (each set's best with `{x}` within both sets' reach)")
                });
                format!(
                    "`{}` of {}{} over {}{}{at}",
                    self.column,
                    stat(r.of_stat),
                    describe_filter(&r.of),
                    stat(r.over_stat),
                    describe_filter(&r.over)
                )
            }
            None => format!("`{}`{best}", self.column),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim's words without its seed references (`(000 §2.1)`) and the research note
    /// after `->`, whitespace collapsed and a final period dropped.
    fn normal(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('(') {
            let is_ref = rest[at + 1..].bytes().take(3).all(|b| b.is_ascii_digit());
            match rest[at..].find(')') {
                Some(end) if is_ref => {
                    out += &rest[..at];
                    rest = &rest[at + end + 1..];
                }
                _ => {
                    out += &rest[..=at];
                    rest = &rest[at + 1..];
                }
            }
        }
        out += rest;
        let body = out.split(" -> ").next().unwrap_or("").to_string();
        let words: Vec<&str> = body.split_whitespace().collect();
        words.join(" ").trim_end_matches(['.', ' ']).to_string()
    }

    /// `../shared/claims.md`'s claims by id: a `- C<n>` line and its indented continuation.
    fn shared_claims(text: &str) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = BTreeMap::new();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let head = line.strip_prefix("- C").and_then(|r| {
                let n: String = r.chars().take_while(char::is_ascii_digit).collect();
                (!n.is_empty()).then(|| (format!("C{n}"), r[n.len()..].to_string()))
            });
            if let Some((id, body)) = head {
                out.insert(id.clone(), body);
                current = Some(id);
            } else if let (Some(id), true) = (&current, line.starts_with("      ")) {
                let t = out.get_mut(id).expect("inserted");
                *t += " ";
                *t += line.trim();
            } else {
                current = None;
            }
        }
        out.into_iter().map(|(k, v)| (k, normal(&v))).collect()
    }

    #[test]
    fn every_claim_is_declared_once_and_quoted_as_written() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let decl = read(&repo.join("experiments/claims.toml")).unwrap();
        let ids: Vec<&str> = decl.claim.iter().map(|c| c.id.as_str()).collect();
        let want: Vec<String> = (1..=27).map(|n| format!("C{n}")).collect();
        assert_eq!(ids, want);
        for c in &decl.claim {
            for (field, v) in [
                ("seed", &c.seed),
                ("source", &c.source),
                ("regime", &c.regime),
                ("objection", &c.objection),
            ] {
                assert!(!v.trim().is_empty(), "{}: empty {field}", c.id);
            }
        }
        let shared = std::env::var("WORKBENCH_SHARED")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| repo.join("../shared"));
        let Ok(text) = std::fs::read_to_string(shared.join("claims.md")) else {
            eprintln!(
                "SKIPPED: {} not found (set WORKBENCH_SHARED to the folder with claims.md)",
                shared.join("claims.md").display()
            );
            return;
        };
        let quoted = shared_claims(&text);
        for c in &decl.claim {
            assert_eq!(
                normal(&c.claim),
                quoted[&c.id],
                "{} is not quoted as written",
                c.id
            );
        }
    }

    #[test]
    fn claims_md_lines_are_read_without_references_or_notes() {
        let text = "## Memory\n- C2  KV per token = L x 2 bytes; \"40 KB\". (000 §1)\n      -> exact calculator.\n- C3  A 7B model (7 billion) holds ~2 GB. (004 §1)\n\nafter\n";
        let got = shared_claims(text);
        assert_eq!(got["C2"], "KV per token = L x 2 bytes; \"40 KB\"");
        assert_eq!(got["C3"], "A 7B model (7 billion) holds ~2 GB");
    }
}
