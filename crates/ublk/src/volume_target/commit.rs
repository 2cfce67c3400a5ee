//! The targets' commit threads.
//!
//! A WRITE whose commit must write a WAL record (its blocks turn Dirty) is committed off the
//! loop thread (see `write`). The commit holds the request's gate and the stripe locks of its
//! blocks until it runs, so it must run on a thread that is never itself parked on a gate or
//! a stripe lock. The runtime's threads do not qualify: a cold fill waits for a stripe on an
//! async worker, and every slow-path request waits for the gate (`enter()`) or a stripe
//! (`prepare_write(.., Wait)`) on the blocking pool, so with enough requests outstanding
//! (512, the pool's size) a commit queued there waits behind threads that wait for it: the
//! volume deadlocks (`commit_tests`).
//!
//! So commits run on threads of their own, shared by every target of the process (a thread
//! per target made the daemon's thread count grow with its devices). Each target has a lane:
//! its commits run one after another, in the order the loops handed them over, on one pool
//! thread at a time; a lane with more waiting after [`TURN`] commits goes to the back of the
//! line, so a busy volume does not hold up the others. A commit only ever waits for its
//! volume's WAL (its mutex and the write(2) of a record), whose holders never wait for a gate
//! or a stripe.
//!
//! The pool keeps [`pool_threads`] threads and grows past them whenever a lane is queued and
//! no thread is idle to take it: volumes whose WAL writes hang (a stall of their own on the
//! cache disk) each hold one thread, and the other lanes still find one (found by review:
//! with a fixed pool, `pool_threads` such volumes stopped every other volume's commits). A
//! thread beyond the base count exits after [`IDLE`] without work. So there are at most as
//! many threads as lanes waiting or running at once plus the base, never more than the old
//! thread per target, and every lane always makes progress. The threads are `IO_FLUSHER`
//! (they write cache files; see `runtime`).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

/// One commit: finishes its request's token (dropping it unfinished fails the request).
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Commits a lane runs before it yields its pool thread to the next lane waiting.
const TURN: usize = 32;

/// How long a thread beyond [`pool_threads`] waits for work before it exits.
const IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// How many commit threads the pool keeps: twice the CPUs, at least 4, at most 32 (it grows
/// past them while lanes wait and none is idle).
pub(super) fn pool_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get() * 2)
        .clamp(4, 32)
}

/// One target's commits, in order.
struct Lane {
    volume: String,
    state: Mutex<LaneState>,
}

#[derive(Default)]
struct LaneState {
    jobs: VecDeque<Job>,
    /// In the pool's line or being run: `run` must not queue the lane again.
    scheduled: bool,
}

/// The lanes with commits waiting, and the threads that run them.
struct Pool {
    line: Mutex<Line>,
    wake: Condvar,
}

#[derive(Default)]
struct Line {
    lanes: VecDeque<Arc<Lane>>,
    /// Threads waiting for a lane.
    idle: usize,
    /// Threads running.
    threads: usize,
}

impl Pool {
    /// The process's pool, its threads started by the first caller. Fails only when not even
    /// one thread could be started (a later call tries again).
    fn get() -> std::io::Result<&'static Pool> {
        static POOL: OnceLock<&'static Pool> = OnceLock::new();
        static START: Mutex<()> = Mutex::new(());
        if let Some(p) = POOL.get() {
            return Ok(p);
        }
        let _one_starter = START.lock();
        if let Some(p) = POOL.get() {
            return Ok(p);
        }
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            line: Mutex::new(Line::default()),
            wake: Condvar::new(),
        }));
        let mut last_err = None;
        for _ in 0..pool_threads() {
            if let Err(e) = pool.spawn() {
                last_err = Some(e);
            }
        }
        let started = pool.line.lock().threads;
        if started == 0 {
            return Err(last_err.unwrap_or_else(|| std::io::Error::other("no commit thread")));
        }
        if let Some(e) = last_err {
            tracing::warn!(started, error = %e, "started fewer commit threads than planned; more start when lanes wait");
        }
        Ok(POOL.get_or_init(|| pool))
    }

    /// Starts one more thread (counted in `threads` before it runs).
    fn spawn(&'static self) -> std::io::Result<()> {
        let n = {
            let mut line = self.line.lock();
            line.threads += 1;
            line.threads
        };
        let spawned = std::thread::Builder::new()
            .name(format!("commit-{n}"))
            .spawn(move || self.work());
        if spawned.is_err() {
            self.line.lock().threads -= 1;
        }
        spawned.map(drop)
    }

    fn work(&'static self) {
        crate::runtime::mark_io_flusher();
        let base = pool_threads();
        loop {
            let lane = {
                let mut line = self.line.lock();
                loop {
                    if let Some(lane) = line.lanes.pop_front() {
                        break lane;
                    }
                    line.idle += 1;
                    let timed_out = self.wake.wait_for(&mut line, IDLE).timed_out();
                    line.idle -= 1;
                    if timed_out && line.lanes.is_empty() && line.threads > base {
                        line.threads -= 1;
                        return;
                    }
                }
            };
            self.run_turn(&lane);
        }
    }

    /// Runs up to [`TURN`] commits of `lane`, then puts it back in line if more wait.
    fn run_turn(&'static self, lane: &Arc<Lane>) {
        for _ in 0..TURN {
            let job = {
                let mut state = lane.state.lock();
                match state.jobs.pop_front() {
                    Some(job) => job,
                    None => {
                        state.scheduled = false;
                        return;
                    }
                }
            };
            // A panicking commit drops its token (the request fails with -EIO); the lane goes
            // on with the next one.
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                tracing::error!(volume = %lane.volume, "a deferred commit panicked: its request failed");
            }
        }
        let more = {
            let mut state = lane.state.lock();
            state.scheduled = !state.jobs.is_empty();
            state.scheduled
        };
        if more {
            self.queue(lane.clone());
        }
    }

    /// Puts `lane` in line; starts a thread when no idle one is left to take it (see the
    /// module docs). Should that fail, the lane waits for a thread to come free.
    fn queue(&'static self, lane: Arc<Lane>) {
        let grow = {
            let mut line = self.line.lock();
            line.lanes.push_back(lane);
            line.lanes.len() > line.idle
        };
        self.wake.notify_one();
        if grow {
            if let Err(e) = self.spawn() {
                tracing::warn!(error = %e, "could not start another commit thread; the lane waits for a busy one");
            }
        }
    }
}

/// A target's handle on the commit pool: its lane.
pub(super) struct Committer {
    pool: &'static Pool,
    lane: Arc<Lane>,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer")
            .field("volume", &self.lane.volume)
            .field("waiting", &self.lane.state.lock().jobs.len())
            .finish()
    }
}

impl Committer {
    /// The lane of volume `volume` (the pool's threads start with the first one; the error:
    /// none could).
    pub(super) fn start(volume: &str) -> std::io::Result<Committer> {
        Ok(Committer {
            pool: Pool::get()?,
            lane: Arc::new(Lane {
                volume: volume.to_string(),
                state: Mutex::new(LaneState::default()),
            }),
        })
    }

    /// Queues `job` behind the lane's earlier commits (never blocks on a commit).
    pub(super) fn run(&self, job: Job) {
        let schedule = {
            let mut state = self.lane.state.lock();
            state.jobs.push_back(job);
            !std::mem::replace(&mut state.scheduled, true)
        };
        if schedule {
            self.pool.queue(self.lane.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    /// Many lanes share the pool's threads: each lane's commits run in order, all of them
    /// run, a lane stuck in a slow commit does not hold up the others, and the threads started
    /// for a burst leave once idle.
    #[test]
    fn lanes_share_the_pool_in_order_and_a_slow_lane_holds_up_no_other() {
        let (tx, rx) = mpsc::channel::<(usize, usize)>();
        let slow = Committer::start("slow").unwrap();
        let (release, held) = mpsc::channel::<()>();
        slow.run(Box::new(move || {
            let _ = held.recv_timeout(Duration::from_secs(30));
        }));
        let lanes: Vec<Committer> = (0..64)
            .map(|i| Committer::start(&format!("v{i}")).unwrap())
            .collect();
        for seq in 0..100 {
            for (i, lane) in lanes.iter().enumerate() {
                let tx = tx.clone();
                lane.run(Box::new(move || {
                    let _ = tx.send((i, seq));
                }));
            }
        }
        let mut next = vec![0usize; lanes.len()];
        for _ in 0..lanes.len() * 100 {
            let (i, seq) = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("a commit did not run while one lane was stuck");
            assert_eq!(seq, next[i], "lane {i} ran out of order");
            next[i] += 1;
        }
        release.send(()).unwrap();
        // Threads beyond the base count leave once idle: the pool shrinks back.
        let commit_threads = || {
            std::fs::read_dir("/proc/self/task").map_or(0, |d| {
                d.filter_map(Result::ok)
                    .filter(|t| {
                        std::fs::read_to_string(t.path().join("comm"))
                            .is_ok_and(|c| c.starts_with("commit-"))
                    })
                    .count()
            })
        };
        let deadline = std::time::Instant::now() + IDLE * 4;
        while commit_threads() > pool_threads() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} commit threads {:?} after the work ended (the pool keeps {})",
                commit_threads(),
                IDLE * 4,
                pool_threads()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A panicking commit fails only itself: the lane runs the next one.
    #[test]
    fn a_panicking_commit_does_not_stop_its_lane() {
        let lane = Committer::start("panics").unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        lane.run(Box::new(|| panic!("injected")));
        let (tx, rx) = mpsc::channel();
        let r = ran.clone();
        lane.run(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(());
        }));
        rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
