//! `harness replay` of moe case files (`x`, `router`, `w_gate`/`w_up`/`w_down`, metadata
//! `top_k`, `capacity`, `policy`, `norm`): the exact routing decisions in f64, then every
//! expert variant against the f64 experts of those decisions.

use crate::case_file::CaseFile;
use crate::case_job::{f32_tensor, stored_floats, wanted, EachCall, Expect, Output, Prepared, Run};
use crate::error::Result;
use crate::registry;
use kernel_common::{tolerance, DType};
use moe_kernels::{Capacity, DropPolicy, MoeConfig, MoeWeights, WeightNorm};
use std::sync::Arc;

/// The jobs of a moe case file.
pub fn prepare(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
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
    for name in moe_kernels::VARIANTS
        .iter()
        .filter(|v| v.device == kernel_common::Runs::Cpu)
        .map(|v| v.name)
    {
        if !wanted(asked, name) {
            continue;
        }
        let (_, variant) = registry::moe_variant(name)?;
        runs.push(Run {
            name: name.to_string(),
            job: Ok(Box::new(EachCall({
                let (weights, xs) = (weights.clone(), xs.clone());
                move || {
                    let mut out = vec![f32::NAN; xs.len()];
                    moe_kernels::moe_forward(&cfg, &weights, &xs, variant, &mut out)?;
                    Ok(Output::Floats(out))
                }
            }))),
            expect: expect.clone(),
        });
    }
    Ok(Prepared {
        label: cfg.label(),
        runs,
    })
}
