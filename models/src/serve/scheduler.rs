//! Request scheduling over the paged KV cache, policy apart from kernels. The modes:
//! - continuous batching (Orca, Yu et al., OSDI 2022; vLLM): waiting and running queues, a
//!   per-step token budget, decode first (every running sequence gets its next token), then
//!   prefill fill-in from the waiting queue in arrival order, optionally chunked; requests join
//!   and leave the batch at every step; `PrefillFirst` is its ablation (prefill and admissions
//!   take the budget first, decode gets what is left);
//! - static batching: a batch is formed only when nothing runs and runs until its last member
//!   finishes (finished members keep their slot, as a padded batch would);
//! - dynamic batching: static, but a batch starts only when `max_batch` requests wait or the
//!   oldest has waited `window_s`;
//! - padded static batching (C26): static, and every prompt of a batch is padded to the
//!   batch's longest, the padding run through the model as filler sequences of its own (the
//!   compute and KV a padded batch spends, without changing any request's tokens); `sorted`
//!   forms each batch from the length-sorted bucket of waiting requests that holds the oldest
//!   (the seed's length-sorted queue, bucketed so no request waits forever).
//!
//! Admission control checks the KV blocks a prompt needs; when a decode step finds no free
//! block, the most recently admitted sequence is preempted by recompute (its blocks are freed,
//! it returns to the front of the waiting queue with its generated tokens, which are prefilled
//! again on readmission): never an out-of-memory failure. An optional latency objective
//! (`SloPolicy`, C25; seed 003 §4's "紧急抢占机制"): while the p95 of the last steps' times
//! exceeds it, running sequences longer than `factor` × the batch's mean length are paused
//! (they keep their blocks and skip decode) until the p95 is back under the objective. Time is
//! a virtual clock advanced by the measured wall time of each step, so Poisson arrivals need
//! no idle waiting.

use crate::model::forward::SeqChunk;
use crate::model::kv::KvPools;
use crate::model::llama::{Llama, Result};
use crate::serve::blocks::BlockManager;
pub use crate::serve::policy::{
    BatchingMode, Finished, Padding, Request, SchedulerConfig, SloPolicy, StepRecord,
};
use crate::serve::sampler::Sampler;
use crate::serve::speculate::{verify_chain, ChainDrafter, EngineSpecStats, EngineSpeculation};
use kernel_common::KernelError;
use std::collections::VecDeque;
use std::time::Instant;

struct Seq {
    req: Request,
    generated: Vec<u32>,
    /// Tokens of prompt ++ generated whose K/V are in the cache.
    computed: usize,
    sampler: Sampler,
    first_token: Option<f64>,
    token_times: Vec<f64>,
    preemptions: usize,
    /// Finished but kept in a static batch (its slot idles as padding would).
    idle: bool,
    /// Skips decode while the latency objective is broken (keeps its blocks).
    paused: bool,
    /// With speculation: this sequence's drafter (made at its first decode step).
    drafter: Option<Box<dyn ChainDrafter>>,
    /// The draft chain this step runs after the last token (empty: a plain decode).
    draft: Vec<u32>,
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
    /// Appends a generated token at clock `now`; whether the sequence is done (its stop
    /// token, its `max_new`, or a `context`-token model full).
    fn emit(&mut self, next: u32, now: f64, context: usize) -> bool {
        self.generated.push(next);
        self.token_times.push(now);
        self.first_token.get_or_insert(now);
        Some(next) == self.req.eos
            || self.generated.len() >= self.req.max_new
            || self.len() >= context
    }
}

/// A filler sequence of a padded batch: pad tokens prefilled beside a real prompt.
struct Filler {
    id: u64,
    tokens: Vec<u32>,
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
    fillers: Vec<Filler>,
    slo: Option<SloPolicy>,
    /// The step count when paused sequences were last resumed for want of other work.
    slo_resumed_at: Option<usize>,
    pub clock: f64,
    pub finished: Vec<Finished>,
    pub steps: Vec<StepRecord>,
    pub preemptions: usize,
    /// Sequences paused by the latency objective (each pause counted once).
    pub pauses: usize,
    pub padding: Padding,
    spec: Option<EngineSpeculation>,
    /// What speculation did (zero without it).
    pub spec_stats: EngineSpecStats,
}

/// Ids of filler sequences count down from here (request ids are below).
const FILLER_IDS: u64 = u64::MAX / 2;

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
            fillers: vec![],
            slo: None,
            slo_resumed_at: None,
            clock: 0.0,
            finished: vec![],
            steps: vec![],
            preemptions: 0,
            pauses: 0,
            padding: Padding::default(),
            spec: None,
            spec_stats: EngineSpecStats::default(),
        })
    }

    /// Speculative decoding inside the batch: every decoding sequence drafts a chain of up to
    /// `spec.max_draft` tokens, run and verified in the same step (`serve::speculate`).
    pub fn with_speculation(mut self, spec: EngineSpeculation) -> Result<Engine<'m>> {
        if spec.max_draft == 0 {
            return Err(KernelError::Unsupported(
                "speculation needs at least one draft token per step".into(),
            ));
        }
        self.spec = Some(spec);
        Ok(self)
    }

    /// Pauses long sequences while the step latency breaks `policy`'s objective.
    pub fn with_slo(mut self, policy: SloPolicy) -> Result<Engine<'m>> {
        policy.validate()?;
        self.slo = Some(policy);
        Ok(self)
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
            if r.id >= FILLER_IDS {
                return Err(KernelError::InvalidShape(format!(
                    "request {}: ids from {FILLER_IDS} are the scheduler's own",
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
                token_times: vec![],
                preemptions: 0,
                idle: false,
                paused: false,
                drafter: None,
                draft: vec![],
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
        s.paused = false;
        s.preemptions += 1;
        self.preemptions += 1;
        self.waiting.push_front(s);
    }

    /// Whether a new batch may start now (static and dynamic modes), or when to look again.
    fn batch_gate(&self) -> std::result::Result<(), Option<f64>> {
        match self.cfg.mode {
            m if m.continuous() => Ok(()),
            _ if !self.running.is_empty() => Err(None),
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
            _ => Ok(()),
        }
    }

    /// The latency objective: pauses sequences longer than `factor` × the mean length while
    /// the p95 of the last `window` step times is over the objective, resumes them otherwise.
    /// Never pauses every decoding sequence.
    fn apply_slo(&mut self) {
        let Some(p) = self.slo else { return };
        if self.slo_resumed_at == Some(self.steps.len()) {
            return;
        }
        let recent: Vec<f64> = self
            .steps
            .iter()
            .rev()
            .take(p.window)
            .map(|s| s.seconds)
            .collect();
        let broken = recent.len() == p.window && percentile(recent, 0.95) > p.objective_s;
        let live: Vec<usize> = (0..self.running.len())
            .filter(|&i| !self.running[i].idle)
            .collect();
        if !broken || live.is_empty() {
            for s in &mut self.running {
                s.paused = false;
            }
            return;
        }
        let mean =
            live.iter().map(|&i| self.running[i].len()).sum::<usize>() as f64 / live.len() as f64;
        let long: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&i| self.running[i].len() as f64 > p.factor * mean)
            .collect();
        if long.len() == live.len() {
            return;
        }
        for i in long {
            let s = &mut self.running[i];
            if !s.paused {
                s.paused = true;
                self.pauses += 1;
            }
        }
    }

    /// Decode slots: every running sequence whose prompt is done gets one token (with
    /// `capped`, only while the budget lasts). Preempts by recompute when a block is missing.
    fn plan_decode(
        &mut self,
        plan: &mut Vec<(usize, usize)>,
        budget: &mut usize,
        capped: bool,
    ) -> Result<()> {
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if capped && *budget == 0 {
                break;
            }
            if plan.iter().any(|p| p.0 == i)
                || !self.decoding(s)
                || s.paused
                || (s.idle && s.len() >= self.model.cfg.context)
            {
                i += 1; // prefilling (handled apart), paused, or a padding slot at the end
                continue;
            }
            let last = *s.generated.last().expect("a decoding sequence has a token");
            let limit = if capped { *budget - 1 } else { usize::MAX };
            let draft = self.draft(i, limit)?;
            let s = &self.running[i];
            let mut run = vec![last];
            run.extend_from_slice(&draft);
            // A draft that finds no blocks is dropped before anyone is preempted for it.
            let appended = match self.blocks.append(s.req.id, &run) {
                Err(_) if !draft.is_empty() => {
                    self.blocks.append(s.req.id, &[last]).map(|c| (c, 1))
                }
                other => other.map(|c| (c, run.len())),
            };
            match appended {
                Ok((copies, n)) => {
                    for (src, dst) in copies {
                        self.kv.copy_block(src, dst)?;
                    }
                    let s = &mut self.running[i];
                    s.draft = if n > 1 { draft } else { vec![] };
                    plan.push((i, n));
                    *budget = budget.saturating_sub(n);
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
        Ok(())
    }

    /// The draft chain of decoding sequence `i` (at most `limit` tokens; empty without
    /// speculation, for a padding slot, or when nothing can follow within the request).
    fn draft(&mut self, i: usize, limit: usize) -> Result<Vec<u32>> {
        let Some(spec) = &self.spec else {
            return Ok(vec![]);
        };
        let s = &mut self.running[i];
        // The chain's positions stay inside the request's own length (prompt + max_new), so
        // it never needs a block the request was not admitted for.
        let room = s.req.max_new.saturating_sub(s.generated.len() + 1);
        let k = spec.max_draft.min(room).min(limit);
        if s.idle || k == 0 {
            return Ok(vec![]);
        }
        let committed = s.tokens();
        let drafter = s.drafter.get_or_insert_with(|| (spec.new_drafter)());
        drafter.chain(&committed, k)
    }

    /// Tokens of a prompt to run now: all of it outside continuous batching; in it, what the
    /// budget allows (a chunk when chunked, a lone prompt over the budget when nothing else
    /// runs).
    fn take(&self, remaining: usize, budget: usize, empty: bool) -> Option<usize> {
        let chunked = matches!(
            self.cfg.mode,
            BatchingMode::Continuous {
                chunked_prefill: true
            }
        );
        if !self.cfg.mode.continuous() || remaining <= budget {
            Some(remaining)
        } else if chunked && budget > 0 {
            Some(budget)
        } else if empty {
            Some(remaining)
        } else {
            None
        }
    }

    /// Prefill: unfinished prompts of running sequences, then admissions (a padded batch's
    /// with its fillers). Returns when to look again if the batch gate is shut.
    fn plan_prefill(&mut self, plan: &mut Vec<(usize, usize)>, budget: &mut usize) -> Option<f64> {
        for i in 0..self.running.len() {
            let s = &self.running[i];
            if plan.iter().any(|p| p.0 == i) || self.decoding(s) || s.computed >= s.len() {
                continue;
            }
            if let Some(n) = self.take(s.len() - s.computed, *budget, plan.is_empty()) {
                plan.push((i, n));
                *budget = budget.saturating_sub(n);
            }
        }
        // Blocks this step fills are shareable at once: the forward pass writes every chunk's
        // K/V of a layer before any chunk's attention reads it.
        for &(i, n) in plan.iter() {
            let s = &self.running[i];
            self.blocks.mark_computed(s.req.id, s.computed + n);
        }
        if let Err(t) = self.batch_gate() {
            return t;
        }
        let padded = match self.cfg.mode {
            BatchingMode::Padded { sorted } => {
                if sorted {
                    self.bucket_to_front();
                }
                Some(self.padded_batch())
            }
            _ => None,
        };
        let continuous = self.cfg.mode.continuous();
        let mut admitted = 0;
        while self.running.len() < self.cfg.max_batch && (*budget > 0 || !continuous) {
            if padded.is_some_and(|n| admitted == n) {
                break;
            }
            let Some(s) = self.waiting.front() else { break };
            let tokens = s.tokens();
            let Some(n) = self.take(tokens.len(), *budget, plan.is_empty()) else {
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
            *budget = budget.saturating_sub(n);
            admitted += 1;
        }
        if padded.is_some() {
            let batch = &self.running[self.running.len() - admitted..];
            let longest = batch.iter().map(Seq::len).max().unwrap_or(0);
            for s in batch {
                let pad = longest - s.len();
                if pad == 0 {
                    continue;
                }
                let id = FILLER_IDS + self.fillers.len() as u64;
                let vocab = self.model.cfg.vocab as u64;
                let tokens: Vec<u32> = (0..pad as u64).map(|t| ((id + t) % vocab) as u32).collect();
                if self.blocks.allocate(id, &tokens).is_ok() {
                    self.padding.prefill += pad;
                    self.fillers.push(Filler { id, tokens });
                }
            }
        }
        None
    }

    /// How many of the waiting queue's front the next padded batch takes: at most
    /// `max_batch`, as many as fit the pool once each is padded to the longest.
    fn padded_batch(&self) -> usize {
        let mut longest = 0;
        let mut n = 0;
        for s in self.waiting.iter().take(self.cfg.max_batch) {
            let l = longest.max(s.len());
            let blocks = (n + 1) * l.div_ceil(self.cfg.block_size);
            if blocks > self.blocks.free_blocks() {
                break;
            }
            longest = l;
            n += 1;
        }
        n
    }

    /// Length-sorted buckets: the waiting requests sorted by length, cut into buckets of
    /// `max_batch`; the one holding the oldest request moves to the front (oldest first).
    fn bucket_to_front(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let mut order: Vec<usize> = (0..self.waiting.len()).collect();
        order.sort_by_key(|&i| (self.waiting[i].len(), i));
        let pos = order
            .iter()
            .position(|&i| i == 0)
            .expect("the oldest is there");
        let b = self.cfg.max_batch;
        let start = (pos / b) * b;
        let mut bucket: Vec<usize> = order[start..(start + b).min(order.len())].to_vec();
        bucket.sort_unstable();
        let mut rest: VecDeque<Seq> = VecDeque::with_capacity(self.waiting.len());
        let mut front = vec![];
        for (i, s) in self.waiting.drain(..).enumerate() {
            if bucket.binary_search(&i).is_ok() {
                front.push(s);
            } else {
                rest.push_back(s);
            }
        }
        front.extend(rest);
        self.waiting = front.into();
    }

    /// Decides and runs one step; advances the clock by its measured time (or to the next
    /// arrival when there is nothing to run).
    pub fn step(&mut self) -> Result<()> {
        self.arrive();
        self.apply_slo();
        let started = Instant::now();
        let mut budget = self.cfg.token_budget;
        let mut plan: Vec<(usize, usize)> = vec![]; // (running index, tokens to run)
        let next_look = if self.cfg.mode == BatchingMode::PrefillFirst {
            let t = self.plan_prefill(&mut plan, &mut budget);
            self.plan_decode(&mut plan, &mut budget, true)?;
            t
        } else {
            self.plan_decode(&mut plan, &mut budget, false)?;
            self.plan_prefill(&mut plan, &mut budget)
        };
        if plan.is_empty() {
            if self.running.iter().any(|s| s.paused) {
                // Only paused sequences could run: resume them, and pause nobody until a
                // step has run.
                for s in &mut self.running {
                    s.paused = false;
                }
                self.slo_resumed_at = Some(self.steps.len());
                return Ok(());
            }
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
        // A decode slot with a draft runs its last token and the chain.
        let tokens: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                let mut t = s.tokens()[s.computed..s.computed + n - s.draft.len()].to_vec();
                t.extend_from_slice(&s.draft);
                t
            })
            .collect();
        let fillers = std::mem::take(&mut self.fillers);
        let tables: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, _)| self.running[i].req.id)
            .chain(fillers.iter().map(|f| f.id))
            .map(|id| self.blocks.seq(id).expect("live").table.clone())
            .collect();
        let chunks: Vec<SeqChunk> = plan
            .iter()
            .zip(&tokens)
            .map(|(&(i, _), t)| {
                let s = &self.running[i];
                (t.as_slice(), s.computed, !s.draft.is_empty())
            })
            .chain(fillers.iter().map(|f| (f.tokens.as_slice(), 0, false)))
            .zip(&tables)
            .map(|((t, start, all_logits), table)| SeqChunk {
                tokens: t,
                start,
                table,
                all_logits,
                verify: all_logits,
                tree: None,
            })
            .collect();
        let logits = self.model.forward(&mut self.kv, &chunks)?;
        for f in &fillers {
            self.blocks.free(f.id);
        }
        let run_tokens: usize = plan.iter().map(|p| p.1).sum();
        let seconds = started.elapsed().as_secs_f64();
        let now = self.clock + seconds;
        let mut done = vec![];
        let vocab = self.model.cfg.vocab;
        for (&(i, n), l) in plan.iter().zip(&logits) {
            let s = &mut self.running[i];
            if !s.draft.is_empty() {
                let draft = std::mem::take(&mut s.draft);
                let rows: Vec<&[f32]> = l.chunks(vocab).collect();
                let emitted = verify_chain(&mut s.sampler, &rows, &draft);
                self.spec_stats.rounds += 1;
                self.spec_stats.drafted += draft.len();
                self.spec_stats.accepted += emitted.len() - 1;
                // The last token and the first e − 1 emitted ones (accepted drafts) have
                // their K/V in place: the cache holds all but the newest token again.
                let mut emitted_n = 0;
                for &next in &emitted {
                    emitted_n += 1;
                    if s.emit(next, now, self.model.cfg.context) {
                        done.push(i);
                        break;
                    }
                }
                s.computed += emitted_n;
                self.blocks.truncate(s.req.id, s.computed);
                self.blocks.mark_computed(s.req.id, s.computed);
                continue;
            }
            s.computed += n;
            self.blocks.mark_computed(s.req.id, s.computed);
            if s.computed < s.len() {
                continue; // a prompt chunk: no token yet
            }
            let next = s.sampler.sample(l);
            if s.idle {
                s.generated.push(next);
                self.padding.decode += 1; // padding work of a static batch, discarded
                continue;
            }
            if s.emit(next, now, self.model.cfg.context) {
                done.push(i);
            }
        }
        self.clock = now;
        for &i in &done {
            let s = &mut self.running[i];
            // Only a speculating sequence's drafter hears that it finished (the tokens are a
            // copy, made for it alone).
            if s.drafter.is_some() {
                let tokens = s.tokens();
                if let Some(d) = s.drafter.as_mut() {
                    d.finish(&tokens)?;
                }
            }
            self.finished.push(Finished {
                id: s.req.id,
                prompt_len: s.req.prompt.len(),
                generated: s.generated.clone(),
                arrival: s.req.arrival,
                first_token: s.first_token.expect("a token"),
                done: now,
                preemptions: s.preemptions,
                token_times: std::mem::take(&mut s.token_times),
            });
            s.idle = true;
        }
        // Continuous: finished sequences leave at once. Static/dynamic: when all are done.
        if self.cfg.mode.continuous() || self.running.iter().all(|s| s.idle) {
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
            tokens: run_tokens + fillers.iter().map(|f| f.tokens.len()).sum::<usize>(),
            kv: self.blocks.stats(),
        });
        Ok(())
    }
}

/// The `p` quantile of `v` (nearest rank on (n − 1)·p).
fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}
