//! Request scheduling over the paged KV cache, policy apart from kernels. Three modes:
//! - continuous batching (Orca, Yu et al., OSDI 2022; vLLM): waiting and running queues, a
//!   per-step token budget, decode first (every running sequence gets its next token), then
//!   prefill fill-in from the waiting queue in arrival order, optionally chunked; requests join
//!   and leave the batch at every step;
//! - static batching: a batch is formed only when nothing runs and runs until its last member
//!   finishes (finished members keep their slot, as a padded batch would);
//! - dynamic batching: static, but a batch starts only when `max_batch` requests wait or the
//!   oldest has waited `window_s`.
//!
//! Admission control checks the KV blocks a prompt needs; when a decode step finds no free
//! block, the most recently admitted sequence is preempted by recompute (its blocks are freed,
//! it returns to the front of the waiting queue with its generated tokens, which are prefilled
//! again on readmission): never an out-of-memory failure. Time is a virtual clock advanced by
//! the measured wall time of each step, so Poisson arrivals need no idle waiting.

use crate::model::forward::SeqChunk;
use crate::model::kv::KvPools;
use crate::model::llama::{Llama, Result};
use crate::serve::blocks::{BlockManager, KvStats};
use crate::serve::sampler::{Sampler, SamplerConfig};
use kernel_common::KernelError;
use std::collections::VecDeque;
use std::time::Instant;

/// How requests are grouped into forward passes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BatchingMode {
    Continuous { chunked_prefill: bool },
    Static,
    Dynamic { window_s: f64 },
}

impl std::str::FromStr for BatchingMode {
    type Err = KernelError;
    /// `continuous`, `continuous-chunked`, `static`, `dynamic:<window ms>`.
    fn from_str(s: &str) -> Result<BatchingMode> {
        Ok(match s {
            "continuous" => BatchingMode::Continuous {
                chunked_prefill: false,
            },
            "continuous-chunked" => BatchingMode::Continuous {
                chunked_prefill: true,
            },
            "static" => BatchingMode::Static,
            _ => match s.strip_prefix("dynamic:").map(str::parse::<f64>) {
                Some(Ok(ms)) if ms.is_finite() && ms >= 0.0 => BatchingMode::Dynamic {
                    window_s: ms / 1e3,
                },
                _ => {
                    return Err(KernelError::Unsupported(format!(
                        "batching mode '{s}' is not continuous, continuous-chunked, static or dynamic:<ms>"
                    )))
                }
            },
        })
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
}

struct Seq {
    req: Request,
    generated: Vec<u32>,
    /// Tokens of prompt ++ generated whose K/V are in the cache.
    computed: usize,
    sampler: Sampler,
    first_token: Option<f64>,
    preemptions: usize,
    /// Finished but kept in a static batch (its slot idles as padding would).
    idle: bool,
}

impl Seq {
    fn tokens(&self) -> Vec<u32> {
        let mut t = self.req.prompt.clone();
        t.extend_from_slice(&self.generated);
        t
    }
    fn len(&self) -> usize {
        self.req.prompt.len() + self.generated.len()
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

/// Runs requests to completion over one model and one KV pool.
pub struct Engine<'m> {
    pub model: &'m Llama,
    pub cfg: SchedulerConfig,
    pub kv: KvPools,
    pub blocks: BlockManager,
    pending: VecDeque<Request>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    pub clock: f64,
    pub finished: Vec<Finished>,
    pub steps: Vec<StepRecord>,
    pub preemptions: usize,
}

impl<'m> Engine<'m> {
    /// An engine with `cfg.num_blocks` KV blocks for `model`.
    pub fn new(model: &'m Llama, cfg: SchedulerConfig) -> Result<Engine<'m>> {
        if cfg.max_batch == 0 || cfg.token_budget == 0 {
            return Err(KernelError::Unsupported(
                "max batch and token budget must be at least 1".into(),
            ));
        }
        Ok(Engine {
            kv: KvPools::new(model, cfg.num_blocks, cfg.block_size)?,
            blocks: BlockManager::new(cfg.num_blocks, cfg.block_size, cfg.prefix_sharing),
            model,
            cfg,
            pending: VecDeque::new(),
            waiting: VecDeque::new(),
            running: vec![],
            clock: 0.0,
            finished: vec![],
            steps: vec![],
            preemptions: 0,
        })
    }

    /// Queues requests (any order; they arrive at their `arrival`). A request that can never
    /// run (too long for the context or for the whole KV pool, bad ids) is an error.
    pub fn submit(&mut self, mut reqs: Vec<Request>) -> Result<()> {
        let cfg = &self.model.cfg;
        for r in &reqs {
            let total = r.prompt.len() + r.max_new;
            if r.prompt.is_empty() || r.max_new == 0 {
                return Err(KernelError::InvalidShape(format!(
                    "request {}: empty prompt or max_new 0",
                    r.id
                )));
            }
            if total > cfg.context {
                return Err(KernelError::InvalidShape(format!(
                    "request {}: {total} tokens exceed the context of {}",
                    r.id, cfg.context
                )));
            }
            if total.div_ceil(self.cfg.block_size) > self.cfg.num_blocks {
                return Err(KernelError::InvalidShape(format!(
                    "request {}: {total} tokens need more than the {} KV blocks of the pool",
                    r.id, self.cfg.num_blocks
                )));
            }
            if let Some(t) = r.prompt.iter().find(|&&t| t as usize >= cfg.vocab) {
                return Err(KernelError::InvalidShape(format!(
                    "request {}: token id {t} is outside the vocabulary of {}",
                    r.id, cfg.vocab
                )));
            }
            Sampler::new(r.sampler)?;
        }
        reqs.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
        self.pending.extend(reqs);
        Ok(())
    }

    /// Whether work remains.
    pub fn busy(&self) -> bool {
        !(self.pending.is_empty() && self.waiting.is_empty() && self.running.is_empty())
    }

    fn arrive(&mut self) {
        while self
            .pending
            .front()
            .is_some_and(|r| r.arrival <= self.clock)
        {
            let req = self.pending.pop_front().expect("checked");
            self.waiting.push_back(Seq {
                sampler: Sampler::new(req.sampler).expect("checked at submit"),
                req,
                generated: vec![],
                computed: 0,
                first_token: None,
                preemptions: 0,
                idle: false,
            });
        }
    }

    /// Runs everything submitted; `on_step` sees each step (progress bars).
    pub fn run(&mut self, mut on_step: impl FnMut(&Engine)) -> Result<()> {
        while self.busy() {
            self.step()?;
            on_step(self);
        }
        Ok(())
    }

    /// Whether `s` has a sampled token whose K/V are not stored yet (its blocks hold all but
    /// the last token); otherwise it is prefilling (its blocks hold all its tokens).
    fn decoding(&self, s: &Seq) -> bool {
        self.blocks
            .seq(s.req.id)
            .expect("a running sequence has blocks")
            .tokens
            .len()
            + 1
            == s.len()
    }

    /// Frees `seq` and puts it back at the front of the waiting queue (recompute later).
    fn preempt(&mut self, i: usize) {
        let mut s = self.running.remove(i);
        self.blocks.free(s.req.id);
        s.computed = 0;
        s.preemptions += 1;
        self.preemptions += 1;
        self.waiting.push_front(s);
    }

    /// Whether a new batch may start now (static and dynamic modes), or when to look again.
    fn batch_gate(&self) -> std::result::Result<(), Option<f64>> {
        match self.cfg.mode {
            BatchingMode::Continuous { .. } => Ok(()),
            _ if !self.running.is_empty() => Err(None),
            BatchingMode::Static => Ok(()),
            BatchingMode::Dynamic { window_s } => {
                let oldest = self.waiting.front().map(|s| s.req.arrival);
                match oldest {
                    Some(t)
                        if self.waiting.len() >= self.cfg.max_batch
                            || self.clock >= t + window_s =>
                    {
                        Ok(())
                    }
                    Some(t) => Err(Some(t + window_s)),
                    None => Err(None),
                }
            }
        }
    }

    /// Decides and runs one step; advances the clock by its measured time (or to the next
    /// arrival when there is nothing to run).
    pub fn step(&mut self) -> Result<()> {
        self.arrive();
        let started = Instant::now();
        // Decode first: every running sequence whose prompt is done gets one token slot.
        let mut budget = self.cfg.token_budget;
        let mut plan: Vec<(usize, usize)> = vec![]; // (running index, tokens to run)
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if !self.decoding(s) || (s.idle && s.len() >= self.model.cfg.context) {
                i += 1; // still prefilling (handled below), or a padding slot at the end
                continue;
            }
            let last = *s.generated.last().expect("a decoding sequence has a token");
            match self.blocks.append(s.req.id, &[last]) {
                Ok(copies) => {
                    for (src, dst) in copies {
                        self.kv.copy_block(src, dst)?;
                    }
                    plan.push((i, 1));
                    budget = budget.saturating_sub(1);
                    i += 1;
                }
                Err(_) if s.idle => i += 1, // padding work stops first, preempting nobody
                Err(_) => {
                    // Preempt the latest admitted sequence not yet planned (this one if none).
                    let victim = (0..self.running.len())
                        .rev()
                        .find(|&j| j != i && !plan.iter().any(|p| p.0 == j))
                        .unwrap_or(i);
                    self.preempt(victim);
                    for p in plan.iter_mut().filter(|p| p.0 > victim) {
                        p.0 -= 1;
                    }
                    if victim < i {
                        i -= 1;
                    }
                }
            }
        }
        // Prefill: unfinished prompts of running sequences, then admissions.
        let chunked = matches!(
            self.cfg.mode,
            BatchingMode::Continuous {
                chunked_prefill: true
            }
        );
        let continuous = matches!(self.cfg.mode, BatchingMode::Continuous { .. });
        let take = |remaining: usize, budget: usize, empty: bool| -> Option<usize> {
            if !continuous || remaining <= budget {
                Some(remaining)
            } else if chunked && budget > 0 {
                Some(budget)
            } else if empty {
                Some(remaining) // a lone prompt over the budget still runs
            } else {
                None
            }
        };
        for (i, s) in self.running.iter().enumerate() {
            if plan.iter().any(|p| p.0 == i) || self.decoding(s) || s.computed >= s.len() {
                continue;
            }
            if let Some(n) = take(s.len() - s.computed, budget, plan.is_empty()) {
                plan.push((i, n));
                budget = budget.saturating_sub(n);
            }
        }
        // Blocks this step fills are shareable at once: the forward pass writes every chunk's
        // K/V of a layer before any chunk's attention reads it.
        for &(i, n) in &plan {
            let s = &self.running[i];
            self.blocks.mark_computed(s.req.id, s.computed + n);
        }
        let mut next_look = None;
        match self.batch_gate() {
            Ok(()) => {
                while self.running.len() < self.cfg.max_batch && (budget > 0 || !continuous) {
                    let Some(s) = self.waiting.front() else { break };
                    let tokens = s.tokens();
                    let Some(n) = take(tokens.len(), budget, plan.is_empty()) else {
                        break;
                    };
                    if self.blocks.blocks_needed(&tokens) > self.blocks.free_blocks() {
                        break;
                    }
                    let mut s = self.waiting.pop_front().expect("checked");
                    let cached = self
                        .blocks
                        .allocate(s.req.id, &tokens)
                        .expect("checked free blocks");
                    s.computed = cached;
                    let n = n.min(tokens.len() - cached);
                    self.blocks.mark_computed(s.req.id, cached + n);
                    self.running.push(s);
                    plan.push((self.running.len() - 1, n));
                    budget = budget.saturating_sub(n);
                }
            }
            Err(t) => next_look = t,
        }
        if plan.is_empty() {
            // Nothing to run: jump to the next arrival or batch deadline.
            let next = self.pending.front().map(|r| r.arrival);
            let t = match (next, next_look) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).ok_or_else(|| {
                    KernelError::Unsupported(
                        "the scheduler is stuck: waiting requests do not fit the KV pool".into(),
                    )
                })?,
            };
            self.clock = self.clock.max(t);
            return Ok(());
        }
        self.execute(&plan, started)
    }

    fn execute(&mut self, plan: &[(usize, usize)], started: Instant) -> Result<()> {
        let tokens: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                s.tokens()[s.computed..s.computed + n].to_vec()
            })
            .collect();
        let tables: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, _)| {
                self.blocks
                    .seq(self.running[i].req.id)
                    .expect("live")
                    .table
                    .clone()
            })
            .collect();
        let chunks: Vec<SeqChunk> = plan
            .iter()
            .zip(&tokens)
            .zip(&tables)
            .map(|((&(i, _), t), table)| SeqChunk {
                tokens: t,
                start: self.running[i].computed,
                table,
                all_logits: false,
                tree: None,
            })
            .collect();
        let logits = self.model.forward(&mut self.kv, &chunks)?;
        let run_tokens: usize = plan.iter().map(|p| p.1).sum();
        let seconds = started.elapsed().as_secs_f64();
        let now = self.clock + seconds;
        let mut done = vec![];
        for (&(i, n), l) in plan.iter().zip(&logits) {
            let s = &mut self.running[i];
            s.computed += n;
            self.blocks.mark_computed(s.req.id, s.computed);
            if s.computed < s.len() {
                continue; // a prompt chunk: no token yet
            }
            let next = s.sampler.sample(l);
            if s.idle {
                s.generated.push(next); // padding work of a static batch, discarded
                continue;
            }
            s.generated.push(next);
            s.first_token.get_or_insert(now);
            let stop = Some(next) == s.req.eos
                || s.generated.len() >= s.req.max_new
                || s.len() >= self.model.cfg.context;
            if stop {
                done.push(i);
            }
        }
        self.clock = now;
        for &i in &done {
            let s = &mut self.running[i];
            self.finished.push(Finished {
                id: s.req.id,
                prompt_len: s.req.prompt.len(),
                generated: s.generated.clone(),
                arrival: s.req.arrival,
                first_token: s.first_token.expect("a token"),
                done: now,
                preemptions: s.preemptions,
            });
            s.idle = true;
        }
        // Continuous: finished sequences leave at once. Static/dynamic: when all are done.
        let continuous = matches!(self.cfg.mode, BatchingMode::Continuous { .. });
        if continuous || self.running.iter().all(|s| s.idle) {
            let blocks = &mut self.blocks;
            self.running.retain(|s| {
                if s.idle {
                    blocks.free(s.req.id);
                }
                !s.idle
            });
        }
        self.steps.push(StepRecord {
            clock: now,
            seconds,
            running: self.running.len(),
            tokens: run_tokens,
            kv: self.blocks.stats(),
        });
        Ok(())
    }
}
