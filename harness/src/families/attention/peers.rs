//! An attention point with peers (`peers = ["torch_sdpa"]`, `--peer`): a peer gets the
//! point's own seeded q, k, v as a case file, writes its output, and that output is compared
//! with the f64 reference rows exactly like a variant's; then each variant is timed in rounds
//! alternating with the peers (repetition i of each before repetition i + 1 of any, caches
//! flushed before every call), so the shared machine's drift hits both sides alike. On a
//! CUDA device every call is cold (ours and the peers' flush L2 before each repetition, after
//! a warm-up); then each side is timed hot once more, for the rows' `hot_median_ms`.

use super::cols::ExpRow;
use super::point::{finish_row, time_hot, PointRunner, Ready};
use crate::error::Result;
use crate::measure::{time_reps, CacheFlusher, Timing};
use crate::peer::{write_case, CaseTensor, Peer, PeerError};
use crate::roofline::Roofline;
use crate::row::Heads;
use kernel_attention::AttentionKernel;
use kernel_common::Device;
use serde_json::json;
use std::path::Path;

/// A checked peer's place in the rows, its samples so far, and why it stopped, if it did.
struct PeerTiming {
    peer: usize,
    row: usize,
    samples: Vec<f64>,
    error: Option<String>,
}

/// The rows of one point: variants first, then peers, in the order given. The peers are
/// checked first; then each variant in turn is prepared, checked and timed in rounds that
/// alternate with every peer (variant, peer 1, peer 2, variant, ...), and dropped before
/// the next is prepared — one variant's memory at a time, as without peers. A peer's row
/// gathers its samples from all those rounds (alone when no variant runs at the point).
#[allow(clippy::too_many_arguments)]
pub(super) fn measure_point(
    runner: &mut PointRunner,
    kernels: &[Box<dyn AttentionKernel>],
    peers: &mut [Peer],
    scratch: &Path,
    heads: &Heads,
    device: Device,
    reps: usize,
    seconds_per_point: f64,
    flusher: &mut CacheFlusher,
    roof: &Roofline,
) -> Result<Vec<ExpRow>> {
    // Who runs here is known before any input exists: a point that every variant and peer
    // skips (a K+V over the limit, a peer not installed) makes no inputs at all.
    let mut rows: Vec<ExpRow> = vec![];
    let mut runs = vec![];
    for kernel in kernels {
        let mut row = runner.row(kernel.as_ref(), heads, roof);
        runs.push(runner.precheck(kernel.as_ref(), device, &mut row));
        rows.push(row);
    }
    let mut peer_rows = vec![];
    let mut peer_runs = vec![];
    for peer in peers.iter() {
        let shape = runner.point().shape;
        let cost = shape.io_cost(runner.point().dtype);
        let mut row = runner.row_named(peer.label(), cost, heads, roof);
        row.head.peer_version = peer.version.clone();
        peer_runs.push(peer_precheck(runner, peer, &mut row));
        peer_rows.push(row);
    }
    if !runs.iter().chain(&peer_runs).any(|&r| r) {
        rows.extend(peer_rows);
        return Ok(rows);
    }
    runner.ensure_reference();
    let runner = &*runner;
    // The point's inputs go to disk only when a peer will read them.
    let case = scratch.join("point.safetensors");
    if peer_runs.iter().any(|&r| r) {
        write_point(runner, &case)?;
    }
    let mut timings = vec![];
    for (p, peer) in peers.iter_mut().enumerate() {
        if peer_runs[p] && check_peer(runner, peer, &case, scratch, device, &mut peer_rows[p]) {
            timings.push(PeerTiming {
                peer: p,
                row: p,
                samples: vec![],
                error: None,
            });
        }
    }
    let mut any_variant = false;
    for (k, kernel) in kernels.iter().enumerate() {
        if !runs[k] {
            continue;
        }
        let row = &mut rows[k];
        if let Some(mut ready) = runner.check(kernel.as_ref(), device, row) {
            any_variant = true;
            let ours = rounds(
                Some(&mut ready),
                peers,
                &mut timings,
                reps,
                seconds_per_point,
                flusher,
            );
            finish_row(row, ours, roof, ready.passed, ready.unwritten);
            time_hot(&mut ready, reps, row);
        }
    }
    if !any_variant {
        // Nothing of ours runs here: the peers are timed on their own.
        let _ = rounds(None, peers, &mut timings, reps, seconds_per_point, flusher);
    }
    for t in timings {
        let row = &mut peer_rows[t.row];
        if let Some(e) = t.error {
            row.head.status = "error".into();
            row.note = e;
            continue;
        }
        if t.samples.is_empty() {
            // Every round stopped at a variant's timing error before reaching the peer.
            row.head.status = "error".into();
            row.note = "not timed: the rounds stopped at a variant's error".into();
            continue;
        }
        let passed = row.head.status == "ok";
        let samples = Timing { samples: t.samples };
        finish_row(row, Ok(samples), roof, passed, 0);
        if crate::measure::on_cuda(heads.device()) && row.head.status == "ok" {
            // The cold timing stands whatever happens to the hot one.
            match peers[t.peer].time_hot_ms(reps) {
                Ok(hot) => row.hot_median_ms = hot,
                Err(e) => row.note = format!("no hot timing: {e}"),
            }
        }
    }
    rows.extend(peer_rows);
    Ok(rows)
}

/// Up to `reps` rounds of one call of `ours` (if any) then one of each live peer, caches
/// flushed before each call; at least 3 rounds, then stops once the rounds used
/// `seconds_per_point` per participant. Our timing, or why it failed.
fn rounds(
    mut ours: Option<&mut Ready>,
    peers: &mut [Peer],
    timings: &mut [PeerTiming],
    reps: usize,
    seconds_per_point: f64,
    flusher: &mut CacheFlusher,
) -> kernel_common::error::Result<Timing> {
    let mut samples = vec![];
    let participants = ours.is_some() as usize + timings.len();
    let budget = seconds_per_point * participants as f64;
    let mut spent = 0.0;
    for round in 0..reps.max(1) {
        if round >= 3 && spent > budget {
            break;
        }
        if let Some(ready) = ours.as_deref_mut() {
            // A CUDA variant times its kernels with CUDA events, as without peers.
            let t = match ready.prepared.time_on_device(1) {
                Some(device_times) => Timing {
                    samples: device_times?,
                },
                None => time_reps(1, f64::INFINITY, flusher, || {
                    ready.prepared.run(&mut ready.out)
                })?,
            };
            spent += t.samples[0];
            samples.push(t.samples[0]);
        }
        for t in timings.iter_mut().filter(|t| t.error.is_none()) {
            // The caches are the machine's: evict them before the peer's call too.
            flusher.flush();
            match peers[t.peer].time_once() {
                Ok(s) => {
                    spent += s;
                    t.samples.push(s);
                }
                Err(e) => t.error = Some(e),
            }
        }
    }
    Ok(Timing { samples })
}

/// The point's q, k, v in their storage dtype, as an attention case file.
fn write_point(runner: &PointRunner, path: &Path) -> Result<()> {
    let s = runner.point().shape;
    let inputs = runner.made_inputs();
    let kv_shape = vec![s.batch, s.kv_heads, s.kv_len, s.head_dim];
    write_case(
        path,
        "attention",
        &[
            ("causal", s.causal.to_string()),
            ("scale", s.scale.to_string()),
        ],
        &[
            CaseTensor::buffer(
                "q",
                &inputs.q,
                vec![s.batch, s.q_heads, s.q_len, s.head_dim],
            ),
            CaseTensor::buffer("k", &inputs.k, kv_shape.clone()),
            CaseTensor::buffer("v", &inputs.v, kv_shape),
        ],
    )
}

/// Whether the peer runs at this point: its modes and the spec's limits (which hold for
/// peers too: a point too large for our variants is not run for theirs either); when not, the
/// row says why.
fn peer_precheck(runner: &PointRunner, peer: &Peer, row: &mut ExpRow) -> bool {
    // A peer that is not installed, or stopped earlier in the run, says so on every row
    // without the point's inputs being written for it.
    if let Some(e) = peer.down_reason() {
        record_failure(row, e);
        return false;
    }
    let point = runner.point();
    if !peer.manifest.serves(&point.mode) {
        row.head.status = "unsupported".into();
        row.note = format!("peer serves {} only", peer.manifest.modes.join(", "));
        return false;
    }
    if let Some(why) = runner.point_over_limit(row.flops) {
        row.head.status = "skipped".into();
        row.note = why;
        return false;
    }
    true
}

/// Loads the point into the peer, runs it once and checks its output; fills the error
/// columns (status ok/fail is set by the timing) or status unavailable, unsupported or
/// error. Returns whether the peer is to be timed.
fn check_peer(
    runner: &PointRunner,
    peer: &mut Peer,
    case: &Path,
    scratch: &Path,
    device: Device,
    row: &mut ExpRow,
) -> bool {
    let point = runner.point();
    let s = point.shape;
    let out = scratch.join(format!("{}.out.safetensors", peer.manifest.file_stem()));
    let _ = std::fs::remove_file(&out);
    let asked = peer
        .request(json!({
            "op": "load",
            "inputs": case,
            "threads": rayon::current_num_threads(),
            "device": device.to_string(),
            "point": {
                "mode": point.mode, "dtype": point.dtype.to_string(), "batch": s.batch,
                "q_heads": s.q_heads, "kv_heads": s.kv_heads, "q_len": s.q_len,
                "kv_len": s.kv_len, "head_dim": s.head_dim, "causal": s.causal,
                "scale": s.scale,
            },
        }))
        .and_then(|_| peer.request(json!({"op": "run", "out": out})))
        .and_then(|_| crate::peer::read_output(&out, s.q_elems()).map_err(PeerError::Failed));
    match asked {
        Ok(full) => {
            let (passed, _) = runner.compare(&full, row);
            // Status ok/fail comes with the timing; remember the verdict meanwhile.
            row.head.status = if passed { "ok" } else { "fail" }.into();
            true
        }
        Err(e) => {
            record_failure(row, e);
            false
        }
    }
}

/// A peer's row when the peer gave no output: unavailable, unsupported or error, and why.
fn record_failure(row: &mut ExpRow, e: PeerError) {
    let (status, why) = e.status_and_why();
    row.head.status = status.into();
    row.note = why;
}
