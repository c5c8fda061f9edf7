//! Experiment specs the CLI and sweep tests share: tiny grids of the attention, quant, MoE and
//! kv_precision families, and decode grids of any length (to interrupt).

/// The tiny experiment of the happy path (its name is its file stem: `render` finds the spec
/// by the experiment name recorded in the provenance).
pub const TINY: &str = r#"name = "tiny"
question = "Smoke test: naive, flash2 and paged on two tiny decode and prefill problems."
claims = ["C5"]
family = "attention"
variants = ["naive", "flash2", "paged:bs=16"]
reps = 2

[grid]
mode = ["decode", "prefill"]
batch = [1]
heads = ["gqa"]
q_heads = [4]
head_dim = [32]
kv_len = [64, 96]

[plot]
x = "kv_len"
panel = "mode"
series = "variant"
y = { decode = "gbps", prefill = "gflops" }

[report]
baseline = "naive"
"#;

/// A tiny quant experiment: two formats against f32 weights (fused and faer), two batches.
pub const TINY_QUANT: &str = r#"name = "tinyq"
question = "Smoke test: quantised GEMV/GEMM against f32 weights."
claims = ["C16", "C18"]
family = "quant"
variants = ["fused", "faer"]
reps = 2

[grid]
format = ["q4_0", "f32", "sym3g32"]
shape = ["40x96"]
weights = ["gaussian", "outliers"]
batch = [1, 5]

[plot]
x = "bits_per_weight"
panel = "weights"
series = "scheme"
y = { "*" = "out_rel_err" }
filter = { batch = "1" }
log_x = false
log_y = true

[[extra_plots]]
x = "batch"
panel = "shape"
series = "format"
y = { "*" = "speedup_vs_f32" }
filter = { weights = "gaussian", format = "q4_0|sym3g32" }
"#;

/// A tiny kv_precision experiment: three KV-cache formats besides f32 on a preset (its token
/// ids are the text's bytes), quality and decode.
pub const TINY_KV: &str = r#"name = "tinykv"
question = "Smoke test: the KV cache in narrow formats, model quality and paged decode."
claims = ["C20"]
family = "kv_precision"
variants = ["kv_cache"]
reps = 2

[grid]
part = ["quality", "decode"]
kv_cache = ["f16", "int8", "progressive:window=16,old=fp8"]
model = ["tiny-gqa"]
text = ["gpl3"]
window = ["64x2"]
prefill_chunk = [16]
decode = ["b2:h4/2:d32:ctx100"]
block_size = [16]

[limits]
seconds_per_point = 0.05

[plot]
x = "kv_bytes_per_token"
panel = "ctx"
series = "scheme"
y = { "*" = "kl_mean" }
filter = { part = "quality" }
log_x = true

[[extra_plots]]
x = "kv_bytes_per_token"
panel = "shape"
series = "isa"
y = { "*" = "gbps" }
filter = { part = "decode" }
log_x = true
"#;

/// A tiny moe experiment: two capacities (one dropless), two skews, both variants.
pub const TINY_MOE: &str = r#"name = "tinymoe"
question = "Smoke test: a small MoE layer with and without capacity."
claims = ["C13"]
family = "moe"
variants = ["grouped", "naive"]
reps = 2

[grid]
capacity = ["0.5", "dropless"]
skew = [0.0, 1.5]
top_k = [2]
experts = [4]
tokens = [40]
d_model = [16]
d_ff = [24]

[plot]
x = "capacity_factor"
panel = "config"
series = "skew"
y = { "*" = "drop_rate" }
filter = { variant = "grouped" }
log_x = false
"#;

/// Decode points at `kv_lens` for (q_heads, head_dim), flash2 and naive, `reps` timed calls each.
pub fn decode_spec(
    name: &str,
    kv_lens: &[usize],
    (q_heads, head_dim): (usize, usize),
    reps: usize,
) -> String {
    let lens: Vec<String> = kv_lens.iter().map(usize::to_string).collect();
    format!(
        r#"name = "{name}"
question = "Many decode points, to be interrupted."
claims = ["C5"]
family = "attention"
variants = ["flash2", "naive"]
reps = {reps}

[grid]
mode = ["decode"]
batch = [1]
heads = ["gqa"]
q_heads = [{q_heads}]
head_dim = [{head_dim}]
kv_len = [{}]

[plot]
x = "kv_len"
panel = "mode"
series = "variant"
y = {{ decode = "gbps" }}
"#,
        lens.join(", ")
    )
}
