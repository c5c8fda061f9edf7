//! Peers of the quant family, checked and timed like our rows (tritonbench's registered
//! baselines, llama.cpp's reference quantisers beside ours):
//!
//! - a `matmul` peer (PyTorch's `F.linear`, `scripts/peers/torch_linear`) multiplies the
//!   point's own f32 weights with its activations in the dtype its options name (`f32`,
//!   `bf16`); its output is checked against the f64 product of the weights and activations
//!   rounded to that dtype, with that dtype's tolerance, and it is timed in the rounds of
//!   `exp::time_interleaved`, beside every format of the point;
//! - a `quantize` peer (gguf-py's reference quantisers, `scripts/peers/gguf_py`) quantises the
//!   same f32 weights into each format it serves: its bytes are compared with ours byte for
//!   byte (a difference fails the row), and its time per matrix is measured in rounds that
//!   alternate with our quantiser's (rows with `op = quantize`, `batch` 0).
//!
//! The weights go to the peers once per (shape, weights) pair as a case file (`x`, f32
//! [rows, cols], `harness replay`'s quant schema); a matmul point adds a small file with the
//! activations (`act` [batch, cols]), named in the load request's `act`.

use super::cols::{QuantRow, RowBase, Stored};
use crate::error::Result;
use crate::measure::{time_reps, CacheFlusher, Timing};
use crate::peer::{read_bytes_output, read_output, write_case, CaseTensor, Peer, PeerError};
use crate::peer::{Manifest, ScratchDir};
use crate::run_files::ExpRequest;
use crate::spec::Limits;
use kernel_common::{tolerance, DType, ErrorStats};
use kernel_quant::{MatVecVariant, Prepared, QuantError, QuantMatrix, WeightFormat};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What a row of a point is timed with.
pub(super) enum Timed {
    /// One of our products on a prepared weight.
    Ours(Prepared, MatVecVariant),
    /// A matmul peer (its index) with the point loaded.
    Peer(usize),
}

/// The run's peers and where their inputs are.
pub(super) struct QuantPeers {
    peers: Vec<Peer>,
    scratch: Option<ScratchDir>,
    /// The current (shape, weights) pair's case file, when a live peer reads it.
    weights: Option<PathBuf>,
    /// The error of the current weights rounded to a peer's dtype, per dtype.
    rounding: BTreeMap<String, QuantError>,
}

fn serves_op(m: &Manifest, op: &str) -> bool {
    m.serves(op)
}

fn serves_format(m: &Manifest, f: WeightFormat) -> bool {
    m.formats.is_empty() || m.formats.iter().any(|s| *s == f.to_string())
}

/// A matmul peer's dtype (its `dtype` option; f32 when it has none).
fn dtype_of(m: &Manifest) -> DType {
    match m.chosen.get("dtype").map(String::as_str) {
        Some("bf16") => DType::BF16,
        Some("f16") => DType::F16,
        _ => DType::F32,
    }
}

fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F32 => v,
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
    }
}

/// f64 products of `sampled` rows of the weights with every activation vector, both rounded
/// to `dtype` first (what a peer computing in `dtype` multiplies).
fn rounded_reference(
    dtype: DType,
    w: &[f32],
    x: &[f32],
    (batch, cols): (usize, usize),
    sampled: &[usize],
) -> Vec<f64> {
    let mut out = Vec::with_capacity(batch * sampled.len());
    for b in 0..batch {
        let xb: Vec<f64> = x[b * cols..(b + 1) * cols]
            .iter()
            .map(|&v| round_to(dtype, v) as f64)
            .collect();
        for &r in sampled {
            let wr = &w[r * cols..(r + 1) * cols];
            out.push(
                wr.iter()
                    .zip(&xb)
                    .map(|(&a, &v)| round_to(dtype, a) as f64 * v)
                    .sum(),
            );
        }
    }
    out
}

/// A peer's row when the peer gave no output: unavailable, unsupported or error, and why.
fn record_failure(row: &mut QuantRow, e: PeerError) {
    let (status, why) = e.status_and_why();
    row.head.status = status.into();
    row.note = why;
}

impl QuantPeers {
    /// Starts the request's peers (none: nothing is started or written).
    pub fn start(req: &ExpRequest, run_id: &str) -> Result<QuantPeers> {
        let mut qp = QuantPeers {
            peers: vec![],
            scratch: None,
            weights: None,
            rounding: BTreeMap::new(),
        };
        if !req.peers.is_empty() {
            let scratch = ScratchDir::new(run_id)?;
            qp.peers = req
                .peers
                .iter()
                .map(|m| Peer::start(m.clone(), &req.peer_root, &scratch.0))
                .collect();
            qp.scratch = Some(scratch);
        }
        Ok(qp)
    }

    pub fn peers_mut(&mut self) -> &mut [Peer] {
        &mut self.peers
    }

    /// Whether a peer multiplies.
    pub fn multiplies(&self) -> bool {
        self.peers.iter().any(|p| serves_op(&p.manifest, "matmul"))
    }

    /// Whether a peer quantises.
    pub fn quantizes(&self) -> bool {
        self.peers
            .iter()
            .any(|p| serves_op(&p.manifest, "quantize"))
    }

    /// The rows the peers add to a run of `formats` over `pairs` (shape, weights) pairs and
    /// `batches` batch sizes: one per matmul peer and point, and per quantised format one of
    /// ours and one per quantiser peer serving it.
    pub fn rows(&self, formats: &[WeightFormat], pairs: usize, batches: usize) -> usize {
        let ms = &self.peers;
        let matmul = ms
            .iter()
            .filter(|p| serves_op(&p.manifest, "matmul"))
            .count();
        let quantize: usize = formats
            .iter()
            .map(|&f| {
                let n = ms
                    .iter()
                    .filter(|p| serves_op(&p.manifest, "quantize") && serves_format(&p.manifest, f))
                    .count();
                if n > 0 {
                    n + 1
                } else {
                    0
                }
            })
            .sum();
        pairs * (matmul * batches + quantize)
    }

    /// A new (shape, weights) pair: its f32 weights go to disk once, when a live peer will
    /// read them (the previous pair's file is removed).
    pub fn new_weights(
        &mut self,
        w: &[f32],
        (rows, cols): (usize, usize),
        (si, di): (usize, usize),
    ) -> Result<()> {
        self.rounding.clear();
        if let Some(old) = self.weights.take() {
            let _ = std::fs::remove_file(old);
        }
        let Some(scratch) = &self.scratch else {
            return Ok(());
        };
        if self.peers.iter().all(|p| p.down_reason().is_some()) {
            return Ok(());
        }
        let path = scratch.0.join(format!("weights-{si}-{di}.safetensors"));
        write_case(
            &path,
            "quant",
            &[("format", "f32".into())],
            &[CaseTensor::f32("x", w, vec![rows, cols])],
        )?;
        self.weights = Some(path);
        Ok(())
    }

    /// The matmul peers' rows at one (shape, weights, batch) point, each checked (or saying
    /// why it did not run), to be timed beside ours.
    pub fn matmul_rows(
        &mut self,
        base: &RowBase,
        w: &[f32],
        batch: usize,
        (x, sampled, want_dense): (&[f32], &[usize], &[f64]),
    ) -> Result<Vec<(QuantRow, Option<Timed>)>> {
        let (rows, cols) = (base.rows, base.cols);
        let act = base_dir(&self.scratch).join(format!("act-b{batch}.safetensors"));
        let mut act_written = false;
        let mut out = vec![];
        for k in 0..self.peers.len() {
            if !serves_op(&self.peers[k].manifest, "matmul") {
                continue;
            }
            let dtype = dtype_of(&self.peers[k].manifest);
            let err = *self.rounding.entry(dtype.to_string()).or_insert_with(|| {
                let rounded: Vec<f32> = w.iter().map(|&v| round_to(dtype, v)).collect();
                QuantError::measure(w, &rounded)
            });
            let bits = 8.0 * dtype.size() as f64;
            let peer = &mut self.peers[k];
            let mut row = base.row(
                peer.label(),
                &dtype.to_string(),
                ("dense".into(), bits),
                batch,
                Some(err),
            );
            row.head.peer_version = peer.version.clone();
            row.bytes = row.weight_bytes + (4 * batch * (cols + rows)) as u64;
            row.flops = (2 * rows * cols * batch) as u64;
            if let Some(e) = peer.down_reason() {
                record_failure(&mut row, e);
                out.push((row, None));
                continue;
            }
            let Some(weights) = self.weights.clone() else {
                record_failure(&mut row, PeerError::Failed("no weights file".into()));
                out.push((row, None));
                continue;
            };
            if !act_written {
                write_case(
                    &act,
                    "quant",
                    &[],
                    &[CaseTensor::f32("act", x, vec![batch, cols])],
                )?;
                act_written = true;
            }
            let out_path = base_dir(&self.scratch)
                .join(format!("{}.out.safetensors", peer.manifest.file_stem()));
            let _ = std::fs::remove_file(&out_path);
            let asked = peer
                .request(json!({
                    "op": "load", "inputs": weights, "act": act,
                    "threads": rayon::current_num_threads(), "device": base.heads.device(),
                    "point": {"op": "matmul", "dtype": dtype.to_string(), "rows": rows,
                              "cols": cols, "batch": batch},
                }))
                .and_then(|_| peer.request(json!({"op": "run", "out": out_path})))
                .and_then(|_| read_output(&out_path, batch * rows).map_err(PeerError::Failed));
            let y = match asked {
                Ok(y) => y,
                Err(e) => {
                    record_failure(&mut row, e);
                    out.push((row, None));
                    continue;
                }
            };
            let y = &y;
            let got: Vec<f32> = (0..batch)
                .flat_map(|b| sampled.iter().map(move |&r| y[b * rows + r]))
                .collect();
            let want = if dtype == DType::F32 {
                want_dense.to_vec()
            } else {
                rounded_reference(dtype, w, x, (batch, cols), sampled)
            };
            let stats = ErrorStats::compare(&got, &want);
            row.max_abs_err = Some(stats.max_abs);
            row.rel_l2_err = Some(stats.rel_l2);
            row.checked_outputs = got.len();
            row.out_rel_err = Some(ErrorStats::compare(&got, want_dense).rel_l2);
            let passed = stats.passes(&tolerance(dtype).scaled_to(&want));
            row.head.status = if passed { "ok" } else { "fail" }.into();
            out.push((row, Some(Timed::Peer(k))));
        }
        Ok(out)
    }

    /// Our quantiser and the quantiser peers on the same f32 weights, per format a peer
    /// serves: the peers' bytes compared with ours, then timed in alternating rounds (ours,
    /// each peer, again; caches flushed before every call).
    pub fn quantize_rows(
        &mut self,
        base: &RowBase,
        w: &[f32],
        stored: &[Stored],
        (reps, limits, flusher): (usize, &Limits, &mut CacheFlusher),
    ) -> Result<Vec<QuantRow>> {
        let (rows, cols) = (base.rows, base.cols);
        let mut out = vec![];
        for st in stored {
            let format = st.format;
            let served: Vec<usize> = (0..self.peers.len())
                .filter(|&k| {
                    let m = &self.peers[k].manifest;
                    serves_op(m, "quantize") && serves_format(m, format)
                })
                .collect();
            if served.is_empty() {
                continue;
            }
            let quantize_row = |variant: &str, err| {
                let mut r = base.format_row(variant, format, 0, err);
                r.op = "quantize".into();
                r.bytes = r.weight_bytes + (4 * rows * cols) as u64;
                r
            };
            let mut our_row = quantize_row("quantize", st.err);
            let ours = match &st.matrix {
                Ok(m) => m,
                Err(e) => {
                    our_row.head.status = "error".into();
                    our_row.note = e.to_string();
                    out.push(our_row);
                    continue;
                }
            };
            let mut peer_rows = vec![];
            let mut live = vec![];
            for &k in &served {
                let peer = &mut self.peers[k];
                let mut row = quantize_row(peer.label(), None);
                row.head.peer_version = peer.version.clone();
                // A peer that is not installed (or died) says so: `unavailable`, not an
                // `error` about the weights file, which is written only for live peers.
                if let Some(e) = peer.down_reason() {
                    record_failure(&mut row, e);
                    peer_rows.push(row);
                    continue;
                }
                let checked = self
                    .weights
                    .clone()
                    .ok_or_else(|| PeerError::Failed("no weights file".into()))
                    .and_then(|weights| {
                        let out_path = base_dir(&self.scratch)
                            .join(format!("{}.q.safetensors", peer.manifest.file_stem()));
                        let _ = std::fs::remove_file(&out_path);
                        let loaded = peer.request(json!({
                            "op": "load", "inputs": weights,
                            "threads": rayon::current_num_threads(), "device": base.heads.device(),
                            "point": {"op": "quantize", "format": format.to_string(),
                                      "rows": rows, "cols": cols},
                        }))?;
                        // A peer may say it uses fewer threads than it was given (numpy: 1).
                        if let Some(t) = loaded["threads"].as_u64() {
                            row.head.threads = t as usize;
                        }
                        peer.request(json!({"op": "run", "out": out_path}))?;
                        read_bytes_output(&out_path, ours.bytes().len()).map_err(PeerError::Failed)
                    });
                match checked {
                    Err(e) => record_failure(&mut row, e),
                    Ok(bytes) => {
                        compare_bytes(ours, bytes, w, &mut row);
                        live.push((peer_rows.len(), k));
                    }
                }
                peer_rows.push(row);
            }
            // Rounds: ours, then each live peer; at least 3, then until the time is used.
            let mut samples = vec![vec![]; peer_rows.len() + 1];
            let mut errors: Vec<Option<String>> = vec![None; peer_rows.len()];
            let budget = limits.seconds_per_point * (live.len() + 1) as f64;
            let mut spent = 0.0;
            for round in 0..reps.max(1) {
                if round >= 3 && spent > budget {
                    break;
                }
                let t = time_reps(1, f64::INFINITY, flusher, || {
                    QuantMatrix::quantize(format, rows, cols, w).map(|_| ())
                })?;
                spent += t.samples[0];
                samples[0].push(t.samples[0]);
                for &(i, k) in &live {
                    if errors[i].is_some() {
                        continue;
                    }
                    flusher.flush();
                    match self.peers[k].time_once() {
                        Ok(s) => {
                            spent += s;
                            samples[i + 1].push(s);
                        }
                        Err(e) => errors[i] = Some(e),
                    }
                }
            }
            our_row.head.status = "ok".into();
            set_quantize_timing(&mut our_row, &samples[0]);
            out.push(our_row);
            for &(i, _) in &live {
                let row = &mut peer_rows[i];
                match &errors[i] {
                    Some(e) => {
                        row.head.status = "error".into();
                        row.note = e.clone();
                    }
                    None => set_quantize_timing(row, &samples[i + 1]),
                }
            }
            out.extend(peer_rows);
        }
        Ok(out)
    }
}

fn base_dir(scratch: &Option<ScratchDir>) -> PathBuf {
    scratch.as_ref().map(|s| s.0.clone()).unwrap_or_default()
}

/// A quantiser row's timing: median ms, and GB/s of f32 read plus bytes written.
fn set_quantize_timing(row: &mut QuantRow, samples: &[f64]) {
    let t = Timing {
        samples: samples.to_vec(),
    };
    row.head.set_timing(&t);
    row.quantize_ms = t.median() * 1e3;
    row.gbps = Some(row.bytes as f64 / t.median() / 1e9);
}

/// A quantiser peer's bytes against ours: status ok when identical, else fail with how many
/// blocks differ and the first; the error columns from its bytes dequantised.
fn compare_bytes(ours: &QuantMatrix, theirs: Vec<u8>, w: &[f32], row: &mut QuantRow) {
    let bb = ours.format.block_bytes();
    let differing: Vec<usize> = ours
        .bytes()
        .chunks(bb)
        .zip(theirs.chunks(bb))
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| i)
        .collect();
    let blocks = ours.bytes().len() / bb;
    match QuantMatrix::from_bytes(ours.format, ours.rows, ours.cols, theirs) {
        Ok(m) => {
            let e = QuantError::measure(w, &m.dequantize());
            (row.w_rmse, row.w_max_abs, row.w_snr_db) = (e.rmse, e.max_abs, e.snr_db);
        }
        Err(e) => row.note = e.to_string(),
    }
    if differing.is_empty() {
        row.head.status = "ok".into();
        row.note = format!("bytes identical to ours ({blocks} blocks)");
    } else {
        let per_row = blocks / ours.rows.max(1);
        let first = differing[0];
        row.head.status = "fail".into();
        row.note = format!(
            "{} of {blocks} blocks differ from ours (first: row {} block {})",
            differing.len(),
            first / per_row.max(1),
            first % per_row.max(1)
        );
    }
}
