//! What the entry of a `recovering` volume holds for its background re-open ([`super::reopen`]):
//! the delays between attempts, the gate a remove or a shutdown stops it with, and the text
//! of its error.

use std::time::Duration;

use super::error::ManagerError;

/// Delays between the attempts to open a `recovering` volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReopenBackoff {
    /// Before the first retry.
    pub first: Duration,
    /// Upper bound of a delay (each failure doubles it up to this).
    pub max: Duration,
}

impl Default for ReopenBackoff {
    /// 1 s, doubling up to 60 s.
    fn default() -> Self {
        Self {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl ReopenBackoff {
    /// The delay after one of `prev`.
    pub(super) fn next(&self, prev: Duration) -> Duration {
        prev.saturating_mul(2)
            .clamp(self.first, self.max.max(self.first))
    }
}

/// Whether an open that failed with `e` is worth retrying in the background: the store did not
/// answer. Anything else (local disk, ownership, geometry, device) needs an operator.
pub(super) fn worth_retrying(e: &ManagerError) -> bool {
    matches!(e, ManagerError::StoreUnavailable { .. })
}

/// The `error` text of a recovering volume.
pub(super) fn recovering_message(attempts: u32, error: &str) -> String {
    format!(
        "recovering: {attempts} attempt(s) to open it failed because the object store did not answer; \
         retrying in the background, it opens by itself once the store answers; last error: {error}"
    )
}

/// The background re-open of one entry, as a forced remove or a shutdown sees it: they
/// [`stop`](ReopenGate::stop) it before they touch the entry.
#[derive(Debug)]
pub(super) struct ReopenGate {
    /// Set once the entry is being taken away: an attempt in flight stops at its next await
    /// (the store call it waits on is dropped) and no other starts.
    cancel: tokio::sync::watch::Sender<bool>,
    /// Held by an attempt from its checks to its end (its device step included, which is
    /// bounded and never cut short: a device attached by a dropped step would be nobody's).
    attempt: tokio::sync::Mutex<()>,
}

impl Default for ReopenGate {
    fn default() -> Self {
        Self {
            cancel: tokio::sync::watch::Sender::new(false),
            attempt: tokio::sync::Mutex::new(()),
        }
    }
}

impl ReopenGate {
    /// Ends the re-open: no attempt starts any more, the one in flight is cancelled, and this
    /// returns once it has ended. The entry's state is then final as far as re-opening goes
    /// (`Open` when the attempt got that far, else as it was).
    pub(super) async fn stop(&self) {
        self.cancel.send_replace(true);
        drop(self.attempt.lock().await);
    }

    /// Held by an attempt from its checks to its end (see the `attempt` field).
    pub(super) async fn attempt(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.attempt.lock().await
    }

    pub(super) fn stopped(&self) -> bool {
        *self.cancel.borrow()
    }

    pub(super) async fn wait_stopped(&self) {
        let mut rx = self.cancel.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = ReopenBackoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(5),
        };
        let mut d = b.first;
        let mut seen = vec![d];
        for _ in 0..5 {
            d = b.next(d);
            seen.push(d);
        }
        let secs: Vec<u64> = seen.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 5, 5, 5]);
    }
}
