//! Hugging Face checkpoint directories: `config.json` of any class in the architecture table
//! (`arch::from_hf`: transformers 4 style, `rope_theta` / `rope_scaling` at the top level, or
//! transformers 5, `rope_parameters`) and the weights in `model.safetensors` or in shards
//! listed by `model.safetensors.index.json` (memory-mapped, each tensor copied out when the
//! builder asks for it), f32/f16/bf16 (bf16 widened to f32 exactly, f16 kept), plus
//! `tokenizer.json` when present. Every defect is one error naming the file and the problem.

use crate::model::arch::{self, ModelSpec, Naming};
use crate::model::llama::{Llama, Result};
use crate::model::mapped::FileBytes;
use crate::model::source::{build, LoadOptions, TensorSource};
use crate::model::tokenizer::TextTokenizer;
use kernel_common::KernelError;
use kernel_quant::{QuantMatrix, WeightFormat};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

struct Tensor {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range in the file.
    range: (usize, usize),
}

/// An opened checkpoint directory (its weight files mapped).
pub struct HfCheckpoint {
    pub dir: PathBuf,
    /// The model config.json describes.
    pub spec: ModelSpec,
    eos: Option<u32>,
    bos: Option<u32>,
    files: Vec<(PathBuf, FileBytes)>,
    tensors: BTreeMap<String, Tensor>,
}

fn bad(path: &Path, m: impl std::fmt::Display) -> KernelError {
    KernelError::BadFile(format!("{}: {m}", path.display()))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| bad(path, format!("cannot read ({e})")))
}

fn json(path: &Path) -> Result<Value> {
    serde_json::from_slice(&read(path)?).map_err(|e| bad(path, format!("malformed JSON ({e})")))
}

/// The first id of a token-id field (an integer or a list of integers); one outside u32 is
/// no id.
fn token_id(v: Option<&Value>) -> Option<u32> {
    let id = match v? {
        Value::Array(a) => a.first()?.as_u64(),
        x => x.as_u64(),
    };
    id.and_then(|x| u32::try_from(x).ok())
}

/// A shard named by the index: a plain file name in the checkpoint's own directory (never a
/// path that leads out of it).
fn shard_name(index: &Path, v: &Value) -> Result<String> {
    match v.as_str() {
        Some(n) if Path::new(n).file_name() == Some(std::ffi::OsStr::new(n)) => Ok(n.to_string()),
        _ => Err(bad(
            index,
            format!("weight_map names {v}, not a file name in the checkpoint directory"),
        )),
    }
}

/// The model a parsed config.json at `path` describes (its class's row of the table).
pub fn parse_config(path: &Path, c: &Value) -> Result<ModelSpec> {
    let spec = arch::from_hf(path, c)?;
    spec.cfg.validate().map_err(|e| bad(path, e))?;
    Ok(spec)
}

impl HfCheckpoint {
    /// Reads config.json and every safetensors file of `dir`.
    pub fn open(dir: &Path) -> Result<HfCheckpoint> {
        let cfg_path = dir.join("config.json");
        if !cfg_path.exists() {
            return Err(bad(
                dir,
                "no config.json: not a Hugging Face checkpoint directory",
            ));
        }
        let c = json(&cfg_path)?;
        let spec = parse_config(&cfg_path, &c)?;
        let index = dir.join("model.safetensors.index.json");
        let names: Vec<String> = if index.exists() {
            let map = json(&index)?;
            let map = map["weight_map"]
                .as_object()
                .ok_or_else(|| bad(&index, "'weight_map' is missing"))?
                .values()
                .map(|v| shard_name(&index, v))
                .collect::<Result<std::collections::BTreeSet<_>>>()?;
            map.into_iter().collect()
        } else if dir.join("model.safetensors").exists() {
            vec!["model.safetensors".into()]
        } else {
            return Err(bad(
                dir,
                "no model.safetensors or model.safetensors.index.json",
            ));
        };
        let mut files = vec![];
        let mut tensors = BTreeMap::new();
        for (fi, n) in names.iter().enumerate() {
            let path = dir.join(n);
            let bytes = FileBytes::map(&path)?;
            SafeTensors::deserialize(bytes.as_slice())
                .map_err(|e| bad(&path, format!("not a valid safetensors file ({e})")))?;
            let (header, meta) = SafeTensors::read_metadata(bytes.as_slice())
                .map_err(|e| bad(&path, format!("not a valid safetensors file ({e})")))?;
            for (name, info) in meta.tensors() {
                let (a, b) = info.data_offsets;
                tensors.insert(
                    name,
                    Tensor {
                        file: fi,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        range: (8 + header + a, 8 + header + b),
                    },
                );
            }
            files.push((path, bytes));
        }
        Ok(HfCheckpoint {
            dir: dir.to_path_buf(),
            spec,
            eos: token_id(c.get("eos_token_id")),
            bos: token_id(c.get("bos_token_id")),
            files,
            tensors,
        })
    }

    /// The model with `opts` (attention, weight format, MoE capacity).
    pub fn build(&self, opts: &LoadOptions) -> Result<Llama> {
        build(&self.spec, self, Naming::Hf, opts)
    }

    /// `tokenizer.json`, when the directory has one.
    pub fn tokenizer(&self) -> Result<Option<TextTokenizer>> {
        let path = self.dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| bad(&path, format!("cannot load the tokenizer ({e})")))?;
        Ok(Some(TextTokenizer::from_tokenizers(
            inner,
            self.spec.cfg.vocab,
            self.bos,
            self.eos,
            false,
        )))
    }
}

impl TensorSource for HfCheckpoint {
    fn origin(&self) -> String {
        self.dir.display().to_string()
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn matrix(&self, name: &str) -> Result<QuantMatrix> {
        let t = &self.tensors[name];
        let (path, bytes) = &self.files[t.file];
        let (rows, cols) = match t.shape[..] {
            [n] => (1, n),
            [r, c] => (r, c),
            _ => {
                return Err(bad(
                    path,
                    format!(
                        "tensor '{name}' has shape {:?}, not a vector or matrix",
                        t.shape
                    ),
                ))
            }
        };
        let data = bytes.copy_out(t.range.0..t.range.1);
        let err = |e: KernelError| bad(path, format!("tensor '{name}': {e}"));
        match t.dtype {
            Dtype::F32 => {
                let w: Vec<f32> = data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                QuantMatrix::quantize(WeightFormat::F32, rows, cols, &w).map_err(err)
            }
            Dtype::BF16 => {
                let w: Vec<f32> = data
                    .chunks_exact(2)
                    .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                    .collect();
                QuantMatrix::quantize(WeightFormat::F32, rows, cols, &w).map_err(err)
            }
            Dtype::F16 => QuantMatrix::from_bytes(WeightFormat::F16, rows, cols, data).map_err(err),
            other => Err(bad(
                path,
                format!("tensor '{name}' has dtype {other:?}, not F32, F16 or BF16"),
            )),
        }
    }
}
