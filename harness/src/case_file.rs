//! Case files: a safetensors file whose `__metadata__` says `family` (attention, paged, quant, moe)
//! and the family's parameters, and whose tensors are the inputs under fixed names, optionally
//! with the output the researcher's own stack produced (`out`). This module reads and
//! validates one; every defect becomes one line naming the file (exit 2).

use crate::error::{HarnessError, Result};
use half::{bf16, f16};
use kernel_common::{Buffer, DType};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// One tensor as stored.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// A parsed case file.
#[derive(Debug, Clone)]
pub struct CaseFile {
    pub path: PathBuf,
    pub family: String,
    /// What a case of this family must hold (for error messages).
    pub needs: &'static str,
    pub meta: HashMap<String, String>,
    pub tensors: BTreeMap<String, Tensor>,
}

impl CaseFile {
    /// Reads and parses `path`; accepts f32, f16, bf16, i32, i64 and u8 tensors.
    /// `replayable(family)` gives what a case of that family needs, or why it cannot be
    /// replayed (the family table answers it).
    pub fn load(
        path: &Path,
        replayable: impl Fn(&str) -> std::result::Result<&'static str, String>,
    ) -> Result<CaseFile> {
        let bytes = std::fs::read(path).map_err(|e| {
            HarnessError::Usage(format!(
                "case {}: cannot read the file ({e})",
                path.display()
            ))
        })?;
        Self::parse(path, &bytes, replayable)
    }

    /// Parses the case file `bytes` (named `path` in errors), as `load` does.
    pub fn parse(
        path: &Path,
        bytes: &[u8],
        replayable: impl Fn(&str) -> std::result::Result<&'static str, String>,
    ) -> Result<CaseFile> {
        let name = path.display().to_string();
        let bad = |m: String| HarnessError::Usage(format!("case {name}: {m}"));
        let (_, header) = SafeTensors::read_metadata(bytes)
            .map_err(|e| bad(format!("not a valid safetensors file ({e})")))?;
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| bad(format!("not a valid safetensors file ({e})")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let family = meta.get("family").cloned().ok_or_else(|| {
            bad(
                "__metadata__ has no \"family\" (`harness list` shows the families marked replay)"
                    .into(),
            )
        })?;
        let needs = replayable(&family).map_err(bad)?;
        let mut tensors = BTreeMap::new();
        for (tname, view) in st.tensors() {
            let dtype = view.dtype();
            if !matches!(
                dtype,
                Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::I32 | Dtype::I64 | Dtype::U8
            ) {
                return Err(bad(format!(
                    "tensor '{tname}' has dtype {dtype:?}; accepted: F32, F16, BF16, I32, I64, U8"
                )));
            }
            tensors.insert(
                tname,
                Tensor {
                    dtype,
                    shape: view.shape().to_vec(),
                    data: view.data().to_vec(),
                },
            );
        }
        Ok(CaseFile {
            path: path.to_path_buf(),
            family,
            needs,
            meta,
            tensors,
        })
    }

    /// A one-line error about this case.
    pub fn error(&self, m: impl std::fmt::Display) -> HarnessError {
        HarnessError::Usage(format!("case {}: {m}", self.path.display()))
    }

    /// The tensor `name`, which must exist and have `rank` dimensions (any of `ranks`).
    pub fn tensor(&self, name: &str, ranks: &[usize]) -> Result<&Tensor> {
        let t = self.tensors.get(name).ok_or_else(|| {
            let have: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
            self.error(format!(
                "no tensor '{name}' (a {} case needs {}; the file has {})",
                self.family,
                self.needs,
                have.join(", ")
            ))
        })?;
        if !ranks.contains(&t.shape.len()) {
            return Err(self.error(format!(
                "tensor '{name}' has shape {:?}; expected rank {}",
                t.shape,
                ranks
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )));
        }
        Ok(t)
    }

    /// An optional tensor.
    pub fn optional(&self, name: &str, ranks: &[usize]) -> Result<Option<&Tensor>> {
        if self.tensors.contains_key(name) {
            self.tensor(name, ranks).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A float tensor as a `Buffer` of its own dtype.
    pub fn buffer(&self, name: &str, t: &Tensor) -> Result<Buffer> {
        let d = &t.data;
        Ok(match t.dtype {
            Dtype::F32 => Buffer::F32(
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::F16 => Buffer::F16(
                d.chunks_exact(2)
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ),
            Dtype::BF16 => Buffer::BF16(
                d.chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ),
            other => {
                return Err(self.error(format!(
                    "tensor '{name}' must be F32, F16 or BF16, not {other:?}"
                )))
            }
        })
    }

    /// An integer tensor (I32, I64, U8) as i64 values.
    pub fn ints(&self, name: &str, t: &Tensor) -> Result<Vec<i64>> {
        let d = &t.data;
        Ok(match t.dtype {
            Dtype::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            Dtype::U8 => d.iter().map(|&b| b as i64).collect(),
            other => {
                return Err(self.error(format!(
                    "tensor '{name}' must be an integer tensor (I32, I64, U8), not {other:?}"
                )))
            }
        })
    }

    /// A metadata flag: absent → `default`; true/false/1/0 accepted.
    pub fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.meta.get(key).map(String::as_str) {
            None => Ok(default),
            Some("true" | "True" | "1") => Ok(true),
            Some("false" | "False" | "0") => Ok(false),
            Some(v) => Err(self.error(format!("metadata {key}='{v}' is not true or false"))),
        }
    }

    /// A positive finite f32 from the metadata, if present.
    pub fn positive(&self, key: &str) -> Result<Option<f32>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(v) => match v.parse::<f32>() {
                Ok(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                _ => Err(self.error(format!("metadata {key}='{v}' is not a positive number"))),
            },
        }
    }
}

/// The storage dtype of a float tensor.
pub fn float_dtype(t: &Tensor) -> Option<DType> {
    match t.dtype {
        Dtype::F32 => Some(DType::F32),
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::BF16),
        _ => None,
    }
}
