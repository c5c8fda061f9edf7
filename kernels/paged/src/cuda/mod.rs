//! CUDA paged attention: decode (one partition per sequence, or split-KV with its
//! log-sum-exp reduction) and append, compiled from `paged.cu` by NVRTC at first use, with the
//! shape's sliding window (partitions over the positions the window reaches) and soft-cap.
//! The launch plan (warps per block, row chunks, partitions, grids, scratch sizes) is pure and
//! unit-tested on the CPU; `paged_decode_cuda`/`paged_append_cuda` run one call on the device
//! and `CudaPaged` (`cuda_paged:bs=..,split=..`) stands beside `paged` in experiments. What the
//! kernels index with — block tables and their entries, context lengths, slots, the pool's
//! buffers, every `int` argument — is checked on the host before the device is asked for
//! (`DeviceDecode::new`, `check_append`), so a bad input is an error, not a stray access.

use crate::adapter::{decode_shape, experiment_pool, paged_cost, require_causal, variant_name};
use crate::decode::{PagedDecodeShape, SplitKv, MAX_Q_LEN};
use crate::pool::{KvPool, PagedBatch, PoolLayout};
use kernel_attention::cuda::{cuda_only, device_options, CUDA_HEAD_DIMS};
use kernel_attention::{AttentionInputs, AttentionKernel, AttentionShape, PreparedAttention};
use kernel_common::error::Result;
use kernel_common::{Buffer, Cost, DType, Device, KernelError};
use kernel_cuda::buffer::{buffer_bytes, buffer_from_bytes, i32_bytes};
use kernel_cuda::cuda_launch;
use kernel_cuda::cudarc::driver::{CudaFunction, CudaSlice};
use kernel_cuda::{dtype_suffix, int_arg, CudaRuntime, DeviceBuffer, KernelSource, Launch};
use std::sync::Arc;

/// `paged.cu` with its entry points.
pub const SOURCE: KernelSource = kernel_cuda::cuda_source!(
    "paged",
    "paged.cu",
    &[
        "paged_decode_d64_f32",
        "paged_decode_d128_f32",
        "paged_decode_k2_d64_f32",
        "paged_decode_k2_d128_f32",
        "paged_decode_pipe_d64_f32",
        "paged_decode_pipe_d128_f32",
        "paged_reduce_f32",
        "paged_append_f32",
        "paged_decode_d64_f16",
        "paged_decode_d128_f16",
        "paged_decode_k2_d64_f16",
        "paged_decode_k2_d128_f16",
        "paged_decode_pipe_d64_f16",
        "paged_decode_pipe_d128_f16",
        "paged_reduce_f16",
        "paged_append_f16",
        "paged_decode_d64_bf16",
        "paged_decode_d128_bf16",
        "paged_decode_k2_d64_bf16",
        "paged_decode_k2_d128_bf16",
        "paged_decode_pipe_d64_bf16",
        "paged_decode_pipe_d128_bf16",
        "paged_reduce_bf16",
        "paged_append_bf16",
    ]
);

/// Query rows per warp (`ROWS_PER_WARP` in paged.cu).
pub const ROWS_PER_WARP: usize = 2;
/// Most warps per decode block (`__launch_bounds__(256)`).
pub const MAX_WARPS: usize = 8;
/// Shortest partition the automatic split makes.
pub const AUTO_MIN_PARTITION: usize = 256;
/// Blocks per multiprocessor the plans assume before the device is asked (its occupancy
/// calculator then gives the kernel's own number: `DeviceDecode::new`). A decode block is 1–8
/// warps with ~2 KiB of K/V loads in flight per warp; an H200 SM needs ~20–30 KiB in flight
/// to stream at full bandwidth (4.3 TB/s / 132 SMs × ~0.7 µs latency).
pub const AUTO_BLOCKS_PER_SM: usize = 8;

/// The resident blocks the plans assume for an H200 before the device is asked: 132 SMs ×
/// `AUTO_BLOCKS_PER_SM`.
pub const NOMINAL_RESIDENT_BLOCKS: usize = 132 * AUTO_BLOCKS_PER_SM;

/// How the decode kernel walks a partition's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLoop {
    /// `paged_decode_*` (`unroll=1`) and `paged_decode_k2_*` (`unroll=2`): each step reads its
    /// keys' page-table entries, then loads the keys, then computes: two memory latencies per
    /// step, exposed.
    Plain(usize),
    /// `paged_decode_pipe_*` (`pipe=1`): the loop software-pipelined — each step issues the
    /// next step's K/V loads and the page-table reads of the step after before computing its
    /// own keys, and rescales the online softmax once per step.
    Pipelined,
}

impl KeyLoop {
    /// The variant's parameter as `cuda_paged:...` writes it (empty for the default).
    pub fn param(self) -> String {
        match self {
            KeyLoop::Plain(1) => String::new(),
            KeyLoop::Plain(n) => format!(",unroll={n}"),
            KeyLoop::Pipelined => ",pipe=1".into(),
        }
    }

    fn entry_prefix(self) -> &'static str {
        match self {
            KeyLoop::Plain(2) => "k2_",
            KeyLoop::Plain(_) => "",
            KeyLoop::Pipelined => "pipe_",
        }
    }
}

/// Everything one decode call launches.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodePlan {
    pub decode_entry: String,
    pub decode: Launch,
    /// The reduction, when some sequence has more than one partition.
    pub reduce: Option<(String, Launch)>,
    pub part_tokens: usize,
    pub parts: usize,
    pub row_chunks: usize,
    /// f32 elements of the partial outputs (0 without a reduction).
    pub partial_elems: usize,
    /// f32 log-sum-exps (0 without a reduction).
    pub lse_elems: usize,
}

/// Tokens per partition on the GPU (of the positions a sequence's rows see, all of them or
/// the window's reach): `Off` = the longest such range, `Tokens(n)` = n, `Auto` = as many
/// partitions as fit one wave of `resident_blocks` (the blocks the device runs at once:
/// multiprocessors × blocks per multiprocessor), none shorter than `AUTO_MIN_PARTITION`
/// tokens. One wave, not more: a grid a few blocks over it runs a second, nearly empty wave
/// (measured on the H200: batch 32 at 16k, 1280 blocks over 1056 slots took 1.43× the time of
/// 1024). One value for the whole batch (the kernel takes one).
pub fn partition_tokens(
    split: SplitKv,
    max_ctx: usize,
    base_blocks: usize,
    resident_blocks: usize,
) -> usize {
    let tokens = match split {
        SplitKv::Off => max_ctx,
        SplitKv::Tokens(n) => n,
        // The CPU's rule: the partition depends on the context alone.
        SplitKv::Context => SplitKv::Context.partition_tokens(max_ctx),
        SplitKv::Auto => {
            let parts = (resident_blocks / base_blocks.max(1)).max(1);
            max_ctx.div_ceil(parts).max(AUTO_MIN_PARTITION)
        }
    };
    tokens.clamp(1, max_ctx.max(1))
}

/// Plans one decode call; `resident_blocks` is how many of its blocks the device runs at once
/// (what the automatic split fills).
pub fn plan_decode(
    shape: &PagedDecodeShape,
    context_lens: &[usize],
    dtype: DType,
    split: SplitKv,
    keys: KeyLoop,
    resident_blocks: usize,
) -> Result<DecodePlan> {
    if let KeyLoop::Plain(unroll @ (0 | 3..)) = keys {
        return Err(KernelError::Unsupported(format!(
            "cuda_paged: unroll (keys per lane group per step) is 1 or 2, not {unroll}"
        )));
    }
    if !CUDA_HEAD_DIMS.contains(&shape.head_dim) {
        return Err(KernelError::Unsupported(format!(
            "cuda_paged is built for head_dim 64 or 128, not {}",
            shape.head_dim
        )));
    }
    if shape.q_len == 0 || shape.q_len > MAX_Q_LEN || context_lens.is_empty() {
        return Err(KernelError::InvalidShape(format!(
            "cuda_paged takes q_len 1..={MAX_Q_LEN} and at least one sequence"
        )));
    }
    let rows = shape.rows();
    let warps = rows.div_ceil(ROWS_PER_WARP).clamp(1, MAX_WARPS);
    let row_chunks = rows.div_ceil(warps * ROWS_PER_WARP);
    let batch = context_lens.len();
    // Partitions cover the positions some row sees (`visible_range`), as on the CPU.
    let max_seen = context_lens
        .iter()
        .map(|&c| shape.visible_range(c).len())
        .max()
        .unwrap_or(1);
    let part_tokens = partition_tokens(
        split,
        max_seen,
        shape.kv_heads * row_chunks * batch,
        resident_blocks,
    );
    let parts = max_seen.div_ceil(part_tokens);
    let dt = dtype_suffix(dtype);
    let decode = Launch::new((shape.kv_heads * row_chunks, batch, parts), warps * 32, 0)?;
    let out_rows = batch * shape.q_heads * shape.q_len;
    let reduce = if parts > 1 {
        Some((
            format!("paged_reduce_{dt}"),
            Launch::new((out_rows, 1, 1), shape.head_dim.next_multiple_of(32), 0)?,
        ))
    } else {
        None
    };
    Ok(DecodePlan {
        decode_entry: format!(
            "paged_decode_{}d{}_{dt}",
            keys.entry_prefix(),
            shape.head_dim
        ),
        decode,
        part_tokens,
        parts,
        row_chunks,
        partial_elems: if parts > 1 {
            parts * out_rows * shape.head_dim
        } else {
            0
        },
        lse_elems: if parts > 1 { parts * out_rows } else { 0 },
        reduce,
    })
}

/// Block tables as one i32 matrix `[batch, max_blocks]` (short rows padded with 0).
pub fn flat_tables(tables: &[Vec<u32>]) -> (Vec<i32>, usize) {
    let width = tables.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut flat = vec![0i32; tables.len() * width];
    for (row, t) in flat.chunks_mut(width).zip(tables) {
        for (dst, &b) in row.iter_mut().zip(t) {
            *dst = b as i32;
        }
    }
    (flat, width)
}

/// The most context positions the decode kernel's `int` arithmetic takes: it adds a
/// partition (up to a whole context) and a step of keys to a position.
pub const MAX_DEVICE_CONTEXT: usize = (i32::MAX as usize - 8) / 2;

/// The decode kernels' `int` arguments that do not depend on the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DecodeArgs {
    batch: i32,
    q_heads: i32,
    kv_heads: i32,
    q_len: i32,
    block_size: i32,
    max_blocks: i32,
    head_dim: i32,
    /// The window (clamped to the longest context; 0 = none).
    window: i32,
}

/// Checks, before anything touches the device, what the decode kernels index with: the
/// shape against the pool and the batch (`PagedDecodeShape::validate`: every block table
/// covers its context with entries inside the pool, contexts ≥ q_len), the pool's K and V
/// against its layout, q's length, and every size and position the kernels hold in an
/// `int` (block ids, table width, context lengths with the kernel's headroom). Returns the
/// kernels' arguments, the flat block tables and the context lengths as the kernel reads them.
fn check_decode(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    pool: &KvPool,
    q: &Buffer,
) -> Result<(DecodeArgs, Vec<i32>, Vec<i32>)> {
    shape.validate(&pool.layout, batch)?;
    let l = pool.layout;
    int_arg("num_blocks (block ids)", l.num_blocks)?;
    let longest = batch.context_lens.iter().copied().max().unwrap_or(0);
    if longest > MAX_DEVICE_CONTEXT {
        return Err(KernelError::Unsupported(format!(
            "cuda_paged: context length {longest} exceeds the kernel's int positions \
             (≤ {MAX_DEVICE_CONTEXT})"
        )));
    }
    pool.validate()?;
    q.expect("q", pool.dtype(), shape.q_elems(batch.len()))?;
    // Entries past a table's coverage (and the padding) are never read; the rest are < num_blocks.
    let (tables, width) = flat_tables(&batch.block_tables);
    let lens = batch
        .context_lens
        .iter()
        .map(|&l| int_arg("context length", l))
        .collect::<Result<_>>()?;
    let args = DecodeArgs {
        batch: int_arg("batch", batch.len())?,
        q_heads: int_arg("q_heads", shape.q_heads)?,
        kv_heads: int_arg("kv_heads", shape.kv_heads)?,
        q_len: int_arg("q_len", shape.q_len)?,
        block_size: int_arg("block_size", l.block_size)?,
        max_blocks: int_arg("block table width", width)?,
        head_dim: int_arg("head_dim", shape.head_dim)?,
        window: device_options(shape.window, shape.softcap, longest.max(1))?.0,
    };
    Ok((args, tables, lens))
}

/// A decode problem resident on the device.
pub struct DeviceDecode {
    rt: Arc<CudaRuntime>,
    plan: DecodePlan,
    decode_fn: CudaFunction,
    reduce_fn: Option<CudaFunction>,
    shape: PagedDecodeShape,
    k: DeviceBuffer,
    v: DeviceBuffer,
    tables: CudaSlice<u8>,
    ctx: CudaSlice<u8>,
    q: DeviceBuffer,
    pub out: DeviceBuffer,
    part_o: CudaSlice<u8>,
    part_lse: CudaSlice<u8>,
    /// The kernels' int arguments, checked before the device was asked for.
    args: DecodeArgs,
    /// The plan's partition length and row chunks as int arguments.
    part_tokens: i32,
    row_chunks: i32,
    softcap: f32,
}

impl DeviceDecode {
    /// Checks the problem on the host (`check_decode`, then the launch plan), uploads the
    /// pool, tables, lengths and queries and allocates a NaN-poisoned output.
    pub fn new(
        shape: &PagedDecodeShape,
        batch: &PagedBatch,
        pool: &KvPool,
        q: &Buffer,
        split: SplitKv,
        keys: KeyLoop,
    ) -> Result<DeviceDecode> {
        let (args, tables, lens) = check_decode(shape, batch, pool, q)?;
        let dtype = pool.dtype();
        // Every check of the plan but the automatic split's partition count holds whatever
        // the device: planned once before the device is asked for, again with its numbers.
        let nominal = plan_decode(
            shape,
            &batch.context_lens,
            dtype,
            split,
            keys,
            NOMINAL_RESIDENT_BLOCKS,
        )?;
        let rt = CudaRuntime::current()?;
        let decode_fn = rt.function(&SOURCE, &nominal.decode_entry)?;
        let per_sm = rt.blocks_per_sm(&decode_fn, nominal.decode.block.0 as usize)?;
        let plan = plan_decode(
            shape,
            &batch.context_lens,
            dtype,
            split,
            keys,
            rt.sm_count * per_sm.max(1),
        )?;
        let reduce_fn = match &plan.reduce {
            Some((entry, _)) => Some(rt.function(&SOURCE, entry)?),
            None => None,
        };
        Ok(DeviceDecode {
            k: DeviceBuffer::upload(&rt, &pool.k)?,
            v: DeviceBuffer::upload(&rt, &pool.v)?,
            tables: rt.upload(&i32_bytes(&tables))?,
            ctx: rt.upload(&i32_bytes(&lens))?,
            q: DeviceBuffer::upload(&rt, q)?,
            out: DeviceBuffer::poisoned(&rt, dtype, shape.q_elems(batch.len()))?,
            part_o: rt.zeros::<u8>(plan.partial_elems * 4)?,
            part_lse: rt.zeros::<u8>(plan.lse_elems * 4)?,
            args,
            part_tokens: int_arg("part_tokens", plan.part_tokens)?,
            row_chunks: int_arg("row_chunks", plan.row_chunks)?,
            softcap: shape.softcap.unwrap_or(0.0),
            shape: *shape,
            plan,
            decode_fn,
            reduce_fn,
            rt,
        })
    }

    /// The plan this problem runs.
    pub fn plan(&self) -> &DecodePlan {
        &self.plan
    }

    /// Queues the decode (and the reduction) on the stream.
    pub fn launch(&mut self) -> Result<()> {
        let a = self.args;
        let (part_tokens, row_chunks) = (self.part_tokens, self.row_chunks);
        let (scale, window) = (self.shape.scale, a.window);
        let rt = &self.rt;
        cuda_launch!(
            rt,
            self.decode_fn,
            self.plan.decode,
            &self.q.bytes,
            &self.k.bytes,
            &self.v.bytes,
            &self.tables,
            &self.ctx,
            &mut self.out.bytes,
            &mut self.part_o,
            &mut self.part_lse,
            &a.batch,
            &a.q_heads,
            &a.kv_heads,
            &a.q_len,
            &a.block_size,
            &a.max_blocks,
            &part_tokens,
            &row_chunks,
            &scale,
            &window,
            &self.softcap
        )?;
        if let (Some(f), Some((_, l))) = (&self.reduce_fn, &self.plan.reduce) {
            cuda_launch!(
                rt,
                f,
                *l,
                &self.part_o,
                &self.part_lse,
                &self.ctx,
                &mut self.out.bytes,
                &a.batch,
                &a.q_heads,
                &a.q_len,
                &a.head_dim,
                &part_tokens,
                &window
            )?;
        }
        Ok(())
    }

    /// Runs once and downloads the output.
    pub fn run(&mut self) -> Result<Buffer> {
        self.launch()?;
        self.rt.sync()?;
        self.out.download(&self.rt)
    }

    /// Event-timed repetitions of `launch`.
    pub fn time(&mut self, reps: usize) -> Result<Vec<f64>> {
        let rt = self.rt.clone();
        rt.time(reps, || self.launch())
    }
}

/// Paged decode on the device: the same contract as `paged_decode`, output downloaded.
pub fn paged_decode_cuda(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    pool: &KvPool,
    q: &Buffer,
    split: SplitKv,
    keys: KeyLoop,
) -> Result<Buffer> {
    DeviceDecode::new(shape, batch, pool, q, split, keys)?.run()
}

/// Pool slots (`block · block_size + offset`) of positions `start..start+n` of a sequence.
pub fn slots(layout: &PoolLayout, table: &[u32], start: usize, n: usize) -> Result<Vec<i32>> {
    layout.validate()?;
    (start..start + n)
        .map(|pos| {
            let block = table.get(pos / layout.block_size).ok_or_else(|| {
                KernelError::BadBuffer(format!("block table too short for position {pos}"))
            })?;
            int_arg(
                "slot",
                *block as usize * layout.block_size + pos % layout.block_size,
            )
        })
        .collect()
}

/// Checks, before anything touches the device, what the append kernel indexes with: the
/// pool against its layout, `k_new`/`v_new` as `[slots, kv_heads, d]` in the pool's dtype,
/// every slot negative (skipped) or inside the pool and none written twice (two blocks would
/// race on it), and the kernel's `int` sizes. Returns its launch and `int` arguments
/// (kv_heads, head_dim, block_size).
pub fn check_append(
    pool: &KvPool,
    slots: &[i32],
    k_new: &Buffer,
    v_new: &Buffer,
) -> Result<(Launch, [i32; 3])> {
    pool.validate()?;
    let l = pool.layout;
    let dtype = pool.dtype();
    let per_token = l.kv_heads * l.head_dim;
    k_new.expect("k_new", dtype, slots.len() * per_token)?;
    v_new.expect("v_new", dtype, slots.len() * per_token)?;
    let capacity = l.num_blocks * l.block_size;
    let mut written = std::collections::HashMap::with_capacity(slots.len());
    for (t, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        if s as usize >= capacity {
            return Err(KernelError::BadBuffer(format!(
                "token {t}: slot {s} is outside a pool of {capacity} slots"
            )));
        }
        if let Some(first) = written.insert(s, t) {
            return Err(KernelError::BadBuffer(format!(
                "slot {s} is written twice (tokens {first} and {t})"
            )));
        }
    }
    int_arg("kv_heads·head_dim", per_token)?;
    let launch = Launch::new((slots.len().max(1), 1, 1), 128, 0)?;
    Ok((
        launch,
        [
            int_arg("kv_heads", l.kv_heads)?,
            int_arg("head_dim", l.head_dim)?,
            int_arg("block_size", l.block_size)?,
        ],
    ))
}

/// Appends tokens on the device: `k_new`/`v_new` are `[tokens, kv_heads, d]` (vLLM's
/// `reshape_and_cache` layout) and `slots[t]` their pool slots (negative: skipped), checked
/// by `check_append` first. Uploads the pool, appends, downloads it back into `pool`.
pub fn paged_append_cuda(
    pool: &mut KvPool,
    slots: &[i32],
    k_new: &Buffer,
    v_new: &Buffer,
) -> Result<()> {
    let (launch, [hkv, d, bs]) = check_append(pool, slots, k_new, v_new)?;
    if slots.is_empty() {
        return Ok(());
    }
    let dtype = pool.dtype();
    let rt = CudaRuntime::current()?;
    let f = rt.function(&SOURCE, &format!("paged_append_{}", dtype_suffix(dtype)))?;
    let mut kp = rt.upload(&buffer_bytes(&pool.k))?;
    let mut vp = rt.upload(&buffer_bytes(&pool.v))?;
    let kn = rt.upload(&buffer_bytes(k_new))?;
    let vn = rt.upload(&buffer_bytes(v_new))?;
    let sl = rt.upload(&i32_bytes(slots))?;
    cuda_launch!(rt, f, launch, &kn, &vn, &sl, &mut kp, &mut vp, &hkv, &d, &bs)?;
    rt.sync()?;
    pool.k = buffer_from_bytes(dtype, &rt.download(&kp)?);
    pool.v = buffer_from_bytes(dtype, &rt.download(&vp)?);
    Ok(())
}

/// `cuda_paged:bs=..,split=..`: the CUDA decode kernel behind `AttentionKernel`, on the
/// same shuffled pool the CPU `paged` variant builds.
#[derive(Debug, Clone, Copy)]
pub struct CudaPaged {
    pub block_size: usize,
    pub split: SplitKv,
    /// The kernel's key loop: `unroll=2` issues twice the loads at once, `pipe=1` the
    /// software-pipelined loop.
    pub keys: KeyLoop,
}

impl AttentionKernel for CudaPaged {
    fn name(&self) -> String {
        format!(
            "{}{}",
            variant_name("cuda_paged", self.block_size, self.split),
            self.keys.param()
        )
    }

    fn supports(&self, shape: &AttentionShape, dtype: DType, device: Device) -> Result<()> {
        cuda_only("cuda_paged", device)?;
        require_causal(shape)?;
        let ds = decode_shape(shape);
        plan_decode(
            &ds,
            &vec![shape.kv_len; shape.batch],
            dtype,
            self.split,
            self.keys,
            NOMINAL_RESIDENT_BLOCKS,
        )
        .map(|_| ())
    }

    fn cost(&self, shape: &AttentionShape, dtype: DType) -> Cost {
        paged_cost(self.block_size, shape, dtype)
    }

    fn prepare<'a>(
        &'a self,
        shape: &AttentionShape,
        inputs: &'a AttentionInputs,
    ) -> Result<Box<dyn PreparedAttention + 'a>> {
        let (pool, batch) = experiment_pool(shape, inputs, self.block_size)?;
        Ok(Box::new(PreparedCudaPaged(DeviceDecode::new(
            &decode_shape(shape),
            &batch,
            &pool,
            &inputs.q,
            self.split,
            self.keys,
        )?)))
    }
}

struct PreparedCudaPaged(DeviceDecode);

impl PreparedAttention for PreparedCudaPaged {
    fn run(&mut self, out: &mut Buffer) -> Result<()> {
        *out = self.0.run()?;
        Ok(())
    }
    fn time_on_device(&mut self, reps: usize) -> Option<Result<Vec<f64>>> {
        Some(self.0.time(reps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(q_heads: usize, kv_heads: usize, q_len: usize) -> PagedDecodeShape {
        PagedDecodeShape {
            q_heads,
            kv_heads,
            head_dim: 128,
            q_len,
            scale: 0.1,
            window: None,
            softcap: None,
        }
    }

    #[test]
    fn unsplit_decode_has_one_partition_and_no_reduction() {
        let p = plan_decode(
            &shape(32, 8, 1),
            &[4096, 100],
            DType::F16,
            SplitKv::Off,
            KeyLoop::Plain(1),
            NOMINAL_RESIDENT_BLOCKS,
        )
        .unwrap();
        assert_eq!(p.decode_entry, "paged_decode_d128_f16");
        // group 4 → 4 rows → 2 warps, one row chunk.
        assert_eq!(p.decode.block, (64, 1, 1));
        assert_eq!(p.decode.grid, (8, 2, 1));
        assert_eq!((p.parts, p.part_tokens), (1, 4096));
        assert!(p.reduce.is_none());
        assert_eq!(p.partial_elems, 0);
    }

    #[test]
    fn large_groups_are_cut_into_row_chunks() {
        // MQA, 32 heads × 4 new tokens = 128 rows: 8 warps × 2 rows = 16 per block → 8 chunks.
        let p = plan_decode(
            &shape(32, 1, 4),
            &[64],
            DType::BF16,
            SplitKv::Off,
            KeyLoop::Plain(1),
            NOMINAL_RESIDENT_BLOCKS,
        )
        .unwrap();
        assert_eq!(p.decode.block.0, 256);
        assert_eq!(p.row_chunks, 8);
        assert_eq!(p.decode.grid.0, 8);
    }

    #[test]
    fn split_partitions_cover_every_context_and_size_the_scratch() {
        let lens = [10_000, 3000, 1];
        let p = plan_decode(
            &shape(8, 8, 1),
            &lens,
            DType::F32,
            SplitKv::Tokens(1024),
            KeyLoop::Plain(2),
            NOMINAL_RESIDENT_BLOCKS,
        )
        .unwrap();
        assert_eq!(p.decode_entry, "paged_decode_k2_d128_f32");
        assert_eq!(p.parts, 10); // ⌈10000 / 1024⌉
        assert_eq!(p.decode.grid, (8, 3, 10));
        assert!(p.parts * p.part_tokens >= 10_000);
        let (entry, reduce) = p.reduce.clone().unwrap();
        assert_eq!(entry, "paged_reduce_f32");
        assert_eq!(reduce.grid.0, 3 * 8);
        assert_eq!(p.partial_elems, 10 * 3 * 8 * 128);
        assert_eq!(p.lse_elems, 10 * 3 * 8);
    }

    #[test]
    fn a_window_partitions_only_what_it_reaches() {
        // 4096-token contexts, window 512: the split cuts 512 positions, not 4096.
        let w = shape(8, 8, 1).with_window(Some(512));
        let p = plan_decode(
            &w,
            &[4096, 4096],
            DType::F16,
            SplitKv::Tokens(128),
            KeyLoop::Plain(1),
            NOMINAL_RESIDENT_BLOCKS,
        )
        .unwrap();
        assert_eq!((p.parts, p.part_tokens), (4, 128));
        let whole = plan_decode(
            &w,
            &[4096, 300],
            DType::F16,
            SplitKv::Off,
            KeyLoop::Plain(1),
            NOMINAL_RESIDENT_BLOCKS,
        )
        .unwrap();
        assert_eq!((whole.parts, whole.part_tokens), (1, 512));
        assert!(whole.reduce.is_none());
        // A window past every context changes nothing.
        let wide = shape(8, 8, 1).with_window(Some(10_000));
        assert_eq!(
            plan_decode(
                &wide,
                &[4096],
                DType::F16,
                SplitKv::Tokens(128),
                KeyLoop::Plain(1),
                NOMINAL_RESIDENT_BLOCKS
            )
            .unwrap(),
            plan_decode(
                &shape(8, 8, 1),
                &[4096],
                DType::F16,
                SplitKv::Tokens(128),
                KeyLoop::Plain(1),
                NOMINAL_RESIDENT_BLOCKS
            )
            .unwrap()
        );
    }

    #[test]
    fn auto_split_fills_one_wave_but_keeps_partitions_long() {
        let wave = NOMINAL_RESIDENT_BLOCKS; // 1056
                                            // 1 sequence × 8 KV heads = 8 blocks unsplit; 132 partitions of 125 would fill the
                                            // wave, raised to the 256-token minimum.
        let t = partition_tokens(SplitKv::Auto, 16_384, 8, wave);
        assert_eq!(t, AUTO_MIN_PARTITION);
        // 8 sequences × 8 KV heads = 64 blocks: 16 partitions of 1024 (1024 blocks, one wave;
        // 17 would make a second wave of 32 blocks).
        assert_eq!(partition_tokens(SplitKv::Auto, 16_384, 64, wave), 1024);
        // 32 sequences: 256 blocks, 4 partitions (1024 blocks), not 5 (1280: two waves).
        assert_eq!(partition_tokens(SplitKv::Auto, 16_384, 256, wave), 4096);
        // Fewer resident blocks (a kernel that fits 5 per SM): 660 → 10 partitions.
        assert_eq!(
            partition_tokens(SplitKv::Auto, 16_384, 64, 132 * 5),
            16_384usize.div_ceil(10)
        );
        // A big batch already fills the device: no split.
        assert_eq!(
            partition_tokens(SplitKv::Auto, 16_384, 8 * 132, wave),
            16_384
        );
        // A short context is not cut below the minimum; one shorter than it stays whole.
        assert_eq!(
            partition_tokens(SplitKv::Auto, 600, 8, wave),
            AUTO_MIN_PARTITION
        );
        assert_eq!(partition_tokens(SplitKv::Auto, 100, 8, wave), 100);
        assert_eq!(
            partition_tokens(SplitKv::Auto, 4000, 8, wave),
            AUTO_MIN_PARTITION
        );
    }

    #[test]
    fn refusals_and_slots() {
        let mut d80 = shape(8, 8, 1);
        d80.head_dim = 80;
        // Head size 80, an unroll of 3, 17 new tokens: each refused.
        for (s, ctx, keys) in [
            (d80, 10, KeyLoop::Plain(1)),
            (shape(8, 8, 1), 10, KeyLoop::Plain(3)),
            (shape(8, 8, 17), 100, KeyLoop::Plain(1)),
        ] {
            let plan = plan_decode(
                &s,
                &[ctx],
                DType::F16,
                SplitKv::Off,
                keys,
                NOMINAL_RESIDENT_BLOCKS,
            );
            assert!(plan.is_err(), "{s:?} {keys:?}");
        }
        let layout = PoolLayout {
            num_blocks: 8,
            block_size: 4,
            kv_heads: 1,
            head_dim: 64,
        };
        assert_eq!(slots(&layout, &[5, 2], 2, 4).unwrap(), vec![22, 23, 8, 9]);
        assert!(slots(&layout, &[5], 2, 4).is_err());
        let (flat, width) = flat_tables(&[vec![3, 1], vec![7]]);
        assert_eq!((flat, width), (vec![3, 1, 7, 0], 2));
    }

    fn pool(num_blocks: usize, block_size: usize) -> KvPool {
        let layout = PoolLayout {
            num_blocks,
            block_size,
            kv_heads: 2,
            head_dim: 64,
        };
        KvPool::poisoned(layout, DType::F32).unwrap()
    }

    /// The error text, and that no device was needed to get it.
    fn refused<T>(r: Result<T>) -> String {
        let Err(e) = r else { panic!("accepted") };
        assert!(!matches!(e, KernelError::Device(_)), "{e}");
        e.to_string()
    }

    #[test]
    fn bad_decode_inputs_are_refused_before_any_launch() {
        // 4 query heads over 2 KV heads of 64, one new token; pool of 4 blocks of 4.
        let s = PagedDecodeShape {
            head_dim: 64,
            ..shape(4, 2, 1)
        };
        let p = pool(4, 4);
        let batch = PagedBatch {
            context_lens: vec![5, 3],
            block_tables: vec![vec![3, 1], vec![0]],
        };
        let q = Buffer::F32(vec![0.0; 2 * 4 * 64]);
        let (a, tables, lens) = check_decode(&s, &batch, &p, &q).unwrap();
        assert_eq!((a.batch, a.max_blocks, a.block_size), (2, 2, 4));
        assert_eq!((tables, lens), (vec![3, 1, 0, 0], vec![5, 3]));
        let decode = |b: &PagedBatch, p: &KvPool, q: &Buffer| {
            refused(paged_decode_cuda(
                &s,
                b,
                p,
                q,
                SplitKv::Off,
                KeyLoop::Plain(1),
            ))
        };
        let with = |lens: Vec<usize>, tables: Vec<Vec<u32>>| PagedBatch {
            context_lens: lens,
            block_tables: tables,
        };
        // Block table entries outside the pool; a context past its table's capacity.
        let e = decode(&with(vec![5, 3], vec![vec![3, 4], vec![0]]), &p, &q);
        assert!(
            e.contains("block table entry 4 out of range (pool has 4 blocks)"),
            "{e}"
        );
        let e = decode(&with(vec![5, 9], vec![vec![3, 1], vec![0, 2]]), &p, &q);
        assert!(e.contains("sequence 1: 9 tokens need 3 blocks"), "{e}");
        let e = decode(&with(vec![5], vec![vec![3, 1], vec![0]]), &p, &q);
        assert!(e.contains("1 context lengths but 2 block tables"), "{e}");
        // The pool's buffers and q against the layout and the shape.
        let short = KvPool {
            k: Buffer::F32(vec![0.0; 10]),
            ..p.clone()
        };
        let e = decode(&batch, &short, &q);
        assert!(e.contains("pool K has 10 elements"), "{e}");
        let mixed = KvPool {
            v: Buffer::poisoned(DType::F16, 4 * 2 * 4 * 64),
            ..p.clone()
        };
        let e = decode(&batch, &mixed, &q);
        assert!(e.contains("pool V is f16"), "{e}");
        let e = decode(&batch, &p, &Buffer::F32(vec![0.0; 64]));
        assert!(e.contains("q has 64 elements"), "{e}");
        // Block ids and context lengths past the kernel's ints.
        let huge = KvPool {
            layout: PoolLayout {
                num_blocks: 1 << 31,
                block_size: 1,
                ..p.layout
            },
            ..p.clone()
        };
        let e = decode(&with(vec![1], vec![vec![0]]), &huge, &q);
        assert!(e.contains("num_blocks (block ids) = 2147483648"), "{e}");
        let long = MAX_DEVICE_CONTEXT + 1;
        let wide = pool(1, 256);
        let e = decode(
            &with(vec![long], vec![vec![0; long.div_ceil(256)]]),
            &wide,
            &q,
        );
        assert!(e.contains(&format!("context length {long}")), "{e}");
        // The plan's refusals come before the device too: an unroll of 3, a grid of 70 000
        // one-token partitions.
        let e = refused(DeviceDecode::new(
            &s,
            &batch,
            &p,
            &q,
            SplitKv::Off,
            KeyLoop::Plain(3),
        ));
        assert!(e.contains("unroll"), "{e}");
        let e = refused(paged_decode_cuda(
            &s,
            &with(vec![70_000], vec![vec![0; 70_000usize.div_ceil(256)]]),
            &wide,
            &Buffer::F32(vec![0.0; 4 * 64]),
            SplitKv::Tokens(1),
            KeyLoop::Plain(1),
        ));
        assert!(e.contains("exceeds the device limits"), "{e}");
    }

    #[test]
    fn bad_append_slots_are_refused_before_any_launch() {
        // 4 blocks of 4 = 16 slots of 2 KV heads × 64.
        let mut p = pool(4, 4);
        let kv = |n: usize| Buffer::F32(vec![0.0; n * 128]);
        let (launch, args) = check_append(&p, &[0, 5, -1, 15], &kv(4), &kv(4)).unwrap();
        assert_eq!((launch.grid.0, args), (4, [2, 64, 4]));
        let append = |p: &mut KvPool, slots: &[i32], k: &Buffer, v: &Buffer| {
            let r = paged_append_cuda(p, slots, k, v);
            let bad = matches!(r, Err(KernelError::BadBuffer(_)));
            let e = refused(r);
            assert!(bad, "{e}");
            e
        };
        let e = append(&mut p, &[0, 16, -1, 15], &kv(4), &kv(4));
        assert!(
            e.contains("token 1: slot 16 is outside a pool of 16 slots"),
            "{e}"
        );
        let e = append(&mut p, &[0, 5, -1, 5], &kv(4), &kv(4));
        assert!(
            e.contains("slot 5 is written twice (tokens 1 and 3)"),
            "{e}"
        );
        let e = append(&mut p, &[0, 5, -1, 15], &kv(3), &kv(4));
        assert!(e.contains("k_new has 384 elements"), "{e}");
        let half = Buffer::poisoned(DType::F16, 4 * 128);
        let e = append(&mut p, &[0, 5, -1, 15], &kv(4), &half);
        assert!(e.contains("v_new is f16"), "{e}");
        let mut short = KvPool {
            v: Buffer::F32(vec![0.0; 7]),
            ..p.clone()
        };
        let e = append(&mut short, &[0], &kv(1), &kv(1));
        assert!(e.contains("pool V has 7 elements"), "{e}");
        let mut no_blocks = KvPool {
            layout: PoolLayout {
                block_size: 0,
                ..p.layout
            },
            ..p.clone()
        };
        let e = refused(paged_append_cuda(&mut no_blocks, &[0], &kv(1), &kv(1)));
        assert!(e.contains("block size 0"), "{e}");
        // Nothing to append and nothing wrong: no device needed.
        paged_append_cuda(&mut p, &[], &kv(0), &kv(0)).unwrap();
        let e = refused(slots(&no_blocks.layout, &[0], 0, 1));
        assert!(e.contains("block size 0"), "{e}");
    }
}
