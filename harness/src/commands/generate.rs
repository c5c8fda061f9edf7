//! `harness generate`: one request through the pipeline — a GGUF llama file (e.g.
//! SmolLM2-135M-Instruct from scripts/fetch-models.sh), a Hugging Face checkpoint directory or
//! a random-weight preset — on the kernel crates over a paged KV cache, greedy or sampled
//! (temperature, top-k, top-p, seeded): text streams to the terminal as tokens are produced,
//! or one JSON object with the ids, the text and the timings (time to first token, time per
//! output token, tokens/s).

use crate::error::{HarnessError, Result};
use crate::mem_guard::MemBudget;
use crate::model_source::{drafter, weight_bytes_by_type, weights_line};
use crate::Format;
use kernel_speculative::TreeShape;
use models::speculative::driver::SpecConfig;
use models::{load, LoadOptions, Sampler, SamplerConfig, Session, TextTokenizer};
use serde::Serialize;
use std::io::Write;
use std::time::Instant;

/// The flags of `harness generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// A GGUF file (llama, qwen2, qwen2moe, gemma3, phi3, olmoe; its tensors in any mix of
    /// the types kernel-quant reads), a Hugging Face checkpoint directory (config.json +
    /// safetensors of Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Gemma-3, Phi-3 or OLMoE),
    /// smollm2 / qwen2.5-0.5b / gemma3-270m (the files scripts/fetch-models.sh fetched), or a
    /// preset with random weights (tiny-gqa, tiny-mqa, tiny-mha, tiny-moe).
    #[arg(long)]
    pub model: String,
    /// Prompt text (tokenised with the model's tokenizer; no BOS is added).
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt token ids, e.g. 1,4093,198.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate (fewer if the end-of-sequence token comes first).
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Generate exactly --max-new-tokens, ignoring end-of-sequence.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Softmax temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample among the k most likely tokens only (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample among the smallest set of tokens whose probability reaches p (1 = all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Attention variant: naive, flash2 (K/V gathered from the cache), or paged (decode
    /// straight on the block pool, each sequence's context split in at most 4 partitions of
    /// whole 64-token units, so the logits are the same bits on any --threads; a verification
    /// pass's chain reads the context once per 16 rows with each row's decode bits;
    /// split=auto sizes them by the
    /// thread count instead, split=N takes N tokens, split=off none; prompt chunks above 16
    /// tokens go through flash2), with parameters, e.g. flash2:br=32 or paged:split=off.
    #[arg(long, default_value = "paged")]
    pub attention: String,
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// What the KV cache stores: f32, f16, bf16, fp8 (E4M3) or int8 (a scale per block and KV
    /// head; fp8:per_head / int8:per_head: one per KV head, set by the prompt), or
    /// progressive:window=N,old=FORMAT[,recent=FORMAT] (the last N tokens in recent — f16 by
    /// default — and blocks older than that re-encoded in old). Every attention reads it as
    /// stored, the prompt's too.
    #[arg(long, default_value = "f32")]
    pub kv_cache: String,
    /// Convert every weight matrix to this format: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
    /// q5_1, iq4_nl, q2_k..q6_k, sym4g32, ... (default: keep the checkpoint's). A K-quant on
    /// rows that are not a multiple of 256 falls back as llama-quantize's does (q4_k → q5_0,
    /// q5_k → q5_1, q6_k → q8_0, q2_k/q3_k → iq4_nl); the loaded bytes per type are printed.
    #[arg(long)]
    pub weights: Option<String>,
    /// The product of every projection. packed (default): int8 activations on 16-row
    /// interleaved weight tiles built at load, llama.cpp's arithmetic (q4_0, q4_1, q5_0, q5_1,
    /// iq4_nl, q8_0, q4_k, q5_k, q6_k); fused:act=q8: the same arithmetic on row-major weights;
    /// fused: f32 activations, the arithmetic of transformers' float32 reference (its greedy
    /// text). A format packed does not tile (q2_k, q3_k in a file's mix) gets fused:act=q8;
    /// others fused. Add isa=avx2 etc. to pin a tier (see --isa).
    #[arg(long, default_value = "packed")]
    pub matmul: String,
    /// MoE capacity: dropless (default) or a factor such as 1.25.
    #[arg(long, default_value = "dropless")]
    pub capacity: String,
    /// Speculative decoding with this drafter: a preset or checkpoint (same vocabulary),
    /// self:FORMAT (the target's own weights converted, e.g. self:q4_0), self-layers:N (the
    /// target's first N layers, layer skipping), ngram[:N] (prompt lookup of the last N
    /// tokens, default 3) or suffix[:D][:corpus=TEXT][:factor=F][:min_prob=P] (SuffixDecoding:
    /// the longest earlier match of the context's suffix, up to D − 1 tokens, default 24,
    /// continuations ranked by frequency; with a corpus — gpl3, licenses, rust, seeds, python
    /// or a file, tokenised — also its matches, REST-style, the longer match drafting; factor
    /// and min_prob: the paper's adaptive length, at most F × the match length tokens a path
    /// and only tokens of path probability ≥ P, vLLM's defaults 1 and 0.1, off unless given).
    #[arg(long)]
    pub spec_draft: Option<String>,
    /// Draft tree: chain:K, static:B1,B2,... (branching per depth) or dynamic:N (N nodes
    /// grown where the draft is most confident).
    #[arg(long, default_value = "chain:4", requires = "spec_draft")]
    pub spec_tree: String,
    /// Shrink the draft depth while the running acceptance rate is under 70%, grow it above.
    #[arg(long, requires = "spec_draft")]
    pub spec_adaptive: bool,
    /// How an adaptive draft picks its depth: threshold (the 70% rule of --spec-adaptive) or
    /// cost (each round the depth with the most expected tokens per decode step, from this
    /// machine's pass costs measured before generating, the running acceptance and the
    /// drafter's time; implies --spec-adaptive).
    #[arg(long, default_value = "threshold", value_parser = ["threshold", "cost"], requires = "spec_draft")]
    pub spec_policy: String,
    /// Worker threads (default: all logical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Refuse a generation whose K/V cache would exceed this (a size such as 8GiB or a share
    /// such as 50% of the available memory; default 80% of it).
    #[arg(long, value_name = "SIZE")]
    pub mem_budget: Option<String>,
    /// table streams the text; json prints one object at the end.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

impl GenerateArgs {
    /// The loader options these flags ask for.
    pub fn load_options(&self) -> Result<LoadOptions> {
        crate::load_flags::LoadFlags {
            attention: Some(self.attention.clone()),
            weights: self.weights.clone(),
            capacity: Some(self.capacity.clone()),
            matmul: Some(self.matmul.clone()),
            kv_cache: Some(self.kv_cache.clone()),
        }
        .options()
    }

    /// The sampler these flags ask for.
    pub fn sampler(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

/// The JSON `--format json` prints.
#[derive(Debug, Serialize)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    /// Empty for a model without a tokenizer (a preset).
    pub text: String,
    pub ttft_ms: f64,
    pub tpot_ms: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// The projections' product (--matmul) and the CPU kernels' ISA tier (--isa).
    pub matmul: String,
    /// What the KV cache stored (--kv-cache).
    pub kv_cache: String,
    pub isa: String,
    /// Bytes of the loaded weights per stored type (q5_0, q8_0, f32, ...).
    pub weight_bytes: std::collections::BTreeMap<String, usize>,
    /// Speculative decoding statistics (with --spec-draft).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<SpecSummary>,
    /// What the thread team did (`kernel_cpu::team::stats`): regions, how many ran solo on
    /// a busy machine, stalls, and the workers' idle gaps before the regions they joined.
    pub team: TeamSummary,
}

/// `kernel_cpu::team::TeamStats` for the JSON.
#[derive(Debug, Serialize)]
pub struct TeamSummary {
    pub regions: u64,
    pub solo_regions: u64,
    pub solo_periods: u64,
    pub stalls: u64,
    pub stall_wait_ms: f64,
    /// The team's threads' run-queue delay over their time while teamed (0 on a quiet
    /// machine).
    pub run_queue_delay_fraction: f64,
    pub parks: u64,
    /// Bucket b: workers' idle gaps of [2^(b−1), 2^b) µs before a region (b = 0: < 1 µs).
    pub idle_gaps_us_log2: Vec<u64>,
}

impl From<kernel_cpu::team::TeamStats> for TeamSummary {
    fn from(st: kernel_cpu::team::TeamStats) -> TeamSummary {
        TeamSummary {
            regions: st.regions,
            solo_regions: st.solo_regions,
            solo_periods: st.solo_periods,
            stalls: st.stalls,
            stall_wait_ms: st.stall_wait_ns as f64 / 1e6,
            run_queue_delay_fraction: st.windows_delay_ns as f64 / st.windows_ns.max(1) as f64,
            parks: st.parks,
            idle_gaps_us_log2: st.gaps.to_vec(),
        }
    }
}

/// What `--spec-draft` adds to the JSON.
#[derive(Debug, Serialize)]
pub struct SpecSummary {
    pub drafter: String,
    pub tree: String,
    pub adaptive: bool,
    /// threshold or cost (`--spec-policy`).
    pub policy: String,
    pub target_passes: usize,
    /// Accepted / proposed draft depth (1 − rejected / drafted).
    pub acceptance_rate: f64,
    pub tokens_per_pass: f64,
    pub draft_ms: f64,
    pub verify_ms: f64,
}

/// The prompt's ids from --prompt (needs a tokenizer) or --prompt-ids, checked.
pub fn prompt_ids(
    args: &GenerateArgs,
    tok: Option<&TextTokenizer>,
    note: Option<&str>,
    vocab: usize,
) -> Result<Vec<u32>> {
    let ids = match (&args.prompt, &args.prompt_ids, tok) {
        (Some(p), None, Some(tok)) => tok.prompt_ids(p)?,
        (Some(_), None, None) => {
            return Err(HarnessError::Usage(format!(
                "--model {} has no tokenizer{}: give --prompt-ids",
                args.model,
                note.map_or(String::new(), |n| format!(" ({n})"))
            )))
        }
        (None, Some(ids), _) => ids.clone(),
        _ => {
            return Err(HarnessError::Usage(
                "give exactly one of --prompt TEXT and --prompt-ids 1,2,3".into(),
            ))
        }
    };
    if ids.is_empty() {
        return Err(HarnessError::Usage("the prompt has no tokens".into()));
    }
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(HarnessError::Usage(format!(
            "prompt id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(ids)
}

/// Prints the part of the text that is complete (a partial UTF-8 sequence decodes to U+FFFD).
struct Streamer<'a> {
    tok: Option<&'a TextTokenizer>,
    printed: usize,
}

impl Streamer<'_> {
    fn show(&mut self, generated: &[u32]) -> Result<()> {
        match self.tok {
            Some(tok) => {
                let text = tok.decode(generated)?;
                if !text.ends_with('\u{FFFD}') {
                    if let Some(new) = text.get(self.printed..).filter(|t| !t.is_empty()) {
                        print!("{new}");
                        self.printed = text.len();
                    }
                }
            }
            None => print!("{} ", generated.last().expect("a token")),
        }
        let _ = std::io::stdout().flush();
        Ok(())
    }
}

/// Runs the generation; returns the exit code.
pub fn run(args: &GenerateArgs) -> Result<i32> {
    let mut sampler = Sampler::new(args.sampler())?;
    let budget = MemBudget::parse(args.mem_budget.as_deref())?;
    if args.max_new_tokens == 0 {
        return Err(HarnessError::Usage(
            "--max-new-tokens must be at least 1".into(),
        ));
    }
    let opts = args.load_options()?;
    if args.spec_draft.is_some() && !opts.kv_cache.is_f32() {
        return Err(HarnessError::Usage(format!(
            "--spec-draft moves accepted draft positions in an f32 KV cache only; drop --kv-cache {}",
            args.kv_cache
        )));
    }
    let loaded = load(&crate::model_source::resolve_model(&args.model)?, &opts)?;
    let (model, tok) = (&loaded.model, loaded.tokenizer.as_ref());
    let prompt_ids = prompt_ids(args, tok, loaded.tokenizer_note.as_deref(), model.cfg.vocab)?;
    if prompt_ids.len().saturating_add(args.max_new_tokens) > model.cfg.context {
        return Err(HarnessError::Usage(format!(
            "{} prompt tokens + {} new tokens exceed the model's context of {}",
            prompt_ids.len(),
            args.max_new_tokens,
            model.cfg.context
        )));
    }
    let tokens = prompt_ids.len() + args.max_new_tokens;
    let bs = args.block_size.max(1);
    // The loaded weights plus the session's pool in the cache's own format (`--kv-cache int8`
    // holds a quarter of f32).
    let held = model.held_bytes() as u64;
    let kv = models::KvPools::planned_bytes(model, tokens.div_ceil(bs), bs);
    if let Some(note) = budget.refuse(
        held.saturating_add(kv),
        &format!(
            "the model's {} of weights and the {} K/V cache of {tokens} tokens",
            crate::mem_guard::human(held),
            model.kv_cache()
        ),
    ) {
        return Err(HarnessError::Usage(format!("this generation {note}")));
    }

    let mut session = Session::new(
        model,
        prompt_ids.len() + args.max_new_tokens,
        args.block_size,
    )?;
    let eos = if args.ignore_eos {
        None
    } else {
        tok.and_then(|t| t.eos)
    };
    if let Some(d) = &args.spec_draft {
        return run_spec(args, &loaded, prompt_ids, eos, d);
    }
    let mut stream = (args.format == Format::Table).then_some(Streamer { tok, printed: 0 });
    let started = Instant::now();
    let mut logits = session.forward(&prompt_ids)?;
    let mut generated = vec![];
    let mut ttft = 0.0;
    loop {
        let next = sampler.sample(&logits);
        generated.push(next);
        if generated.len() == 1 {
            ttft = started.elapsed().as_secs_f64();
        }
        if let Some(s) = stream.as_mut() {
            s.show(&generated)?;
        }
        if Some(next) == eos || generated.len() == args.max_new_tokens {
            break;
        }
        logits = session.forward(&[next])?;
    }
    let total = started.elapsed().as_secs_f64();
    let decode_steps = generated.len() - 1;
    let tpot = (decode_steps > 0).then(|| (total - ttft) / decode_steps as f64);
    let out = Generation {
        text: match tok {
            Some(t) => t.decode(&generated)?,
            None => String::new(),
        },
        prompt_ids,
        ttft_ms: ttft * 1e3,
        tpot_ms: tpot.map(|t| t * 1e3),
        tokens_per_s: tpot.map(|t| 1.0 / t),
        team: kernel_cpu::team::stats().into(),
        generated_ids: generated,
        matmul: args.matmul.clone(),
        kv_cache: opts.kv_cache.to_string(),
        isa: crate::machine::isa(),
        weight_bytes: weight_bytes_by_type(model),
        spec: None,
    };
    report(args, &loaded, &out)
}

/// The largest pass the cost policy times before generating.
const COST_MAX_TOKENS: usize = 33;

fn run_spec(
    args: &GenerateArgs,
    loaded: &models::Loaded,
    prompt_ids: Vec<u32>,
    eos: Option<u32>,
    spec: &str,
) -> Result<i32> {
    let shape = TreeShape::parse(&args.spec_tree)?;
    let by_cost = args.spec_policy == "cost";
    let cost = if by_cost {
        // Passes up to the whole tree (capped: past it the slope extends), after a context
        // like the prompt's; untimed in the run's numbers, it is part of setting up.
        let tokens = (shape.max_nodes() + 1).min(COST_MAX_TOKENS);
        let context = prompt_ids.len().clamp(1, 256);
        let c = models::speculative::cost::PassCost::measure(&loaded.model, tokens, context, 3)?;
        if args.format == Format::Table {
            eprintln!(
                "pass costs (decode steps, 1..{tokens} tokens): {}",
                c.steps
                    .iter()
                    .map(|s| format!("{s:.2}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        Some(c)
    } else {
        None
    };
    let cfg = SpecConfig {
        shape: shape.clone(),
        adaptive: args.spec_adaptive || by_cost,
        threshold: 0.7,
        sampler: args.sampler(),
        cost,
    };
    // Within the context (checked above) plus a tree of at most MAX_TREE_NODES.
    let capacity = prompt_ids.len() + args.max_new_tokens + shape.max_nodes() + 1;
    let mut d = drafter(
        &crate::model_source::resolve_model(&args.model)?,
        args.load_options()?,
        args.sampler(),
        &loaded.model,
        loaded.tokenizer.as_ref(),
        spec,
        capacity,
    )?;
    let started = Instant::now();
    let out = models::speculative::driver::generate(
        &loaded.model,
        d.as_mut(),
        &prompt_ids,
        args.max_new_tokens,
        eos,
        &cfg,
    )?;
    let total = started.elapsed().as_secs_f64();
    let st = &out.stats;
    let after_first = total - st.prefill_s;
    let decode = out.tokens.len().saturating_sub(1);
    let gen = Generation {
        text: match &loaded.tokenizer {
            Some(t) => t.decode(&out.tokens)?,
            None => String::new(),
        },
        prompt_ids,
        ttft_ms: st.prefill_s * 1e3,
        tpot_ms: (decode > 0).then(|| after_first / decode as f64 * 1e3),
        tokens_per_s: (decode > 0).then(|| decode as f64 / after_first),
        matmul: args.matmul.clone(),
        kv_cache: args.kv_cache.clone(),
        isa: crate::machine::isa(),
        weight_bytes: weight_bytes_by_type(&loaded.model),
        team: kernel_cpu::team::stats().into(),
        spec: Some(SpecSummary {
            drafter: d.name(),
            tree: shape.label(),
            adaptive: cfg.adaptive,
            policy: args.spec_policy.clone(),
            target_passes: st.rounds,
            acceptance_rate: st.acceptance_rate(),
            tokens_per_pass: st.tokens_per_pass(),
            draft_ms: st.draft_s * 1e3,
            verify_ms: st.verify_s * 1e3,
        }),
        generated_ids: out.tokens,
    };
    if args.format == Format::Table {
        match &loaded.tokenizer {
            Some(_) => print!("{}", gen.text),
            None => print!(
                "{}",
                gen.generated_ids
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        }
    }
    report(args, loaded, &gen)
}

fn report(args: &GenerateArgs, loaded: &models::Loaded, out: &Generation) -> Result<i32> {
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&out)?),
        Format::Table => {
            println!();
            eprintln!("{}", weights_line(&loaded.model));
            eprintln!(
                "{}: {} prompt + {} generated tokens; time to first token {:.1} ms, {} per output token",
                loaded.source,
                out.prompt_ids.len(),
                out.generated_ids.len(),
                out.ttft_ms,
                out.tpot_ms
                    .map_or("–".into(), |t| format!("{t:.2} ms ({:.1} tokens/s)", 1e3 / t))
            );
            if let Some(s) = &out.spec {
                eprintln!(
                    "speculative: {} drafting {}{}, {} target passes, acceptance {:.0}%, {:.2} tokens per pass, draft {:.0} ms, verify {:.0} ms",
                    s.drafter,
                    s.tree,
                    match (s.adaptive, s.policy.as_str()) {
                        (true, "cost") => " (depth by pass cost)",
                        (true, _) => " (adaptive depth)",
                        _ => "",
                    },
                    s.target_passes,
                    100.0 * s.acceptance_rate,
                    s.tokens_per_pass,
                    s.draft_ms,
                    s.verify_ms
                );
            }
            if let Some(line) = team_line(&out.team) {
                eprintln!("{line}");
            }
        }
    }
    Ok(0)
}

/// What the thread team did when other processes kept its threads off the cores (nothing on
/// a quiet machine).
fn team_line(st: &TeamSummary) -> Option<String> {
    let busy =
        st.solo_regions > 0 || st.run_queue_delay_fraction > kernel_cpu::team::DELAY_FRACTION;
    busy.then(|| {
        format!(
            "busy machine: {} of {} parallel regions ran on one thread ({} solo periods); {} regions waited {:.1} ms for descheduled threads; while teamed its threads waited for a CPU {:.1}% of the time",
            st.solo_regions,
            st.regions,
            st.solo_periods,
            st.stalls,
            st.stall_wait_ms,
            100.0 * st.run_queue_delay_fraction
        )
    })
}
