//! `harness exp` for the speculative family (claims C21, C22): speculative decoding on a real model
//! over drafters × tree shapes × temperatures × prompt kinds. For each (drafter, prompt,
//! temperature) plain decoding runs first in the same process, then every tree shape, the
//! whole round repeated `reps` times (the spec's `reps`, default 1); a row holds acceptance
//! (accepted / drafted depth), tokens per target pass, the draft/verify time split, tokens/s,
//! the speed-up over plain decoding (median over the repetitions, with p10 and p90), and the
//! cost model of Leviathan et al.: a round's verify pass and whole cost in plain decode steps,
//! the draft's speed against the target's, and the break-even acceptance — the acceptance at
//! which a round's 1 + acceptance × drafted tokens repay its cost. Greedy rows must reproduce
//! plain greedy output token for token (status fail otherwise).

use crate::error::{HarnessError, Result};
use crate::load_flags::LoadFlags;
use crate::model_source::drafter;
use crate::model_source::resolve_model;
use crate::provenance::Provenance;
use crate::render::{report, Rendered};
use crate::row::{Head, Row};
use crate::run_files::{ExpRequest, GridValues, RunFiles};
use crate::spec::ExperimentSpec;
use crate::sweep::PointKey;
use kernel_speculative::TreeShape;
use models::speculative::driver::{generate, generate_plain, SpecConfig};
use models::{load, SamplerConfig};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// One drafter × tree × temperature × prompt. Column names are stable.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SpecCols {
    pub model: String,
    /// The target's (and a model drafter's) projection product and attention. (Absent from
    /// runs before the columns existed: those ran `fused` and `flash2`.)
    #[serde(default)]
    pub matmul: String,
    #[serde(default)]
    pub attention: String,
    pub drafter: String,
    pub tree: String,
    /// chain | static | dynamic
    pub shape_kind: String,
    /// Deepest draft level the shape allows.
    pub depth: usize,
    pub max_nodes: usize,
    /// Draft depth adapted to the running acceptance (70% threshold). (Absent from runs
    /// before the column existed: off.)
    #[serde(default)]
    pub adaptive: bool,
    /// How an adaptive depth is picked: threshold (the 70% rule) or cost (the depth with the
    /// most expected tokens per decode step, from pass costs measured on the target); empty
    /// when not adaptive and in runs before the column existed.
    #[serde(default)]
    pub policy: String,
    /// Mean depth limit over the rounds (the shape's depth unless adaptive).
    #[serde(default)]
    pub mean_depth_limit: f64,
    pub temperature: f64,
    pub prompt: String,
    pub new_tokens: usize,
    pub plain_tok_s: f64,
    pub spec_tok_s: f64,
    pub speedup: f64,
    pub acceptance_rate: f64,
    pub tokens_per_pass: f64,
    pub target_passes: usize,
    pub nodes_per_pass: f64,
    pub draft_ms: f64,
    pub verify_ms: f64,
    /// draft / (draft + verify)
    pub draft_share: f64,
    /// p10 and p90 of the per-repetition speed-ups (`speedup` is their median).
    #[serde(default)]
    pub speedup_p10: Option<f64>,
    #[serde(default)]
    pub speedup_p90: Option<f64>,
    /// Draft depth proposed per round.
    #[serde(default)]
    pub drafted_per_pass: Option<f64>,
    /// One round's verify pass, and the whole round (draft + verify), in plain decode steps
    /// (plain decoding's time per token after the first in the same run: its time for
    /// `max_new` tokens less its time for the prompt and one token).
    #[serde(default)]
    pub verify_steps: Option<f64>,
    #[serde(default)]
    pub pass_steps: Option<f64>,
    /// How many times faster the draft proposes a level than the target decodes a token.
    #[serde(default)]
    pub draft_vs_target: Option<f64>,
    /// (pass_steps − 1) / drafted_per_pass: below it speculation loses to plain decoding.
    #[serde(default)]
    pub breakeven_acceptance: Option<f64>,
}

/// A row: the shared head, these columns, the note.
pub type SpecRow = Row<SpecCols>;

/// The columns a row takes from its model, drafter and tree shape.
/// How a point's draft depth is chosen (the `adaptive` grid axis).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Adapt {
    /// The shape's depth every round.
    Off,
    /// Shrink under 70% running acceptance, grow above (`--spec-adaptive`).
    Threshold,
    /// The depth with the most expected tokens per decode step (`--spec-policy cost`).
    Cost,
}

impl Adapt {
    fn adaptive(self) -> bool {
        self != Adapt::Off
    }

    fn policy(self) -> String {
        match self {
            Adapt::Off => "",
            Adapt::Threshold => "threshold",
            Adapt::Cost => "cost",
        }
        .into()
    }
}

/// The largest pass the cost policy times before a prompt's runs (`generate`'s cap).
const COST_MAX_TOKENS: usize = 33;

fn shape_cols(target: &SpecCols, drafter: &str, shape: &TreeShape) -> SpecCols {
    SpecCols {
        model: target.model.clone(),
        matmul: target.matmul.clone(),
        attention: target.attention.clone(),
        drafter: drafter.into(),
        tree: shape.label(),
        shape_kind: shape.label().split(':').next().unwrap_or("").into(),
        depth: shape.max_depth(),
        max_nodes: shape.max_nodes(),
        ..SpecCols::default()
    }
}

/// The K/V pool of a session of `capacity` tokens over `m` (blocks of 16, as the driver's).
fn planned_kv(m: &models::Llama, capacity: usize) -> u64 {
    models::KvPools::planned_bytes(m, capacity.div_ceil(16), 16)
}

/// What drafter `spec` of `target` (loaded from `path`) holds, estimated before it is built:
/// n-gram lookup a table of the tokens it has seen; suffix drafting a node per indexed
/// string; `self:FORMAT` the target's weights in that format; `self-layers:N` all of the
/// target's (they load before it keeps N); a preset its parameters in f32; a checkpoint path
/// its files' bytes, twice (16-bit safetensors widen to f32); and every model drafter a K/V
/// session of `capacity` tokens.
fn drafter_bytes(target: &models::Llama, path: &str, spec: &str, capacity: usize) -> u64 {
    if spec == "ngram" || spec.starts_with("ngram:") {
        return crate::mem_guard::product(&[capacity, 64]);
    }
    if let Some(s) = crate::model_source::suffix_spec(spec) {
        // A node (~64 bytes with its map entry) per indexed string: depth per token (a bad
        // spec is refused when the drafter is built). A corpus's index (8 bytes a token: ~10 MB
        // for `python`) is not counted: its size is known only once its text is read.
        let depth = s
            .as_ref()
            .map_or(crate::model_source::SUFFIX_DEPTH, |s| s.depth);
        return crate::mem_guard::product(&[capacity, depth, 64]);
    }
    let kv = planned_kv(target, capacity);
    let weights = if let Some(fmt) = spec.strip_prefix("self:") {
        let f32_bytes = target.f32_weight_bytes() as f64;
        kernel_quant::WeightFormat::parse(fmt)
            .map_or(f32_bytes, |f| f32_bytes * f.bits_per_weight() / 32.0) as u64
    } else if spec.starts_with("self-layers:") || spec == path {
        target.held_bytes() as u64
    } else if let Some(shape) = models::preset(spec) {
        shape.params().saturating_mul(4)
    } else {
        2 * path_bytes(std::path::Path::new(spec))
    };
    weights.saturating_add(kv)
}

/// A file's bytes, or a directory's files' (a checkpoint); 0 for a name that is not a path.
fn path_bytes(p: &std::path::Path) -> u64 {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => m.len(),
        Ok(m) if m.is_dir() => std::fs::read_dir(p)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0),
        _ => 0,
    }
}

/// Prompts of different kinds.
fn prompt_text(kind: &str) -> Result<&'static str> {
    Ok(match kind {
        "prose" => "The history of the old harbour town begins in the twelfth century, when",
        "code" => "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef factorial(n):\n",
        // An edit of code in the prompt (what prompt lookup and SuffixDecoding are for): the
        // answer restates most of the prompt.
        "code_edit" => "# Original:\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n\n\ndef variance(xs):\n    m = mean(xs)\n    total = 0\n    for x in xs:\n        total += (x - m) ** 2\n    return total / len(xs)\n\n\n# The same code with type hints:\n",
        "repetitive" => "one two three four five, one two three four five, one two three four five, one two",
        o => {
            return Err(HarnessError::Usage(format!(
                "prompt '{o}' is not prose, code, code_edit or repetitive"
            )))
        }
    })
}

/// Runs a spec experiment.
pub fn run(req: &ExpRequest) -> Result<i32> {
    let (opts, spec, spec_path, grid) = (req.opts, req.spec, req.spec_path, req.grid.clone());
    let g = GridValues(&grid);
    let model_name = g.one_string("model", "smollm2")?;
    // `harness generate`'s defaults: paged attention (a tree's nodes scored as decode steps,
    // so greedy output is plain greedy's bits) and the packed int8 product.
    let (matmul, attention) = (
        g.one_string("matmul", "packed")?,
        g.one_string("attention", "paged")?,
    );
    let target_cols = SpecCols {
        model: model_name.clone(),
        matmul: matmul.clone(),
        attention: attention.clone(),
        ..SpecCols::default()
    };
    let load_opts = LoadFlags {
        attention: Some(attention.clone()),
        capacity: Some("dropless".into()),
        matmul: Some(matmul.clone()),
        ..LoadFlags::default()
    }
    .options()?;
    let drafters = g.strings("drafter", &["ngram"]);
    let trees = g
        .strings("tree", &["chain:4"])
        .iter()
        .map(|t| TreeShape::parse(t))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let temps = g.parsed("temperature", &["0"], "a temperature ≥ 0", |t: f64| {
        t >= 0.0
    })?;
    let prompts = g.strings("prompt", &["prose", "code", "repetitive"]);
    for p in &prompts {
        prompt_text(p)?;
    }
    let max_new = g.one("max_new", "48", "a positive integer", |n: usize| n > 0)?;
    let reps = spec.reps.unwrap_or(1).max(1);
    let adaptive: Vec<Adapt> = g
        .strings("adaptive", &["off"])
        .iter()
        .map(|a| match a.as_str() {
            "off" | "false" => Ok(Adapt::Off),
            "on" | "true" | "threshold" => Ok(Adapt::Threshold),
            "cost" => Ok(Adapt::Cost),
            o => Err(HarnessError::Usage(format!(
                "adaptive '{o}' is not off, on (threshold) or cost"
            ))),
        })
        .collect::<Result<_>>()?;
    // Model, prompts and every drafter are set up before results/ is touched.
    let path = resolve_model(&model_name)?;
    let loaded = load(&path, &load_opts)?;
    let tok = loaded.tokenizer.as_ref().ok_or_else(|| {
        HarnessError::Usage(format!(
            "model {model_name} has no tokenizer for the prompts"
        ))
    })?;
    let target = &loaded.model;
    let encoded = prompts
        .iter()
        .map(|p| Ok((p, tok.prompt_ids(prompt_text(p)?)?)))
        .collect::<Result<Vec<_>>>()?;
    let max_nodes = trees.iter().map(|t| t.max_nodes()).max().unwrap_or(1);
    let longest = encoded.iter().map(|(_, ids)| ids.len()).max().unwrap_or(0);
    let capacity = longest + max_new + max_nodes + 1;
    if capacity > target.cfg.context {
        return Err(HarnessError::Usage(format!(
            "a {longest}-token prompt + max_new {max_new} + a {max_nodes}-node tree exceed the context of {}",
            target.cfg.context
        )));
    }
    // The memory guard: every drafter is held for the whole run, so each is counted on top
    // of the target and the ones before it; a drafter that would go over the budget is not
    // built, and its points are skipped with the note.
    let mut held = target.held_bytes() as u64 + planned_kv(target, capacity);
    let mut drafters_at = vec![];
    for d in &drafters {
        for &temp in &temps {
            let need = drafter_bytes(target, &path, d, capacity);
            let what = format!(
                "the target and its K/V {}, drafters before it, drafter {d} {}",
                crate::mem_guard::human(target.held_bytes() as u64 + planned_kv(target, capacity)),
                crate::mem_guard::human(need)
            );
            if let Some(note) = opts.mem_budget.refuse(held.saturating_add(need), &what) {
                drafters_at.push((d, temp, Err(note)));
                continue;
            }
            held = held.saturating_add(need);
            // A model drafter loads as the target does (`generate`'s way), sampled at this
            // temperature (top-k/top-p off).
            let load = load_opts.clone();
            let sampler = SamplerConfig {
                temperature: temp as f32,
                top_k: 0,
                top_p: 1.0,
                seed: opts.seed,
            };
            drafters_at.push((
                d,
                temp,
                Ok(drafter(
                    &path,
                    load,
                    sampler,
                    target,
                    Some(tok),
                    d,
                    capacity,
                )?),
            ));
        }
    }
    let mut run = RunFiles::start(opts, spec, spec_path, grid.clone())?;
    let bar = run
        .progress_bar(drafters.len() * temps.len() * prompts.len() * trees.len() * adaptive.len());
    let mut failures = 0;
    let mut costs: std::collections::HashMap<String, models::speculative::cost::PassCost> =
        std::collections::HashMap::new();
    for (d, temp, drafter) in &mut drafters_at {
        let (d, temp) = (*d, *temp);
        let sampler = SamplerConfig {
            temperature: temp as f32,
            top_k: 0,
            top_p: 1.0,
            seed: opts.seed,
        };
        for (p, ids) in &encoded {
            let key = PointKey::of(&[("drafter", d), ("temperature", &temp), ("prompt", p)]);
            if !run.owns(&key) {
                continue;
            }
            let mut rows = vec![];
            let drafter = match drafter {
                Ok(drafter) => drafter,
                Err(note) => {
                    for (shape, &adapt) in trees
                        .iter()
                        .flat_map(|t| adaptive.iter().map(move |a| (t, a)))
                    {
                        rows.push(Row::skipped(
                            run.head("driver", opts.seed),
                            SpecCols {
                                adaptive: adapt.adaptive(),
                                policy: adapt.policy(),
                                temperature: temp,
                                prompt: p.to_string(),
                                ..shape_cols(&target_cols, d, shape)
                            },
                            note.clone(),
                        ));
                        bar.inc(1);
                    }
                    run.write_point(&key, &rows)?;
                    continue;
                }
            };
            // The cost policy's pass costs on the target after a context like this prompt's,
            // measured once per prompt before its first timed runs (setting up, as in
            // `generate`); they depend on the target and the prompt, not the drafter.
            let cost = if adaptive.contains(&Adapt::Cost) {
                if !costs.contains_key(p.as_str()) {
                    let tokens = (max_nodes + 1).min(COST_MAX_TOKENS);
                    let context = ids.len().clamp(1, 256);
                    let measured =
                        models::speculative::cost::PassCost::measure(target, tokens, context, 3)?;
                    costs.insert(p.to_string(), measured);
                }
                costs.get(p.as_str()).cloned()
            } else {
                None
            };
            let shapes: Vec<(&TreeShape, Adapt)> = trees
                .iter()
                .flat_map(|t| adaptive.iter().map(move |&a| (t, a)))
                .collect();
            let mut plain_s = vec![];
            let mut first_s = vec![];
            let mut spec_s = vec![vec![]; shapes.len()];
            let mut plain = vec![];
            let mut outs = vec![None; shapes.len()];
            for rep in 0..reps {
                bar.set_message(format!("{d} T={temp} {p}: plain ({}/{reps})", rep + 1));
                let t0 = Instant::now();
                plain = generate_plain(target, ids, max_new, None, sampler)?;
                plain_s.push(t0.elapsed().as_secs_f64());
                // The prompt and the first token alone: the rest is plain decoding's steps.
                let t0 = Instant::now();
                generate_plain(target, ids, 1, None, sampler)?;
                first_s.push(t0.elapsed().as_secs_f64());
                for (i, (shape, adapt)) in shapes.iter().enumerate() {
                    bar.set_message(format!(
                        "{d} T={temp} {p}: {} ({}/{reps})",
                        shape.label(),
                        rep + 1
                    ));
                    let cfg = SpecConfig {
                        shape: (*shape).clone(),
                        adaptive: adapt.adaptive(),
                        threshold: 0.7,
                        sampler,
                        cost: (*adapt == Adapt::Cost).then(|| cost.clone()).flatten(),
                    };
                    let t0 = Instant::now();
                    let out = generate(target, drafter.as_mut(), ids, max_new, None, &cfg)?;
                    spec_s[i].push(t0.elapsed().as_secs_f64());
                    outs[i] = Some(out);
                }
            }
            for (i, (shape, adapt)) in shapes.iter().enumerate() {
                let out = outs[i].take().expect("at least one repetition");
                let st = &out.stats;
                let ok = temp > 0.0 || out.tokens == plain;
                failures += usize::from(!ok);
                let mut speedups: Vec<f64> = plain_s
                    .iter()
                    .zip(&spec_s[i])
                    .map(|(p, s)| p / s * out.tokens.len() as f64 / plain.len() as f64)
                    .collect();
                speedups.sort_by(f64::total_cmp);
                let q = |p: f64| speedups[((speedups.len() - 1) as f64 * p).round() as usize];
                let spec_median = median(&spec_s[i]);
                let mut steps: Vec<f64> = plain_s
                    .iter()
                    .zip(&first_s)
                    .map(|(all, first)| (all - first) / plain.len().saturating_sub(1).max(1) as f64)
                    .collect();
                steps.sort_by(f64::total_cmp);
                let step_s = steps[steps.len() / 2];
                let rounds = st.rounds.max(1) as f64;
                let drafted = st.drafted_depth as f64 / rounds;
                let pass_steps = (st.draft_s + st.verify_s) / rounds / step_s;
                rows.push(Row {
                    head: Head {
                        status: if ok { "ok" } else { "fail" }.into(),
                        reps,
                        ..run.head("driver", opts.seed)
                    },
                    cols: SpecCols {
                        adaptive: adapt.adaptive(),
                        policy: adapt.policy(),
                        mean_depth_limit: st.depths.iter().sum::<usize>() as f64
                            / st.depths.len().max(1) as f64,
                        temperature: temp,
                        prompt: p.to_string(),
                        new_tokens: out.tokens.len(),
                        plain_tok_s: plain.len() as f64 / median(&plain_s),
                        spec_tok_s: out.tokens.len() as f64 / spec_median,
                        speedup: speedups[speedups.len() / 2],
                        acceptance_rate: st.acceptance_rate(),
                        tokens_per_pass: st.tokens_per_pass(),
                        target_passes: st.rounds,
                        nodes_per_pass: st.nodes_scored as f64 / rounds,
                        draft_ms: st.draft_s * 1e3,
                        verify_ms: st.verify_s * 1e3,
                        draft_share: st.draft_s / (st.draft_s + st.verify_s).max(1e-12),
                        speedup_p10: Some(q(0.1)),
                        speedup_p90: Some(q(0.9)),
                        drafted_per_pass: Some(drafted),
                        verify_steps: Some(st.verify_s / rounds / step_s),
                        pass_steps: Some(pass_steps),
                        draft_vs_target: (st.draft_s > 0.0 && st.drafted_depth > 0)
                            .then(|| step_s / (st.draft_s / st.drafted_depth as f64)),
                        breakeven_acceptance: (drafted > 0.0).then(|| (pass_steps - 1.0) / drafted),
                        ..shape_cols(&target_cols, d, shape)
                    },
                    note: String::new(),
                });
                bar.inc(1);
            }
            run.write_point(&key, &rows)?;
        }
    }
    bar.finish_and_clear();
    run.finish(spec, opts.format, failures, render)
}

/// The median of a few timings.
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// This family's `RenderFn`.
pub fn render(spec: &ExperimentSpec, csv: &Path, prov: &Provenance) -> Result<Rendered> {
    report::<SpecCols>(spec, csv, prov, |_, rows| tables(rows))
}

/// The markdown table of a spec run.
pub fn tables(rows: &[SpecRow]) -> String {
    let mut md = String::from("## Speculative decoding against plain decoding (same process)\n\n");
    if let Some(r) = rows.first().filter(|r| !r.matmul.is_empty()) {
        let _ = writeln!(
            md,
            "Target {}: the {} product, {} attention.\n",
            r.model, r.matmul, r.attention
        );
    }
    md.push_str("| drafter | tree | adaptive (mean depth) | T | prompt | acceptance | break-even acceptance | tokens/pass | nodes/pass | verify / round (decode steps) | draft × faster | draft share | plain tok/s | spec tok/s | speed-up (p10–p90) | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("–".to_string(), f);
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.0}% | {} | {:.2} | {:.1} | {} / {} | {} | {:.0}% | {:.1} | {:.1} | {:.2}× ({}) | {} |",
            r.drafter,
            r.tree,
            if r.adaptive {
                let policy = if r.policy.is_empty() { "on" } else { &r.policy };
                format!("{policy} ({:.1})", r.mean_depth_limit)
            } else {
                "off".into()
            },
            r.temperature,
            r.prompt,
            100.0 * r.acceptance_rate,
            opt(r.breakeven_acceptance, &|a| format!("{:.0}%", 100.0 * a)),
            r.tokens_per_pass,
            r.nodes_per_pass,
            opt(r.verify_steps, &|v| format!("{v:.2}")),
            opt(r.pass_steps, &|v| format!("{v:.2}")),
            opt(r.draft_vs_target, &|v| format!("{v:.1}")),
            100.0 * r.draft_share,
            r.plain_tok_s,
            r.spec_tok_s,
            r.speedup,
            match (r.speedup_p10, r.speedup_p90) {
                (Some(a), Some(b)) => format!("{a:.2}–{b:.2}"),
                _ => "–".into(),
            },
            r.head.status
        );
    }
    md.push_str(&best_per_prompt(rows));
    md.push('\n');
    md
}

/// The fastest speculative row of each prompt kind (the question a run answers: how much
/// does speculation pay on prose, on code, ...), in the order the prompts first appear.
fn best_per_prompt(rows: &[SpecRow]) -> String {
    let ok: Vec<&SpecRow> = rows.iter().filter(|r| r.head.status == "ok").collect();
    let mut prompts: Vec<&str> = vec![];
    for r in &ok {
        if !prompts.contains(&r.prompt.as_str()) {
            prompts.push(&r.prompt);
        }
    }
    if prompts.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n**Best per prompt.**\n\n| prompt | drafter | tree | adaptive | T | speed-up | acceptance | tokens/pass |\n|---|---|---|---|---|---|---|---|\n");
    for p in prompts {
        let best = ok
            .iter()
            .filter(|r| r.prompt == p)
            .max_by(|a, b| a.speedup.total_cmp(&b.speedup))
            .expect("a row of this prompt");
        let _ = writeln!(
            md,
            "| {p} | {} | {} | {} | {} | {:.2}× | {:.0}% | {:.2} |",
            best.drafter,
            best.tree,
            match (best.adaptive, best.policy.as_str()) {
                (false, _) => "off",
                (true, "") => "on",
                (true, policy) => policy,
            },
            best.temperature,
            best.speedup,
            100.0 * best.acceptance_rate,
            best.tokens_per_pass
        );
    }
    md
}
