//! The grid of an attention experiment: its keys, and their cartesian product expanded into
//! validated `Point`s (mode decode → q_len 1, append → q_len = append_len < kv_len, prefill →
//! q_len = kv_len; heads as mha, gqa, mqa or Q/KV).

use crate::error::{HarnessError, Result};
use crate::sweep::PointKey;
use kernel_attention::AttentionShape;
use kernel_common::DType;
use std::collections::BTreeMap;

/// Grid keys an attention experiment understands, with what each means.
pub const GRID_KEYS: &[(&str, &str)] = &[
    ("mode", "decode (q_len 1) | append (q_len = append_len < kv_len, causal) | prefill (q_len = kv_len)"),
    ("dtype", "f32 | f16 | bf16 (storage; accumulation is f32)"),
    ("batch", "sequences per call"),
    ("q_heads", "query heads"),
    ("heads", "mha | gqa (kv = q/4) | mqa (kv = 1) | Q/KV explicit, e.g. 32/8"),
    ("kv_len", "context length (keys per sequence)"),
    ("append_len", "new tokens per sequence in append mode"),
    ("head_dim", "dimension of each head"),
    ("causal", "true | false (prefill only; decode/append are causal by position)"),
];

/// Attention-specific view of one grid point.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub mode: String,
    pub dtype: DType,
    pub shape: AttentionShape,
}

impl Point {
    /// The point's identity for sweeps: every coordinate that tells it from another point.
    pub fn key(&self) -> PointKey {
        let s = &self.shape;
        PointKey::of(&[
            ("mode", &self.mode),
            ("dtype", &self.dtype),
            ("batch", &s.batch),
            ("heads", &format!("{}/{}", s.q_heads, s.kv_heads)),
            ("q_len", &s.q_len),
            ("kv_len", &s.kv_len),
            ("head_dim", &s.head_dim),
            ("causal", &s.causal),
        ])
    }
}

/// Expands a resolved grid into points, validating every value and every shape.
pub fn points(grid: &BTreeMap<String, Vec<String>>) -> Result<Vec<Point>> {
    let list = |key: &str, default: &str| -> Vec<String> {
        grid.get(key)
            .cloned()
            .unwrap_or_else(|| vec![default.to_string()])
    };
    let num = |key: &str, v: &str| -> Result<usize> {
        v.parse::<usize>().map_err(|_| {
            HarnessError::Usage(format!(
                "--set/grid {key}='{v}' is not a non-negative integer"
            ))
        })
    };
    let mut points = vec![];
    for mode in list("mode", "decode") {
        if !["decode", "append", "prefill"].contains(&mode.as_str()) {
            return Err(HarnessError::Usage(format!(
                "mode '{mode}' is not decode, append or prefill"
            )));
        }
        for dt in list("dtype", "f32") {
            let dtype = DType::parse(&dt).map_err(|e| HarnessError::Usage(e.to_string()))?;
            for batch in list("batch", "1") {
                for qh in list("q_heads", "32") {
                    for heads in list("heads", "gqa") {
                        for kv_len in list("kv_len", "1024") {
                            for append_len in list("append_len", "16") {
                                for head_dim in list("head_dim", "128") {
                                    for causal in list("causal", "true") {
                                        let q_heads = num("q_heads", &qh)?;
                                        let kv_heads = parse_heads(&heads, q_heads)?;
                                        let kv_len = num("kv_len", &kv_len)?;
                                        let causal = match causal.as_str() {
                                            "true" => true,
                                            "false" => false,
                                            o => {
                                                return Err(HarnessError::Usage(format!(
                                                    "causal '{o}' is not true or false"
                                                )))
                                            }
                                        };
                                        let (q_len, causal) = match mode.as_str() {
                                            "decode" => (1, true),
                                            "append" => {
                                                let n = num("append_len", &append_len)?;
                                                if n >= kv_len {
                                                    continue; // not an append: it would be a prefill
                                                }
                                                (n, true)
                                            }
                                            _ => (kv_len, causal),
                                        };
                                        let shape = AttentionShape::new(
                                            num("batch", &batch)?,
                                            q_heads,
                                            kv_heads,
                                            q_len,
                                            kv_len,
                                            num("head_dim", &head_dim)?,
                                            causal,
                                        );
                                        shape.validate().map_err(|e| {
                                            HarnessError::Usage(format!(
                                                "{mode} {}: {e}",
                                                shape.label()
                                            ))
                                        })?;
                                        let p = Point {
                                            mode: mode.clone(),
                                            dtype,
                                            shape,
                                        };
                                        if !points.contains(&p) {
                                            points.push(p);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(points)
}

/// `mha`, `gqa`, `mqa` or `Q/KV` → number of KV heads for `q_heads` query heads.
pub fn parse_heads(text: &str, q_heads: usize) -> Result<usize> {
    match text {
        "mha" => Ok(q_heads),
        "gqa" => Ok((q_heads / 4).max(1)),
        "mqa" => Ok(1),
        _ => {
            let parsed = text
                .split_once('/')
                .and_then(|(q, kv)| Some((q.parse::<usize>().ok()?, kv.parse::<usize>().ok()?)));
            match parsed {
                Some((q, kv)) if q == q_heads => Ok(kv),
                Some((q, _)) => Err(HarnessError::Usage(format!(
                    "heads '{text}' names {q} query heads but q_heads is {q_heads}"
                ))),
                None => Err(HarnessError::Usage(format!(
                    "heads '{text}' is not mha, gqa, mqa or Q/KV"
                ))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        assert_eq!(parse_heads("mha", 32).unwrap(), 32);
        assert_eq!(parse_heads("gqa", 32).unwrap(), 8);
        assert_eq!(parse_heads("mqa", 32).unwrap(), 1);
        assert_eq!(parse_heads("32/4", 32).unwrap(), 4);
        assert!(parse_heads("16/4", 32).is_err());
        assert!(parse_heads("many", 32).is_err());
    }

    #[test]
    fn points_validate_shapes() {
        let mut grid = BTreeMap::new();
        grid.insert(
            "mode".to_string(),
            vec!["decode".to_string(), "prefill".to_string()],
        );
        grid.insert("kv_len".to_string(), vec!["64".to_string()]);
        let pts = points(&grid).unwrap();
        assert_eq!(pts.len(), 2);
        assert_eq!(pts[0].shape.q_len, 1);
        assert_eq!(pts[1].shape.q_len, 64);
        grid.insert("heads".to_string(), vec!["32/3".to_string()]);
        let err = points(&grid).unwrap_err().to_string();
        assert!(
            err.contains("kv_heads (3) must divide q_heads (32)"),
            "{err}"
        );
        grid.insert("heads".to_string(), vec!["gqa".to_string()]);
        grid.insert("head_dim".to_string(), vec!["0".to_string()]);
        assert!(points(&grid)
            .unwrap_err()
            .to_string()
            .contains("head_dim must be > 0"));
        grid.insert("head_dim".to_string(), vec!["x".to_string()]);
        assert!(points(&grid).is_err());
    }
}
