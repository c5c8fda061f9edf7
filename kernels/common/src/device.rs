//! The device a kernel runs on: `Device::Cpu` always exists; `Device::Cuda(n)` names a CUDA
//! device, which exists only after `kernel_cuda::probe_cuda` has found a driver and a device.

use crate::error::{KernelError, Result};
use std::fmt;

/// Where a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU (rayon threads).
    Cpu,
    /// CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// Parses `cpu`, `cuda` (ordinal 0) or `cuda:N`.
    pub fn parse(text: &str) -> Result<Device> {
        match text {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match text.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(KernelError::Device(format!(
                    "unknown device '{text}' (expected cpu, cuda or cuda:N)"
                ))),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
        assert_eq!(Device::parse("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(Device::parse("cuda:3").unwrap(), Device::Cuda(3));
        assert!(Device::parse("gpu").is_err());
        assert!(Device::parse("cuda:x").is_err());
    }
}
