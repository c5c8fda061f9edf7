//! A GGUF (v2/v3) reader following ggml's `gguf.c` / the `gguf` Python package: header,
//! metadata key-values (all scalar types, strings, arrays), tensor infos, alignment, and the
//! tensors as `QuantMatrix`es in F32, F16, Q8_0, Q4_0 or Q4_1. Every defect is one error that
//! names the file and what is wrong (bad magic, truncated, unknown type, missing key/tensor).
//! A file is a tensor source (llama.cpp naming) whose `llama.*` metadata gives the model's
//! shape (`gguf_config`); `Llama::from_gguf` builds it.

use crate::model::llama::{Llama, LlamaConfig, RopeLayout};
use crate::model::source::{build, LoadOptions, Naming, TensorSource};
use kernel_common::KernelError;
use quant_kernels::{QuantMatrix, WeightFormat};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    UInt(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

/// One tensor's header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// ggml order: dims[0] is the row length.
    pub dims: Vec<usize>,
    /// ggml type id.
    pub ggml_type: u32,
    /// Offset from the start of the data section.
    pub offset: usize,
}

/// A parsed GGUF file (its bytes kept in memory).
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub meta: BTreeMap<String, Value>,
    pub tensors: BTreeMap<String, TensorInfo>,
    data_start: usize,
    bytes: Vec<u8>,
}

/// The error type of model loading: one line naming the file.
pub type Result<T> = std::result::Result<T, KernelError>;

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl Cursor<'_> {
    fn err(&self, m: impl std::fmt::Display) -> KernelError {
        KernelError::BadBuffer(format!("{}: {m}", self.path.display()))
    }
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.at + n > self.b.len() {
            return Err(self.err(format!(
                "truncated: needs {} bytes at offset {}, the file has {}",
                n,
                self.at,
                self.b.len()
            )));
        }
        self.at += n;
        Ok(&self.b[self.at - n..self.at])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()? as usize;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| self.err("a string is not UTF-8"))
    }
    fn value(&mut self, ty: u32, depth: usize) -> Result<Value> {
        Ok(match ty {
            0 => Value::UInt(self.take(1)?[0] as u64),
            1 => Value::Int(self.take(1)?[0] as i8 as i64),
            2 => Value::UInt(u16::from_le_bytes(self.take(2)?.try_into().expect("2")) as u64),
            3 => Value::Int(i16::from_le_bytes(self.take(2)?.try_into().expect("2")) as i64),
            4 => Value::UInt(self.u32()? as u64),
            5 => Value::Int(self.u32()? as i32 as i64),
            6 => Value::Float(f32::from_le_bytes(self.take(4)?.try_into().expect("4")) as f64),
            7 => Value::Bool(self.take(1)?[0] != 0),
            8 => Value::Str(self.string()?),
            9 if depth == 0 => {
                let inner = self.u32()?;
                let n = self.u64()? as usize;
                if n > self.b.len() {
                    return Err(self.err(format!("an array claims {n} elements")));
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(inner, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::UInt(self.u64()?),
            11 => Value::Int(self.u64()? as i64),
            12 => Value::Float(f64::from_le_bytes(self.take(8)?.try_into().expect("8"))),
            other => return Err(self.err(format!("unknown metadata value type {other}"))),
        })
    }
}

/// The weight format of a ggml type id, if this workbench reads it.
pub fn format_of(ggml_type: u32) -> Option<WeightFormat> {
    match ggml_type {
        0 => Some(WeightFormat::F32),
        1 => Some(WeightFormat::F16),
        2 => Some(WeightFormat::Q4_0),
        3 => Some(WeightFormat::Q4_1),
        8 => Some(WeightFormat::Q8_0),
        _ => None,
    }
}

impl Gguf {
    /// Reads and parses `path`.
    pub fn open(path: &Path) -> Result<Gguf> {
        let bytes = std::fs::read(path).map_err(|e| {
            KernelError::BadBuffer(format!("{}: cannot read ({e})", path.display()))
        })?;
        Gguf::parse(path, bytes)
    }

    /// Parses GGUF `bytes` (named `path` in errors).
    pub fn parse(path: &Path, bytes: Vec<u8>) -> Result<Gguf> {
        let mut c = Cursor {
            b: &bytes,
            at: 0,
            path,
        };
        if c.take(4)? != b"GGUF" {
            return Err(c.err("wrong magic: not a GGUF file"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(c.err(format!("GGUF version {version} is not 2 or 3")));
        }
        let (n_tensors, n_kv) = (c.u64()? as usize, c.u64()? as usize);
        let mut meta = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            let v = c.value(ty, 0)?;
            meta.insert(key, v);
        }
        let mut tensors = BTreeMap::new();
        for _ in 0..n_tensors {
            let name = c.string()?;
            let nd = c.u32()? as usize;
            if nd == 0 || nd > 4 {
                return Err(c.err(format!("tensor '{name}' has {nd} dimensions")));
            }
            let dims = (0..nd)
                .map(|_| c.u64().map(|d| d as usize))
                .collect::<Result<Vec<_>>>()?;
            let ggml_type = c.u32()?;
            let offset = c.u64()? as usize;
            tensors.insert(
                name,
                TensorInfo {
                    dims,
                    ggml_type,
                    offset,
                },
            );
        }
        let align = match meta.get("general.alignment") {
            Some(Value::UInt(a)) if *a > 0 => *a as usize,
            _ => 32,
        };
        let data_start = c.at.div_ceil(align) * align;
        Ok(Gguf {
            path: path.to_path_buf(),
            version,
            meta,
            tensors,
            data_start,
            bytes,
        })
    }

    fn err(&self, m: impl std::fmt::Display) -> KernelError {
        KernelError::BadBuffer(format!("{}: {m}", self.path.display()))
    }

    /// A required unsigned integer.
    pub fn uint(&self, key: &str) -> Result<usize> {
        match self.meta.get(key) {
            Some(Value::UInt(v)) => Ok(*v as usize),
            Some(Value::Int(v)) if *v >= 0 => Ok(*v as usize),
            Some(other) => Err(self.err(format!("metadata {key} is {other:?}, not an integer"))),
            None => Err(self.err(format!("metadata {key} is missing"))),
        }
    }

    /// A required float.
    pub fn float(&self, key: &str) -> Result<f64> {
        match self.meta.get(key) {
            Some(Value::Float(v)) => Ok(*v),
            Some(other) => Err(self.err(format!("metadata {key} is {other:?}, not a float"))),
            None => Err(self.err(format!("metadata {key} is missing"))),
        }
    }

    /// A required string.
    pub fn string(&self, key: &str) -> Result<&str> {
        match self.meta.get(key) {
            Some(Value::Str(s)) => Ok(s),
            Some(_) => Err(self.err(format!("metadata {key} is not a string"))),
            None => Err(self.err(format!("metadata {key} is missing"))),
        }
    }

    /// A required array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        match self.meta.get(key) {
            Some(Value::Array(v)) => v
                .iter()
                .map(|x| match x {
                    Value::Str(s) => Ok(s.as_str()),
                    _ => Err(self.err(format!("metadata {key} holds a non-string"))),
                })
                .collect(),
            _ => Err(self.err(format!("metadata {key} is missing or not an array"))),
        }
    }

    /// Tensor `name` as a rows × cols matrix (ggml dims [cols, rows] or [len] for vectors).
    pub fn matrix(&self, name: &str) -> Result<QuantMatrix> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| self.err(format!("tensor '{name}' is missing")))?;
        let format = format_of(t.ggml_type).ok_or_else(|| {
            self.err(format!(
                "tensor '{name}' has ggml type {}, not F32, F16, Q8_0, Q4_0 or Q4_1",
                t.ggml_type
            ))
        })?;
        let cols = t.dims[0];
        let rows: usize = t.dims[1..].iter().product();
        format
            .validate(cols)
            .map_err(|e| self.err(format!("tensor '{name}': {e}")))?;
        let len = rows * format.row_bytes(cols);
        let start = self.data_start + t.offset;
        if start + len > self.bytes.len() {
            return Err(self.err(format!(
                "truncated: tensor '{name}' needs bytes {start}..{} of {}",
                start + len,
                self.bytes.len()
            )));
        }
        QuantMatrix::from_bytes(format, rows, cols, self.bytes[start..start + len].to_vec())
            .map_err(|e| self.err(format!("tensor '{name}': {e}")))
    }

    /// Tensor `name` (any shape) dequantised to f32.
    pub fn floats(&self, name: &str) -> Result<Vec<f32>> {
        Ok(self.matrix(name)?.dequantize())
    }
}

impl TensorSource for Gguf {
    fn origin(&self) -> String {
        self.path.display().to_string()
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn matrix(&self, name: &str) -> Result<QuantMatrix> {
        Gguf::matrix(self, name)
    }
}

/// The shape of a GGUF `llama` file.
pub fn gguf_config(g: &Gguf) -> Result<LlamaConfig> {
    let arch = g.string("general.architecture")?;
    if arch != "llama" {
        return Err(KernelError::BadBuffer(format!(
            "{}: architecture '{arch}' is not llama",
            g.path.display()
        )));
    }
    if g.uint("llama.expert_count").unwrap_or(0) > 0 {
        return Err(KernelError::Unsupported(format!(
            "{}: GGUF mixture-of-experts files are not supported (load Mixtral from a Hugging Face directory)",
            g.path.display()
        )));
    }
    let d_model = g.uint("llama.embedding_length")?;
    let heads = g.uint("llama.attention.head_count")?;
    Ok(LlamaConfig {
        layers: g.uint("llama.block_count")?,
        d_model,
        heads,
        kv_heads: g.uint("llama.attention.head_count_kv").unwrap_or(heads),
        head_dim: d_model / heads.max(1),
        d_ff: g.uint("llama.feed_forward_length")?,
        vocab: g.strings("tokenizer.ggml.tokens").map(|t| t.len())?,
        context: g.uint("llama.context_length")?,
        eps: g.float("llama.attention.layer_norm_rms_epsilon")? as f32,
        rope_base: g.float("llama.rope.freq_base").unwrap_or(10000.0) as f32,
        rope: RopeLayout::Interleaved,
        moe: None,
    })
}

impl Llama {
    /// Loads the `llama` architecture from `g`; `attention` is an attention variant spec.
    pub fn from_gguf(g: &Gguf, attention: &str) -> Result<Llama> {
        let opts = LoadOptions {
            attention: attention.into(),
            ..LoadOptions::default()
        };
        build(gguf_config(g)?, g, Naming::Gguf, false, &opts)
    }
}
