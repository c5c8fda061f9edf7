//! One CUDA context and stream per process (`CudaRuntime::get`), the module cache (each
//! `.cu` compiled by NVRTC for the device's own `compute_XY` at first use), device buffers of
//! plain element types, and timing with CUDA events.
//!
//! Timing (`CudaRuntime::time_with`): one untimed warm-up launch, then each repetition
//! between two events. Cold (`Flush::Cold`, the default): before each repetition, outside
//! its events, a scratch buffer of twice the L2 (`flush_bytes`; allocated once per runtime)
//! is written with `cuMemsetD8Async`, so a kernel's inputs come from device memory and not
//! from what the warm-up or the previous repetition left in L2 (the H200's 50 MB L2 holds a
//! 25 MB weight matrix whole). Hot (`Flush::Hot`): no flush, the inputs as L2 left them.
//! The memset leaves dirty lines in L2 that the timed kernel's reads evict (written back
//! during it), as with Triton's `do_bench` and nvbench's flush: a cold time can be slightly
//! pessimistic, never L2-inflated. The family crates' launchers call `time`, which takes
//! the mode of the calling thread (`Flush::scoped`), so a caller gets their hot timings
//! without a change in the families.

use crate::nvrtc;
use crate::probe::probe_cuda;
use crate::KernelSource;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use kernel_common::error::{KernelError, Result};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The L2 size assumed when the driver reports none: the H200's 50 MiB.
pub const FALLBACK_L2_BYTES: usize = 50 << 20;

/// Bytes of the flush buffer for an L2 of `l2_bytes` (0: unknown, the H200's assumed):
/// twice the L2, so writing it evicts every line a kernel's inputs left there whatever the
/// replacement policy.
pub fn flush_bytes(l2_bytes: usize) -> usize {
    2 * if l2_bytes == 0 {
        FALLBACK_L2_BYTES
    } else {
        l2_bytes
    }
}

/// What a timed repetition finds in L2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flush {
    /// L2 flushed before each repetition (outside its events): inputs from device memory.
    /// What every result reports by default.
    #[default]
    Cold,
    /// No flush: each repetition finds what the warm-up and the previous one left in L2.
    Hot,
}

thread_local! {
    static FLUSH: Cell<Flush> = const { Cell::new(Flush::Cold) };
}

/// Restores the calling thread's previous mode when dropped (also on a panic).
struct Restore(Flush);

impl Drop for Restore {
    fn drop(&mut self) {
        FLUSH.with(|m| m.set(self.0));
    }
}

impl Flush {
    /// The mode `CudaRuntime::time` uses on this thread (cold unless inside `scoped`).
    pub fn current() -> Flush {
        FLUSH.with(Cell::get)
    }

    /// Runs `f` with `CudaRuntime::time` in `self`'s mode on this thread, then restores the
    /// previous mode. The family crates' `time(reps)` launchers call `time`: this is how the
    /// harness gets their hot timings.
    pub fn scoped<R>(self, f: impl FnOnce() -> R) -> R {
        let _restore = Restore(FLUSH.with(|m| m.replace(self)));
        f()
    }
}

/// Turns a driver error into one line naming what was being done.
pub fn driver<T>(r: std::result::Result<T, cudarc::driver::DriverError>, what: &str) -> Result<T> {
    r.map_err(|e| KernelError::DeviceFailure(format!("CUDA {what}: {e}")))
}

/// The process's CUDA context, stream and compiled modules.
pub struct CudaRuntime {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// Device name from the driver.
    pub name: String,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: usize,
    /// L2 size in bytes (`FALLBACK_L2_BYTES` when the driver reports none).
    pub l2_bytes: usize,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// The cold timings' flush buffer, `flush_bytes(l2_bytes)`, allocated at first use.
    flush: Mutex<Option<CudaSlice<u8>>>,
}

static RUNTIME: Mutex<Option<Arc<CudaRuntime>>> = Mutex::new(None);

impl CudaRuntime {
    /// The runtime for device `ordinal`, created on first use: probes the driver (never
    /// panics without one), checks NVRTC, creates the context and one stream.
    pub fn get(ordinal: usize) -> Result<Arc<CudaRuntime>> {
        let mut slot = RUNTIME.lock().expect("runtime lock");
        if let Some(rt) = slot.as_ref() {
            if rt.ctx.ordinal() != ordinal {
                return Err(KernelError::Device(format!(
                    "this process already uses cuda:{}; one device per run",
                    rt.ctx.ordinal()
                )));
            }
            return Ok(rt.clone());
        }
        probe_cuda(ordinal)?;
        nvrtc::require_nvrtc()?;
        let ctx = driver(CudaContext::new(ordinal), "context")?;
        let stream = driver(ctx.new_stream(), "stream")?;
        let attr = |a| driver(ctx.attribute(a), "device attribute");
        let rt = Arc::new(CudaRuntime {
            name: driver(ctx.name(), "device name")?,
            capability: driver(ctx.compute_capability(), "compute capability")?,
            sm_count: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                as usize,
            l2_bytes: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
                .ok()
                .filter(|&b| b > 0)
                .map_or(FALLBACK_L2_BYTES, |b| b as usize),
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
            flush: Mutex::new(None),
        });
        *slot = Some(rt.clone());
        Ok(rt)
    }

    /// The runtime this process already opened (`harness … --device cuda:N` opens it while
    /// validating the request), or device 0's.
    pub fn current() -> Result<Arc<CudaRuntime>> {
        let existing = RUNTIME.lock().expect("runtime lock").clone();
        match existing {
            Some(rt) => Ok(rt),
            None => CudaRuntime::get(0),
        }
    }

    /// `compute_XY` for this device.
    pub fn ptx_arch(&self) -> String {
        format!("compute_{}{}", self.capability.0, self.capability.1)
    }

    /// The entry `entry` of `source`, compiling and loading the module at first use. A
    /// compile failure carries NVRTC's log.
    pub fn function(&self, source: &KernelSource, entry: &str) -> Result<CudaFunction> {
        if !source.entries.contains(&entry) {
            return Err(KernelError::Unsupported(format!(
                "{} has no kernel {entry}",
                source.file
            )));
        }
        let module = {
            let mut modules = self.modules.lock().expect("module cache lock");
            match modules.get(source.file) {
                Some(m) => m.clone(),
                None => {
                    let compiled = nvrtc::compile(source, &self.ptx_arch(), false)?;
                    let ptx = cudarc::nvrtc::Ptx::from_src(compiled.ptx.unwrap_or_default());
                    let m = driver(self.ctx.load_module(ptx), "module load")?;
                    modules.insert(source.file, m.clone());
                    m
                }
            }
        };
        driver(module.load_function(entry), entry)
    }

    /// How many blocks of `threads` threads (no dynamic shared memory) of `f` one
    /// multiprocessor holds at once, by the driver's occupancy calculator (registers, shared
    /// memory and the per-SM limits of this device).
    pub fn blocks_per_sm(&self, f: &CudaFunction, threads: usize) -> Result<usize> {
        let n = driver(
            f.occupancy_max_active_blocks_per_multiprocessor(threads as u32, 0, None),
            "occupancy",
        )?;
        Ok(n as usize)
    }

    /// Copies `host` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        driver(self.stream.clone_htod(host), "host-to-device copy")
    }

    /// A zeroed device buffer of `n` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        driver(self.stream.alloc_zeros::<T>(n.max(1)), "allocation")
    }

    /// Copies a device buffer back (synchronises the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>> {
        driver(self.stream.clone_dtoh(dev), "device-to-host copy")
    }

    /// Waits for all queued work and reports any asynchronous error of a launch.
    pub fn sync(&self) -> Result<()> {
        driver(self.stream.synchronize(), "synchronize (a kernel failed)")
    }

    /// Queues a write of the flush buffer (`flush_bytes(l2_bytes)`, allocated at the first
    /// call) on the stream with `cuMemsetD8Async`: every line L2 held is evicted by the
    /// time the stream's next work starts.
    pub fn flush_l2(&self) -> Result<()> {
        let mut slot = self.flush.lock().expect("flush buffer lock");
        if slot.is_none() {
            let bytes = flush_bytes(self.l2_bytes);
            // SAFETY: the buffer is only ever written (by the memset below), never read, so
            // its first contents do not matter.
            let buf = unsafe { self.stream.alloc::<u8>(bytes) };
            *slot = Some(driver(buf, "L2 flush buffer allocation")?);
        }
        let buf = slot.as_mut().expect("allocated above");
        driver(self.stream.memset_zeros(buf), "L2 flush (cuMemsetD8Async)")
    }

    /// `time_with` in this thread's mode (`Flush::current`: cold unless inside
    /// `Flush::scoped`).
    pub fn time(&self, reps: usize, launch: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
        self.time_with(Flush::current(), reps, launch)
    }

    /// `time_with(Flush::Cold, ..)`, whatever this thread's mode.
    pub fn time_cold(&self, reps: usize, launch: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
        self.time_with(Flush::Cold, reps, launch)
    }

    /// `time_with(Flush::Hot, ..)`, whatever this thread's mode.
    pub fn time_hot(&self, reps: usize, launch: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
        self.time_with(Flush::Hot, reps, launch)
    }

    /// Runs `launch` once to warm up, then `reps` times (at least once), each between two
    /// CUDA events, L2 flushed before each (outside the events) when `flush` is cold;
    /// returns the seconds of each repetition.
    pub fn time_with(
        &self,
        flush: Flush,
        reps: usize,
        mut launch: impl FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        launch()?;
        self.sync()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut samples = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            if flush == Flush::Cold {
                self.flush_l2()?;
            }
            let start = driver(self.stream.record_event(flags), "event")?;
            launch()?;
            let end = driver(self.stream.record_event(flags), "event")?;
            driver(end.synchronize(), "event synchronize")?;
            let ms = driver(start.elapsed_ms(&end), "event elapsed time")?;
            samples.push(ms as f64 / 1e3);
        }
        Ok(samples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_buffer_is_twice_the_l2_or_the_h200s() {
        assert_eq!(flush_bytes(50 << 20), 100 << 20);
        assert_eq!(flush_bytes(40 << 20), 80 << 20);
        assert_eq!(flush_bytes(0), 2 * FALLBACK_L2_BYTES);
        assert_eq!(FALLBACK_L2_BYTES, 50 << 20);
    }

    #[test]
    fn the_flush_mode_is_cold_unless_scoped_and_restored_after() {
        assert_eq!(Flush::current(), Flush::Cold);
        let inner = Flush::Hot.scoped(|| {
            let nested = Flush::Cold.scoped(Flush::current);
            (Flush::current(), nested)
        });
        assert_eq!(inner, (Flush::Hot, Flush::Cold));
        assert_eq!(Flush::current(), Flush::Cold);
        let caught = std::panic::catch_unwind(|| Flush::Hot.scoped(|| panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(Flush::current(), Flush::Cold, "restored after a panic");
        // Another thread has its own mode.
        Flush::Hot.scoped(|| {
            let there = std::thread::spawn(Flush::current).join().unwrap();
            assert_eq!(there, Flush::Cold);
        });
    }
}
