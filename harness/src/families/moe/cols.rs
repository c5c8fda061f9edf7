//! The columns of a moe experiment row (`MoeCols`, after the shared head). Column names are
//! stable; the columns added with the routing conventions (`routing`, `min_capacity`,
//! `dtype`, `rerouted`, `assignments`, `unserved_tokens`, `multi_served_tokens`,
//! `experts_per_token`) read from older CSVs as what those runs were: token choice, a floor
//! of 1, f32, nothing rerouted, and unknown counts.

use crate::row::Row;
use serde::{Deserialize, Serialize};

fn token_choice() -> String {
    "token_choice".into()
}

fn one() -> usize {
    1
}

fn f32_name() -> String {
    "f32".into()
}

/// One variant at one grid point.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MoeCols {
    /// `e8 k2`, `e8 ec` (the plots' panels)
    pub config: String,
    pub tokens: usize,
    pub d_model: usize,
    pub d_ff: usize,
    pub experts: usize,
    /// Experts per token (empty under expert choice).
    pub top_k: Option<usize>,
    /// A factor or `dropless`.
    pub capacity: String,
    /// The factor (empty when dropless).
    pub capacity_factor: Option<f64>,
    pub capacity_slots: Option<usize>,
    pub skew: f64,
    /// `order`, `gshard`, `score`, `reroute` (empty under expert choice).
    pub policy: String,
    /// `renormalize`, `raw`, `renormalize_kept`.
    pub norm: String,
    /// `token_choice` or `expert_choice`.
    #[serde(default = "token_choice")]
    pub routing: String,
    /// The floor on slots per expert.
    #[serde(default = "one")]
    pub min_capacity: usize,
    /// Storage of x and the expert weights (`f32` on the CPU; `cuda_grouped`'s f16/bf16).
    #[serde(default = "f32_name")]
    pub dtype: String,
    /// Useful FLOPs of the timed call / median (CPU: router + kept assignments' SwiGLU;
    /// CUDA: the experts only, as timed).
    pub gflops: Option<f64>,
    pub flops: u64,
    /// Assignments made (token choice: tokens·k; expert choice: experts·c).
    pub assignments: Option<usize>,
    pub dropped: usize,
    pub drop_rate: f64,
    /// Assignments `reroute` moved to another expert (kept, not dropped).
    #[serde(default)]
    pub rerouted: usize,
    /// Tokens no expert serves.
    pub unserved_tokens: Option<usize>,
    /// Tokens two or more experts serve.
    pub multi_served_tokens: Option<usize>,
    /// Kept assignments per token.
    pub experts_per_token: Option<f64>,
    /// Busiest expert's routed load / mean load.
    pub imbalance: f64,
    /// Share of routed assignments taken by the busiest ⌈20%⌉ of experts (C14).
    pub top20_share: f64,
    /// The same for exactly a fifth of the experts: the busiest ⌊E/5⌋ and the fraction
    /// E/5 − ⌊E/5⌋ of the next (⌈20%⌉ of 8 experts is 25%). Empty in runs before it.
    #[serde(default)]
    pub top_fifth_share: Option<f64>,
    /// Switch's N·Σ f_i·P_i (1 when balanced).
    pub balance_loss: f64,
    /// Relative L2 distance of the whole output (every token) from the same convention
    /// without a capacity limit (token choice: the dropless top-k layer; expert choice:
    /// every expert taking every token), the latter computed by the grouped f32 variant.
    /// (Runs before the routing conventions compared 64 sampled tokens with an f64 yardstick.)
    pub out_rel_err_vs_dropless: Option<f64>,
    /// Against the f64 reference of the same routing (the correctness check).
    pub rel_l2_err: Option<f64>,
    pub max_abs_err: Option<f64>,
    pub checked_tokens: usize,
    /// Parameters one token touches (router + its experts; expert choice: the mean) and the
    /// layer holds (C15).
    pub active_params: u64,
    pub total_params: u64,
    pub active_ratio: f64,
    /// `cuda_grouped`: the median of the expert kernels timed hot (after the warm-up, L2 not
    /// flushed), beside `median_ms`, which is cold (L2 flushed before each repetition).
    /// Empty on the CPU and in runs before it.
    #[serde(default)]
    pub hot_median_ms: Option<f64>,
}

/// A row: the shared head, these columns, the note.
pub type MoeRow = Row<MoeCols>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::read_rows;

    /// Two rows of the first committed moe_capacity run (20261130T003954Z), in its header.
    const OLD: &str = "run_id,experiment,variant,config,tokens,d_model,d_ff,experts,top_k,capacity,capacity_factor,capacity_slots,skew,policy,norm,threads,device,status,reps,median_ms,p10_ms,p90_ms,gflops,flops,dropped,drop_rate,imbalance,top20_share,balance_loss,out_rel_err_vs_dropless,rel_l2_err,max_abs_err,checked_tokens,active_params,total_params,active_ratio,seed,note
20261130T003954Z,moe_capacity,grouped,e8 k1,1024,512,1024,8,1,1,1.0,128,0.0,score,renormalize,2,cpu,ok,3,35.00869,34.8751076,35.383222800000006,88.29813534868057,3091202048,44,0.04296875,1.1953125,0.29296875,1.003343592522656,0.2599289431650615,7.324717580307963e-7,2.1328765547057316e-6,64,1576960,12587008,0.1252847380410023,12058926934050108962,
20261130T003954Z,moe_capacity,naive,e8 k1,1024,512,1024,8,1,dropless,,,0.0,score,renormalize,2,cpu,ok,3,240.451011,239.4255334,241.90697659999998,12.855849659954227,3091202048,0,0.0,1.1953125,0.29296875,1.003343592522656,0.0,8.327718399918778e-7,2.743166051866197e-6,64,1576960,12587008,0.1252847380410023,12058926934050108962,
";

    #[test]
    fn rows_written_before_the_conventions_still_read() {
        let dir = std::env::temp_dir().join(format!("harness-moe-cols-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("old.csv");
        std::fs::write(&path, OLD).unwrap();
        let rows: Vec<MoeRow> = read_rows(&path).unwrap();
        assert_eq!(rows.len(), 2);
        let r = &rows[0];
        assert_eq!(
            (r.top_k, r.capacity_slots, r.dropped),
            (Some(1), Some(128), 44)
        );
        assert_eq!(
            (r.routing.as_str(), r.min_capacity, r.dtype.as_str()),
            ("token_choice", 1, "f32")
        );
        assert_eq!(
            (r.rerouted, r.assignments, r.unserved_tokens),
            (0, None, None)
        );
        assert_eq!(rows[1].capacity_factor, None);
        assert_eq!(rows[1].head.variant, "naive");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
