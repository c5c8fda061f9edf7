//! A sweep CSV read back by point. Every row carries its point's key (`point`) and how many
//! rows the point has (`point_rows`), and a point's rows are written together, so the file
//! is a run of complete points followed, if the writer was killed, by a tail: a half-written
//! last line and/or a point missing rows. `--resume` keeps the complete points and cuts the
//! tail off; `harness merge` refuses a file with one.

use crate::error::{HarnessError, Result};
use std::collections::HashSet;
use std::path::Path;

/// One complete point of a shard CSV.
#[derive(Debug, Clone)]
pub struct PointRows {
    pub key: String,
    pub rows: Vec<csv::StringRecord>,
}

/// A shard CSV by point.
#[derive(Debug, Clone, Default)]
pub struct ShardCsv {
    /// The header line as written (None for an empty file or a half-written header).
    pub header_line: Option<String>,
    pub header: csv::StringRecord,
    pub points: Vec<PointRows>,
    /// Bytes of the header and the complete points: where a resumed shard appends.
    pub complete_len: u64,
    /// What follows the complete points, if anything, in words.
    pub tail: Option<String>,
}

impl ShardCsv {
    /// Rows of the complete points.
    pub fn rows(&self) -> usize {
        self.points.iter().map(|p| p.rows.len()).sum()
    }

    /// The index of column `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }
}

/// Reads `path`; a file that is not a sweep CSV, or whose complete part is inconsistent
/// (a point cut short before another starts, a point twice), is one line.
pub fn read(path: &Path) -> Result<ShardCsv> {
    let bytes =
        std::fs::read(path).map_err(HarnessError::io(format!("reading {}", path.display())))?;
    let whole_lines = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut tail = (whole_lines < bytes.len()).then(|| {
        format!(
            "a half-written last line ({} bytes)",
            bytes.len() - whole_lines
        )
    });
    let Some(header_end) = bytes.iter().position(|&b| b == b'\n') else {
        return Ok(ShardCsv {
            tail,
            ..ShardCsv::default()
        });
    };
    let corrupt = |line: u64, why: String| {
        HarnessError::Usage(format!(
            "{} is corrupt at line {line}: {why}",
            path.display()
        ))
    };
    let header_line = String::from_utf8_lossy(&bytes[..header_end]).into_owned();
    let mut reader = csv::Reader::from_reader(&bytes[..whole_lines]);
    let header = reader
        .headers()
        .map_err(|e| corrupt(1, e.to_string()))?
        .clone();
    let (Some(point_col), Some(rows_col)) = (
        header.iter().position(|h| h == "point"),
        header.iter().position(|h| h == "point_rows"),
    ) else {
        return Err(HarnessError::Usage(format!(
            "{} is not a sweep CSV: it has no point and point_rows columns",
            path.display()
        )));
    };
    let mut scan = ShardCsv {
        header_line: Some(header_line),
        header,
        complete_len: header_end as u64 + 1,
        ..ShardCsv::default()
    };
    let mut seen = HashSet::new();
    let mut open: Option<(PointRows, usize)> = None;
    loop {
        let mut record = csv::StringRecord::new();
        let more = reader.read_record(&mut record).map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            corrupt(line, e.to_string())
        })?;
        if !more {
            break;
        }
        let line = record.position().map_or(0, |p| p.line());
        let key = record.get(point_col).unwrap_or("").to_string();
        let want: usize = record
            .get(rows_col)
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| corrupt(line, "point_rows is not a positive count".into()))?;
        let (mut point, want) = match open.take() {
            Some((p, w)) if p.key == key => (p, w),
            Some((p, w)) => {
                return Err(corrupt(
                    line,
                    format!(
                        "point '{}' has {} of its {w} rows when point '{key}' starts",
                        p.key,
                        p.rows.len()
                    ),
                ))
            }
            None if seen.contains(&key) => {
                return Err(corrupt(line, format!("point '{key}' appears twice")))
            }
            None => (
                PointRows {
                    key: key.clone(),
                    rows: vec![],
                },
                want,
            ),
        };
        point.rows.push(record);
        if point.rows.len() == want {
            seen.insert(key);
            scan.points.push(point);
            scan.complete_len = reader.position().byte();
        } else {
            open = Some((point, want));
        }
    }
    if let Some((p, want)) = open {
        let cut = format!("point '{}' has {} of its {want} rows", p.key, p.rows.len());
        tail = Some(match tail {
            Some(t) => format!("{cut}, then {t}"),
            None => cut,
        });
    }
    scan.tail = tail;
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "run_id,variant,status,point,point_rows,note\n";

    fn scan(body: &str) -> Result<ShardCsv> {
        let dir = std::env::temp_dir().join(format!("harness-shard-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!(
            "{:x}.csv",
            crate::sweep::key::digest(body.as_bytes())
        ));
        std::fs::write(&path, body).unwrap();
        let out = read(&path);
        std::fs::remove_file(&path).unwrap();
        out
    }

    #[test]
    fn complete_points_are_kept_and_the_tail_is_named() {
        let a = "r,x,ok,k=1,2,\nr,y,ok,k=1,2,\n";
        let b = "r,x,ok,k=2,1,\n";
        let whole = scan(&format!("{HEADER}{a}{b}")).unwrap();
        assert_eq!(whole.points.len(), 2);
        assert_eq!(whole.rows(), 3);
        assert_eq!(whole.tail, None);
        assert_eq!(
            whole.complete_len as usize,
            HEADER.len() + a.len() + b.len()
        );
        assert_eq!(whole.header_line.as_deref(), Some(HEADER.trim_end()));

        // Killed inside point k=3 (one of two rows), mid-line.
        let cut = scan(&format!("{HEADER}{a}{b}r,x,ok,k=3,2,\nr,y,o")).unwrap();
        assert_eq!(cut.points.len(), 2);
        assert_eq!(cut.complete_len as usize, HEADER.len() + a.len() + b.len());
        let tail = cut.tail.unwrap();
        assert!(
            tail.contains("k=3' has 1 of its 2") && tail.contains("half-written"),
            "{tail}"
        );

        // Killed while writing the header, or before any row.
        assert!(scan("run_id,vari").unwrap().header_line.is_none());
        assert_eq!(scan(HEADER).unwrap().complete_len as usize, HEADER.len());
    }

    #[test]
    fn inconsistent_files_are_one_line() {
        let short_then_next = format!("{HEADER}r,x,ok,k=1,2,\nr,x,ok,k=2,1,\n");
        let e = scan(&short_then_next).unwrap_err().to_string();
        assert!(
            e.contains("corrupt at line 3") && e.contains("1 of its 2"),
            "{e}"
        );
        let twice = format!("{HEADER}r,x,ok,k=1,1,\nr,x,ok,k=2,1,\nr,x,ok,k=1,1,\n");
        assert!(scan(&twice).unwrap_err().to_string().contains("twice"));
        let e = scan("run_id,status\nr,ok\n").unwrap_err().to_string();
        assert!(e.contains("not a sweep CSV"), "{e}");
    }
}
