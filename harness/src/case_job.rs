//! What a family's replay preparation gives the `replay` command: one `Run` per variant (a
//! `Job` that prepares untimed and then runs, or why the variant is unsupported) with what its
//! output must match (`Expect`), and the helpers every family's preparation uses to read a case
//! file's tensors with one-line errors.

use crate::case_file::{float_dtype, CaseFile, Tensor};
use crate::error::Result;
use kernel_common::{DType, Tolerance};
use std::sync::Arc;

/// A variant's output, ready to compare.
pub enum Output {
    Floats(Vec<f32>),
    Bytes(Vec<u8>),
}

/// What a variant's output is compared with: the stored output (if the file has one) and the
/// f64 reference (if the family has one), under `tol`.
pub struct Expect {
    pub tol: Tolerance,
    pub reference: Option<Vec<f64>>,
    pub stored: Option<Output>,
}

/// A prepared call: `run` once (checked), then timed; `output` is the last run's.
pub trait Started {
    fn run(&mut self) -> kernel_common::error::Result<()>;
    fn output(&self) -> Output;
}

/// One variant's work with everything it needs owned.
pub trait Job {
    /// The untimed part (an attention kernel's `prepare`), then the call to run.
    fn start(&self) -> kernel_common::error::Result<Box<dyn Started + '_>>;
}

/// A job that is one call producing its output (nothing to prepare).
pub struct EachCall<F>(pub F);

struct EachStarted<'a, F> {
    call: &'a F,
    last: Option<Output>,
}

impl<F: Fn() -> kernel_common::error::Result<Output>> Job for EachCall<F> {
    fn start(&self) -> kernel_common::error::Result<Box<dyn Started + '_>> {
        Ok(Box::new(EachStarted {
            call: &self.0,
            last: None,
        }))
    }
}

impl<F: Fn() -> kernel_common::error::Result<Output>> Started for EachStarted<'_, F> {
    fn run(&mut self) -> kernel_common::error::Result<()> {
        self.last = Some((self.call)()?);
        Ok(())
    }
    fn output(&self) -> Output {
        match &self.last {
            Some(Output::Floats(v)) => Output::Floats(v.clone()),
            Some(Output::Bytes(v)) => Output::Bytes(v.clone()),
            None => Output::Floats(vec![]),
        }
    }
}

/// One variant to run: its name, its job (or why it is unsupported), what it must match.
pub struct Run {
    pub name: String,
    pub job: std::result::Result<Box<dyn Job>, String>,
    pub expect: Arc<Expect>,
}

/// A parsed, validated case file, ready to run.
pub struct Prepared {
    pub label: String,
    pub runs: Vec<Run>,
}

/// Whether `name` (a variant spec) is asked for: all when the list is empty, else by its base
/// name or its full spec.
pub fn wanted(asked: &[String], name: &str) -> bool {
    asked.is_empty()
        || asked
            .iter()
            .any(|a| a == name || a.split(':').next() == name.split(':').next())
}

/// The storage dtype shared by `tensors`, or a one-line error.
pub fn common_dtype(case: &CaseFile, tensors: &[(&str, &Tensor)]) -> Result<DType> {
    let mut dt = None;
    for (name, t) in tensors {
        let d = float_dtype(t).ok_or_else(|| {
            case.error(format!(
                "tensor '{name}' must be F32, F16 or BF16, not {:?}",
                t.dtype
            ))
        })?;
        match dt {
            None => dt = Some(d),
            Some(prev) if prev != d => {
                return Err(case.error(format!(
                    "tensor '{name}' is {d} but the others are {prev}: one storage dtype per case"
                )))
            }
            _ => {}
        }
    }
    Ok(dt.expect("at least one tensor"))
}

/// The file's `out` as floats, checked to have `want_shape`.
pub fn stored_floats(case: &CaseFile, want_shape: &[usize]) -> Result<Option<Output>> {
    match case.optional("out", &[want_shape.len()])? {
        None => Ok(None),
        Some(t) if t.shape != want_shape => Err(case.error(format!(
            "tensor 'out' has shape {:?}, expected {want_shape:?}",
            t.shape
        ))),
        Some(t) => Ok(Some(Output::Floats(case.buffer("out", t)?.to_f32()))),
    }
}

/// f32 values of a float tensor that must be F32.
pub fn f32_tensor(case: &CaseFile, name: &str, t: &Tensor) -> Result<Vec<f32>> {
    if t.dtype != safetensors::Dtype::F32 {
        return Err(case.error(format!("tensor '{name}' must be F32, not {:?}", t.dtype)));
    }
    Ok(case.buffer(name, t)?.to_f32())
}
