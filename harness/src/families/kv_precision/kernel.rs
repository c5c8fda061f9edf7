//! The decode part of a kv_precision point: one decode shape (batch, heads, head dim,
//! context), block size and ISA tier; the same seeded Gaussian K/V written into a cache of
//! every format of the grid (a progressive one ageing the blocks past its window), paged
//! decode of one new token per sequence over it (split-KV on, as the model runs it) checked
//! against the f64 reference of the cache as stored on the first and last sequence, then
//! timed with caches flushed: GB/s of what one call reads — the K/V as stored, codes and
//! scales — against the run's read bandwidth, and the speed-up over the f32 cache.

use super::cols::{storage_columns, KvPrecisionCols, KvPrecisionRow};
use super::quality::scheme;
use crate::error::{HarnessError, Result};
use crate::measure::{time_reps, CacheFlusher};
use crate::row::Head;
use indicatif::ProgressBar;
use kernel_common::inputs::{derive_seed, normal_f32, rng};
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_cpu::Isa;
use kernel_paged::reference::cache_reference;
use kernel_paged::{
    paged_decode_cache, KvCache, KvCacheFormat, PagedBatch, PagedDecodeShape, PoolLayout, SplitKv,
};
use rand::seq::SliceRandom;

/// A decode shape of the grid: `b8:h32/8:d128:ctx4096`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub context: usize,
}

impl DecodeShape {
    /// Parses `bB:hQ/K:dD:ctxN`; every count positive, K dividing Q.
    pub fn parse(text: &str) -> Result<DecodeShape> {
        let bad = || {
            HarnessError::Usage(format!(
                "decode shape '{text}' is not bB:hQ/K:dD:ctxN (e.g. b8:h32/8:d128:ctx4096) with K dividing Q"
            ))
        };
        let parts: Vec<&str> = text.split(':').collect();
        let [b, h, d, c] = parts[..] else {
            return Err(bad());
        };
        let num = |s: Option<&str>| -> Result<usize> {
            s.and_then(|s| s.parse::<usize>().ok())
                .filter(|&n| n > 0)
                .ok_or_else(bad)
        };
        let (q, k) = h
            .strip_prefix('h')
            .and_then(|h| h.split_once('/'))
            .ok_or_else(bad)?;
        let shape = DecodeShape {
            batch: num(b.strip_prefix('b'))?,
            q_heads: num(Some(q))?,
            kv_heads: num(Some(k))?,
            head_dim: num(d.strip_prefix('d'))?,
            context: num(c.strip_prefix("ctx"))?,
        };
        if !shape.q_heads.is_multiple_of(shape.kv_heads) {
            return Err(bad());
        }
        Ok(shape)
    }

    pub fn label(&self) -> String {
        format!(
            "b{}:h{}/{}:d{}:ctx{}",
            self.batch, self.q_heads, self.kv_heads, self.head_dim, self.context
        )
    }
}

/// What one decode point measures.
pub struct DecodePoint<'a> {
    pub shape: DecodeShape,
    pub block_size: usize,
    pub isa: Isa,
    pub formats: &'a [KvCacheFormat],
    pub seed: u64,
    pub reps: usize,
    pub budget_s: f64,
    /// The run's read bandwidth, GB/s.
    pub read_gbps: f64,
}

/// The rows of the point, one per format (`formats` starts with f32).
pub fn rows(
    p: &DecodePoint,
    head: &dyn Fn(&str) -> Head,
    flusher: &mut CacheFlusher,
    bar: &ProgressBar,
) -> Result<Vec<KvPrecisionRow>> {
    let s = p.shape;
    let per_seq = s.context.div_ceil(p.block_size);
    let layout = PoolLayout {
        num_blocks: s.batch * per_seq + 1,
        block_size: p.block_size,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
    };
    let mut r = rng(p.seed);
    let mut ids: Vec<u32> = (0..layout.num_blocks as u32).collect();
    ids.shuffle(&mut r);
    let batch = PagedBatch {
        context_lens: vec![s.context; s.batch],
        block_tables: ids[..s.batch * per_seq]
            .chunks(per_seq)
            .map(<[u32]>::to_vec)
            .collect(),
    };
    let token = s.kv_heads * s.head_dim;
    let values: Vec<(Vec<f32>, Vec<f32>)> = (0..s.batch)
        .map(|b| {
            let mut r = rng(derive_seed(p.seed, 1 + b as u64));
            let k = normal_f32(&mut r, s.context * token, 1.0);
            (k, normal_f32(&mut r, s.context * token, 1.0))
        })
        .collect();
    let dshape = PagedDecodeShape {
        q_heads: s.q_heads,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
        q_len: 1,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        window: None,
        softcap: None,
    };
    let q = normal_f32(&mut r, dshape.q_elems(s.batch), 1.0);
    let positions: Vec<usize> = (0..s.context).collect();
    let f32_bytes =
        KvCacheFormat::default().bytes_per_token(s.context, s.kv_heads, s.head_dim, p.block_size);
    let mut rows: Vec<KvPrecisionRow> = vec![];
    for &f in p.formats {
        bar.set_message(format!("decode {} {f} ({})", s.label(), p.isa));
        let mut cache = KvCache::new(layout, f)?;
        for ((k, v), table) in values.iter().zip(&batch.block_tables) {
            cache.write(table, &positions, k, v)?;
        }
        let mut out = vec![f32::NAN; q.len()];
        let run = |out: &mut [f32]| {
            kernel_cpu::isa::with_isa(p.isa, || {
                paged_decode_cache(&dshape, &batch, &cache, &q, out, SplitKv::Auto)
            })
            .map_err(|e| HarnessError::Usage(e.to_string()))?
            .map_err(HarnessError::from)
        };
        run(&mut out)?;
        let check = check(&dshape, &batch, &cache, &q, &out)?;
        let store = storage(&cache, &batch.block_tables[0], &values[0], s)?;
        let t = time_reps(p.reps, p.budget_s, flusher, || {
            run(&mut out).map_err(|e| kernel_common::KernelError::Unsupported(e.to_string()))
        })?;
        let bytes = (4 * (2 * q.len() + s.batch * per_seq)
            + batch
                .block_tables
                .iter()
                .map(|t| cache.bytes_read(t, s.context))
                .sum::<usize>()) as f64;
        let med = t.median();
        let ok = check.passes(&tolerance(DType::F32));
        let mut h = head(&f.to_string());
        h.set_timing(&t);
        h.status = if ok { "ok" } else { "fail" }.into();
        let (rel, max, snr) = storage_columns(&store);
        let bpt = f.bytes_per_token(s.context, s.kv_heads, s.head_dim, p.block_size);
        rows.push(KvPrecisionRow {
            head: h,
            cols: KvPrecisionCols {
                part: "decode".into(),
                kv_cache: f.to_string(),
                scheme: scheme(&f).into(),
                kv_bytes_per_token: bpt,
                bytes_vs_f32: bpt / f32_bytes,
                store_rel_l2: Some(rel),
                store_max_abs: Some(max),
                store_snr_db: Some(snr),
                shape: s.label(),
                batch: Some(s.batch),
                q_heads: Some(s.q_heads),
                kv_heads: Some(s.kv_heads),
                head_dim: Some(s.head_dim),
                context: Some(s.context),
                block_size: Some(p.block_size),
                isa: p.isa.name().into(),
                bytes: Some(bytes),
                gbps: Some(bytes / med / 1e9),
                pct_read_bw: Some(100.0 * bytes / med / 1e9 / p.read_gbps),
                rel_l2_err: Some(check.rel_l2),
                max_abs_err: Some(check.max_abs),
                ..KvPrecisionCols::default()
            },
            note: String::new(),
        });
        bar.inc(1);
    }
    let base = rows
        .iter()
        .find(|r| r.kv_cache == KvCacheFormat::default().to_string())
        .and_then(|r| r.head.median_ms);
    for r in &mut rows {
        r.cols.speedup_vs_f32 = base.zip(r.head.median_ms).map(|(b, m)| b / m);
    }
    Ok(rows)
}

/// The output of the first and last sequence against the f64 reference of the cache as
/// stored.
fn check(
    shape: &PagedDecodeShape,
    batch: &PagedBatch,
    cache: &KvCache,
    q: &[f32],
    out: &[f32],
) -> Result<ErrorStats> {
    let per = shape.q_elems(1);
    let (mut got, mut want) = (vec![], vec![]);
    let mut seqs = vec![0, batch.len() - 1];
    seqs.dedup();
    for s in seqs {
        let one = PagedBatch {
            context_lens: vec![batch.context_lens[s]],
            block_tables: vec![batch.block_tables[s].clone()],
        };
        want.extend(cache_reference(
            shape,
            &one,
            cache,
            &q[s * per..(s + 1) * per],
        )?);
        got.extend_from_slice(&out[s * per..(s + 1) * per]);
    }
    Ok(ErrorStats::compare(&got, &want))
}

/// The stored K/V of one sequence against the f32 values written (token-major).
fn storage(
    cache: &KvCache,
    table: &[u32],
    (k, v): &(Vec<f32>, Vec<f32>),
    s: DecodeShape,
) -> Result<ErrorStats> {
    let (gk, gv) = cache.gather(table, s.context)?;
    let d = s.head_dim;
    let mut exact = Vec::with_capacity(gk.len() * 2);
    for w in [k, v] {
        for h in 0..s.kv_heads {
            for t in 0..s.context {
                let at = (t * s.kv_heads + h) * d;
                exact.extend(w[at..at + d].iter().map(|&x| x as f64));
            }
        }
    }
    let stored: Vec<f32> = gk.into_iter().chain(gv).collect();
    Ok(ErrorStats::compare(&stored, &exact))
}
