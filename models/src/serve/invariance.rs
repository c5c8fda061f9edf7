//! Batch and thread invariance of a model's logits, the property "Defeating Nondeterminism in
//! LLM Inference" (He et al., Thinking Machines, 2025) asks of a serving engine: a sequence's
//! logits compared bit for bit when it is decoded alone and inside a continuous batch with
//! sequences of other lengths (their prompts prefilled in the same passes, then one token each
//! per step, as the batching engine runs them), and when it is decoded alone on one thread
//! and on several. The tokens are fixed (teacher-forced), so a difference in one step cannot
//! change the next step's input: every step is compared on the same inputs.

use crate::model::forward::SeqChunk;
use crate::model::kv::KvPools;
use crate::model::llama::{argmax, Llama, Result};
use kernel_common::KernelError;

/// One sequence to decode: its prompt (prefilled in one pass) and the tokens fed one per step.
#[derive(Debug, Clone)]
pub struct Script {
    pub prompt: Vec<u32>,
    pub steps: Vec<u32>,
}

/// How far a sequence's logits moved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drift {
    /// Largest |a − b| over every logit of the prompt's last token and of every step.
    pub max_abs: f32,
    /// Logits that differ in any bit.
    pub differing: usize,
    /// Logits compared.
    pub count: usize,
    /// Steps (the prefill counts as one) whose arg-max token differs.
    pub top1_flips: usize,
}

impl Drift {
    /// Every logit the same bits.
    pub fn identical(&self) -> bool {
        self.differing == 0
    }

    fn between(a: &[Vec<f32>], b: &[Vec<f32>]) -> Drift {
        let mut d = Drift {
            max_abs: 0.0,
            differing: 0,
            count: 0,
            top1_flips: 0,
        };
        for (x, y) in a.iter().zip(b) {
            for (&p, &q) in x.iter().zip(y) {
                d.count += 1;
                if p.to_bits() != q.to_bits() {
                    d.differing += 1;
                    d.max_abs = d.max_abs.max((p - q).abs());
                }
            }
            d.top1_flips += usize::from(argmax(x) != argmax(y));
        }
        d
    }
}

/// Decodes `scripts` together, each over its own blocks of one pool: one pass with every
/// prompt, then one pass per step with one token of each. Returns, per sequence, the logits
/// of its prompt's last token and of each step. The scripts must have equally many steps.
pub fn decode_together(
    model: &Llama,
    scripts: &[Script],
    block_size: usize,
) -> Result<Vec<Vec<Vec<f32>>>> {
    let steps = scripts.first().map_or(0, |s| s.steps.len());
    if scripts
        .iter()
        .any(|s| s.steps.len() != steps || s.prompt.is_empty())
    {
        return Err(KernelError::InvalidShape(
            "invariance: every script needs a prompt and the same number of steps".into(),
        ));
    }
    let blocks: Vec<usize> = scripts
        .iter()
        .map(|s| (s.prompt.len() + steps).div_ceil(block_size))
        .collect();
    let mut kv = KvPools::new(model, blocks.iter().sum(), block_size)?;
    let mut tables = vec![];
    let mut next = 0u32;
    for &n in &blocks {
        tables.push((next..next + n as u32).collect::<Vec<u32>>());
        next += n as u32;
    }
    let mut out: Vec<Vec<Vec<f32>>> = vec![vec![]; scripts.len()];
    let prefill: Vec<SeqChunk> = scripts
        .iter()
        .zip(&tables)
        .map(|(s, table)| SeqChunk {
            tokens: &s.prompt,
            start: 0,
            table,
            all_logits: false,
            verify: false,
            tree: None,
        })
        .collect();
    for (o, l) in out.iter_mut().zip(model.forward(&mut kv, &prefill)?) {
        o.push(l);
    }
    for step in 0..steps {
        let chunks: Vec<SeqChunk> = scripts
            .iter()
            .zip(&tables)
            .map(|(s, table)| SeqChunk {
                tokens: &s.steps[step..step + 1],
                start: s.prompt.len() + step,
                table,
                all_logits: false,
                verify: false,
                tree: None,
            })
            .collect();
        for (o, l) in out.iter_mut().zip(model.forward(&mut kv, &chunks)?) {
            o.push(l);
        }
    }
    Ok(out)
}

/// What `check` found for one model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Invariance {
    /// The target alone vs in the middle of a batch with `others`, both on `threads`.
    pub batch: Drift,
    /// The target alone on one thread vs on `threads`.
    pub threads: Drift,
}

/// A rayon pool of `threads`.
fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| KernelError::Unsupported(format!("a pool of {threads}: {e}")))
}

/// Decodes `target` alone and between `others` on a pool of `threads`, and alone on a pool of
/// one thread (three decodes: the alone-on-`threads` one is the baseline of both comparisons).
pub fn check(
    model: &Llama,
    target: &Script,
    others: &[Script],
    threads: usize,
    block_size: usize,
) -> Result<Invariance> {
    let alone = || -> Result<Vec<Vec<f32>>> {
        Ok(decode_together(model, std::slice::from_ref(target), block_size)?.remove(0))
    };
    let mut batch = others.to_vec();
    let at = batch.len() / 2;
    batch.insert(at, target.clone());
    let (many, inside) = pool(threads.max(1))?.install(|| -> Result<_> {
        Ok((
            alone()?,
            decode_together(model, &batch, block_size)?.remove(at),
        ))
    })?;
    let one = pool(1)?.install(alone)?;
    Ok(Invariance {
        batch: Drift::between(&many, &inside),
        threads: Drift::between(&one, &many),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_counts_differing_bits_and_flipped_arg_maxes() {
        let a = vec![vec![1.0f32, 2.0, 3.0], vec![0.5, 0.1, 0.0]];
        let mut b = a.clone();
        assert!(Drift::between(&a, &b).identical());
        b[0][1] = 2.0 + f32::EPSILON * 2.0;
        b[1][1] = 0.7;
        let d = Drift::between(&a, &b);
        assert_eq!((d.differing, d.count, d.top1_flips), (2, 6, 1));
        assert!((d.max_abs - 0.6).abs() < 1e-6);
        // -0.0 and 0.0 differ in a bit.
        b = a.clone();
        b[1][2] = -0.0;
        assert_eq!(Drift::between(&a, &b).differing, 1);
    }
}
