//! `harness replay` of paged case files (vLLM's layout: `q`, `k_cache`/`v_cache` as
//! [blocks, kv_heads, block_size, head_dim], `block_tables`, `context_lens`): paged decode with
//! and without split-KV on the file's pool, against the gather + attention oracle.

use crate::case_file::CaseFile;
use crate::case_job::{
    common_dtype, stored_floats, wanted, EachCall, Expect, Output, Prepared, Run,
};
use crate::error::Result;
use kernel_common::{tolerance, Buffer};
use kernel_paged::{KvPool, PagedBatch, PagedDecodeShape, PoolLayout, SplitKv};
use std::sync::Arc;

/// The jobs of a paged case file.
pub fn prepare(case: &CaseFile, asked: &[String]) -> Result<Prepared> {
    let q = case.tensor("q", &[3, 4])?;
    let (kc, vc) = (case.tensor("k_cache", &[4])?, case.tensor("v_cache", &[4])?);
    let (bt, cl) = (
        case.tensor("block_tables", &[2])?,
        case.tensor("context_lens", &[1])?,
    );
    let dtype = common_dtype(case, &[("q", q), ("k_cache", kc), ("v_cache", vc)])?;
    let [blocks, hkv, bs, d] = kc.shape[..] else {
        unreachable!("rank checked")
    };
    let (seqs, hq, q_len, dq) = match q.shape[..] {
        [s, h, dq] => (s, h, 1, dq),
        [s, h, l, dq] => (s, h, l, dq),
        _ => unreachable!("rank checked"),
    };
    if vc.shape != kc.shape || dq != d || bt.shape[0] != seqs || cl.shape[0] != seqs {
        return Err(case.error(format!(
            "shapes do not fit: q {:?}, k_cache {:?}, v_cache {:?}, block_tables {:?}, context_lens {:?} (want q [S,Hq,D] or [S,Hq,L,D], caches [blocks,Hkv,block_size,D], tables [S,max_blocks], lens [S])",
            q.shape, kc.shape, vc.shape, bt.shape, cl.shape
        )));
    }
    let layout = PoolLayout {
        num_blocks: blocks,
        block_size: bs,
        kv_heads: hkv,
        head_dim: d,
    };
    layout.validate().map_err(|e| case.error(e))?;
    let lens = case.ints("context_lens", cl)?;
    let table_ints = case.ints("block_tables", bt)?;
    let width = bt.shape[1];
    let mut context_lens = vec![];
    let mut block_tables = vec![];
    for (s, &len) in lens.iter().enumerate() {
        if len < 1 {
            return Err(case.error(format!("context_lens[{s}] = {len}: must be ≥ 1")));
        }
        let need = layout.blocks_for(len as usize);
        if need > width {
            return Err(case.error(format!(
                "sequence {s} has {len} tokens = {need} blocks but block_tables has {width} columns"
            )));
        }
        let row = &table_ints[s * width..s * width + need];
        if let Some(&bad) = row.iter().find(|&&id| id < 0 || id as usize >= blocks) {
            return Err(case.error(format!(
                "block_tables[{s}] names block {bad}, outside the pool of {blocks}"
            )));
        }
        context_lens.push(len as usize);
        block_tables.push(row.iter().map(|&id| id as u32).collect::<Vec<u32>>());
    }
    let batch = PagedBatch {
        context_lens,
        block_tables,
    };
    let mut shape = PagedDecodeShape {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        q_len,
        scale: 1.0 / (d as f32).sqrt(),
        window: None,
        softcap: None,
    };
    if let Some(s) = case.positive("scale")? {
        shape.scale = s;
    }
    shape.validate(&layout, &batch).map_err(|e| case.error(e))?;
    let pool = KvPool {
        layout,
        k: case.buffer("k_cache", kc)?,
        v: case.buffer("v_cache", vc)?,
    };
    let qb = case.buffer("q", q)?;
    let expect = Arc::new(Expect {
        tol: tolerance(dtype),
        reference: Some(
            kernel_paged::reference::paged_reference(&shape, &batch, &pool, &qb)
                .map_err(|e| case.error(e))?,
        ),
        stored: stored_floats(case, &q.shape)?,
    });
    let (pool, batch, qb) = (Arc::new(pool), Arc::new(batch), Arc::new(qb));
    let mut runs = vec![];
    for (name, split) in [("paged", SplitKv::Off), ("paged:split=auto", SplitKv::Auto)] {
        if !wanted(asked, name) {
            continue;
        }
        runs.push(Run {
            name: name.into(),
            job: Ok(Box::new(EachCall({
                let (batch, pool, qb) = (batch.clone(), pool.clone(), qb.clone());
                move || {
                    let mut out = Buffer::poisoned(dtype, shape.q_elems(batch.len()));
                    kernel_paged::paged_decode(&shape, &batch, &pool, &qb, &mut out, split)?;
                    Ok(Output::Floats(out.to_f32()))
                }
            }))),
            expect: expect.clone(),
        });
    }
    Ok(Prepared {
        label: format!("seqs{lens:?} bs{bs} h{hq}/{hkv} q{q_len} d{d} {dtype}"),
        runs,
    })
}
