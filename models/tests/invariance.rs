//! Batch and thread invariance on a random preset (`models::serve::invariance`): with paged's
//! default split (partitions by the context length), a fixed partition size
//! (`paged:split=64`), without a split, and with flash2, the int8-activation products give a
//! sequence bit-identical logits alone and inside a batch of other lengths, and on 1 and on
//! 2 threads. `split=auto` (its partitions depend on the thread count) and the f32-activation
//! products are reported, not required, by `harness check --invariance`.

use kernel_quant::{MatVecVariant, WeightFormat};
use models::serve::invariance::{check, Script};
use models::{load, LoadOptions};

fn script(len: usize, steps: usize, seed: u32) -> Script {
    let ids = |n: usize, s: u32| {
        (0..n as u32)
            .map(|i| (i * 7919 + s * 104_729 + 13) % 500)
            .collect()
    };
    Script {
        prompt: ids(len, seed),
        steps: ids(steps, seed + 100),
    }
}

#[test]
fn deterministic_variants_are_batch_and_thread_invariant() {
    let target = script(300, 5, 1);
    let others = [script(5, 5, 2), script(90, 5, 3), script(170, 5, 4)];
    for attention in ["paged", "paged:split=64", "paged:split=off", "flash2"] {
        for matmul in [MatVecVariant::Packed(None), MatVecVariant::FusedQ8(None)] {
            let opts = LoadOptions {
                attention: attention.into(),
                weights: Some(WeightFormat::Q4_0),
                matmul,
                ..LoadOptions::default()
            };
            let m = load("tiny-gqa", &opts).unwrap().model;
            let r = check(&m, &target, &others, 2, 16).unwrap();
            assert!(
                r.batch.identical(),
                "{attention} {matmul:?}: batch {:?}",
                r.batch
            );
            assert!(
                r.threads.identical(),
                "{attention} {matmul:?}: threads {:?}",
                r.threads
            );
            assert_eq!(r.batch.count, 6 * m.cfg.vocab);
        }
    }
}

#[test]
fn the_automatic_split_is_caught_depending_on_the_thread_count() {
    // The check can fail: paged's split=auto cuts a 300-token context differently on 1 and on
    // 2 threads, which moves the last bits.
    let m = load(
        "tiny-gqa",
        &LoadOptions {
            attention: "paged:split=auto".into(),
            ..LoadOptions::default()
        },
    )
    .unwrap()
    .model;
    let r = check(&m, &script(300, 3, 1), &[script(20, 3, 2)], 2, 16).unwrap();
    assert!(!r.threads.identical(), "{:?}", r.threads);
    assert!(r.threads.max_abs < 1e-3, "{:?}", r.threads);
}

#[test]
fn a_verification_pass_gives_each_token_the_bits_of_its_decode_step() {
    // Every logit of a k-token pass whose every logit is read (a draft chain's verification)
    // equals that token's decode step bit for bit, at contexts where the partitions of one
    // multi-token call (cut over the whole chunk's context) would differ from a step's, and
    // past the 16 tokens paged decode takes in one call.
    use models::speculative::cost::ScratchStep;
    use models::Session;
    for attention in ["paged", "paged:split=64"] {
        let opts = LoadOptions {
            attention: attention.into(),
            weights: Some(WeightFormat::Q4_0),
            matmul: MatVecVariant::Packed(None),
            ..LoadOptions::default()
        };
        let m = load("tiny-gqa", &opts).unwrap().model;
        for (context, k) in [(40, 5), (300, 8), (700, 17)] {
            let ids: Vec<u32> = (0..(context + k) as u32)
                .map(|i| (i * 7919 + 13) % 500)
                .collect();
            let mut pass = ScratchStep::new(&m, ids.clone(), context).unwrap();
            let (_, all) = pass.step(k).unwrap();
            let mut s = Session::new(&m, context + k, 16).unwrap();
            s.forward(&ids[..context]).unwrap();
            let v = m.cfg.vocab;
            for (i, &t) in ids[context..].iter().enumerate() {
                let one = s.forward(&[t]).unwrap();
                let got = &all[i * v..(i + 1) * v];
                assert!(
                    one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{attention} context {context}: token {i} of {k} differs from its decode step"
                );
            }
        }
    }
}
