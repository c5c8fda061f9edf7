//! The conformance suite (burn's idea): every variant the harness registry knows runs on one
//! shared list of problems — decode, append and prefill; MHA, GQA and MQA; odd lengths; every
//! storage dtype — into NaN-poisoned outputs, and must match the f64 reference within the
//! dtype's tolerance or say why it does not support the case. Two deliberately broken
//! variants show the same comparison fails when it should.

use attention_kernels::reference::attention;
use attention_kernels::{AttentionInputs, AttentionKernel, AttentionShape, PreparedAttention};
use harness::registry::attention_kernel;
use kernel_common::{tolerance, Buffer, Cost, DType, Device, ErrorStats, KernelError};

const VARIANTS: &[&str] = &[
    "reference",
    "naive",
    "flash2",
    "flash2:br=7,bc=13",
    "paged:bs=1",
    "paged:bs=16",
    "paged:bs=256",
    "paged:bs=16,split=auto",
    "paged:bs=32,split=40",
];

fn problems() -> Vec<AttentionShape> {
    vec![
        AttentionShape::new(3, 8, 8, 1, 97, 64, true), // decode, MHA
        AttentionShape::new(2, 8, 2, 1, 577, 128, true), // decode, GQA
        AttentionShape::new(2, 8, 1, 1, 54, 128, true), // decode, MQA
        AttentionShape::new(1, 4, 2, 5, 1, 64, false), // kv_len 1 (cross attention)
        AttentionShape::new(2, 4, 1, 16, 300, 64, true), // append
        AttentionShape::new(1, 6, 3, 97, 97, 128, true), // prefill
        AttentionShape::new(1, 2, 2, 54, 54, 80, false), // prefill, non-causal, odd head_dim
    ]
}

/// Runs `kernel` into a poisoned output; `None` when it does not support the case.
fn run(
    kernel: &dyn AttentionKernel,
    shape: &AttentionShape,
    inputs: &AttentionInputs,
) -> Option<Vec<f32>> {
    kernel.supports(shape, inputs.dtype(), Device::Cpu).ok()?;
    let mut out = Buffer::poisoned(inputs.dtype(), shape.q_elems());
    kernel
        .prepare(shape, inputs)
        .unwrap()
        .run(&mut out)
        .unwrap();
    Some(out.to_f32())
}

#[test]
fn every_variant_matches_the_reference_or_says_why_not() {
    let mut ran = 0;
    for (i, shape) in problems().iter().enumerate() {
        for dtype in DType::ALL {
            let inputs = AttentionInputs::random(shape, dtype, 1000 + i as u64);
            let want = attention(shape, &inputs);
            for spec in VARIANTS {
                let kernel = attention_kernel(spec).unwrap();
                match run(kernel.as_ref(), shape, &inputs) {
                    Some(got) => {
                        let stats = ErrorStats::compare(&got, &want);
                        assert!(
                            stats.passes(&tolerance(dtype)),
                            "{spec} {dtype} {}: {stats:?}",
                            shape.label()
                        );
                        ran += 1;
                    }
                    None => {
                        let why = kernel.supports(shape, dtype, Device::Cpu).unwrap_err();
                        assert!(matches!(why, KernelError::Unsupported(_)), "{spec}: {why}");
                    }
                }
            }
        }
    }
    // Contiguous variants run everywhere; paged ones on the decode/append problems.
    assert!(ran >= 3 * 7 * 4 + 3 * 5 * 4, "only {ran} variant runs");
}

/// flash2 with one defect injected after it runs.
struct Broken {
    defect: fn(&mut [f32]),
}

struct BrokenRun<'a> {
    inner: Box<dyn PreparedAttention + 'a>,
    defect: fn(&mut [f32]),
}

impl PreparedAttention for BrokenRun<'_> {
    fn run(&mut self, out: &mut Buffer) -> kernel_common::error::Result<()> {
        self.inner.run(out)?;
        let Buffer::F32(o) = out else {
            unreachable!("the test uses f32")
        };
        (self.defect)(o);
        Ok(())
    }
}

impl AttentionKernel for Broken {
    fn name(&self) -> String {
        "broken".into()
    }
    fn supports(
        &self,
        _: &AttentionShape,
        _: DType,
        _: Device,
    ) -> kernel_common::error::Result<()> {
        Ok(())
    }
    fn cost(&self, shape: &AttentionShape, dtype: DType) -> Cost {
        shape.io_cost(dtype)
    }
    fn prepare<'a>(
        &'a self,
        shape: &AttentionShape,
        inputs: &'a AttentionInputs,
    ) -> kernel_common::error::Result<Box<dyn PreparedAttention + 'a>> {
        let flash2: &'static dyn AttentionKernel = Box::leak(attention_kernel("flash2").unwrap());
        Ok(Box::new(BrokenRun {
            inner: flash2.prepare(shape, inputs)?,
            defect: self.defect,
        }))
    }
}

#[test]
fn the_comparison_catches_broken_variants() {
    let shape = AttentionShape::new(1, 4, 2, 33, 33, 64, true);
    let inputs = AttentionInputs::random(&shape, DType::F32, 7);
    let want = attention(&shape, &inputs);
    let tol = tolerance(DType::F32);
    // A variant that leaves its last element unwritten (still NaN from the poison).
    let unwritten = Broken {
        defect: |o| *o.last_mut().unwrap() = f32::NAN,
    };
    // A variant that is off by 1e-4 relative everywhere: above the f32 tolerance.
    let scaled = Broken {
        defect: |o| o.iter_mut().for_each(|x| *x *= 1.0001),
    };
    for broken in [unwritten, scaled] {
        let got = run(&broken, &shape, &inputs).unwrap();
        assert!(!ErrorStats::compare(&got, &want).passes(&tol));
    }
    // And the unbroken variant passes on the same inputs.
    let good = run(
        attention_kernel("flash2").unwrap().as_ref(),
        &shape,
        &inputs,
    )
    .unwrap();
    assert!(ErrorStats::compare(&good, &want).passes(&tol));
}
