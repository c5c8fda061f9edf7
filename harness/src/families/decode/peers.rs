//! Peers of the decode family (`scripts/peers/llamacpp`: llama.cpp's `llama-bench` at batch 1
//! and for prefill, `llama-batched-bench` at batch B > 1, on the same GGUF file, beside ours in
//! one run). A peer serves the points it can (llama.cpp: the file as shipped); at each one it
//! makes one timed call in every round of ours — the runner alternates one of our runs with
//! one call of each peer — so a peer's row gathers its samples from the rounds of every
//! product we time at that point. llama.cpp returns no logits, so its rows are timing only.

use super::rows::{DecodeRow, Phase, RowCtx};
use crate::error::Result;
use crate::measure::Timing;
use crate::peer::{Peer, PeerError, ScratchDir};
use crate::run_files::ExpRequest;
use serde_json::{json, Value};

/// A point as a peer sees it: a decode batch after a context, or a prefill.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PeerPoint(Value);

impl PeerPoint {
    pub fn decode(batch: usize, context: usize, steps: usize) -> PeerPoint {
        PeerPoint(json!({"phase": "decode", "batch": batch, "context": context, "steps": steps}))
    }

    pub fn prefill(prompt: usize) -> PeerPoint {
        PeerPoint(json!({"phase": "prefill", "batch": 1, "prompt": prompt}))
    }

    fn phase(&self) -> &str {
        self.0["phase"].as_str().unwrap_or("")
    }
}

/// One peer at one point: its samples so far, or why it does not run there.
pub(super) struct Slot {
    peer: usize,
    /// The point's index in the list the slots were made from.
    index: usize,
    point: PeerPoint,
    samples: Vec<f64>,
    failed: Option<PeerError>,
}

/// The run's peers.
pub(super) struct DecodePeers {
    peers: Vec<Peer>,
    _scratch: Option<ScratchDir>,
}

impl DecodePeers {
    /// Starts the request's peers (none: nothing is started).
    pub fn start(req: &ExpRequest, run_id: &str) -> Result<DecodePeers> {
        if req.peers.is_empty() {
            return Ok(DecodePeers {
                peers: vec![],
                _scratch: None,
            });
        }
        let scratch = ScratchDir::new(run_id)?;
        let peers = req
            .peers
            .iter()
            .map(|m| Peer::start(m.clone(), &req.peer_root, &scratch.0))
            .collect();
        Ok(DecodePeers {
            peers,
            _scratch: Some(scratch),
        })
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    fn load(
        &mut self,
        peer: usize,
        model: &str,
        point: &PeerPoint,
    ) -> std::result::Result<(), PeerError> {
        // The peer runs in its own folder: the model's path must not depend on ours.
        let model = std::fs::canonicalize(model)
            .map_or_else(|_| model.to_string(), |p| p.display().to_string());
        self.peers[peer]
            .request(json!({
                "op": "load", "inputs": model, "point": point.0,
                "threads": rayon::current_num_threads(), "device": "cpu",
            }))
            .map(|_| ())
    }

    /// A slot per peer and point of `model`, each asked once whether it serves the point.
    pub fn slots(&mut self, model: &str, points: &[PeerPoint]) -> Vec<Slot> {
        let mut slots = vec![];
        for peer in 0..self.peers.len() {
            for (index, point) in points.iter().enumerate() {
                let failed = if !self.peers[peer].manifest.serves(point.phase()) {
                    let modes = self.peers[peer].manifest.modes.join(", ");
                    Some(PeerError::Unsupported(format!("peer serves {modes} only")))
                } else {
                    self.load(peer, model, point).err()
                };
                slots.push(Slot {
                    peer,
                    index,
                    point: point.clone(),
                    samples: vec![],
                    failed,
                });
            }
        }
        slots
    }

    /// Whether a peer runs at `point`.
    pub fn live_at(&self, slots: &[Slot], point: &PeerPoint) -> bool {
        slots
            .iter()
            .any(|s| s.point == *point && s.failed.is_none())
    }

    /// One timed call of every live peer at `point` (loaded afresh: a peer holds one point).
    pub fn time_round(&mut self, slots: &mut [Slot], model: &str, point: &PeerPoint) {
        for s in slots.iter_mut() {
            if s.point != *point || s.failed.is_some() {
                continue;
            }
            let timed = self
                .load(s.peer, model, point)
                .map_err(PeerError::why)
                .and_then(|_| self.peers[s.peer].time_once());
            match timed {
                Ok(t) => s.samples.push(t),
                Err(e) => s.failed = Some(PeerError::Failed(e)),
            }
        }
    }

    /// The peers' rows, in slot order; `phases[i]` is the phase of the i-th point the slots
    /// were made from.
    pub fn rows(&self, slots: Vec<Slot>, ctx: &RowCtx, phases: &[Phase]) -> Vec<DecodeRow> {
        slots
            .into_iter()
            .map(|s| {
                let peer = &self.peers[s.peer];
                let phase = &phases[s.index];
                let t = Timing { samples: s.samples };
                let mut row = if t.samples.is_empty() {
                    let mut row = ctx.row(
                        peer.label(),
                        "llama.cpp",
                        phase,
                        &Timing {
                            samples: vec![f64::NAN],
                        },
                        None,
                    );
                    row.head.reps = 0;
                    (row.head.median_ms, row.head.p10_ms, row.head.p90_ms) = (None, None, None);
                    let (status, why) = s
                        .failed
                        .unwrap_or_else(|| PeerError::Failed("not timed".into()))
                        .status_and_why();
                    row.head.status = status.into();
                    row.note = why;
                    row
                } else {
                    let mut row = ctx.row(peer.label(), "llama.cpp", phase, &t, None);
                    row.note = "timing only: llama.cpp returns no output to check".into();
                    if let Some(e) = s.failed {
                        row.head.status = "error".into();
                        row.note =
                            format!("stopped after {} samples: {}", t.samples.len(), e.why());
                    }
                    row
                };
                row.head.peer_version = peer.version.clone();
                row
            })
            .collect()
    }
}
