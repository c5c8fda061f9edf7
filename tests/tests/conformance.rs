//! The conformance suite (burn's and llama.cpp's `test-backend-ops` idea): what runs is read
//! from the kernel crates' `VARIANTS` tables, never listed here. Every CPU row of the five
//! kernel families (attention, paged, quant, moe, spec) runs through its family's check — the
//! check specs its row names — at every ISA tier this machine has, into NaN-poisoned
//! outputs, against the f64 reference within the dtype's tolerance; a CPU row with no check
//! specs fails the suite unless it is the oracle itself. The attention-shaped rows also run
//! on the family's edge cases (`kernel_attention::cases::edge`: decode, append and prefill;
//! MHA, GQA and MQA; odd lengths; windows and soft-caps) in every storage dtype at every
//! tier, where each must match or say why it does not support the case. Two
//! deliberately broken variants show the same comparison fails when it should.

use harness::checking::CheckOptions;
use harness::registry::{attention_kernel, ATTENTION_TABLES};
use kernel_attention::reference::attention;
use kernel_attention::{AttentionInputs, AttentionKernel, AttentionShape, PreparedAttention};
use kernel_common::inputs::rng;
use kernel_common::Variant;
use kernel_common::{tolerance, Buffer, Cost, DType, Device, ErrorStats, KernelError, Runs};
use kernel_test_support::backends::{Backend, Backends};
use std::collections::{BTreeMap, BTreeSet};

/// The CPU rows of every kernel crate's table: (family whose check runs it, name, whether it
/// names check specs).
fn cpu_rows() -> Vec<(&'static str, &'static str, bool)> {
    fn rows<K: 'static>(
        family: &'static str,
        t: &[Variant<K>],
    ) -> Vec<(&'static str, &'static str, bool)> {
        let mut r = rng(0);
        t.iter()
            .filter(|v| v.device == Runs::Cpu)
            .map(|v| (family, v.name, !(v.checks)(0, &mut r).is_empty()))
            .collect()
    }
    [
        rows("attention", kernel_attention::VARIANTS),
        rows("attention", kernel_paged::VARIANTS),
        rows("quant", kernel_quant::VARIANTS),
        rows("moe", kernel_moe::VARIANTS),
        rows("speculative", kernel_speculative::VARIANTS),
    ]
    .concat()
}

#[test]
fn every_cpu_row_of_every_table_names_what_check_runs_it_as() {
    let unchecked: Vec<&str> = cpu_rows()
        .into_iter()
        .filter(|(_, _, checked)| !checked)
        .map(|(_, name, _)| name)
        .collect();
    // Only the oracle is never compared with itself.
    assert_eq!(unchecked, ["reference"], "CPU rows that check never runs");
    // The tables are what `harness list` prints.
    let listed: BTreeSet<&str> = harness::families::all_variants()
        .iter()
        .map(|v| v.name)
        .collect();
    for (_, name, _) in cpu_rows() {
        assert!(listed.contains(name), "{name} is not listed");
    }
}

/// (family, variant, status) of every row of one `harness check` of all families at `isa`.
fn check_rows(isa: kernel_cpu::Isa, tag: &str) -> Vec<(String, String, String)> {
    let dir = std::env::temp_dir().join(format!("conformance-{}-{tag}", std::process::id()));
    let opts = CheckOptions {
        families: harness::commands::check::default_families(),
        device: Device::Cpu,
        // `harness check --cases 4` (its default seed): its random cases include an f32
        // matrix, the one format `faer` multiplies.
        cases: 4,
        seed: 42,
        dtypes: DType::ALL.to_vec(),
        format: harness::Format::Json,
        results_dir: dir.clone(),
    };
    let code = kernel_cpu::isa::with_isa(isa, || harness::commands::check::run(&opts))
        .expect("a runnable tier")
        .expect("check runs");
    let csv = std::fs::read_dir(dir.join("check"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "csv"))
        .expect("check wrote its rows");
    let mut reader = csv::Reader::from_path(&csv).unwrap();
    let header = reader.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let (f, v, s) = (col("family"), col("variant"), col("status"));
    let rows: Vec<_> = reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            (r[f].to_string(), r[v].to_string(), r[s].to_string())
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        code,
        0,
        "check at {isa} failed: {:?}",
        rows.iter().filter(|r| r.2 == "fail").collect::<Vec<_>>()
    );
    rows
}

#[test]
fn every_table_variant_passes_its_check_at_every_tier() {
    for isa in kernel_cpu::isa::runnable() {
        let rows = check_rows(isa, &isa.to_string());
        assert!(rows.iter().all(|r| r.2 != "fail"), "{isa}");
        for (family, name, checked) in cpu_rows() {
            if !checked {
                continue;
            }
            let passed = rows
                .iter()
                .any(|(f, v, s)| f == family && v.split(':').next() == Some(name) && s == "pass");
            assert!(passed, "{family}/{name} has no passing check row at {isa}");
        }
    }
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
fn every_attention_row_matches_the_reference_or_says_why_not() {
    // The attention family's edge cases (`kernel_attention::cases::edge`) on every CPU
    // backend, each CPU row of the attention and paged tables as its check specs.
    let mut ran: BTreeMap<String, usize> = BTreeMap::new();
    let backends = Backends::cpu();
    for (i, shape) in kernel_attention::cases::edge().iter().enumerate() {
        let specs =
            harness::registry::check_specs(ATTENTION_TABLES, Device::Cpu, i, &mut rng(i as u64));
        for dtype in DType::ALL {
            let inputs = AttentionInputs::random(shape, dtype, 1000 + i as u64);
            let want = attention(shape, &inputs);
            backends.for_each(|backend| {
                let Backend::Cpu(isa) = backend else { return };
                for spec in &specs {
                    let kernel = attention_kernel(spec).unwrap();
                    match run(kernel.as_ref(), shape, &inputs) {
                        Some(got) => {
                            let stats = ErrorStats::compare(&got, &want);
                            assert!(
                                stats.passes(&tolerance(dtype)),
                                "{spec} {isa} {dtype} {}: {stats:?}",
                                shape.label()
                            );
                            *ran.entry(spec.split(':').next().unwrap().to_string())
                                .or_default() += 1;
                        }
                        None => {
                            let why = kernel.supports(shape, dtype, Device::Cpu).unwrap_err();
                            assert!(matches!(why, KernelError::Unsupported(_)), "{spec}: {why}");
                        }
                    }
                }
            });
        }
    }
    // Contiguous rows run everywhere, paged ones on the decode and append cases; every CPU
    // row with check specs ran.
    let tiers = kernel_cpu::isa::runnable().len();
    assert!(ran["naive"] >= tiers * 11 * DType::ALL.len(), "{ran:?}");
    for (family, name, checked) in cpu_rows() {
        if family == "attention" && checked {
            assert!(
                ran.get(name).is_some_and(|&n| n > 0),
                "{name} never ran: {ran:?}"
            );
        }
    }
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
