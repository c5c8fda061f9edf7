//! Fuzzing on stable Rust (cargo-fuzz needs a nightly toolchain): seed files mutated the way
//! libFuzzer's and AFL's byte mutators do it — bit flips, random bytes, boundary integers
//! written over 1, 2, 4 or 8 bytes (0, 2^31, 2^32, 2^40, 2^60, 2^64 − 1, the input's own length
//! ± a little, ...), decimal numbers in text replaced by boundary values, truncation, and
//! deletion, insertion and duplication of ranges — as proptest strategies (so a failure is
//! shrunk to a few edits), and `fuzz`, which holds a parser to the contract: no panic, a
//! refusal naming the problem (on the one line `harness::error::one_line` makes of it, as the
//! CLI prints it), and a peak heap during the parse bounded by the input's size (measured by the harness's counting allocator, `harness::alloc`). It prints a
//! tally per parser: cases, accepted, refused, the largest peak and the commonest refusals.
//! CI runs `cases(n)` cases per parser; `WORKBENCH_FUZZ_CASES` sets a longer run and
//! `WORKBENCH_FUZZ_SEED` another deterministic seed.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

/// Cases per parser: `ci`, or `WORKBENCH_FUZZ_CASES` when set.
pub fn cases(ci: u32) -> u32 {
    match std::env::var("WORKBENCH_FUZZ_CASES") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("WORKBENCH_FUZZ_CASES={v} is not a count")),
        Err(_) => ci,
    }
}

/// An integer value written over the input: a fixed boundary, or the input's length plus a
/// small delta (offsets just inside or past the end).
#[derive(Debug, Clone, Copy)]
pub enum Boundary {
    Fixed(u64),
    FromEnd(i64),
}

const BOUNDARIES: &[u64] = &[
    0,
    1,
    2,
    7,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    1 << 60,
    1 << 63,
    u64::MAX - 31,
    u64::MAX - 7,
    u64::MAX,
];

const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "255",
    "65536",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "1e308",
    "1e999",
    "-0",
    "0.5",
    "nan",
    "inf",
];

/// One mutation of an input.
#[derive(Debug, Clone)]
pub enum Edit {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Int(Index, usize, Boundary),
    /// The `Index`-th run of ASCII digits, replaced.
    Number(Index, &'static str),
    Truncate(Index),
    Delete(Index, usize),
    Insert(Index, Vec<u8>),
    Duplicate(Index, usize, Index),
}

fn boundary() -> impl Strategy<Value = Boundary> {
    prop_oneof![
        3 => proptest::sample::select(BOUNDARIES).prop_map(Boundary::Fixed),
        1 => (-64i64..64).prop_map(Boundary::FromEnd),
    ]
}

/// One edit.
pub fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Edit::FlipBit(i, b)),
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::SetByte(i, b)),
        6 => (any::<Index>(), proptest::sample::select(&[1usize, 2, 4, 8][..]), boundary())
            .prop_map(|(i, w, v)| Edit::Int(i, w, v)),
        3 => (any::<Index>(), proptest::sample::select(NUMBERS)).prop_map(|(i, n)| Edit::Number(i, n)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        2 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        2 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => (any::<Index>(), 1usize..256, any::<Index>()).prop_map(|(f, n, t)| Edit::Duplicate(f, n, t)),
    ]
}

/// A position inside `region` (clamped to the input as it is now).
fn at(i: &Index, region: &Range<usize>, len: usize) -> usize {
    let (lo, hi) = (region.start.min(len), region.end.min(len));
    if hi <= lo {
        return lo;
    }
    lo + i.index(hi - lo)
}

/// `seed` with `edits` applied, each landing inside `region`. In `text`, bytes written are
/// ASCII and integers are written as decimal numbers, so most inputs stay UTF-8 and reach
/// the parser behind the decoding.
pub fn apply(seed: &[u8], region: &Range<usize>, edits: &[Edit], text: bool) -> Vec<u8> {
    let mut b = seed.to_vec();
    let byte = |v: u8| if text { v & 0x7f } else { v };
    for e in edits {
        let len = b.len();
        match e {
            Edit::FlipBit(i, bit) => {
                if let Some(x) = b.get_mut(at(i, region, len)) {
                    *x ^= 1 << if text { bit % 7 } else { *bit };
                }
            }
            Edit::SetByte(i, v) => {
                if let Some(x) = b.get_mut(at(i, region, len)) {
                    *x = byte(*v);
                }
            }
            Edit::Int(i, _, value) if text => {
                let v = match *value {
                    Boundary::Fixed(v) => v.to_string(),
                    Boundary::FromEnd(d) => d.to_string(),
                };
                let p = at(i, region, len);
                b.splice(p..p, v.bytes());
            }
            Edit::Int(i, width, value) => {
                let v = match *value {
                    Boundary::Fixed(v) => v,
                    Boundary::FromEnd(d) => (len as i64 + d).max(0) as u64,
                };
                let p = at(i, region, len.saturating_sub(*width));
                let n = (*width).min(len - p);
                b[p..p + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            Edit::Number(i, text) => {
                let runs = digit_runs(&b, region);
                if !runs.is_empty() {
                    let r = runs[i.index(runs.len())].clone();
                    b.splice(r, text.bytes());
                }
            }
            Edit::Truncate(i) => b.truncate(at(i, region, len)),
            Edit::Delete(i, n) => {
                let p = at(i, region, len);
                b.drain(p..(p + n).min(len));
            }
            Edit::Insert(i, bytes) => {
                let p = at(i, region, len);
                b.splice(p..p, bytes.iter().map(|&v| byte(v)));
            }
            Edit::Duplicate(from, n, to) => {
                let f = at(from, region, len);
                let piece = b[f..(f + n).min(len)].to_vec();
                let t = at(to, region, len);
                b.splice(t..t, piece);
            }
        }
    }
    b
}

/// The runs of ASCII digits inside `region`.
fn digit_runs(b: &[u8], region: &Range<usize>) -> Vec<Range<usize>> {
    let (lo, hi) = (region.start.min(b.len()), region.end.min(b.len()));
    let mut runs = vec![];
    let mut i = lo;
    while i < hi {
        if b[i].is_ascii_digit() {
            let s = i;
            while i < hi && b[i].is_ascii_digit() {
                i += 1;
            }
            runs.push(s..i);
        } else {
            i += 1;
        }
    }
    runs
}

/// A seed: its name, bytes, the region the edits land in, and whether it is text.
#[derive(Debug, Clone)]
pub struct Seed {
    pub name: String,
    pub bytes: Vec<u8>,
    pub region: Range<usize>,
    pub text: bool,
}

impl Seed {
    /// A binary seed whose edits land in `region`.
    pub fn binary(name: impl Into<String>, bytes: Vec<u8>, region: Range<usize>) -> Seed {
        Seed {
            name: name.into(),
            bytes,
            region,
            text: false,
        }
    }

    /// A binary seed whose edits land anywhere.
    pub fn whole(name: impl Into<String>, bytes: Vec<u8>) -> Seed {
        let region = 0..bytes.len();
        Seed::binary(name, bytes, region)
    }

    /// A safetensors file three ways: binary edits in its header (the length and the JSON),
    /// text edits in its JSON (names, dtypes, shapes, offsets as decimal boundaries), and
    /// binary edits anywhere (the tensor bytes too).
    pub fn safetensors(name: &str, bytes: Vec<u8>) -> Vec<Seed> {
        let header = bytes
            .get(..8)
            .map_or(0, |b| {
                u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize + 8
            })
            .min(bytes.len());
        vec![
            Seed::binary(format!("{name} header"), bytes.clone(), 0..header),
            Seed {
                text: true,
                ..Seed::binary(format!("{name} JSON"), bytes.clone(), 8..header)
            },
            Seed::whole(name, bytes),
        ]
    }

    /// A text seed (JSON, TOML, a command-line value): edits land anywhere and keep it ASCII.
    pub fn text(name: impl Into<String>, bytes: Vec<u8>) -> Seed {
        Seed {
            text: true,
            ..Seed::whole(name, bytes)
        }
    }
}

/// A mutated input: which seed (index into the list), its edits and the bytes they give.
#[derive(Clone)]
pub struct Case {
    pub seed: usize,
    pub edits: Vec<Edit>,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Case {
    /// The seed and the edits (what reproduces it), and the start of the bytes as text.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = &self.bytes[..self.bytes.len().min(600)];
        write!(
            f,
            "seed {} with edits {:?}: {} bytes, starting \"{}\"",
            self.seed,
            self.edits,
            self.bytes.len(),
            shown.escape_ascii()
        )
    }
}

/// Mutated inputs of `seeds`. One case in eight is a seed itself, so the accepting paths run
/// too.
pub fn mutated(seeds: &[Seed]) -> impl Strategy<Value = Case> {
    let seeds = seeds.to_vec();
    (
        0..seeds.len(),
        prop_oneof![1 => Just(vec![]), 7 => proptest::collection::vec(edit(), 1..8)],
    )
        .prop_map(move |(s, edits)| {
            let seed = &seeds[s];
            let bytes = apply(&seed.bytes, &seed.region, &edits, seed.text);
            Case {
                seed: s,
                edits,
                bytes,
            }
        })
}

/// What the parser made of an input: accepted, or refused with this message.
pub type Outcome = Result<(), String>;

/// One parser's run.
#[derive(Debug, Default)]
pub struct Tally {
    pub cases: u64,
    pub accepted: u64,
    pub refused: u64,
    /// The largest heap peak above the parse's start, and the input size it came with.
    pub peak_bytes: usize,
    pub peak_input: usize,
    /// The largest peak / input-size ratio seen.
    pub worst_ratio: f64,
    refusals: BTreeMap<String, u64>,
}

/// The bound the contract puts on a parse's peak heap: `factor` × the input plus `slack`.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub factor: usize,
    pub slack: usize,
}

/// Fuzz tests measure heap peaks: one at a time in the process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the process's heap for one test: every test of a binary that measures heap peaks
/// takes it (`fuzz` does), so no other test's allocations land in a measurement.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `parse` on `cases` inputs from `strategy` under the contract: no panic, a refusal is
/// a non-empty line that `names` accepts (given the input), and the heap peak stays within `bound` of
/// `size(input)`. Prints the tally and returns it; panics with the shrunk input on a breach.
/// The caller holds `exclusive()` (from before it reads its seeds).
pub fn fuzz<S: Strategy>(
    parser: &str,
    cases: u32,
    strategy: S,
    size: impl Fn(&S::Value) -> usize,
    bound: Bound,
    names: impl Fn(&S::Value, &str) -> bool,
    parse: impl Fn(&S::Value) -> Outcome,
) -> Tally
where
    S::Value: std::fmt::Debug,
{
    assert_counting_allocator();
    let seed: u64 = std::env::var("WORKBENCH_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    for (i, b) in parser.bytes().enumerate() {
        key[8 + i % 24] ^= b;
    }
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    let tally = Mutex::new(Tally::default());
    let result = runner.run(&strategy, |input| {
        let len = size(&input);
        let base = harness::alloc::reset_peak();
        let outcome = parse(&input);
        let peak = harness::alloc::peak_above(base);
        let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
        t.cases += 1;
        if peak > t.peak_bytes {
            t.peak_bytes = peak;
            t.peak_input = len;
        }
        t.worst_ratio = t.worst_ratio.max(peak as f64 / len.max(1) as f64);
        if peak > bound.factor * len + bound.slack {
            return Err(TestCaseError::fail(format!(
                "{parser}: the parse's heap peaked at {peak} bytes for a {len}-byte input"
            )));
        }
        match outcome {
            Ok(()) => t.accepted += 1,
            Err(message) => {
                t.refused += 1;
                // What stderr shows: the harness prints a refusal through `one_line`, which
                // escapes the control characters a quoted input may hold.
                let message = harness::error::one_line(&message);
                if message.trim().is_empty() {
                    return Err(TestCaseError::fail(format!("{parser}: an empty refusal")));
                }
                if !names(&input, &message) {
                    return Err(TestCaseError::fail(format!(
                        "{parser}: the refusal does not name its input: {message}"
                    )));
                }
                *t.refusals.entry(kind_of(&message)).or_default() += 1;
            }
        }
        Ok(())
    });
    let tally = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = result {
        panic!("{parser}: {e}");
    }
    tally.print(parser);
    tally
}

/// A refusal with its numbers and quoted names blanked, to count kinds of refusal.
fn kind_of(message: &str) -> String {
    let mut kind = String::new();
    let mut quoted = false;
    for c in message.chars() {
        match c {
            '\'' | '`' | '"' => {
                quoted = !quoted;
                kind.push(c);
            }
            _ if quoted => {}
            '0'..='9' => {
                if !kind.ends_with('#') {
                    kind.push('#');
                }
            }
            _ => kind.push(c),
        }
    }
    kind.chars().take(90).collect()
}

impl Tally {
    fn print(&self, parser: &str) {
        println!(
            "fuzz {parser}: {} cases, {} accepted, {} refused, 0 panics; largest heap peak {} bytes (input {} bytes), worst peak/input {:.2}",
            self.cases, self.accepted, self.refused, self.peak_bytes, self.peak_input, self.worst_ratio
        );
        let mut kinds: Vec<(&String, &u64)> = self.refusals.iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1));
        for (kind, n) in kinds.iter().take(6) {
            println!("    {n:>7} × {kind}");
        }
    }
}

/// The peak measurement is only a check if the harness's allocator counts this binary's
/// allocations: a probe allocated must show. Another thread freeing memory between the reset
/// and the probe (a finished test's thread exiting, a rayon worker dropping its buffers) can
/// hide one probe, so the check passes if any of a few probes shows; a binary without the
/// counting allocator shows none.
fn assert_counting_allocator() {
    let shown = (0..8).any(|_| {
        let base = harness::alloc::reset_peak();
        let probe = std::hint::black_box(vec![1u8; 16 << 20]);
        let seen = harness::alloc::peak_above(base) >= probe.len();
        drop(probe);
        seen || {
            std::thread::sleep(std::time::Duration::from_millis(5));
            false
        }
    });
    assert!(
        shown,
        "the counting allocator is not this binary's global allocator"
    );
}

/// The file at `path` under the workspace root, or `None` with a printed reason.
pub fn workspace_file(path: &str) -> Option<Vec<u8>> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("SKIPPED seed {}: {e}", p.display());
            None
        }
    }
}

/// GPT-2's byte-to-character map, byte-level BPE's alphabet: the character of byte `b` is
/// entry `b`.
pub fn gpt2_byte_chars() -> Vec<char> {
    let printable: Vec<u32> = (b'!'..=b'~')
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .map(u32::from)
        .collect();
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            let c = if printable.contains(&b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(c).expect("a char")
        })
        .collect()
}
