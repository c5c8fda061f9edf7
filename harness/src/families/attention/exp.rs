//! `harness exp` for attention specs: per grid point, seeded inputs and the f64 reference of
//! sampled rows are made once and shared by the variants; each variant is prepared (untimed),
//! run once on NaN-poisoned output and checked, then timed with caches flushed; its cost model
//! gives GB/s, GFLOP/s and % of the roofline measured at the start of the run (`point.rs`).
//! With peers, a point's variants and peers are checked, then timed in alternating rounds
//! (`peers.rs`).

use super::grid::points;
use super::point::PointRunner;
use crate::error::{HarnessError, Result};
use crate::measure::CacheFlusher;
use crate::peer::{Peer, ScratchDir};
use crate::registry;
use crate::run_files::{counts_as_failure, ExpRequest, RunFiles};
use kernel_common::inputs::derive_seed;

/// Runs an attention experiment: every variant at every point, checked and timed.
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, names, reps) = (req.opts, req.spec, &req.names, req.reps);
    let points = points(&req.grid)?;
    if points.is_empty() {
        return Err(HarnessError::Usage(format!(
            "experiment '{}': the grid has no point",
            spec.name
        )));
    }
    let kernels = names
        .iter()
        .map(|v| registry::attention_kernel(v))
        .collect::<Result<Vec<_>>>()?;

    let mut run = RunFiles::start(opts, spec, req.spec_path, req.grid.clone())?;
    let scratch = ScratchDir::new(&run.run_id)?;
    let mut peers: Vec<Peer> = req
        .peers
        .iter()
        .map(|m| Peer::start(m.clone(), &req.peer_root, &scratch.0))
        .collect();
    let bar = run.progress_bar(points.len() * (kernels.len() + peers.len()));
    let mut flusher = CacheFlusher::new();
    let mut failures = 0;
    for (index, point) in points.iter().enumerate() {
        let key = point.key();
        if !run.owns(&key) {
            continue;
        }
        let mut runner = PointRunner::new(
            point,
            derive_seed(opts.seed, index as u64),
            &spec.limits,
            &opts.mem_budget,
        );
        if !peers.is_empty() {
            bar.set_message(format!("{} {} with peers", point.mode, point.shape.label()));
            let rows = super::peers::measure_point(
                &mut runner,
                &kernels,
                &mut peers,
                &scratch.0,
                &run.heads,
                opts.device,
                reps,
                spec.limits.seconds_per_point,
                &mut flusher,
                &run.roof,
            )?;
            for row in &rows {
                if counts_as_failure(&row.head.status, &row.note) {
                    failures += 1;
                }
                bar.inc(1);
            }
            run.write_point(&key, &rows)?;
            continue;
        }
        let mut rows = vec![];
        for kernel in &kernels {
            bar.set_message(format!(
                "{} {} {}",
                point.mode,
                point.shape.label(),
                kernel.name()
            ));
            let mut row = runner.row(kernel.as_ref(), &run.heads, &run.roof);
            runner.measure(
                kernel.as_ref(),
                opts.device,
                reps,
                &mut flusher,
                &run.roof,
                &mut row,
            );
            if counts_as_failure(&row.head.status, &row.note) {
                failures += 1;
            }
            rows.push(row);
            bar.inc(1);
        }
        run.write_point(&key, &rows)?;
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, super::report::render)
}
