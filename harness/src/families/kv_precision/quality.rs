//! The quality part of a kv_precision point: one model, text, window setting and prefill
//! chunk, the model run with its KV cache in every format of the grid over the same windows.
//! Window by window the f32 cache's run comes first and its log-probabilities are kept in
//! memory (one window's at a time), then each format's run is scored against them with
//! `quality::run_chunked`: perplexity, KL divergence and top-1 agreement, summed over the
//! windows. The storage error of each format is measured on the model's own K/V: every
//! layer's K/V of the first window under the f32 cache, written into a cache of the format
//! in the same prefill pieces and read back.

use super::cols::{storage_columns, KvPrecisionCols, KvPrecisionRow};
use crate::error::Result;
use crate::quality::{run_chunked, RefLogits, RefMeta};
use crate::row::Head;
use indicatif::ProgressBar;
use kernel_common::ErrorStats;
use kernel_paged::{KvCache, KvCacheFormat};
use models::eval::perplexity::{KlStats, Moments, PplStats, Window};
use models::{KvPools, Llama, Session};

/// What one quality point evaluates.
pub struct QualityPoint<'a> {
    pub model_name: &'a str,
    pub model_id: String,
    pub text: &'a crate::texts::Text,
    pub tokens: &'a [u32],
    pub windows: &'a [Window],
    pub ctx: usize,
    pub prefill_chunk: usize,
    pub formats: &'a [KvCacheFormat],
    /// Said on every row (how presets got their token ids).
    pub note: String,
}

fn add(into: &mut Moments, m: &Moments) {
    into.count += m.count;
    into.sum += m.sum;
    into.sum2 += m.sum2;
}

/// One format's sums over the windows.
#[derive(Default)]
struct Totals {
    ppl: PplStats,
    kl: KlStats,
    tokens: usize,
    seconds: f64,
}

/// The rows of the point: one per format (`formats` starts with f32, the reference, whose
/// KL is 0 and top-1 agreement 1 by definition).
pub fn rows(
    model: &mut Llama,
    p: &QualityPoint,
    head: &dyn Fn(&str) -> Head,
    bar: &ProgressBar,
) -> Result<Vec<KvPrecisionRow>> {
    let mut totals: Vec<Totals> = p.formats.iter().map(|_| Totals::default()).collect();
    let hidden = ProgressBar::hidden();
    for (k, w) in p.windows.iter().enumerate() {
        let one = std::slice::from_ref(w);
        bar.set_message(format!(
            "{}: window {}/{}, f32",
            p.model_name,
            k + 1,
            p.windows.len()
        ));
        model.set_kv_cache(KvCacheFormat::default());
        let mut reference =
            run_chunked(model, p.tokens, one, p.prefill_chunk, None, true, &hidden)?;
        let kept = RefLogits {
            meta: RefMeta {
                model: p.model_id.clone(),
                text_sha256: p.text.sha256.clone(),
                ctx: p.ctx,
                stride: p.ctx,
                windows: 1,
                vocab: model.cfg.vocab,
            },
            logprobs: reference.kept.take().expect("kept"),
        };
        for (t, &f) in totals.iter_mut().zip(p.formats) {
            if f.is_f32() {
                add(&mut t.ppl.nll, &reference.stats.nll);
                t.tokens += reference.tokens_run;
                t.seconds += reference.seconds;
                continue;
            }
            bar.set_message(format!(
                "{}: window {}/{}, {f}",
                p.model_name,
                k + 1,
                p.windows.len()
            ));
            model.set_kv_cache(f);
            let out = run_chunked(
                model,
                p.tokens,
                one,
                p.prefill_chunk,
                Some(&kept),
                false,
                &hidden,
            )?;
            add(&mut t.ppl.nll, &out.stats.nll);
            if let Some(kl) = out.kl {
                add(&mut t.kl.kl, &kl.kl);
                t.kl.top1_same += kl.top1_same;
            }
            t.tokens += out.tokens_run;
            t.seconds += out.seconds;
        }
    }
    let storage = storage_errors(model, p)?;
    model.set_kv_cache(KvCacheFormat::default());
    let l = &model.cfg;
    let per_token =
        |f: &KvCacheFormat| l.layers as f64 * f.bytes_per_token(p.ctx, l.kv_heads, l.head_dim, 16);
    let f32_bytes = per_token(&KvCacheFormat::default());
    let mut rows = vec![];
    for ((t, f), store) in totals.iter().zip(p.formats).zip(storage) {
        let is_ref = f.is_f32();
        let (rel, max, snr) = storage_columns(&store);
        let mut h = head(&f.to_string());
        h.status = if t.ppl.ppl().is_finite() {
            "ok"
        } else {
            "fail"
        }
        .into();
        h.reps = 1;
        h.median_ms = Some(t.seconds * 1e3);
        h.p10_ms = h.median_ms;
        h.p90_ms = h.median_ms;
        rows.push(KvPrecisionRow {
            head: h,
            cols: KvPrecisionCols {
                part: "quality".into(),
                kv_cache: f.to_string(),
                scheme: scheme(f).into(),
                kv_bytes_per_token: per_token(f),
                bytes_vs_f32: per_token(f) / f32_bytes,
                store_rel_l2: Some(rel),
                store_max_abs: Some(max),
                store_snr_db: Some(snr),
                model: p.model_name.into(),
                text: p.text.name.clone(),
                text_sha256: p.text.sha256.clone(),
                ctx: Some(p.ctx),
                windows: Some(p.windows.len()),
                prefill_chunk: Some(p.prefill_chunk),
                scored_tokens: Some(t.ppl.nll.count),
                ppl: Some(t.ppl.ppl()),
                ppl_stderr: Some(t.ppl.ppl_stderr()),
                delta_ppl: None,
                kl_mean: Some(if is_ref { 0.0 } else { t.kl.kl.mean() }),
                kl_stderr: Some(if is_ref { 0.0 } else { t.kl.kl.stderr() }),
                top1_agreement: Some(if is_ref { 1.0 } else { t.kl.top1_agreement() }),
                tokens_per_s: Some(t.tokens as f64 / t.seconds.max(1e-9)),
                ..KvPrecisionCols::default()
            },
            note: p.note.clone(),
        });
        bar.inc(1);
    }
    let base = rows
        .iter()
        .find(|r| r.kv_cache == KvCacheFormat::default().to_string())
        .and_then(|r| r.ppl);
    for r in &mut rows {
        r.cols.delta_ppl = base.zip(r.ppl).map(|(b, x)| x - b);
    }
    Ok(rows)
}

/// uniform | progressive
pub fn scheme(f: &KvCacheFormat) -> &'static str {
    match f {
        KvCacheFormat::Uniform(_) => "uniform",
        KvCacheFormat::Progressive { .. } => "progressive",
    }
}

/// Each format's storage error on the model's own K/V: the first window run under the f32
/// cache, then every layer's K/V written, in the same prefill pieces, into a cache of the
/// format and read back.
fn storage_errors(model: &mut Llama, p: &QualityPoint) -> Result<Vec<ErrorStats>> {
    model.set_kv_cache(KvCacheFormat::default());
    let w = p.windows[0];
    let tokens = &p.tokens[w.start..w.start + w.len];
    let mut session = Session::new(model, w.len, 16)?;
    session.forward_all(tokens)?;
    let kv: &KvPools = &session.kv;
    let l = kv.layout;
    let table: Vec<u32> = (0..l.blocks_for(w.len) as u32).collect();
    let per = l.kv_heads * l.head_dim;
    let mut out = vec![];
    for &f in p.formats {
        let (mut stored, mut exact) = (vec![], vec![]);
        for li in 0..kv.layers.len() {
            let (k, v) = kv.layers[li].gather(&table, w.len)?;
            // Head-major [kv_heads, len, d] → token-major rows for the write.
            let rows = |x: &[f32]| -> Vec<f32> {
                let mut r = vec![0.0; x.len()];
                for h in 0..l.kv_heads {
                    for t in 0..w.len {
                        let (src, dst) = ((h * w.len + t) * l.head_dim, t * per + h * l.head_dim);
                        r[dst..dst + l.head_dim].copy_from_slice(&x[src..src + l.head_dim]);
                    }
                }
                r
            };
            let (kr, vr) = (rows(&k), rows(&v));
            let mut cache = KvCache::new(l, f)?;
            let mut start = 0;
            while start < w.len {
                let end = (start + p.prefill_chunk).min(w.len);
                let pos: Vec<usize> = (start..end).collect();
                cache.write(
                    &table,
                    &pos,
                    &kr[start * per..end * per],
                    &vr[start * per..end * per],
                )?;
                start = end;
            }
            let (gk, gv) = cache.gather(&table, w.len)?;
            stored.extend(gk);
            stored.extend(gv);
            exact.extend(k.iter().chain(&v).map(|&x| x as f64));
        }
        out.push(ErrorStats::compare(&stored, &exact));
    }
    Ok(out)
}
