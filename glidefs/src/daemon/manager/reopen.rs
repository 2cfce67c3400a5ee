//! Re-opening, in the background, the volumes that could not be opened at start because the
//! object store did not answer (an outage, a network not up yet).
//!
//! Contract:
//! - [`VolumeManager::restore`] tries each volume once. A volume whose open failed with
//!   `store_unavailable` is registered as [`EntryState::Recovering`] (state `recovering` in the
//!   API, `glidefs_volume_recovering 1` in the metrics, the last error in `error`) and one task
//!   per such volume re-opens it: it sleeps [`ReopenBackoff::first`], doubling after each
//!   failure up to [`ReopenBackoff::max`], and tries again until the open succeeds (the volume
//!   turns `running`: its device is attached, or the QUIESCED device a crashed daemon left is
//!   taken over and the I/O the kernel held meanwhile resumes), fails for another reason (the
//!   volume turns `failed` with that reason), or the volume is no longer this entry (removed
//!   with `force`/`purge`, or replaced by a create after such a remove) or the manager shuts
//!   down.
//! - Every attempt runs under the manager's `admin` lock, like create, remove and restore:
//!   a remove never deletes a cache directory while an attempt opens it, and an attempt never
//!   opens a volume that a remove has dropped.
//! - While recovering, nothing of the volume is open: its local cache is untouched on disk
//!   (writes the WAL made durable stay there), flush and a plain remove answer
//!   `store_unavailable` (503), a remove with `force` or `purge` goes ahead.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::{Entry, EntryState, ManagerError, VolumeManager};
use crate::daemon::logging::chain;

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
    fn next(&self, prev: Duration) -> Duration {
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

/// What one attempt did.
enum Attempt {
    Opened,
    Again,
    Stop,
}

impl VolumeManager {
    /// Starts the task that re-opens `entry` (see the module docs).
    pub(super) fn spawn_reopen(self: &Arc<Self>, entry: Arc<Entry>) {
        let manager: Weak<Self> = Arc::downgrade(self);
        let mut stop = self.stop.subscribe();
        let backoff = self.opts.reopen;
        tokio::spawn(async move {
            let name = entry.spec.name.clone();
            let mut delay = backoff.first;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                let Some(manager) = manager.upgrade() else {
                    return;
                };
                match manager.reopen_once(&entry).await {
                    Attempt::Opened | Attempt::Stop => return,
                    Attempt::Again => {
                        delay = backoff.next(delay);
                        tracing::warn!(volume = %name, retry_in_ms = delay.as_millis() as u64, "volume still recovering: the object store does not answer");
                    }
                }
            }
        });
    }

    /// One attempt to open a recovering volume, under the admin lock.
    async fn reopen_once(&self, entry: &Arc<Entry>) -> Attempt {
        let admin = self.admin.lock().await;
        if *admin {
            return Attempt::Stop;
        }
        let registered = self.volumes.read().get(&entry.spec.name).cloned();
        if !registered.is_some_and(|r| Arc::ptr_eq(&r, entry)) {
            return Attempt::Stop;
        }
        let attempts = match &*entry.state.lock() {
            EntryState::Recovering { attempts, .. } => *attempts,
            _ => return Attempt::Stop,
        };
        let name = &entry.spec.name;
        match self
            .open_volume(&entry.spec, &entry.dir, &entry.flush, false, None)
            .await
        {
            Ok(open) => {
                let open = Arc::new(open);
                let id = open.device_id();
                tracing::info!(volume = %name, device = ?id, attempts = attempts + 1, "volume re-attached: the object store answers again");
                if id.is_some() && id != entry.spec.device_id {
                    // Record the new device id: the entry is replaced by one with that spec.
                    let mut spec = entry.spec.clone();
                    spec.device_id = id;
                    let replaced = Arc::new(Entry {
                        spec,
                        dir: entry.dir.clone(),
                        flush: entry.flush.clone(),
                        state: Mutex::new(EntryState::Open(open.clone())),
                    });
                    *entry.state.lock() = EntryState::Open(open);
                    self.volumes.write().insert(name.clone(), replaced);
                    if let Err(e) = self.persist().await {
                        tracing::error!(volume = %name, error = %chain(&e), "recording the new device id failed");
                    }
                } else {
                    *entry.state.lock() = EntryState::Open(open);
                }
                drop(admin);
                Attempt::Opened
            }
            Err(e) if worth_retrying(&e) => {
                *entry.state.lock() = EntryState::Recovering {
                    attempts: attempts + 1,
                    error: e.to_string(),
                };
                Attempt::Again
            }
            Err(e) => {
                tracing::error!(volume = %name, error = %chain(&e), "volume could not be re-attached");
                *entry.state.lock() = EntryState::Failed(format!(
                    "re-attach failed after {} attempts: {e}",
                    attempts + 1
                ));
                Attempt::Stop
            }
        }
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
