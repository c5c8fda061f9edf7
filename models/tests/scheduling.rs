//! The scheduling policies behind claims C25 and C26 on a random preset: padded static batches
//! (FIFO and length-sorted buckets) and the prefill-first ablation give every request the
//! tokens it gets alone; padding is counted exactly (a sorted bucket of equal lengths pads
//! nothing, FIFO batches of alternating lengths pad the difference); prefill-first spends a
//! step's budget on a prompt before any decode; the latency objective pauses the long
//! sequence when broken, never when met, changes no output, and refuses bad knobs.

mod common;

use models::serve::scheduler::SloPolicy;
use models::{
    load, BatchingMode, Engine, Llama, LoadOptions, Request, SamplerConfig, SchedulerConfig,
};
use std::collections::BTreeMap;

fn model() -> Llama {
    load(
        "tiny-gqa",
        &LoadOptions {
            attention: "paged".into(),
            ..LoadOptions::default()
        },
    )
    .unwrap()
    .model
}

const GREEDY: SamplerConfig = SamplerConfig {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    seed: 0,
};

/// Requests of the given prompt lengths, all queued at time 0.
fn requests(lengths: &[usize], max_new: usize) -> Vec<Request> {
    lengths
        .iter()
        .enumerate()
        .map(|(id, &n)| Request {
            id: id as u64,
            prompt: (0..n as u32)
                .map(|i| (i * 53 + id as u32 * 17 + 3) % 500)
                .collect(),
            max_new,
            arrival: 0.0,
            sampler: GREEDY,
            eos: None,
        })
        .collect()
}

fn cfg(mode: BatchingMode, max_batch: usize, token_budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        mode,
        max_batch,
        token_budget,
        num_blocks: 256,
        block_size: 16,
        prefix_sharing: false,
    }
}

fn outputs(e: &Engine) -> BTreeMap<u64, Vec<u32>> {
    e.finished
        .iter()
        .map(|f| (f.id, f.generated.clone()))
        .collect()
}

fn serve<'m>(m: &'m Llama, c: SchedulerConfig, reqs: &[Request]) -> Engine<'m> {
    common::serve(m, c, None, reqs)
}

#[test]
fn new_modes_parse_and_keep_every_output() {
    for (text, mode) in [
        ("static-padded", BatchingMode::Padded { sorted: false }),
        ("static-sorted", BatchingMode::Padded { sorted: true }),
        ("continuous-prefill-first", BatchingMode::PrefillFirst),
    ] {
        assert_eq!(text.parse::<BatchingMode>().unwrap(), mode);
    }
    let err = "static-ragged".parse::<BatchingMode>().unwrap_err();
    assert!(err.to_string().contains("static-sorted"), "{err}");
    let m = model();
    let reqs = requests(&[5, 30, 9, 21, 3, 17, 26], 6);
    let want: BTreeMap<u64, Vec<u32>> = reqs
        .iter()
        .map(|r| (r.id, m.greedy(&r.prompt, r.max_new, None).unwrap()))
        .collect();
    for mode in [
        BatchingMode::Padded { sorted: false },
        BatchingMode::Padded { sorted: true },
        BatchingMode::PrefillFirst,
    ] {
        let e = serve(&m, cfg(mode, 3, 64), &reqs);
        assert_eq!(outputs(&e), want, "{mode:?}");
        for f in &e.finished {
            assert_eq!(f.token_times.len(), f.generated.len(), "{mode:?}");
            assert!(f.gaps().all(|g| g > 0.0), "{mode:?}");
        }
    }
}

#[test]
fn padding_is_counted_and_sorted_buckets_avoid_it() {
    let m = model();
    // Alternating lengths: FIFO batches of 4 hold two of each, sorted buckets one length.
    let reqs = requests(&[4, 40, 4, 40, 4, 40, 4, 40], 3);
    let fifo = serve(
        &m,
        cfg(BatchingMode::Padded { sorted: false }, 4, 256),
        &reqs,
    );
    assert_eq!(fifo.padding.prefill, 2 * 2 * 36, "{:?}", fifo.padding);
    let sorted = serve(
        &m,
        cfg(BatchingMode::Padded { sorted: true }, 4, 256),
        &reqs,
    );
    assert_eq!(sorted.padding.prefill, 0, "{:?}", sorted.padding);
    // Every member of a batch runs until the last finishes: equal outputs pad no decode.
    assert_eq!((fifo.padding.decode, sorted.padding.decode), (0, 0));
    // The ragged static batcher pads no prompt.
    let ragged = serve(&m, cfg(BatchingMode::Static, 4, 256), &reqs);
    assert_eq!(ragged.padding.prefill, 0);
}

#[test]
fn prefill_first_spends_the_budget_on_a_prompt_before_decoding() {
    let m = model();
    // The first prompt (8) runs alone: the second (16) does not fit what is left of 16.
    let reqs = requests(&[8, 16], 4);
    let decode_first = serve(
        &m,
        cfg(
            BatchingMode::Continuous {
                chunked_prefill: false,
            },
            4,
            16,
        ),
        &reqs,
    );
    let prefill_first = serve(&m, cfg(BatchingMode::PrefillFirst, 4, 16), &reqs);
    assert_eq!(decode_first.steps[0].tokens, 8);
    assert_eq!(prefill_first.steps[0].tokens, 8);
    // Step 2: decode first runs request 0's token and cannot fit the 16-token prompt;
    // prefill first runs the prompt and leaves no budget for the decode.
    assert_eq!(decode_first.steps[1].tokens, 1);
    assert_eq!(prefill_first.steps[1].tokens, 16);
}

#[test]
fn the_latency_objective_pauses_long_sequences_only_when_broken() {
    let m = model();
    let reqs = requests(&[60, 4, 5, 6, 4], 12);
    let continuous = cfg(
        BatchingMode::Continuous {
            chunked_prefill: false,
        },
        8,
        256,
    );
    let run = |objective_s: f64| {
        let policy = SloPolicy {
            objective_s,
            window: 2,
            factor: 2.0,
        };
        let mut e = Engine::new(&m, continuous)
            .unwrap()
            .with_slo(policy)
            .unwrap();
        e.submit(reqs.clone()).unwrap();
        e.run(|_| {}).unwrap();
        (outputs(&e), e.pauses, e.finished.len())
    };
    let free = serve(&m, continuous, &reqs);
    let (met, met_pauses, n) = run(1e9);
    assert_eq!((met_pauses, n), (0, reqs.len()));
    assert_eq!(met, outputs(&free));
    let (broken, pauses, n) = run(1e-12);
    assert_eq!(n, reqs.len());
    assert!(
        pauses >= 1,
        "the 64-token sequence is > 2x the mean and was not paused"
    );
    assert_eq!(broken, outputs(&free), "pausing changed an output");
    for bad in [
        SloPolicy {
            objective_s: 0.0,
            window: 2,
            factor: 2.0,
        },
        SloPolicy {
            objective_s: 0.1,
            window: 0,
            factor: 2.0,
        },
        SloPolicy {
            objective_s: 0.1,
            window: 2,
            factor: 0.5,
        },
    ] {
        let err = Engine::new(&m, continuous)
            .unwrap()
            .with_slo(bad)
            .err()
            .unwrap();
        assert!(err.to_string().contains("objective"), "{err}");
    }
}
