//! One CUDA context and stream per process (`CudaRuntime::get`), the module cache (each
//! `.cu` compiled by NVRTC for the device's own `compute_XY` at first use), device buffers of
//! plain element types, and timing with CUDA events.

use crate::nvrtc;
use crate::probe::probe_cuda;
use crate::KernelSource;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use kernel_common::error::{KernelError, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
    /// L2 size in bytes.
    pub l2_bytes: usize,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
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
            l2_bytes: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
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

    /// Runs `launch` once to warm up, then `reps` times, each between two CUDA events;
    /// returns the seconds of each repetition.
    pub fn time(&self, reps: usize, mut launch: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
        launch()?;
        self.sync()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut samples = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
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
