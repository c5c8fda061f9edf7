//! The decode family's rows: `DecodeCols` (one model × weights × product × phase × batch,
//! ours or a peer's), and `RowCtx`, which turns a timed phase into a row against the run's
//! bandwidth roofline; shared by the runner and its peers.

use crate::measure::Timing;
use crate::row::{Head, Heads, Row};
use serde::{Deserialize, Serialize};

/// One model × weights × phase × batch. Column names are stable.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DecodeCols {
    pub model: String,
    pub weights: String,
    /// The projection product (fused, fused:act=q8). (Absent from the first runs: fused.)
    #[serde(default = "fused")]
    pub matmul: String,
    /// decode | prefill
    pub phase: String,
    pub batch: usize,
    /// Tokens in each sequence's context at the timed steps (decode), or the prompt (prefill).
    pub context: usize,
    pub weight_mb: f64,
    pub kv_mb: f64,
    /// Generated tokens per second (decode: batch / step time; prefill: prompt / time).
    pub tokens_per_s: f64,
    pub bandwidth_gbs: f64,
    /// (weight + KV bytes) / bandwidth.
    pub roofline_ms: f64,
    pub pct_of_roofline: f64,
    /// (weight + KV bytes) / measured time.
    pub effective_gbs: f64,
    pub gflops: f64,
    /// max |Δ| / max |logit| of sequence 0 against a batch-1 session (decode, batch > 1), or
    /// of a verify step's k logits against the same tokens decoded one at a time.
    pub rel_err_vs_batch1: Option<f64>,
    /// Tokens one timed step runs: decode the batch (one each), prefill the prompt, verify k
    /// tokens of one sequence. (Absent from runs before verify_cost.)
    #[serde(default)]
    pub step_tokens: Option<usize>,
    /// verify: this step's median over the 1-token step's of the same point, model, weights
    /// and product: its cost in decode steps.
    #[serde(default)]
    pub cost_steps: Option<f64>,
    /// verify: the roofline's cost in decode steps, max(bytes / read bandwidth, k × FLOPs /
    /// f32 FMA peak) over the same at k = 1 (the run's own roofline; int8 products multiply
    /// more per instruction than f32 FMAs, so for them it is an upper bound).
    #[serde(default)]
    pub roofline_steps: Option<f64>,
}

/// A row: the shared head, these columns, the note.
pub type DecodeRow = Row<DecodeCols>;

fn fused() -> String {
    "fused".into()
}

/// What every row of one (model, weights, product) shares: where it goes and the roofline's
/// terms.
pub struct RowCtx<'a> {
    /// The run's id, experiment and device.
    pub heads: &'a Heads,
    pub seed: u64,
    pub model: &'a str,
    pub weights: &'a str,
    /// Weight bytes read per step.
    pub wbytes: f64,
    /// The run's read bandwidth, GB/s.
    pub bw: f64,
    pub flops_token: f64,
}

/// One timed phase of a row.
pub struct Phase<'a> {
    pub name: &'a str,
    pub batch: usize,
    pub context: usize,
    /// Tokens each timed sample produces (decode: the batch; prefill: the prompt).
    pub tokens: usize,
    pub kv_bytes: f64,
}

impl RowCtx<'_> {
    /// What `phase` holds besides the weights, for the memory guard: its K/V cache and the
    /// batch's logits and activations; the note when the weights and that are over `budget`.
    pub fn over_budget(
        &self,
        phase: &Phase,
        vocab: usize,
        budget: &crate::mem_guard::MemBudget,
    ) -> Option<String> {
        use crate::mem_guard::human;
        let acts = crate::mem_guard::product(&[phase.tokens, vocab, 8]);
        let (w, kv) = (self.wbytes as u64, phase.kv_bytes as u64);
        let what = format!(
            "weights {}, K/V {}, logits {}",
            human(w),
            human(kv),
            human(acts)
        );
        budget.refuse(w.saturating_add(kv).saturating_add(acts), &what)
    }

    /// The columns `phase` fixes before it is timed.
    fn phase_cols(&self, matmul: &str, phase: &Phase) -> DecodeCols {
        DecodeCols {
            model: self.model.into(),
            weights: self.weights.into(),
            matmul: matmul.into(),
            phase: phase.name.into(),
            batch: phase.batch,
            context: phase.context,
            weight_mb: self.wbytes / 1e6,
            kv_mb: phase.kv_bytes / 1e6,
            bandwidth_gbs: self.bw,
            step_tokens: Some(phase.tokens),
            ..DecodeCols::default()
        }
    }

    /// The row of a phase the memory guard skipped: its columns, no timing.
    pub fn skipped(&self, variant: &str, matmul: &str, phase: &Phase, note: String) -> DecodeRow {
        Row::skipped(
            self.heads.head(variant, self.seed),
            self.phase_cols(matmul, phase),
            note,
        )
    }

    /// The row of `variant` (product `matmul`) for `phase` timed by `t`.
    pub fn row(
        &self,
        variant: &str,
        matmul: &str,
        phase: &Phase,
        t: &Timing,
        err: Option<f64>,
    ) -> DecodeRow {
        let med = t.median();
        let roof = (self.wbytes + phase.kv_bytes) / (self.bw * 1e9);
        let ok = err.is_none_or(|e| e <= 1e-3);
        Row {
            head: Head {
                reps: t.samples.len(),
                median_ms: Some(med * 1e3),
                p10_ms: Some(t.percentile(10.0) * 1e3),
                p90_ms: Some(t.percentile(90.0) * 1e3),
                status: if ok { "ok" } else { "fail" }.into(),
                ..self.heads.head(variant, self.seed)
            },
            cols: DecodeCols {
                tokens_per_s: phase.tokens as f64 / med,
                roofline_ms: roof * 1e3,
                pct_of_roofline: 100.0 * roof / med,
                effective_gbs: (self.wbytes + phase.kv_bytes) / med / 1e9,
                gflops: self.flops_token * phase.tokens as f64 / med / 1e9,
                rel_err_vs_batch1: err,
                ..self.phase_cols(matmul, phase)
            },
            note: String::new(),
        }
    }
}
