//! The compile check run on every CI machine, GPU or not: each `.cu` to PTX for
//! `compute_90` (what the runtime loads on an H100/H200) and to an `sm_90` cubin with ptxas'
//! resource report; any compile error, missing entry point or register spill fails it.

use kernel_common::error::{KernelError, Result};
use kernel_cuda::nvrtc::{compile, nvrtc_version};
use kernel_cuda::resources::{parse_ptxas_report, KernelResources};
use kernel_cuda::KernelSource;

/// The PTX target of the compile check.
pub const CHECK_PTX_ARCH: &str = "compute_90";
/// The machine-code target of the compile check (the H200's).
pub const CHECK_CUBIN_ARCH: &str = "sm_90";

/// One kernel's row of `results/cuda/resources.csv`.
#[derive(Debug, Clone)]
pub struct ResourceRow {
    pub family: &'static str,
    pub file: &'static str,
    pub resources: KernelResources,
    pub ptx_bytes: usize,
    pub cubin_bytes: usize,
}

/// Compiles `source` both ways and returns one row per entry point, in the source's order.
/// Fails on a compile error (with NVRTC's log), an entry point absent from the PTX or the
/// report, or any spill.
pub fn compile_check(source: &KernelSource) -> Result<Vec<ResourceRow>> {
    let ptx = compile(source, CHECK_PTX_ARCH, false)?
        .ptx
        .unwrap_or_default();
    let cubin = compile(source, CHECK_CUBIN_ARCH, true)?;
    if let Ok(dir) = std::env::var("CUDA_DUMP_DIR") {
        // For reading the PTX (ptxas, cuobjdump) and the full log by hand.
        let dir = std::path::Path::new(&dir);
        let stem = source.file.trim_end_matches(".cu");
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::write(dir.join(format!("{stem}.ptx")), &ptx);
        let _ = std::fs::write(dir.join(format!("{stem}.sm_90.log")), &cubin.log);
        if let Some(bin) = &cubin.cubin {
            let _ = std::fs::write(dir.join(format!("{stem}.sm_90.cubin")), bin);
        }
    }
    let report = parse_ptxas_report(&cubin.log);
    let mut rows = Vec::with_capacity(source.entries.len());
    for &entry in source.entries {
        if !ptx.contains(&format!(".entry {entry}(")) {
            return Err(KernelError::DeviceFailure(format!(
                "{}: entry point {entry} is not in the PTX",
                source.file
            )));
        }
        let Some(res) = report.iter().find(|r| r.kernel == entry) else {
            return Err(KernelError::DeviceFailure(format!(
                "{}: ptxas reported nothing for {entry}; log:\n{}",
                source.file, cubin.log
            )));
        };
        if res.spills() {
            return Err(KernelError::DeviceFailure(format!(
                "{}: {entry} spills registers ({} bytes stored, {} loaded; {} registers)",
                source.file, res.spill_store_bytes, res.spill_load_bytes, res.registers
            )));
        }
        rows.push(ResourceRow {
            family: source.family,
            file: source.file,
            resources: res.clone(),
            ptx_bytes: ptx.len(),
            cubin_bytes: cubin.cubin.as_ref().map_or(0, Vec::len),
        });
    }
    Ok(rows)
}

/// `results/cuda/resources.csv`'s text for `rows`.
pub fn resources_csv(rows: &[ResourceRow]) -> String {
    let (major, minor) = nvrtc_version().unwrap_or((0, 0));
    let mut out = String::from(
        "family,file,kernel,arch,registers,shared_bytes,stack_bytes,spill_store_bytes,spill_load_bytes,nvrtc\n",
    );
    for r in rows {
        let k = &r.resources;
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{major}.{minor}\n",
            r.family,
            r.file,
            k.kernel,
            k.arch,
            k.registers,
            k.shared_bytes,
            k.stack_bytes,
            k.spill_store_bytes,
            k.spill_load_bytes
        ));
    }
    out
}
