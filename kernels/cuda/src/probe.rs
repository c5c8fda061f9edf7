//! The CUDA driver probe: is libcuda loadable, how many devices, which one is `ordinal`.
//! cudarc panics when libcuda cannot be loaded, so nothing touches the driver before
//! `is_culib_present` says it is there.

use kernel_common::error::{KernelError, Result};

/// What the probe learned about a CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name reported by the driver.
    pub name: String,
    /// Number of CUDA devices the driver reports.
    pub device_count: usize,
}

/// Looks for a CUDA driver and device `ordinal` without ever panicking.
///
/// Returns `KernelError::Device` with one readable line when libcuda is absent, the driver
/// reports no device, or the ordinal is out of range.
pub fn probe_cuda(ordinal: usize) -> Result<CudaInfo> {
    // SAFETY: `is_culib_present` only tries to dlopen the library and reports the outcome.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        return Err(KernelError::Device(
            "no CUDA driver on this machine (libcuda could not be loaded); use --device cpu"
                .to_string(),
        ));
    }
    // After a positive probe cudarc reports failures as Results; a missing symbol in an old
    // driver can still panic, so keep that contained too.
    let probed = std::panic::catch_unwind(|| -> std::result::Result<CudaInfo, String> {
        let count = cudarc::driver::CudaContext::device_count().map_err(|e| e.to_string())?;
        let count = usize::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(format!(
                "CUDA device {ordinal} requested but the driver reports {count} device(s)"
            ));
        }
        let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| e.to_string())?;
        let name = ctx.name().map_err(|e| e.to_string())?;
        Ok(CudaInfo {
            ordinal,
            name,
            device_count: count,
        })
    });
    match probed {
        Ok(Ok(info)) => Ok(info),
        Ok(Err(msg)) => Err(KernelError::Device(msg)),
        Err(_) => Err(KernelError::Device(
            "the CUDA driver library is present but unusable (incompatible version)".to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics() {
        // On a machine without a driver this is an error; with one it names the device.
        match probe_cuda(0) {
            Ok(info) => assert!(!info.name.is_empty()),
            Err(KernelError::Device(msg)) => assert!(!msg.is_empty()),
            Err(other) => panic!("unexpected error kind: {other}"),
        }
    }
}
