//! `harness replay` of attention case files (`q`, `k`, `v` as [batch, heads, len, head_dim],
//! metadata `causal`, `scale`, and optionally `window` (a sliding window in positions) and
//! `softcap` (Gemma-2's logit cap)): every attention-shaped variant (attention and paged
//! crates) on the file's tensors, against the f64 reference and the stored `out`.

use crate::case_file::CaseFile;
use crate::case_job::{
    common_dtype, stored_floats, wanted, Expect, Job, Output, Prepared, Run, Started,
};
use crate::error::Result;
use crate::registry;
use kernel_attention::{AttentionInputs, AttentionKernel, AttentionShape, PreparedAttention};
use kernel_common::{tolerance, Buffer, DType, Device};
use std::sync::Arc;

/// An attention kernel on the case: prepared once (untimed), then run.
struct AttentionJob {
    kernel: Box<dyn AttentionKernel>,
    shape: AttentionShape,
    inputs: Arc<AttentionInputs>,
    dtype: DType,
}

struct AttentionStarted<'a> {
    prepared: Box<dyn PreparedAttention + 'a>,
    out: Buffer,
}

impl Job for AttentionJob {
    fn start(&self) -> kernel_common::error::Result<Box<dyn Started + '_>> {
        let prepared = self.kernel.prepare(&self.shape, &self.inputs)?;
        Ok(Box::new(AttentionStarted {
            prepared,
            out: Buffer::poisoned(self.dtype, self.shape.q_elems()),
        }))
    }
}

impl Started for AttentionStarted<'_> {
    fn run(&mut self) -> kernel_common::error::Result<()> {
        self.prepared.run(&mut self.out)
    }
    fn output(&self) -> Output {
        Output::Floats(self.out.to_f32())
    }
}

/// The jobs of an attention case file.
pub fn prepare(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
    let (q, k, v) = (
        case.tensor("q", &[4])?,
        case.tensor("k", &[4])?,
        case.tensor("v", &[4])?,
    );
    let dtype = common_dtype(case, &[("q", q), ("k", k), ("v", v)])?;
    let [b, hq, lq, d] = q.shape[..] else {
        unreachable!("rank checked")
    };
    let [bk, hkv, lkv, dk] = k.shape[..] else {
        unreachable!("rank checked")
    };
    if v.shape != k.shape || bk != b || dk != d {
        return Err(case.error(format!(
            "shapes do not fit: q {:?}, k {:?}, v {:?} (want q [B,Hq,Lq,D], k = v [B,Hkv,Lkv,D])",
            q.shape, k.shape, v.shape
        )));
    }
    let mut shape = AttentionShape::new(b, hq, hkv, lq, lkv, d, case.flag("causal", false)?);
    if let Some(s) = case.positive("scale")? {
        shape.scale = s;
    }
    let window = match case.positive("window")? {
        Some(w) if w.fract() == 0.0 && w <= (1u32 << 24) as f32 => Some(w as usize),
        Some(w) => {
            return Err(case.error(format!(
                "metadata window='{w}' is not a whole number of positions"
            )))
        }
        None => None,
    };
    shape = shape
        .with_window(window)
        .with_softcap(case.positive("softcap")?);
    shape.validate().map_err(|e| case.error(e))?;
    let inputs = Arc::new(AttentionInputs {
        q: case.buffer("q", q)?,
        k: case.buffer("k", k)?,
        v: case.buffer("v", v)?,
    });
    let expect = Arc::new(Expect {
        tol: tolerance(dtype),
        reference: Some(kernel_attention::reference::attention(&shape, &inputs)),
        stored: stored_floats(case, &q.shape)?,
    });
    let mut runs = vec![];
    for name in registry::attention_variant_names() {
        if name == "reference" || !wanted(asked, name) {
            continue;
        }
        let spec = asked
            .iter()
            .find(|a| a.split(':').next() == Some(name))
            .cloned()
            .unwrap_or_else(|| name.to_string());
        let kernel = registry::attention_kernel(&spec)?;
        let name = match kernel.supports(&shape, dtype, Device::Cpu) {
            Ok(()) => kernel.name(),
            Err(_) => spec,
        };
        let job = match kernel.supports(&shape, dtype, Device::Cpu) {
            Err(e) => Err(e.to_string()),
            Ok(()) => Ok(Box::new(AttentionJob {
                kernel,
                shape,
                inputs: inputs.clone(),
                dtype,
            }) as Box<dyn Job>),
        };
        runs.push(Run {
            name,
            job,
            expect: expect.clone(),
        });
    }
    Ok(Prepared {
        label: format!("{} {dtype}", shape.label()),
        runs,
    })
}
