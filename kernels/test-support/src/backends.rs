//! Every backend a test can run a case on here (llama.cpp's `test-backend-ops` runs each op
//! on every backend the same way): each ISA tier this CPU has — the closure runs under
//! `kernel_cpu::isa::with_isa`, so the kernels read that tier — and the CPU emulator of the
//! family's `.cu` when g++ is there (built once, skipped with a line on stderr otherwise).
//! A GPU is the harness's business (`harness check --device cuda`), not the tests'.

use crate::emu::EmuModule;
use kernel_cpu::Isa;
use kernel_cuda::KernelSource;

/// Where one run of a case goes.
pub enum Backend<'a> {
    /// A CPU tier; the closure is already running under it.
    Cpu(Isa),
    /// The emulated `.cu` module of the family.
    Emulator(&'a EmuModule),
}

/// The backends of one test: the CPU tiers, and the emulator when asked for and available.
pub struct Backends {
    emulator: Option<EmuModule>,
}

impl Backends {
    /// The CPU tiers only.
    pub fn cpu() -> Backends {
        Backends { emulator: None }
    }

    /// The CPU tiers and the emulated `source` (skipped, with a line on stderr, where the
    /// emulator cannot build; a planted bug when `WORKBENCH_EMU_MUTATION` names one).
    pub fn with_emulator(source: &KernelSource) -> Backends {
        Backends {
            emulator: crate::emulated::module(source),
        }
    }

    /// Runs `f` once per backend: every runnable tier (under it), then the emulator.
    pub fn for_each(&self, mut f: impl FnMut(Backend<'_>)) {
        for isa in kernel_cpu::isa::runnable() {
            kernel_cpu::isa::with_isa(isa, || f(Backend::Cpu(isa))).expect("a runnable tier");
        }
        if let Some(m) = &self.emulator {
            f(Backend::Emulator(m));
        }
    }
}
