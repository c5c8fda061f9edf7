//! Result rows: the columns every row shares (which run, which variant, where, how it went,
//! how long it took) are declared once in `Head`; a family adds its own columns as a struct `F`,
//! and `Row<F>` is the two together with the free-text `note` last. CSV files are streamed by
//! `RowWriter` (a grid point's rows in one write, so a killed run keeps every finished point) and read back by
//! column name, so files written before a column existed still read (missing → empty).
//! The csv crate cannot serialise `#[serde(flatten)]`; rows are written as the tuple
//! `(head, family columns, note)` — an experiment's `(head, point columns, family columns,
//! note)` — which it flattens in order.

use crate::error::{HarnessError, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::fs::File;
use std::io::{Seek, Write};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

/// The columns every result row starts with. Columns a row does not use stay empty (a
/// calculator has no timing; a check has no experiment).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Head {
    pub run_id: String,
    /// The experiment's name (`check` and `replay` for those commands).
    pub experiment: String,
    /// The variant as spelled (`flash2:br=64`), or what the family's rows compare
    /// (an allocator, a batching mode, a drafter).
    pub variant: String,
    /// cpu | cuda:N
    pub device: String,
    /// Host threads (rayon); under `--device cuda` the kernels run on the device regardless.
    pub threads: usize,
    /// ok | fail (wrong output) | skipped (over a limit) | unsupported | error; `check` says
    /// pass | fail | unsupported, `replay` agree | disagree | unsupported | error | info.
    pub status: String,
    /// Timed repetitions behind the percentiles.
    pub reps: usize,
    pub median_ms: Option<f64>,
    pub p10_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    /// The seed of this row's random inputs (derived from `--seed`).
    pub seed: u64,
    /// The version of an external peer in `variant` (`torch 2.15.0`); empty for ours.
    pub peer_version: String,
}

/// What every row of one run repeats — its run id, its experiment and its device — so a
/// runner names only a row's variant and seed (`RunFiles::head`). `check` and `replay`
/// make theirs with their own run ids.
#[derive(Debug, Clone)]
pub struct Heads {
    run_id: String,
    experiment: String,
    device: String,
}

impl Heads {
    pub fn new(run_id: &str, experiment: &str, device: &str) -> Heads {
        Heads {
            run_id: run_id.into(),
            experiment: experiment.into(),
            device: device.into(),
        }
    }

    /// The device its rows ran on (`cpu`, `cuda:0`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The head of a row of `variant` whose inputs came from `seed`, with this process's
    /// threads, status and timing still empty.
    pub fn head(&self, variant: &str, seed: u64) -> Head {
        Head::new(&self.run_id, &self.experiment, variant, &self.device, seed)
    }

    /// The same with its status set.
    pub fn with_status(&self, variant: &str, seed: u64, status: &str) -> Head {
        Head {
            status: status.into(),
            ..self.head(variant, seed)
        }
    }
}

impl Head {
    /// A head for `variant` of run `run_id` of `experiment`, on `device` with this process's
    /// threads, status and timing still empty; runners get theirs from `Heads`.
    fn new(run_id: &str, experiment: &str, variant: &str, device: &str, seed: u64) -> Head {
        Head {
            run_id: run_id.into(),
            experiment: experiment.into(),
            variant: variant.into(),
            device: device.into(),
            threads: rayon::current_num_threads(),
            seed,
            ..Head::default()
        }
    }

    /// Fills the percentiles (in ms) and the repetition count from a timing.
    pub fn set_timing(&mut self, t: &crate::measure::Timing) {
        self.reps = t.samples.len();
        self.median_ms = Some(t.median() * 1e3);
        self.p10_ms = Some(t.percentile(10.0) * 1e3);
        self.p90_ms = Some(t.percentile(90.0) * 1e3);
    }
}

/// The last column of every row.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct Note {
    #[serde(default)]
    note: String,
}

impl Note {
    /// A row's note on one line.
    fn of<F>(row: &Row<F>) -> Note {
        Note {
            note: row.note.replace(['\n', '\r'], " "),
        }
    }
}

/// One result row: the shared head, a family's columns, a note. Derefs to the family's
/// columns, so `row.gbps` reads a family column and `row.head.median_ms` a shared one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row<F> {
    #[serde(flatten)]
    pub head: Head,
    #[serde(flatten)]
    pub cols: F,
    /// Why a row did not run, or what to know about it.
    pub note: String,
}

impl<F> Row<F> {
    /// A row with an empty note.
    pub fn new(head: Head, cols: F) -> Row<F> {
        Row {
            head,
            cols,
            note: String::new(),
        }
    }

    /// A row that did not run (over a limit, the memory guard): status `skipped`, its
    /// columns, no timing, and why in its note.
    pub fn skipped(head: Head, cols: F, note: impl Into<String>) -> Row<F> {
        Row {
            head: Head {
                status: "skipped".into(),
                ..head
            },
            cols,
            note: note.into(),
        }
    }
}

impl<F> Row<F> {
    /// Makes an `ok` row of a CUDA device whose `gbps` is implausible
    /// (`measure::implausible_bandwidth` against the run's device copy bandwidth `copy_gbps`)
    /// an error row, the reason in its note and its timing kept beside it. Rows of the CPU, and
    /// rows already failed, are left as they are.
    pub fn hold_to_copy_bandwidth(&mut self, gbps: f64, copy_gbps: f64) {
        if self.head.status != "ok" || !crate::measure::on_cuda(&self.head.device) {
            return;
        }
        if let Some(why) = crate::measure::implausible_bandwidth(gbps, copy_gbps) {
            self.head.status = "error".into();
            self.note = why;
        }
    }
}

impl<F> Deref for Row<F> {
    type Target = F;
    fn deref(&self) -> &F {
        &self.cols
    }
}

impl<F> DerefMut for Row<F> {
    fn deref_mut(&mut self) -> &mut F {
        &mut self.cols
    }
}

/// A row's columns by their CSV names, for plots and generic tables.
pub trait Columns {
    /// The column `name` as text ("" when empty or absent).
    fn column(&self, name: &str) -> String;
}

impl<F: Serialize> Columns for Row<F> {
    fn column(&self, name: &str) -> String {
        match serde_json::to_value(self)
            .ok()
            .and_then(|v| v.get(name).cloned())
        {
            Some(serde_json::Value::String(s)) => s,
            Some(serde_json::Value::Null) | None => String::new(),
            Some(v) => v.to_string(),
        }
    }
}

/// The two columns an experiment's rows add after the head: the row's grid point
/// (`sweep::PointKey`) and how many rows that point has, so a reader can tell a complete
/// point from one cut short by a kill (`sweep::shard_csv`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PointCols {
    pub point: String,
    pub point_rows: usize,
}

/// A CSV file written a group of rows at a time: each group is serialised whole and handed
/// to the OS in one write, so a killed run keeps every finished group (and the reader of a
/// sweep CSV can tell a group cut short). Notes are kept on one line, so one row is one line.
pub struct RowWriter {
    file: File,
    pub path: PathBuf,
    pub rows: usize,
    /// The header line as in the file (None until the first row of a new file).
    header: Option<String>,
}

impl RowWriter {
    /// Creates `path` (its folder must exist).
    pub fn create(path: PathBuf) -> Result<RowWriter> {
        let file = File::create(&path)
            .map_err(HarnessError::io(format!("creating {}", path.display())))?;
        Ok(RowWriter {
            file,
            path,
            rows: 0,
            header: None,
        })
    }

    /// Opens `path` to append after its first `keep` bytes (the rest is cut off), which
    /// hold `header` and `rows` rows: a resumed sweep's CSV.
    pub fn append(
        path: PathBuf,
        keep: u64,
        header: Option<String>,
        rows: usize,
    ) -> Result<RowWriter> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| {
                f.set_len(keep)?;
                f.seek(std::io::SeekFrom::End(0))?;
                Ok(f)
            })
            .map_err(HarnessError::io(format!("reopening {}", path.display())))?;
        Ok(RowWriter {
            file,
            path,
            rows,
            header,
        })
    }

    /// Appends one row (head, family columns, note): a check's.
    pub fn write<F: Serialize>(&mut self, row: &Row<F>) -> Result<()> {
        self.write_records(std::iter::once((&row.head, &row.cols, Note::of(row))))
    }

    /// Appends the rows of one grid point (head, point columns, family columns, note), all
    /// in one write.
    pub fn write_point<F: Serialize>(&mut self, point: &PointCols, rows: &[&Row<F>]) -> Result<()> {
        self.write_records(rows.iter().map(|r| (&r.head, point, &r.cols, Note::of(r))))
    }

    fn write_records<T: Serialize>(&mut self, records: impl Iterator<Item = T>) -> Result<()> {
        let mut w = csv::Writer::from_writer(vec![]);
        let mut n = 0;
        for r in records {
            w.serialize(r)?;
            n += 1;
        }
        let bytes = w
            .into_inner()
            .map_err(|e| HarnessError::Usage(format!("csv: {e}")))?;
        if n == 0 {
            return Ok(());
        }
        let header_end = bytes
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(bytes.len());
        let header = String::from_utf8_lossy(&bytes[..header_end]).into_owned();
        let body = match &self.header {
            None => &bytes[..],
            Some(h) if *h == header => &bytes[(header_end + 1).min(bytes.len())..],
            Some(h) => {
                return Err(HarnessError::Usage(format!(
                    "{}: this build's columns ({header}) differ from the file's ({h}); resume it with the build that started it",
                    self.path.display()
                )))
            }
        };
        self.file
            .write_all(body)
            .map_err(HarnessError::io(format!("writing {}", self.path.display())))?;
        self.header = Some(header);
        self.rows += n;
        Ok(())
    }
}

/// Every row of a CSV, each part read by column name.
pub fn read_rows<F: DeserializeOwned>(path: &Path) -> Result<Vec<Row<F>>> {
    let bad = |e: csv::Error| HarnessError::Usage(format!("{}: {e}", path.display()));
    let mut reader = csv::Reader::from_path(path).map_err(bad)?;
    let headers = reader.headers().map_err(bad)?.clone();
    let mut rows = vec![];
    for record in reader.records() {
        let record = record.map_err(bad)?;
        let head: Head = record.deserialize(Some(&headers)).map_err(bad)?;
        let cols: F = record.deserialize(Some(&headers)).map_err(bad)?;
        let note: Note = record.deserialize(Some(&headers)).map_err(bad)?;
        rows.push(Row {
            head,
            cols,
            note: note.note,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
    struct Cols {
        mode: String,
        batch: usize,
        causal: bool,
        gbps: Option<f64>,
    }

    #[test]
    fn rows_round_trip_through_csv_in_column_order() {
        let dir = std::env::temp_dir().join(format!("harness-row-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.csv");
        let mut head = Heads::new("r", "e", "cpu").head("paged:bs=16,split=auto", 7);
        head.status = "ok".into();
        head.reps = 3;
        head.median_ms = Some(1.5);
        head.p90_ms = Some(2.0);
        let mut row = Row::new(
            head,
            Cols {
                mode: "decode".into(),
                batch: 1,
                causal: true,
                gbps: None,
            },
        );
        row.note = "a, \"quoted\" note".into();
        let mut w = RowWriter::create(path.clone()).unwrap();
        w.write(&row).unwrap();
        w.write(&row).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(
            "run_id,experiment,variant,device,threads,status,reps,median_ms,p10_ms,p90_ms,seed,peer_version,mode,batch,causal,gbps,note\n"
        ));
        let back: Vec<Row<Cols>> = read_rows(&path).unwrap();
        assert_eq!(back, vec![row.clone(), row.clone()]);
        assert_eq!(row.column("median_ms"), "1.5");
        assert_eq!(row.column("mode"), "decode");
        assert_eq!(row.column("gbps"), "");
        // A file from before a shared column existed reads with that column empty.
        std::fs::write(
            &path,
            "run_id,experiment,mode,batch,causal,gbps,status\nold,e,prefill,2,false,3.5,ok\n",
        )
        .unwrap();
        let old: Vec<Row<Cols>> = read_rows(&path).unwrap();
        assert_eq!(old[0].head.status, "ok");
        assert_eq!(old[0].head.median_ms, None);
        assert_eq!(old[0].gbps, Some(3.5));
        assert_eq!(old[0].note, "");

        // A point's rows: the point columns after the head, notes on one line, and a file
        // reopened after its complete part takes rows of the same columns only.
        let point = PointCols {
            point: "mode=decode batch=1".into(),
            point_rows: 2,
        };
        row.note = "two\nlines".into();
        let mut w = RowWriter::create(path.clone()).unwrap();
        w.write_point(&point, &[&row, &row]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(
            text.contains(",peer_version,point,point_rows,mode,"),
            "{text}"
        );
        assert!(text.contains("mode=decode batch=1,2,decode") && text.contains("two lines"));
        let keep = text.len() as u64;
        let header = text.lines().next().map(String::from);
        std::fs::write(&path, format!("{text}half,a,ro")).unwrap();
        let mut w = RowWriter::append(path.clone(), keep, header, 2).unwrap();
        w.write_point(&point, &[&row]).unwrap();
        assert_eq!(w.rows, 3);
        let again = std::fs::read_to_string(&path).unwrap();
        assert_eq!(again.lines().count(), 4, "the half line is gone: {again}");
        let other = Row::new(Head::default(), Note::default());
        assert!(w
            .write_point(&point, &[&other])
            .unwrap_err()
            .to_string()
            .contains("differ from the file's"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn only_ok_cuda_rows_are_held_to_the_copy_bandwidth() {
        let row = |device: &str, status: &str| {
            Row::new(Heads::new("r", "e", device).with_status("v", 1, status), ())
        };
        let mut fast = row("cuda:0", "ok");
        fast.hold_to_copy_bandwidth(9000.0, 4300.0);
        assert_eq!(fast.head.status, "error");
        assert!(
            fast.note.starts_with("implausible: 9000 GB/s"),
            "{}",
            fast.note
        );
        let mut plausible = row("cuda:0", "ok");
        plausible.hold_to_copy_bandwidth(4000.0, 4300.0);
        assert_eq!(
            (plausible.head.status.as_str(), plausible.note.as_str()),
            ("ok", "")
        );
        // The CPU's roofline is a read bandwidth, and a wrong output stays a failure.
        for (device, status) in [("cpu", "ok"), ("cuda:0", "fail")] {
            let mut r = row(device, status);
            r.hold_to_copy_bandwidth(9000.0, 4300.0);
            assert_eq!(r.head.status, status);
        }
    }
}
