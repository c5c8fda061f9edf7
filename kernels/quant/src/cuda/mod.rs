//! CUDA dequantising GEMV / skinny GEMM (Y = X·Wᵀ, batch ≤ 8) for f16 (the baseline),
//! `sym4g32` (int4 symmetric, f16 scale per 32) and ggml `q4_0`/`q8_0`, compiled from
//! `quant.cu`; the weight bytes are the CPU `QuantMatrix`'s, uploaded unchanged once
//! `check_gemv` has held them, x and every `int` argument against the format and shape.

use crate::format::{ScaleType, WeightFormat};
use crate::matrix::QuantMatrix;
use kernel_common::error::Result;
use kernel_common::KernelError;
use kernel_cuda::buffer::{f32_bytes, f32_from_bytes};
use kernel_cuda::cuda_launch;
use kernel_cuda::cudarc::driver::{CudaFunction, CudaSlice};
use kernel_cuda::{blocks_for, int_arg, CudaRuntime, KernelSource, Launch};
use std::sync::Arc;

/// `quant.cu` with its entry points.
pub const SOURCE: KernelSource = kernel_cuda::cuda_source!(
    "quant",
    "quant.cu",
    &["gemv_f16", "gemv_sym4g32", "gemv_q4_0", "gemv_q8_0"]
);

/// Most activation rows one launch takes (`GEMV_MAX_BATCH` in quant.cu).
pub const MAX_BATCH: usize = 8;
/// Output rows per block (one warp each).
pub const ROWS_PER_BLOCK: usize = 4;

/// The entry point for `format`, or why there is none.
pub fn gemv_entry(format: WeightFormat) -> Result<&'static str> {
    Ok(match format {
        WeightFormat::F16 => "gemv_f16",
        WeightFormat::Sym {
            bits: 4,
            group: 32,
            scale: ScaleType::F16,
        } => "gemv_sym4g32",
        WeightFormat::Q4_0 => "gemv_q4_0",
        WeightFormat::Q8_0 => "gemv_q8_0",
        other => {
            return Err(KernelError::Unsupported(format!(
                "no CUDA GEMV for {other} (f16, sym4g32, q4_0, q8_0)"
            )))
        }
    })
}

/// The launch of one GEMV: one warp per output row. Refuses what the kernel's `int`
/// arithmetic cannot hold: rows rounded up to whole blocks (the row index of a block's last
/// warp), cols.
pub fn plan_gemv(format: WeightFormat, rows: usize, cols: usize, batch: usize) -> Result<Launch> {
    gemv_entry(format)?;
    if !cols.is_multiple_of(32) || cols == 0 || rows == 0 {
        return Err(KernelError::InvalidShape(format!(
            "CUDA GEMV needs rows > 0 and cols a positive multiple of 32, got {rows} × {cols}"
        )));
    }
    if batch == 0 || batch > MAX_BATCH {
        return Err(KernelError::Unsupported(format!(
            "CUDA GEMV takes batch 1..={MAX_BATCH}, got {batch}"
        )));
    }
    let blocks = blocks_for(rows, ROWS_PER_BLOCK);
    int_arg("rows rounded up to whole blocks", blocks * ROWS_PER_BLOCK)?;
    int_arg("cols", cols)?;
    Launch::new((blocks, 1, 1), 32 * ROWS_PER_BLOCK, 0)
}

/// Checks, before anything touches the device, what the kernel indexes with: the plan
/// (format, shape, batch, `int` sizes), the matrix's bytes against its format and shape (its
/// `rows`/`cols` are public fields: the kernel reads `rows · cols/32` blocks), and x's
/// length. Returns the launch and the `int` arguments (rows, cols, batch).
pub fn check_gemv(w: &QuantMatrix, x: &[f32], batch: usize) -> Result<(Launch, [i32; 3])> {
    let launch = plan_gemv(w.format, w.rows, w.cols, batch)?;
    let want = w.format.matrix_bytes(w.rows, w.cols);
    if want != Some(w.bytes().len()) {
        return Err(KernelError::BadBuffer(format!(
            "{} {}×{} matrix holds {} bytes, its format needs {}",
            w.format,
            w.rows,
            w.cols,
            w.bytes().len(),
            want.map_or("more than usize".into(), |n| n.to_string())
        )));
    }
    if Some(x.len()) != batch.checked_mul(w.cols) {
        return Err(KernelError::BadBuffer(format!(
            "x has {} values, want batch·cols = {}",
            x.len(),
            batch * w.cols
        )));
    }
    Ok((
        launch,
        [
            int_arg("rows", w.rows)?,
            int_arg("cols", w.cols)?,
            int_arg("batch", batch)?,
        ],
    ))
}

/// A GEMV resident on the device.
pub struct DeviceGemv {
    rt: Arc<CudaRuntime>,
    f: CudaFunction,
    launch: Launch,
    w: CudaSlice<u8>,
    x: CudaSlice<u8>,
    y: CudaSlice<u8>,
    /// rows, cols, batch as the kernel's ints (checked before the device was asked for).
    args: [i32; 3],
}

impl DeviceGemv {
    /// Checks (`check_gemv`), then uploads `w` and `x` (`[batch, cols]` f32); the output
    /// starts NaN-poisoned.
    pub fn new(w: &QuantMatrix, x: &[f32], batch: usize) -> Result<DeviceGemv> {
        let (launch, args) = check_gemv(w, x, batch)?;
        let rt = CudaRuntime::current()?;
        let f = rt.function(&SOURCE, gemv_entry(w.format)?)?;
        Ok(DeviceGemv {
            w: rt.upload(w.bytes())?,
            x: rt.upload(&f32_bytes(x))?,
            y: rt.upload(&f32_bytes(&vec![f32::NAN; batch * w.rows]))?,
            rt,
            f,
            launch,
            args,
        })
    }

    /// Queues one GEMV.
    pub fn launch(&mut self) -> Result<()> {
        let [rows, cols, batch] = self.args;
        cuda_launch!(
            self.rt,
            self.f,
            self.launch,
            &self.w,
            &self.x,
            &mut self.y,
            &rows,
            &cols,
            &batch
        )
    }

    /// Runs once; Y as `[batch, rows]`.
    pub fn run(&mut self) -> Result<Vec<f32>> {
        self.launch()?;
        self.rt.sync()?;
        Ok(f32_from_bytes(&self.rt.download(&self.y)?))
    }

    /// Event-timed repetitions.
    pub fn time(&mut self, reps: usize) -> Result<Vec<f64>> {
        let rt = self.rt.clone();
        rt.time(reps, || self.launch())
    }
}

/// Y = X·Wᵀ on the device, `[batch, rows]`.
pub fn gemv_cuda(w: &QuantMatrix, x: &[f32], batch: usize) -> Result<Vec<f32>> {
    DeviceGemv::new(w, x, batch)?.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_plans() {
        assert_eq!(gemv_entry(WeightFormat::Q4_0).unwrap(), "gemv_q4_0");
        assert_eq!(
            gemv_entry(WeightFormat::parse("sym4g32").unwrap()).unwrap(),
            "gemv_sym4g32"
        );
        assert!(gemv_entry(WeightFormat::parse("sym4g32s32").unwrap()).is_err());
        assert!(gemv_entry(WeightFormat::Q4_1).is_err());
        let l = plan_gemv(WeightFormat::Q8_0, 4097, 4096, 1).unwrap();
        assert_eq!(l.grid.0, 1025);
        assert_eq!(l.block.0, 128);
        assert!(plan_gemv(WeightFormat::Q8_0, 8, 48, 1).is_err());
        assert!(plan_gemv(WeightFormat::Q8_0, 8, 64, 9).is_err());
        assert!(plan_gemv(WeightFormat::F32, 8, 64, 1).is_err());
    }

    /// The byte layout quant.cu decodes, restated from format.rs: a block's scale is an f16
    /// at offset 0 and its codes follow; sym4 packs value 2j in byte j's low nibble, q4_0
    /// value j there and value j+16 in the high one.
    #[test]
    fn the_layout_the_kernels_assume_is_the_crates() {
        for (fmt, bytes) in [("sym4g32", 18), ("q4_0", 18), ("q8_0", 34), ("f16", 2)] {
            assert_eq!(
                WeightFormat::parse(fmt).unwrap().block_bytes(),
                bytes,
                "{fmt}"
            );
        }
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) / 4.0).collect();
        for fmt in ["sym4g32", "q4_0"] {
            let m = QuantMatrix::quantize(WeightFormat::parse(fmt).unwrap(), 1, 32, &x).unwrap();
            let b = m.bytes();
            let scale = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            let dq = m.dequantize();
            for (i, &want) in dq.iter().enumerate() {
                let code = if fmt == "sym4g32" {
                    (b[2 + i / 2] >> (4 * (i % 2))) & 15
                } else {
                    (b[2 + i % 16] >> (4 * (i / 16))) & 15
                };
                assert_eq!(scale * (code as f32 - 8.0), want, "{fmt} value {i}");
            }
        }
    }

    #[test]
    fn bad_matrices_and_lengths_are_refused_before_any_launch() {
        let w: Vec<f32> = (0..4 * 64).map(|i| (i % 7) as f32 - 3.0).collect();
        let m = QuantMatrix::quantize(WeightFormat::Q4_0, 4, 64, &w).unwrap();
        let x = vec![1.0f32; 2 * 64];
        let (launch, args) = check_gemv(&m, &x, 2).unwrap();
        assert_eq!((launch.grid.0, args), (1, [4, 64, 2]));
        let refused = |m: &QuantMatrix, x: &[f32], batch: usize| {
            let Err(e) = gemv_cuda(m, x, batch) else {
                panic!("accepted")
            };
            assert!(!matches!(e, KernelError::Device(_)), "{e}");
            e.to_string()
        };
        // The public shape no longer matches the bytes: the kernel would read past them.
        let mut taller = m.clone();
        taller.rows = 5;
        let e = refused(&taller, &x, 2);
        assert!(
            e.contains("q4_0 5×64 matrix holds 144 bytes, its format needs 180"),
            "{e}"
        );
        let mut wider = m.clone();
        wider.cols = 96;
        let e = refused(&wider, &[1.0; 2 * 96], 2);
        assert!(e.contains("needs 216"), "{e}");
        let e = refused(&m, &x[..100], 2);
        assert!(e.contains("x has 100 values, want batch·cols = 128"), "{e}");
        let e = refused(&m, &[1.0; 9 * 64], 9);
        assert!(e.contains("batch 1..=8"), "{e}");
        // Rows and cols past the kernel's ints.
        let e = plan_gemv(WeightFormat::Q8_0, i32::MAX as usize - 1, 32, 1).unwrap_err();
        assert!(
            e.to_string().contains("rows rounded up to whole blocks"),
            "{e}"
        );
        let e = plan_gemv(WeightFormat::Q8_0, 1, 1 << 31, 1).unwrap_err();
        assert!(e.to_string().contains("cols = 2147483648"), "{e}");
    }
}
