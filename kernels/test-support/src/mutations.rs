//! Planted bugs: textual mutations of the `.cu` sources that the emulated kernel tests must
//! catch (mutation testing, as `cargo-mutants` does for Rust, here for CUDA C++). A mutation
//! is switched on for one process by `WORKBENCH_EMU_MUTATION=<name>`; `emulated::module` then
//! compiles the source with the mutation planted (its text must occur exactly once, so a
//! mutation cannot silently stop applying when the kernel changes). `assert_each_caught` runs
//! a family's emulated test once per mutation of its file, in a child process (a planted bug
//! may fault), and asserts that each run fails on a wrong result — and the test itself, run
//! without the variable, passes.

use kernel_cuda::KernelSource;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that plants a mutation.
pub const SWITCH: &str = "WORKBENCH_EMU_MUTATION";

/// One planted bug.
#[derive(Debug, Clone, Copy)]
pub struct Mutation {
    pub name: &'static str,
    /// The `.cu` it applies to.
    pub file: &'static str,
    pub what: &'static str,
    pub find: &'static str,
    pub replace: &'static str,
}

/// The bugs kernels/CUDA.md and the README say the emulated tests catch.
pub const MUTATIONS: &[Mutation] = &[
    Mutation {
        name: "flash2-pv-rows-swapped",
        file: "attention.cu",
        what: "flash2's P·V B-fragment reads V rows key+1 and key swapped",
        find: "join2(vs[key * LD + dim], vs[(key + 1) * LD + dim])",
        replace: "join2(vs[(key + 1) * LD + dim], vs[key * LD + dim])",
    },
    Mutation {
        name: "flash2-barrier-before-load",
        file: "attention.cu",
        what: "flash2's barrier before a K/V tile is overwritten removed",
        find: "        __syncthreads();  // the previous tile is no longer read\n",
        replace: "",
    },
    Mutation {
        name: "flash2-barrier-after-load",
        file: "attention.cu",
        what: "flash2's barrier after a K/V tile is loaded removed",
        find: "        __syncthreads();\n\n        // S = Q·Kᵀ",
        replace: "\n        // S = Q·Kᵀ",
    },
    Mutation {
        name: "flash2p-barrier-after-load",
        file: "attention.cu",
        what: "flash2p's barrier after a tile's cp.async lands removed",
        find: "        __syncthreads();  // tile t is in shared memory for every thread\n",
        replace: "",
    },
    Mutation {
        name: "flash2p-barrier-before-refill",
        file: "attention.cu",
        what: "flash2p's barrier before a stage is refilled removed",
        find: "        __syncthreads();  // the stage is refilled two tiles on: everyone has read it\n",
        replace: "",
    },
    Mutation {
        name: "flash2p-v-without-trans",
        file: "attention.cu",
        what: "flash2p reads V with ldmatrix without .trans",
        find: "ldmatrix_x4_trans(r, vt +",
        replace: "ldmatrix_x4(r, vt +",
    },
    Mutation {
        name: "attention-window-off-by-one",
        file: "attention.cu",
        what: "naive and flash2 let a row see one key more than its sliding window",
        find: "(window <= 0 || pos - key < window)",
        replace: "(window <= 0 || pos - key <= window)",
    },
    Mutation {
        name: "flash2-window-start-late",
        file: "attention.cu",
        what: "flash2 and flash2p start a block's key loop one key after its window start",
        find: "max(0, offset + row0 + 1 - window)",
        replace: "max(0, offset + row0 + 2 - window)",
    },
    Mutation {
        name: "flash2-softcap-skipped",
        file: "attention.cu",
        what: "flash2 and flash2p skip the logit soft-cap",
        find: "softcap > 0.0f ? cap_out * tanhf(s[nt][e] * cap_in) : s[nt][e] * sl2",
        replace: "s[nt][e] * sl2",
    },
    Mutation {
        name: "paged-causal-off-by-one",
        file: "paged.cu",
        what: "paged decode lets query row i see one key past its position",
        find: "last_key[r] = ctx - q_len + i;",
        replace: "last_key[r] = ctx - q_len + i + 1;",
    },
    Mutation {
        name: "paged-launch-hq-hkv-swapped",
        file: "paged.cu",
        what: "paged decode's hq and hkv launch arguments swapped (the entry's signature)",
        find: "float* part_o, float* part_lse, int batch, int hq, int hkv, int q_len, int bs,",
        replace: "float* part_o, float* part_lse, int batch, int hkv, int hq, int q_len, int bs,",
    },
    Mutation {
        name: "paged-window-off-by-one",
        file: "paged.cu",
        what: "paged decode lets a row see one key more than its sliding window",
        find: "last_key[r] - j >= window",
        replace: "last_key[r] - j > window",
    },
    Mutation {
        name: "paged-partitions-from-zero",
        file: "paged.cu",
        what: "paged decode's partitions start at position 0, not at the window's first key",
        find: "const int k_begin = k_first + part * part_tokens",
        replace: "const int k_begin = part * part_tokens",
    },
    Mutation {
        name: "paged-softcap-skipped",
        file: "paged.cu",
        what: "paged decode skips the logit soft-cap",
        find: "if (softcap > 0.0f) s = cap_l2 * tanhf(s * cap_inv);",
        replace: "",
    },
    Mutation {
        name: "moe-up-fed-gate-fragments",
        file: "experts.cu",
        what: "cuda_grouped's up-projection MMA fed the gate's B fragments",
        find: "mma16816<T>(au[mt][nt], a[mt], bu[nt]);",
        replace: "mma16816<T>(au[mt][nt], a[mt], bg[nt]);",
    },
    Mutation {
        name: "moe-up-barrier-after-load",
        file: "experts.cu",
        what: "cuda_grouped's barrier after the gate/up tiles are loaded removed",
        find: "            load_chunk(us + r * XLD + col, n < ff ? wue + (size_t)n * dm : nullptr, k0 + col, dm);\n        }\n        __syncthreads();\n",
        replace: "            load_chunk(us + r * XLD + col, n < ff ? wue + (size_t)n * dm : nullptr, k0 + col, dm);\n        }\n",
    },
    Mutation {
        name: "moe-combine-rows-skips-last",
        file: "experts.cu",
        what: "cuda_grouped's per-token combine skips a token's last assignment",
        find: "for (int i = first; i < last; ++i) acc",
        replace: "for (int i = first; i < last - 1; ++i) acc",
    },
    Mutation {
        name: "moe-combine-skips-last-rank",
        file: "moe.cu",
        what: "the slot combine skips a token's last-ranked assignment",
        find: "for (int r = 0; r < k; ++r) {\n            const int a = t * k + r;",
        replace: "for (int r = 0; r < k - 1; ++r) {\n            const int a = t * k + r;",
    },
    Mutation {
        name: "tree-window-off-by-one",
        file: "spec.cu",
        what: "tree attention lets a node see an ancestor one level past its sliding window",
        find: "depth - depths[j] >= window",
        replace: "depth - depths[j] > window",
    },
    Mutation {
        name: "tree-softcap-skipped",
        file: "spec.cu",
        what: "tree attention skips the logit soft-cap",
        find: "if (softcap > 0.0f) s = softcap * tanhf(s / softcap);",
        replace: "",
    },
];

/// Whether this process runs with a mutation planted (a child of `assert_each_caught`).
pub fn switched_on() -> bool {
    std::env::var_os(SWITCH).is_some()
}

/// The mutation `WORKBENCH_EMU_MUTATION` names for `source`'s file, planted, if any. Panics
/// on a name no mutation has, or a mutation whose text is not in the source exactly once.
pub fn planted(source: &KernelSource) -> Option<KernelSource> {
    let name = std::env::var(SWITCH).ok()?;
    let m = MUTATIONS
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{SWITCH}={name}: no such mutation"));
    if m.file != source.file {
        return None;
    }
    let found = source.code.matches(m.find).count();
    assert_eq!(
        found, 1,
        "mutation {name}: its text occurs {found} times in {}",
        m.file
    );
    eprintln!("planted mutation {name} in {}: {}", m.file, m.what);
    let code: &'static str = Box::leak(source.code.replacen(m.find, m.replace, 1).into_boxed_str());
    Some(KernelSource { code, ..*source })
}

/// How a mutated run ended.
#[derive(Debug)]
pub struct Caught {
    pub mutation: &'static str,
    pub seconds: f64,
    /// The first line of the failure (a panic message, or the signal).
    pub failure: String,
}

/// Runs test `test` of the calling test binary once per mutation of `file`, each in a child
/// process with the mutation planted (as many at a time as there are cores), and asserts that
/// each fails on a wrong result (a failed closeness assertion or a fault), not on a build
/// error. Returns how each was caught.
pub fn assert_each_caught(file: &str, test: &str) -> Vec<Caught> {
    let exe = std::env::current_exe().expect("the test binary");
    let todo: Vec<&Mutation> = MUTATIONS.iter().filter(|m| m.file == file).collect();
    assert!(!todo.is_empty(), "no mutation applies to {file}");
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut caught = vec![];
    for batch in todo.chunks(at_once) {
        let running: Vec<_> = batch.iter().map(|m| (m, spawn(&exe, test, m))).collect();
        for (m, (mut child, log, start)) in running {
            let status = loop {
                if let Some(s) = child.try_wait().expect("waiting for the child") {
                    break s;
                }
                if start.elapsed() > Duration::from_secs(900) {
                    let _ = child.kill();
                    panic!("mutation {}: still running after 15 minutes", m.name);
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            caught.push(judge(m, test, file, status, &text, start));
        }
    }
    caught
}

/// A child running `test` with `m` planted, its output going to a file (so a chatty child
/// never blocks on a full pipe).
fn spawn(
    exe: &std::path::Path,
    test: &str,
    m: &Mutation,
) -> (std::process::Child, std::path::PathBuf, Instant) {
    let log = std::env::temp_dir().join(format!(
        "workbench-mutation-{}-{}.log",
        m.name,
        std::process::id()
    ));
    let out = std::fs::File::create(&log).expect("a log file");
    let child = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(SWITCH, m.name)
        .stdout(Stdio::from(out.try_clone().expect("the log file")))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("the test binary runs");
    (child, log, Instant::now())
}

/// Asserts that the mutated run was planted, failed, and failed on a result, not a build.
fn judge(
    m: &Mutation,
    test: &str,
    file: &str,
    status: std::process::ExitStatus,
    text: &str,
    start: Instant,
) -> Caught {
    assert!(
        text.contains(&format!("planted mutation {}", m.name)),
        "mutation {}: never planted (is {test} emulating {file}?):\n{text}",
        m.name
    );
    assert!(
        !status.success(),
        "mutation {} ({}) was not caught by {test}",
        m.name,
        m.what
    );
    assert!(
        !text.contains("could not compile"),
        "mutation {}: the mutant does not build:\n{text}",
        m.name
    );
    let failure = text
        .lines()
        .skip_while(|l| !l.contains("panicked at"))
        .nth(1)
        .map(str::to_string)
        .unwrap_or_else(|| format!("ended by {status}"));
    let seconds = start.elapsed().as_secs_f64();
    eprintln!("mutation {}: caught in {seconds:.1} s: {failure}", m.name);
    Caught {
        mutation: m.name,
        seconds,
        failure,
    }
}
