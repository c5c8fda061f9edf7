//! `harness check`: every variant of a family on random shapes and on the DESIGN.md edge
//! cases (odd lengths 54/97/577, kv_len 1, kv_heads 1 and = q_heads, block size 1, a pool of
//! > 32768 blocks, NaN in unused pool slots; quant, moe and spec cases in `check_quant`,
//! `check_moe`, `check_spec`), outputs NaN-poisoned before each run, compared
//! with the f64 reference under the per-dtype tolerance table; a table on stdout, every row in
//! results/check/<run-id>.csv, exit 1 on any failure.

use crate::error::{HarnessError, Result};
use crate::output::RowWriter;
use crate::{machine, registry, Format};
use attention_kernels::reference::attention;
use attention_kernels::{AttentionInputs, AttentionShape};
use kernel_common::inputs::{derive_seed, rng};
use kernel_common::{tolerance, Buffer, DType, Device, ErrorStats};
use paged_kernels::adapter::build_pool;
use paged_kernels::{pool::gather, PagedCaseSpec, SplitKv};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What `harness check` was asked to do.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    pub families: Vec<String>,
    pub device: Device,
    pub cases: usize,
    pub seed: u64,
    pub dtypes: Vec<DType>,
    pub format: Format,
    pub results_dir: PathBuf,
}

/// One variant on one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckRow {
    pub run_id: String,
    pub family: String,
    pub case: usize,
    pub variant: String,
    pub dtype: String,
    pub shape: String,
    /// pass | fail | unsupported
    pub status: String,
    pub max_abs_err: Option<f64>,
    pub rel_l2_err: Option<f64>,
    pub nmse: Option<f64>,
    pub tol_rel_l2: f64,
    pub tol_max_abs: f64,
    pub seed: u64,
    pub note: String,
    /// The CPU kernels' ISA tier of the run (`--isa`); a quant variant that names its own
    /// (`fused:isa=avx2`) says so in `variant`.
    #[serde(default)]
    pub isa: String,
}

pub(crate) struct Ctx<'a> {
    pub opts: &'a CheckOptions,
    run_id: String,
    writer: RowWriter,
    rows: Vec<CheckRow>,
}

impl Ctx<'_> {
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        family: &str,
        case: usize,
        variant: &str,
        dtype: DType,
        shape: String,
        seed: u64,
        outcome: std::result::Result<ErrorStats, String>,
    ) -> Result<()> {
        self.record_with(
            family,
            case,
            variant,
            dtype,
            tolerance(dtype),
            shape,
            seed,
            outcome,
        )
    }

    /// Records one row judged against `tol`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_with(
        &mut self,
        family: &str,
        case: usize,
        variant: &str,
        dtype: DType,
        tol: kernel_common::Tolerance,
        shape: String,
        seed: u64,
        outcome: std::result::Result<ErrorStats, String>,
    ) -> Result<()> {
        let (status, stats, note) = match outcome {
            Ok(s) if s.passes(&tol) => ("pass", Some(s), String::new()),
            Ok(s) => (
                "fail",
                Some(s),
                if s.non_finite > 0 {
                    format!("{} non-finite outputs", s.non_finite)
                } else {
                    String::new()
                },
            ),
            // A device that failed (launch, fault, compile) is a failure, not a refusal.
            Err(why) if why.starts_with("device error:") => ("fail", None, why),
            Err(why) => ("unsupported", None, why),
        };
        let row = CheckRow {
            run_id: self.run_id.clone(),
            family: family.into(),
            case,
            variant: variant.into(),
            dtype: dtype.to_string(),
            shape,
            status: status.into(),
            max_abs_err: stats.map(|s| s.max_abs),
            rel_l2_err: stats.map(|s| s.rel_l2),
            nmse: stats.map(|s| s.nmse),
            tol_rel_l2: tol.rel_l2,
            tol_max_abs: tol.max_abs,
            seed,
            note,
            isa: crate::machine::isa(),
        };
        self.writer.write(&row)?;
        self.rows.push(row);
        Ok(())
    }
}

/// Runs the check; returns the exit code (1 when any row fails).
pub fn run(opts: &CheckOptions) -> Result<i32> {
    for f in &opts.families {
        if !registry::FAMILIES.contains(&f.as_str()) {
            return Err(HarnessError::Usage(format!(
                "unknown family '{f}' (known: {})",
                registry::FAMILIES.join(", ")
            )));
        }
    }
    if opts.cases == 0 {
        return Err(HarnessError::Usage("--cases must be at least 1".into()));
    }
    let probe = AttentionShape::new(1, 1, 1, 1, 1, 64, true);
    let names = match opts.device {
        Device::Cpu => ["naive", "flash2", "paged"],
        Device::Cuda(_) => ["cuda_naive", "cuda_flash2", "cuda_paged"],
    };
    let kernels: Vec<_> = names
        .iter()
        .map(|v| registry::attention_kernel(v))
        .collect::<Result<_>>()?;
    crate::require_device(
        opts.device,
        kernels
            .iter()
            .map(|k| k.supports(&probe, DType::F32, opts.device)),
    )?;
    let run_id = machine::run_id("check");
    let dir = opts.results_dir.join("check");
    std::fs::create_dir_all(&dir)
        .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
    let writer = RowWriter::create(dir.join(format!("{run_id}.csv")))?;
    let mut ctx = Ctx {
        opts,
        run_id,
        writer,
        rows: vec![],
    };
    for family in &opts.families {
        match family.as_str() {
            "attention" => check_attention(&mut ctx)?,
            "quant" => crate::check_quant::check_quant(&mut ctx)?,
            "moe" if matches!(opts.device, Device::Cuda(_)) => {
                crate::check_cuda::check_moe_cuda(&mut ctx)?
            }
            "moe" => crate::check_moe::check_moe(&mut ctx)?,
            "spec" => crate::check_spec::check_spec(&mut ctx)?,
            _ => check_paged(&mut ctx)?,
        }
    }
    let failed = ctx.rows.iter().filter(|r| r.status == "fail").count();
    match opts.format {
        Format::Table => print_summary(&ctx.rows),
        Format::Json => println!("{}", serde_json::to_string_pretty(&ctx.rows)?),
    }
    eprintln!(
        "{} rows, {failed} failed: {}",
        ctx.rows.len(),
        ctx.writer.path.display()
    );
    Ok(if failed > 0 { 1 } else { 0 })
}

/// Random attention shapes (decode, append, prefill; MHA/GQA/MQA) then the edge cases.
fn attention_cases(cases: usize, seed: u64) -> Vec<AttentionShape> {
    let mut r = rng(seed);
    let mut out = vec![];
    for _ in 0..cases {
        let kv_heads = [1, 2, 4][r.gen_range(0..3)];
        let group = r.gen_range(1..=4);
        let head_dim = [64, 128, r.gen_range(1..=160)][r.gen_range(0..3)];
        let kv_len = r.gen_range(1..=600);
        let (q_len, causal) = match r.gen_range(0..3) {
            0 => (1, true),
            1 => (r.gen_range(1..=kv_len.min(16)), true),
            _ => (kv_len, r.gen_bool(0.5)),
        };
        out.push(AttentionShape::new(
            r.gen_range(1..=3),
            kv_heads * group,
            kv_heads,
            q_len,
            kv_len,
            head_dim,
            causal,
        ));
    }
    out.extend([
        AttentionShape::new(1, 4, 4, 1, 1, 64, true),
        AttentionShape::new(2, 8, 1, 1, 577, 128, true),
        AttentionShape::new(3, 8, 8, 1, 97, 64, true),
        AttentionShape::new(1, 8, 2, 54, 97, 128, true),
        AttentionShape::new(1, 4, 1, 577, 577, 64, true),
        AttentionShape::new(1, 2, 2, 97, 54, 128, false),
    ]);
    out
}

fn check_attention(ctx: &mut Ctx) -> Result<()> {
    let shapes = attention_cases(ctx.opts.cases, ctx.opts.seed);
    for (case, shape) in shapes.iter().enumerate() {
        let seed = derive_seed(ctx.opts.seed, case as u64);
        let mut r = rng(seed);
        let cuda = matches!(ctx.opts.device, Device::Cuda(_));
        let cpu_variants = [
            "naive".to_string(),
            "flash2".to_string(),
            format!(
                "flash2:br={},bc={}",
                r.gen_range(1..=96),
                r.gen_range(1..=96)
            ),
            format!("paged:bs={}", [1, 16, r.gen_range(2..=256)][case % 3]),
            format!(
                "paged:bs={},split={}",
                [16, 1, 32][case % 3],
                ["auto", "64", "7"][case % 3]
            ),
        ];
        // On CUDA the same cases go to the CUDA variants (names prefixed `cuda_`).
        let variants: Vec<String> = if cuda {
            cpu_variants
                .iter()
                .filter(|v| !v.contains("br="))
                .map(|v| format!("cuda_{v}"))
                .chain(["cuda_flash2:pipe=1".to_string()])
                .collect()
        } else {
            cpu_variants.to_vec()
        };
        for &dtype in &ctx.opts.dtypes {
            let inputs = AttentionInputs::random(shape, dtype, seed);
            let want = attention(shape, &inputs);
            for v in &variants {
                let kernel = registry::attention_kernel(v)?;
                let outcome = kernel
                    .supports(shape, dtype, ctx.opts.device)
                    .map_err(|e| e.to_string())
                    .and_then(|_| {
                        let mut out = Buffer::poisoned(dtype, shape.q_elems());
                        kernel
                            .prepare(shape, &inputs)
                            .and_then(|mut p| p.run(&mut out))
                            .map_err(|e| e.to_string())?;
                        Ok(ErrorStats::compare(&out.to_f32(), &want))
                    });
                ctx.record(
                    "attention",
                    case,
                    &kernel.name(),
                    dtype,
                    shape.label(),
                    seed,
                    outcome,
                )?;
            }
        }
    }
    Ok(())
}

/// Random paged batches, then the edge cases, each under every split policy; plus an
/// append round trip (gather(append(x)) == x exactly) per case.
fn paged_cases(cases: usize, seed: u64, dtype: DType) -> Vec<PagedCaseSpec> {
    let mut r = rng(seed ^ 0x9A6E);
    let mut out = vec![];
    for c in 0..cases {
        let seqs = r.gen_range(1..=4);
        out.push(PagedCaseSpec {
            context_lens: (0..seqs).map(|_| r.gen_range(1..=1200)).collect(),
            block_size: [1, 16, 32, 256, r.gen_range(1..=256)][c % 5],
            kv_heads: [1, 2, 4][r.gen_range(0..3)],
            group: r.gen_range(1..=4),
            head_dim: [64, 128, r.gen_range(1..=160)][r.gen_range(0..3)],
            q_len: 1,
            dtype,
            spare_blocks: r.gen_range(0..8),
            seed: derive_seed(seed, c as u64),
        });
        let last = out.last_mut().expect("just pushed");
        last.q_len = r
            .gen_range(1..=4)
            .min(*last.context_lens.iter().min().expect("seqs >= 1"));
    }
    let edge = |lens: Vec<usize>,
                block_size: usize,
                kv_heads: usize,
                group: usize,
                spare_blocks: usize| PagedCaseSpec {
        context_lens: lens,
        block_size,
        kv_heads,
        group,
        head_dim: 128,
        q_len: 1,
        dtype,
        spare_blocks,
        seed: derive_seed(seed, 1 << 20),
    };
    out.push(edge(vec![54, 97, 577], 1, 1, 8, 5));
    out.push(edge(vec![54, 97, 577], 16, 8, 1, 3));
    out.push(edge(vec![577, 1], 256, 2, 4, 1));
    // More than 32768 blocks: sequence blocks land at ids beyond i16/u16 and 2^15 ranges.
    out.push(PagedCaseSpec {
        head_dim: 64,
        ..edge(vec![300, 97], 1, 1, 4, 40_000)
    });
    out
}

fn check_paged(ctx: &mut Ctx) -> Result<()> {
    for &dtype in &ctx.opts.dtypes.clone() {
        for (case, spec) in paged_cases(ctx.opts.cases, ctx.opts.seed, dtype)
            .iter()
            .enumerate()
        {
            let c = spec.build()?;
            let want = c.reference()?;
            let part = 1 + (spec.seed % 300) as usize;
            let cuda = matches!(ctx.opts.device, Device::Cuda(_));
            for split in [SplitKv::Off, SplitKv::Auto, SplitKv::Tokens(part)] {
                let got = if cuda {
                    paged_kernels::cuda::paged_decode_cuda(&c.shape, &c.batch, &c.pool, &c.q, split)
                        .map(|b| b.to_f32())
                } else {
                    c.decode(split)
                };
                let outcome = got
                    .map(|got| ErrorStats::compare(&got, &want))
                    .map_err(|e| e.to_string());
                let prefix = if cuda {
                    "cuda_paged_decode"
                } else {
                    "paged_decode"
                };
                let name = match split {
                    SplitKv::Off => prefix.to_string(),
                    SplitKv::Auto => format!("{prefix}:split=auto"),
                    SplitKv::Tokens(n) => format!("{prefix}:split={n}"),
                };
                ctx.record("paged", case, &name, dtype, c.label(), spec.seed, outcome)?;
            }
            // Append round trip from contiguous K/V through shuffled blocks and back.
            let kv_len = spec.context_lens[0];
            let shape = AttentionShape::new(
                2,
                spec.kv_heads * spec.group,
                spec.kv_heads,
                1,
                kv_len,
                spec.head_dim,
                true,
            );
            let inputs = AttentionInputs::random(&shape, dtype, spec.seed);
            let (pool, batch) = if cuda {
                crate::check_cuda::build_pool_on_device(
                    &shape,
                    &inputs,
                    spec.block_size,
                    spec.seed,
                )?
            } else {
                build_pool(&shape, &inputs, spec.block_size, spec.seed)?
            };
            let per = shape.kv_heads * kv_len * shape.head_dim;
            let mut exact = true;
            for (b, table) in batch.block_tables.iter().enumerate() {
                let (k, v) = gather(&pool, table, kv_len)?;
                exact &= k == inputs.k.slice(b * per, per) && v == inputs.v.slice(b * per, per);
            }
            let stats = ErrorStats {
                max_abs: if exact { 0.0 } else { f64::INFINITY },
                rel_l2: if exact { 0.0 } else { f64::INFINITY },
                nmse: if exact { 0.0 } else { f64::INFINITY },
                non_finite: 0,
                count: 2 * per,
            };
            ctx.record(
                "paged",
                case,
                if cuda {
                    "cuda_append_roundtrip"
                } else {
                    "append_roundtrip"
                },
                dtype,
                format!("kv{kv_len} bs{}", spec.block_size),
                spec.seed,
                Ok(stats),
            )?;
        }
    }
    Ok(())
}

/// Rows, passes, unsupported and worst errors of one (family, variant, dtype) group.
#[derive(Default)]
struct Group {
    rows: usize,
    pass: usize,
    unsupported: usize,
    worst_rel_l2: f64,
    worst_abs: f64,
}

/// One line per (family, variant base name, dtype): cases, passes, worst errors.
fn print_summary(rows: &[CheckRow]) {
    let mut groups: BTreeMap<(String, String, String), Group> = BTreeMap::new();
    for r in rows {
        let base = r.variant.split(':').next().unwrap_or("").to_string();
        let name = if r.variant.contains("split=") {
            format!("{base}+split")
        } else {
            base
        };
        let g = groups
            .entry((r.family.clone(), name, r.dtype.clone()))
            .or_default();
        g.rows += 1;
        match r.status.as_str() {
            "pass" => g.pass += 1,
            "unsupported" => g.unsupported += 1,
            _ => {}
        }
        g.worst_rel_l2 = g.worst_rel_l2.max(r.rel_l2_err.unwrap_or(0.0));
        g.worst_abs = g.worst_abs.max(r.max_abs_err.unwrap_or(0.0));
    }
    println!(
        "{:<10} {:<20} {:<5} {:>5} {:>5} {:>6} {:>6} {:>11} {:>11}",
        "family", "variant", "dtype", "rows", "pass", "FAIL", "unsup", "worst relL2", "worst |err|"
    );
    for ((family, variant, dtype), g) in &groups {
        println!(
            "{family:<10} {variant:<20} {dtype:<5} {:>5} {:>5} {:>6} {:>6} {:>11.2e} {:>11.2e}",
            g.rows,
            g.pass,
            g.rows - g.pass - g.unsupported,
            g.unsupported,
            g.worst_rel_l2,
            g.worst_abs
        );
    }
    for r in rows.iter().filter(|r| r.status == "fail") {
        println!(
            "FAIL {} case {} {} {} {}: rel L2 {:?}, max |err| {:?} {}",
            r.family, r.case, r.variant, r.dtype, r.shape, r.rel_l2_err, r.max_abs_err, r.note
        );
    }
}
