//! Re-opening, in the background, the volumes that could not be opened at start because the
//! object store did not answer (an outage, a network not up yet).
//!
//! Contract:
//! - [`VolumeManager::restore`] tries each volume once. A volume whose open failed with
//!   `store_unavailable` is registered as [`EntryState::Recovering`] (state `recovering` in the
//!   API, `glidefs_volume_recovering 1` in the metrics, the last error in `error`) and one task
//!   per such volume re-opens it: it sleeps [`ReopenBackoff::first`](super::recovering::ReopenBackoff::first), doubling after each
//!   failure up to [`ReopenBackoff::max`](super::recovering::ReopenBackoff::max), and tries again until the open succeeds (the volume
//!   turns `running`: its device is attached, or the QUIESCED device a crashed daemon left is
//!   taken over and the I/O the kernel held meanwhile resumes), fails for another reason (the
//!   volume turns `failed` with that reason), or the volume is no longer this entry (removed
//!   with `force`/`purge`, or replaced by a create after such a remove) or the manager shuts
//!   down.
//! - An attempt does not hold the manager's `admin` lock: a store that does not answer (each
//!   call hanging until its timeout and retries run out) holds up no create, remove or
//!   shutdown. It runs under its entry's [`ReopenGate`](super::recovering::ReopenGate) instead: a remove with `force` or
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

use super::recovering::worth_retrying;
use super::{Entry, EntryState, VolumeManager};
use glidefs_model::log::chain;

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

    /// One attempt to open a recovering volume, under its [`ReopenGate`](super::recovering::ReopenGate) (not the admin lock:
    /// see the module docs).
    async fn reopen_once(&self, entry: &Arc<Entry>) -> Attempt {
        let gate = &entry.reopen;
        let _attempt = gate.attempt().await;
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
