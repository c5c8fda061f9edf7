//! CPU emulation of the workbench's `.cu` kernels, for tests on machines without a GPU:
//! each source is compiled by g++ with `emulate.h` (CUDA threads as coroutines, barriers,
//! warp shuffles, the m16n8k16 MMA from its fragment layout) into a shared library, loaded,
//! and launched by entry name with the grid, block and arguments the host plans give. It
//! checks what the kernels compute, not how fast, and not the memory model.

use kernel_common::error::{KernelError, Result};
use kernel_cuda::{KernelSource, Launch};
use std::ffi::{c_char, c_void, CString};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::Command;

/// `emulate.h`'s text.
pub const EMULATE_H: &str = include_str!("emulate.h");

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
    match Command::new("g++").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("g++ not found: the CUDA emulator compiles kernels with it".into()),
    }
}

impl EmuModule {
    /// Compiles `source` (cached by content in the temp directory) and loads it.
    pub fn build(source: &KernelSource) -> Result<EmuModule> {
        let mut text = String::new();
        text.push_str(EMULATE_H);
        text.push('\n');
        text.push_str(source.code);
        text.push_str(
            "\nextern \"C\" int emu_run(const char* entry, unsigned gx, unsigned gy, unsigned gz, \
             unsigned threads, void** args, char* err, size_t err_len) {\n    dim3e grid{gx, gy, gz};\n",
        );
        for e in source.entries {
            text.push_str(&format!("    EMU_ENTRY({e})\n"));
        }
        text.push_str(
            "    std::snprintf(err, err_len, \"no entry %s\", entry);\n    return 2;\n}\n",
        );
        // Which entries this library has (the fake libcuda routes launches by it).
        text.push_str("extern \"C\" int emu_has(const char* entry) {\n");
        for e in source.entries {
            text.push_str(&format!(
                "    if (std::strcmp(entry, \"{e}\") == 0) return 1;\n"
            ));
        }
        text.push_str("    return 0;\n}\n");
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        let dir = std::env::temp_dir().join("workbench-cuda-emu");
        std::fs::create_dir_all(&dir)
            .map_err(|e| KernelError::Device(format!("emulator: {}: {e}", dir.display())))?;
        let stem = format!(
            "{}-{:016x}",
            source.file.trim_end_matches(".cu"),
            h.finish()
        );
        let lib: PathBuf = dir.join(format!("{stem}.so"));
        // One build at a time in this process (test threads share the temporary names below);
        // other processes write their own, and the rename is atomic.
        static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _building = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        if !lib.exists() {
            let cpp = dir.join(format!("{stem}.{}.cpp", std::process::id()));
            std::fs::write(&cpp, &text)
                .map_err(|e| KernelError::Device(format!("emulator: {}: {e}", cpp.display())))?;
            let tmp = dir.join(format!("{stem}.{}.so", std::process::id()));
            let out = Command::new("g++")
                .args([
                    "-O2",
                    "-std=c++17",
                    "-shared",
                    "-fPIC",
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
            let _ = std::fs::remove_file(&cpp);
        }
        Self::load(source, lib)
    }

    /// The shared library for `source` (built if needed), for loaders other than this one
    /// (the fake libcuda of the tests).
    pub fn library(source: &KernelSource) -> Result<PathBuf> {
        Ok(Self::build(source)?.path)
    }

    fn load(source: &KernelSource, lib: PathBuf) -> Result<EmuModule> {
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
        // CUDA's convention: an array of pointers to the argument values.
        let mut ptrs: Vec<*mut c_void> = Vec::with_capacity(args.len());
        let mut ints: Vec<i32> = vec![];
        let mut longs: Vec<i64> = vec![];
        let mut floats: Vec<f32> = vec![];
        let mut bufs: Vec<*mut c_void> = vec![];
        for a in args.iter_mut() {
            match a {
                Arg::In(b) => bufs.push(b.as_ptr() as *mut c_void),
                Arg::Out(b) => bufs.push(b.as_mut_ptr().cast()),
                Arg::I32(v) => ints.push(*v),
                Arg::I64(v) => longs.push(*v),
                Arg::F32(v) => floats.push(*v),
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
        // The emulator's state (the running block, `__shared__` statics) is process-global.
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
