//! `harness merge SWEEP_ID | SHARD.csv...`: the shards of a sweep put back together into
//! `results/<exp>/<sweep-id>.csv` (rows in the grid's order), a provenance JSON listing every
//! shard's sessions (machine, ISA, roofline, commit, start and end), and the usual `.md` and
//! `.svg` through the family's report. Everything is checked before anything is written,
//! and each refusal is one line: a missing or unfinished shard, a truncated shard CSV, a
//! point present twice or in a shard it does not hash to, shards of different specs, grids
//! or sweeps; shards on different commits or machines need `--allow-mixed` and are recorded
//! as mixed.

use crate::commands::exp::family_of;
use crate::error::{HarnessError, Result};
use crate::provenance::{MergeRecord, MergedShard, Provenance, Session, ShardRecord};
use crate::run_files::counts_as_failure;
use crate::spec::ExperimentSpec;
use crate::sweep::id::{parse_shard_name, shard_csv};
use crate::sweep::shard_csv::{self as csv_file, ShardCsv};
use crate::sweep::{PointKey, Shard};
use crate::{atomic, machine, render, Format};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What `harness merge` was asked to do.
pub struct MergeOptions {
    pub inputs: Vec<String>,
    pub allow_mixed: bool,
    pub format: Format,
    pub experiments_dir: PathBuf,
    pub results_dir: PathBuf,
}

/// One shard: its files, provenance and rows.
struct ShardIn {
    csv: PathBuf,
    prov: Provenance,
    rec: ShardRecord,
    data: ShardCsv,
}

fn usage(text: String) -> HarnessError {
    HarnessError::Usage(text)
}

/// Merges; the exit code is 1 when a merged row disagrees with the reference.
pub fn run(opts: &MergeOptions) -> Result<i32> {
    let shards = shard_files(opts)?
        .into_iter()
        .map(|csv| read_provenance(&csv))
        .collect::<Result<Vec<_>>>()?;
    same_sweep(&shards)?;
    let shards = every_shard_once(shards)?;
    let shards = shards
        .into_iter()
        .map(read_rows)
        .collect::<Result<Vec<_>>>()?;
    let (header, records, order) = rows_in_grid_order(&shards)?;
    let mixed = mixed(&shards);
    if !mixed.is_empty() && !opts.allow_mixed {
        return Err(usage(format!(
            "the shards ran on different {}; merge with --allow-mixed to accept that (it is recorded as mixed)",
            mixed
                .iter()
                .map(|(what, values)| format!("{what} ({})", values.join(", ")))
                .collect::<Vec<_>>()
                .join(" and ")
        )));
    }
    let first = &shards[0];
    let (spec, _) = ExperimentSpec::load(&opts.experiments_dir, &first.prov.experiment)?;
    let family = family_of(&spec)?;
    let dir = opts.results_dir.join(&first.prov.experiment);
    let out_csv = dir.join(format!("{}.csv", first.rec.sweep_id));
    if out_csv.exists() {
        return Err(usage(format!(
            "{} exists (merged before): remove it to merge again",
            out_csv.display()
        )));
    }
    let prov = merged_provenance(&shards, &mixed, records.len());
    std::fs::create_dir_all(&dir)
        .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
    let mut w = csv::Writer::from_writer(vec![]);
    if let Some(header) = header {
        w.write_record(header)?;
    }
    for r in &records {
        w.write_record(*r)?;
    }
    let bytes = w.into_inner().map_err(|e| usage(format!("csv: {e}")))?;
    atomic::write(&out_csv, &bytes)?;
    prov.write(&out_csv.with_extension("json"))?;
    let report = render::render_run(&spec, &out_csv, &prov, family.render)?;
    match opts.format {
        Format::Table => println!("{}", report.tables),
        Format::Json => println!("{}", serde_json::to_string_pretty(&report.rows)?),
    }
    eprintln!(
        "merged {} shards: {} points, {} rows -> {} (+ .json, .md, .svg){}",
        shards.len(),
        order,
        records.len(),
        out_csv.display(),
        if mixed.is_empty() { "" } else { "; mixed" }
    );
    let column = |name: &str| header.and_then(|h| h.iter().position(|c| c == name));
    let failures = match (column("status"), column("note")) {
        (Some(s), Some(n)) => records
            .iter()
            .filter(|r| counts_as_failure(&r[s], &r[n]))
            .count(),
        _ => 0,
    };
    if failures > 0 {
        eprintln!("{failures} row(s) disagree with the reference: see status=fail in the CSV");
    }
    Ok(if failures > 0 { 1 } else { 0 })
}

/// The shard CSVs named, or those of the sweep id under the results folder.
fn shard_files(opts: &MergeOptions) -> Result<Vec<PathBuf>> {
    let files: Vec<&String> = opts.inputs.iter().filter(|i| i.ends_with(".csv")).collect();
    match (&opts.inputs[..], files.len()) {
        (inputs, n) if n == inputs.len() => Ok(files.into_iter().map(PathBuf::from).collect()),
        ([id], 0) => {
            let mut found = vec![];
            let folders = std::fs::read_dir(&opts.results_dir).map_err(HarnessError::io(
                format!("reading {}", opts.results_dir.display()),
            ))?;
            for folder in folders.flatten().filter(|e| e.path().is_dir()) {
                for file in std::fs::read_dir(folder.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let path = file.path();
                    if parse_shard_name(&path).is_some_and(|(sweep, _)| sweep == *id) {
                        found.push(path);
                    }
                }
            }
            if found.is_empty() {
                return Err(usage(format!(
                    "no shard of sweep '{id}' under {} (files <exp>/{id}.shard-<i>-of-<n>.csv)",
                    opts.results_dir.display()
                )));
            }
            found.sort();
            Ok(found)
        }
        _ => Err(usage(
            "give one sweep id, or the shard CSV files of one sweep".into(),
        )),
    }
}

/// A shard's provenance (the JSON beside its CSV), which must say it is a shard.
fn read_provenance(csv: &Path) -> Result<ShardIn> {
    if !csv.is_file() {
        return Err(usage(format!("{}: no such shard file", csv.display())));
    }
    let json = csv.with_extension("json");
    let prov = Provenance::read(&json)
        .map_err(|e| usage(format!("{}: no readable provenance ({e})", json.display())))?;
    let rec = prov.sweep.clone().ok_or_else(|| {
        usage(format!(
            "{} is not a shard of a sweep (its provenance has no sweep record)",
            csv.display()
        ))
    })?;
    Ok(ShardIn {
        csv: csv.to_path_buf(),
        prov,
        rec,
        data: ShardCsv::default(),
    })
}

/// Every shard is of the first's experiment, spec, grid, sweep and split.
fn same_sweep(shards: &[ShardIn]) -> Result<()> {
    let a = &shards[0];
    for b in &shards[1..] {
        let (x, y) = (a.csv.display(), b.csv.display());
        let why = if a.prov.experiment != b.prov.experiment {
            format!(
                "shards of different specs: {x} is of experiment '{}', {y} of '{}'",
                a.prov.experiment, b.prov.experiment
            )
        } else if a.rec.spec_digest != b.rec.spec_digest {
            format!(
                "shards of different specs: {x} and {y} ran different versions of {}",
                a.prov.spec_file
            )
        } else if a.prov.grid != b.prov.grid {
            format!("shards of different grids: {x} and {y} (--quick or --set differ)")
        } else if a.rec.definition != b.rec.definition {
            format!("shards of different sweeps: {x} and {y} differ in variants, peers, reps, seed or device")
        } else if a.rec.sweep_id != b.rec.sweep_id {
            format!(
                "shards of different sweeps: {x} is of '{}', {y} of '{}'",
                a.rec.sweep_id, b.rec.sweep_id
            )
        } else if a.rec.shards != b.rec.shards {
            format!(
                "shards of different splits: {x} is one of {}, {y} one of {}",
                a.rec.shards, b.rec.shards
            )
        } else {
            continue;
        };
        return Err(usage(why));
    }
    Ok(())
}

/// The shards in order, each index of 0..n exactly once.
fn every_shard_once(mut shards: Vec<ShardIn>) -> Result<Vec<ShardIn>> {
    shards.sort_by_key(|s| s.rec.shard);
    let (count, id) = (shards[0].rec.shards, shards[0].rec.sweep_id.clone());
    let dir = shards[0]
        .csv
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    for pair in shards.windows(2) {
        if pair[0].rec.shard == pair[1].rec.shard {
            return Err(usage(format!(
                "shard {} of {count} is given twice: {} and {}",
                pair[0].rec.shard,
                pair[0].csv.display(),
                pair[1].csv.display()
            )));
        }
    }
    if let Some(missing) = (0..count).find(|i| !shards.iter().any(|s| s.rec.shard == *i)) {
        let shard = Shard {
            index: missing,
            count,
        };
        return Err(usage(format!(
            "sweep '{id}' is missing shard {shard} ({})",
            shard_csv(&dir, &id, shard).display()
        )));
    }
    Ok(shards)
}

/// Reads a finished shard's CSV, which must hold exactly the rows its provenance counts.
fn read_rows(mut s: ShardIn) -> Result<ShardIn> {
    let (shard, csv) = (
        format!("{}/{}", s.rec.shard, s.rec.shards),
        s.csv.display().to_string(),
    );
    if s.prov.status != "finished" {
        return Err(usage(format!(
            "shard {shard} ({csv}) has not finished (status '{}'): run it again with --resume",
            s.prov.status
        )));
    }
    s.data = csv_file::read(&s.csv)?;
    if let Some(tail) = &s.data.tail {
        return Err(usage(format!("{csv} is truncated: {tail}")));
    }
    if s.data.rows() != s.prov.rows {
        return Err(usage(format!(
            "{csv} is truncated: {} rows, its provenance counts {}",
            s.data.rows(),
            s.prov.rows
        )));
    }
    Ok(s)
}

/// The header (none when every shard is empty) and every shard's rows in the grid's order,
/// with the checks that need them all: one header (an empty shard, to which no point hashed,
/// has none), one grid, each point in the shard it hashes to and in no other.
type GridRows<'a> = (
    Option<&'a csv::StringRecord>,
    Vec<&'a csv::StringRecord>,
    usize,
);

fn rows_in_grid_order(shards: &[ShardIn]) -> Result<GridRows<'_>> {
    let first = &shards[0];
    let mut at: HashMap<&str, (usize, &[csv::StringRecord])> = HashMap::new();
    let mut header: Option<&ShardIn> = None;
    for (i, s) in shards.iter().enumerate() {
        if s.data.header_line.is_some() {
            match header {
                Some(h) if h.data.header != s.data.header => {
                    return Err(usage(format!(
                        "{} has other columns than {}: shards of different builds cannot be merged",
                        s.csv.display(),
                        h.csv.display()
                    )))
                }
                Some(_) => {}
                None => header = Some(s),
            }
        }
        if s.rec.points != first.rec.points {
            return Err(usage(format!(
                "shards of different grids: {} and {} enumerate different points",
                first.csv.display(),
                s.csv.display()
            )));
        }
        for p in &s.data.points {
            if let Some((j, _)) = at.insert(&p.key, (i, &p.rows)) {
                return Err(usage(format!(
                    "point '{}' is present twice: in {} and {}",
                    p.key,
                    shards[j].csv.display(),
                    s.csv.display()
                )));
            }
        }
    }
    for (key, &(i, _)) in &at {
        let (s, owner) = (&shards[i], PointKey::from_text(key).shard(first.rec.shards));
        if owner != s.rec.shard {
            return Err(usage(format!(
                "point '{key}' in {} belongs to shard {owner}/{}",
                s.csv.display(),
                s.rec.shards
            )));
        }
    }
    if let Some(stray) = at
        .keys()
        .find(|k| !first.rec.points.iter().any(|p| p == *k))
    {
        return Err(usage(format!("point '{stray}' is not in the sweep's grid")));
    }
    let records = first
        .rec
        .points
        .iter()
        .filter_map(|k| at.get(k.as_str()))
        .flat_map(|(_, rows)| rows.iter())
        .collect();
    Ok((
        header.map(|h| &h.data.header),
        records,
        first.rec.points.len(),
    ))
}

/// What differs between the shards' sessions: ("commits", [...]) and/or ("machines", [...]).
fn mixed(shards: &[ShardIn]) -> Vec<(&'static str, Vec<String>)> {
    let mut out = vec![];
    let commits = distinct(shards, Session::commit);
    if commits.len() > 1 {
        out.push(("commits", commits));
    }
    let machines = distinct(shards, Session::machine_kind);
    if machines.len() > 1 {
        out.push(("machines", machines));
    }
    out
}

/// The distinct values of `f` over every session of every shard, in order of appearance.
fn distinct(shards: &[ShardIn], f: impl Fn(&Session) -> String) -> Vec<String> {
    let mut values: Vec<String> = vec![];
    for s in shards.iter().flat_map(|s| &s.rec.sessions) {
        let v = f(s);
        if !values.contains(&v) {
            values.push(v);
        }
    }
    values
}

/// The merged run's provenance: shard 0's description of the sweep, every shard's sessions,
/// what was mixed, the span of all sessions and the best roofline any of them measured (for
/// the plot's line; each row's `% roof` is against its own shard's).
fn merged_provenance(
    shards: &[ShardIn],
    mixed: &[(&'static str, Vec<String>)],
    rows: usize,
) -> Provenance {
    let first = &shards[0];
    let sessions: Vec<&Session> = shards.iter().flat_map(|s| &s.rec.sessions).collect();
    let joined = |f: fn(&Session) -> String| distinct(shards, f).join(" + ");
    let mut prov = first.prov.clone();
    prov.run_id = first.rec.sweep_id.clone();
    prov.status = match mixed {
        [] => "merged".into(),
        m => format!(
            "merged (mixed {})",
            m.iter().map(|(w, _)| *w).collect::<Vec<_>>().join(", ")
        ),
    };
    prov.command_line = machine::command_line();
    prov.git_sha = joined(|s| s.git_sha.clone());
    prov.git_dirty = sessions.iter().any(|s| s.git_dirty);
    prov.host = joined(|s| s.host.clone());
    prov.cpu_model = joined(|s| s.cpu_model.clone());
    prov.isa = joined(|s| s.isa.clone());
    prov.isa_detected = joined(|s| s.isa_detected.clone());
    if let Some(best) = sessions
        .iter()
        .map(|s| s.roofline.clone())
        .reduce(|a, b| a.best_of(b))
    {
        prov.roofline = best;
    }
    prov.started_at = sessions
        .iter()
        .map(|s| s.started_at.clone())
        .min()
        .unwrap_or_default();
    prov.finished_at = shards
        .iter()
        .filter_map(|s| s.prov.finished_at.clone())
        .max();
    prov.rows = rows;
    prov.sweep = None;
    prov.merged = Some(MergeRecord {
        sweep_id: first.rec.sweep_id.clone(),
        shards: shards
            .iter()
            .map(|s| MergedShard {
                shard: s.rec.shard,
                csv: s.csv.display().to_string(),
                rows: s.data.rows(),
                points: s.data.points.len(),
                sessions: s.rec.sessions.clone(),
            })
            .collect(),
        mixed: mixed.iter().map(|(w, _)| w.to_string()).collect(),
    });
    prov
}
