//! When a busy machine makes the team slower than one thread, and what the team then does.
//!
//! A spinning team assumes each of its threads owns a core. When another process shares the
//! cores (a compile, a browser, `yes > /dev/null`), a worker is descheduled for a scheduler
//! slice (milliseconds) in the middle of a region, and the leader, done with its own share,
//! waits for it: a 20–200 µs region then costs milliseconds. Measured on SmolLM2 (2 vCPUs, one
//! `yes` beside it) before this module: 2 threads decoded at 91–104 tok/s, 1 thread at 189–249.
//!
//! Two signals, both read by the leader as it finishes each region it ran with its workers:
//! - **Run-queue delay.** Every [`DELAY_WINDOW_MS`] the leader reads its own
//!   `/proc/thread-self/schedstat` (the time it was runnable but waiting for a CPU), and the
//!   workers add theirs as they leave a team. Above [`DELAY_FRACTION`] of the team's thread
//!   time, other threads are taking its cores. This is the signal that fires under a steady
//!   hog: a worker is simply off-core when a region opens, so the leader runs the region
//!   alone and rarely waits for it, yet the team holds two cores' share of three threads.
//! - **Stalls.** A region whose leader, done with its tasks, waited longer than a
//!   scheduler-scale delay and than several of its own tasks for a worker still inside (a
//!   running worker finishes its last task within about one task's time), or that no worker
//!   joined although it was long enough that a spinning one always does. Each scores 1, the
//!   score decays by 1/32 per region, and [`SCORE_TO_GO_SOLO`] close together fire.
//!
//! Either sends the team **solo** — every region on the leader, the workers back in rayon
//! (asleep unless it has work), so the leader gets a whole core beside the other process —
//! for a period that starts at [`FIRST_SOLO_MS`]. When it ends the team works together
//! again and its next window is a probe: busy again doubles the period (to
//! [`LONGEST_SOLO_MS`]), quiet resets it. A period of at least [`MIN_JUDGED_MS`] is first
//! judged without a probe: if other processes used at least [`OTHERS_BUSY_CORES`] of the
//! machine's cores meanwhile (`/proc/stat`'s busy time less this process's own), it renews
//! itself, doubled, and the team never leaves the leader. A quiet one never goes solo.
//!
//! Process-wide: one forward pass is one team, and the machine's load outlives it. Relaxed
//! atomics: two leaders at once (tests) may race on the score, which only shifts a heuristic.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// A wait for workers shorter than this is never a stall: a worker that is running finishes
/// its task in at most a task's time, and regions' tasks are 1–100 µs; a descheduled one is
/// back after a scheduler slice (0.75–4 ms on Linux's CFS/EEVDF).
const STALL_MIN_NS: u64 = 250_000;
/// A wait longer than this many of the leader's own mean task times is a stall.
const STALL_TASKS: u64 = 4;
/// A region of at least this much leader time that no worker joined is a stall: a spinning
/// worker joins within a microsecond, a parked one within tens of µs (`team_probe` measures
/// both).
const ABSENT_MIN_NS: u64 = 400_000;
/// Stalls close together that send the team solo.
pub const SCORE_TO_GO_SOLO: u32 = 3;
/// The first solo period, and the longest after repeated stalls.
pub const FIRST_SOLO_MS: u64 = 20;
pub const LONGEST_SOLO_MS: u64 = 1000;
/// How often the leader reads the run-queue delay, and the share of the team's thread time
/// spent waiting for a CPU that means the machine is busy. Measured over whole SmolLM2
/// decodes on a 2-vCPU VM (`harness generate --format json`, `team.run_queue_delay_fraction`):
/// 0.3% quiet, 49–64% with one `yes` beside a 2-thread decode. Single quiet windows reach a
/// few percent (a worker's first reading after a long sleep), so it takes
/// [`BUSY_WINDOWS`] windows in a row to go solo (one during a probe).
pub const DELAY_WINDOW_MS: u64 = 20;
/// Other processes' CPU, in cores, over a solo period that renews it without a probe: one
/// `yes` beside a solo decode on 2 vCPUs reads ~1.0, a quiet machine ~0.0–0.1.
pub const OTHERS_BUSY_CORES: f64 = 0.5;
/// Shortest solo period judged by CPU accounting (its clock ticks are 10 ms; shorter ones
/// end in a probe).
pub const MIN_JUDGED_MS: u64 = 50;
/// Clock ticks per second of `/proc/stat` and `/proc/self/stat` (USER_HZ, 100 on Linux's
/// x86 and arm64 ABIs).
const USER_HZ: f64 = 100.0;
pub const DELAY_FRACTION: f64 = 0.10;
pub const BUSY_WINDOWS: u32 = 2;

const ONE: u32 = 1024;

/// The decision state: the stall score, busy windows in a row, whether the team is probing
/// (working together again after a solo period), and the next solo period's length.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Detector {
    score: u32,
    busy_run: u32,
    probing: bool,
    solo_ms: u64,
}

impl Detector {
    const fn new() -> Detector {
        Detector {
            score: 0,
            busy_run: 0,
            probing: false,
            solo_ms: FIRST_SOLO_MS,
        }
    }

    /// One region with its workers: whether it stalled, and the run-queue verdict if a
    /// window ended. Returns the length of a solo period to start now, ms.
    fn region(&mut self, stall: bool, delayed: Option<bool>) -> Option<u64> {
        self.score -= self.score / 32;
        if stall {
            self.score += ONE;
        }
        match delayed {
            Some(true) => self.busy_run += 1,
            Some(false) => self.busy_run = 0,
            None => {}
        }
        let delay_says_busy =
            delayed == Some(true) && (self.busy_run >= BUSY_WINDOWS || self.probing);
        // Three stalls close together: the decay leaves 2.9 of three in a row.
        if self.score >= SCORE_TO_GO_SOLO * ONE - ONE / 4 || delay_says_busy {
            if self.probing {
                // Still busy right after a solo period: stay away longer this time.
                self.solo_ms = (self.solo_ms * 2).min(LONGEST_SOLO_MS);
            }
            self.probing = true;
            self.busy_run = 0;
            self.score = 0;
            return Some(self.solo_ms);
        }
        if delayed == Some(false) && self.probing {
            // A quiet probe: the machine is free again.
            self.probing = false;
            self.solo_ms = FIRST_SOLO_MS;
        }
        None
    }
}

static DETECTOR: Mutex<Detector> = Mutex::new(Detector::new());
/// The machine's and this process's CPU when the current solo period began (None: not
/// judged, as when `/proc` is absent; the period then ends in a probe).
static SOLO_BASE: Mutex<Option<CpuSample>> = Mutex::new(None);
static SOLO_UNTIL_NS: AtomicU64 = AtomicU64::new(0);
static ADAPTIVE: AtomicBool = AtomicBool::new(true);
/// `WORKBENCH_TEAM=fixed` turns the fallback off from the start (to measure without it).
pub const ENV_VAR: &str = "WORKBENCH_TEAM";

/// Whether the fallback is on: [`set_adaptive`]'s last word, else not `WORKBENCH_TEAM=fixed`.
fn adaptive() -> bool {
    static FROM_ENV: OnceLock<()> = OnceLock::new();
    FROM_ENV.get_or_init(|| {
        if std::env::var(ENV_VAR).is_ok_and(|v| v == "fixed") {
            ADAPTIVE.store(false, Relaxed);
        }
    });
    ADAPTIVE.load(Relaxed)
}

static REGIONS: AtomicU64 = AtomicU64::new(0);
static SOLO_REGIONS: AtomicU64 = AtomicU64::new(0);
static STALLS: AtomicU64 = AtomicU64::new(0);
static STALL_WAIT_NS: AtomicU64 = AtomicU64::new(0);
static SOLO_PERIODS: AtomicU64 = AtomicU64::new(0);
static PARKS: AtomicU64 = AtomicU64::new(0);
static DELAYED_WINDOWS: AtomicU64 = AtomicU64::new(0);
static WINDOWS_NS: AtomicU64 = AtomicU64::new(0);
static WINDOWS_DELAY_NS: AtomicU64 = AtomicU64::new(0);
/// Run-queue delay workers reported as they left their teams, ns.
static WORKERS_DELAY_NS: AtomicU64 = AtomicU64::new(0);
/// Buckets of [`TeamStats::gaps`].
pub const GAP_BUCKETS: usize = 16;
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static GAPS: [AtomicU64; GAP_BUCKETS] = [ZERO; GAP_BUCKETS];

/// What the team did since the process started (or since [`reset_stats`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TeamStats {
    /// Parallel regions a team's leader ran (with its workers or solo).
    pub regions: u64,
    /// Of them, regions run on the leader alone because the machine was busy.
    pub solo_regions: u64,
    /// Regions whose leader waited a scheduler slice for a worker, or that no worker joined.
    pub stalls: u64,
    /// Time leaders spent waiting for descheduled workers in stalled regions, ns.
    pub stall_wait_ns: u64,
    /// Times the team went solo.
    pub solo_periods: u64,
    /// Windows in which a leader waited for a CPU more than [`DELAY_FRACTION`] of the time.
    pub delayed_windows: u64,
    /// The windows' thread time (length × threads) and the team's run-queue delay within
    /// them, ns.
    pub windows_ns: u64,
    pub windows_delay_ns: u64,
    /// Times a worker stopped spinning and slept (after [`super::SPIN_BUDGET`] idle).
    pub parks: u64,
    /// How long workers were idle before the regions they joined: bucket b counts gaps of
    /// [2^(b−1), 2^b) µs (bucket 0: under 1 µs; the last: 2^14 µs and longer). What
    /// [`super::SPIN_BUDGET`] is chosen from.
    pub gaps: [u64; GAP_BUCKETS],
}

/// The counters so far.
pub fn stats() -> TeamStats {
    TeamStats {
        regions: REGIONS.load(Relaxed),
        solo_regions: SOLO_REGIONS.load(Relaxed),
        stalls: STALLS.load(Relaxed),
        stall_wait_ns: STALL_WAIT_NS.load(Relaxed),
        solo_periods: SOLO_PERIODS.load(Relaxed),
        delayed_windows: DELAYED_WINDOWS.load(Relaxed),
        windows_ns: WINDOWS_NS.load(Relaxed),
        windows_delay_ns: WINDOWS_DELAY_NS.load(Relaxed),
        parks: PARKS.load(Relaxed),
        gaps: std::array::from_fn(|b| GAPS[b].load(Relaxed)),
    }
}

/// Zeroes the counters (not the detector's state).
pub fn reset_stats() {
    for c in [
        &REGIONS,
        &SOLO_REGIONS,
        &STALLS,
        &STALL_WAIT_NS,
        &SOLO_PERIODS,
        &PARKS,
        &DELAYED_WINDOWS,
        &WINDOWS_NS,
        &WINDOWS_DELAY_NS,
    ]
    .into_iter()
    .chain(&GAPS)
    {
        c.store(0, Relaxed);
    }
}

/// Turns the busy-machine fallback on (the default) or off (every region on the whole team,
/// however long it waits: the behaviour to compare against). Off also forgets a solo period.
pub fn set_adaptive(on: bool) {
    adaptive();
    ADAPTIVE.store(on, Relaxed);
    if !on {
        SOLO_UNTIL_NS.store(0, Relaxed);
        *DETECTOR.lock().unwrap_or_else(|p| p.into_inner()) = Detector::new();
    }
}

/// Nanoseconds on a process-wide monotonic clock.
pub(super) fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Held by the tests that start or end solo periods (the state is process-wide).
#[cfg(test)]
pub(super) static SOLO_TESTS: Mutex<()> = Mutex::new(());

/// Starts a solo period of `ms` (tests).
#[cfg(test)]
pub(super) fn go_solo_for(ms: u64) {
    SOLO_UNTIL_NS.store(now_ns() + ms * 1_000_000, Relaxed);
}

/// Whether regions run on the leader alone now.
pub(super) fn solo() -> bool {
    let until = SOLO_UNTIL_NS.load(Relaxed);
    if until == 0 {
        return false;
    }
    let now = now_ns();
    if now < until || renew_if_others_stayed(now) {
        return true;
    }
    // Over: later calls (every region, every 64 idle spins of a worker) stop at `until == 0`
    // instead of asking for the renewal lock again; a period started meanwhile is kept.
    let _ = SOLO_UNTIL_NS.compare_exchange(until, 0, Relaxed, Relaxed);
    false
}

/// Busy CPU time of the whole machine and of this process, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuSample {
    wall_ns: u64,
    machine_busy: u64,
    own: u64,
}

/// Reads `/proc/stat`'s first line (user nice system idle iowait irq softirq steal ...) and
/// this process's utime + stime (`/proc/self/stat` fields 14 and 15).
fn cpu_sample() -> Option<CpuSample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next().filter(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let machine_busy = f[0] + f[1] + f[2] + f.get(5)? + f.get(6)? + f.get(7)?;
    let own_stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name's closing parenthesis, field 3 (state) is index 0.
    let fields: Vec<&str> = own_stat.rsplit_once(')')?.1.split_whitespace().collect();
    let own = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(CpuSample {
        wall_ns: now_ns(),
        machine_busy,
        own,
    })
}

/// Cores other processes kept busy between two samples.
fn others_cores(then: &CpuSample, now: &CpuSample) -> f64 {
    let others = now.machine_busy.saturating_sub(then.machine_busy) as f64
        - now.own.saturating_sub(then.own) as f64;
    let ticks = now.wall_ns.saturating_sub(then.wall_ns) as f64 * USER_HZ / 1e9;
    if ticks > 0.0 {
        others / ticks
    } else {
        0.0
    }
}

/// At the end of a solo period: renews it (doubled) if other processes still held
/// [`OTHERS_BUSY_CORES`] through it, so a steadily busy machine costs no probes. One caller
/// judges; the period is over for the others.
fn renew_if_others_stayed(now: u64) -> bool {
    let Ok(mut base) = SOLO_BASE.try_lock() else {
        return false;
    };
    let Some(then) = base.take() else {
        return false;
    };
    let judged = now.saturating_sub(then.wall_ns) >= MIN_JUDGED_MS * 1_000_000;
    if !judged || !cpu_sample().is_some_and(|s| others_cores(&then, &s) >= OTHERS_BUSY_CORES) {
        return false;
    }
    let ms = {
        let mut d = DETECTOR.lock().unwrap_or_else(|p| p.into_inner());
        d.solo_ms = (d.solo_ms * 2).min(LONGEST_SOLO_MS);
        d.solo_ms
    };
    *base = cpu_sample();
    SOLO_UNTIL_NS.store(now + ms * 1_000_000, Relaxed);
    SOLO_PERIODS.fetch_add(1, Relaxed);
    true
}

/// Counts a region the leader ran alone: `solo` because the machine is busy, else because
/// no worker had joined (yet).
pub(super) fn count_alone_region(solo: bool) {
    REGIONS.fetch_add(1, Relaxed);
    if solo {
        SOLO_REGIONS.fetch_add(1, Relaxed);
    }
}

/// Records how long a worker was idle before the region it joined.
pub(super) fn count_gap(ns: u64) {
    let us = ns / 1000;
    let b = (u64::BITS - us.leading_zeros()) as usize;
    GAPS[b.min(GAP_BUCKETS - 1)].fetch_add(1, Relaxed);
}

pub(super) fn count_park() {
    PARKS.fetch_add(1, Relaxed);
}

/// Whether a region was a stall: `own_ns` the leader spent on its `led` tasks of `n`, then
/// `wait_ns` waiting for workers still inside.
pub(super) fn is_stall(own_ns: u64, wait_ns: u64, led: usize, n: usize) -> bool {
    let task_ns = own_ns / led.max(1) as u64;
    let straggled = wait_ns > STALL_MIN_NS.max(STALL_TASKS * task_ns);
    let absent = led == n && n >= 2 && own_ns > ABSENT_MIN_NS;
    straggled || absent
}

/// Records a region the leader ran with its workers and decides whether to go solo.
pub(super) fn record(own_ns: u64, wait_ns: u64, led: usize, n: usize) {
    REGIONS.fetch_add(1, Relaxed);
    let stall = is_stall(own_ns, wait_ns, led, n);
    if stall {
        STALLS.fetch_add(1, Relaxed);
        STALL_WAIT_NS.fetch_add(wait_ns, Relaxed);
    }
    let delayed = run_queue_verdict();
    if delayed == Some(true) {
        DELAYED_WINDOWS.fetch_add(1, Relaxed);
    }
    let solo_ms = DETECTOR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .region(stall, delayed);
    if let Some(ms) = solo_ms.filter(|_| adaptive()) {
        start_solo(ms);
    }
}

/// Starts a solo period of `ms` on the leader's word. The leader's next run-queue window
/// starts when the period ends: a window spanning the period would measure the leader alone
/// on its core (no delay) and call the probe of a still-busy machine quiet, resetting the
/// period to [`FIRST_SOLO_MS`]. Before this reset, on a 2-vCPU AMD EPYC, one decode beside two
/// busy processes went through 23 solo periods of 20 ms, each ended by a probe (33% of its
/// regions solo), and beside one `yes` decodes ran 32–91% of their regions solo (2 threads at
/// 0.92× one thread); with it the periods double (20, 40, 80 ms, then judged and renewed) and
/// 91–96% of regions run solo beside one `yes` (1.00× one thread).
fn start_solo(ms: u64) {
    DELAY_BASE.with(|b| b.set((0, 0, 0)));
    *SOLO_BASE.lock().unwrap_or_else(|p| p.into_inner()) = cpu_sample();
    SOLO_UNTIL_NS.store(now_ns() + ms * 1_000_000, Relaxed);
    SOLO_PERIODS.fetch_add(1, Relaxed);
}

thread_local! {
    /// This leader's last reading: (when, its run-queue delay then, the workers' total then).
    static DELAY_BASE: Cell<(u64, u64, u64)> = const { Cell::new((0, 0, 0)) };
    /// This worker's last reading: (when, its run-queue delay then), ns.
    static WORKER_BASE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// A worker leaves its team (at the end of a forward pass): at most once a window, it adds
/// its run-queue delay since its last reading to the workers' total the leader reads.
pub(super) fn worker_left() {
    let now = now_ns();
    let (then, delay_then) = WORKER_BASE.with(Cell::get);
    if then != 0 && now - then < DELAY_WINDOW_MS * 1_000_000 {
        return;
    }
    if let Some(delay) = run_queue_delay_ns() {
        WORKER_BASE.with(|b| b.set((now, delay)));
        if then != 0 {
            WORKERS_DELAY_NS.fetch_add(delay.saturating_sub(delay_then), Relaxed);
        }
    }
}

/// This thread's time runnable but waiting for a CPU, ns (`/proc/thread-self/schedstat`'s
/// second field); None where the file is absent (not Linux, or no scheduler statistics).
fn run_queue_delay_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Once per window: whether the team's threads waited for a CPU more than `DELAY_FRACTION`
/// of their time since the last reading (the leader's delay and what workers reported, over
/// the window times the pool's threads). None between readings, on the first, and after a
/// gap of several windows (solo, or idle: that delay is not the team's).
fn run_queue_verdict() -> Option<bool> {
    let now = now_ns();
    let (then, delay_then, workers_then) = DELAY_BASE.with(Cell::get);
    let window = DELAY_WINDOW_MS * 1_000_000;
    if then != 0 && now - then < window {
        return None;
    }
    let delay = run_queue_delay_ns()?;
    let workers = WORKERS_DELAY_NS.load(Relaxed);
    DELAY_BASE.with(|b| b.set((now, delay, workers)));
    if then == 0 || now - then > 3 * window {
        return None;
    }
    let waited = delay.saturating_sub(delay_then) + workers.saturating_sub(workers_then);
    let thread_time = (now - then) * rayon::current_num_threads() as u64;
    WINDOWS_NS.fetch_add(thread_time, Relaxed);
    WINDOWS_DELAY_NS.fetch_add(waited, Relaxed);
    Some(waited as f64 > DELAY_FRACTION * thread_time as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_worker_finishing_its_task_is_not_a_stall() {
        // 10 tasks of 20 µs led, then 30 µs waiting for the worker's last task.
        assert!(!is_stall(200_000, 30_000, 10, 20));
        // Long tasks (2 ms each): waiting one task's time is normal.
        assert!(!is_stall(4_000_000, 2_000_000, 2, 4));
        // A scheduler slice behind a 20 µs task is a stall.
        assert!(is_stall(200_000, 3_000_000, 10, 20));
        // A long region no worker joined is one; a short one is not (a parked worker wakes).
        assert!(is_stall(1_000_000, 0, 64, 64));
        assert!(!is_stall(100_000, 0, 64, 64));
        assert!(!is_stall(1_000_000, 0, 1, 1));
    }

    #[test]
    fn other_processes_cores_come_from_the_machine_less_this_process() {
        let at = |s: u64, busy, own| CpuSample {
            wall_ns: s * 1_000_000_000,
            machine_busy: busy,
            own,
        };
        // 2 s: the machine busy 400 ticks (2 cores), this process 200 (1 core): 1 other.
        assert!((others_cores(&at(1, 1000, 50), &at(3, 1400, 250)) - 1.0).abs() < 1e-9);
        // Quiet: all of the machine's busy time was this process's.
        assert_eq!(others_cores(&at(1, 1000, 50), &at(3, 1200, 250)), 0.0);
        assert_eq!(others_cores(&at(1, 1000, 50), &at(1, 1000, 50)), 0.0);
        // Where /proc is (Linux outside Miri's isolation), a sample reads and counts up.
        if let (Some(a), Some(b)) = (cpu_sample(), cpu_sample()) {
            assert!(
                b.machine_busy >= a.machine_busy && b.own >= a.own,
                "{a:?} {b:?}"
            );
        }
    }

    #[test]
    fn the_first_run_queue_window_after_a_solo_period_starts_with_it() {
        // On a thread of its own (the window is the leader's thread-local), with a period of
        // 0 ms, over at once.
        let _solo_tests = SOLO_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::spawn(|| {
            if run_queue_delay_ns().is_none() {
                return; // no schedstat here (not Linux, Miri's isolation)
            }
            let window = DELAY_WINDOW_MS * 1_000_000;
            while now_ns() < 2 * window {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let old_reading = || DELAY_BASE.with(|b| b.set((now_ns() - window - 1, 0, 0)));
            // A reading one window old gives a verdict...
            old_reading();
            assert!(run_queue_verdict().is_some());
            // ...unless a solo period began since: then the next reading starts a window.
            old_reading();
            start_solo(0);
            assert_eq!(run_queue_verdict(), None);
            assert!(!solo());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn three_stalls_close_together_go_solo_and_scattered_ones_do_not() {
        let mut d = Detector::new();
        assert_eq!(d.region(true, None), None);
        assert_eq!(d.region(true, None), None);
        assert_eq!(d.region(true, None), Some(FIRST_SOLO_MS));
        let mut d = Detector::new();
        for i in 0..10_000 {
            // One stall in every 100 regions, as on a quiet VM now and then.
            assert_eq!(d.region(i % 100 == 0, None), None, "region {i}");
        }
    }

    #[test]
    fn busy_windows_go_solo_a_busy_probe_doubles_the_period_and_a_quiet_one_resets_it() {
        let mut d = Detector::new();
        // One busy window is not enough; two in a row are.
        assert_eq!(d.region(false, Some(true)), None);
        assert_eq!(d.region(false, Some(false)), None);
        assert_eq!(d.region(false, Some(true)), None);
        assert_eq!(d.region(false, None), None);
        assert_eq!(d.region(false, Some(true)), Some(FIRST_SOLO_MS));
        // Probing: a busy window at once doubles, up to the longest period.
        let mut ms = FIRST_SOLO_MS;
        for _ in 0..10 {
            ms = (ms * 2).min(LONGEST_SOLO_MS);
            assert_eq!(d.region(false, None), None);
            assert_eq!(d.region(false, Some(true)), Some(ms));
        }
        assert_eq!(ms, LONGEST_SOLO_MS);
        // A quiet probe resets it: going solo again starts from the first period.
        assert_eq!(d.region(false, Some(false)), None);
        assert!(!d.probing);
        assert_eq!(d.region(false, Some(true)), None);
        assert_eq!(d.region(false, Some(true)), Some(FIRST_SOLO_MS));
    }
}
