//! A GGUF (v2/v3) reader following ggml's `gguf.c` / the `gguf` Python package: header,
//! metadata key-values (all scalar types, strings, arrays), tensor infos, alignment, and the
//! tensors as `QuantMatrix`es, each in its own type (real files mix them per tensor). The file
//! is memory-mapped (`mapped.rs`): a tensor is copied out when asked for and its pages
//! released, so a loaded model does not hold the file beside its weights. Every defect is one
//! error that names the file and what is wrong (bad magic, truncated, unknown type, missing
//! key/tensor, a duplicate, a count the file cannot hold): counts and lengths are checked
//! against the bytes left before anything is allocated for them, and offset and size
//! arithmetic is checked, so a damaged header never allocates more than the file nor wraps
//! into a wrong but valid range. A file is a tensor source (llama.cpp naming, `source.rs`)
//! whose `general.architecture` picks its row of `arch::ARCHITECTURES` (`arch::from_gguf`);
//! `load::load_gguf` builds it.

use crate::model::mapped::FileBytes;
use kernel_common::KernelError;
use kernel_quant::{ggml_type_name, QuantMatrix, WeightFormat};
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

/// A parsed GGUF file (its bytes mapped, or in memory).
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub meta: BTreeMap<String, Value>,
    pub tensors: BTreeMap<String, TensorInfo>,
    data_start: usize,
    bytes: FileBytes,
}

/// The error type of model loading: one line naming the file.
pub type Result<T> = std::result::Result<T, KernelError>;

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    path: &'a Path,
}

/// The fewest bytes a metadata value of type `ty` occupies (a string: its length field).
fn min_value_bytes(ty: u32) -> Option<usize> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        8 | 10..=12 => Some(8),
        // An array: element type and count.
        9 => Some(12),
        _ => None,
    }
}

/// The fewest bytes of a key-value pair (empty key, type, one byte) and of a tensor info
/// (empty name, one dimension, type, offset): bounds on the counts a header may claim.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 8 + 4 + 8;

impl Cursor<'_> {
    fn err(&self, m: impl std::fmt::Display) -> KernelError {
        KernelError::BadFile(format!("{}: {m}", self.path.display()))
    }
    fn left(&self) -> usize {
        self.b.len() - self.at
    }
    /// The next `n` bytes; `what` names them when the file ends first.
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        if n > self.left() {
            return Err(self.err(format!(
                "truncated: {what} at offset {} needs {n} bytes, the file has {} left",
                self.at,
                self.left()
            )));
        }
        self.at += n;
        Ok(&self.b[self.at - n..self.at])
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }
    /// A count or length read from the file, as usize (saturating: it is checked against the
    /// bytes left before anything is allocated for it).
    fn size(&mut self, what: &str) -> Result<usize> {
        Ok(usize::try_from(self.u64(what)?).unwrap_or(usize::MAX))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.size(what)?;
        let at = self.at;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec())
            .map_err(|_| self.err(format!("{what} at offset {at} is not UTF-8")))
    }
    /// `count` items of at least `min_bytes` each must fit in what is left of the file.
    fn claim(&self, count: usize, min_bytes: usize, what: &str) -> Result<()> {
        if count > self.left() / min_bytes {
            return Err(self.err(format!(
                "the header claims {count} {what}, more than the {} bytes left can hold",
                self.left()
            )));
        }
        Ok(())
    }
    fn value(&mut self, ty: u32, key: &str, in_array: bool) -> Result<Value> {
        Ok(match ty {
            0 => Value::UInt(self.array::<1>(key)?[0] as u64),
            1 => Value::Int(self.array::<1>(key)?[0] as i8 as i64),
            2 => Value::UInt(u16::from_le_bytes(self.array(key)?) as u64),
            3 => Value::Int(i16::from_le_bytes(self.array(key)?) as i64),
            4 => Value::UInt(self.u32(key)? as u64),
            5 => Value::Int(self.u32(key)? as i32 as i64),
            6 => Value::Float(f32::from_le_bytes(self.array(key)?) as f64),
            7 => Value::Bool(self.array::<1>(key)?[0] != 0),
            8 => Value::Str(self.string(key)?),
            9 if in_array => {
                return Err(self.err(format!(
                    "metadata {key} is an array of arrays, which this reader does not take"
                )))
            }
            9 => {
                let inner = self.u32(key)?;
                let n = self.size(key)?;
                let min = min_value_bytes(inner).ok_or_else(|| {
                    self.err(format!(
                        "metadata {key}: unknown array element type {inner}"
                    ))
                })?;
                self.claim(n, min, &format!("elements in metadata {key}"))?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(inner, key, true)?);
                }
                Value::Array(v)
            }
            10 => Value::UInt(self.u64(key)?),
            11 => Value::Int(self.u64(key)? as i64),
            12 => Value::Float(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.err(format!("metadata {key} has unknown value type {other}"))),
        })
    }
}

impl Gguf {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<Gguf> {
        Gguf::parse_bytes(path, FileBytes::map(path)?)
    }

    /// Parses GGUF `bytes` (named `path` in errors). Counts and lengths in the header are
    /// checked against the bytes left before anything is allocated for them, so a damaged
    /// header is an error, never an allocation larger than the file.
    pub fn parse(path: &Path, bytes: Vec<u8>) -> Result<Gguf> {
        Gguf::parse_bytes(path, FileBytes::Owned(bytes))
    }

    fn parse_bytes(path: &Path, bytes: FileBytes) -> Result<Gguf> {
        let mut c = Cursor {
            b: bytes.as_slice(),
            at: 0,
            path,
        };
        if c.take(4, "the magic")? != b"GGUF" {
            return Err(c.err("wrong magic: not a GGUF file"));
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(c.err(format!("GGUF version {version} is not 2 or 3")));
        }
        let n_tensors = c.size("the tensor count")?;
        let n_kv = c.size("the metadata count")?;
        c.claim(n_kv, MIN_KV_BYTES, "metadata entries")?;
        let mut meta = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key {i}"))?;
            let ty = c.u32(&key)?;
            let v = c.value(ty, &key, false)?;
            if meta.insert(key.clone(), v).is_some() {
                return Err(c.err(format!("metadata {key} appears twice")));
            }
        }
        c.claim(n_tensors, MIN_TENSOR_INFO_BYTES, "tensors")?;
        let mut tensors = BTreeMap::new();
        for i in 0..n_tensors {
            let name = c.string(&format!("the name of tensor {i}"))?;
            let nd = c.u32(&name)? as usize;
            if nd == 0 || nd > 4 {
                return Err(c.err(format!("tensor '{name}' has {nd} dimensions")));
            }
            let dims = (0..nd).map(|_| c.size(&name)).collect::<Result<Vec<_>>>()?;
            let ggml_type = c.u32(&name)?;
            let offset = c.size(&name)?;
            let info = TensorInfo {
                dims,
                ggml_type,
                offset,
            };
            if tensors.insert(name.clone(), info).is_some() {
                return Err(c.err(format!("tensor '{name}' appears twice")));
            }
        }
        let align = match meta.get("general.alignment") {
            None => 32,
            Some(Value::UInt(a)) if a.is_power_of_two() => *a,
            Some(other) => {
                return Err(c.err(format!(
                    "general.alignment is {other:?}, not a power of two"
                )))
            }
        };
        let data_start = usize::try_from(align)
            .ok()
            .and_then(|a| c.at.checked_next_multiple_of(a))
            .ok_or_else(|| c.err(format!("general.alignment {align} is beyond the file")))?;
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
        KernelError::BadFile(format!("{}: {m}", self.path.display()))
    }

    /// Where the tensor data begins (the header's end, aligned).
    pub fn data_start(&self) -> usize {
        self.data_start
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
        let format = WeightFormat::from_ggml_type(t.ggml_type).ok_or_else(|| {
            let ty = ggml_type_name(t.ggml_type).unwrap_or("unknown to ggml");
            self.err(format!(
                "tensor '{name}' has type {ty} ({}), which this workbench does not read",
                t.ggml_type
            ))
        })?;
        let cols = t.dims[0];
        format
            .validate(cols)
            .map_err(|e| self.err(format!("tensor '{name}': {e}")))?;
        // Sizes and offsets come from the file: every sum and product is checked, so a
        // value near 2^64 is an error rather than a wrapped, in-bounds range.
        let range = t.dims[1..]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|rows| Some((rows, format.matrix_bytes(rows, cols)?)))
            .and_then(|(rows, len)| {
                let start = self.data_start.checked_add(t.offset)?;
                Some((rows, start, start.checked_add(len)?))
            });
        let len = self.bytes.as_slice().len();
        let Some((rows, start, end)) = range.filter(|&(_, _, end)| end <= len) else {
            return Err(self.err(format!(
                "truncated: tensor '{name}' ({format}, dims {:?}, offset {}) lies beyond the file's {len} bytes",
                t.dims,
                t.offset,
            )));
        };
        QuantMatrix::from_bytes(format, rows, cols, self.bytes.copy_out(start..end))
            .map_err(|e| self.err(format!("tensor '{name}': {e}")))
    }

    /// Tensor `name` (any shape) dequantised to f32.
    pub fn floats(&self, name: &str) -> Result<Vec<f32>> {
        Ok(self.matrix(name)?.dequantize())
    }
}
