//! `harness list`: this machine's ISA tiers, then every family (what it has: check, exp,
//! replay), every variant of the kernel crates' tables with its device, the experiments with
//! their claims, the peers installed, and each experiment family's grid keys.

use crate::error::Result;
use crate::spec::ExperimentSpec;
use crate::{families, machine, peer, workspace};
use std::path::Path;

/// Prints the listing; `experiments_dir` is found (or refused) before anything is printed.
pub fn run(experiments_dir: &Path) -> Result<i32> {
    let specs = ExperimentSpec::list(experiments_dir)?;
    println!("{}\n", machine::isa_summary());
    println!("Families:");
    for f in families::FAMILIES {
        let does: Vec<&str> = [
            f.check.is_some().then_some("check"),
            f.exp.is_some().then_some("exp"),
            f.replay.is_some().then_some("replay"),
        ]
        .into_iter()
        .flatten()
        .collect();
        println!("  {:<12} [{}] {}", f.name, does.join(" "), f.about);
    }
    println!("\nVariants (use as --variant NAME[:key=value,...]):");
    for v in families::all_variants() {
        println!(
            "  {:<12} {:<14} {:<5} {}",
            v.family, v.name, v.device, v.about
        );
    }
    println!("\nExperiments (harness exp NAME):");
    for spec in specs {
        println!(
            "  {:<18} [{}] {}",
            spec.name,
            spec.claims.join(" "),
            spec.question.trim().lines().next().unwrap_or("")
        );
    }
    let peers_dir = workspace::root().map(|r| r.join("scripts/peers"));
    let peers: Vec<_> = peers_dir
        .iter()
        .flat_map(|d| {
            peer::list(d)
                .into_iter()
                .map(move |n| peer::read_manifest(d, &n))
        })
        .flatten()
        .collect();
    if !peers.is_empty() {
        println!("\nPeers (use as --peer NAME[:option=value,...]; scripts/fetch-peers.sh installs them):");
        for m in peers {
            let options: Vec<String> = m
                .options
                .iter()
                .map(|(k, v)| format!("{k}={}", v.join("|")))
                .collect();
            println!(
                "  {:<12} {:<9} [{}] {}{}",
                m.name,
                m.families.join(","),
                m.devices.join(","),
                m.about,
                if options.is_empty() {
                    String::new()
                } else {
                    format!(" (options: {})", options.join(", "))
                }
            );
        }
    }
    for f in families::FAMILIES {
        let Some(exp) = &f.exp else { continue };
        println!("\nGrid keys for --set ({} experiments):", f.name);
        for (k, about) in exp.grid_keys {
            println!("  {k:<11} {about}");
        }
    }
    Ok(0)
}
