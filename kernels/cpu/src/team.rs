//! A persistent team of spinning threads for the many short parallel regions of a decode step
//! (llama.cpp's thread pool: every thread joins every op, then meets the others at a spin
//! barrier). A SmolLM2-135M token is ~150 regions of 20–200 µs each; a rayon fork-join costs
//! a few µs (stealing, and a sleeping worker's futex wake), which is a large share of such
//! regions. Inside `with_team`, the other threads of the rayon pool run a loop that spins on a
//! job word, so a region (`for_each_chunk_mut`, `parallel_for`) costs one atomic store to
//! publish and one spin to join. While they wait, the team's threads keep serving rayon
//! (`rayon::yield_now`), so kernels that use rayon directly (flash2, the tile GEMMs of a
//! prompt) still run in parallel inside a team.
//!
//! The team yields when the machine is busy:
//! - A worker that has had nothing to do for [`SPIN_BUDGET`] sleeps on a condition variable
//!   (woken by the next region, and every [`PARK_POLL`] to serve rayon).
//! - A worker joins a region only while it is open: the leader closes it once every task is
//!   claimed and waits only for workers still inside, never for one that was descheduled
//!   before it joined.
//! - The leader reports each region's waits to `busy`, which sends the team solo (every region
//!   on the leader, the workers back in rayon) while other processes keep them off the cores.
//!
//! Outside a team — or called from a thread that is not the team's leader — the same calls
//! fall back to rayon, so a kernel written against this module works anywhere.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::isa::with_isa;
use crate::Isa;

mod busy;
pub use busy::{reset_stats, set_adaptive, stats, TeamStats, DELAY_FRACTION, GAP_BUCKETS};

/// How long an idle worker spins before it sleeps. Measured on a 2-vCPU Xeon VM: a sleeping
/// worker joins the next region 37 µs after it opens (median; p90 55–87 µs: a futex wake and
/// a reschedule; `team_probe`), and of the 44.5k gaps before the regions of a 256-token
/// SmolLM2 decode 98.5% are under 16 µs and 99.9% under 128 µs (`harness generate --format
/// json`, `team.idle_gaps_us_log2`). 200 µs keeps every gap inside a step spinning (0–20
/// parks per 256 tokens) and sleeps through longer ones, where the wake costs under a fifth.
pub const SPIN_BUDGET: Duration = Duration::from_micros(200);
/// How often a sleeping worker wakes to serve rayon work its leader started (rayon does not
/// know to wake a thread that sleeps in the team).
pub const PARK_POLL: Duration = Duration::from_micros(500);

/// A type-erased job: `f(i)` for every task of the shares, at the leader's ISA tier (its
/// `Isa::active()` when it published the job: a worker runs the tasks under `with_isa` of it,
/// so a kernel that reads the tier inside a task sees the leader's choice, `with_isa` in tests
/// included).
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    isa: Isa,
}

/// One participant's share of a job's tasks: `next..end`, claimed by its owner first and by
/// the others once they finish their own (on its own cache line, so an owner's claims do not
/// contend with anyone until stealing starts).
#[repr(align(128))]
struct Share {
    next: AtomicUsize,
    end: AtomicUsize,
}

/// Most participants a team has (the leader and up to 63 workers).
const MAX_PARTICIPANTS: usize = 64;

/// The gate word: the job's sequence number above bit 32, whether it is open at bit 31, and
/// the workers inside it below.
const OPEN: u64 = 1 << 31;
const INSIDE: u64 = OPEN - 1;

struct Team {
    /// `seq << 32 | OPEN | inside`: stored (SeqCst) after `job` and the shares are written; a
    /// worker joins by incrementing `inside` while the word is open and its sequence is the
    /// one it saw, and leaves by decrementing it (Release). The leader closes it when every
    /// task is claimed and waits for `inside` to reach 0 (Acquire).
    gate: AtomicU64,
    job: UnsafeCell<Job>,
    /// Participant p's contiguous share of the tasks (p = 0 the leader, then workers in the
    /// order they joined); `parts` of them are in use for the current job.
    shares: Box<[Share]>,
    parts: AtomicUsize,
    /// Workers in the team now (each region's shares are cut for them).
    members: AtomicUsize,
    /// Workers asleep (or about to be) on `wake`; the leader notifies when it is non-zero.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
    /// A task panicked on a worker.
    panicked: AtomicBool,
}

// SAFETY: `job` is written only by the leader while the gate is closed with no worker inside
// (after the previous region's wait), and read by a worker only while it is inside the gate.
unsafe impl Sync for Team {}

fn noop(_: usize) {}

impl Team {
    fn new() -> Team {
        let f: &(dyn Fn(usize) + Sync) = &noop;
        Team {
            gate: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                f,
                isa: Isa::Portable,
            }),
            shares: (0..MAX_PARTICIPANTS)
                .map(|_| Share {
                    next: AtomicUsize::new(0),
                    end: AtomicUsize::new(0),
                })
                .collect(),
            parts: AtomicUsize::new(1),
            members: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        }
    }

    /// Runs participant `me`'s share of the tasks, then helps with the others' until none is
    /// left; returns how many tasks it ran. A contiguous share per thread keeps each thread
    /// streaming one contiguous part of a weight matrix; claiming one task at a time from one
    /// shared counter made a region cost ~2 µs of cache-line traffic on two cores.
    fn work(&self, job: Job, me: usize) -> usize {
        let parts = self.parts.load(Ordering::Relaxed);
        let mut ran = 0;
        for k in 0..parts {
            let share = &self.shares[(me + k) % parts];
            let end = share.end.load(Ordering::Relaxed);
            loop {
                let i = share.next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                // SAFETY: the leader keeps `f` alive until no worker is inside the gate.
                unsafe { (*job.f)(i) };
                ran += 1;
            }
        }
        ran
    }

    /// Marks every task of the job claimed (after a panic), so no one waits for them.
    fn drain(&self) {
        for share in &self.shares[..self.parts.load(Ordering::Relaxed)] {
            share.next.store(usize::MAX / 2, Ordering::Relaxed);
        }
    }

    /// Joins region `seq` if it is still open.
    fn enter(&self, seq: u64) -> bool {
        let mut g = self.gate.load(Ordering::Acquire);
        loop {
            if g >> 32 != seq || g & OPEN == 0 {
                return false;
            }
            match self
                .gate
                .compare_exchange_weak(g, g + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => g = now,
            }
        }
    }

    /// Sleeps until a region after `seq` is published, the team stops, or `PARK_POLL` passes.
    fn park(&self, seq: u64) {
        busy::count_park();
        let guard = self.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Checked after counting ourselves (SeqCst, against the leader's SeqCst publish and
        // its SeqCst read of `sleepers`): either we see the new region here or it notifies,
        // and it notifies under the lock we hold until `wait` releases it.
        if self.gate.load(Ordering::SeqCst) >> 32 == seq && !self.stop.load(Ordering::SeqCst) {
            let _ = self.wake.wait_timeout(guard, PARK_POLL);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes sleeping workers (a region was published, or the team stops).
    fn wake_sleepers(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.wake.notify_all();
        }
    }

    /// The loop of a worker thread: wait for a region, help with it; serve rayon meanwhile;
    /// sleep when idle for `SPIN_BUDGET`; leave while the team is solo.
    fn worker(&self) {
        if IN_TEAM.with(Cell::get) {
            // This thread already serves a team (a loop stolen by another loop's
            // `yield_now`): joining a second one would stall the first one's regions.
            return;
        }
        let me = self.members.fetch_add(1, Ordering::Relaxed) + 1;
        if me >= MAX_PARTICIPANTS {
            self.members.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let mut seen = self.gate.load(Ordering::Acquire) >> 32;
        IN_TEAM.with(|t| t.set(true));
        let mut idle = 0u32;
        let mut idle_since = busy::now_ns();
        loop {
            let seq = self.gate.load(Ordering::Acquire) >> 32;
            if seq != seen {
                seen = seq;
                if self.enter(seq) {
                    busy::count_gap(busy::now_ns() - idle_since);
                    // SAFETY: written before the region was published, and kept until we
                    // leave the gate.
                    let job = unsafe { *self.job.get() };
                    let run = || catch_unwind(AssertUnwindSafe(|| self.work(job, me)));
                    // The leader's tier is one this CPU runs, so `with_isa` accepts it.
                    let ran = with_isa(job.isa, run).unwrap_or_else(|_| run());
                    if ran.is_err() {
                        self.panicked.store(true, Ordering::Relaxed);
                        self.drain();
                    }
                    self.gate.fetch_sub(1, Ordering::Release);
                }
                idle = 0;
                idle_since = busy::now_ns();
                continue;
            }
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            idle = idle.wrapping_add(1);
            if idle.is_multiple_of(64) {
                if busy::solo() {
                    // Solo: back to rayon, whose sleep wakes only for rayon work; the leader
                    // steals this worker's share if a region comes before the team ends.
                    break;
                }
                // Rayon work the leader started (flash2, tile GEMMs) runs here meanwhile.
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    idle_since = busy::now_ns();
                } else if busy::now_ns() - idle_since > SPIN_BUDGET.as_nanos() as u64 {
                    self.park(seen);
                }
            } else {
                std::hint::spin_loop();
            }
        }
        self.members.fetch_sub(1, Ordering::Relaxed);
        busy::worker_left();
        IN_TEAM.with(|t| t.set(false));
    }

    /// Runs `f(i)` for i < n on the leader and every member that joins in time, returning
    /// when all are done; on the leader alone while `busy` says the machine is busy.
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        // Solo while the machine is busy, and alone when no worker joined this team (it
        // started solo, or its workers left when a solo period began).
        let solo = busy::solo();
        let members = self.members.load(Ordering::Relaxed);
        if solo || members == 0 {
            busy::count_alone_region(solo);
            // Nested regions from inside these tasks fall back to rayon, as on a worker.
            let lead = LEADER.with(|l| l.replace(std::ptr::null()));
            let mine = catch_unwind(AssertUnwindSafe(|| (0..n).for_each(f)));
            LEADER.with(|l| l.set(lead));
            return mine.unwrap_or_else(|p| resume_unwind(p));
        }
        // A worker that joins after this read starts on a share `me % parts` and steals the
        // rest, like everyone else.
        let parts = members.min(MAX_PARTICIPANTS - 1) + 1;
        self.parts.store(parts, Ordering::Relaxed);
        for (p, share) in self.shares[..parts].iter().enumerate() {
            share.next.store(p * n / parts, Ordering::Relaxed);
            share.end.store((p + 1) * n / parts, Ordering::Relaxed);
        }
        let seq = (self.gate.load(Ordering::Relaxed) >> 32) + 1;
        // SAFETY: the previous region's gate is closed with no worker inside (the wait below),
        // so no one reads `job` now; a worker reads it again only inside the next gate.
        unsafe {
            let f: *const (dyn Fn(usize) + Sync + '_) = f;
            // Lifetime erased: `f` outlives every use, as the wait below guarantees.
            *self.job.get() = Job {
                f: std::mem::transmute::<
                    *const (dyn Fn(usize) + Sync + '_),
                    *const (dyn Fn(usize) + Sync + 'static),
                >(f),
                isa: Isa::active(),
            };
        }
        self.gate.store(seq << 32 | OPEN, Ordering::SeqCst);
        self.wake_sleepers();
        let job = unsafe { *self.job.get() };
        let start = busy::now_ns();
        // While this thread runs tasks it does not lead: a region started inside a task
        // falls back to rayon instead of re-entering this job.
        let lead = LEADER.with(|l| l.replace(std::ptr::null()));
        let mine = catch_unwind(AssertUnwindSafe(|| self.work(job, 0)));
        LEADER.with(|l| l.set(lead));
        if mine.is_err() {
            self.drain();
        }
        // Every task is claimed: close the gate and wait for the workers inside.
        let inside = self.gate.fetch_and(!OPEN, Ordering::AcqRel) & INSIDE;
        let own = busy::now_ns() - start;
        let mut waited = 0;
        if inside > 0 {
            let mut spins = 0u32;
            while self.gate.load(Ordering::Acquire) & INSIDE != 0 {
                spins = spins.wrapping_add(1);
                if spins < 1 << 12 {
                    std::hint::spin_loop();
                } else {
                    // A worker inside is descheduled: let whatever shares this core run.
                    std::thread::yield_now();
                }
            }
            waited = busy::now_ns() - start - own;
        }
        if let Ok(led) = &mine {
            busy::record(own, waited, *led, n);
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if self.panicked.swap(false, Ordering::Relaxed) {
            panic!("a team task panicked on a worker thread");
        }
    }
}

thread_local! {
    /// The team this thread leads, if any.
    static LEADER: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
    /// This thread runs a team's worker loop.
    static IN_TEAM: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the other threads of the rayon pool spinning as a team for this thread's
/// `parallel_for` / `for_each_chunk_mut` calls (one decode step, one forward pass). Nested
/// calls, a pool of one thread, and calls from inside a team's task just run `f`.
pub fn with_team<R>(f: impl FnOnce() -> R) -> R {
    let threads = rayon::current_num_threads();
    if threads < 2 || !LEADER.with(Cell::get).is_null() || IN_TEAM.with(Cell::get) {
        return f();
    }
    let team = Team::new();
    // While the machine is busy the team is the leader alone: no workers to wake.
    let workers = if busy::solo() { 0 } else { threads - 1 };
    // In place: `f` runs on this thread, so its thread-local choices (the ISA of
    // `isa::with_isa`) hold; the worker loops go to the pool.
    rayon::in_place_scope(|s| {
        for _ in 0..workers {
            s.spawn(|_| team.worker());
        }
        struct Leave<'a>(&'a Team);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                LEADER.with(|l| l.set(std::ptr::null()));
                self.0.stop.store(true, Ordering::SeqCst);
                self.0.wake_sleepers();
            }
        }
        LEADER.with(|l| l.set(&team));
        let _leave = Leave(&team);
        f()
    })
}

/// Runs `f(i)` for every i < n in parallel: on this thread's team when it leads one, else on
/// rayon. Tasks are claimed one at a time, so unequal tasks balance.
pub fn parallel_for(n: usize, f: impl Fn(usize) + Sync) {
    if n == 0 {
        return;
    }
    let team = LEADER.with(Cell::get);
    if team.is_null() || n == 1 {
        use rayon::prelude::*;
        return (0..n).into_par_iter().for_each(&f);
    }
    // SAFETY: LEADER points at the team `with_team` keeps alive while it is set.
    unsafe { (*team).run(n, &f) }
}

/// A raw slice pointer that may cross threads (the chunks handed out are disjoint).
struct SharedMut<T>(*mut T, usize);
unsafe impl<T: Send> Sync for SharedMut<T> {}
unsafe impl<T: Send> Send for SharedMut<T> {}

/// `f(t, chunk t of out)` for the `chunk`-element pieces of `out` (the last may be shorter),
/// in parallel as `parallel_for`.
pub fn for_each_chunk_mut<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(chunk > 0, "for_each_chunk_mut: chunk of 0");
    let len = out.len();
    let shared = SharedMut(out.as_mut_ptr(), len);
    let n = len.div_ceil(chunk);
    parallel_for(n, |t| {
        let shared = &shared;
        let start = t * chunk;
        let end = (start + chunk).min(shared.1);
        // SAFETY: tasks t are distinct, so these ranges are disjoint parts of `out`, which
        // the caller's &mut keeps borrowed until parallel_for returns.
        let part = unsafe { std::slice::from_raw_parts_mut(shared.0.add(start), end - start) };
        f(t, part)
    });
}

/// Whether this thread leads a team now.
pub fn leading() -> bool {
    !LEADER.with(Cell::get).is_null()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn chunks_cover_the_slice_once_inside_and_outside_a_team() {
        for in_team in [false, true] {
            let mut v = vec![0u64; 1000];
            let body = |v: &mut Vec<u64>| {
                for round in 0..200u64 {
                    for_each_chunk_mut(v, 7, |t, part| {
                        for (j, x) in part.iter_mut().enumerate() {
                            *x += (t * 7 + j) as u64 + round;
                        }
                    });
                }
            };
            if in_team {
                with_team(|| {
                    assert_eq!(leading(), rayon::current_num_threads() > 1);
                    body(&mut v)
                });
            } else {
                body(&mut v);
            }
            for (i, x) in v.iter().enumerate() {
                assert_eq!(*x, 200 * i as u64 + (0..200).sum::<u64>(), "index {i}");
            }
            assert!(!leading());
        }
    }

    #[test]
    fn rayon_work_inside_a_team_completes_and_nested_teams_are_plain_calls() {
        use rayon::prelude::*;
        let total = AtomicU64::new(0);
        with_team(|| {
            // rayon directly (the team's workers serve it while they wait).
            let s: u64 = (0..10_000u64).into_par_iter().sum();
            total.fetch_add(s, Ordering::Relaxed);
            with_team(|| {
                parallel_for(50, |i| {
                    total.fetch_add(i as u64, Ordering::Relaxed);
                    // A region from inside a task falls back to rayon.
                    parallel_for(3, |j| {
                        total.fetch_add(j as u64, Ordering::Relaxed);
                    });
                });
            });
        });
        assert_eq!(
            total.load(Ordering::Relaxed),
            (0..10_000u64).sum::<u64>() + (0..50).sum::<u64>() + 50 * 3
        );
    }

    #[test]
    fn workers_run_a_job_at_the_leaders_tier() {
        // Each task records the tier it sees; under `with_isa` on the leader every task, on
        // whichever thread, must see that tier (the widest runnable tier otherwise).
        for isa in crate::isa::runnable() {
            let seen: Vec<AtomicUsize> = (0..256).map(|_| AtomicUsize::new(usize::MAX)).collect();
            with_isa(isa, || {
                with_team(|| {
                    parallel_for(seen.len(), |i| {
                        // Long enough that the workers take a share.
                        std::thread::sleep(std::time::Duration::from_micros(20));
                        seen[i].store(Isa::active() as usize, Ordering::Relaxed);
                    })
                })
            })
            .unwrap();
            for (i, s) in seen.iter().enumerate() {
                assert_eq!(s.load(Ordering::Relaxed), isa as usize, "task {i} at {isa}");
            }
        }
    }

    #[test]
    fn regions_after_the_workers_slept_run_every_task_once() {
        // Gaps longer than the spin budget: the workers sleep and are woken by each region.
        let counts: Vec<AtomicUsize> = (0..97).map(|_| AtomicUsize::new(0)).collect();
        with_team(|| {
            for round in 0..12 {
                std::thread::sleep(SPIN_BUDGET * 3);
                parallel_for(counts.len(), |i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                    if round % 2 == 0 {
                        // Long enough that a woken worker joins.
                        std::thread::sleep(Duration::from_micros(30));
                    }
                });
            }
        });
        for (i, c) in counts.iter().enumerate() {
            assert_eq!(c.load(Ordering::Relaxed), 12, "task {i}");
        }
    }

    #[test]
    fn a_solo_team_runs_every_task_on_the_leader() {
        // A pool of 2 whatever the machine: on a 1-CPU machine (or Miri's) the global pool
        // has one thread, `with_team` makes no team, and the tasks go to rayon's thread.
        let _solo_tests = busy::SOLO_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let on_leader = AtomicUsize::new(0);
        let total = AtomicUsize::new(0);
        pool.install(|| {
            let leader = std::thread::current().id();
            with_team(|| {
                busy::go_solo_for(10_000);
                parallel_for(64, |_| {
                    // Long enough that a worker, were one in the region, would take tasks.
                    std::thread::sleep(Duration::from_micros(20));
                    total.fetch_add(1, Ordering::Relaxed);
                    if std::thread::current().id() == leader {
                        on_leader.fetch_add(1, Ordering::Relaxed);
                    }
                });
                busy::go_solo_for(0);
            })
        });
        assert_eq!(total.load(Ordering::Relaxed), 64);
        assert_eq!(on_leader.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn a_panicking_task_reaches_the_leader_and_the_team_recovers() {
        let r = std::panic::catch_unwind(|| {
            with_team(|| {
                parallel_for(64, |i| {
                    if i == 40 {
                        panic!("task 40");
                    }
                })
            })
        });
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        with_team(|| {
            parallel_for(64, |_| {
                count.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(count.load(Ordering::Relaxed), 64);
    }
}
