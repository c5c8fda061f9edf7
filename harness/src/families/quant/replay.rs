//! `harness replay` of quant case files (metadata `format`; `x` the f32 weights, optionally
//! `q` their packed bytes, `out` the dequantised weights, `act`/`y` a product): the codec
//! byte-exact both ways, and every product variant against the f64 product.

use crate::case_file::CaseFile;
use crate::case_job::{wanted, EachCall, Expect, Job, Output, Prepared, Run};
use crate::error::Result;
use crate::registry;
use kernel_common::{tolerance, DType};
use kernel_quant::{MatVecVariant, QuantMatrix, WeightFormat};
use std::sync::Arc;

/// The jobs of a quant case file.
pub fn prepare(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
    let format_name = case
        .meta
        .get("format")
        .ok_or_else(|| case.error("a quant case needs metadata \"format\" (e.g. q4_0, sym4g32)"))?;
    let format = WeightFormat::parse(format_name).map_err(|e| case.error(e))?;
    let x = case.tensor("x", &[2])?;
    if x.dtype != safetensors::Dtype::F32 {
        return Err(case.error(format!("tensor 'x' must be F32, not {:?}", x.dtype)));
    }
    let (rows, cols) = (x.shape[0], x.shape[1]);
    format.validate(cols).map_err(|e| case.error(e))?;
    let xs = case.buffer("x", x)?.to_f32();
    let stored_q = match case.optional("q", &[1, 2])? {
        None => None,
        Some(t) if t.dtype != safetensors::Dtype::U8 => {
            return Err(case.error(format!("tensor 'q' must be U8, not {:?}", t.dtype)))
        }
        Some(t) => Some(
            QuantMatrix::from_bytes(format, rows, cols, t.data.clone())
                .map_err(|e| case.error(e))?,
        ),
    };
    let out = case.optional("out", &[2])?;
    if let Some(t) = out {
        if t.shape != x.shape {
            return Err(case.error(format!(
                "tensor 'out' has shape {:?}, expected {:?} (the dequantised x)",
                t.shape, x.shape
            )));
        }
    }
    let act = case.optional("act", &[2])?;
    let y = case.optional("y", &[2])?;
    let label = format!("{rows}x{cols} {format}");
    let mut runs = vec![];
    // The codec: quantise (bytes compared exactly) and dequantise (floats).
    if let Some(want) = &stored_q {
        if wanted(asked, "quantize") {
            runs.push(Run {
                name: "quantize".into(),
                job: Ok(Box::new(EachCall({
                    let x = xs.clone();
                    move || {
                        Ok(Output::Bytes(
                            QuantMatrix::quantize(format, rows, cols, &x)?
                                .bytes()
                                .to_vec(),
                        ))
                    }
                }))),
                expect: Arc::new(Expect {
                    tol: tolerance(DType::F32),
                    reference: None,
                    stored: Some(Output::Bytes(want.bytes().to_vec())),
                }),
            });
        }
        if let (Some(t), true) = (out, wanted(asked, "dequantize")) {
            runs.push(Run {
                name: "dequantize".into(),
                job: Ok(Box::new(EachCall({
                    let m = want.clone();
                    move || Ok(Output::Floats(m.dequantize()))
                }))),
                expect: Arc::new(Expect {
                    tol: tolerance(DType::F32),
                    reference: None,
                    stored: Some(Output::Floats(case.buffer("out", t)?.to_f32())),
                }),
            });
        }
    }
    // Products, when the file carries activations: W is the stored bytes (else ours).
    if let Some(a) = act {
        if a.dtype != safetensors::Dtype::F32 || a.shape[1] != cols {
            return Err(case.error(format!(
                "tensor 'act' must be F32 [batch, {cols}], got {:?} {:?}",
                a.dtype, a.shape
            )));
        }
        let batch = a.shape[0];
        let w = match &stored_q {
            Some(m) => m.clone(),
            None => QuantMatrix::quantize(format, rows, cols, &xs).map_err(|e| case.error(e))?,
        };
        let w = Arc::new(w);
        let av = Arc::new(case.buffer("act", a)?.to_f32());
        let stored = match y {
            Some(t) if t.shape != [batch, rows] => {
                return Err(case.error(format!(
                    "tensor 'y' has shape {:?}, expected [{batch}, {rows}]",
                    t.shape
                )))
            }
            Some(t) => Some(Output::Floats(case.buffer("y", t)?.to_f32())),
            None => None,
        };
        let expect_for = |variant: MatVecVariant, stored: Option<Output>| {
            let seen = kernel_quant::activation_as_seen(variant, w.format, &av, cols);
            let reference = kernel_quant::reference::matmul(&w, &seen, batch);
            Arc::new(Expect {
                tol: tolerance(DType::F32).scaled_to(&reference),
                reference: Some(reference),
                stored,
            })
        };
        let expect = expect_for(MatVecVariant::Dequant, stored);
        for name in kernel_quant::VARIANTS.iter().map(|v| v.name) {
            if !wanted(asked, name) {
                continue;
            }
            let spec = asked
                .iter()
                .find(|s| s.split(':').next() == Some(name))
                .cloned()
                .unwrap_or_else(|| name.to_string());
            let (vname, variant) = registry::quant_variant(&spec)?;
            let job = kernel_quant::supports(variant, format)
                .map(|()| {
                    let (w, act) = (w.clone(), av.clone());
                    Box::new(EachCall(move || {
                        let mut out = vec![f32::NAN; batch * w.rows];
                        kernel_quant::matmul(&w, &act, batch, &mut out, variant)?;
                        Ok(Output::Floats(out))
                    })) as Box<dyn Job>
                })
                .map_err(|e| e.to_string());
            // act=q8 is judged against the product with its quantised activation; against the
            // stored y (a product with x itself) it is expected to differ by that error.
            let expect = if matches!(variant, MatVecVariant::FusedQ8(_)) {
                expect_for(variant, None)
            } else {
                expect.clone()
            };
            runs.push(Run {
                name: format!("{vname} (b{batch})"),
                job,
                expect,
            });
        }
    }
    if runs.is_empty() {
        return Err(case.error(
            "nothing to replay: a quant case needs q (packed bytes) or act (activations), and --variant must name one of its variants",
        ));
    }
    Ok(Prepared { label, runs })
}
