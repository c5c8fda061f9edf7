//! Peers: the production kernels a family's variants compete with (PyTorch SDPA, ...), run as
//! external programs registered under `scripts/peers/<name>/peer.toml` and timed in the same
//! run, in alternating rounds with our variants (tritonbench's registered baselines,
//! llama.cpp's `llama-bench` beside ours). A peer is one long-lived process per run that
//! speaks JSON lines on stdin/stdout:
//!
//! - `{"op":"hello","options":{...}}` → `{"ok":true,"version":"torch 2.15.0"}`, or
//!   `{"ok":false,"unavailable":"how to install it"}`;
//! - `{"op":"load","inputs":PATH,"point":{...},"threads":N,"device":"cpu"}` →
//!   `{"ok":true}` — PATH is a safetensors case file in `harness replay`'s schema holding
//!   the point's own seeded inputs (or, for the decode family, the model file);
//!   `{"ok":false,"unsupported":"why"}` when the peer cannot do this point;
//! - `{"op":"run","out":PATH}` → `{"ok":true}` after writing its output to PATH (tensor `out`,
//!   f32; a quantiser writes `q`, u8), which the harness checks against the f64 reference
//!   (or our bytes) like a variant's;
//! - `{"op":"time","reps":N}` → `{"ok":true,"times_ms":[...]}`. On a CUDA device a peer
//!   times as our kernels do (`kernel_cuda::runtime`): one untimed warm-up call, then each
//!   repetition between two CUDA events with L2 flushed before it, outside the events (a
//!   buffer of twice the L2 written). With `"l2":"hot"` the flush is left out, and a peer
//!   that honoured it says `"l2":"hot"` in its reply (its row's `hot_median_ms`; a peer that
//!   does not say so gets none).
//!
//! Any other reply is `{"ok":false,"error":"..."}`. A peer whose program is missing is
//! `unavailable` (with the install command); one that crashes, prints garbage or exceeds its
//! timeout is an `error` carrying the last line of its stderr, and the run goes on.
//!
//! A spec or `--peer` names a peer like a variant, with options its manifest declares:
//! `torch_linear:dtype=bf16`, `llamacpp:build=avx2`; the rows carry that full name.

use crate::error::{HarnessError, Result};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

/// A peer's `peer.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    /// One line for `harness list` and the reports.
    pub about: String,
    /// Families whose experiments it serves.
    pub families: Vec<String>,
    /// Modes (attention: decode, append, prefill) it serves; empty = all.
    #[serde(default)]
    pub modes: Vec<String>,
    /// The program and its arguments: `{python}` is the peers' Python
    /// (`WORKBENCH_PEER_PYTHON`, else `target/peers/venv/bin/python` of the checkout),
    /// `{dir}` this manifest's folder.
    pub command: Vec<String>,
    /// The command that installs what it needs.
    pub install: String,
    /// Seconds one request may take before the peer is killed.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Options a spec may give it (`name:key=value`): each key's allowed values, the first
    /// being the default.
    #[serde(default)]
    pub options: BTreeMap<String, Vec<String>>,
    /// Devices it runs on (`cpu`, `cuda`); default cpu only.
    #[serde(default = "cpu_only")]
    pub devices: Vec<String>,
    /// Quant family: the weight formats it serves (empty: every one it is asked for).
    #[serde(default)]
    pub formats: Vec<String>,
    #[serde(skip)]
    pub dir: PathBuf,
    /// The name as the spec gave it, options included: what its rows are called.
    #[serde(skip)]
    pub label: String,
    /// Every option's value (the spec's, else the default), sent with `hello`.
    #[serde(skip)]
    pub chosen: BTreeMap<String, String>,
}

fn default_timeout() -> f64 {
    120.0
}

fn cpu_only() -> Vec<String> {
    vec!["cpu".into()]
}

impl Manifest {
    /// Whether it runs on `device` (`cpu`, `cuda:0`).
    pub fn runs_on(&self, device: &str) -> bool {
        let kind = device.split(':').next().unwrap_or(device);
        self.devices.iter().any(|d| d == kind)
    }

    /// Its label as a file name (`torch_linear_dtype_bf16`).
    pub fn file_stem(&self) -> String {
        let label = if self.label.is_empty() {
            &self.name
        } else {
            &self.label
        };
        label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    }

    /// Whether it serves this mode (empty `modes`: all).
    pub fn serves(&self, mode: &str) -> bool {
        self.modes.is_empty() || self.modes.iter().any(|m| m == mode)
    }

    /// Checks a spec's options against the declared ones and fills in the defaults.
    fn choose(&mut self, given: &BTreeMap<String, String>) -> Result<()> {
        for (k, v) in given {
            let Some(allowed) = self.options.get(k) else {
                return Err(HarnessError::Usage(format!(
                    "peer '{}' has no option '{k}' (it takes: {})",
                    self.name,
                    if self.options.is_empty() {
                        "none".to_string()
                    } else {
                        self.options.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                )));
            };
            if !allowed.contains(v) {
                return Err(HarnessError::Usage(format!(
                    "peer '{}': option {k}='{v}' is not one of {}",
                    self.name,
                    allowed.join(", ")
                )));
            }
        }
        self.chosen = self
            .options
            .iter()
            .filter_map(|(k, allowed)| {
                let v = given.get(k).or(allowed.first())?;
                Some((k.clone(), v.clone()))
            })
            .collect();
        Ok(())
    }
}

/// The manifest of peer `name` under `peers_dir` (no options chosen yet); a missing or
/// malformed one is one line naming the peers there are.
pub fn read_manifest(peers_dir: &Path, name: &str) -> Result<Manifest> {
    let path = peers_dir.join(name).join("peer.toml");
    let text = std::fs::read_to_string(&path).map_err(|_| {
        let known = list(peers_dir);
        HarnessError::Usage(format!(
            "unknown peer '{name}' (no {}; peers: {})",
            path.display(),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ))
    })?;
    let mut m: Manifest = toml::from_str(&text).map_err(|e| {
        HarnessError::Usage(format!(
            "{}: {}",
            path.display(),
            e.message().replace('\n', " ")
        ))
    })?;
    m.dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok(m)
}

/// The manifests of `names` (`name[:option=value,...]`) under `peers_dir`, each serving
/// `family`; a bad name, option or value, or a peer of another family, is one line naming
/// what there is.
pub fn manifests(peers_dir: &Path, names: &[String], family: &str) -> Result<Vec<Manifest>> {
    names
        .iter()
        .map(|label| {
            let spec = kernel_common::VariantSpec::parse(label)
                .map_err(|e| HarnessError::Usage(format!("peer: {e}")))?;
            let mut m = read_manifest(peers_dir, &spec.name)?;
            if !m.families.iter().any(|f| f == family) {
                return Err(HarnessError::Usage(format!(
                    "peer '{}' serves {} experiments, not {family}",
                    spec.name,
                    m.families.join(", ")
                )));
            }
            m.choose(&spec.params)?;
            m.label = label.clone();
            Ok(m)
        })
        .collect()
}

/// The names of the peers registered under `peers_dir`.
pub fn list(peers_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(peers_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("peer.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Why a request to a peer gave no answer.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerError {
    /// Not installed: the row says `unavailable` and how to install it.
    Unavailable(String),
    /// The peer cannot do this point: `unsupported`.
    Unsupported(String),
    /// Crashed, timed out, printed garbage, or said `error`: `error`.
    Failed(String),
}

impl PeerError {
    /// The reason, whatever the kind.
    pub fn why(self) -> String {
        self.status_and_why().1
    }

    /// The row status it gives (unavailable, unsupported, error) and the reason.
    pub fn status_and_why(self) -> (&'static str, String) {
        match self {
            PeerError::Unavailable(w) => ("unavailable", w),
            PeerError::Unsupported(w) => ("unsupported", w),
            PeerError::Failed(w) => ("error", w),
        }
    }
}

/// A running peer.
pub struct Peer {
    pub manifest: Manifest,
    /// Its own version line, from `hello`.
    pub version: String,
    state: State,
}

enum State {
    Running {
        child: Child,
        stdin: ChildStdin,
        lines: Receiver<String>,
        stderr: PathBuf,
    },
    Down(PeerError),
}

impl Peer {
    /// Starts the peer's program and greets it; a peer that cannot start is kept as
    /// unavailable (or failed), and every request then answers with that.
    pub fn start(manifest: Manifest, root: &Path, scratch: &Path) -> Peer {
        let mut peer = Peer {
            version: String::new(),
            state: State::Down(PeerError::Unavailable(String::new())),
            manifest,
        };
        peer.state = match peer.spawn(root, scratch) {
            Ok(state) => state,
            Err(e) => State::Down(e),
        };
        if let State::Running { .. } = peer.state {
            let options = peer.manifest.chosen.clone();
            match peer.request(json!({"op": "hello", "options": options})) {
                Ok(reply) => {
                    peer.version = reply["version"].as_str().unwrap_or("").to_string();
                }
                Err(e) => peer.down(e),
            }
        }
        peer
    }

    fn spawn(&self, root: &Path, scratch: &Path) -> std::result::Result<State, PeerError> {
        let m = &self.manifest;
        let unavailable =
            |why: String| PeerError::Unavailable(format!("{why}; install with {}", m.install));
        let python = match std::env::var_os("WORKBENCH_PEER_PYTHON") {
            Some(p) => PathBuf::from(p),
            None => root.join("target/peers/venv/bin/python"),
        };
        let args: Vec<String> = m
            .command
            .iter()
            .map(|a| {
                a.replace("{python}", &python.display().to_string())
                    .replace("{dir}", &m.dir.display().to_string())
            })
            .collect();
        let (program, rest) = args
            .split_first()
            .ok_or_else(|| PeerError::Failed(format!("peer {}: empty command", m.name)))?;
        let stderr = scratch.join(format!("{}.stderr", m.file_stem()));
        let err_file = std::fs::File::create(&stderr)
            .map_err(|e| PeerError::Failed(format!("creating {}: {e}", stderr.display())))?;
        let mut child = Command::new(program)
            .args(rest)
            .current_dir(&m.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err_file)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                    unavailable(format!("{program} is not there ({e})"))
                }
                _ => PeerError::Failed(format!("starting {program}: {e}")),
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(State::Running {
            child,
            stdin,
            lines,
            stderr,
        })
    }

    /// What its rows are called: the name as the spec gave it, options included.
    pub fn label(&self) -> &str {
        &self.manifest.label
    }

    /// One timed call of the loaded point, in seconds (the peer's own clock).
    pub fn time_once(&mut self) -> std::result::Result<f64, String> {
        let reply = self
            .request(json!({"op": "time", "reps": 1}))
            .map_err(PeerError::why)?;
        reply["times_ms"]
            .as_array()
            .and_then(|t| t.first())
            .and_then(|t| t.as_f64())
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map(|ms| ms / 1e3)
            .ok_or_else(|| format!("peer {} returned no times_ms", self.manifest.label))
    }

    /// `reps` calls timed hot (on a CUDA device: after a warm-up, no L2 flush), their median
    /// in ms; None when the reply does not say `"l2":"hot"` (a peer that knows no hot timing).
    pub fn time_hot_ms(&mut self, reps: usize) -> std::result::Result<Option<f64>, String> {
        let reply = self
            .request(json!({"op": "time", "reps": reps.max(1), "l2": "hot"}))
            .map_err(PeerError::why)?;
        if reply["l2"] != json!("hot") {
            return Ok(None);
        }
        let times: Vec<f64> = reply["times_ms"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t.as_f64()).collect())
            .unwrap_or_default();
        if times.is_empty() || times.iter().any(|t| !t.is_finite() || *t < 0.0) {
            return Err(format!(
                "peer {} returned no hot times_ms",
                self.manifest.label
            ));
        }
        Ok(Some(crate::measure::Timing { samples: times }.median()))
    }

    /// Why the peer is down, if it is.
    pub fn down_reason(&self) -> Option<PeerError> {
        match &self.state {
            State::Down(e) => Some(e.clone()),
            State::Running { .. } => None,
        }
    }

    fn down(&mut self, e: PeerError) {
        if let State::Running { child, .. } = &mut self.state {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.state = State::Down(e);
    }

    /// Sends one request and waits for its reply (at most the manifest's timeout). A reply
    /// `{"ok":false,"unsupported":...}` leaves the peer up; a crash, a timeout, garbage or
    /// `unavailable` takes it down for the rest of the run.
    pub fn request(&mut self, req: Value) -> std::result::Result<Value, PeerError> {
        let name = self.manifest.name.clone();
        let timeout = Duration::from_secs_f64(self.manifest.timeout_s.max(0.001));
        let State::Running {
            child,
            stdin,
            lines,
            stderr,
        } = &mut self.state
        else {
            let State::Down(e) = &self.state else {
                unreachable!()
            };
            return Err(e.clone());
        };
        let last_stderr = |path: &Path| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|t| {
                    t.lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .map(String::from)
                })
                .unwrap_or_else(|| "(nothing on stderr)".into())
        };
        let sent = writeln!(stdin, "{req}").and_then(|_| stdin.flush());
        let reply = match sent {
            Err(e) => Err(format!("peer {name} stopped reading ({e})")),
            Ok(()) => match lines.recv_timeout(timeout) {
                Ok(line) => Ok(line),
                Err(RecvTimeoutError::Timeout) => Err(format!(
                    "peer {name} gave no answer within {} s",
                    self.manifest.timeout_s
                )),
                Err(RecvTimeoutError::Disconnected) => {
                    let status = child.wait().map_or("?".to_string(), |s| s.to_string());
                    Err(format!(
                        "peer {name} exited ({status}): {}",
                        last_stderr(stderr)
                    ))
                }
            },
        };
        let outcome: std::result::Result<Value, PeerError> = match reply {
            Err(why) => Err(PeerError::Failed(why)),
            Ok(line) => match serde_json::from_str::<Value>(&line) {
                Err(_) => Err(PeerError::Failed(format!(
                    "peer {name} printed something that is not JSON: {}",
                    line.chars().take(120).collect::<String>()
                ))),
                Ok(v) if v["ok"] == json!(true) => return Ok(v),
                Ok(v) => {
                    if let Some(why) = v["unsupported"].as_str() {
                        return Err(PeerError::Unsupported(why.to_string()));
                    }
                    if let Some(why) = v["unavailable"].as_str() {
                        Err(PeerError::Unavailable(format!(
                            "{why}; install with {}",
                            self.manifest.install
                        )))
                    } else {
                        // The peer answered: it failed this request but is still up.
                        let why = v["error"].as_str().unwrap_or("no reason given");
                        return Err(PeerError::Failed(format!("peer {name}: {why}")));
                    }
                }
            },
        };
        let e = outcome.expect_err("Ok returned above");
        self.down(e.clone());
        Err(e)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let State::Running { child, .. } = &mut self.state {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A scratch folder for the peers' case and output files, removed when dropped.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    /// `workbench-peers-<run id>-<pid>` in the temporary folder.
    pub fn new(run_id: &str) -> Result<ScratchDir> {
        let dir =
            std::env::temp_dir().join(format!("workbench-peers-{run_id}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        Ok(ScratchDir(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One tensor of a case file: its name, safetensors dtype, little-endian bytes and shape.
pub struct CaseTensor<'a> {
    pub name: &'a str,
    pub dtype: safetensors::Dtype,
    pub bytes: Vec<u8>,
    pub shape: Vec<usize>,
}

impl<'a> CaseTensor<'a> {
    /// A buffer in its storage dtype.
    pub fn buffer(name: &'a str, b: &kernel_common::Buffer, shape: Vec<usize>) -> Self {
        use kernel_common::Buffer;
        use safetensors::Dtype;
        let (dtype, bytes) = match b {
            Buffer::F32(v) => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            Buffer::F16(v) => (Dtype::F16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            Buffer::BF16(v) => (
                Dtype::BF16,
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
        };
        CaseTensor {
            name,
            dtype,
            bytes,
            shape,
        }
    }

    /// f32 values.
    pub fn f32(name: &'a str, v: &[f32], shape: Vec<usize>) -> Self {
        CaseTensor {
            name,
            dtype: safetensors::Dtype::F32,
            bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            shape,
        }
    }
}

/// Writes a case file (safetensors, `harness replay`'s schema): `family` and `meta` in the
/// header, each tensor as given.
pub fn write_case(
    path: &Path,
    family: &str,
    meta: &[(&str, String)],
    tensors: &[CaseTensor],
) -> Result<()> {
    use safetensors::tensor::TensorView;
    let views = tensors
        .iter()
        .map(|t| {
            TensorView::new(t.dtype, t.shape.clone(), &t.bytes)
                .map(|v| (t.name.to_string(), v))
                .map_err(|e| HarnessError::Usage(format!("case file tensor {}: {e}", t.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut info: std::collections::HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    info.insert("family".into(), family.into());
    safetensors::serialize_to_file(views, &Some(info), path)
        .map_err(|e| HarnessError::Usage(format!("writing {}: {e}", path.display())))
}

/// The bytes of tensor `name` of a peer's output file, which must have `dtype` and `len`
/// bytes.
fn read_tensor(
    path: &Path,
    name: &str,
    dtype: safetensors::Dtype,
    len: usize,
) -> std::result::Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("no output at {}: {e}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("output {} is not safetensors: {e}", path.display()))?;
    let t = st
        .tensor(name)
        .map_err(|_| format!("output {} has no tensor '{name}'", path.display()))?;
    if t.dtype() != dtype {
        return Err(format!("output '{name}' is {:?}, not {dtype:?}", t.dtype()));
    }
    if t.data().len() != len {
        return Err(format!(
            "output '{name}' has {} bytes, expected {len}",
            t.data().len()
        ));
    }
    Ok(t.data().to_vec())
}

/// The f32 values of tensor `out` of a peer's output file, which must hold `len` values.
pub fn read_output(path: &Path, len: usize) -> std::result::Result<Vec<f32>, String> {
    let data = read_tensor(path, "out", safetensors::Dtype::F32, len * 4)?;
    Ok(data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The bytes of tensor `q` (u8) of a quantiser peer's output file, which must hold `len`.
pub fn read_bytes_output(path: &Path, len: usize) -> std::result::Result<Vec<u8>, String> {
    read_tensor(path, "q", safetensors::Dtype::U8, len)
}
