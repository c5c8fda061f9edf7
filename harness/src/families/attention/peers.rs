//! An attention point with peers (`peers = ["torch_sdpa"]`, `--peer`): every variant and
//! every peer is checked first — a peer gets the point's own seeded q, k, v as a case file,
//! writes its output, and that output is compared with the f64 reference rows exactly like a
//! variant's — then all of them are timed in alternating rounds (repetition i of each before
//! repetition i + 1 of any, caches flushed before our calls), so the shared machine's drift
//! hits both sides alike. Stops after `reps` rounds, or after 3 once the point has used
//! `seconds_per_point` per row.

use super::cols::ExpRow;
use super::point::{finish_row, PointRunner, Ready};
use crate::error::Result;
use crate::measure::{time_reps, CacheFlusher, Timing};
use crate::peer::{write_case, Peer, PeerError};
use crate::roofline::Roofline;
use attention_kernels::AttentionKernel;
use kernel_common::Device;
use serde_json::json;
use std::path::Path;

/// What is timed in the rounds: a checked variant, or a checked peer (by index).
enum Timed<'k> {
    Variant(Ready<'k>),
    Peer(usize),
}

/// The rows of one point: variants first, then peers, in the order given.
#[allow(clippy::too_many_arguments)]
pub(super) fn measure_point(
    runner: &mut PointRunner,
    kernels: &[Box<dyn AttentionKernel>],
    peers: &mut [Peer],
    scratch: &Path,
    ids: (&str, &str),
    device: Device,
    reps: usize,
    seconds_per_point: f64,
    flusher: &mut CacheFlusher,
    roof: &Roofline,
) -> Result<Vec<ExpRow>> {
    let (run_id, exp) = ids;
    runner.ensure_reference();
    let runner = &*runner;
    let mut rows = vec![];
    let mut timed: Vec<(usize, Timed)> = vec![];
    for kernel in kernels {
        let mut row = runner.row(kernel.as_ref(), run_id, exp, device, roof);
        if let Some(ready) = runner.check(kernel.as_ref(), device, &mut row) {
            timed.push((rows.len(), Timed::Variant(ready)));
        }
        rows.push(row);
    }
    let case = scratch.join("point.safetensors");
    write_point(runner, &case)?;
    for (p, peer) in peers.iter_mut().enumerate() {
        let shape = runner.point().shape;
        let cost = shape.io_cost(runner.point().dtype);
        let mut row = runner.row_named(&peer.manifest.name, cost, run_id, exp, device, roof);
        row.head.peer_version = peer.version.clone();
        if check_peer(runner, peer, &case, scratch, &mut row) {
            timed.push((rows.len(), Timed::Peer(p)));
        }
        rows.push(row);
    }
    // Alternating rounds.
    let mut samples: Vec<Vec<f64>> = vec![vec![]; timed.len()];
    let mut errors: Vec<Option<String>> = vec![None; timed.len()];
    let budget = seconds_per_point * timed.len() as f64;
    let mut spent = 0.0;
    for round in 0..reps.max(1) {
        if round >= 3 && spent > budget {
            break;
        }
        for (i, (_, t)) in timed.iter_mut().enumerate() {
            if errors[i].is_some() {
                continue;
            }
            let sample = match t {
                Timed::Variant(ready) => time_reps(1, f64::INFINITY, flusher, || {
                    ready.prepared.run(&mut ready.out)
                })
                .map(|t| t.samples[0])
                .map_err(|e| e.to_string()),
                Timed::Peer(p) => {
                    // The caches are the machine's: evict them before the peer's call too.
                    flusher.flush();
                    time_peer(&mut peers[*p])
                }
            };
            match sample {
                Ok(s) => {
                    spent += s;
                    samples[i].push(s);
                }
                Err(e) => errors[i] = Some(e),
            }
        }
    }
    for (i, (r, t)) in timed.iter().enumerate() {
        let (passed, unwritten) = match t {
            Timed::Variant(ready) => (ready.passed, ready.unwritten),
            Timed::Peer(_) => (rows[*r].head.status == "ok", 0),
        };
        match &errors[i] {
            Some(e) => {
                rows[*r].head.status = "error".into();
                rows[*r].note = e.clone();
            }
            None => {
                let t = Timing {
                    samples: samples[i].clone(),
                };
                finish_row(&mut rows[*r], Ok(t), roof, passed, unwritten);
            }
        }
    }
    Ok(rows)
}

/// The point's q, k, v in their storage dtype, as an attention case file.
fn write_point(runner: &PointRunner, path: &Path) -> Result<()> {
    let s = runner.point().shape;
    let inputs = runner.made_inputs();
    write_case(
        path,
        "attention",
        &[
            ("causal", s.causal.to_string()),
            ("scale", s.scale.to_string()),
        ],
        &[
            (
                "q",
                &inputs.q,
                vec![s.batch, s.q_heads, s.q_len, s.head_dim],
            ),
            (
                "k",
                &inputs.k,
                vec![s.batch, s.kv_heads, s.kv_len, s.head_dim],
            ),
            (
                "v",
                &inputs.v,
                vec![s.batch, s.kv_heads, s.kv_len, s.head_dim],
            ),
        ],
    )
}

/// Loads the point into the peer, runs it once and checks its output; fills the error
/// columns (status ok/fail is set by the timing) or status unavailable, unsupported or
/// error. Returns whether the peer is to be timed.
fn check_peer(
    runner: &PointRunner,
    peer: &mut Peer,
    case: &Path,
    scratch: &Path,
    row: &mut ExpRow,
) -> bool {
    let point = runner.point();
    let modes = &peer.manifest.modes;
    if !modes.is_empty() && !modes.contains(&point.mode) {
        row.head.status = "unsupported".into();
        row.note = format!("peer serves {} only", modes.join(", "));
        return false;
    }
    // The spec's limits hold for peers too: a point too large for our variants is not run
    // for theirs either.
    let limits = runner.limits();
    let kv_mib = (2 * point.shape.kv_elems() * point.dtype.size()) as f64 / (1 << 20) as f64;
    let gflop = row.flops as f64 / 1e9;
    if kv_mib > limits.max_kv_mib || gflop > limits.max_gflop {
        row.head.status = "skipped".into();
        row.note = if kv_mib > limits.max_kv_mib {
            format!("K+V {kv_mib:.0} MiB > max_kv_mib {}", limits.max_kv_mib)
        } else {
            format!("{gflop:.1} GFLOP > max_gflop {}", limits.max_gflop)
        };
        return false;
    }
    let s = point.shape;
    let out = scratch.join(format!("{}.out.safetensors", peer.manifest.name));
    let _ = std::fs::remove_file(&out);
    let asked = peer
        .request(json!({
            "op": "load",
            "inputs": case,
            "threads": rayon::current_num_threads(),
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
            let (status, why) = match e {
                PeerError::Unavailable(w) => ("unavailable", w),
                PeerError::Unsupported(w) => ("unsupported", w),
                PeerError::Failed(w) => ("error", w),
            };
            row.head.status = status.into();
            row.note = why;
            false
        }
    }
}

/// One timed call of the peer's loaded point, in seconds (the peer's own clock).
fn time_peer(peer: &mut Peer) -> std::result::Result<f64, String> {
    let reply = peer
        .request(json!({"op": "time", "reps": 1}))
        .map_err(|e| match e {
            PeerError::Unavailable(w) | PeerError::Unsupported(w) | PeerError::Failed(w) => w,
        })?;
    reply["times_ms"]
        .as_array()
        .and_then(|t| t.first())
        .and_then(|t| t.as_f64())
        .filter(|t| t.is_finite() && *t >= 0.0)
        .map(|ms| ms / 1e3)
        .ok_or_else(|| format!("peer {} returned no times_ms", peer.manifest.name))
}
