//! Test-only support for the CUDA side, used from `[dev-dependencies]` only: the CPU emulator
//! of the `.cu` kernels (`emu`, with `emulate.h`), the helpers every family's emulated kernel
//! tests share (`emulated`), and the CI compile check (`check`: every `.cu` through NVRTC,
//! spills fail, rows for `results/cuda/resources.csv`). No GPU is needed for any of it.

/// The CI compile check: PTX and sm_90 cubins, resource rows, spills fail.
pub mod check;
/// CPU emulation of the kernels (g++ + coroutines) for tests without a GPU.
pub mod emu;
/// What the emulated kernel tests share: the module (or a skip), closeness, poisoned outputs.
pub mod emulated;
