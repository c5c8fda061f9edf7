//! A persistent team of spinning threads for the many short parallel regions of a decode step
//! (llama.cpp's thread pool: every thread joins every op, then meets the others at a spin
//! barrier). A SmolLM2-135M token is ~150 regions of 20–200 µs each; a rayon fork-join costs
//! a few µs (stealing, and a sleeping worker's futex wake), which is a large share of such
//! regions. Inside `with_team`, the other threads of the rayon pool run a loop that spins on a
//! job counter, so a region (`for_each_chunk_mut`, `parallel_for`) costs one atomic store to
//! publish and one spin to join. While they wait, the team's threads keep serving rayon
//! (`rayon::yield_now`), so kernels that use rayon directly (flash2, the tile GEMMs of a
//! prompt) still run in parallel inside a team.
//!
//! Outside a team — or called from a thread that is not the team's leader — the same calls
//! fall back to rayon, so a kernel written against this module works anywhere.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::isa::with_isa;
use crate::Isa;

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

struct Team {
    /// Bumped (Release) after `job` is written; workers read `job` after seeing it (Acquire).
    epoch: AtomicUsize,
    job: UnsafeCell<Job>,
    /// Participant p's contiguous share of the tasks (p = 0 the leader, then workers in the
    /// order they joined); `parts` of them are in use for the current job.
    shares: Box<[Share]>,
    parts: AtomicUsize,
    /// Workers finished with the current epoch.
    acks: AtomicUsize,
    /// Workers that joined the team (counted from the next job on: its acks to wait for).
    members: Mutex<usize>,
    stop: AtomicBool,
    /// A task panicked on a worker.
    panicked: AtomicBool,
}

// SAFETY: `job` is written only by the leader while no worker reads it (before the epoch bump
// that publishes it, after every expected worker acked the previous one) and read by workers
// only between seeing the new epoch and acking it.
unsafe impl Sync for Team {}

fn noop(_: usize) {}

impl Team {
    fn new() -> Team {
        let f: &(dyn Fn(usize) + Sync) = &noop;
        Team {
            epoch: AtomicUsize::new(0),
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
            acks: AtomicUsize::new(0),
            members: Mutex::new(0),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        }
    }

    /// Runs participant `me`'s share of the tasks, then helps with the others' until none is
    /// left. A contiguous share per thread keeps each thread streaming one contiguous part of
    /// a weight matrix; claiming one task at a time from one shared counter made a region cost
    /// ~2 µs of cache-line traffic on two cores.
    fn work(&self, job: Job, me: usize) {
        let parts = self.parts.load(Ordering::Relaxed);
        for k in 0..parts {
            let share = &self.shares[(me + k) % parts];
            let end = share.end.load(Ordering::Relaxed);
            loop {
                let i = share.next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                // SAFETY: the leader keeps `f` alive until every expected worker acked.
                unsafe { (*job.f)(i) };
            }
        }
    }

    /// Marks every task of the job claimed (after a panic), so no one waits for them.
    fn drain(&self) {
        for share in &self.shares[..self.parts.load(Ordering::Relaxed)] {
            share.next.store(usize::MAX / 2, Ordering::Relaxed);
        }
    }

    /// The loop of a worker thread: wait for a job, help with it, ack; serve rayon meanwhile.
    fn worker(&self) {
        if IN_TEAM.with(Cell::get) {
            // This thread already serves a team (a loop stolen by another loop's
            // `yield_now`): joining twice would leave the outer loop unacked.
            return;
        }
        let (me, mut seen) = {
            let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
            if *members + 1 >= MAX_PARTICIPANTS {
                return;
            }
            *members += 1;
            (*members, self.epoch.load(Ordering::Acquire))
        };
        IN_TEAM.with(|t| t.set(true));
        let mut idle = 0u32;
        loop {
            let e = self.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                // SAFETY: published before the epoch bump we just saw (Acquire).
                let job = unsafe { *self.job.get() };
                let run = || catch_unwind(AssertUnwindSafe(|| self.work(job, me)));
                // The leader's tier is one this CPU runs, so `with_isa` accepts it.
                let ran = with_isa(job.isa, run).unwrap_or_else(|_| run());
                if ran.is_err() {
                    self.panicked.store(true, Ordering::Relaxed);
                    self.drain();
                }
                self.acks.fetch_add(1, Ordering::Release);
                idle = 0;
                continue;
            }
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            idle = idle.wrapping_add(1);
            if idle.is_multiple_of(64) {
                // Rayon work the leader started (flash2, tile GEMMs) runs here meanwhile.
                let _ = rayon::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        IN_TEAM.with(|t| t.set(false));
    }

    /// Runs `f(i)` for i < n on the leader and every member, returning when all are done.
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        // The workers that will ack this job: those that joined before it was published.
        let expected = {
            let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
            self.acks.store(0, Ordering::Relaxed);
            let parts = *members + 1;
            self.parts.store(parts, Ordering::Relaxed);
            for (p, share) in self.shares[..parts].iter().enumerate() {
                share.next.store(p * n / parts, Ordering::Relaxed);
                share.end.store((p + 1) * n / parts, Ordering::Relaxed);
            }
            // SAFETY: every expected worker acked the previous job (the wait below), so none
            // reads `job` now; it is read again only after the epoch bump.
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
            self.epoch.fetch_add(1, Ordering::Release);
            *members
        };
        let job = unsafe { *self.job.get() };
        // While this thread runs tasks it does not lead: a region started inside a task
        // falls back to rayon instead of re-entering this job.
        let lead = LEADER.with(|l| l.replace(std::ptr::null()));
        let mine = catch_unwind(AssertUnwindSafe(|| self.work(job, 0)));
        LEADER.with(|l| l.set(lead));
        if mine.is_err() {
            self.drain();
        }
        while self.acks.load(Ordering::Acquire) < expected {
            std::hint::spin_loop();
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
    // In place: `f` runs on this thread, so its thread-local choices (the ISA of
    // `isa::with_isa`) hold; the worker loops go to the pool.
    rayon::in_place_scope(|s| {
        for _ in 0..threads - 1 {
            s.spawn(|_| team.worker());
        }
        struct Leave<'a>(&'a Team);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                LEADER.with(|l| l.set(std::ptr::null()));
                self.0.stop.store(true, Ordering::Release);
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
