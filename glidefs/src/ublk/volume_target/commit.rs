//! The target's commit thread.
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
//! So each target has one thread of its own that runs commits one after another, in the
//! order the loops handed them over. It only ever waits for the WAL (its mutex and the
//! write(2) of a record), whose holders never wait for a gate or a stripe: it always makes
//! progress. The WAL serialises the records anyway. The thread is an `IO_FLUSHER` (it writes
//! cache files; see `runtime`) and ends once the target is dropped.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;

/// One commit: finishes its request's token (dropping it unfinished fails the request).
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Handle on the commit thread.
#[derive(Debug)]
pub(super) struct Committer {
    tx: mpsc::Sender<Job>,
}

impl Committer {
    /// Starts the commit thread of volume `volume`.
    pub(super) fn start(volume: &str) -> std::io::Result<Committer> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(format!("commit-{volume}"))
            .spawn(move || {
                crate::daemon::runtime::mark_io_flusher();
                while let Ok(job) = rx.recv() {
                    // A panicking commit drops its token (the request fails with -EIO); the
                    // thread goes on with the next one.
                    if catch_unwind(AssertUnwindSafe(job)).is_err() {
                        tracing::error!("a deferred commit panicked: its request failed");
                    }
                }
            })?;
        Ok(Committer { tx })
    }

    /// Queues `job` (never blocks). Should the thread be gone, the job is dropped, and with
    /// it its token: the request fails with `-EIO`.
    pub(super) fn run(&self, job: Job) {
        if self.tx.send(job).is_err() {
            tracing::error!("the commit thread is gone: failing the request");
        }
    }
}
