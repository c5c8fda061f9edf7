//! The expert side of the layer, given the router's decisions: every kept assignment adds
//! weight · FFN_e(x_t) to token t's output, FFN_e(x) = W_down·(silu(W_gate·x) ⊙ W_up·x) (SwiGLU,
//! as Mixtral). Two variants:
//! - `naive`: per token, per kept assignment, three matrix-vector products (threads over
//!   tokens): each expert's weights are streamed once per token that uses them.
//! - `grouped`: dispatch the kept tokens of each expert into a contiguous buffer, run that
//!   expert's three GEMMs over all of them (threads over (expert, 128-token chunk) tasks, so one
//!   busy expert still spreads over the cores), then combine: a weighted scatter-add back to
//!   token order, in a fixed order so the result is deterministic.
//! - `cuda_grouped`: the same on the device as grouped tensor-core GEMMs in f16 or bf16
//!   storage (`cuda::experts`); x and the weights are rounded to that type on the way.

use crate::config::MoeConfig;
use crate::decision::Routing;
use crate::weights::MoeWeights;
use kernel_common::{error::Result, DType, KernelError};
use kernel_cpu::gemm::{sgemm, Strides};
use rayon::prelude::*;

/// Which expert computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertVariant {
    Naive,
    Grouped,
    /// On the CUDA device, in this storage type (f16 or bf16).
    CudaGrouped(DType),
}

/// Tokens per grouped task.
const CHUNK: usize = 128;

fn silu(z: f32) -> f32 {
    z / (1.0 + (-z).exp())
}

/// out (tokens × d_model) = Σ over kept assignments of weight · FFN_expert(x_token).
pub fn experts_forward(
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    routing: &Routing,
    variant: ExpertVariant,
    out: &mut [f32],
) -> Result<()> {
    cfg.validate()?;
    w.check(cfg)?;
    let d = cfg.d_model;
    if x.len() != cfg.tokens * d || out.len() != cfg.tokens * d {
        return Err(KernelError::BadBuffer(format!(
            "x and out must hold tokens × d_model = {} values, got {} and {}",
            cfg.tokens * d,
            x.len(),
            out.len()
        )));
    }
    routing.check(cfg)?;
    match variant {
        ExpertVariant::Naive => naive(cfg, w, x, routing, out),
        ExpertVariant::Grouped => grouped(cfg, w, x, routing, out),
        ExpertVariant::CudaGrouped(dtype) => {
            out.copy_from_slice(&crate::cuda::experts::experts_cuda(
                cfg, w, x, routing, dtype,
            )?);
        }
    }
    Ok(())
}

fn naive(cfg: &MoeConfig, w: &MoeWeights, x: &[f32], routing: &Routing, out: &mut [f32]) {
    let (d, f) = (cfg.d_model, cfg.d_ff);
    out.par_chunks_mut(d).enumerate().for_each(|(t, o)| {
        o.fill(0.0);
        let xt = &x[t * d..(t + 1) * d];
        let (mut g, mut u) = (vec![0.0f32; f], vec![0.0f32; f]);
        for a in routing.of_token(t).iter().filter(|a| a.kept) {
            let (wg, wu) = (
                &w.w_gate[a.expert * d * f..(a.expert + 1) * d * f],
                &w.w_up[a.expert * d * f..(a.expert + 1) * d * f],
            );
            g.fill(0.0);
            u.fill(0.0);
            for (i, &xi) in xt.iter().enumerate() {
                kernel_cpu::simd::axpy_plain(xi, &wg[i * f..(i + 1) * f], &mut g);
                kernel_cpu::simd::axpy_plain(xi, &wu[i * f..(i + 1) * f], &mut u);
            }
            let wd = &w.w_down[a.expert * f * d..(a.expert + 1) * f * d];
            let weight = a.weight as f32;
            for j in 0..f {
                let h = silu(g[j]) * u[j] * weight;
                kernel_cpu::simd::axpy_plain(h, &wd[j * d..(j + 1) * d], o);
            }
        }
    });
}

/// One grouped task: `tokens` (with their weights) of `expert`.
struct Task {
    expert: usize,
    tokens: Vec<(usize, f32)>,
}

fn grouped(cfg: &MoeConfig, w: &MoeWeights, x: &[f32], routing: &Routing, out: &mut [f32]) {
    let (d, f, e) = (cfg.d_model, cfg.d_ff, cfg.experts);
    // Dispatch: kept tokens per expert, in token order.
    let mut per_expert: Vec<Vec<(usize, f32)>> = vec![vec![]; e];
    for a in routing.assignments.iter().filter(|a| a.kept) {
        per_expert[a.expert].push((a.token, a.weight as f32));
    }
    let tasks: Vec<Task> = per_expert
        .into_iter()
        .enumerate()
        .flat_map(|(expert, list)| {
            list.chunks(CHUNK)
                .map(|c| Task {
                    expert,
                    tokens: c.to_vec(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|task| {
            let n = task.tokens.len();
            let mut xs = vec![0.0f32; n * d];
            for (r, &(t, _)) in task.tokens.iter().enumerate() {
                xs[r * d..(r + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
            }
            let ex = task.expert;
            let (mut g, mut u) = (vec![0.0f32; n * f], vec![0.0f32; n * f]);
            let wg = &w.w_gate[ex * d * f..(ex + 1) * d * f];
            let wu = &w.w_up[ex * d * f..(ex + 1) * d * f];
            let wd = &w.w_down[ex * f * d..(ex + 1) * f * d];
            for (wm, dst) in [(wg, &mut g), (wu, &mut u)] {
                let (sx, sw) = (Strides::row_major(d), Strides::row_major(f));
                sgemm(n, d, f, 1.0, &xs, sx, wm, sw, 0.0, dst, f);
            }
            for (r, (gr, ur)) in g.chunks_mut(f).zip(u.chunks(f)).enumerate() {
                let weight = task.tokens[r].1;
                for (gv, &uv) in gr.iter_mut().zip(ur) {
                    *gv = silu(*gv) * uv * weight;
                }
            }
            let mut y = vec![0.0f32; n * d];
            sgemm(
                n,
                f,
                d,
                1.0,
                &g,
                Strides::row_major(f),
                wd,
                Strides::row_major(d),
                0.0,
                &mut y,
                d,
            );
            y
        })
        .collect();
    // Combine: scatter-add in task order (deterministic).
    out.fill(0.0);
    for (task, y) in tasks.iter().zip(&results) {
        for (r, &(t, _)) in task.tokens.iter().enumerate() {
            for (o, v) in out[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&y[r * d..(r + 1) * d])
            {
                *o += v;
            }
        }
    }
}
