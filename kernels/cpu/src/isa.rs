//! Which vector instruction set the CPU kernels use. Three tiers, each a set of x86-64 features
//! every kernel of that tier may assume:
//!
//! | tier | features | who has it |
//! |---|---|---|
//! | `avx512` | AVX-512 F, BW, VL + AVX2, FMA, F16C | Skylake-SP and later Xeons, Ice Lake, Zen 4/5 |
//! | `avx2` | AVX2, FMA, F16C (x86-64-v3) | most laptops, desktops and cloud VMs since 2013–2015 |
//! | `portable` | none: plain loops the compiler vectorises for the baseline ISA | any CPU, ARM included |
//!
//! The CPU is probed once (`Isa::detected`). A process-wide cap (`set_cap`, the harness's
//! `--isa`, or the `WORKBENCH_ISA` environment variable for tests and library users) lowers
//! what kernels use, so every path can be forced, measured and tested on a machine with a wider
//! one; `with_isa` lowers it for one thread (tests run each ISA side by side in one process).
//! Kernels read `Isa::active()` once on the calling thread, before they fork work to rayon, and
//! pass the tier down — so a per-thread choice reaches the worker threads too.
//!
//! No build flag selects the ISA: every tier is compiled in (`#[target_feature]` functions) and
//! chosen at run time.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// A tier of vector instructions, ordered from narrowest to widest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust loops (the baseline ISA's auto-vectorisation).
    Portable = 0,
    /// AVX2 + FMA + F16C (x86-64-v3).
    Avx2 = 1,
    /// AVX-512 F/BW/VL on top of the AVX2 tier.
    Avx512 = 2,
}

/// The `--isa` / `WORKBENCH_ISA` value is not a tier, or names one this CPU lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsaError(pub String);

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IsaError {}

/// The environment variable that caps the ISA of a process (tests, library users).
pub const ENV_VAR: &str = "WORKBENCH_ISA";

impl Isa {
    /// Every tier, widest first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Portable];

    /// The name `parse` accepts and results record.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses `avx512`, `avx2` or `portable`.
    pub fn parse(text: &str) -> Result<Isa, IsaError> {
        match text {
            "avx512" => Ok(Isa::Avx512),
            "avx2" => Ok(Isa::Avx2),
            "portable" => Ok(Isa::Portable),
            other => Err(IsaError(format!(
                "unknown ISA '{other}': give avx512, avx2 or portable"
            ))),
        }
    }

    /// The CPU features the tier's kernels assume (as `is_x86_feature_detected!` names them).
    pub const fn features(self) -> &'static [&'static str] {
        match self {
            Isa::Portable => &[],
            Isa::Avx2 => &["avx2", "fma", "f16c"],
            Isa::Avx512 => &["avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"],
        }
    }

    /// The features of this tier that this CPU lacks (empty: the CPU runs it).
    pub fn missing(self) -> Vec<&'static str> {
        self.features()
            .iter()
            .copied()
            .filter(|f| !cpu_has(f))
            .collect()
    }

    /// Whether this CPU runs the tier's kernels.
    pub fn supported(self) -> bool {
        self.missing().is_empty()
    }

    /// The widest tier this CPU runs (probed once).
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .find(|i| i.supported())
                .unwrap_or(Isa::Portable)
        })
    }

    /// Every tier this CPU runs, widest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.supported()).collect()
    }

    /// The tier kernels called from this thread use now: the detected tier, lowered by the
    /// process cap and by a `with_isa` on this thread.
    pub fn active() -> Isa {
        let capped = Isa::detected().min(cap());
        match THREAD_ISA.with(Cell::get) {
            Some(t) => capped.min(t),
            None => capped,
        }
    }

    /// Whether the AVX2 + FMA + F16C instructions may be used (this tier or wider).
    pub fn has_avx2(self) -> bool {
        self >= Isa::Avx2
    }

    /// Whether the AVX-512 F/BW/VL instructions may be used.
    pub fn has_avx512(self) -> bool {
        self >= Isa::Avx512
    }

    /// Whether AVX-512 VNNI (`vpdpbusd`) may be used: the AVX-512 tier on a CPU that has it.
    /// The AVX2 tier never uses AVX-VNNI, so that it is exactly what an x86-64-v3 CPU gets.
    pub fn has_avx512_vnni(self) -> bool {
        self.has_avx512() && cpu_has("avx512vnni")
    }

    /// This tier, or the narrower one the CPU and the cap allow, with a line saying why when
    /// it had to be lowered (for a variant that asked for `isa=...` explicitly).
    pub fn require(self) -> Result<Isa, IsaError> {
        let missing = self.missing();
        if !missing.is_empty() {
            return Err(IsaError(format!(
                "isa {} needs {}, which this CPU lacks",
                self.name(),
                missing.join(", ")
            )));
        }
        let allowed = Isa::active();
        if self > allowed {
            return Err(IsaError(format!(
                "isa {} is above the ISA cap of this run ({}; see --isa and {ENV_VAR})",
                self.name(),
                allowed.name()
            )));
        }
        Ok(self)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the CPU has one feature (`is_x86_feature_detected!` names); false off x86-64.
pub fn cpu_has(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        match feature {
            "avx512f" => has!("avx512f"),
            "avx512bw" => has!("avx512bw"),
            "avx512vl" => has!("avx512vl"),
            "avx512vnni" => has!("avx512vnni"),
            "avx2" => has!("avx2"),
            "fma" => has!("fma"),
            "f16c" => has!("f16c"),
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}

/// The cap: `u8::MAX` = not yet read from the environment.
static CAP: AtomicU8 = AtomicU8::new(u8::MAX);

thread_local! {
    static THREAD_ISA: Cell<Option<Isa>> = const { Cell::new(None) };
}

fn from_u8(v: u8) -> Isa {
    match v {
        0 => Isa::Portable,
        1 => Isa::Avx2,
        _ => Isa::Avx512,
    }
}

/// The cap `WORKBENCH_ISA` asks for: `Ok(None)` when unset or empty.
pub fn cap_from_env() -> Result<Option<Isa>, IsaError> {
    match std::env::var(ENV_VAR) {
        Ok(v) if !v.trim().is_empty() => {
            let isa = Isa::parse(v.trim()).map_err(|e| IsaError(format!("{ENV_VAR}: {e}")))?;
            check_supported(isa).map_err(|e| IsaError(format!("{ENV_VAR}: {e}")))?;
            Ok(Some(isa))
        }
        _ => Ok(None),
    }
}

fn check_supported(isa: Isa) -> Result<(), IsaError> {
    refusal(isa, &isa.missing(), Isa::detected()).map_or(Ok(()), Err)
}

/// The error for a tier whose features `missing` a CPU of tier `has` lacks (none if nothing is
/// missing).
fn refusal(isa: Isa, missing: &[&str], has: Isa) -> Option<IsaError> {
    (!missing.is_empty()).then(|| {
        IsaError(format!(
            "this CPU lacks {} (needed by isa {}; it has {})",
            missing.join(", "),
            isa.name(),
            has.name()
        ))
    })
}

/// The process-wide cap: set by `set_cap`, else `WORKBENCH_ISA`, else the detected tier. An
/// invalid `WORKBENCH_ISA` is ignored here (the harness refuses it at start-up with
/// `cap_from_env`; a library user gets the detected tier).
pub fn cap() -> Isa {
    let v = CAP.load(Ordering::Relaxed);
    if v != u8::MAX {
        return from_u8(v);
    }
    let isa = cap_from_env().ok().flatten().unwrap_or(Isa::detected());
    // Another thread may have called set_cap meanwhile: keep its value.
    let _ = CAP.compare_exchange(u8::MAX, isa as u8, Ordering::Relaxed, Ordering::Relaxed);
    from_u8(CAP.load(Ordering::Relaxed))
}

/// Caps the ISA of the whole process (the harness's `--isa`). Refuses a tier this CPU lacks,
/// naming the missing features.
pub fn set_cap(isa: Isa) -> Result<(), IsaError> {
    check_supported(isa)?;
    CAP.store(isa as u8, Ordering::Relaxed);
    Ok(())
}

/// Runs `f` with kernels called from this thread capped at `isa` (tests: every tier side by
/// side in one process). Refuses a tier this CPU lacks.
pub fn with_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> Result<R, IsaError> {
    check_supported(isa)?;
    struct Restore(Option<Isa>);
    impl Drop for Restore {
        fn drop(&mut self) {
            THREAD_ISA.with(|t| t.set(self.0));
        }
    }
    let _restore = Restore(THREAD_ISA.with(|t| t.replace(Some(isa))));
    Ok(f())
}

/// Every tier this process can run (the CPU has it and the cap allows it), widest first; the
/// others are named on stderr once per process, so a test that loops over these never skips a
/// path silently.
pub fn runnable() -> Vec<Isa> {
    static REPORTED: std::sync::Once = std::sync::Once::new();
    REPORTED.call_once(|| {
        for isa in Isa::ALL {
            if !isa.supported() {
                eprintln!(
                    "skipped: isa {} (this CPU lacks {})",
                    isa.name(),
                    isa.missing().join(", ")
                );
            } else if isa > cap() {
                eprintln!(
                    "skipped: isa {} (above the process cap {}, {ENV_VAR})",
                    isa.name(),
                    cap().name()
                );
            }
        }
    });
    Isa::ALL
        .into_iter()
        .filter(|&i| i.supported() && i <= cap())
        .collect()
}

/// Runs `f` once per tier this process can run (widest first, `runnable`) under `with_isa`;
/// returns those tiers.
pub fn for_each_available(mut f: impl FnMut(Isa)) -> Vec<Isa> {
    let ran = runnable();
    for &isa in &ran {
        with_isa(isa, || f(isa)).expect("a supported tier");
    }
    ran
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()).unwrap(), isa);
        }
        let e = Isa::parse("sse9").unwrap_err();
        assert!(e.0.contains("unknown ISA 'sse9'"), "{e}");
    }

    #[test]
    fn portable_is_always_available_and_tiers_nest() {
        assert!(Isa::Portable.supported());
        let avail = Isa::available();
        assert_eq!(avail.last(), Some(&Isa::Portable));
        assert_eq!(avail[0], Isa::detected());
        // A CPU that runs a tier runs every narrower one.
        for w in Isa::ALL.windows(2) {
            assert!(!w[0].supported() || w[1].supported());
        }
    }

    #[test]
    fn with_isa_lowers_this_thread_only_and_restores() {
        let before = Isa::active();
        with_isa(Isa::Portable, || {
            assert_eq!(Isa::active(), Isa::Portable);
            let other = std::thread::spawn(Isa::active).join().unwrap();
            assert_eq!(other, Isa::detected().min(cap()));
            // Nested: the narrower wins while it lasts.
            with_isa(Isa::Portable, || assert_eq!(Isa::active(), Isa::Portable)).unwrap();
        })
        .unwrap();
        assert_eq!(Isa::active(), before);
    }

    #[test]
    fn the_refusal_names_the_missing_features() {
        let e = refusal(Isa::Avx512, &["avx512f", "avx512bw"], Isa::Avx2).unwrap();
        assert_eq!(
            e.0,
            "this CPU lacks avx512f, avx512bw (needed by isa avx512; it has avx2)"
        );
        assert!(refusal(Isa::Avx2, &[], Isa::Avx2).is_none());
    }

    #[test]
    fn a_tier_the_cpu_lacks_is_refused_by_name() {
        for isa in Isa::ALL.into_iter().filter(|i| !i.supported()) {
            let e = with_isa(isa, || ()).unwrap_err();
            assert!(e.0.contains("lacks"), "{e}");
            assert!(isa.require().is_err());
        }
        assert!(Isa::Portable.require().is_ok());
    }

    #[test]
    fn every_available_tier_runs() {
        let mut seen = vec![];
        let ran = for_each_available(|isa| {
            assert_eq!(Isa::active(), isa);
            seen.push(isa);
        });
        assert_eq!(ran, seen);
        let want: Vec<Isa> = Isa::available()
            .into_iter()
            .filter(|&i| i <= cap())
            .collect();
        assert_eq!(ran, want);
    }
}
