//! Any result CSV read as text by column name, whatever its family: the rows a report filters
//! and the grid point a row belongs to. A row's point is the value of its key columns — every
//! column that varies in the files at hand and is neither a measurement (timing, status,
//! seed, note, a float) nor derived from one (`bound`) — so rows of two runs, or two variants
//! of one run, are joined the way llama.cpp's `compare-llama-bench.py` joins on its test
//! parameters.

use crate::error::{HarnessError, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Columns that say how a row went, never which point it is.
const MEASUREMENT_COLUMNS: &[&str] = &[
    "run_id",
    "status",
    "reps",
    "median_ms",
    "p10_ms",
    "p90_ms",
    // a CUDA row's hot timing beside the cold median_ms
    "hot_median_ms",
    "seed",
    "peer_version",
    "note",
    // The whole grid point as one string: what a key set names, never a key of its own.
    "point",
    "point_rows",
    // attention's memory/compute label follows the roofline measured at the run's start
    "bound",
];

/// A CSV as text: its header and its rows.
#[derive(Debug, Clone)]
pub struct Table {
    pub path: PathBuf,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Reads `path`; an unreadable or ragged file is one line.
    pub fn read(path: &Path) -> Result<Table> {
        let bad = |e: csv::Error| HarnessError::Usage(format!("{}: {e}", path.display()));
        let mut reader = csv::Reader::from_path(path).map_err(bad)?;
        let headers: Vec<String> = reader
            .headers()
            .map_err(bad)?
            .iter()
            .map(String::from)
            .collect();
        let rows = reader
            .records()
            .map(|r| r.map(|rec| rec.iter().map(String::from).collect()))
            .collect::<std::result::Result<Vec<Vec<String>>, _>>()
            .map_err(bad)?;
        Ok(Table {
            path: path.to_path_buf(),
            headers,
            rows,
        })
    }

    /// The index of column `name`.
    pub fn col(&self, name: &str) -> Option<usize> {
        self.headers.iter().position(|h| h == name)
    }

    /// Fails with one line unless every column in `names` is present.
    pub fn require(&self, names: &[&str]) -> Result<()> {
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| self.col(n).is_none())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(HarnessError::Usage(format!(
                "{}: no column {}",
                self.path.display(),
                missing.join(", ")
            )))
        }
    }

    /// The value of column `name` in `row` ("" when the column is absent).
    pub fn get<'a>(&self, row: &'a [String], name: &str) -> &'a str {
        self.col(name)
            .and_then(|i| row.get(i))
            .map_or("", String::as_str)
    }

    /// Column `name` of `row` as a number (None when empty, absent or not a number).
    pub fn number(&self, row: &[String], name: &str) -> Option<f64> {
        self.get(row, name).parse().ok()
    }
}

/// The newest `<run-id>.csv` directly in `dir` (run ids sort by time; shards excluded).
pub fn newest_run_csv(dir: &Path) -> Result<Option<PathBuf>> {
    Ok(run_csvs(dir)?.pop())
}

/// Every `<run-id>.csv` directly in `dir`, oldest first (run ids sort by time; shards
/// excluded).
pub fn run_csvs(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries =
        std::fs::read_dir(dir).map_err(HarnessError::io(format!("reading {}", dir.display())))?;
    let mut csvs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .filter(|p| !p.to_string_lossy().contains(".shard-"))
        .collect();
    csvs.sort();
    Ok(csvs)
}

/// Whether `value` is a measured number rather than a coordinate: a float (`0.25`, `inf`),
/// where coordinates are integers, booleans or words.
fn is_float(value: &str) -> bool {
    !value.is_empty() && value.parse::<i64>().is_err() && value.parse::<f64>().is_ok()
}

/// The key columns of rows drawn from `tables` (each with the rows it contributes): the columns
/// every table has that are not measurements, hold no float, and take more than one value
/// across those rows, less any that the others (with `apart`) determine — `bytes` follows
/// from the shape and the variant — and less `apart` and `ignore` themselves. `apart` are
/// the columns a comparison sets apart (`variant` when two variants' rows are divided);
/// `ignore` the measured column.
pub fn key_columns(
    tables: &[(&Table, Vec<&[String]>)],
    apart: &[&str],
    ignore: &[&str],
) -> Vec<String> {
    let Some((first, _)) = tables.first() else {
        return vec![];
    };
    let candidates: Vec<String> = first
        .headers
        .iter()
        .filter(|h| !MEASUREMENT_COLUMNS.contains(&h.as_str()) && !ignore.contains(&h.as_str()))
        .filter(|h| tables.iter().all(|(t, _)| t.col(h).is_some()))
        .filter(|h| {
            let mut values = BTreeSet::new();
            for (t, rows) in tables {
                for row in rows {
                    let v = t.get(row, h);
                    // `apart` columns are coordinates by the caller's word, floats or not (a
                    // plot's x, `load = 0.5`): without them nothing they determine drops out.
                    if is_float(v) && !apart.contains(&h.as_str()) {
                        return false;
                    }
                    values.insert(v);
                }
            }
            values.len() > 1
        })
        .cloned()
        .collect();
    let mut keys = candidates.clone();
    for c in candidates.iter().rev() {
        if apart.contains(&c.as_str()) {
            continue;
        }
        let others: Vec<String> = keys.iter().filter(|k| *k != c).cloned().collect();
        if determines(tables, &others, c) {
            keys = others;
        }
    }
    keys.retain(|k| !apart.contains(&k.as_str()));
    keys
}

/// Whether the values of `by` fix the value of `column` in every row.
fn determines(tables: &[(&Table, Vec<&[String]>)], by: &[String], column: &str) -> bool {
    let mut seen: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
    tables.iter().all(|(t, rows)| {
        rows.iter().all(|row| {
            let v = t.get(row, column);
            *seen.entry(point_of(t, row, by)).or_insert(v) == v
        })
    })
}

/// A row's point: `name=value` over `keys`, space-separated.
pub fn point_of(table: &Table, row: &[String], keys: &[String]) -> String {
    keys.iter()
        .map(|k| format!("{k}={}", table.get(row, k)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A table read from CSV text (written to a temporary file and read back), for unit tests.
#[cfg(test)]
pub(crate) fn table_from_text(text: &str) -> Table {
    let dir = std::env::temp_dir().join(format!("harness-table-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!(
        "{}.csv",
        xxhash_rust::xxh3::xxh3_64(text.as_bytes())
    ));
    std::fs::write(&path, text).unwrap();
    let t = Table::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    t
}

#[cfg(test)]
mod tests {
    use super::table_from_text as table;
    use super::*;

    #[test]
    fn keys_are_the_varying_coordinates_not_the_measurements() {
        let t = table(
            "run_id,variant,kv_len,dtype,median_ms,gbps,bound,flag\n\
             r,a,64,f32,1.5,2.0,memory,true\n\
             r,b,64,f32,1.0,3.0,compute,false\n\
             r,a,128,f32,2.5,2.1,memory,true\n",
        );
        let rows: Vec<&[String]> = t.rows.iter().map(Vec::as_slice).collect();
        // flag follows from the variant: not a key of its own.
        let keys = key_columns(&[(&t, rows.clone())], &[], &[]);
        assert_eq!(keys, ["variant", "kv_len"]);
        let keys = key_columns(&[(&t, rows.clone())], &["variant"], &[]);
        assert_eq!(keys, ["kv_len"]);
        let keys = key_columns(&[(&t, rows)], &[], &["variant"]);
        assert_eq!(keys, ["kv_len", "flag"]);
        assert_eq!(point_of(&t, &t.rows[2], &keys), "kv_len=128 flag=true");
        assert_eq!(t.number(&t.rows[0], "gbps"), Some(2.0));
        assert_eq!(t.number(&t.rows[0], "absent"), None);
        assert!(t.require(&["median_ms", "p10_ms"]).is_err());
    }
}
