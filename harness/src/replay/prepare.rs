//! Building the runnable jobs of a case file, one family at a time: shapes and metadata
//! checked (one-line errors naming the file), the f64 reference computed, and one `Job` per
//! variant that supports the case (or the reason it does not).

use super::{Expect, Job, Output, Prepared, Run};
use crate::case_file::{float_dtype, CaseFile, Tensor};
use crate::error::Result;
use crate::registry;
use attention_kernels::{AttentionInputs, AttentionShape};
use kernel_common::{tolerance, DType, Device};
use moe_kernels::{Capacity, DropPolicy, MoeConfig, MoeWeights, WeightNorm};
use paged_kernels::{KvPool, PagedBatch, PagedDecodeShape, PoolLayout, SplitKv};
use quant_kernels::{MatVecVariant, QuantMatrix, WeightFormat};
use std::sync::Arc;

/// Whether `name` (a variant spec) is asked for: all when the list is empty, else by its base
/// name or its full spec.
fn wanted(asked: &[String], name: &str) -> bool {
    asked.is_empty()
        || asked
            .iter()
            .any(|a| a == name || a.split(':').next() == name.split(':').next())
}

/// The jobs of `case`, restricted to the `asked` variants (all when empty).
pub(super) fn prepare(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
    match case.family.as_str() {
        "attention" => prepare_attention(case, asked),
        "paged" => prepare_paged(case, asked),
        "moe" => prepare_moe(case, asked),
        _ => prepare_quant(case, asked),
    }
}

/// The storage dtype shared by `tensors`, or a one-line error.
fn common_dtype(case: &CaseFile, tensors: &[(&str, &Tensor)]) -> Result<DType> {
    let mut dt = None;
    for (name, t) in tensors {
        let d = float_dtype(t).ok_or_else(|| {
            case.error(format!(
                "tensor '{name}' must be F32, F16 or BF16, not {:?}",
                t.dtype
            ))
        })?;
        match dt {
            None => dt = Some(d),
            Some(prev) if prev != d => {
                return Err(case.error(format!(
                    "tensor '{name}' is {d} but the others are {prev}: one storage dtype per case"
                )))
            }
            _ => {}
        }
    }
    Ok(dt.expect("at least one tensor"))
}

fn stored_floats(case: &CaseFile, want_shape: &[usize]) -> Result<Option<Output>> {
    match case.optional("out", &[want_shape.len()])? {
        None => Ok(None),
        Some(t) if t.shape != want_shape => Err(case.error(format!(
            "tensor 'out' has shape {:?}, expected {want_shape:?}",
            t.shape
        ))),
        Some(t) => Ok(Some(Output::Floats(case.buffer("out", t)?.to_f32()))),
    }
}

fn prepare_attention(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
    let (q, k, v) = (
        case.tensor("q", &[4])?,
        case.tensor("k", &[4])?,
        case.tensor("v", &[4])?,
    );
    let dtype = common_dtype(case, &[("q", q), ("k", k), ("v", v)])?;
    let [b, hq, lq, d] = q.shape[..] else {
        unreachable!("rank checked")
    };
    let [bk, hkv, lkv, dk] = k.shape[..] else {
        unreachable!("rank checked")
    };
    if v.shape != k.shape || bk != b || dk != d {
        return Err(case.error(format!(
            "shapes do not fit: q {:?}, k {:?}, v {:?} (want q [B,Hq,Lq,D], k = v [B,Hkv,Lkv,D])",
            q.shape, k.shape, v.shape
        )));
    }
    let mut shape = AttentionShape::new(b, hq, hkv, lq, lkv, d, case.flag("causal", false)?);
    if let Some(s) = case.positive("scale")? {
        shape.scale = s;
    }
    shape.validate().map_err(|e| case.error(e))?;
    let inputs = Arc::new(AttentionInputs {
        q: case.buffer("q", q)?,
        k: case.buffer("k", k)?,
        v: case.buffer("v", v)?,
    });
    let expect = Arc::new(Expect {
        tol: tolerance(dtype),
        reference: Some(attention_kernels::reference::attention(&shape, &inputs)),
        stored: stored_floats(case, &q.shape)?,
    });
    let mut runs = vec![];
    for (family, name, _) in registry::all_variants() {
        if !matches!(family, "attention" | "paged") || name == "reference" || !wanted(asked, name) {
            continue;
        }
        let spec = asked
            .iter()
            .find(|a| a.split(':').next() == Some(name))
            .cloned()
            .unwrap_or_else(|| name.to_string());
        let kernel = registry::attention_kernel(&spec)?;
        let job = match kernel.supports(&shape, dtype, Device::Cpu) {
            Err(e) => Err(e.to_string()),
            Ok(()) => Ok(Job::Attention {
                kernel,
                shape,
                inputs: inputs.clone(),
                dtype,
            }),
        };
        let name = match &job {
            Ok(Job::Attention { kernel, .. }) => kernel.name(),
            _ => spec,
        };
        runs.push(Run {
            name,
            job,
            expect: expect.clone(),
        });
    }
    Ok(Prepared {
        label: format!("{} {dtype}", shape.label()),
        runs,
    })
}

fn prepare_paged(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
    let q = case.tensor("q", &[3, 4])?;
    let (kc, vc) = (case.tensor("k_cache", &[4])?, case.tensor("v_cache", &[4])?);
    let (bt, cl) = (
        case.tensor("block_tables", &[2])?,
        case.tensor("context_lens", &[1])?,
    );
    let dtype = common_dtype(case, &[("q", q), ("k_cache", kc), ("v_cache", vc)])?;
    let [blocks, hkv, bs, d] = kc.shape[..] else {
        unreachable!("rank checked")
    };
    let (seqs, hq, q_len, dq) = match q.shape[..] {
        [s, h, dq] => (s, h, 1, dq),
        [s, h, l, dq] => (s, h, l, dq),
        _ => unreachable!("rank checked"),
    };
    if vc.shape != kc.shape || dq != d || bt.shape[0] != seqs || cl.shape[0] != seqs {
        return Err(case.error(format!(
            "shapes do not fit: q {:?}, k_cache {:?}, v_cache {:?}, block_tables {:?}, context_lens {:?} (want q [S,Hq,D] or [S,Hq,L,D], caches [blocks,Hkv,block_size,D], tables [S,max_blocks], lens [S])",
            q.shape, kc.shape, vc.shape, bt.shape, cl.shape
        )));
    }
    let layout = PoolLayout {
        num_blocks: blocks,
        block_size: bs,
        kv_heads: hkv,
        head_dim: d,
    };
    layout.validate().map_err(|e| case.error(e))?;
    let lens = case.ints("context_lens", cl)?;
    let table_ints = case.ints("block_tables", bt)?;
    let width = bt.shape[1];
    let mut context_lens = vec![];
    let mut block_tables = vec![];
    for (s, &len) in lens.iter().enumerate() {
        if len < 1 {
            return Err(case.error(format!("context_lens[{s}] = {len}: must be ≥ 1")));
        }
        let need = layout.blocks_for(len as usize);
        if need > width {
            return Err(case.error(format!(
                "sequence {s} has {len} tokens = {need} blocks but block_tables has {width} columns"
            )));
        }
        let row = &table_ints[s * width..s * width + need];
        if let Some(&bad) = row.iter().find(|&&id| id < 0 || id as usize >= blocks) {
            return Err(case.error(format!(
                "block_tables[{s}] names block {bad}, outside the pool of {blocks}"
            )));
        }
        context_lens.push(len as usize);
        block_tables.push(row.iter().map(|&id| id as u32).collect::<Vec<u32>>());
    }
    let batch = PagedBatch {
        context_lens,
        block_tables,
    };
    let mut shape = PagedDecodeShape {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        q_len,
        scale: 1.0 / (d as f32).sqrt(),
    };
    if let Some(s) = case.positive("scale")? {
        shape.scale = s;
    }
    shape.validate(&layout, &batch).map_err(|e| case.error(e))?;
    let pool = KvPool {
        layout,
        k: case.buffer("k_cache", kc)?,
        v: case.buffer("v_cache", vc)?,
    };
    let qb = case.buffer("q", q)?;
    let expect = Arc::new(Expect {
        tol: tolerance(dtype),
        reference: Some(
            paged_kernels::reference::paged_reference(&shape, &batch, &pool, &qb)
                .map_err(|e| case.error(e))?,
        ),
        stored: stored_floats(case, &q.shape)?,
    });
    let (pool, batch, qb) = (Arc::new(pool), Arc::new(batch), Arc::new(qb));
    let mut runs = vec![];
    for (name, split) in [("paged", SplitKv::Off), ("paged:split=auto", SplitKv::Auto)] {
        if !wanted(asked, name) {
            continue;
        }
        runs.push(Run {
            name: name.into(),
            job: Ok(Job::Paged {
                shape,
                batch: batch.clone(),
                pool: pool.clone(),
                q: qb.clone(),
                split,
                dtype,
            }),
            expect: expect.clone(),
        });
    }
    Ok(Prepared {
        label: format!("seqs{lens:?} bs{bs} h{hq}/{hkv} q{q_len} d{d} {dtype}"),
        runs,
    })
}

fn prepare_quant(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
    let format_name = case
        .meta
        .get("format")
        .ok_or_else(|| case.error("a quant case needs metadata \"format\" (e.g. q4_0, sym4g32)"))?;
    let format = WeightFormat::parse(format_name).map_err(|e| case.error(e))?;
    let x = case.tensor("x", &[2])?;
    if x.dtype != safetensors::Dtype::F32 {
        return Err(case.error(format!("tensor 'x' must be F32, not {:?}", x.dtype)));
    }
    let (rows, cols) = (x.shape[0], x.shape[1]);
    format.validate(cols).map_err(|e| case.error(e))?;
    let xs = case.buffer("x", x)?.to_f32();
    let stored_q = match case.optional("q", &[1, 2])? {
        None => None,
        Some(t) if t.dtype != safetensors::Dtype::U8 => {
            return Err(case.error(format!("tensor 'q' must be U8, not {:?}", t.dtype)))
        }
        Some(t) => Some(
            QuantMatrix::from_bytes(format, rows, cols, t.data.clone())
                .map_err(|e| case.error(e))?,
        ),
    };
    let out = case.optional("out", &[2])?;
    if let Some(t) = out {
        if t.shape != x.shape {
            return Err(case.error(format!(
                "tensor 'out' has shape {:?}, expected {:?} (the dequantised x)",
                t.shape, x.shape
            )));
        }
    }
    let act = case.optional("act", &[2])?;
    let y = case.optional("y", &[2])?;
    let label = format!("{rows}x{cols} {format}");
    let mut runs = vec![];
    // The codec: quantise (bytes compared exactly) and dequantise (floats).
    if let Some(want) = &stored_q {
        if wanted(asked, "quantize") {
            runs.push(Run {
                name: "quantize".into(),
                job: Ok(Job::Quantize {
                    format,
                    rows,
                    cols,
                    x: Arc::new(xs.clone()),
                }),
                expect: Arc::new(Expect {
                    tol: tolerance(DType::F32),
                    reference: None,
                    stored: Some(Output::Bytes(want.bytes().to_vec())),
                }),
            });
        }
        if let (Some(t), true) = (out, wanted(asked, "dequantize")) {
            runs.push(Run {
                name: "dequantize".into(),
                job: Ok(Job::Dequantize(Arc::new(want.clone()))),
                expect: Arc::new(Expect {
                    tol: tolerance(DType::F32),
                    reference: None,
                    stored: Some(Output::Floats(case.buffer("out", t)?.to_f32())),
                }),
            });
        }
    }
    // Products, when the file carries activations: W is the stored bytes (else ours).
    if let Some(a) = act {
        if a.dtype != safetensors::Dtype::F32 || a.shape[1] != cols {
            return Err(case.error(format!(
                "tensor 'act' must be F32 [batch, {cols}], got {:?} {:?}",
                a.dtype, a.shape
            )));
        }
        let batch = a.shape[0];
        let w = match &stored_q {
            Some(m) => m.clone(),
            None => QuantMatrix::quantize(format, rows, cols, &xs).map_err(|e| case.error(e))?,
        };
        let w = Arc::new(w);
        let av = Arc::new(case.buffer("act", a)?.to_f32());
        let stored = match y {
            Some(t) if t.shape != [batch, rows] => {
                return Err(case.error(format!(
                    "tensor 'y' has shape {:?}, expected [{batch}, {rows}]",
                    t.shape
                )))
            }
            Some(t) => Some(Output::Floats(case.buffer("y", t)?.to_f32())),
            None => None,
        };
        let expect_for = |variant: MatVecVariant, stored: Option<Output>| {
            let seen = quant_kernels::activation_as_seen(variant, &av, cols);
            let reference = quant_kernels::reference::matmul(&w, &seen, batch);
            Arc::new(Expect {
                tol: tolerance(DType::F32).scaled_to(&reference),
                reference: Some(reference),
                stored,
            })
        };
        let expect = expect_for(MatVecVariant::Dequant, stored);
        for (name, _) in quant_kernels::VARIANTS {
            if !wanted(asked, name) {
                continue;
            }
            let spec = asked
                .iter()
                .find(|s| s.split(':').next() == Some(name))
                .cloned()
                .unwrap_or_else(|| name.to_string());
            let (vname, variant) = registry::quant_variant(&spec)?;
            let job = quant_kernels::supports(variant, format)
                .map(|()| Job::Product {
                    w: w.clone(),
                    act: av.clone(),
                    batch,
                    variant,
                })
                .map_err(|e| e.to_string());
            // act=q8 is judged against the product with its quantised activation; against the
            // stored y (a product with x itself) it is expected to differ by that error.
            let expect = if matches!(variant, MatVecVariant::FusedQ8(_)) {
                expect_for(variant, None)
            } else {
                expect.clone()
            };
            runs.push(Run {
                name: format!("{vname} (b{batch})"),
                job,
                expect,
            });
        }
    }
    if runs.is_empty() {
        return Err(case.error(
            "nothing to replay: a quant case needs q (packed bytes) or act (activations), and --variant must name one of its variants",
        ));
    }
    Ok(Prepared { label, runs })
}

/// f32 values of a float tensor that must be F32.
fn f32_tensor(case: &CaseFile, name: &str, t: &Tensor) -> Result<Vec<f32>> {
    if t.dtype != safetensors::Dtype::F32 {
        return Err(case.error(format!("tensor '{name}' must be F32, not {:?}", t.dtype)));
    }
    Ok(case.buffer(name, t)?.to_f32())
}

fn prepare_moe(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
    let x = case.tensor("x", &[2])?;
    let router = case.tensor("router", &[2])?;
    let (wg, wu, wd) = (
        case.tensor("w_gate", &[3])?,
        case.tensor("w_up", &[3])?,
        case.tensor("w_down", &[3])?,
    );
    let (tokens, d_model) = (x.shape[0], x.shape[1]);
    let experts = router.shape[1];
    let d_ff = wg.shape[2];
    if router.shape[0] != d_model
        || wg.shape != [experts, d_model, d_ff]
        || wu.shape != wg.shape
        || wd.shape != [experts, d_ff, d_model]
    {
        return Err(case.error(format!(
            "shapes do not fit: x {:?}, router {:?}, w_gate {:?}, w_up {:?}, w_down {:?} (want x [T,D], router [D,E], w_gate = w_up [E,D,F], w_down [E,F,D])",
            x.shape, router.shape, wg.shape, wu.shape, wd.shape
        )));
    }
    let top_k = match case.meta.get("top_k").map(|v| v.parse::<usize>()) {
        Some(Ok(k)) => k,
        Some(Err(_)) => {
            return Err(case.error(format!(
                "metadata top_k='{}' is not an integer",
                case.meta["top_k"]
            )))
        }
        None => return Err(case.error("a moe case needs metadata \"top_k\"")),
    };
    let capacity = match case.meta.get("capacity") {
        None => Capacity::Dropless,
        Some(c) => moe_kernels::parse_capacity(c).map_err(|e| case.error(e))?,
    };
    let policy = match case.meta.get("policy").map(String::as_str) {
        None | Some("score") => DropPolicy::Score,
        Some("order") => DropPolicy::TokenOrder,
        Some(o) => return Err(case.error(format!("metadata policy='{o}' is not score or order"))),
    };
    let norm = match case.meta.get("norm").map(String::as_str) {
        None | Some("renormalize") => WeightNorm::Renormalize,
        Some("raw") => WeightNorm::Raw,
        Some(o) => return Err(case.error(format!("metadata norm='{o}' is not renormalize or raw"))),
    };
    let cfg = MoeConfig {
        tokens,
        d_model,
        d_ff,
        experts,
        top_k,
        norm,
        capacity,
        policy,
    };
    cfg.validate().map_err(|e| case.error(e))?;
    let bias = match case.optional("router_bias", &[1])? {
        Some(t) => f32_tensor(case, "router_bias", t)?,
        None => vec![0.0; experts],
    };
    let weights = MoeWeights {
        router: f32_tensor(case, "router", router)?,
        bias,
        w_gate: f32_tensor(case, "w_gate", wg)?,
        w_up: f32_tensor(case, "w_up", wu)?,
        w_down: f32_tensor(case, "w_down", wd)?,
    };
    weights.check(&cfg).map_err(|e| case.error(e))?;
    let xs = f32_tensor(case, "x", x)?;
    let exact = moe_kernels::route_reference(&cfg, &xs, &weights.router, &weights.bias)
        .map_err(|e| case.error(e))?;
    let all: Vec<usize> = (0..tokens).collect();
    let reference = moe_kernels::reference::experts_reference(&cfg, &weights, &xs, &exact, &all);
    let expect = Arc::new(Expect {
        tol: tolerance(DType::F32).scaled_to(&reference),
        reference: Some(reference),
        stored: stored_floats(case, &x.shape)?,
    });
    let (weights, xs) = (Arc::new(weights), Arc::new(xs));
    let mut runs = vec![];
    for (name, _) in moe_kernels::VARIANTS {
        if !wanted(asked, name) {
            continue;
        }
        let (_, variant) = registry::moe_variant(name)?;
        runs.push(Run {
            name: name.to_string(),
            job: Ok(Job::Moe {
                cfg,
                weights: weights.clone(),
                x: xs.clone(),
                variant,
            }),
            expect: expect.clone(),
        });
    }
    Ok(Prepared {
        label: cfg.label(),
        runs,
    })
}
