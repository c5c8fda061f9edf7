//! Planted bugs: textual mutations of the `.cu` sources that the emulated kernel tests must
//! catch (mutation testing, as `cargo-mutants` does for Rust, here for CUDA C++). A mutation
//! is switched on for one process by `WORKBENCH_EMU_MUTATION=<name>`; `emulated::module` then
//! compiles the source with the mutation planted (its text must occur exactly once, so a
//! mutation cannot silently stop applying when the kernel changes). `assert_each_caught` runs
//! a family's emulated test once per mutation of its file, in a child process (a planted bug
//! may fault; one the sanitisers must catch runs with the kernels built with ASan and UBSan),
//! and asserts that each run fails — on a wrong result, a fault, or the failure the mutation
//! names — and that the test itself passes once more with sanitised kernels (`sanitized`);
//! the test run without the variable passing is the other half.

use kernel_cuda::KernelSource;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that plants a mutation.
pub const SWITCH: &str = crate::emu::MUTATION_SWITCH;

/// One planted bug.
#[derive(Debug, Clone, Copy)]
pub struct Mutation {
    pub name: &'static str,
    /// The `.cu` it applies to.
    pub file: &'static str,
    pub what: &'static str,
    pub find: &'static str,
    pub replace: &'static str,
    /// Run with the kernels built with ASan and UBSan (what catches it is a sanitiser).
    pub sanitized: bool,
    /// Text the failing run's output must hold (the check that catches it), or "".
    pub expect: &'static str,
}

/// The defaults of a mutation caught by the plain emulated run, on any failure.
const PLAIN: Mutation = Mutation {
    name: "",
    file: "",
    what: "",
    find: "",
    replace: "",
    sanitized: false,
    expect: "",
};

/// The bugs kernels/CUDA.md and the README say the emulated tests catch.
pub const MUTATIONS: &[Mutation] = &[
    Mutation {
        name: "flash2-pv-rows-swapped",
        file: "attention.cu",
        what: "flash2's P·V B-fragment reads V rows key+1 and key swapped",
        find: "join2(vs[key * LD + dim], vs[(key + 1) * LD + dim])",
        replace: "join2(vs[(key + 1) * LD + dim], vs[key * LD + dim])",
        ..PLAIN
    },
    Mutation {
        name: "flash2-barrier-before-load",
        file: "attention.cu",
        what: "flash2's barrier before a K/V tile is overwritten removed",
        find: "        __syncthreads();  // the previous tile is no longer read\n",
        replace: "",
        ..PLAIN
    },
    Mutation {
        name: "flash2-barrier-after-load",
        file: "attention.cu",
        what: "flash2's barrier after a K/V tile is loaded removed",
        find: "        __syncthreads();\n\n        // S = Q·Kᵀ",
        replace: "\n        // S = Q·Kᵀ",
        ..PLAIN
    },
    Mutation {
        name: "flash2p-barrier-after-load",
        file: "attention.cu",
        what: "flash2p's barrier after a tile's cp.async lands removed",
        find: "        __syncthreads();  // tile t is in shared memory for every thread\n",
        replace: "",
        ..PLAIN
    },
    Mutation {
        name: "flash2p-barrier-before-refill",
        file: "attention.cu",
        what: "flash2p's barrier before a stage is refilled removed",
        find: "        __syncthreads();  // the stage is refilled two tiles on: everyone has read it\n",
        replace: "",
        ..PLAIN
    },
    Mutation {
        name: "flash2p-v-without-trans",
        file: "attention.cu",
        what: "flash2p reads V with ldmatrix without .trans",
        find: "ldmatrix_x4_trans(r, vt +",
        replace: "ldmatrix_x4(r, vt +",
        ..PLAIN
    },
    Mutation {
        name: "attention-window-off-by-one",
        file: "attention.cu",
        what: "naive and flash2 let a row see one key more than its sliding window",
        find: "(window <= 0 || pos - key < window)",
        replace: "(window <= 0 || pos - key <= window)",
        ..PLAIN
    },
    Mutation {
        name: "flash2-window-start-late",
        file: "attention.cu",
        what: "flash2 and flash2p start a block's key loop one key after its window start",
        find: "max(0, offset + row0 + 1 - window)",
        replace: "max(0, offset + row0 + 2 - window)",
        ..PLAIN
    },
    Mutation {
        name: "flash2-softcap-skipped",
        file: "attention.cu",
        what: "flash2 and flash2p skip the logit soft-cap",
        find: "softcap > 0.0f ? cap_out * tanh_f32(s[nt][e] * cap_in) : s[nt][e] * sl2",
        replace: "s[nt][e] * sl2",
        ..PLAIN
    },
    Mutation {
        name: "paged-causal-off-by-one",
        file: "paged.cu",
        what: "paged decode lets query row i see one key past its position",
        find: "last_key[r] = w.ctx - q_len + i;",
        replace: "last_key[r] = w.ctx - q_len + i + 1;",
        ..PLAIN
    },
    Mutation {
        name: "paged-launch-hq-hkv-swapped",
        file: "paged.cu",
        what: "paged decode's hq and hkv launch arguments swapped (the entry's signature)",
        find: "float* part_o, float* part_lse, int batch, int hq, int hkv, int q_len, int bs,",
        replace: "float* part_o, float* part_lse, int batch, int hkv, int hq, int q_len, int bs,",
        ..PLAIN
    },
    Mutation {
        name: "paged-window-off-by-one",
        file: "paged.cu",
        what: "paged decode lets a row see one key more than its sliding window",
        find: "last_key - j >= window",
        replace: "last_key - j > window",
        ..PLAIN
    },
    Mutation {
        name: "paged-partitions-from-zero",
        file: "paged.cu",
        what: "paged decode's partitions start at position 0, not at the window's first key",
        find: "w.k_begin = k_first + w.part * part_tokens",
        replace: "w.k_begin = w.part * part_tokens",
        ..PLAIN
    },
    Mutation {
        name: "paged-softcap-skipped",
        file: "paged.cu",
        what: "paged decode skips the logit soft-cap",
        find: "return inv > 0.0f ? l2 * tanh_f32(s * inv) : s;",
        replace: "return s;",
        ..PLAIN
    },
    Mutation {
        name: "paged-pipe-stale-page",
        file: "paged.cu",
        what: "the pipelined paged decode reads the page-table entries of the step it is about to \
               load instead of the step after (every key from the second step on reads the \
               wrong page once steps cross a block)",
        find: "page[u] = table[min(j0 + 2 * STEP + kg + 4 * u, last) / bs];",
        replace: "page[u] = table[min(j0 + STEP + kg + 4 * u, last) / bs];",
        ..PLAIN
    },
    Mutation {
        name: "moe-up-fed-gate-fragments",
        file: "experts.cu",
        what: "cuda_grouped's up-projection MMA fed the gate's B fragments",
        find: "mma16816<T>(au[mt][nt], a[mt], bu[nt]);",
        replace: "mma16816<T>(au[mt][nt], a[mt], bg[nt]);",
        ..PLAIN
    },
    Mutation {
        name: "moe-up-barrier-after-load",
        file: "experts.cu",
        what: "cuda_grouped's barrier after the gate/up tiles are loaded removed",
        find: "            load_chunk(us + r * XLD + col, n < ff ? wue + (size_t)n * dm : nullptr, k0 + col, dm);\n        }\n        __syncthreads();\n",
        replace: "            load_chunk(us + r * XLD + col, n < ff ? wue + (size_t)n * dm : nullptr, k0 + col, dm);\n        }\n",
        ..PLAIN
    },
    Mutation {
        name: "moe-combine-rows-skips-last",
        file: "experts.cu",
        what: "cuda_grouped's per-token combine skips a token's last assignment",
        find: "for (int i = first; i < last; ++i) acc",
        replace: "for (int i = first; i < last - 1; ++i) acc",
        ..PLAIN
    },
    Mutation {
        name: "moe-router-nan-unranked",
        file: "moe.cu",
        what: "the router ranks raw probabilities: a row of NaNs picks no expert (index n_experts)",
        find: "const float v = rank_key(p[warp][e]);",
        replace: "const float v = p[warp][e];",
        ..PLAIN
    },
    Mutation {
        name: "moe-combine-skips-last-rank",
        file: "moe.cu",
        what: "the slot combine skips a token's last-ranked assignment",
        find: "for (int r = 0; r < k; ++r) {\n            const int a = t * k + r;",
        replace: "for (int r = 0; r < k - 1; ++r) {\n            const int a = t * k + r;",
        ..PLAIN
    },
    Mutation {
        name: "tree-window-off-by-one",
        file: "spec.cu",
        what: "tree attention lets a node see an ancestor one level past its sliding window",
        find: "depth - depths[j] >= window",
        replace: "depth - depths[j] > window",
        ..PLAIN
    },
    Mutation {
        name: "tree-softcap-skipped",
        file: "spec.cu",
        what: "tree attention skips the logit soft-cap",
        find: "if (softcap > 0.0f) s = softcap * tanh_f32(s / softcap);",
        replace: "",
        ..PLAIN
    },
    // The failures a GPU has and the old emulator did not (each caught by the check named).
    Mutation {
        name: "flash2p-wait-group-short",
        file: "attention.cu",
        what: "flash2p waits for all but the newest 2 cp.async groups, not 1: tile t is read \
               before it lands (queued cp.async)",
        find: "cp_async_wait<1>();",
        replace: "cp_async_wait<2>();",
        ..PLAIN
    },
    Mutation {
        name: "flash2p-last-wait-removed",
        file: "attention.cu",
        what: "flash2p's wait for the last tile removed (queued cp.async: read before it lands, \
               and the thread returns with it in flight)",
        find: "            cp_async_wait<0>();\n",
        replace: "",
        ..PLAIN
    },
    Mutation {
        name: "flash2p-cp-async-misaligned",
        file: "attention.cu",
        what: "flash2p's cp.async source 4 elements (8 bytes) off: a misaligned cp.async",
        find: "const size_t src = (size_t)(in ? j0 + r : 0) * D + col;",
        replace: "const size_t src = (size_t)(in ? j0 + r : 0) * D + col + 4;",
        expect: "misaligned address",
        ..PLAIN
    },
    Mutation {
        name: "flash2-padding-rows-unwritten",
        file: "attention.cu",
        what: "flash2 leaves a tile's rows past kv_len unwritten: P·V reads uninitialised \
               shared memory (0 · NaN)",
        find: "            *reinterpret_cast<uint4*>(ks + r * LD + col) = kv;\n            \
               *reinterpret_cast<uint4*>(vs + r * LD + col) = vv;\n",
        replace: "            if (j0 + r < lk) {\n                \
                  *reinterpret_cast<uint4*>(ks + r * LD + col) = kv;\n                \
                  *reinterpret_cast<uint4*>(vs + r * LD + col) = vv;\n            }\n",
        ..PLAIN
    },
    Mutation {
        name: "tree-query-load-past-end",
        file: "spec.cu",
        what: "tree attention loads query element d (unused, but one past the end of q for the \
               last query): caught by AddressSanitizer",
        find: "qv[c] = e < d ? qr[e] : 0.0f;",
        replace: "qv[c] = e <= d ? qr[e] : 0.0f;",
        sanitized: true,
        expect: "AddressSanitizer: heap-buffer-overflow",
    },
    Mutation {
        name: "gemv-idle-lanes-return",
        file: "quant.cu",
        what: "the GEMV's lanes without a block of the row return before the warp sum: a \
               shuffle whose mask names exited lanes",
        find: "    if (row >= rows) return;\n    const int nb = cols / 32;\n",
        replace: "    const int nb = cols / 32;\n    if (row >= rows || lane >= nb) return;\n",
        expect: "exited",
        ..PLAIN
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
/// each fails on a wrong result, a fault or the failure it expects (`Mutation::expect`), not
/// on a build error; and, beside them, `test` unmutated with the kernels built with ASan and
/// UBSan, asserting that it passes (skipped where g++ has no ASan runtime, or when a mutation
/// needs one: that fails). Returns how each mutation was caught.
pub fn assert_each_caught(file: &str, test: &str) -> Vec<Caught> {
    let exe = std::env::current_exe().expect("the test binary");
    let todo: Vec<&Mutation> = MUTATIONS.iter().filter(|m| m.file == file).collect();
    assert!(!todo.is_empty(), "no mutation applies to {file}");
    let asan = crate::sanitized::unavailable_here();
    if let Some(why) = &asan {
        assert!(
            todo.iter().all(|m| !m.sanitized),
            "{file} has mutations only the sanitisers catch, and {why}"
        );
        eprintln!("SKIPPED sanitised emulator run of {test}: {why}");
    }
    // The jobs: each mutation, then (None) the sanitised unmutated run.
    let mut jobs: Vec<Option<&Mutation>> = todo.iter().map(|&m| Some(m)).collect();
    if asan.is_none() {
        jobs.push(None);
    }
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut caught = vec![];
    for batch in jobs.chunks(at_once) {
        let running: Vec<_> = batch.iter().map(|m| (m, spawn(&exe, test, *m))).collect();
        for (m, (mut child, log, start)) in running {
            let status = loop {
                if let Some(s) = child.try_wait().expect("waiting for the child") {
                    break s;
                }
                if start.elapsed() > Duration::from_secs(900) {
                    let _ = child.kill();
                    panic!("{}: still running after 15 minutes", label(*m, test));
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            match m {
                Some(m) => caught.push(judge(m, test, file, status, &text, start)),
                None => {
                    assert!(
                        status.success() && text.contains("1 passed"),
                        "{test} fails with the kernels built with ASan and UBSan ({status}):\n{text}"
                    );
                    let seconds = start.elapsed().as_secs_f64();
                    eprintln!("{test}: passes with ASan and UBSan in {seconds:.1} s");
                }
            }
        }
    }
    caught
}

fn label(m: Option<&Mutation>, test: &str) -> String {
    match m {
        Some(m) => format!("mutation {}", m.name),
        None => format!("the sanitised run of {test}"),
    }
}

/// A child running `test` with `m` planted (or, for `None`, unmutated with sanitised kernels),
/// its output going to a file (so a chatty child never blocks on a full pipe).
fn spawn(
    exe: &std::path::Path,
    test: &str,
    m: Option<&Mutation>,
) -> (std::process::Child, std::path::PathBuf, Instant) {
    let log = std::env::temp_dir().join(format!(
        "workbench-mutation-{}-{}.log",
        m.map_or("sanitized", |m| m.name),
        std::process::id()
    ));
    let out = std::fs::File::create(&log).expect("a log file");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().expect("the log file")))
        .stderr(Stdio::from(out));
    match m {
        Some(m) => {
            cmd.env(SWITCH, m.name);
            if m.sanitized {
                crate::sanitized::configure(&mut cmd);
            }
        }
        None => {
            crate::sanitized::configure(&mut cmd);
        }
    }
    let child = cmd.spawn().expect("the test binary runs");
    (child, log, Instant::now())
}

/// Asserts that the mutated run was planted, failed, and failed on a result (or on what the
/// mutation expects), not a build.
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
    // The run's own lines: not the one naming the mutation (its `what` may hold the words).
    let planted = format!("planted mutation {}", m.name);
    let mut lines = text.lines().filter(|l| !l.contains(&planted));
    assert!(
        lines.any(|l| l.contains(m.expect)),
        "mutation {}: {test} fails, but not with \"{}\":\n{text}",
        m.name,
        m.expect
    );
    let failure = text
        .lines()
        .filter(|l| !l.contains(&planted))
        .find(|l| !m.expect.is_empty() && l.contains(m.expect))
        .or_else(|| {
            text.lines()
                .skip_while(|l| !l.contains("panicked at"))
                .nth(1)
        })
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
