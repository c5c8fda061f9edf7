//! The `harness` command line: list, check, exp, plan, merge, replay, generate, roofline,
//! compare, paper, render. Every error is one line on
//! stderr and exit code 2; a check or experiment with a wrong answer exits 1.

use clap::{Args, Parser, Subcommand};
use harness::checking::CheckOptions;
use harness::commands::{check, compare, eval, exp, generate, list, merge, replay, roofline};
use harness::error::{HarnessError, Result};
use harness::mem_guard::MemBudget;
use harness::run_files::ExpOptions;
use harness::sweep::{Shard, SweepOptions};
use harness::{machine, workspace, Format};
use kernel_common::{DType, Device};
use std::path::PathBuf;

/// Kernel-research workbench for LLM inference: correctness against an f64 reference,
/// measurement against this machine's roofline, results with provenance.
#[derive(Parser)]
#[command(name = "harness", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Folder of experiment specs (<name>.toml). Default: experiments/ of the workbench
    /// checkout the current directory is in (or of WORKBENCH_ROOT).
    #[arg(long, global = true)]
    experiments_dir: Option<PathBuf>,
    /// Folder results are written under. Default: results/ of the workbench checkout the
    /// current directory is in (or of WORKBENCH_ROOT).
    #[arg(long, global = true)]
    results_dir: Option<PathBuf>,
    /// Cap the CPU kernels' instruction set: avx512 (AVX-512 F/BW/VL), avx2 (AVX2 + FMA +
    /// F16C, x86-64-v3) or portable (plain loops). Default: the widest this CPU has, or the
    /// WORKBENCH_ISA environment variable. Recorded in every result's provenance.
    #[arg(long, global = true, value_name = "TIER")]
    isa: Option<String>,
}

/// Applies `--isa` (or checks `WORKBENCH_ISA`): a tier this CPU lacks is one line naming the
/// missing features.
fn apply_isa(isa: Option<&str>) -> Result<()> {
    use kernel_cpu::isa;
    let usage = |e: kernel_cpu::IsaError| HarnessError::Usage(e.to_string());
    match isa {
        Some(name) => {
            let tier = kernel_cpu::Isa::parse(name)
                .map_err(|e| usage(kernel_cpu::IsaError(format!("--isa: {e}"))))?;
            isa::set_cap(tier)
                .map_err(|e| usage(kernel_cpu::IsaError(format!("--isa {name}: {e}"))))
        }
        None => isa::cap_from_env().map(|_| ()).map_err(usage),
    }
}

/// `--experiments-dir` / `--results-dir`, or `name` in the workspace found from here.
fn dir_or_workspace(given: Option<PathBuf>, name: &str) -> Result<PathBuf> {
    match given {
        Some(dir) => Ok(dir),
        None => Ok(workspace::root()?.join(name)),
    }
}

#[derive(Args)]
struct Common {
    /// Where kernels run: cpu, cuda or cuda:N (cuda needs a driver and a GPU).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Worker threads (default: all logical cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of every random input (rows record their own derived seed).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Output on stdout.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// What `exp` and `plan` share: the experiment and how its grid, variants and peers are chosen.
#[derive(Args)]
struct ExpArgs {
    /// Experiment name (experiments/<name>.toml) or a path to a .toml spec.
    name: String,
    /// Replace a grid key's values, e.g. --set kv_len=512,4096 (repeatable).
    #[arg(long = "set", value_name = "KEY=V1,V2")]
    sets: Vec<String>,
    /// Run these variants instead of the spec's (repeatable), e.g. --variant flash2:br=64.
    #[arg(long = "variant")]
    variants: Vec<String>,
    /// Time and check these peers (scripts/peers/<name>, options as for variants) instead
    /// of the spec's `peers` (repeatable), e.g. --peer torch_sdpa,
    /// --peer torch_linear:dtype=bf16, --peer llamacpp:build=avx2.
    #[arg(long = "peer", value_name = "NAME")]
    peers: Vec<String>,
    /// Run without the spec's peers.
    #[arg(long, conflicts_with = "peers")]
    no_peers: bool,
    /// Folder of registered peers. Default: scripts/peers of the checkout.
    #[arg(long, value_name = "DIR")]
    peers_dir: Option<PathBuf>,
    /// Use the spec's [quick] grid: smaller, for a first look in about a minute.
    #[arg(long)]
    quick: bool,
    /// Timed repetitions per point (after one untimed warm-up); default from the spec or 5.
    #[arg(long)]
    reps: Option<usize>,
    /// Skip a grid point whose estimated memory (inputs, outputs, workspace, K/V, weights)
    /// exceeds this, with a `skipped` row saying why: a size (8GiB, 500M) or a share of the
    /// memory available at the start (50%). Default: 80% of the available memory.
    #[arg(long, value_name = "SIZE")]
    mem_budget: Option<String>,
    /// The sweep this run is a shard of, shared by all its shards (default: derived from the
    /// spec, the grid and the commit).
    #[arg(long, value_name = "ID")]
    sweep_id: Option<String>,
    #[command(flatten)]
    common: Common,
}

impl ExpArgs {
    /// The options of `harness exp` / `plan`, with the folders resolved.
    fn options(
        self,
        experiments_dir: Option<PathBuf>,
        results_dir: Option<PathBuf>,
        sweep: SweepOptions,
    ) -> Result<ExpOptions> {
        let device = Device::parse(&self.common.device)?;
        set_threads(self.common.threads)?;
        Ok(ExpOptions {
            name: self.name,
            sets: self.sets,
            variants: self.variants,
            quick: self.quick,
            device,
            reps: self.reps,
            seed: self.common.seed,
            format: self.common.format,
            experiments_dir: dir_or_workspace(experiments_dir, "experiments")?,
            results_dir: dir_or_workspace(results_dir, "results")?,
            peers_dir: match self.peers_dir {
                Some(dir) => dir,
                None => workspace::root()
                    .map(|r| r.join("scripts/peers"))
                    .unwrap_or_else(|_| PathBuf::from("scripts/peers")),
            },
            peers: self.peers,
            no_peers: self.no_peers,
            sweep,
            mem_budget: MemBudget::parse(self.mem_budget.as_deref())?,
        })
    }
}

#[derive(Subcommand)]
enum Command {
    /// List kernel families, variants and experiments.
    List,
    /// Check every variant against the f64 reference on random shapes and edge cases;
    /// writes results/check/<run-id>.csv, exits 1 on any failure.
    Check {
        /// Family to check (attention, paged, quant, moe, speculative); default all.
        #[arg(long)]
        family: Vec<String>,
        /// Random cases per family (edge cases are always added).
        #[arg(long, default_value_t = 12)]
        cases: usize,
        /// Storage dtypes to check (f32, f16, bf16); default all.
        #[arg(long)]
        dtype: Vec<String>,
        /// Instead of the families' checks: for every attention variant × projection
        /// product, whether a sequence's logits are bit-identical alone and inside a batch
        /// of sequences of other lengths, and on 1 and on --threads threads (a report:
        /// results/check/<run-id>-invariance.csv).
        #[arg(long)]
        invariance: bool,
        /// The model of --invariance (as `generate --model`; default the tiny-gqa preset,
        /// its weights converted to q4_0).
        #[arg(long, requires = "invariance")]
        model: Option<String>,
        /// --weights for the --invariance model.
        #[arg(long, requires = "invariance")]
        weights: Option<String>,
        /// Decode steps of --invariance after the prompts.
        #[arg(long, default_value_t = 8, requires = "invariance")]
        steps: usize,
        #[command(flatten)]
        common: Common,
    },
    /// Run an experiment spec: every variant at every grid point, checked and timed; rows
    /// stream to results/<exp>/<run-id>.csv with .json provenance, .md table and .svg plot.
    /// With --shard I/N only the points of that shard, into
    /// results/<exp>/<sweep-id>.shard-I-of-N.{csv,json} (`harness merge` puts shards together).
    Exp {
        #[command(flatten)]
        args: ExpArgs,
        /// Run only shard I of N (I counts from 0): the grid points whose key hashes to I,
        /// e.g. --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT.
        #[arg(long, value_name = "I/N")]
        shard: Option<String>,
        /// Continue this shard's files if they exist: skip the points complete in its CSV,
        /// discard a half-written tail, measure the rest (without it, existing files are
        /// refused). Alone, the whole grid is shard 0/1.
        #[arg(long)]
        resume: bool,
    },
    /// How a sweep would split into N shards: points, rows and estimated time per shard
    /// (rows x the spec's seconds_per_point), and the sweep id the shards would share.
    /// Measures and writes nothing.
    Plan {
        #[command(flatten)]
        args: ExpArgs,
        /// Number of shards.
        #[arg(long, value_name = "N")]
        shards: usize,
    },
    /// Put the shards of a sweep together: one CSV and one provenance JSON listing every
    /// shard's machine, ISA, roofline, commit, start and end, then the .md and .svg, in
    /// results/<exp>/<sweep-id>.*. Refuses a missing or unfinished shard, a truncated shard
    /// CSV, a point present twice, shards of different specs or grids.
    Merge {
        /// A sweep id (its shards are found under the results folder) or the shard CSVs.
        #[arg(required = true, value_name = "SWEEP_ID|SHARD.csv")]
        inputs: Vec<String>,
        /// Accept shards run on different commits or machines (recorded as mixed).
        #[arg(long)]
        allow_mixed: bool,
        /// Output on stdout.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Measure this machine's read bandwidth, f32 FMA peak and int8 MAC peak; keep the best seen so far in
    /// results/roofline/<machine>-<threads>t.json (each experiment also measures afresh).
    Roofline {
        /// Worker threads (default: all logical cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Store this measurement even if the stored one is higher (default: keep the best).
        #[arg(long)]
        replace: bool,
        /// Where to measure: cpu (cuda rooflines come with the CUDA backend).
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Replay captured tensors (safetensors case files: `family` in the metadata, inputs under
    /// fixed names, optionally the output your stack produced as `out`) against every variant
    /// that supports them: error vs the stored output and vs the f64 reference, and time.
    /// Exit 0 when all agree with the stored output, 1 when one disagrees, 2 on a malformed file.
    Replay {
        /// Case files (.safetensors); README documents the schema per family.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only these variants (repeatable), e.g. --variant flash2:br=64 --variant quantize.
        #[arg(long = "variant")]
        variants: Vec<String>,
        /// Timed repetitions per variant (after the checked run).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        #[command(flatten)]
        common: Common,
    },
    /// Generate with a model (a GGUF llama file such as SmolLM2-135M-Instruct from
    /// scripts/fetch-models.sh, a Hugging Face Llama/Mixtral directory, or a random preset):
    /// greedy or sampled, streamed to the terminal, or one JSON object with ids, text, time to
    /// first token and time per output token.
    Generate(generate::GenerateArgs),
    /// Model quality: `eval perplexity` (llama.cpp's chunked convention or a sliding
    /// window), with KL divergence and top-1 agreement against a reference run.
    #[command(subcommand)]
    Eval(EvalCommand),
    /// Compare two runs of one experiment row by row (joined on grid point and variant):
    /// B's speed-up over A by median and the change in error; a row regressed when the
    /// p10–p90 ranges do not overlap and B is slower by more than --threshold. Exit 1 on a
    /// regression.
    Compare {
        /// A (before): a run CSV, a results/<exp>/ folder (its newest run) or a run id.
        before: String,
        /// B (after), as A.
        after: String,
        /// Percent the median must move, beyond non-overlapping p10–p90, to count.
        #[arg(long, default_value_t = 5.0, value_name = "PCT")]
        threshold: f64,
        /// Output on stdout.
        #[arg(long, value_enum, default_value = "table")]
        format: compare::CompareFormat,
    },
    /// Regenerate paper/ from results/ and experiments/claims.toml: claims.md (a verdict per
    /// claim), findings.md, method.md, machines.md. With --check, write nothing and exit 1
    /// if paper/ differs from what would be generated.
    Paper {
        /// Compare with paper/ instead of writing it.
        #[arg(long)]
        check: bool,
        /// Folder to write (default: paper/ of the checkout).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Regenerate the .md and .svg of a run from its CSV and JSON.
    Render {
        /// results/<exp>/<run-id>.csv
        csv: PathBuf,
    },
}

fn set_threads(threads: Option<usize>) -> Result<()> {
    let n = threads.unwrap_or_else(machine::logical_cores);
    if n == 0 {
        return Err(HarnessError::Usage("--threads must be at least 1".into()));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| HarnessError::Usage(format!("cannot start {n} threads: {e}")))
}

/// Runs `work` on a thread of the global pool: the kernels' parallel regions then start from a
/// worker (work stealing, no cross-thread wake-up and futex wait per region, which a call from
/// the main thread pays: ~120 regions per decoded token).
fn on_pool<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    rayon::scope(|_| work())
}

fn run(cli: Cli) -> Result<i32> {
    apply_isa(cli.isa.as_deref())?;
    match cli.command {
        Command::List => {
            // The folder is found (or refused) before anything is printed.
            let experiments_dir = dir_or_workspace(cli.experiments_dir, "experiments")?;
            list::run(&experiments_dir)
        }
        Command::Check {
            family,
            cases,
            dtype,
            invariance,
            model,
            weights,
            steps,
            common,
        } => {
            let device = Device::parse(&common.device)?;
            set_threads(common.threads)?;
            if invariance {
                let opts = harness::commands::invariance::InvarianceOptions {
                    model: model.unwrap_or_else(|| "tiny-gqa".into()),
                    weights,
                    threads: rayon::current_num_threads(),
                    steps,
                    format: common.format,
                    results_dir: dir_or_workspace(cli.results_dir, "results")?,
                };
                return on_pool(|| harness::commands::invariance::run(&opts));
            }
            let families = if family.is_empty() {
                check::default_families()
            } else {
                family
            };
            let dtypes = if dtype.is_empty() {
                DType::ALL.to_vec()
            } else {
                dtype
                    .iter()
                    .map(|d| DType::parse(d))
                    .collect::<kernel_common::error::Result<_>>()?
            };
            let opts = CheckOptions {
                families,
                device,
                cases,
                seed: common.seed,
                dtypes,
                format: common.format,
                results_dir: dir_or_workspace(cli.results_dir, "results")?,
            };
            on_pool(|| check::run(&opts))
        }
        Command::Exp {
            args,
            shard,
            resume,
        } => {
            let sweep = SweepOptions {
                shard: shard.as_deref().map(Shard::parse).transpose()?,
                sweep_id: args.sweep_id.clone(),
                resume,
                plan: None,
            };
            let opts = args.options(cli.experiments_dir, cli.results_dir, sweep)?;
            on_pool(|| exp::run(&opts))
        }
        Command::Plan { args, shards } => {
            if shards == 0 {
                return Err(HarnessError::Usage("--shards must be at least 1".into()));
            }
            let sweep = SweepOptions {
                shard: None,
                sweep_id: args.sweep_id.clone(),
                resume: false,
                plan: Some(shards),
            };
            let opts = args.options(cli.experiments_dir, cli.results_dir, sweep)?;
            on_pool(|| exp::run(&opts))
        }
        Command::Merge {
            inputs,
            allow_mixed,
            format,
        } => merge::run(&merge::MergeOptions {
            inputs,
            allow_mixed,
            format,
            experiments_dir: dir_or_workspace(cli.experiments_dir, "experiments")?,
            results_dir: dir_or_workspace(cli.results_dir, "results")?,
        }),
        Command::Roofline {
            threads,
            device,
            replace,
        } => {
            let device = Device::parse(&device)?;
            let results_dir = dir_or_workspace(cli.results_dir, "results")?;
            roofline::run(device, replace, &results_dir, || set_threads(threads))
        }
        Command::Replay {
            files,
            variants,
            reps,
            common,
        } => {
            let device = Device::parse(&common.device)?;
            set_threads(common.threads)?;
            let opts = replay::ReplayOptions {
                files,
                device,
                variants,
                reps,
                format: common.format,
            };
            on_pool(|| replay::run(&opts))
        }
        Command::Generate(args) => {
            set_threads(args.threads)?;
            on_pool(|| generate::run(&args))
        }
        Command::Eval(EvalCommand::Perplexity(args)) => {
            set_threads(args.threads)?;
            let root = workspace::root().ok();
            let report = on_pool(|| eval::perplexity(&args, root.as_deref()))?;
            match args.format {
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("serialisable")
                ),
                Format::Table => println!("{}", report.table()),
            }
            Ok(0)
        }
        Command::Compare {
            before,
            after,
            threshold,
            format,
        } => compare::run(&compare::CompareOptions {
            before,
            after,
            threshold_pct: threshold,
            format,
            results_dir: dir_or_workspace(cli.results_dir, "results")?,
        }),
        Command::Paper { check, out } => harness::report::run(&harness::report::PaperOptions {
            experiments_dir: dir_or_workspace(cli.experiments_dir, "experiments")?,
            results_dir: dir_or_workspace(cli.results_dir, "results")?,
            out: dir_or_workspace(out, "paper")?,
            check,
        }),
        Command::Render { csv } => {
            let experiments_dir = dir_or_workspace(cli.experiments_dir, "experiments")?;
            println!("{}", exp::rerender(&csv, &experiments_dir)?);
            Ok(0)
        }
    }
}

/// `harness eval ...`.
#[derive(Subcommand, Debug)]
enum EvalCommand {
    /// Perplexity of a model over a text: chunks of --ctx tokens scoring their second half
    /// (llama.cpp's llama-perplexity) or a sliding window (--stride); PPL with its standard
    /// error, KL divergence and top-1 agreement against --reference-logits, tokens/s.
    Perplexity(eval::PerplexityArgs),
}

/// Parses the command line; a usage error becomes one line (clap's first) and exit 2.
fn parse() -> Cli {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            e.exit()
        }
        Err(e) => {
            eprintln!(
                "error: {} (see harness --help)",
                harness::error::clap_line(&e)
            );
            std::process::exit(2);
        }
    }
}

fn main() {
    let args = parse();
    // The tree's state before this run writes anything (its provenance).
    let _ = harness::machine::git_state();
    let code = match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", e.one_line());
            2
        }
    };
    std::process::exit(code);
}
