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
//! So commits run on threads of their own, shared by every target of the process: a pool of
//! [`pool_threads`] started on first use (a thread per target made the daemon's thread count
//! grow with its devices). Each target has a lane: its commits run one after another, in the
//! order the loops handed them over, on one pool thread at a time; a lane with more waiting
//! after [`TURN`] commits goes to the back of the line, so a busy volume does not hold up the
//! others. A commit only ever waits for its volume's WAL (its mutex and the write(2) of a
//! record), whose holders never wait for a gate or a stripe: every lane always makes
//! progress. (A volume whose WAL writes are slow keeps one pool thread busy at a time; the
//! others serve the other lanes.) The threads are `IO_FLUSHER` (they write cache files; see
//! `runtime`) and live as long as the process.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

/// One commit: finishes its request's token (dropping it unfinished fails the request).
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Commits a lane runs before it yields its pool thread to the next lane waiting.
const TURN: usize = 32;

/// How many commit threads the process runs: twice the CPUs, at least 4 (a few volumes with
/// slow WAL writes must not take them all), at most 32.
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
    line: Mutex<VecDeque<Arc<Lane>>>,
    wake: Condvar,
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
            line: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
        }));
        let mut started = 0;
        let mut last_err = None;
        for i in 0..pool_threads() {
            match std::thread::Builder::new()
                .name(format!("commit-{i}"))
                .spawn(move || pool.work())
            {
                Ok(_) => started += 1,
                Err(e) => last_err = Some(e),
            }
        }
        if started == 0 {
            return Err(last_err.unwrap_or_else(|| std::io::Error::other("no commit thread")));
        }
        if let Some(e) = last_err {
            tracing::warn!(started, error = %e, "started fewer commit threads than planned");
        }
        Ok(POOL.get_or_init(|| pool))
    }

    fn work(&self) {
        crate::daemon::runtime::mark_io_flusher();
        loop {
            let lane = {
                let mut line = self.line.lock();
                loop {
                    if let Some(lane) = line.pop_front() {
                        break lane;
                    }
                    self.wake.wait(&mut line);
                }
            };
            self.run_turn(&lane);
        }
    }

    /// Runs up to [`TURN`] commits of `lane`, then puts it back in line if more wait.
    fn run_turn(&self, lane: &Arc<Lane>) {
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

    fn queue(&self, lane: Arc<Lane>) {
        self.line.lock().push_back(lane);
        self.wake.notify_one();
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
    /// run, and a lane stuck in a slow commit does not hold up the others.
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
        let names: usize = std::fs::read_dir("/proc/self/task")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|t| {
                        std::fs::read_to_string(t.path().join("comm"))
                            .is_ok_and(|c| c.starts_with("commit-"))
                    })
                    .count()
            })
            .unwrap_or(0);
        assert!(
            names <= pool_threads(),
            "{names} commit threads for 65 lanes (the pool has {})",
            pool_threads()
        );
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
