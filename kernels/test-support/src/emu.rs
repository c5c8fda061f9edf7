//! CPU emulation of the workbench's `.cu` kernels, for tests on machines without a GPU:
//! each source is compiled by g++ with `emulate.h`, `emulate_warp.h` and `emulate_math.h`
//! (CUDA threads as coroutines, two blocks interleaved, NaN-poisoned shared memory, barriers,
//! masked warp shuffles, the m16n8k16 MMA from its fragment layout, ldmatrix, queued cp.async,
//! alignment checks, the fast-math intrinsics' worst-case errors) into a shared library,
//! loaded, and launched by entry name with the grid, block and arguments the host plans give;
//! each buffer is staged in its own 256-byte-aligned allocation of exactly its length, as
//! `cuMemAlloc` aligns. It checks what the kernels compute and where they would fault, not how
//! fast, and not the memory model. With `WORKBENCH_EMU_SANITIZE=1` the library is built with
//! AddressSanitizer and UndefinedBehaviorSanitizer (a separate cached build), which loads only
//! in a process that has the ASan runtime preloaded (`sanitized`).

use kernel_common::error::{KernelError, Result};
use kernel_cuda::{KernelSource, Launch};
use std::alloc::{alloc, dealloc, Layout};
use std::ffi::{c_char, c_void, CString};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::Command;

/// The emulator's text, prepended to every source: `emulate.h`, `emulate_warp.h`,
/// `emulate_math.h`.
pub const EMULATE_H: &str = concat!(
    include_str!("emulate.h"),
    "\n",
    include_str!("emulate_warp.h"),
    "\n",
    include_str!("emulate_math.h")
);

/// The environment variable that builds the kernels with ASan and UBSan (`1`).
pub const SANITIZE: &str = "WORKBENCH_EMU_SANITIZE";

/// Whether this process builds sanitised kernels (`WORKBENCH_EMU_SANITIZE=1`).
pub fn sanitizing() -> bool {
    std::env::var(SANITIZE).is_ok_and(|v| v == "1")
}

/// Whether the ASan runtime is preloaded into this process (what sanitised kernels need).
pub fn asan_preloaded() -> bool {
    std::env::var("LD_PRELOAD").is_ok_and(|p| p.contains("libasan"))
}

/// The environment variable that plants a mutation (`mutations::SWITCH`; here so that the
/// layers above — `sanitized`, then `mutations` — import downwards only).
pub const MUTATION_SWITCH: &str = "WORKBENCH_EMU_MUTATION";

type RunFn = unsafe extern "C" fn(
    *const c_char,
    u32,
    u32,
    u32,
    u32,
    *mut *mut c_void,
    *mut c_char,
    usize,
) -> i32;

/// One kernel argument, as the entry point's signature takes it.
pub enum Arg<'a> {
    /// A buffer the kernel reads (a `const T*`).
    In(&'a [u8]),
    /// A buffer the kernel writes (a `T*`).
    Out(&'a mut [u8]),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// A `.cu` compiled for the emulator.
pub struct EmuModule {
    _lib: libloading::Library,
    run: RunFn,
    file: &'static str,
    path: PathBuf,
}

/// Why the emulator cannot run here, or `None` when g++ is available.
pub fn unavailable() -> Option<String> {
    match Command::new("g++")
        .arg("--version")
        .env_remove("LD_PRELOAD")
        .output()
    {
        Ok(o) if o.status.success() => None,
        _ => Some("g++ not found: the CUDA emulator compiles kernels with it".into()),
    }
}

impl EmuModule {
    /// Compiles `source` (cached by content in the temp directory) and loads it.
    pub fn build(source: &KernelSource) -> Result<EmuModule> {
        let mut text = String::new();
        text.push_str(EMULATE_H);
        // Diagnostics (g++'s, the sanitisers') name the prelude and the .cu by their own lines.
        match source.code.strip_prefix(kernel_cuda::PRELUDE) {
            Some(kernel) => {
                text.push_str("\n#line 1 \"prelude.cuh\"\n");
                text.push_str(kernel_cuda::PRELUDE);
                text.push_str(&format!("\n#line 1 \"{}\"\n", source.file));
                text.push_str(kernel);
            }
            None => {
                text.push_str(&format!("\n#line 1 \"{}\"\n", source.file));
                text.push_str(source.code);
            }
        }
        text.push_str(
            "\nextern \"C\" __attribute__((visibility(\"default\"))) int emu_run(const char* entry, unsigned gx, unsigned gy, unsigned gz, \
             unsigned threads, void** args, char* err, size_t err_len) {\n    dim3e grid{gx, gy, gz};\n",
        );
        for e in source.entries {
            text.push_str(&format!("    EMU_ENTRY({e})\n"));
        }
        text.push_str(
            "    std::snprintf(err, err_len, \"no entry %s\", entry);\n    return 2;\n}\n",
        );
        // Which entries this library has (the fake libcuda routes launches by it).
        text.push_str(
            "extern \"C\" __attribute__((visibility(\"default\"))) int emu_has(const char* entry) {\n",
        );
        for e in source.entries {
            text.push_str(&format!(
                "    if (std::strcmp(entry, \"{e}\") == 0) return 1;\n"
            ));
        }
        text.push_str("    return 0;\n}\n");
        let sanitize = sanitizing();
        let flags: &[&str] = if sanitize {
            &[
                "-O1",
                "-g",
                "-fno-omit-frame-pointer",
                "-fsanitize=address,undefined",
                "-fno-sanitize-recover=all",
                "-DWORKBENCH_EMU_SANITIZE",
            ]
        } else {
            &["-O2"]
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        flags.hash(&mut h);
        let dir = std::env::temp_dir().join("workbench-cuda-emu");
        std::fs::create_dir_all(&dir)
            .map_err(|e| KernelError::Device(format!("emulator: {}: {e}", dir.display())))?;
        let stem = format!(
            "{}{}-{:016x}",
            source.file.trim_end_matches(".cu"),
            if sanitize { "-asan-ubsan" } else { "" },
            h.finish()
        );
        let lib: PathBuf = dir.join(format!("{stem}.so"));
        // One build at a time in this process (test threads share the temporary names below);
        // other processes write their own, and the rename is atomic.
        static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _building = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        if !lib.exists() {
            // The source stays beside the library (what a debugger or a report would open).
            let cpp = dir.join(format!("{stem}.cpp"));
            let cpp_tmp = dir.join(format!("{stem}.{}.cpp", std::process::id()));
            std::fs::write(&cpp_tmp, &text)
                .and_then(|()| std::fs::rename(&cpp_tmp, &cpp))
                .map_err(|e| KernelError::Device(format!("emulator: {}: {e}", cpp.display())))?;
            let tmp = dir.join(format!("{stem}.{}.so", std::process::id()));
            // Hidden symbols and no STB_GNU_UNIQUE: two libraries loaded in one process (moe.cu
            // and experts.cu) must not share the emulator's statics or `__shared__` storage.
            let out = Command::new("g++")
                .env_remove("LD_PRELOAD") // g++ itself runs uninstrumented
                .args(flags)
                .args([
                    "-std=c++17",
                    "-shared",
                    "-fPIC",
                    "-pthread",
                    "-fvisibility=hidden",
                    "-fno-gnu-unique",
                    "-DWORKBENCH_EMULATE",
                    "-w",
                ])
                .arg(&cpp)
                .arg("-o")
                .arg(&tmp)
                .output()
                .map_err(|e| KernelError::Device(format!("emulator: cannot run g++: {e}")))?;
            if !out.status.success() {
                return Err(KernelError::Device(format!(
                    "emulator: g++ could not compile {}:\n{}",
                    source.file,
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            std::fs::rename(&tmp, &lib)
                .map_err(|e| KernelError::Device(format!("emulator: {e}")))?;
        }
        Self::load(source, lib)
    }

    /// The shared library for `source` (built if needed), for loaders other than this one
    /// (the fake libcuda of the tests).
    pub fn library(source: &KernelSource) -> Result<PathBuf> {
        Ok(Self::build(source)?.path)
    }

    fn load(source: &KernelSource, lib: PathBuf) -> Result<EmuModule> {
        if sanitizing() && !asan_preloaded() {
            // The ASan runtime ends the process when a library needs it and it came late.
            return Err(KernelError::Device(format!(
                "emulator: {SANITIZE}=1 builds kernels with AddressSanitizer, whose runtime must \
                 be preloaded: LD_PRELOAD=$(g++ -print-file-name=libasan.so) (see \
                 kernel_test_support::sanitized)"
            )));
        }
        // SAFETY: the library was just built from our sources; loading runs no constructors
        // beyond the C++ runtime's.
        let loaded = unsafe { libloading::Library::new(&lib) }.map_err(|e| {
            KernelError::Device(format!("emulator: loading {}: {e}", lib.display()))
        })?;
        // SAFETY: `emu_run` is defined above with exactly this signature.
        let run: RunFn = unsafe {
            *loaded
                .get::<RunFn>(b"emu_run\0")
                .map_err(|e| KernelError::Device(format!("emulator: {e}")))?
        };
        Ok(EmuModule {
            _lib: loaded,
            run,
            file: source.file,
            path: lib,
        })
    }

    /// Runs `entry` over `launch`'s grid with `args` (dynamic shared memory is not used by
    /// the workbench's kernels and must be 0).
    pub fn launch(&self, entry: &str, launch: Launch, args: &mut [Arg]) -> Result<()> {
        if launch.smem != 0 || launch.block.1 != 1 || launch.block.2 != 1 {
            return Err(KernelError::Unsupported(
                "emulator: 1-D blocks without dynamic shared memory only".into(),
            ));
        }
        // Device buffers as `cuMemAlloc` gives them: 256-byte aligned, and as long as asked
        // for (one byte past the end is another allocation's redzone under ASan).
        let mut staged: Vec<Staged> = args
            .iter()
            .filter_map(|a| match a {
                Arg::In(b) => Some(Staged::new(b)),
                Arg::Out(b) => Some(Staged::new(b)),
                _ => None,
            })
            .collect();
        // CUDA's convention: an array of pointers to the argument values.
        let mut ptrs: Vec<*mut c_void> = Vec::with_capacity(args.len());
        let mut ints: Vec<i32> = vec![];
        let mut longs: Vec<i64> = vec![];
        let mut floats: Vec<f32> = vec![];
        let mut bufs: Vec<*mut c_void> = staged.iter_mut().map(|s| s.ptr.cast()).collect();
        for a in args.iter() {
            match a {
                Arg::I32(v) => ints.push(*v),
                Arg::I64(v) => longs.push(*v),
                Arg::F32(v) => floats.push(*v),
                Arg::In(_) | Arg::Out(_) => {}
            }
        }
        let (mut bi, mut ii, mut li, mut fi) = (0, 0, 0, 0);
        for a in args.iter() {
            let p: *mut c_void = match a {
                Arg::In(_) | Arg::Out(_) => {
                    bi += 1;
                    (&mut bufs[bi - 1]) as *mut *mut c_void as *mut c_void
                }
                Arg::I32(_) => {
                    ii += 1;
                    (&mut ints[ii - 1]) as *mut i32 as *mut c_void
                }
                Arg::I64(_) => {
                    li += 1;
                    (&mut longs[li - 1]) as *mut i64 as *mut c_void
                }
                Arg::F32(_) => {
                    fi += 1;
                    (&mut floats[fi - 1]) as *mut f32 as *mut c_void
                }
            };
            ptrs.push(p);
        }
        let name = CString::new(entry).expect("entry names hold no NUL");
        // A library's emulator state (the running blocks, `__shared__` storage) is global to it.
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let mut err = vec![0u8; 512];
        // SAFETY: the pointers stay alive for the call; the argument kinds follow the entry's
        // signature (the caller's responsibility, as with a real launch).
        let rc = unsafe {
            (self.run)(
                name.as_ptr(),
                launch.grid.0,
                launch.grid.1,
                launch.grid.2,
                launch.block.0,
                ptrs.as_mut_ptr(),
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if rc == 0 {
            let mut outs = staged.iter();
            for a in args.iter_mut() {
                match a {
                    Arg::In(_) => {
                        outs.next();
                    }
                    Arg::Out(b) => outs
                        .next()
                        .expect("one staged buffer per buffer")
                        .copy_to(b),
                    _ => {}
                }
            }
            return Ok(());
        }
        let msg = String::from_utf8_lossy(&err[..err.iter().position(|&b| b == 0).unwrap_or(0)])
            .into_owned();
        Err(KernelError::DeviceFailure(format!(
            "emulated {}::{entry}: {msg}",
            self.file
        )))
    }
}

/// A buffer's bytes at a 256-byte-aligned address, in an allocation of exactly its length.
struct Staged {
    ptr: *mut u8,
    layout: Layout,
}

impl Staged {
    fn new(bytes: &[u8]) -> Staged {
        let layout = Layout::from_size_align(bytes.len().max(1), 256).expect("a buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc(layout) };
        assert!(!ptr.is_null(), "emulator: out of memory staging a buffer");
        // SAFETY: `ptr` holds at least `bytes.len()` bytes and does not overlap `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        Staged { ptr, layout }
    }

    fn copy_to(&self, out: &mut [u8]) {
        // SAFETY: staged from a slice of `out.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), out.len()) };
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}
