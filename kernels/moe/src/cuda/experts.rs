//! `cuda_grouped`: the expert FFN of any routing (token or expert choice, every policy and
//! weight rule) as grouped tensor-core GEMMs from `experts.cu` — f16 or bf16 storage, f32
//! accumulation on m16n8k16 MMAs, one launch per stage for all experts (gate+up with SiLU,
//! down, combine). The host plans the grouped layout (`plan_grouped`: kept assignments
//! sorted by expert, each expert's rows padded to whole tiles, the tile → expert table, the
//! per-token rows and weights of the combine); `DeviceExperts` holds the weights transposed
//! per expert so both MMA operands run along the reduction.

use crate::config::MoeConfig;
use crate::decision::Routing;
use crate::weights::MoeWeights;
use kernel_common::error::Result;
use kernel_common::{Buffer, DType, KernelError};
use kernel_cuda::buffer::{f32_bytes, i32_bytes};
use kernel_cuda::cuda_launch;
use kernel_cuda::cudarc::driver::{CudaFunction, CudaSlice};
use kernel_cuda::{dtype_suffix, int_arg, CudaRuntime, DeviceBuffer, KernelSource, Launch};
use std::sync::Arc;

/// `experts.cu` with its entry points.
pub const SOURCE: KernelSource = kernel_cuda::cuda_source!(
    "moe",
    "experts.cu",
    &[
        "moe_up_f16",
        "moe_up_bf16",
        "moe_down_f16",
        "moe_down_bf16",
        "moe_combine_rows_f16",
        "moe_combine_rows_bf16",
    ]
);

/// Rows of one tile (an expert's rows are padded to a multiple of it) and its columns
/// (`XM`, `XN` in experts.cu).
pub const TILE_ROWS: usize = 64;
pub const TILE_COLS: usize = 64;
/// Threads per GEMM block (4 warps) and per combine block.
const THREADS: usize = 128;

/// The storage types the MMA takes, or why not.
pub fn check_storage(dtype: DType) -> Result<()> {
    match dtype {
        DType::F16 | DType::BF16 => Ok(()),
        DType::F32 => Err(KernelError::Unsupported(
            "cuda_grouped stores f16 or bf16 (the MMA's operands); f32 has no tensor-core path"
                .into(),
        )),
    }
}

/// The grouped layout of one routing.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupedPlan {
    /// Token of each padded row, experts in order, each expert's kept tokens in token order
    /// then −1 up to a whole tile.
    pub rows: Vec<i32>,
    /// Expert of each tile of `TILE_ROWS` rows.
    pub tile_expert: Vec<i32>,
    /// Token t's kept assignments are entries `token_starts[t]..token_starts[t + 1]` of
    /// `token_rows` (their padded rows) and `token_weights`.
    pub token_starts: Vec<i32>,
    pub token_rows: Vec<i32>,
    pub token_weights: Vec<f32>,
}

impl GroupedPlan {
    /// Tiles of rows (the y extent of the GEMM grids).
    pub fn tiles(&self) -> usize {
        self.tile_expert.len()
    }
}

/// The grouped layout of `routing`'s kept assignments.
pub fn plan_grouped(cfg: &MoeConfig, routing: &Routing) -> Result<GroupedPlan> {
    cfg.validate()?;
    routing.check(cfg)?;
    let mut per_expert: Vec<Vec<usize>> = vec![vec![]; cfg.experts];
    for (i, a) in routing.assignments.iter().enumerate() {
        if a.kept {
            per_expert[a.expert].push(i);
        }
    }
    let mut rows = vec![];
    let mut tile_expert = vec![];
    let mut row_of = vec![-1i32; routing.assignments.len()];
    for (e, list) in per_expert.iter().enumerate() {
        for &i in list {
            row_of[i] = int_arg("padded row", rows.len())?;
            rows.push(int_arg("token", routing.assignments[i].token)?);
        }
        let tiles = list.len().div_ceil(TILE_ROWS);
        rows.resize(rows.len() + tiles * TILE_ROWS - list.len(), -1);
        tile_expert.extend(std::iter::repeat_n(int_arg("expert", e)?, tiles));
    }
    let mut token_starts = vec![0i32];
    let (mut token_rows, mut token_weights) = (vec![], vec![]);
    for t in 0..cfg.tokens {
        let first = routing.starts[t];
        for (j, a) in routing.of_token(t).iter().enumerate() {
            if a.kept {
                token_rows.push(row_of[first + j]);
                token_weights.push(a.weight as f32);
            }
        }
        token_starts.push(int_arg("assignments", token_rows.len())?);
    }
    Ok(GroupedPlan {
        rows,
        tile_expert,
        token_starts,
        token_rows,
        token_weights,
    })
}

/// The three launches: gate+up over d_ff columns, down over d_model columns (None when no
/// assignment was kept), combine over tokens.
pub fn plan_launches(cfg: &MoeConfig, plan: &GroupedPlan) -> Result<[Option<Launch>; 3]> {
    let gemm = |cols: usize| -> Result<Option<Launch>> {
        if plan.tiles() == 0 {
            return Ok(None);
        }
        Launch::new((cols.div_ceil(TILE_COLS), plan.tiles(), 1), THREADS, 0).map(Some)
    };
    Ok([
        gemm(cfg.d_ff)?,
        gemm(cfg.d_model)?,
        Some(Launch::new((cfg.tokens, 1, 1), THREADS, 0)?),
    ])
}

/// Expert weights on the device in the storage type: W_gate and W_up as [E, d_ff, d_model],
/// W_down as [E, d_model, d_ff] (each expert's matrix transposed).
pub struct DeviceExperts {
    rt: Arc<CudaRuntime>,
    dtype: DType,
    /// The layer the weights were uploaded for (its sizes are what a batch must match).
    layer: MoeConfig,
    w_gate: DeviceBuffer,
    w_up: DeviceBuffer,
    w_down: DeviceBuffer,
}

/// Each of `experts` row-major `rows × cols` matrices transposed.
fn transpose_each(w: &[f32], experts: usize, rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; w.len()];
    for e in 0..experts {
        let (src, dst) = (&w[e * rows * cols..], &mut out[e * rows * cols..]);
        for r in 0..rows {
            for c in 0..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
    out
}

impl DeviceExperts {
    /// Rounds `w`'s expert weights to `dtype` and uploads them, transposed.
    pub fn upload(cfg: &MoeConfig, w: &MoeWeights, dtype: DType) -> Result<DeviceExperts> {
        check_storage(dtype)?;
        cfg.validate()?;
        w.check(cfg)?;
        let rt = CudaRuntime::current()?;
        let (d, f, e) = (cfg.d_model, cfg.d_ff, cfg.experts);
        let up = |m: &[f32], rows, cols| {
            DeviceBuffer::upload(
                &rt,
                &Buffer::from_f32(dtype, &transpose_each(m, e, rows, cols)),
            )
        };
        Ok(DeviceExperts {
            w_gate: up(&w.w_gate, d, f)?,
            w_up: up(&w.w_up, d, f)?,
            w_down: up(&w.w_down, f, d)?,
            rt: rt.clone(),
            dtype,
            layer: *cfg,
        })
    }

    /// Uploads `x` (rounded to the storage type) and the grouped layout of `routing` (made
    /// under `cfg`: any convention of the layer the weights were uploaded for); the output
    /// starts NaN-poisoned.
    pub fn batch(&self, cfg: &MoeConfig, x: &[f32], routing: &Routing) -> Result<DeviceBatch<'_>> {
        let l = &self.layer;
        if (cfg.d_model, cfg.d_ff, cfg.experts) != (l.d_model, l.d_ff, l.experts) {
            return Err(KernelError::InvalidShape(format!(
                "a batch of {} for experts uploaded as {}",
                cfg.label(),
                l.label()
            )));
        }
        if x.len() != cfg.tokens * cfg.d_model {
            return Err(KernelError::BadBuffer(format!(
                "x has {} values, want tokens × d_model = {}",
                x.len(),
                cfg.tokens * cfg.d_model
            )));
        }
        let plan = plan_grouped(cfg, routing)?;
        let launches = plan_launches(cfg, &plan)?;
        let rt = &self.rt;
        let ints = |v: &[i32]| rt.upload(&i32_bytes(if v.is_empty() { &[0][..] } else { v }));
        let suffix = dtype_suffix(self.dtype);
        let padded = plan.rows.len();
        Ok(DeviceBatch {
            d_model: int_arg("d_model", cfg.d_model)?,
            d_ff: int_arg("d_ff", cfg.d_ff)?,
            functions: [
                rt.function(&SOURCE, &format!("moe_up_{suffix}"))?,
                rt.function(&SOURCE, &format!("moe_down_{suffix}"))?,
                rt.function(&SOURCE, &format!("moe_combine_rows_{suffix}"))?,
            ],
            x: DeviceBuffer::upload(rt, &Buffer::from_f32(self.dtype, x))?,
            rows: ints(&plan.rows)?,
            tile_expert: ints(&plan.tile_expert)?,
            token_starts: ints(&plan.token_starts)?,
            token_rows: ints(&plan.token_rows)?,
            token_weights: rt.upload(&f32_bytes(&plan.token_weights))?,
            h: DeviceBuffer::poisoned(rt, self.dtype, (padded * cfg.d_ff).max(1))?,
            y: rt.upload(&f32_bytes(&vec![f32::NAN; (padded * cfg.d_model).max(1)]))?,
            out: DeviceBuffer::poisoned(rt, self.dtype, cfg.tokens * cfg.d_model)?,
            launches,
            experts: self,
        })
    }
}

/// One routed batch resident on the device, ready to launch.
pub struct DeviceBatch<'a> {
    experts: &'a DeviceExperts,
    d_model: i32,
    d_ff: i32,
    functions: [CudaFunction; 3],
    launches: [Option<Launch>; 3],
    x: DeviceBuffer,
    rows: CudaSlice<u8>,
    tile_expert: CudaSlice<u8>,
    token_starts: CudaSlice<u8>,
    token_rows: CudaSlice<u8>,
    token_weights: CudaSlice<u8>,
    h: DeviceBuffer,
    y: CudaSlice<u8>,
    out: DeviceBuffer,
}

impl DeviceBatch<'_> {
    /// Queues the three launches.
    pub fn launch(&mut self) -> Result<()> {
        let ex = self.experts;
        let rt = &ex.rt;
        let (dm, ff) = (self.d_model, self.d_ff);
        let [up, down, combine] = &self.functions;
        if let Some(l) = self.launches[0] {
            cuda_launch!(
                rt,
                up,
                l,
                &self.x.bytes,
                &ex.w_gate.bytes,
                &ex.w_up.bytes,
                &self.rows,
                &self.tile_expert,
                &mut self.h.bytes,
                &dm,
                &ff
            )?;
        }
        if let Some(l) = self.launches[1] {
            cuda_launch!(
                rt,
                down,
                l,
                &self.h.bytes,
                &ex.w_down.bytes,
                &self.tile_expert,
                &mut self.y,
                &dm,
                &ff
            )?;
        }
        let l = self.launches[2].expect("the combine always launches");
        cuda_launch!(
            rt,
            combine,
            l,
            &self.y,
            &self.token_starts,
            &self.token_rows,
            &self.token_weights,
            &mut self.out.bytes,
            &dm
        )
    }

    /// Runs once; the output `[tokens, d_model]` in the storage type.
    pub fn run(&mut self) -> Result<Buffer> {
        self.launch()?;
        self.experts.rt.sync()?;
        self.out.download(&self.experts.rt)
    }

    /// Event-timed repetitions of the three launches.
    pub fn time(&mut self, reps: usize) -> Result<Vec<f64>> {
        let rt = self.experts.rt.clone();
        rt.time(reps, || self.launch())
    }
}

/// The expert side on the device: `routing`'s kept assignments through `w`'s experts, x and
/// the weights rounded to `dtype`; the output as f32 values of `dtype`.
pub fn experts_cuda(
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    routing: &Routing,
    dtype: DType,
) -> Result<Vec<f32>> {
    let experts = DeviceExperts::upload(cfg, w, dtype)?;
    let out = experts.batch(cfg, x, routing)?.run()?;
    Ok(out.to_f32())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Capacity, Priority, WeightNorm};
    use crate::routing::select;

    #[test]
    fn the_grouped_layout_pads_each_expert_to_whole_tiles() {
        // 70 tokens, 3 experts, top-1, dropless; expert 0 takes 66 tokens, expert 2 four.
        let cfg = MoeConfig::token_choice(
            70,
            8,
            8,
            3,
            1,
            Priority::TokenOrder,
            WeightNorm::Raw,
            Capacity::Dropless,
        );
        let probs: Vec<f64> = (0..70)
            .flat_map(|t| {
                if t < 66 {
                    [0.8, 0.1, 0.1]
                } else {
                    [0.1, 0.2, 0.7]
                }
            })
            .collect();
        let plan = plan_grouped(&cfg, &select(&cfg, probs)).unwrap();
        assert_eq!(plan.tile_expert, vec![0, 0, 2]);
        assert_eq!(plan.rows.len(), 3 * TILE_ROWS);
        assert_eq!(&plan.rows[..3], &[0, 1, 2]);
        assert_eq!(plan.rows[65], 65);
        assert!(plan.rows[66..128].iter().all(|&r| r == -1));
        assert_eq!(&plan.rows[128..132], &[66, 67, 68, 69]);
        assert!(plan.rows[132..].iter().all(|&r| r == -1));
        // Token 67's one kept assignment sits in padded row 129, weight 0.7.
        assert_eq!(plan.token_starts[67..69], [67, 68]);
        assert_eq!(plan.token_rows[67], 129);
        assert!((plan.token_weights[67] - 0.7).abs() < 1e-7);
        let [up, down, combine] = plan_launches(&cfg, &plan).unwrap();
        assert_eq!(up.unwrap().grid, (1, 3, 1));
        assert_eq!(down.unwrap().grid, (1, 3, 1));
        assert_eq!(combine.unwrap().grid, (70, 1, 1));
        assert!(check_storage(DType::F32).is_err());
    }

    #[test]
    fn transposes_each_expert() {
        // Two experts of 2 × 3.
        let w: Vec<f32> = (0..12).map(|v| v as f32).collect();
        assert_eq!(
            transpose_each(&w, 2, 2, 3),
            vec![0., 3., 1., 4., 2., 5., 6., 9., 7., 10., 8., 11.]
        );
    }
}
