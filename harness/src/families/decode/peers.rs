//! Peers of the decode family (`scripts/peers/llamacpp`: llama.cpp's `llama-bench` at batch 1,
//! for prefill and for a k-token verification step, `llama-batched-bench` at batch B > 1, on
//! the same GGUF file, beside ours in one run). A peer serves the points it can (llama.cpp: the file as shipped); at each one it
//! makes one timed call in every round of ours — the runner alternates one of our runs with
//! one call of each peer — so a peer's row gathers its samples from the rounds of every
//! product we time at that point. llama.cpp returns no logits; before any of its times count,
//! its greedy tokens on the model are checked against ours (`peer_check.rs`).

use super::peer_check::{self, Failure, PeerText};
use super::rows::{DecodeRow, Phase, RowCtx};
use crate::error::Result;
use crate::measure::Timing;
use crate::peer::{Peer, PeerError, ScratchDir};
use crate::run_files::ExpRequest;
use models::{Llama, TextTokenizer};
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

    /// A k-token step of one sequence after `context` tokens (a verification pass).
    pub fn verify(tokens: usize, context: usize) -> PeerPoint {
        PeerPoint(json!({"phase": "verify", "batch": 1, "context": context, "tokens": tokens}))
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
    /// The peer's check on this model (`peer_check`): its note.
    checked: String,
    failed: Option<Failure>,
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

    /// A slot per peer and point of `model`, each asked once whether it serves the point;
    /// a peer that serves any is then checked once against `ours` (the model loaded from
    /// `model` and its tokenizer, if it has one), and where the check does not pass, none of
    /// its points is timed.
    pub fn slots(
        &mut self,
        model: &str,
        points: &[PeerPoint],
        ours: (&mut Llama, Option<&TextTokenizer>),
    ) -> Vec<Slot> {
        let (m, tok) = ours;
        let mut slots = vec![];
        for peer in 0..self.peers.len() {
            let first = slots.len();
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
                    checked: String::new(),
                    failed: failed.map(Failure::from),
                });
            }
            // The peer holds the last point it loaded: the model is the same at every one.
            if slots[first..].iter().all(|s| s.failed.is_some()) {
                continue;
            }
            let verdict = match tok {
                None => Err(Failure {
                    status: "error",
                    why: format!("unchecked: {model} has no tokenizer here, so the peer's tokens cannot be compared with ours"),
                }),
                Some(tok) => self.check(peer, m, tok),
            };
            for s in slots[first..].iter_mut().filter(|s| s.failed.is_none()) {
                match &verdict {
                    Ok(note) => s.checked = note.clone(),
                    Err(f) => s.failed = Some(f.clone()),
                }
            }
        }
        slots
    }

    /// The peer's greedy continuation of the check's prompt scored by our model.
    fn check(
        &mut self,
        peer: usize,
        m: &mut Llama,
        tok: &TextTokenizer,
    ) -> std::result::Result<String, Failure> {
        let reply = self.peers[peer].request(json!({
            "op": "run",
            "check": {"prompt": peer_check::PROMPT, "tokens": peer_check::TOKENS},
        }))?;
        let (Some(text), Some(decoded)) = (reply["text"].as_str(), reply["decoded"].as_u64())
        else {
            return Err(Failure {
                status: "error",
                why: format!(
                    "unchecked: the peer's check reply has no text and decoded count: {reply}"
                ),
            });
        };
        let peer_text = PeerText {
            text: text.to_string(),
            decoded: decoded as usize,
        };
        peer_check::agreement(m, tok, &peer_text)
    }

    /// Whether a peer runs at `point`.
    pub fn live_at(&self, slots: &[Slot], point: &PeerPoint) -> bool {
        slots
            .iter()
            .any(|s| s.point == *point && s.failed.is_none())
    }

    /// Our runs at `point` (`ours`: its samples and a check), each followed by one timed call
    /// of every live peer there: `live_rounds` rounds when a peer is live, else one. Our
    /// samples of every round, and the first round's check.
    pub fn alternate<C>(
        &mut self,
        slots: &mut [Slot],
        model: &str,
        point: &PeerPoint,
        live_rounds: usize,
        mut ours: impl FnMut() -> Result<(Timing, Option<C>)>,
    ) -> Result<(Timing, Option<C>)> {
        let rounds = if self.live_at(slots, point) {
            live_rounds
        } else {
            1
        };
        let (mut samples, mut check) = (vec![], None);
        for round in 0..rounds {
            let (t, c) = ours()?;
            samples.extend(t.samples);
            if round == 0 {
                check = c;
            }
            self.time_round(slots, model, point);
        }
        Ok((Timing { samples }, check))
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
                Err(e) => s.failed = Some(PeerError::Failed(e).into()),
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
                    let f = s.failed.unwrap_or_else(|| Failure {
                        status: "error",
                        why: "not timed".into(),
                    });
                    row.head.status = f.status.into();
                    row.note = f.why;
                    row
                } else {
                    let mut row = ctx.row(peer.label(), "llama.cpp", phase, &t, None);
                    row.note = s.checked;
                    if let Some(f) = s.failed {
                        row.head.status = "error".into();
                        row.note = format!("stopped after {} samples: {}", t.samples.len(), f.why);
                    }
                    row
                };
                row.head.peer_version = peer.version.clone();
                row
            })
            .collect()
    }
}
