//! `cuda_grouped`: the expert FFN of any routing (token or expert choice, every policy and
//! weight rule) as grouped tensor-core GEMMs from `experts.cu` — f16 or bf16 storage, f32
//! accumulation on m16n8k16 MMAs, one launch per stage for all experts (gate+up with SiLU,
//! down, combine). The host plans the grouped layout (`plan_grouped`: kept assignments
//! sorted by expert, each expert's rows padded to whole tiles, the tile → expert table, the
//! per-token rows and weights of the combine); `DeviceExperts` holds the weights transposed
//! per expert so both MMA operands run along the reduction. Every index the kernels follow —
//! rows' tokens, tiles' experts, the combine's token starts and rows — and every `int` size is
//! checked on the host (`check_plan`, `check_batch`, `layer_args`) before the device is used.

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

/// Checks what the kernels index with in `plan`, made for `cfg`'s batch: whole tiles of
/// rows, each row a token in 0..tokens or −1 (padding), each tile's expert in 0..experts,
/// tokens + 1 ascending token starts from 0 to the number of combine rows, one weight per
/// combine row, and each combine row a padded row that holds its token. `plan_grouped`
/// builds plans that pass; the kernels read x, the weights, h and y at these indices unchecked.
pub fn check_plan(cfg: &MoeConfig, plan: &GroupedPlan) -> Result<()> {
    let bad = |m: String| Err(KernelError::BadBuffer(m));
    if plan.rows.len() != plan.tiles() * TILE_ROWS {
        return bad(format!(
            "grouped plan: {} rows for {} tiles of {TILE_ROWS}",
            plan.rows.len(),
            plan.tiles()
        ));
    }
    if let Some((r, t)) = plan
        .rows
        .iter()
        .enumerate()
        .find(|(_, &t)| t < -1 || (t >= 0 && t as usize >= cfg.tokens))
    {
        return bad(format!(
            "grouped plan: row {r} holds token {t}, neither -1 (padding) nor in 0..{}",
            cfg.tokens
        ));
    }
    if let Some((i, e)) = plan
        .tile_expert
        .iter()
        .enumerate()
        .find(|(_, &e)| e < 0 || e as usize >= cfg.experts)
    {
        return bad(format!(
            "grouped plan: tile {i} names expert {e}, outside 0..{}",
            cfg.experts
        ));
    }
    let starts = &plan.token_starts;
    if starts.len() != cfg.tokens + 1
        || starts[0] != 0
        || starts.windows(2).any(|w| w[0] > w[1])
        || starts[cfg.tokens] as usize != plan.token_rows.len()
        || plan.token_weights.len() != plan.token_rows.len()
    {
        return bad(format!(
            "grouped plan: {} token starts (want tokens + 1 = {}, ascending from 0 to the {} \
             combine rows) and {} weights",
            starts.len(),
            cfg.tokens + 1,
            plan.token_rows.len(),
            plan.token_weights.len()
        ));
    }
    for t in 0..cfg.tokens {
        for i in starts[t] as usize..starts[t + 1] as usize {
            let r = plan.token_rows[i];
            if r < 0 || r as usize >= plan.rows.len() || plan.rows[r as usize] != t as i32 {
                return bad(format!(
                    "grouped plan: token {t}'s combine row {i} is padded row {r}, which does \
                     not hold it ({} rows)",
                    plan.rows.len()
                ));
            }
        }
    }
    Ok(())
}

/// d_model and d_ff as the kernels' `int` arguments, each with the 64-column tile the kernels
/// add to a column (`n0 + r`, `k0 + col`) still inside an `int`.
pub fn layer_args(cfg: &MoeConfig) -> Result<(i32, i32)> {
    let arg = |name: &str, n: usize| {
        int_arg(
            &format!("{name} + a {TILE_COLS}-column tile"),
            n + TILE_COLS,
        )?;
        int_arg(name, n)
    };
    Ok((arg("d_model", cfg.d_model)?, arg("d_ff", cfg.d_ff)?))
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
        layer_args(cfg)?;
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
    /// under `cfg`: any convention of the layer the weights were uploaded for; checked by
    /// `check_batch` first); the output starts NaN-poisoned.
    pub fn batch(&self, cfg: &MoeConfig, x: &[f32], routing: &Routing) -> Result<DeviceBatch<'_>> {
        let BatchPlan {
            plan,
            launches,
            d_model,
            d_ff,
        } = check_batch(&self.layer, cfg, x, routing)?;
        let rt = &self.rt;
        let ints = |v: &[i32]| rt.upload(&i32_bytes(if v.is_empty() { &[0][..] } else { v }));
        let suffix = dtype_suffix(self.dtype);
        let padded = plan.rows.len();
        Ok(DeviceBatch {
            d_model,
            d_ff,
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

/// What a batch launches with, checked on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchPlan {
    pub plan: GroupedPlan,
    pub launches: [Option<Launch>; 3],
    pub d_model: i32,
    pub d_ff: i32,
}

/// Checks a batch before anything touches the device: `cfg` has the sizes of `layer` (the
/// weights on the device), x is `[tokens, d_model]`, `routing` describes `cfg`'s batch
/// (`plan_grouped` → `Routing::check`), its grouped plan passes `check_plan`, the grids fit
/// and d_model, d_ff are `int`s (`layer_args`).
pub fn check_batch(
    layer: &MoeConfig,
    cfg: &MoeConfig,
    x: &[f32],
    routing: &Routing,
) -> Result<BatchPlan> {
    let l = layer;
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
    let (d_model, d_ff) = layer_args(cfg)?;
    let plan = plan_grouped(cfg, routing)?;
    check_plan(cfg, &plan)?;
    let launches = plan_launches(cfg, &plan)?;
    Ok(BatchPlan {
        plan,
        launches,
        d_model,
        d_ff,
    })
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

    #[test]
    fn bad_plans_and_batches_are_refused_before_any_launch() {
        // 3 tokens, top-1 of 2 experts, dropless: tokens 0 and 2 to expert 1, token 1 to 0.
        let cfg = MoeConfig::token_choice(
            3,
            8,
            16,
            2,
            1,
            Priority::TokenOrder,
            WeightNorm::Raw,
            Capacity::Dropless,
        );
        let routing = select(&cfg, vec![0.3, 0.7, 0.6, 0.4, 0.2, 0.8]);
        let x = vec![0.5f32; 3 * 8];
        let b = check_batch(&cfg, &cfg, &x, &routing).unwrap();
        let plan = b.plan.clone();
        assert_eq!((b.d_model, b.d_ff), (8, 16));
        assert_eq!(plan.tile_expert, vec![0, 1]);
        assert_eq!(&plan.rows[..1], &[1]);
        assert_eq!(&plan.rows[64..66], &[0, 2]);
        assert_eq!(plan.token_rows, vec![64, 0, 65]);
        check_plan(&cfg, &plan).unwrap();
        let refused = |p: &GroupedPlan| {
            let e = check_plan(&cfg, p).unwrap_err();
            assert!(matches!(e, KernelError::BadBuffer(_)), "{e}");
            e.to_string()
        };
        let with = |f: &dyn Fn(&mut GroupedPlan)| {
            let mut p = plan.clone();
            f(&mut p);
            p
        };
        let e = refused(&with(&|p| p.rows[5] = 3));
        assert!(e.contains("row 5 holds token 3"), "{e}");
        let e = refused(&with(&|p| p.rows[5] = -2));
        assert!(e.contains("row 5 holds token -2"), "{e}");
        let e = refused(&with(&|p| {
            p.rows.pop();
        }));
        assert!(e.contains("127 rows for 2 tiles"), "{e}");
        let e = refused(&with(&|p| p.tile_expert[1] = 2));
        assert!(e.contains("tile 1 names expert 2"), "{e}");
        let e = refused(&with(&|p| p.tile_expert[0] = -1));
        assert!(e.contains("tile 0 names expert -1"), "{e}");
        let e = refused(&with(&|p| p.token_starts[3] = 4));
        assert!(e.contains("token starts"), "{e}");
        let e = refused(&with(&|p| p.token_starts = vec![0, 2, 1, 3]));
        assert!(e.contains("ascending"), "{e}");
        let e = refused(&with(&|p| p.token_weights.push(1.0)));
        assert!(e.contains("and 4 weights"), "{e}");
        let e = refused(&with(&|p| p.token_rows[2] = 128));
        assert!(
            e.contains("token 2's combine row 2 is padded row 128"),
            "{e}"
        );
        let e = refused(&with(&|p| p.token_rows[2] = 66));
        assert!(e.contains("padded row 66, which does not hold it"), "{e}");
        // Batches: the layer's sizes, x's length, a routing of another batch or out of range.
        let other = MoeConfig { d_ff: 32, ..cfg };
        let e = check_batch(&other, &cfg, &x, &routing).unwrap_err();
        assert!(e.to_string().contains("for experts uploaded as"), "{e}");
        let e = check_batch(&cfg, &cfg, &x[1..], &routing).unwrap_err();
        assert!(e.to_string().contains("x has 23 values"), "{e}");
        let mut wrong = routing.clone();
        wrong.assignments[1].expert = 2;
        let e = check_batch(&cfg, &cfg, &x, &wrong).unwrap_err();
        assert!(e.to_string().contains("of 2 experts"), "{e}");
        let mut wrong = routing.clone();
        wrong.starts[1] = 2;
        let e = check_batch(&cfg, &cfg, &x, &wrong).unwrap_err();
        assert!(e.to_string().contains("filed under token 0"), "{e}");
        // Sizes past the kernels' ints, refused by the upload before it asks for a device.
        let wide = MoeConfig {
            d_model: i32::MAX as usize - 10,
            ..cfg
        };
        let e = layer_args(&wide).unwrap_err();
        assert!(e.to_string().contains("d_model + a 64-column tile"), "{e}");
        let none = MoeWeights {
            router: vec![],
            bias: vec![],
            w_gate: vec![],
            w_up: vec![],
            w_down: vec![],
        };
        let Err(e) = DeviceExperts::upload(&wide, &none, DType::F16) else {
            panic!("accepted")
        };
        assert!(e.to_string().contains("d_model + a 64-column tile"), "{e}");
        let Err(e) = DeviceExperts::upload(&cfg, &none, DType::F16) else {
            panic!("accepted")
        };
        assert!(e.to_string().contains("router W_gate"), "{e}");
    }
}
