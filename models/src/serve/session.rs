//! A batch-1 session (the convenience over vLLM-style paged storage for one request): one
//! sequence over its own `KvPools`, blocks 0.. in order, prompt then token by token, for tests
//! and plain generation; `Llama::greedy` on top of it. A model with longrope (Phi-3) is run as
//! transformers' Phi-3 generation runs it: the step whose sequence first passes the original
//! context recomputes the whole sequence (its cached keys were rotated with the short factors,
//! the rest of the run uses the long ones).

use crate::model::forward::SeqChunk;
use crate::model::kv::KvPools;
use crate::model::llama::{argmax, Llama, Result};
use kernel_common::KernelError;

/// One sequence over its own pools (blocks in order): prompt, then token by token.
pub struct Session<'m> {
    pub model: &'m Llama,
    pub kv: KvPools,
    table: Vec<u32>,
    /// Tokens in the cache.
    pub len: usize,
    /// Their ids (a longrope model recomputes them once: `Llama::longrope_original`).
    history: Vec<u32>,
}

impl<'m> Session<'m> {
    /// Room for `capacity` tokens in blocks of `block_size`.
    pub fn new(model: &'m Llama, capacity: usize, block_size: usize) -> Result<Session<'m>> {
        if capacity > model.cfg.context {
            return Err(KernelError::InvalidShape(format!(
                "{capacity} tokens exceed the context of {}",
                model.cfg.context
            )));
        }
        let blocks = capacity.max(1).div_ceil(block_size);
        Ok(Session {
            model,
            kv: KvPools::new(model, blocks, block_size)?,
            table: (0..blocks as u32).collect(),
            len: 0,
            history: vec![],
        })
    }

    /// Runs `tokens` at the end of the context; returns the logits of the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(tokens, false)
    }

    /// Logits of every token of `tokens` (e.g. a whole prompt, to compare with a reference).
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(tokens, true)
    }

    fn run(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        let cap = self.table.len() * self.kv.layout.block_size;
        if self.len + tokens.len() > cap {
            return Err(KernelError::InvalidShape(format!(
                "{} tokens exceed the session's room of {cap}",
                self.len + tokens.len()
            )));
        }
        let crosses = self
            .model
            .longrope_original()
            .is_some_and(|o| self.len > 0 && self.len <= o && self.len + tokens.len() > o);
        // Crossing: the whole sequence again, in the long regime; the logits of its new tokens.
        let earlier = if crosses {
            std::mem::take(&mut self.len)
        } else {
            0
        };
        self.history.extend_from_slice(tokens);
        let chunk = SeqChunk {
            tokens: &self.history[self.len..],
            start: self.len,
            table: &self.table,
            all_logits: all_logits || crosses,
            verify: false,
            tree: None,
        };
        let logits = self.model.forward(&mut self.kv, &[chunk])?;
        self.len = self.history.len();
        let mut logits = logits.into_iter().next().expect("one chunk");
        if crosses {
            let vocab = self.model.cfg.vocab;
            let keep = if all_logits {
                earlier
            } else {
                earlier + tokens.len() - 1
            };
            logits.drain(..keep * vocab);
        }
        Ok(logits)
    }
}

impl Llama {
    /// Greedy continuation of `prompt`: `max_new` tokens, stopping early at `eos` unless None.
    pub fn greedy(&self, prompt: &[u32], max_new: usize, eos: Option<u32>) -> Result<Vec<u32>> {
        self.greedy_with_blocks(prompt, max_new, eos, 16)
    }

    /// `greedy` with KV blocks of `block_size` tokens.
    pub fn greedy_with_blocks(
        &self,
        prompt: &[u32],
        max_new: usize,
        eos: Option<u32>,
        block_size: usize,
    ) -> Result<Vec<u32>> {
        let mut s = Session::new(self, prompt.len() + max_new, block_size)?;
        let mut out = vec![];
        let mut logits = s.forward(prompt)?;
        while out.len() < max_new {
            let next = argmax(&logits);
            out.push(next);
            if Some(next) == eos || out.len() == max_new {
                break;
            }
            logits = s.forward(&[next])?;
        }
        Ok(out)
    }
}
