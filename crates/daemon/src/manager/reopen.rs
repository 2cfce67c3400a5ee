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
//! - An attempt does not hold the manager's `admin` lock: a store that does not answer (each
//!   call hanging until its timeout and retries run out) holds up no create, remove or
//!   shutdown. It runs under its entry's [`ReopenGate`] instead: a remove with `force` or
//!   `purge` and a shutdown stop the gate first, which cancels the attempt at its next await
//!   (its store calls are dropped; an open that got through the store but not yet to its
//!   device is closed again), waits for it to end (a device step in flight, bounded, is let
//!   finish, and the volume it opened is then torn down by the remover like any open one),
//!   and only then delete the cache directory or close the volume. So a remove never
//!   deletes a cache directory an attempt still opens through the async runtime, and an
//!   attempt never opens a volume that a remove has dropped. (A cancel that lands while the
//!   attempt replays the cache on the blocking pool lets that replay run out beside the
//!   remove: the forced remove may then find the directory not empty and answer so; a remove
//!   with `force` again finishes.)
//! - While recovering, nothing of the volume is open: its local cache is untouched on disk
//!   (writes the WAL made durable stay there), flush and a plain remove answer
//!   `store_unavailable` (503), a remove with `force` or `purge` goes ahead.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Entry, EntryState, ManagerError, VolumeManager};
use glidefs_model::log::chain;

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

    fn stopped(&self) -> bool {
        *self.cancel.borrow()
    }

    async fn wait_stopped(&self) {
        let mut rx = self.cancel.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }
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
                    () = entry.reopen.wait_stopped() => return,
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

    /// One attempt to open a recovering volume, under its [`ReopenGate`] (not the admin lock:
    /// see the module docs).
    async fn reopen_once(&self, entry: &Arc<Entry>) -> Attempt {
        let gate = &entry.reopen;
        let _attempt = gate.attempt.lock().await;
        if gate.stopped() || *self.stop.borrow() {
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
        // The store I/O of the open: cut short by a forced remove or a shutdown.
        let engine = tokio::select! {
            r = self.open_engine(&entry.spec, &entry.dir, false, None) => r,
            () = gate.wait_stopped() => {
                tracing::info!(volume = %name, "re-open attempt cancelled: the volume is being removed or the daemon stops");
                return Attempt::Stop;
            }
        };
        let opened = match engine {
            Ok(volume) if gate.stopped() => {
                if let Err(e) = volume.close().await {
                    tracing::warn!(volume = %name, error = %chain(&e), "close of a cancelled re-open");
                }
                return Attempt::Stop;
            }
            Ok(volume) => self.start_volume(&entry.spec, volume, &entry.flush).await,
            Err(e) => Err(e),
        };
        match opened {
            Ok(open) => {
                let open = Arc::new(open);
                let id = open.device_id();
                tracing::info!(volume = %name, device = ?id, attempts = attempts + 1, "volume re-attached: the object store answers again");
                let new_id = id.is_some() && id != entry.spec.device_id;
                if new_id {
                    // Record the new device id: the entry is replaced by one with that spec
                    // (while it is still the registered one: a remove waits for this attempt).
                    let mut spec = entry.spec.clone();
                    spec.device_id = id;
                    let replaced = Arc::new(Entry::new(
                        spec,
                        entry.dir.clone(),
                        entry.flush.clone(),
                        EntryState::Open(open.clone()),
                    ));
                    let mut volumes = self.volumes.write();
                    if volumes.get(name).is_some_and(|r| Arc::ptr_eq(r, entry)) {
                        volumes.insert(name.clone(), replaced);
                    }
                }
                *entry.state.lock() = EntryState::Open(open);
                drop(_attempt);
                if new_id {
                    // Every state.json write is under the admin lock (in registry order).
                    let _admin = self.admin.lock().await;
                    if let Err(e) = self.persist().await {
                        tracing::error!(volume = %name, error = %chain(&e), "recording the new device id failed");
                    }
                }
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
