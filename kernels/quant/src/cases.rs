//! The quant family's one case list, shared by `harness check --family quant` (CPU and
//! CUDA) and the conformance suite: random weight formats (every width 2..=8, symmetric and
//! asymmetric, random group sizes and scale types, every ggml block — Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1, IQ4_NL and the K-quants Q2_K..Q8_K — f32/f16/bf16), random shapes and batch
//! sizes, Gaussian or outlier weights, then edge cases (all-zero groups, one huge outlier
//! among tiny values, one row, one block, batch 64), every codec format at a GEMV, an odd
//! tile and a full 64-activation tile, and the CUDA GEMV's formats at its batch sizes.

use crate::{ScaleType, WeightDist, WeightFormat};
use kernel_common::inputs::rng;
use rand::Rng;

/// One check case: a format, a matrix shape, a batch and how weights are drawn.
pub struct Case {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    pub batch: usize,
    pub dist: WeightDist,
    /// Overwrite group 0 of every row with zeros and put one 3e4 outlier among 1e-9 values.
    pub hostile: bool,
}

fn random_format(r: &mut impl Rng) -> WeightFormat {
    let scale = if r.gen_bool(0.3) {
        ScaleType::F32
    } else {
        ScaleType::F16
    };
    let bits = r.gen_range(2..=8u8);
    let group = [16, 32, 64, 128, r.gen_range(1..=96)][r.gen_range(0..5)];
    const GGML: [WeightFormat; 13] = [
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::IQ4_NL,
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::Q8_K,
        WeightFormat::BF16,
    ];
    match r.gen_range(0..10) {
        0 => WeightFormat::F32,
        1 => WeightFormat::F16,
        2..=5 => GGML[r.gen_range(0..GGML.len())],
        6 | 7 => WeightFormat::Sym { bits, group, scale },
        _ => WeightFormat::Asym { bits, group, scale },
    }
}

/// `n` random cases drawn from `seed`, then the edge cases.
pub fn cases(n: usize, seed: u64) -> Vec<Case> {
    let mut r = rng(seed ^ 0x0AA7);
    let mut out = vec![];
    for _ in 0..n {
        let format = random_format(&mut r);
        let block = format.block_values().max(1);
        let per_row = (r.gen_range(16..=700) / block).max(1);
        out.push(Case {
            format,
            rows: r.gen_range(1..=200),
            cols: block * per_row,
            batch: [1, 1, 2, 3, 5, 8, 64][r.gen_range(0..7)],
            dist: if r.gen_bool(0.5) {
                WeightDist::Gaussian
            } else {
                WeightDist::Outliers {
                    channels: 3,
                    scale: 50.0,
                }
            },
            hostile: false,
        });
    }
    let f = |s: &str| WeightFormat::parse(s).expect("known format");
    let edge = |format, rows, cols, batch, hostile| Case {
        format,
        rows,
        cols,
        batch,
        dist: WeightDist::Gaussian,
        hostile,
    };
    out.extend([
        edge(f("q4_0"), 67, 256, 1, true),
        edge(f("q4_1"), 67, 256, 3, true),
        edge(f("q8_0"), 9, 128, 64, true),
        edge(f("sym4g32"), 33, 96, 1, true),
        edge(f("asym2g64"), 5, 128, 2, true),
        edge(f("sym3g128"), 130, 384, 4, true),
        edge(f("asym8g32s32"), 1, 32, 1, false),
        edge(f("q4_0"), 1, 32, 64, false),
        edge(f("sym7g5"), 3, 5, 1, false),
    ]);
    // Every codec format at a GEMV, an odd tile and a full 64-activation tile, with the zero
    // group + outlier rows.
    for (i, format) in [
        "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k",
    ]
    .into_iter()
    .enumerate()
    {
        let cols = f(format).block_values().max(32) * 3;
        out.push(edge(f(format), 37 + i, cols, 1, true));
        out.push(edge(f(format), 70, 2 * cols, 7, i % 2 == 0));
        out.push(edge(f(format), 5, cols, 64, false));
    }
    // The CUDA GEMV's formats at its batch sizes (the CPU variants run them too).
    for (i, format) in ["f16", "sym4g32", "q4_0", "q8_0"].into_iter().enumerate() {
        out.push(edge(f(format), 257, 4096, [1, 3, 8, 2][i], i % 2 == 0));
        out.push(edge(f(format), 5, 32, 8 - i, false));
    }
    out
}

impl Case {
    /// The case's f32 weights drawn from `seed`; a hostile case has group 0 of every row
    /// zero and one 3e4 outlier among 1e-9 values in group 1.
    pub fn weights(&self, seed: u64) -> Vec<f32> {
        let mut w = self.dist.sample(self.rows, self.cols, seed);
        if self.hostile {
            let g = self.format.block_values().max(32).min(self.cols);
            for row in w.chunks_mut(self.cols) {
                row[..g].fill(0.0);
                if self.cols >= 2 * g {
                    row[g..2 * g].fill(1e-9);
                    row[g + 1] = 3.0e4;
                }
            }
        }
        w
    }
}

/// The CUDA GEMV's cases, small enough for the emulator: its four formats (f16, sym4g32,
/// q4_0, q8_0) at a GEMV, a 3-activation batch over 1024 columns and its largest batch, 8;
/// Gaussian weights, seeded by the format and the row count.
pub fn device() -> Vec<Case> {
    let mut out = vec![];
    for format in ["f16", "sym4g32", "q4_0", "q8_0"] {
        for (rows, cols, batch) in [(37, 96, 1), (9, 1024, 3), (130, 64, 8)] {
            out.push(Case {
                format: WeightFormat::parse(format).expect("known format"),
                rows,
                cols,
                batch,
                dist: WeightDist::Gaussian,
                hostile: false,
            });
        }
    }
    out
}
