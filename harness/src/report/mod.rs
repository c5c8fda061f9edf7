//! `harness paper`: paper/ regenerated from results/ and `experiments/claims.toml` alone —
//! `claims.md` (a verdict per claim, judged by the declared rules, with the numbers, the
//! machine and the runs), `findings.md` (declared ranges over all rows of a filter, and every
//! committed run), `method.md`, `machines.md` and `claims.svg` (every tested check's measured
//! values over the claim's number). The output is a pure function of those
//! files (sorted listings, no clock), so `--check` can compare it with the committed paper/.

/// Claim and finding declarations, and their evaluation against result CSVs.
pub mod claims;
/// `claims.svg`: measured over claimed, per check.
pub mod figure;
/// `method.md` and `machines.md`.
pub mod pages;
/// Any result CSV as text by column, and the grid point of a row.
pub mod table;

use crate::error::{HarnessError, Result};
use claims::{combine, judge, num, range, values, Judged, RunRef, Verdict};
use pages::GENERATED;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

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
        .and_then(|t| t.lines().find(|l| l.starts_with("Verdicts:")))
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

fn verdict_cell(v: &Verdict) -> String {
    match v {
        Verdict::Holds | Verdict::Refuted => format!("**{}**", v.word()),
        Verdict::Depends(c) => format!("**depends**: {}", cell(c)),
        Verdict::Untested(r) => format!("**untested**: {}", cell(r)),
    }
}

/// claims.md.
fn claims_page(decl: &claims::Declarations, results: &Path) -> String {
    let judged: Vec<(&claims::ClaimDecl, Vec<Judged>, Verdict)> = decl
        .claim
        .iter()
        .map(|c| {
            let j: Vec<Judged> = c.check.iter().map(|k| judge(results, k)).collect();
            let v = combine(c, &j);
            (c, j, v)
        })
        .collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, _, v) in &judged {
        *counts.entry(v.word()).or_default() += 1;
    }
    let count = |w: &str| counts.get(w).copied().unwrap_or(0);
    let mut out = format!(
        "# The claims and their verdicts\n\n{GENERATED} Each verdict follows from the rule its claim declares there: \
         `holds` when every value of the cited rows passes, `refuted` when none does, `depends` \
         (with where it holds) when some do, `untested` with what it would take.\n\n\
         Verdicts: {} holds, {} refuted, {} depends, {} untested.\n\n\
         ![Each tested check's measured values over the claim's number](claims.svg)\n\n\
         | claim | verdict |\n|---|---|\n",
        count("holds"),
        count("refuted"),
        count("depends"),
        count("untested")
    );
    for (c, js, v) in &judged {
        let partly = !matches!(v, Verdict::Untested(_))
            && (c.untested.is_some()
                || js.iter().any(|j| matches!(j.verdict, Verdict::Untested(_))));
        let _ = writeln!(
            out,
            "| [{}](#{}) {} | {}{} |",
            c.id,
            c.id.to_lowercase(),
            cell(&c.text),
            verdict_cell(v),
            if partly { " (part untested)" } else { "" }
        );
    }
    for (c, js, v) in &judged {
        let _ = write!(
            out,
            "\n## {}\n\n{}\n\nVerdict: {}\n\n",
            c.id,
            c.text,
            verdict_cell(v)
        );
        if !c.check.is_empty() {
            out +=
                "| part | rule | measured | verdict | machine | run |\n|---|---|---|---|---|---|\n";
        }
        for (k, j) in c.check.iter().zip(js) {
            let ev = &k.evidence;
            let value = ev.describe_value();
            let stat = match k.stat.as_deref() {
                Some(s) if s != "each" => format!("{s} of "),
                _ => "each ".into(),
            };
            let _ = writeln!(
                out,
                "| {} | {stat}{value} over {} {} | {} | {} | {} | {} |",
                cell(&k.what),
                cell(&claims::describe_filter(&ev.filter)),
                cell(&k.expect),
                cell(&j.measured),
                verdict_cell(&j.verdict),
                j.run.as_ref().map_or(String::new(), |r| cell(&r.machine)),
                j.run.as_ref().map_or(String::new(), run_link)
            );
        }
        if let Some(u) = &c.untested {
            let _ = writeln!(out, "\nNot measured: {u}");
        }
    }
    out
}

/// claims.svg: every tested check, measured over claimed (`figure`).
fn claims_figure(decl: &claims::Declarations, results: &Path) -> Result<String> {
    let mut checks = vec![];
    for c in &decl.claim {
        for k in &c.check {
            let j = judge(results, k);
            let (Some(marker), verdict) = (j.marker, j.verdict.word()) else {
                continue;
            };
            let (number, band) = claims::claimed(k);
            checks.push(figure::FigureCheck {
                label: format!("{} · {}", c.id, k.what),
                verdict,
                number,
                band,
                values: j.values,
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
                        "{what}{} over {}; {}; {}.\n\n",
                        if ev.unit.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", ev.unit)
                        },
                        claims::describe_filter(&ev.filter),
                        run.machine,
                        run_link(&run)
                    );
                    let mut groups: BTreeMap<&str, Vec<claims::Value>> = BTreeMap::new();
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
                            num(claims::median(vs)),
                            num(hi)
                        );
                    }
                    let _ = writeln!(out, "\nOver all: {}.", range(&vals, &ev.unit));
                }
            }
        }
    }
    out += "\n## Every run in results/\n\n| experiment | run | rows | status | commit | machine | figures |\n|---|---|---|---|---|---|---|\n";
    for r in pages::runs(results)? {
        let _ = writeln!(
            out,
            "| {} | [{}](../results/{}/{}.csv) | {} | {} | {} | {} | {} |",
            r.experiment,
            r.run_id,
            r.experiment,
            r.run_id,
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
