//! The one error type of the workbench kernels: every fallible kernel call returns it, and the
//! harness turns it into one line on stderr and exit code 2.

use thiserror::Error;

/// What can go wrong before or while a kernel runs.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum KernelError {
    /// A problem descriptor failed `validate()`.
    #[error("invalid shape: {0}")]
    InvalidShape(String),
    /// The variant cannot run this case (dtype, device, shape limit); the text says why.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A buffer does not have the length or dtype the descriptor implies.
    #[error("bad buffer: {0}")]
    BadBuffer(String),
    /// A model file, checkpoint or config that cannot be used as it is (damaged, truncated, a
    /// missing key or tensor, an architecture or tensor type this workbench does not run); the
    /// message names the file and the problem, and is printed as it is.
    #[error("{0}")]
    BadFile(String),
    /// The requested device is not present or not usable.
    #[error("device unavailable: {0}")]
    Device(String),
    /// The device is there but a call on it failed: a kernel that does not compile, a launch,
    /// a copy, a synchronisation (where an asynchronous kernel fault surfaces).
    #[error("device error: {0}")]
    DeviceFailure(String),
}

/// Shorthand for results of kernel calls.
pub type Result<T> = std::result::Result<T, KernelError>;
