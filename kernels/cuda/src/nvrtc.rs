//! NVRTC compilation of the workbench's `.cu` sources: to PTX for a `compute_XY` target (what
//! the runtime loads) or to an `sm_XY` cubin with ptxas' verbose resource report (what the
//! compile check records). Headers (`cuda_fp16.h`, `cuda_bf16.h`, `math_constants.h`) are
//! found by `include_dirs`; NVRTC itself is `dlopen`ed, so call `nvrtc_present` first.

use crate::KernelSource;
use cudarc::nvrtc::{result, sys};
use kernel_common::error::{KernelError, Result};
use std::ffi::CString;
use std::path::PathBuf;

/// What one compilation produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// PTX text (for `compute_XY` targets).
    pub ptx: Option<String>,
    /// Machine code (for `sm_XY` targets).
    pub cubin: Option<Vec<u8>>,
    /// The program log: warnings, and ptxas' resource report when asked for with `-v`.
    pub log: String,
}

/// True when libnvrtc can be loaded (it ships with the toolkit or the
/// `nvidia-cuda-nvrtc` wheel, not with the driver).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library and reports the outcome.
    unsafe { sys::is_culib_present() }
}

/// Fails with one line when NVRTC cannot be loaded.
pub fn require_nvrtc() -> Result<()> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(KernelError::Device(
            "no NVRTC on this machine (libnvrtc.so.13 not found: install the CUDA 13.0 toolkit, or \
             the nvidia-cuda-nvrtc==13.0.88 wheel and add its nvidia/cu13/lib to LD_LIBRARY_PATH)"
                .into(),
        ))
    }
}

/// Directories searched for the CUDA headers, in order: `$CUDA_INCLUDE_DIR`,
/// `$CUDA_HOME/include`, the `include` beside every `nvidia/cu13/lib` on `LD_LIBRARY_PATH`
/// (the PyPI wheels' layout), `/usr/local/cuda/include`. Only those holding `cuda_fp16.h`.
pub fn include_dirs() -> Vec<String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = std::env::var("CUDA_INCLUDE_DIR") {
        candidates.push(dir.into());
    }
    if let Ok(home) = std::env::var("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("include"));
    }
    if let Ok(paths) = std::env::var("LD_LIBRARY_PATH") {
        for p in paths.split(':').filter(|p| !p.is_empty()) {
            let lib = PathBuf::from(p);
            if let Some(parent) = lib.parent() {
                candidates.push(parent.join("include"));
            }
        }
    }
    candidates.push("/usr/local/cuda/include".into());
    let mut found: Vec<String> = Vec::new();
    for dir in candidates {
        if dir.join("cuda_fp16.h").is_file() {
            let s = dir.to_string_lossy().into_owned();
            if !found.contains(&s) {
                found.push(s);
            }
        }
    }
    found
}

/// Compiles `source` for `arch` (`compute_90` → PTX, `sm_90` → cubin). `verbose` adds ptxas'
/// resource report to the log (cubin targets only). A compile error carries the NVRTC log.
pub fn compile(source: &KernelSource, arch: &str, verbose: bool) -> Result<Compiled> {
    require_nvrtc()?;
    let includes = include_dirs();
    if includes.is_empty() {
        return Err(KernelError::Device(
            "the CUDA headers (cuda_fp16.h) were not found: set CUDA_INCLUDE_DIR, CUDA_HOME, or \
             put the nvidia-cuda-runtime wheel's nvidia/cu13/lib on LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let mut options: Vec<String> = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--use_fast_math".into(),
        "-default-device".into(),
    ];
    options.extend(includes.iter().map(|d| format!("--include-path={d}")));
    let machine_code = arch.starts_with("sm_");
    if verbose && machine_code {
        options.push("--ptxas-options=-v".into());
        options.push("--ptxas-options=--warn-on-spills".into());
    }
    let src = CString::new(source.code).map_err(|_| {
        KernelError::DeviceFailure(format!("{}: source holds a NUL byte", source.file))
    })?;
    let name = CString::new(source.file).expect("file names hold no NUL");
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| KernelError::DeviceFailure(format!("nvrtc: cannot create program: {e:?}")))?;
    // SAFETY: `prog` was just created and is destroyed exactly once below.
    let outcome = unsafe { result::compile_program(prog, &options) };
    let log = unsafe { result::get_program_log(prog) }
        .map(|chars| c_chars_to_string(&chars))
        .unwrap_or_default();
    let compiled = match outcome {
        Err(e) => Err(KernelError::DeviceFailure(format!(
            "nvrtc could not compile {} for {arch} ({e:?}):\n{}",
            source.file,
            log.trim_end()
        ))),
        Ok(()) if machine_code => unsafe { cubin(prog) }.map(|bin| Compiled {
            ptx: None,
            cubin: Some(bin),
            log,
        }),
        Ok(()) => unsafe { result::get_ptx(prog) }
            .map(|chars| Compiled {
                ptx: Some(c_chars_to_string(&chars)),
                cubin: None,
                log,
            })
            .map_err(|e| KernelError::DeviceFailure(format!("nvrtc: no PTX: {e:?}"))),
    };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    compiled
}

/// # Safety
/// `prog` must be a live, successfully compiled program for an `sm_XY` target.
unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size)
        .result()
        .map_err(|e| KernelError::DeviceFailure(format!("nvrtc: no cubin size: {e:?}")))?;
    let mut bin = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast())
        .result()
        .map_err(|e| KernelError::DeviceFailure(format!("nvrtc: no cubin: {e:?}")))?;
    Ok(bin)
}

fn c_chars_to_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| KernelError::DeviceFailure(format!("nvrtc version: {e:?}")))?;
    Ok((major, minor))
}
