//! Test-only support, used from `[dev-dependencies]` only: the CPU emulator of the `.cu`
//! kernels (`emu`, with `emulate.h`, `emulate_warp.h`, `emulate_math.h`), the helpers every
//! family's emulated kernel tests share (`emulated`), `backends` (a case on every ISA tier and
//! the emulator), the planted bugs they must catch (`mutations`), the reruns with the kernels
//! built with ASan and UBSan (`sanitized`), the CI compile check (`check`: every `.cu` through
//! NVRTC, spills fail, rows for `results/cuda/resources.csv`), and the chi-square test of the
//! statistical tests (`stats`). No GPU is needed for any of it.

/// Every backend a case runs on in a test: the ISA tiers and the emulator.
pub mod backends;
/// The CI compile check: PTX and sm_90 cubins, resource rows, spills fail.
pub mod check;
/// CPU emulation of the kernels (g++ + coroutines) for tests without a GPU.
pub mod emu;
/// What the emulated kernel tests share: the module (or a skip), closeness, poisoned outputs.
pub mod emulated;
/// Planted bugs in the `.cu` sources, and the check that the emulated tests catch each.
pub mod mutations;
/// The emulated tests rerun with the kernels built with ASan and UBSan.
pub mod sanitized;
/// Pearson's chi-square test and its p-value.
pub mod stats;
