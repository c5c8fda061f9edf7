//! The scheduler's vocabulary, apart from the engine that runs it (`scheduler.rs`): the
//! batching modes (continuous — Orca, vLLM — and its prefill-first ablation, static, dynamic,
//! padded static in FIFO or length-sorted buckets), the configuration with its latency
//! objective (`SloPolicy`, C25), a request and its finished record with its timings, and the
//! per-step and padding records the serving experiments plot.

use crate::model::llama::Result;
use crate::serve::blocks::KvStats;
use crate::serve::sampler::SamplerConfig;
use kernel_common::KernelError;

/// How requests are grouped into forward passes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BatchingMode {
    Continuous {
        chunked_prefill: bool,
    },
    /// Continuous, unchunked, with prefill before decode in every step.
    PrefillFirst,
    Static,
    Dynamic {
        window_s: f64,
    },
    /// Static batches padded to their longest prompt; `sorted`: length-sorted buckets.
    Padded {
        sorted: bool,
    },
}

impl std::str::FromStr for BatchingMode {
    type Err = KernelError;
    /// `continuous`, `continuous-chunked`, `continuous-prefill-first`, `static`,
    /// `dynamic:<window ms>`, `static-padded`, `static-sorted`.
    fn from_str(s: &str) -> Result<BatchingMode> {
        Ok(match s {
            "continuous" => BatchingMode::Continuous {
                chunked_prefill: false,
            },
            "continuous-chunked" => BatchingMode::Continuous {
                chunked_prefill: true,
            },
            "continuous-prefill-first" => BatchingMode::PrefillFirst,
            "static" => BatchingMode::Static,
            "static-padded" => BatchingMode::Padded { sorted: false },
            "static-sorted" => BatchingMode::Padded { sorted: true },
            _ => match s.strip_prefix("dynamic:").map(str::parse::<f64>) {
                Some(Ok(ms)) if ms.is_finite() && ms >= 0.0 => BatchingMode::Dynamic {
                    window_s: ms / 1e3,
                },
                _ => {
                    return Err(KernelError::Unsupported(format!(
                        "batching mode '{s}' is not continuous, continuous-chunked, \
                         continuous-prefill-first, static, dynamic:<ms>, static-padded or static-sorted"
                    )))
                }
            },
        })
    }
}

impl BatchingMode {
    /// Requests join and leave the batch at every step.
    pub(crate) fn continuous(self) -> bool {
        matches!(
            self,
            BatchingMode::Continuous { .. } | BatchingMode::PrefillFirst
        )
    }
}

/// The scheduler's knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    pub mode: BatchingMode,
    /// Sequences in one batch at most.
    pub max_batch: usize,
    /// Tokens one step may run (decode tokens + prefill tokens), continuous mode.
    pub token_budget: usize,
    /// KV blocks and their size.
    pub num_blocks: usize,
    pub block_size: usize,
    pub prefix_sharing: bool,
}

/// Pausing long sequences while the step latency breaks its objective (C25).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SloPolicy {
    /// The objective on the p95 of step times, seconds (every running sequence waits one
    /// step per token, so a step time is the inter-token latency it sees).
    pub objective_s: f64,
    /// Steps the p95 is taken over.
    pub window: usize,
    /// A sequence longer than this × the running batch's mean length is paused.
    pub factor: f64,
}

impl SloPolicy {
    /// Checks the knobs; one line.
    pub fn validate(&self) -> Result<()> {
        if !(self.objective_s > 0.0 && self.objective_s.is_finite())
            || self.window == 0
            || !(self.factor >= 1.0 && self.factor.is_finite())
        {
            return Err(KernelError::Unsupported(format!(
                "latency objective {} s over {} steps with factor {}: the objective must be > 0, the window ≥ 1 step, the factor ≥ 1",
                self.objective_s, self.window, self.factor
            )));
        }
        Ok(())
    }
}

/// One request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub max_new: usize,
    /// Seconds on the virtual clock.
    pub arrival: f64,
    pub sampler: SamplerConfig,
    pub eos: Option<u32>,
}

/// A finished request and its timings (seconds on the virtual clock).
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub id: u64,
    pub prompt_len: usize,
    pub generated: Vec<u32>,
    pub arrival: f64,
    pub first_token: f64,
    pub done: f64,
    pub preemptions: usize,
    /// The clock when each generated token came out.
    pub token_times: Vec<f64>,
}

impl Finished {
    /// Time to first token.
    pub fn ttft(&self) -> f64 {
        self.first_token - self.arrival
    }
    /// Time per output token after the first (None for one token).
    pub fn tpot(&self) -> Option<f64> {
        (self.generated.len() > 1)
            .then(|| (self.done - self.first_token) / (self.generated.len() - 1) as f64)
    }
    /// The gaps between successive tokens (inter-token latencies).
    pub fn gaps(&self) -> impl Iterator<Item = f64> + '_ {
        self.token_times.windows(2).map(|w| w[1] - w[0])
    }
}

/// Per-step record for utilisation plots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRecord {
    pub clock: f64,
    pub seconds: f64,
    pub running: usize,
    pub tokens: usize,
    pub kv: KvStats,
}

/// Tokens a step runs that no request asked for: prompt padding and the decode slots of
/// finished members of a static batch.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Padding {
    pub prefill: usize,
    pub decode: usize,
}
