//! The tokio runtime of `glidefs serve`.
//!
//! Its threads serve I/O for the ublk devices as much as the queue threads do: FLUSH, FUA,
//! writes that wait, cold reads and fills run on the workers and the blocking pool and
//! allocate memory and write cache files. Each of them (and the thread that builds the
//! runtime, which runs `block_on`) is marked `IO_FLUSHER` (`PR_SET_IO_FLUSHER`, as the queue
//! threads are), so memory reclaim on them never waits for writeback to our own devices: with
//! a filesystem on `/dev/ublkbN` under memory pressure that wait is the loop/NBD/FUSE reclaim
//! deadlock. Marking needs `CAP_SYS_RESOURCE`; without it a warning is logged once and the
//! daemon runs on.

use glidefs_model::log::chain;
use std::sync::atomic::{AtomicBool, Ordering};

/// A multi-thread runtime whose every thread, and the calling one, is an `IO_FLUSHER`.
pub fn serving() -> std::io::Result<tokio::runtime::Runtime> {
    mark_io_flusher();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(mark_io_flusher)
        .build()
}

/// Marks the calling thread `IO_FLUSHER` (best effort; see the module docs).
pub(crate) fn mark_io_flusher() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Err(e) = rustix::process::configure_io_flusher_behavior(true) {
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %chain(&e),
                "could not mark the runtime's threads IO_FLUSHER (needs CAP_SYS_RESOURCE): \
                 under memory pressure, reclaim on them may wait for I/O to our own devices"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_that_serves_io_is_an_io_flusher() {
        // Whether this process may set the flag at all (CAP_SYS_RESOURCE), asked on a thread
        // of its own so the answer does not depend on this one.
        let allowed = std::thread::spawn(|| rustix::process::configure_io_flusher_behavior(true))
            .join()
            .unwrap();
        if let Err(e) = allowed {
            println!("cannot check IO_FLUSHER here: PR_SET_IO_FLUSHER failed ({e}); needs CAP_SYS_RESOURCE");
            assert_eq!(
                e,
                rustix::io::Errno::PERM,
                "only a missing capability may stop it"
            );
            return;
        }
        let (caller, worker, blocking) = std::thread::spawn(|| {
            let rt = serving().unwrap();
            let caller = rustix::process::is_io_flusher().unwrap();
            let (worker, blocking) = rt.block_on(async {
                let w = tokio::spawn(async { rustix::process::is_io_flusher() });
                let b = tokio::task::spawn_blocking(rustix::process::is_io_flusher);
                (w.await.unwrap().unwrap(), b.await.unwrap().unwrap())
            });
            (caller, worker, blocking)
        })
        .join()
        .unwrap();
        assert!(caller, "the thread that runs block_on is not an IO_FLUSHER");
        assert!(worker, "an async worker thread is not an IO_FLUSHER");
        assert!(blocking, "a blocking-pool thread is not an IO_FLUSHER");
    }
}
