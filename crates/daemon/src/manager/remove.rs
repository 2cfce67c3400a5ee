//! Remove (`purge=false`, `force=false`): flush to the store while the device still serves (a
//! failure leaves the volume untouched; the bulk of it before taking `admin`, so other creates
//! and removes do not wait behind the upload), refuse with `device_busy` while something has the
//! block device open (a mounted filesystem: [`Exporter::stop_if_unused`]; the volume is left
//! serving), stop the flusher and the device, flush the tail, close, delete the cache
//! directory, rewrite `state.json`. `force=true` skips both flushes (local data not in the
//! store is lost) and the in-use check; `purge=true` skips the flushes too (not the in-use
//! check) and, recorded as pending in `state.json` first, deletes every object under the
//! volume's store prefix (a crash half way is finished at the next start, [`pending`]).
//! If the tail flush (or the release after it) fails, the volume stays listed as `failed` with its cache directory kept
//! and the volume still open, without device or flusher (`EntryState::Stopped`): a plain
//! remove again retries the flush and finishes, `force` or `purge` drop it, and a shutdown
//! closes it (it stays in `state.json`, so the next start serves it again). If only deleting
//! the cache directory fails, the volume is closed already: `EntryState::Closed`, and a remove
//! again (a plain one when the first flushed) deletes the directory. A
//! `recovering` volume is not open: a plain remove answers `store_unavailable`, `force` or
//! `purge` cancel its re-open attempt (without waiting for the store), then remove it. Once a remove (or a shutdown) starts
//! stopping a volume, other calls on it answer `volume_closing` (409), and so do calls it
//! overtook, whatever the engine said (closed, released, objects purged); once it is gone,
//! `not_found`.
//!

use std::sync::Arc;

use glidefs_model::api::RemoveReport;

use super::error::Detail;
use super::{
    device_step, flusher, recovering, remove_dir, state, EntryState, ManagerError, Open,
    VolumeManager,
};

impl VolumeManager {
    /// Refuses a remove while something has the volume's block device open (a mounted
    /// filesystem): [`Exporter::stop_if_unused`], bounded like every device step. The device
    /// keeps serving after a refusal; after `Ok` it may be stopped already.
    async fn stop_if_unused(&self, name: &str, open: &Open) -> Result<(), ManagerError> {
        let Some(id) = open.device_id() else {
            return Ok(());
        };
        let devices = self.devices.clone();
        let volume = name.to_string();
        device_step(name, "stop if unused", move || {
            Ok(devices.stop_if_unused(&volume, id)?)
        })
        .await
    }

    /// Removes a volume; see the module docs. Runs to its end even when the caller stops
    /// waiting.
    pub async fn remove(
        self: &Arc<Self>,
        name: &str,
        purge: bool,
        force: bool,
    ) -> Result<RemoveReport, ManagerError> {
        let name = name.to_string();
        self.detached("remove", move |m| async move {
            m.remove_now(&name, purge, force).await
        })
        .await
    }

    async fn remove_now(
        &self,
        name: &str,
        purge: bool,
        force: bool,
    ) -> Result<RemoveReport, ManagerError> {
        let skip_flush = purge || force;
        let shutting_down = || *self.stop.borrow();
        if shutting_down() {
            return Err(ManagerError::ShuttingDown);
        }
        if !skip_flush {
            // The bulk of the upload, before `admin` (as a `flush` call beside the remove
            // would): other creates and removes need not wait behind it. The flush under
            // `admin` below then uploads only what was written meanwhile.
            let early = self
                .entry(name)
                .ok()
                .and_then(|e| Some((e.open().ok()?, e)));
            if let Some((open, entry)) = early {
                flusher::flush_now(&open.volume, &entry.flush)
                    .await
                    .map_err(|e| match shutting_down() {
                        // The shutdown closed the volume under this flush.
                        true => ManagerError::ShuttingDown,
                        false => ManagerError::from_volume(name, "flush before remove", e),
                    })?;
            }
        }
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let entry = match self.entry(name) {
            Err(ManagerError::NotFound { .. }) if purge && self.interrupted(name) => {
                // A create or clone that a crash (or a store outage) interrupted.
                let purged_objects = self.purge_interrupted(name).await?;
                drop(admin);
                return Ok(RemoveReport {
                    name: name.to_string(),
                    purged_objects,
                });
            }
            other => other?,
        };
        if purge {
            self.check_purge(&entry.spec).await?;
        }
        if skip_flush && matches!(*entry.state.lock(), EntryState::Recovering { .. }) {
            // Cancel the re-open attempt (one waiting on the store is dropped) and wait for
            // it to end; the state read below is then what it left (`Open` if it got there).
            entry.reopen.stop().await;
        }
        let state = entry.state.lock().clone();
        match state {
            EntryState::Open(open) => {
                if !skip_flush {
                    flusher::flush_now(&open.volume, &entry.flush)
                        .await
                        .map_err(|e| ManagerError::from_volume(name, "flush before remove", e))?;
                }
                if !force {
                    self.stop_if_unused(name, &open).await?;
                }
                self.teardown(&entry, &open, skip_flush).await?;
            }
            // Flush (or release) again; with force or purge, close it unflushed.
            EntryState::Stopped { open, .. } => {
                self.teardown(&entry, &open, skip_flush).await?;
            }
            EntryState::Failed(reason)
            | EntryState::Closed {
                in_store: false,
                reason,
            } if !skip_flush => {
                return Err(ManagerError::Failed {
                    name: name.to_string(),
                    reason: format!(
                        "{reason}; its local cache may hold data not in the store: remove with force=true or purge=true"
                    ),
                });
            }
            EntryState::Recovering { attempts, error } if !skip_flush => {
                return Err(ManagerError::StoreUnavailable {
                    name: name.to_string(),
                    detail: Detail::new(format!(
                        "{}; its local cache may hold data not in the store: wait for it to open, or remove with force=true or purge=true",
                        recovering::recovering_message(attempts, &error)
                    )),
                });
            }
            // The re-open task of a recovering volume sees the entry gone and ends.
            // A closed volume whose directory is left: only that is to do.
            EntryState::Failed(_) | EntryState::Recovering { .. } | EntryState::Closed { .. } => {}
        }
        if purge {
            // Before anything is deleted: a crash from here on finishes the purge at the
            // next start instead of serving a half-deleted volume.
            let op = state::Pending::Purge {
                spec: entry.spec.clone(),
            };
            self.pending
                .lock()
                .insert(name.to_string(), state::Record::live(op));
            self.persist().await?;
        }
        if let Err(e) = remove_dir(&entry.dir).await {
            // The volume is closed: say so instead of looking `running` (later calls would
            // fail with `closed`), and what a remove again does.
            let (in_store, advice) = match skip_flush {
                false => (true, "every write is in the store: remove again"),
                true => (false, "remove with force=true or purge=true again"),
            };
            *entry.state.lock() = EntryState::Closed {
                in_store,
                reason: format!("device stopped and volume closed, but {e}; {advice}"),
            };
            return Err(e);
        }
        let purged_objects = if purge {
            match self.purge(&entry.spec).await {
                Ok(n) => n,
                Err(e) => {
                    // The device and the cache are gone already: say so instead of looking
                    // `running`; a later remove with purge finishes the job.
                    *entry.state.lock() = EntryState::Failed(format!(
                        "device and local cache removed, but purging the store failed ({e}): remove with purge=true again"
                    ));
                    self.pending
                        .lock()
                        .entry(name.to_string())
                        .and_modify(|r| r.live = false);
                    return Err(e);
                }
            }
        } else {
            0
        };
        self.volumes.write().remove(name);
        self.pending.lock().remove(name);
        self.persist().await?;
        drop(admin);
        tracing::info!(volume = %name, purge, force, purged_objects, "volume removed");
        Ok(RemoveReport {
            name: name.to_string(),
            purged_objects,
        })
    }
}
