//! `harness replay` of moe case files (`x`, `router`, `w_gate`/`w_up`/`w_down`): the exact
//! routing decisions in f64 under the file's convention, then every expert variant against
//! the f64 experts of those decisions. Metadata: `routing` (`token_choice`, the default, or
//! `expert_choice`); token choice needs `top_k` and takes `policy` (`order`, `gshard`,
//! `score` — the default — or `reroute`); expert choice takes neither; `norm`
//! (`renormalize`, the token-choice default, `raw`, the expert-choice default, or
//! `renormalize_kept`), `capacity` (a factor or `dropless`, the default) and `min_capacity`
//! (default 1).

use crate::case_file::CaseFile;
use crate::case_job::{f32_tensor, stored_floats, wanted, EachCall, Expect, Output, Prepared, Run};
use crate::error::Result;
use crate::registry;
use kernel_common::{tolerance, DType};
use kernel_moe::{Capacity, Choice, MoeConfig, MoeWeights, Priority, WeightNorm};
use std::sync::Arc;

/// The routing convention the file's metadata names.
fn convention(case: &CaseFile) -> Result<(Choice, WeightNorm)> {
    let meta = |key: &str| case.meta.get(key).map(String::as_str);
    let expert_choice = match meta("routing") {
        None | Some("token_choice") => false,
        Some("expert_choice") => true,
        Some(o) => {
            return Err(case.error(format!(
                "metadata routing='{o}' is not token_choice or expert_choice"
            )))
        }
    };
    let norm = match meta("norm") {
        None if expert_choice => WeightNorm::Raw,
        None => WeightNorm::Renormalize,
        Some(n) => WeightNorm::parse(n).map_err(|e| case.error(format!("metadata {e}")))?,
    };
    if expert_choice {
        for key in ["top_k", "policy"] {
            if case.meta.contains_key(key) {
                return Err(case.error(format!(
                    "routing=expert_choice takes no {key} (each expert picks its tokens)"
                )));
            }
        }
        return Ok((Choice::Experts, norm));
    }
    let top_k = match meta("top_k").map(str::parse::<usize>) {
        Some(Ok(k)) => k,
        Some(Err(_)) => {
            return Err(case.error(format!(
                "metadata top_k='{}' is not an integer",
                case.meta["top_k"]
            )))
        }
        None => return Err(case.error("a token-choice moe case needs metadata \"top_k\"")),
    };
    let policy = match meta("policy") {
        None => Priority::Score,
        Some(p) => Priority::parse(p).map_err(|e| case.error(format!("metadata {e}")))?,
    };
    Ok((Choice::Tokens { top_k, policy }, norm))
}

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
    let (choice, norm) = convention(case)?;
    let capacity = match case.meta.get("capacity") {
        None => Capacity::Dropless,
        Some(c) => kernel_moe::parse_capacity(c).map_err(|e| case.error(e))?,
    };
    let min_capacity = match case.meta.get("min_capacity").map(|v| v.parse::<usize>()) {
        None => 1,
        Some(Ok(m)) => m,
        Some(Err(_)) => {
            return Err(case.error(format!(
                "metadata min_capacity='{}' is not an integer >= 0",
                case.meta["min_capacity"]
            )))
        }
    };
    let cfg = MoeConfig {
        tokens,
        d_model,
        d_ff,
        experts,
        choice,
        norm,
        capacity,
        min_capacity,
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
    let exact = kernel_moe::route_reference(&cfg, &xs, &weights.router, &weights.bias)
        .map_err(|e| case.error(e))?;
    let all: Vec<usize> = (0..tokens).collect();
    let reference = kernel_moe::reference::experts_reference(&cfg, &weights, &xs, &exact, &all);
    let expect = Arc::new(Expect {
        tol: tolerance(DType::F32).scaled_to(&reference),
        reference: Some(reference),
        stored: stored_floats(case, &x.shape)?,
    });
    let (weights, xs) = (Arc::new(weights), Arc::new(xs));
    let mut runs = vec![];
    for name in kernel_moe::VARIANTS
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
                    kernel_moe::moe_forward(&cfg, &weights, &xs, variant, &mut out)?;
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
