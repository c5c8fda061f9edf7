//! MHA/GQA/MQA attention: the problem descriptor, the `AttentionKernel` trait every variant
//! implements (so the harness can enumerate them by name), the f64 reference, and the CPU
//! variants — `naive` (materialised scores) and `flash2` (FlashAttention-2 tiling, Dao 2023).
//!
//! Non-finite inputs propagate: a NaN or ±Inf in a query row makes that row's output
//! non-finite, one in K the rows that see that key; one in V the rows that see that key in
//! that dimension — and, because a masked probability is exactly 0 and 0·NaN = NaN, the
//! masked rows that share the key's tile (as in FlashAttention and PyTorch's math backend;
//! the reference keeps them clean). Keys no row of a tile sees — before the first row's
//! sliding window — are never read, so nothing there leaks. Soft-capping maps an infinite
//! score to ±cap (tanh's limits), in the reference too. Softmaxes are max-shifted, so logits
//! of ±1e4 are exact up to f32 rounding; every row sees at least one key (causal needs
//! q_len ≤ kv_len, and a window is ≥ 1: the key at the row's own position).

/// The family's one case list: random shapes, the edge cases, the emulator's shapes.
pub mod cases;
/// Optimised CPU variants: naive materialised-scores attention and FlashAttention-2 tiling.
pub mod cpu;
/// CUDA variants (NVRTC-compiled `attention.cu`): naive and FlashAttention-2.
pub mod cuda;
/// The f64 oracle with materialised scores.
pub mod reference;
/// `AttentionShape`, its validation and its FLOP/byte model.
pub mod shape;
/// The variant table: every variant's name, device, constructor and check specs.
pub mod variants;

pub use shape::AttentionShape;
pub use variants::VARIANTS;

use kernel_common::error::Result;
use kernel_common::{Buffer, Cost, DType, Device, KernelError, VariantSpec};

/// The three input tensors of one attention call, in one storage dtype.
/// Layouts: q `[batch, q_heads, q_len, head_dim]`, k and v `[batch, kv_heads, kv_len, head_dim]`.
#[derive(Debug, Clone)]
pub struct AttentionInputs {
    pub q: Buffer,
    pub k: Buffer,
    pub v: Buffer,
}

impl AttentionInputs {
    /// Seeded standard-normal inputs for `shape` in `dtype` (generated in parallel; the
    /// values depend on the seed only).
    pub fn random(shape: &AttentionShape, dtype: DType, seed: u64) -> AttentionInputs {
        use kernel_common::inputs::{derive_seed, normal_buffer_par};
        AttentionInputs {
            q: normal_buffer_par(derive_seed(seed, 1), dtype, shape.q_elems()),
            k: normal_buffer_par(derive_seed(seed, 2), dtype, shape.kv_elems()),
            v: normal_buffer_par(derive_seed(seed, 3), dtype, shape.kv_elems()),
        }
    }

    /// The storage dtype (that of q).
    pub fn dtype(&self) -> DType {
        self.q.dtype()
    }

    /// Checks dtypes and lengths against `shape`.
    pub fn check(&self, shape: &AttentionShape) -> Result<()> {
        let dt = self.dtype();
        self.q.expect("q", dt, shape.q_elems())?;
        self.k.expect("k", dt, shape.kv_elems())?;
        self.v.expect("v", dt, shape.kv_elems())
    }
}

/// Runs `$body` with `$q, $k, $v, $o` bound to the typed slices of the inputs and output,
/// or returns `BadBuffer` when they do not share one dtype.
#[macro_export]
macro_rules! with_qkvo {
    ($inputs:expr, $out:expr, |$q:ident, $k:ident, $v:ident, $o:ident| $body:expr) => {{
        use kernel_common::Buffer as B;
        match (&$inputs.q, &$inputs.k, &$inputs.v, $out) {
            (B::F32($q), B::F32($k), B::F32($v), B::F32($o)) => $body,
            (B::F16($q), B::F16($k), B::F16($v), B::F16($o)) => $body,
            (B::BF16($q), B::BF16($k), B::BF16($v), B::BF16($o)) => $body,
            _ => {
                return Err(kernel_common::KernelError::BadBuffer(
                    "q, k, v and out must share one dtype".into(),
                ))
            }
        }
    }};
}

/// A variant after its untimed set-up (e.g. a paged variant has filled its block pool):
/// `run` is what the harness times.
pub trait PreparedAttention {
    /// Computes the attention output into `out` (`[batch, q_heads, q_len, head_dim]`).
    fn run(&mut self, out: &mut Buffer) -> Result<()>;
    /// Seconds of each of `reps` timed calls measured on the device, for variants whose
    /// `run` also copies the output back (CUDA: the kernels only, between CUDA events, after
    /// a warm-up); `None` means the harness times `run` on the host.
    fn time_on_device(&mut self, _reps: usize) -> Option<Result<Vec<f64>>> {
        None
    }
}

/// One attention variant. Implementations do no I/O and print nothing.
pub trait AttentionKernel: Send + Sync {
    /// The full variant spec, parameters included (`flash2:br=64,bc=64`).
    fn name(&self) -> String;
    /// Why this case cannot run here, or `Ok`.
    fn supports(&self, shape: &AttentionShape, dtype: DType, device: Device) -> Result<()>;
    /// Minimum bytes moved and FLOPs of one call.
    fn cost(&self, shape: &AttentionShape, dtype: DType) -> Cost;
    /// Heap scratch the variant allocates during one call with `threads` threads (a model,
    /// used to skip cases that would not fit; the harness also measures the real peak).
    fn workspace_bytes(&self, _shape: &AttentionShape, _threads: usize) -> u64 {
        0
    }
    /// Untimed set-up on `inputs`; the returned object runs the timed part.
    fn prepare<'a>(
        &'a self,
        shape: &AttentionShape,
        inputs: &'a AttentionInputs,
    ) -> Result<Box<dyn PreparedAttention + 'a>>;
}

/// A contiguous-layout variant: a plain function of (shape, q, k, v) with nothing to set up.
pub trait ContiguousAttention: Send + Sync {
    /// Computes `out` from the contiguous inputs.
    fn compute(
        &self,
        shape: &AttentionShape,
        inputs: &AttentionInputs,
        out: &mut Buffer,
    ) -> Result<()>;
}

struct PreparedContiguous<'a, K: ContiguousAttention + ?Sized> {
    kernel: &'a K,
    shape: AttentionShape,
    inputs: &'a AttentionInputs,
}

impl<K: ContiguousAttention + ?Sized> PreparedAttention for PreparedContiguous<'_, K> {
    fn run(&mut self, out: &mut Buffer) -> Result<()> {
        self.kernel.compute(&self.shape, self.inputs, out)
    }
}

/// `prepare` for contiguous variants: validates and wraps `compute`.
pub fn prepare_contiguous<'a, K: ContiguousAttention>(
    kernel: &'a K,
    shape: &AttentionShape,
    inputs: &'a AttentionInputs,
) -> Result<Box<dyn PreparedAttention + 'a>> {
    shape.validate()?;
    inputs.check(shape)?;
    Ok(Box::new(PreparedContiguous {
        kernel,
        shape: *shape,
        inputs,
    }))
}

/// CPU-only variants refuse other devices with this error.
pub fn cpu_only(name: &str, device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        other => Err(KernelError::Unsupported(format!(
            "{name} has no {other} implementation yet"
        ))),
    }
}

/// Builds a variant of this crate from its spec, or `None` when no row of `VARIANTS` has
/// its name.
pub fn kernel_from_spec(spec: &VariantSpec) -> Result<Option<Box<dyn AttentionKernel>>> {
    kernel_common::build_from(&[VARIANTS], spec)
}
