//! What a test checks about its own process: a call bounded in time (a hang fails the test
//! instead of stalling the suite) and the number of open file descriptors (a leak check).

use std::time::{Duration, Instant};

/// Runs `f` on a helper thread; fails the test if it takes longer than `limit`.
pub fn bounded<R: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let start = Instant::now();
    match within(limit, f) {
        Some(r) => {
            println!("{what} took {:?}", start.elapsed());
            r
        }
        None => panic!("{what} did not finish within {limit:?} (hang)"),
    }
}

/// Runs `f` on a helper thread: its result, or `None` if it takes longer than `limit` (the
/// thread is left to finish on its own). For callers that must not panic, e.g. a `Drop`
/// that runs while the test already unwinds.
pub fn within<R: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> Option<R> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// Number of open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_returns_the_result_and_fails_a_hang() {
        assert_eq!(bounded("quick", Duration::from_secs(10), || 7), 7);
        let hang = std::panic::catch_unwind(|| {
            bounded("slow", Duration::from_millis(10), || {
                std::thread::sleep(Duration::from_secs(1))
            })
        });
        assert!(hang.is_err());
        assert_eq!(within(Duration::from_secs(10), || 7), Some(7));
        assert_eq!(
            within(Duration::from_millis(10), || std::thread::sleep(
                Duration::from_secs(1)
            )),
            None
        );
        assert!(open_fds() >= 3);
    }
}
