//! CUDA variants of contiguous attention: `cuda_naive` (materialised scores, three launches)
//! and `cuda_flash2` (FlashAttention-2 with m16n8k16 tensor-core MMAs), compiled from
//! `attention.cu` by NVRTC at first use; both take the shape's sliding window (flash2 starts
//! its key loop at a block's window start) and logit soft-cap. Host side: launch plans (pure, unit-tested on the
//! CPU) and the `AttentionKernel` implementations that upload in `prepare`, launch in `run`
//! and time with CUDA events. `prepare` checks the inputs' lengths against the shape, the plan
//! and every `int` argument (`kernel_args`) before it asks for the device.

use crate::{AttentionInputs, AttentionKernel, AttentionShape, PreparedAttention};
use kernel_common::error::Result;
use kernel_common::{Buffer, Cost, DType, Device, KernelError};
use kernel_cuda::cuda_launch;
use kernel_cuda::{
    blocks_for, dtype_suffix, int_arg, CudaRuntime, DeviceBuffer, KernelSource, Launch,
};
use std::sync::Arc;

/// `attention.cu` with its entry points.
pub const SOURCE: KernelSource = kernel_cuda::cuda_source!(
    "attention",
    "attention.cu",
    &[
        "naive_scores_f32",
        "naive_scores_f16",
        "naive_scores_bf16",
        "naive_softmax_f32",
        "naive_pv_f32",
        "naive_pv_f16",
        "naive_pv_bf16",
        "flash2_d64_f16",
        "flash2_d128_f16",
        "flash2_d64_bf16",
        "flash2_d128_bf16",
        "flash2p_d64_f16",
        "flash2p_d128_f16",
        "flash2p_d64_bf16",
        "flash2p_d128_bf16",
    ]
);

/// Query rows per FlashAttention-2 block (4 warps × 16), as `FA_BR` in attention.cu.
pub const FLASH2_BLOCK_ROWS: usize = 64;
/// Threads per FlashAttention-2 block.
pub const FLASH2_THREADS: usize = 128;
/// Keys per block of the naive score kernel.
const SCORES_THREADS: usize = 128;
/// Head dims the tensor-core kernels are instantiated for.
pub const CUDA_HEAD_DIMS: [usize; 2] = [64, 128];
/// The longest q_len or kv_len the kernels take: they hold positions in an `int` and add up
/// to a tile (a 128-key score block, a 64-key tile plus its lanes) to one.
pub const MAX_DEVICE_LEN: usize = i32::MAX as usize - 128;

/// Which CUDA algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaAlgo {
    /// Scores materialised in f32, softmax in place, P·V.
    Naive,
    /// FlashAttention-2 with tensor-core MMAs.
    Flash2,
    /// The same, K/V tiles double-buffered by cp.async, fragments by ldmatrix.
    Flash2Pipelined,
}

/// One kernel launch of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedLaunch {
    pub entry: String,
    pub launch: Launch,
}

/// The launches of one call, and the f32 score workspace (naive only).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionPlan {
    pub launches: Vec<PlannedLaunch>,
    pub workspace_bytes: usize,
}

/// The kernels' `int` arguments of one shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelArgs {
    pub q_heads: i32,
    pub kv_heads: i32,
    pub q_len: i32,
    pub kv_len: i32,
    pub head_dim: i32,
    /// The window clamped to kv_len (0 = none) and the soft-cap (0 = none).
    pub window: i32,
    pub softcap: f32,
}

/// The shape's sizes as the kernels' `int`s, or why one does not fit: each size, and q_len
/// and kv_len with the tile the kernels add to a position (`MAX_DEVICE_LEN`).
pub fn kernel_args(shape: &AttentionShape) -> Result<KernelArgs> {
    for (name, len) in [("q_len", shape.q_len), ("kv_len", shape.kv_len)] {
        if len > MAX_DEVICE_LEN {
            return Err(KernelError::Unsupported(format!(
                "CUDA attention: {name} {len} exceeds the kernels' int positions \
                 (≤ {MAX_DEVICE_LEN})"
            )));
        }
    }
    let (window, softcap) = device_options(shape.window, shape.softcap, shape.kv_len)?;
    Ok(KernelArgs {
        q_heads: int_arg("q_heads", shape.q_heads)?,
        kv_heads: int_arg("kv_heads", shape.kv_heads)?,
        q_len: int_arg("q_len", shape.q_len)?,
        kv_len: int_arg("kv_len", shape.kv_len)?,
        head_dim: int_arg("head_dim", shape.head_dim)?,
        window,
        softcap,
    })
}

/// Plans one call of `algo` on `shape` in `dtype`, or says why it cannot run (the shape's
/// validation, the kernels' limits, `kernel_args`, the grids).
pub fn plan(algo: CudaAlgo, shape: &AttentionShape, dtype: DType) -> Result<AttentionPlan> {
    shape.validate()?;
    kernel_args(shape)?;
    let unsupported = |m: String| Err(KernelError::Unsupported(m));
    let dt = dtype_suffix(dtype);
    let heads = shape.batch * shape.q_heads;
    match algo {
        CudaAlgo::Flash2 | CudaAlgo::Flash2Pipelined => {
            if dtype == DType::F32 {
                return unsupported(
                    "cuda_flash2 takes f16 or bf16 (tensor-core MMA operands)".into(),
                );
            }
            if !CUDA_HEAD_DIMS.contains(&shape.head_dim) {
                return unsupported(format!(
                    "cuda_flash2 is built for head_dim 64 or 128, not {}",
                    shape.head_dim
                ));
            }
            let launch = Launch::new(
                (blocks_for(shape.q_len, FLASH2_BLOCK_ROWS), heads, 1),
                FLASH2_THREADS,
                0,
            )?;
            Ok(AttentionPlan {
                launches: vec![PlannedLaunch {
                    entry: format!(
                        "{}_d{}_{dt}",
                        if algo == CudaAlgo::Flash2 {
                            "flash2"
                        } else {
                            "flash2p"
                        },
                        shape.head_dim
                    ),
                    launch,
                }],
                workspace_bytes: 0,
            })
        }
        CudaAlgo::Naive => {
            if shape.head_dim > 1024 {
                return unsupported(format!(
                    "cuda_naive takes head_dim ≤ 1024, not {}",
                    shape.head_dim
                ));
            }
            let rows = heads * shape.q_len;
            let Some(workspace_bytes) = rows
                .checked_mul(shape.kv_len)
                .and_then(|n| n.checked_mul(4))
            else {
                return unsupported(format!(
                    "cuda_naive: {rows} × {} f32 scores overflow the address space",
                    shape.kv_len
                ));
            };
            let scores = Launch::new(
                (blocks_for(shape.kv_len, SCORES_THREADS), shape.q_len, heads),
                SCORES_THREADS,
                0,
            )?;
            let softmax = Launch::new((blocks_for(rows, 4), 1, 1), 128, 0)?;
            let pv = Launch::new((rows, 1, 1), shape.head_dim.next_multiple_of(32), 0)?;
            Ok(AttentionPlan {
                launches: vec![
                    PlannedLaunch {
                        entry: format!("naive_scores_{dt}"),
                        launch: scores,
                    },
                    PlannedLaunch {
                        entry: "naive_softmax_f32".into(),
                        launch: softmax,
                    },
                    PlannedLaunch {
                        entry: format!("naive_pv_{dt}"),
                        launch: pv,
                    },
                ],
                workspace_bytes,
            })
        }
    }
}

/// The window and soft-cap as the kernels take them: window clamped to `reach` (a window
/// that long already reaches every key; 0 = none) as an i32, cap as an f32 (0 = none).
pub fn device_options(
    window: Option<usize>,
    softcap: Option<f32>,
    reach: usize,
) -> Result<(i32, f32)> {
    Ok((
        int_arg("window", window.map_or(0, |w| w.min(reach)))?,
        softcap.unwrap_or(0.0),
    ))
}

/// A CUDA attention variant for the registry (`cuda_naive`, `cuda_flash2`).
#[derive(Debug, Clone, Copy)]
pub struct CudaAttention {
    pub algo: CudaAlgo,
}

impl CudaAttention {
    fn label(&self) -> &'static str {
        match self.algo {
            CudaAlgo::Naive => "cuda_naive",
            CudaAlgo::Flash2 => "cuda_flash2",
            CudaAlgo::Flash2Pipelined => "cuda_flash2:pipe=1",
        }
    }
}

/// Fails unless `device` is a CUDA device.
pub fn cuda_only(name: &str, device: Device) -> Result<()> {
    match device {
        Device::Cuda(_) => Ok(()),
        Device::Cpu => Err(KernelError::Unsupported(format!(
            "{name} runs on CUDA only (use --device cuda)"
        ))),
    }
}

impl AttentionKernel for CudaAttention {
    fn name(&self) -> String {
        self.label().into()
    }
    fn supports(&self, shape: &AttentionShape, dtype: DType, device: Device) -> Result<()> {
        cuda_only(self.label(), device)?;
        plan(self.algo, shape, dtype).map(|_| ())
    }
    fn cost(&self, shape: &AttentionShape, dtype: DType) -> Cost {
        shape.io_cost(dtype)
    }
    /// Device memory for naive's f32 scores (the harness skips points over its limit).
    fn workspace_bytes(&self, shape: &AttentionShape, _threads: usize) -> u64 {
        plan(self.algo, shape, DType::F32).map_or(0, |p| p.workspace_bytes as u64)
    }
    fn prepare<'a>(
        &'a self,
        shape: &AttentionShape,
        inputs: &'a AttentionInputs,
    ) -> Result<Box<dyn PreparedAttention + 'a>> {
        inputs.check(shape)?;
        let dtype = inputs.dtype();
        let plan = plan(self.algo, shape, dtype)?;
        let args = kernel_args(shape)?;
        let rt = CudaRuntime::current()?;
        let functions = plan
            .launches
            .iter()
            .map(|l| rt.function(&SOURCE, &l.entry))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(PreparedCuda {
            q: DeviceBuffer::upload(&rt, &inputs.q)?,
            k: DeviceBuffer::upload(&rt, &inputs.k)?,
            v: DeviceBuffer::upload(&rt, &inputs.v)?,
            o: DeviceBuffer::poisoned(&rt, dtype, shape.q_elems())?,
            scores: rt.zeros::<u8>(plan.workspace_bytes)?,
            rt,
            plan,
            functions,
            shape: *shape,
            args,
        }))
    }
}

struct PreparedCuda {
    rt: Arc<CudaRuntime>,
    plan: AttentionPlan,
    functions: Vec<kernel_cuda::cudarc::driver::CudaFunction>,
    shape: AttentionShape,
    /// The `int` arguments, checked before the device was asked for.
    args: KernelArgs,
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    o: DeviceBuffer,
    scores: kernel_cuda::cudarc::driver::CudaSlice<u8>,
}

impl PreparedCuda {
    fn launch_all(&mut self) -> Result<()> {
        let s = &self.shape;
        let KernelArgs {
            q_heads: hq,
            kv_heads: hkv,
            q_len: lq,
            kv_len: lk,
            head_dim: d,
            window,
            softcap,
        } = self.args;
        let causal = s.causal as i32;
        let scale = s.scale;
        let rt = &self.rt;
        for (planned, f) in self.plan.launches.iter().zip(&self.functions) {
            let l = planned.launch;
            if planned.entry.starts_with("flash2") {
                cuda_launch!(
                    rt,
                    f,
                    l,
                    &self.q.bytes,
                    &self.k.bytes,
                    &self.v.bytes,
                    &mut self.o.bytes,
                    &hq,
                    &hkv,
                    &lq,
                    &lk,
                    &causal,
                    &scale,
                    &window,
                    &softcap
                )?;
            } else if planned.entry.starts_with("naive_scores") {
                cuda_launch!(
                    rt,
                    f,
                    l,
                    &self.q.bytes,
                    &self.k.bytes,
                    &mut self.scores,
                    &hq,
                    &hkv,
                    &lq,
                    &lk,
                    &d,
                    &causal,
                    &scale,
                    &window,
                    &softcap
                )?;
            } else if planned.entry == "naive_softmax_f32" {
                let rows = (s.batch * s.q_heads * s.q_len) as i64;
                cuda_launch!(rt, f, l, &mut self.scores, &rows, &lk)?;
            } else {
                cuda_launch!(
                    rt,
                    f,
                    l,
                    &self.scores,
                    &self.v.bytes,
                    &mut self.o.bytes,
                    &hq,
                    &hkv,
                    &lq,
                    &lk,
                    &d
                )?;
            }
        }
        Ok(())
    }
}

impl PreparedAttention for PreparedCuda {
    fn run(&mut self, out: &mut Buffer) -> Result<()> {
        self.launch_all()?;
        self.rt.sync()?;
        *out = self.o.download(&self.rt)?;
        Ok(())
    }

    fn time_on_device(&mut self, reps: usize) -> Option<Result<Vec<f64>>> {
        let rt = self.rt.clone();
        Some(rt.time(reps, || self.launch_all()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash2_plan_grid_and_refusals() {
        let s = AttentionShape::new(2, 32, 8, 1000, 1000, 128, true);
        let p = plan(CudaAlgo::Flash2, &s, DType::BF16).unwrap();
        assert_eq!(p.launches.len(), 1);
        assert_eq!(p.launches[0].entry, "flash2_d128_bf16");
        assert_eq!(p.launches[0].launch.grid, (16, 64, 1));
        assert_eq!(p.launches[0].launch.block, (128, 1, 1));
        assert!(plan(CudaAlgo::Flash2, &s, DType::F32).is_err());
        let odd = AttentionShape::new(1, 4, 4, 8, 8, 96, false);
        assert!(plan(CudaAlgo::Flash2, &odd, DType::F16).is_err());
    }

    #[test]
    fn naive_plan_covers_every_score_and_row() {
        let s = AttentionShape::new(3, 8, 2, 5, 300, 64, true);
        let p = plan(CudaAlgo::Naive, &s, DType::F16).unwrap();
        let names: Vec<&str> = p.launches.iter().map(|l| l.entry.as_str()).collect();
        assert_eq!(
            names,
            ["naive_scores_f16", "naive_softmax_f32", "naive_pv_f16"]
        );
        let scores = p.launches[0].launch;
        assert!(scores.grid.0 as usize * scores.block.0 as usize >= 300);
        assert_eq!((scores.grid.1, scores.grid.2), (5, 24));
        assert_eq!(p.launches[1].launch.grid.0, 30); // 120 rows, 4 warps a block
        assert_eq!(p.launches[2].launch.grid.0, 120);
        assert_eq!(p.workspace_bytes, 120 * 300 * 4);
    }

    #[test]
    fn bad_lengths_and_sizes_are_refused_before_any_launch() {
        // Positions past the kernels' ints: refused by the plan (and so by `supports`).
        let long = AttentionShape::new(1, 1, 1, 1, MAX_DEVICE_LEN + 1, 64, false);
        for algo in [CudaAlgo::Naive, CudaAlgo::Flash2, CudaAlgo::Flash2Pipelined] {
            let e = plan(algo, &long, DType::F16).unwrap_err();
            assert!(matches!(e, KernelError::Unsupported(_)), "{e}");
            assert!(e.to_string().contains("kv_len 2147483520"), "{e}");
        }
        let e = CudaAttention {
            algo: CudaAlgo::Flash2,
        }
        .supports(&long, DType::F16, Device::Cuda(0))
        .unwrap_err();
        assert!(e.to_string().contains("int positions"), "{e}");
        assert_eq!(
            kernel_args(&AttentionShape::new(2, 8, 2, 3, 40, 64, true).with_window(Some(100)))
                .unwrap(),
            KernelArgs {
                q_heads: 8,
                kv_heads: 2,
                q_len: 3,
                kv_len: 40,
                head_dim: 64,
                window: 40,
                softcap: 0.0,
            }
        );
        // Inputs that do not match the shape: refused by `prepare` without a device.
        let s = AttentionShape::new(1, 2, 1, 4, 8, 64, true);
        let good = AttentionInputs::random(&s, DType::F16, 1);
        let prepare = |inputs: &AttentionInputs| {
            let kernel = CudaAttention {
                algo: CudaAlgo::Flash2,
            };
            let Err(e) = kernel.prepare(&s, inputs) else {
                panic!("accepted")
            };
            assert!(matches!(e, KernelError::BadBuffer(_)), "{e}");
            e.to_string()
        };
        let short_k = AttentionInputs {
            k: Buffer::F16(vec![half::f16::ZERO; 8 * 64 - 1]),
            ..good.clone()
        };
        assert!(prepare(&short_k).contains("k has 511 elements, the shape needs 512"));
        let f32_v = AttentionInputs {
            v: Buffer::F32(vec![0.0; 8 * 64]),
            ..good.clone()
        };
        assert!(prepare(&f32_v).contains("v is f32"));
    }
}
