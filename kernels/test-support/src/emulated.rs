//! Helpers shared by every family's emulated CUDA tests (`kernels/*/tests/cuda_emulated.rs`):
//! the emulator module for a source (or `None`, with the reason printed, where g++ is
//! missing; with a planted bug when `WORKBENCH_EMU_MUTATION` names one), the closeness
//! assertion against an f64 reference, and NaN-poisoned outputs.

use crate::emu::{unavailable, EmuModule};
use kernel_common::{DType, ErrorStats, Tolerance};
use kernel_cuda::KernelSource;

/// `source` built for the emulator — with the bug `WORKBENCH_EMU_MUTATION` plants, if it
/// names one of this file's (`mutations`) — or `None` (the test then returns early) without
/// g++.
pub fn module(source: &KernelSource) -> Option<EmuModule> {
    if let Some(why) = unavailable() {
        eprintln!("SKIPPED emulated CUDA kernels: {why}");
        return None;
    }
    let mutant = crate::mutations::planted(source);
    Some(EmuModule::build(mutant.as_ref().unwrap_or(source)).unwrap_or_else(|e| panic!("{e}")))
}

/// Fails the test unless `got` is within `tol` of `want`, naming `what`.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: Tolerance) {
    let stats = ErrorStats::compare(got, want);
    assert!(
        stats.passes(&tol),
        "{what}: rel L2 {:.3e}, max |err| {:.3e}, {} non-finite of {}",
        stats.rel_l2,
        stats.max_abs,
        stats.non_finite,
        stats.count
    );
}

/// `len` elements of `dtype`, every byte 0xff (NaN in f32, f16 and bf16).
pub fn nan_bytes(dtype: DType, len: usize) -> Vec<u8> {
    vec![0xff; len * dtype.size()]
}
