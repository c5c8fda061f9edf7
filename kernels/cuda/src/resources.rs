//! ptxas' verbose resource report (registers, shared memory, stack frame, spill bytes per
//! kernel), parsed out of an NVRTC program log compiled with `--ptxas-options=-v`.

/// The resources ptxas reported for one kernel entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// The entry's (unmangled, `extern "C"`) name.
    pub kernel: String,
    /// The target, e.g. `sm_90`.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u32,
    /// Stack frame per thread, bytes.
    pub stack_bytes: u32,
    /// Register spill stores, bytes.
    pub spill_store_bytes: u32,
    /// Register spill loads, bytes.
    pub spill_load_bytes: u32,
}

impl KernelResources {
    /// True when ptxas spilled registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// The number in front of `unit` in `text` (`"8192 bytes smem"` → 8192 for `"bytes smem"`).
fn number_before(text: &str, unit: &str) -> Option<u32> {
    let at = text.find(unit)?;
    text[..at].split_whitespace().last()?.parse().ok()
}

/// Parses every `Compiling entry function 'X' for 'sm_NN'` section of a ptxas `-v` log.
/// Entries appear in the order ptxas compiled them.
pub fn parse_ptxas_report(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        let line = line.trim();
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let kernel = parts.next().unwrap_or_default().to_string();
            let arch = parts.nth(1).unwrap_or_default().to_string();
            out.push(KernelResources {
                kernel,
                arch,
                ..Default::default()
            });
            continue;
        }
        let Some(current) = out.last_mut() else {
            continue;
        };
        if line.contains("bytes stack frame") {
            current.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            current.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
            current.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used") && line.contains("registers") {
            current.registers = number_before(line, "registers").unwrap_or(0);
            current.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as NVRTC 13.0 printed them here (`--ptxas-options=-v`), two entries; the
    /// second one's spill is the one `gemv_f16` had before its loads stopped taking the
    /// address of a register (see quant.cu).
    const LOG: &str = "ptxas info    : 20 bytes gmem
ptxas info    : Compiling entry function 'paged_decode_f16' for 'sm_90'
ptxas info    : Function properties for paged_decode_f16
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1056 bytes smem
ptxas info    : Compile time = 35.035 ms
ptxas warning : Registers are spilled to local memory in function 'append_f32', 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function 'append_f32' for 'sm_90'
ptxas info    : Function properties for append_f32
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 80 registers, used 0 barriers, 8 bytes cumulative stack size
";

    #[test]
    fn parses_each_entry() {
        let r = parse_ptxas_report(LOG);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].kernel, "paged_decode_f16");
        assert_eq!(r[0].arch, "sm_90");
        assert_eq!((r[0].registers, r[0].shared_bytes), (40, 1056));
        assert!(!r[0].spills());
        assert_eq!(r[1].registers, 80);
        assert_eq!(r[1].shared_bytes, 0);
        assert_eq!(
            (
                r[1].stack_bytes,
                r[1].spill_store_bytes,
                r[1].spill_load_bytes
            ),
            (16, 8, 12)
        );
        assert!(r[1].spills());
    }

    #[test]
    fn empty_log_has_no_entries() {
        assert!(parse_ptxas_report("").is_empty());
    }
}
