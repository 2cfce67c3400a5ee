//! Creates, clones and purges that a crash (or a store outage) must not leave half done: each
//! is recorded in `state.json` ([`state::Pending`]) before its first store write, and the
//! write that registers (or drops) the volume drops the record.
//!
//! Contract:
//! - A create or clone that fails has its claim undone (only what this daemon wrote, see
//!   `undo_claim`; a clone's registration under its snapshot too). When that cannot be done
//!   (the store does not answer), the record stays: the name is *interrupted*.
//! - At start ([`VolumeManager::restore`]) every record is a crash's leftover: an interrupted
//!   create or clone is undone (its cache directory deleted, its objects purged when every
//!   generation is this daemon's, a clone's registration dropped so its snapshot is unpinned),
//!   an interrupted purge is finished and the volume is not opened (a half-deleted volume is
//!   never served), unless another daemon holds the name now (created again, or taken over:
//!   a purge never deletes what another daemon holds), when the name is dropped here; one
//!   that fails again stays recorded (a purge's volume listed `failed`).
//! - While a record is live (its call still runs, its undo too), a create of the name is
//!   refused as a duplicate: an undo never meets a volume acknowledged meanwhile.
//! - `DELETE ?purge=true` of an interrupted create or clone (not registered) undoes it now.

use std::collections::BTreeMap;

use glidefs_objstore::CloneOrigin;

use super::state::{Pending, Record};
use super::{remove_dir, Entry, EntryState, FlushStats, ManagerError, VolumeManager, VolumeSpec};
use glidefs_model::log::chain;
use std::sync::Arc;

impl VolumeManager {
    /// The records to persist, by name.
    pub(super) fn pending_ops(&self) -> Vec<Pending> {
        self.pending.lock().values().map(|r| r.op.clone()).collect()
    }

    /// Whether a call of this daemon still runs the create, clone or purge of `name`
    /// (including the undo of a failed create or clone): the name is taken meanwhile.
    pub(super) fn pending_live(&self, name: &str) -> bool {
        self.pending.lock().get(name).is_some_and(|r| r.live)
    }

    /// Whether `name` is a create or clone left interrupted (no call of this daemon runs it).
    pub(super) fn interrupted(&self, name: &str) -> bool {
        self.pending.lock().get(name).is_some_and(|r| {
            !r.live && matches!(r.op, Pending::Create { .. } | Pending::Clone { .. })
        })
    }

    /// Undoes the interrupted create or clone `name` (`DELETE ?purge`); under the admin lock.
    pub(super) async fn purge_interrupted(&self, name: &str) -> Result<u64, ManagerError> {
        let Some(record) = self.pending.lock().get(name).cloned() else {
            return Err(ManagerError::NotFound {
                name: name.to_string(),
            });
        };
        remove_dir(&self.opts.volumes_dir.join(name)).await?;
        let purged = self.undo_pending(&record.op).await?;
        self.pending.lock().remove(name);
        self.persist().await?;
        tracing::info!(volume = %name, purged, "interrupted create purged");
        Ok(purged)
    }

    /// After a failed create or clone of a new volume (not under the admin lock): undoes its
    /// claim and drops the record, or, when the store cannot be asked, leaves the record
    /// (the name is interrupted: a restart or `DELETE ?purge` undoes it).
    pub(super) async fn undo_failed_create(&self, name: &str) {
        let Some(record) = self.pending.lock().get(name).cloned() else {
            return;
        };
        let undone = self.undo_pending(&record.op).await;
        let _admin = self.admin.lock().await;
        match undone {
            Ok(_) => {
                // Its own record only (live throughout, so no other call took the name).
                let mine = |r: &Record| r.live && r.op == record.op;
                let drop_it = self.pending.lock().get(name).is_some_and(mine);
                if drop_it {
                    self.pending.lock().remove(name);
                }
                if let Err(e) = self.persist().await {
                    tracing::warn!(volume = %name, error = %chain(&e), "dropping the record of an undone create failed; the next start undoes it again");
                }
            }
            Err(e) => {
                tracing::warn!(volume = %name, error = %chain(&e), "could not undo the claim of a failed create: it is undone at the next start, or by a remove with purge");
                if let Some(r) = self
                    .pending
                    .lock()
                    .get_mut(name)
                    .filter(|r| r.op == record.op)
                {
                    r.live = false;
                }
            }
        }
    }

    /// Undoes a create or clone (what this daemon wrote), or finishes a purge; returns how
    /// many objects were deleted.
    async fn undo_pending(&self, op: &Pending) -> Result<u64, ManagerError> {
        match op {
            Pending::Purge { spec } => self.purge(spec).await,
            Pending::Create { spec } => self.undo_claim(spec).await,
            Pending::Clone { spec, from } => {
                let purged = self.undo_claim(spec).await?;
                // A crash between the registration and generation 1 leaves a registration
                // (and maybe an origin record) with nothing published: drop them, so the
                // snapshot is no longer pinned. A published clone is left to its owner.
                let vstore = self.volume_store(spec)?;
                let fail = super::snapshots::store_err(&spec.name, "undo clone");
                if vstore.latest_generation().await.map_err(&fail)? == 0 {
                    let origin = CloneOrigin {
                        volume: from.volume.clone(),
                        snapshot: from.snapshot.clone(),
                        generation: 0,
                    };
                    vstore.unregister_clone(&origin).await.map_err(fail)?;
                }
                Ok(purged)
            }
        }
    }

    /// At start, under the admin lock: deals with what a crash interrupted (see the module
    /// docs); returns the volumes to open (without those whose purge was interrupted) and
    /// whether `state.json` must be written again.
    pub(super) async fn resume_pending(
        &self,
        specs: Vec<VolumeSpec>,
        pending: Vec<Pending>,
    ) -> (Vec<VolumeSpec>, bool) {
        let mut changed = false;
        let mut purging = BTreeMap::new();
        for op in pending {
            let name = op.spec().name.clone();
            let dir = self.opts.volumes_dir.join(&name);
            let listed = specs.iter().any(|s| s.name == name);
            let undone = match &op {
                // A create whose registration was written is done (the record is stale).
                Pending::Create { .. } | Pending::Clone { .. } if listed => Ok(0),
                _ => match remove_dir(&dir).await {
                    Ok(()) => self.undo_pending(&op).await,
                    Err(e) => Err(e),
                },
            };
            // A purge whose name another daemon holds now (it created the name again, or took
            // the half-purged volume over): what was this daemon's is gone; theirs is left.
            let undone = match undone {
                Err(ManagerError::OwnedElsewhere { detail, .. })
                    if matches!(op, Pending::Purge { .. }) =>
                {
                    tracing::warn!(volume = %name, %detail, "an interrupted purge is not finished: another daemon holds the name now; this daemon drops it");
                    Ok(0)
                }
                other => other,
            };
            match undone {
                Ok(n) => {
                    tracing::warn!(volume = %name, ?op, purged = n, "an operation a crash interrupted is finished (a purge) or undone (a create or clone)");
                    changed = true;
                    if matches!(op, Pending::Purge { .. }) {
                        purging.insert(name, None);
                    }
                }
                Err(e) => {
                    tracing::error!(volume = %name, error = %chain(&e), "an operation a crash interrupted could not be finished or undone; tried again at the next start, or by a remove with purge");
                    if matches!(op, Pending::Purge { .. }) {
                        purging.insert(name.clone(), Some(e.to_string()));
                    }
                    self.pending.lock().insert(name, Record { op, live: false });
                }
            }
        }
        let mut open = Vec::with_capacity(specs.len());
        for spec in specs {
            match purging.get(&spec.name) {
                None => open.push(spec),
                Some(None) => {}
                Some(Some(error)) => {
                    let reason = format!("a purge a crash interrupted could not finish ({error}): remove with purge=true again");
                    let entry = Entry::new(
                        spec.clone(),
                        self.opts.volumes_dir.join(&spec.name),
                        Arc::new(FlushStats::default()),
                        EntryState::Failed(reason),
                    );
                    self.volumes.write().insert(spec.name, Arc::new(entry));
                }
            }
        }
        (open, changed)
    }
}
