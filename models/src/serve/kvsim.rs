//! KV allocation under one fixed budget, simulated step by step without a model (claims C4,
//! C5): every running request stores one more token per step; admission is first come first
//! served while the allocator has room (paged: leaving vLLM's watermark of 1% of the blocks).
//! `Contiguous` reserves prompt + max_new slots per request for its whole life (first fit, as
//! systems before vLLM did); `Paged` allocates blocks as tokens arrive (with prefix sharing
//! optionally) and preempts the latest admitted request by recompute when a block is missing.
//! Reported: concurrency, fragmentation (slots reserved or allocated but holding no token),
//! utilisation of the budget, latency in steps.

use crate::serve::blocks::{BlockManager, ContiguousAllocator};
use crate::serve::workload::Drawn;
use std::collections::VecDeque;

/// Which allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    Contiguous,
    Paged { block_size: usize, sharing: bool },
}

/// Time averages and totals of one simulation.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SimResult {
    pub steps: usize,
    pub mean_running: f64,
    pub max_running: usize,
    /// Mean over steps of (reserved or allocated − filled) / (reserved or allocated), %.
    pub fragmentation_pct: f64,
    /// Mean over steps of filled slots / budget, %.
    pub utilisation_pct: f64,
    /// Mean over steps of tokens held per physical slot filled (1 = no sharing).
    pub sharing_factor: f64,
    pub mean_latency_steps: f64,
    pub p99_latency_steps: f64,
    pub preemptions: usize,
    /// Tokens generated per step.
    pub tokens_per_step: f64,
}

struct Live {
    id: usize,
    /// Prompt + generated so far (what is stored).
    tokens: Vec<u32>,
    left: usize,
}

/// Runs `reqs` (arrival times ignored: all queued at step 0, a saturated server) with
/// `budget` token slots.
pub fn simulate(reqs: &[Drawn], max_new: usize, budget: usize, alloc: Allocator) -> SimResult {
    let mut waiting: VecDeque<Live> = reqs
        .iter()
        .enumerate()
        .map(|(id, d)| Live {
            id,
            tokens: d.prompt.clone(),
            left: d.output,
        })
        .collect();
    let mut contiguous = ContiguousAllocator::new(budget);
    let mut paged = match alloc {
        Allocator::Paged {
            block_size,
            sharing,
        } => Some(BlockManager::new(budget / block_size, block_size, sharing)),
        Allocator::Contiguous => None,
    };
    let mut running: Vec<Live> = vec![];
    let mut out = SimResult::default();
    let mut latency = vec![];
    let (mut frag, mut util, mut share) = (0.0, 0.0, 0.0);
    let mut generated = 0usize;
    while !(waiting.is_empty() && running.is_empty()) {
        // Admission, first come first served.
        while let Some(w) = waiting.front() {
            let ok = match paged.as_mut() {
                None => contiguous.reserve(
                    w.id as u64,
                    reqs[w.id].prompt.len() + max_new,
                    w.tokens.len(),
                ),
                Some(m) => {
                    // vLLM's watermark: keep 1% of the blocks free for running sequences.
                    m.blocks_needed(&w.tokens) + m.total_blocks() / 100 <= m.free_blocks() && {
                        m.allocate(w.id as u64, &w.tokens).expect("checked");
                        m.mark_computed(w.id as u64, w.tokens.len());
                        true
                    }
                }
            };
            if !ok {
                break;
            }
            running.push(waiting.pop_front().expect("front exists"));
        }
        assert!(!running.is_empty(), "a request larger than the budget");
        // One token each; paged preempts the latest admitted when a block is missing.
        let mut i = 0;
        while i < running.len() {
            let token = (running[i].id * 131 + running[i].tokens.len()) as u32;
            let grown = match paged.as_mut() {
                None => {
                    contiguous.grow(running[i].id as u64);
                    true
                }
                Some(m) => m.append(running[i].id as u64, &[token]).is_ok(),
            };
            if grown {
                let r = &mut running[i];
                r.tokens.push(token);
                r.left -= 1;
                generated += 1;
                i += 1;
            } else {
                let victim = running.len() - 1;
                let v = running.remove(victim);
                if let Some(m) = paged.as_mut() {
                    m.free(v.id as u64);
                }
                out.preemptions += 1;
                waiting.push_front(v);
                // retry i (it may have been the victim: then the loop moves on)
            }
        }
        out.steps += 1;
        // Occupancy after this step's tokens.
        let (held, filled, logical) = match paged.as_ref() {
            None => {
                let (reserved, used) = contiguous.usage();
                (reserved, used, used)
            }
            Some(m) => {
                let s = m.stats();
                (s.slots_allocated, s.slots_filled, s.logical_tokens)
            }
        };
        if held > 0 {
            frag += 100.0 * (held - filled) as f64 / held as f64;
            share += logical as f64 / filled.max(1) as f64;
        }
        util += 100.0 * filled as f64 / budget as f64;
        out.mean_running += running.len() as f64;
        out.max_running = out.max_running.max(running.len());
        running.retain(|r| {
            if r.left == 0 {
                latency.push(out.steps as f64);
                match paged.as_mut() {
                    None => contiguous.release(r.id as u64),
                    Some(m) => m.free(r.id as u64),
                }
            }
            r.left > 0
        });
    }
    let steps = out.steps.max(1) as f64;
    out.mean_running /= steps;
    out.fragmentation_pct = frag / steps;
    out.utilisation_pct = util / steps;
    out.sharing_factor = share / steps;
    out.tokens_per_step = generated as f64 / steps;
    latency.sort_by(f64::total_cmp);
    out.mean_latency_steps = latency.iter().sum::<f64>() / latency.len().max(1) as f64;
    out.p99_latency_steps = latency[(latency.len() * 99 / 100).min(latency.len() - 1)];
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::workload::Workload;

    fn workload(system: usize) -> Vec<Drawn> {
        Workload {
            requests: 300,
            prompt_mean: 161.0,
            output_mean: 338.0,
            sigma: 1.0,
            max_new: 1024,
            system_prompt: system,
            max_prompt: 1024,
            rate: 0.0,
            vocab: 32000,
            seed: 5,
        }
        .draw()
    }

    #[test]
    fn paged_holds_more_requests_than_contiguous() {
        let reqs = workload(0);
        let c = simulate(&reqs, 1024, 16384, Allocator::Contiguous);
        let p = simulate(
            &reqs,
            1024,
            16384,
            Allocator::Paged {
                block_size: 16,
                sharing: false,
            },
        );
        assert!(p.mean_running > 1.5 * c.mean_running, "{p:?} vs {c:?}");
        assert!(p.fragmentation_pct < 5.0 && c.fragmentation_pct > 40.0);
        assert!(p.steps < c.steps);
        // Every token of every request was generated in both.
        let total: usize = reqs.iter().map(|d| d.output).sum();
        assert!(((c.tokens_per_step * c.steps as f64) - total as f64).abs() < 0.5);
        assert!(((p.tokens_per_step * p.steps as f64) - total as f64).abs() < 0.5);
    }

    #[test]
    fn sharing_a_system_prompt_packs_more() {
        let reqs = workload(512);
        let run = |sharing| {
            simulate(
                &reqs,
                1024,
                32768,
                Allocator::Paged {
                    block_size: 16,
                    sharing,
                },
            )
        };
        let (with, without) = (run(true), run(false));
        assert!(
            with.sharing_factor > 1.5 && (without.sharing_factor - 1.0).abs() < 1e-9,
            "{with:?} vs {without:?}"
        );
        assert!(
            with.mean_running > 1.5 * without.mean_running,
            "{with:?} vs {without:?}"
        );
    }
}
