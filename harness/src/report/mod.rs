//! `harness paper`: paper/ regenerated from results/ and `experiments/claims.toml` alone —
//! `claims.md` (each claim quoted with its seed section and regime, its verdict judged by the
//! declared rules, each check's statement, measurement, kind and numbers, the machines and
//! the runs, and how the verdict could be wrong), `findings.md` (declared ranges over all
//! rows of a filter, and every committed run), `method.md`, `machines.md` and `claims.svg`
//! (every check's measured values over the claim's number). The output is a pure function of
//! those files (sorted listings, no clock), so `--check` can compare it with the committed
//! paper/.

/// Claim and finding declarations.
pub mod claims;
/// The values a piece of evidence gives from a run's rows.
pub mod evidence;
/// Arithmetic over a row's columns.
pub mod expr;
/// `claims.svg`: measured over claimed, per check.
pub mod figure;
/// `method.md` and `machines.md`.
pub mod pages;
/// The rule a claim's number sets, ties, and numbers printed beside thresholds.
pub mod rule;
/// Any result CSV as text by column, and the grid point of a row.
pub mod table;
/// From values to verdicts.
pub mod verdict;

use crate::error::{HarnessError, Result};
use claims::{describe_filter, ClaimDecl, Kind};
use evidence::{values, RunRef};
use pages::GENERATED;
use rule::num;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use verdict::{combine, judge, median, range, Judged, Verdict};

/// What `harness paper` was asked to do.
pub struct PaperOptions {
    pub experiments_dir: PathBuf,
    pub results_dir: PathBuf,
    pub out: PathBuf,
    /// Compare with `out` instead of writing.
    pub check: bool,
}

/// The files `harness paper` owns in paper/ (others there are left alone).
pub const OWNED: &[&str] = &[
    "claims.md",
    "claims.svg",
    "findings.md",
    "method.md",
    "machines.md",
];

/// Writes paper/, or with `check` exits 1 naming the files that differ.
pub fn run(opts: &PaperOptions) -> Result<i32> {
    let files = generate(
        &opts.experiments_dir.join(crate::spec::CLAIMS_FILE),
        &opts.results_dir,
    )?;
    if opts.check {
        let stale: Vec<&str> = files
            .iter()
            .filter(|(name, text)| {
                std::fs::read_to_string(opts.out.join(name)).ok().as_ref() != Some(text)
            })
            .map(|(name, _)| name.as_str())
            .collect();
        if stale.is_empty() {
            println!("{} is up to date with results/", opts.out.display());
            return Ok(0);
        }
        eprintln!(
            "{}: {} differ from what `harness paper` generates from results/; run it and commit",
            opts.out.display(),
            stale.join(", ")
        );
        return Ok(1);
    }
    std::fs::create_dir_all(&opts.out)
        .map_err(HarnessError::io(format!("creating {}", opts.out.display())))?;
    for (name, text) in &files {
        crate::atomic::write(&opts.out.join(name), text.clone())?;
    }
    let counts = files
        .get("claims.md")
        .and_then(|t| t.lines().find(|l| l.starts_with("Claims:")))
        .unwrap_or("");
    println!("wrote {} ({counts})", opts.out.display());
    Ok(0)
}

/// Every owned file's text, by name.
pub fn generate(declarations: &Path, results: &Path) -> Result<BTreeMap<String, String>> {
    let decl = claims::read(declarations)?;
    let mut files = BTreeMap::new();
    files.insert("claims.md".to_string(), claims_page(&decl, results));
    files.insert("claims.svg".to_string(), claims_figure(&decl, results)?);
    files.insert("findings.md".to_string(), findings_page(&decl, results)?);
    files.insert("method.md".to_string(), pages::method(results)?);
    files.insert("machines.md".to_string(), pages::machines(results)?);
    Ok(files)
}

/// `[id](../results/exp/id.csv) ([report](../results/exp/id.md))`, marked when dirty.
fn run_link(run: &RunRef) -> String {
    let base = format!("../results/{}/{}", run.experiment, run.run_id);
    format!(
        "[{}/{}]({base}.csv) ([report]({base}.md)){}",
        run.experiment,
        run.run_id,
        if run.dirty {
            " — **dirty tree**: no commit reproduces it"
        } else {
            ""
        }
    )
}

/// A cell on one line, its `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// `**word**`, with its place or reason.
fn verdict_cell(v: &Verdict) -> String {
    match v {
        Verdict::Depends(w) | Verdict::NotInRegime(w) | Verdict::Untested(w) => {
            format!("**{}** ({})", v.word(), cell(w))
        }
        _ => format!("**{}**", v.word()),
    }
}

/// A claim with its checks judged and its verdict.
struct Judgement<'a> {
    claim: &'a ClaimDecl,
    checks: Vec<Judged>,
    verdict: Verdict,
}

fn judge_all<'a>(decl: &'a claims::Declarations, results: &Path) -> Vec<Judgement<'a>> {
    decl.claim
        .iter()
        .map(|c| {
            let checks: Vec<Judged> = c.check.iter().map(|k| judge(results, k)).collect();
            let verdict = combine(c, &checks);
            Judgement {
                claim: c,
                checks,
                verdict,
            }
        })
        .collect()
}

/// "x holds, y refuted, ..." over the verdict words, zero counts left out.
fn counts<'a>(words: impl Iterator<Item = &'a str>) -> String {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for w in words {
        *n.entry(w).or_default() += 1;
    }
    Verdict::WORDS
        .iter()
        .filter_map(|w| n.get(w).map(|c| format!("{c} {w}")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// claims.md.
fn claims_page(decl: &claims::Declarations, results: &Path) -> String {
    let judged = judge_all(decl, results);
    let mut out = format!(
        "# The claims and their verdicts\n\n{GENERATED} Each claim is quoted as \
         `../shared/claims.md` writes it, with the seed section it comes from and the regime \
         (hardware, model) it is about. Each check says what the claim states, what is \
         measured, and why that is the same quantity or how the regimes differ; it is \
         `arithmetic` (machine-independent), a `CPU analogue` (a mechanism that carries over to \
         this CPU, and why), or `not in regime` (a claim about a GPU or a 7B model: the CPU \
         result is evidence on the mechanism, never the claim's verdict). Verdicts: `holds`, \
         `holds, stronger than claimed` (beyond the claim's number in the direction it \
         points), `refuted`, `depends` (where), `tie (within noise)` (the values' p10–p90 or \
         confidence intervals reach both sides of the rule), `not in regime`, `untested` (what \
         it needs). A claim's verdict combines its in-regime checks; the rest is named beside \
         it. See [method.md](method.md#verdicts) for the rules.\n\n\
         Claims: {}.\n\nChecks: {}.\n\n",
        counts(judged.iter().map(|j| j.verdict.word())),
        counts(
            judged
                .iter()
                .flat_map(|j| j.checks.iter().map(|k| k.verdict.word()))
        )
    );
    out += "| check kind | checks | verdicts (of the CPU evidence, for checks not in regime) |\n|---|---|---|\n";
    for kind in [Kind::Arithmetic, Kind::Analogue, Kind::NotInRegime] {
        let of_kind: Vec<&Judged> = judged
            .iter()
            .flat_map(|j| j.claim.check.iter().zip(&j.checks))
            .filter(|(c, _)| c.kind == kind)
            .map(|(_, k)| k)
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            kind.word(),
            of_kind.len(),
            counts(of_kind.iter().map(|k| k.reading.word()))
        );
    }
    out += "\n![Each check's measured values over the claim's number](claims.svg)\n\n\
            | claim | seed | verdict | beside it |\n|---|---|---|---|\n";
    for j in &judged {
        let c = j.claim;
        let beside = beside(j);
        let _ = writeln!(
            out,
            "| [{}](#{}) {} | {} | {} | {} |",
            c.id,
            c.id.to_lowercase(),
            cell(&c.claim),
            cell(&c.seed),
            verdict_cell(&j.verdict),
            cell(&beside.join("; "))
        );
    }
    for j in &judged {
        claim_section(&mut out, j);
    }
    out
}

/// The parts a claim's verdict leaves out: checks not in regime or untested, and parts no
/// check covers (none when the verdict itself is not in regime or untested: it lists them).
fn beside(j: &Judgement) -> Vec<String> {
    if matches!(j.verdict, Verdict::NotInRegime(_) | Verdict::Untested(_)) {
        return vec![];
    }
    let c = j.claim;
    let mut out: Vec<String> = c
        .check
        .iter()
        .zip(&j.checks)
        .filter(|(_, k)| matches!(k.verdict, Verdict::NotInRegime(_) | Verdict::Untested(_)))
        .map(|(k, v)| format!("{}: {}", k.part, v.verdict.word()))
        .collect();
    out.extend(c.untested.iter().map(|u| format!("{}: untested", u.part)));
    out
}

/// One claim's section of claims.md.
fn claim_section(out: &mut String, j: &Judgement) {
    let c = j.claim;
    let machines: BTreeSet<&str> = j
        .checks
        .iter()
        .filter_map(|k| k.run.as_ref().map(|r| r.machine.as_str()))
        .collect();
    let runs = match machines.len() {
        0 => "no run (calculations only, or no cited run yet)".to_string(),
        1 => format!("one machine, {}", machines.iter().next().expect("one")),
        n => format!(
            "**{n} machines**: {}",
            machines.iter().copied().collect::<Vec<_>>().join("; ")
        ),
    };
    let _ = write!(
        out,
        "\n## {}\n\n> {} — `../shared/claims.md`, seed {}\n\nThe seed: {}\n\n\
         The claim is about: {}. The runs cited: {runs}.\n\nVerdict: {}\n",
        c.id,
        c.claim,
        c.seed,
        c.source,
        c.regime,
        verdict_cell(&j.verdict)
    );
    let beside = beside(j);
    if !beside.is_empty() {
        let _ = writeln!(out, "\nBeside it: {}.", beside.join("; "));
    }
    for (n, (k, v)) in c.check.iter().zip(&j.checks).enumerate() {
        let ev = &k.evidence;
        let why = match k.kind {
            Kind::NotInRegime => "How the regimes differ",
            _ => "Why it is the same quantity",
        };
        let stat = match k.stat.as_deref() {
            Some("some") => "some value of ".to_string(),
            Some(s) if s != "each" => format!("the {s} of "),
            _ => "each ".into(),
        };
        let rule = match &k.calc {
            Some(calc) => format!("`{calc}` {}", k.expect),
            None => format!(
                "{stat}{} in `{}` ({}): {}",
                ev.describe_value(),
                ev.experiment,
                describe_filter(&ev.filter),
                k.expect
            ),
        };
        let extras = [
            k.tolerance.map(|t| format!("tolerance {t}")),
            k.stronger.map(|d| {
                format!(
                    "beyond the band {} reads stronger than claimed",
                    match d {
                        rule::Direction::Above => "above",
                        rule::Direction::Below => "below",
                    }
                )
            }),
            ev.noise
                .as_ref()
                .map(|n| format!("noise: {}", describe_noise(n))),
        ];
        let extras: Vec<String> = extras.into_iter().flatten().collect();
        let _ = write!(
            out,
            "\n### {}.{} · {} — {}\n\n\
             - The claim states: {}\n- Measured: {}\n- {why}: {}\n- Rule: {rule}{}\n",
            c.id,
            n + 1,
            k.part,
            k.kind.word(),
            k.states,
            k.measures,
            k.why,
            if extras.is_empty() {
                String::new()
            } else {
                format!(" ({})", extras.join("; "))
            }
        );
        if !v.measured.is_empty() {
            let _ = writeln!(out, "- Values: {}", v.measured);
        }
        let _ = writeln!(out, "- Verdict: {}", verdict_cell(&v.verdict));
        if let Some(r) = &v.run {
            let _ = writeln!(
                out,
                "- Run: {} on {}; {}",
                run_link(r),
                r.machine,
                r.setting
            );
        }
    }
    for u in &c.untested {
        let _ = write!(out, "\nNot tested: {} — needs {}\n", u.part, u.needs);
    }
    let _ = writeln!(out, "\nHow this verdict could be wrong: {}", c.objection);
}

fn describe_noise(n: &claims::Noise) -> String {
    match n {
        claims::Noise::Named(k) if k == "timing" => "the p10–p90 of the timed rows".into(),
        claims::Noise::Named(_) => "the p10–p90 of the timed rows, for a rate".into(),
        claims::Noise::Columns { lo, hi } => format!("the interval `{lo}`–`{hi}`"),
        claims::Noise::Stderr { stderr, k } => format!("± {k} × `{stderr}`"),
    }
}

/// claims.svg: every check with values, measured over claimed (`figure`).
fn claims_figure(decl: &claims::Declarations, results: &Path) -> Result<String> {
    let mut checks = vec![];
    for j in judge_all(decl, results) {
        for (k, v) in j.claim.check.iter().zip(j.checks) {
            let Some(marker) = v.marker else { continue };
            let (number, band) = verdict::claimed(k.rule());
            checks.push(figure::FigureCheck {
                label: format!("{} · {}", j.claim.id, k.part),
                verdict: v.verdict.word(),
                number,
                band,
                values: v.values,
                marker,
            });
        }
    }
    figure::claims_svg(&checks)
}

/// findings.md: the declared tables, then every run in results/.
fn findings_page(decl: &claims::Declarations, results: &Path) -> Result<String> {
    let mut out = format!(
        "# Findings\n\n{GENERATED} Every number is a range over all rows of the stated filter \
         of the cited run (min, median, max, and how many rows), grouped by the columns named.\n"
    );
    let mut by_experiment: BTreeMap<&str, Vec<&claims::FindingDecl>> = BTreeMap::new();
    for f in &decl.finding {
        by_experiment
            .entry(f.evidence.experiment.as_str())
            .or_default()
            .push(f);
    }
    for (exp, findings) in &by_experiment {
        let _ = write!(out, "\n## {exp}\n");
        for f in findings {
            let ev = &f.evidence;
            let _ = write!(out, "\n### {}\n\n", f.title);
            let what = ev.describe_value();
            match values(results, ev) {
                Err(reason) => {
                    let _ = writeln!(out, "Not available: {reason}.");
                }
                Ok((run, vals)) => {
                    let _ = write!(
                        out,
                        "{what}{} over {}; {}; {}; {}.\n\n",
                        if ev.unit.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", ev.unit)
                        },
                        describe_filter(&ev.filter),
                        run.machine,
                        run.setting,
                        run_link(&run)
                    );
                    let mut groups: BTreeMap<&str, Vec<evidence::Value>> = BTreeMap::new();
                    for v in &vals {
                        groups.entry(v.group.as_str()).or_default().push(v.clone());
                    }
                    out += "| group | rows | min | median | max |\n|---|---|---|---|---|\n";
                    for (g, vs) in &groups {
                        let lo = vs.iter().map(|v| v.value).fold(f64::INFINITY, f64::min);
                        let hi = vs.iter().map(|v| v.value).fold(f64::NEG_INFINITY, f64::max);
                        let _ = writeln!(
                            out,
                            "| {} | {} | {} | {} | {} |",
                            cell(if g.is_empty() { "all" } else { g }),
                            vs.len(),
                            num(lo),
                            num(median(vs)),
                            num(hi)
                        );
                    }
                    let _ = writeln!(out, "\nOver all: {}.", range(&vals, &ev.unit, &[]));
                }
            }
        }
    }
    out += "\n## Every run in results/\n\n| experiment | run | rows | status | commit | machine | figures |\n|---|---|---|---|---|---|---|\n";
    for r in pages::runs(results)? {
        let _ = writeln!(
            out,
            "| {} | [{}](../results/{}/{}) | {} | {} | {} | {} | {} |",
            r.experiment,
            r.run_id,
            r.experiment,
            r.file,
            r.rows,
            cell(&r.status),
            r.commit,
            cell(&r.machine),
            r.figures
                .iter()
                .map(|f| format!("[{f}](../results/{}/{f})", r.experiment))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(out)
}
