//! `harness exp NAME`: loads the spec, finds its family in the table, checks the grid keys and
//! variants against the family's, applies `--quick`, `--set`, `--variant`, `--reps` and the
//! CUDA limits, then hands the request to the family's runner (which streams rows to
//! results/<exp>/<run-id>.csv and writes provenance, tables and plots). `harness render CSV`
//! re-renders a finished or interrupted run through the same family's report.

use crate::error::{HarnessError, Result};
use crate::families;
use crate::peer;
use crate::provenance::Provenance;
use crate::run_files::{ExpOptions, ExpRequest, DEFAULT_REPS};
use crate::spec::{parse_set, ExperimentSpec};
use kernel_common::Device;
use std::path::Path;

/// Runs the experiment; returns the exit code (1 when a variant gave a wrong answer).
pub fn run(opts: &ExpOptions) -> Result<i32> {
    // Everything that can be wrong with the request is found before results/ is touched.
    let (mut spec, spec_path) = ExperimentSpec::load(&opts.experiments_dir, &opts.name)?;
    let family = family_of(&spec)?;
    let cuda = matches!(opts.device, Device::Cuda(_));
    if let Device::Cuda(n) = opts.device {
        // Driver, GPU and NVRTC first: each missing one is named in one line.
        kernel_cuda::CudaRuntime::get(n)?;
    }
    if let (true, Some(limits)) = (cuda, spec.cuda_limits.clone()) {
        spec.limits = limits;
    }
    let sets = opts
        .sets
        .iter()
        .map(|s| parse_set(s))
        .collect::<Result<Vec<_>>>()?;
    let grid = spec.resolve_grid(family.grid_keys, opts.quick, &sets)?;
    let names = if !opts.variants.is_empty() {
        opts.variants.clone()
    } else if cuda {
        if spec.cuda_variants.is_empty() {
            return Err(HarnessError::Usage(format!(
                "experiment '{}' names no cuda_variants; give them with --variant cuda_...",
                spec.name
            )));
        }
        spec.cuda_variants.clone()
    } else {
        spec.variants.clone()
    };
    // Where each variant runs is its table row's device: checked once, here, for every family.
    for name in &names {
        (family.variant)(name)?;
    }
    crate::registry::require_variant_devices(&names, opts.device, &families::all_variants())?;
    let reps = opts.reps.or(spec.reps).unwrap_or(DEFAULT_REPS);
    if reps == 0 {
        return Err(HarnessError::Usage("--reps must be at least 1".into()));
    }
    let no_peers = vec![];
    let peer_names = if opts.no_peers {
        &no_peers
    } else if opts.peers.is_empty() {
        &spec.peers
    } else {
        &opts.peers
    };
    if !peer_names.is_empty() && !family.peers {
        return Err(HarnessError::Usage(format!(
            "experiment '{}': {} experiments take no peers yet",
            spec.name, spec.family
        )));
    }
    let mut peers = peer::manifests(&opts.peers_dir, peer_names, &spec.family)?;
    // A peer runs on the devices its manifest names: a spec's peers that cannot run on this
    // one are left out; asking for one with --peer is an error.
    let device = opts.device.to_string();
    if let Some(m) = peers.iter().find(|m| !m.runs_on(&device)) {
        if !opts.peers.is_empty() {
            return Err(HarnessError::Usage(format!(
                "--peer {}: it runs on {} only, not on {device}",
                m.label,
                m.devices.join(", ")
            )));
        }
    }
    peers.retain(|m| m.runs_on(&device));
    let peer_root = opts
        .peers_dir
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| opts.peers_dir.clone(), Path::to_path_buf);
    (family.run)(&ExpRequest {
        opts,
        spec: &spec,
        spec_path: &spec_path,
        grid,
        names,
        reps,
        peers,
        peer_root,
    })
}

/// The experiment side of the spec's family, with the spec checked against it.
pub fn family_of(spec: &ExperimentSpec) -> Result<&'static crate::family::ExpFamily> {
    let family = families::experiment(&spec.family)
        .map_err(|e| HarnessError::Usage(format!("experiment '{}': {e}", spec.name)))?;
    spec.validate_for(family.grid_keys, family.variant)?;
    Ok(family)
}

/// `harness render CSV`: rewrites the .md and .svg of a finished (or interrupted) run.
pub fn rerender(csv: &Path, experiments_dir: &Path) -> Result<String> {
    let prov = Provenance::read(&csv.with_extension("json"))?;
    let (spec, _) = ExperimentSpec::load(experiments_dir, &prov.experiment)?;
    let family = family_of(&spec)?;
    Ok(crate::render::render_run(&spec, csv, &prov, family.render)?.tables)
}
