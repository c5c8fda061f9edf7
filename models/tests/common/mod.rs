//! What the serving and speculative tests share: an engine run to completion with its
//! invariants checked, and the target's own joint distribution of its first tokens after a
//! prompt, the oracle their chi-square tests compare sampled outputs with.

// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use models::serve::speculate::EngineSpeculation;
use models::{Engine, Llama, Request, Sampler, SchedulerConfig, Session};

/// `reqs` served to completion by an engine over `m` (with `spec`'s speculation, if any):
/// every request finishes and every KV block comes back.
pub fn serve<'m>(
    m: &'m Llama,
    c: SchedulerConfig,
    spec: Option<EngineSpeculation>,
    reqs: &[Request],
) -> Engine<'m> {
    let mut e = Engine::new(m, c).unwrap();
    if let Some(s) = spec {
        e = e.with_speculation(s).unwrap();
    }
    e.submit(reqs.to_vec()).unwrap();
    e.run(|_| {}).unwrap();
    assert_eq!(e.finished.len(), reqs.len());
    assert_eq!(
        e.blocks.free_blocks(),
        c.num_blocks,
        "every block comes back"
    );
    e
}

/// The target's joint p(t1)·p(t2 | t1)·… of its first `tokens` tokens after `prompt`, under
/// `sampler`'s distribution (temperature, top-k, top-p), over vocab^tokens cells (cell = the
/// tokens read as digits base vocab, first token most significant). Prefixes of probability 0
/// are not expanded.
pub fn target_joint(target: &Llama, prompt: &[u32], sampler: &Sampler, tokens: usize) -> Vec<f64> {
    let vocab = target.cfg.vocab;
    let after = |extra: &[u32]| -> Vec<f64> {
        let mut s = Session::new(target, 16, 16).unwrap();
        let mut logits = s.forward(prompt).unwrap();
        for &x in extra {
            logits = s.forward(&[x]).unwrap();
        }
        sampler.probs(&logits).into_iter().map(f64::from).collect()
    };
    let mut expected = vec![0.0f64; vocab.pow(tokens as u32)];
    let mut prefixes = vec![(vec![], 1.0f64)];
    while let Some((prefix, p)) = prefixes.pop() {
        if prefix.len() == tokens {
            expected[prefix.iter().fold(0, |c, &t| c * vocab + t as usize)] = p;
            continue;
        }
        for (x, &px) in after(&prefix).iter().enumerate() {
            if px > 0.0 {
                let mut next = prefix.clone();
                next.push(x as u32);
                prefixes.push((next, p * px));
            }
        }
    }
    expected
}
