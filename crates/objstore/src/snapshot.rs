//! Snapshots and clones: named, pinned manifest generations, and volumes that start from one.
//!
//! ```text
//! volumes/<v>/snapshots/<s>/record          {name, generation, created_unix, ...}, created once
//! volumes/<v>/snapshots/<s>/deleting        a delete of <s> in progress
//! volumes/<v>/snapshots/<s>/clones/<c>      volume <c> was cloned from <s>
//! volumes/<v>/snapshots/<s>/views/<id>       a read-only view of <s> is open {holder, ...}
//! volumes/<c>/origin                        {volume: v, snapshot: s, generation}
//! ```
//!
//! Contracts:
//! - **A snapshot pins its generation.** GC keeps the manifest of every recorded snapshot (and
//!   so every pack it maps), whatever its age (`gc.rs`). The engine writes the record while it
//!   holds its flusher's lock, naming the generation it has just published, which is then the
//!   newest manifest. GC lists the manifests *before* the snapshots: a GC that listed a
//!   newer manifest ran its snapshot listing after the record was written, and a GC whose
//!   newest manifest is the snapshot's keeps it anyway (the newest is always kept).
//! - **A clone never copies data up front.** Its generation 1 maps every block of the
//!   snapshot to the origin's packs by foreign id (`<origin>/<pack>`, see [`PackId`]); its
//!   own flushes add its own packs. Reads need nothing else; GC and compaction of the clone
//!   never touch a foreign pack.
//! - **A snapshot with clones is not deleted.** Clone creation: register the clone under the
//!   snapshot, write the clone's origin record, publish its generation 1 (given up right before
//!   its PUT, undone, when half of `StoreConfig::clone_deadline` passed since the registration
//!   was sent; a generation 1 the PUT did not create itself, found byte-identical, may be a
//!   twin creation's and is never undone while a registration pins it), then
//!   check that the snapshot's record is there *with the generation the clone maps*, that no
//!   delete is in progress and that the clone's own registration is still there (else undo
//!   and fail: a snapshot deleted and re-created under the same name pins other packs).
//!   Snapshot deletion (`unpin`): write `deleting`, list the clones, refuse while one has
//!   published (generation 1 read by key, so a stale listing cannot hide it: a clone's GC
//!   keeps its generation 1) or while one
//!   without a manifest was registered less than `clone_deadline` ago by the store's clock
//!   (the marker's own time: a creation that may still publish, whose creator may die right
//!   after), changing nothing else; otherwise clear the registrations older than that (a
//!   creation that died: it can no longer publish), delete the record, then the marker.
//!   Whichever of the two checks comes second sees the other's first step, and a
//!   registration is never cleared while its clone may publish, so a clone never outlives
//!   the pin on its packs. Purging a volume ([`VolumeStore::purge`]) takes each of its
//!   snapshots through the same protocol first, and withdrawing a record (see
//!   `check_newest`) too.
//! - **A snapshot with an open view is not deleted** (issue 45 item 5: a view on another host
//!   reads the snapshot's packs cold, long after it opened). A view registers under the
//!   snapshot ([`VolumeStore::register_view`]): it PUTs `views/<id>` ([`ViewRegistration`]:
//!   holder, generation, lease), then checks that no `deleting` marker is there and *then*
//!   that the record is there at the generation it serves (in that order: a whole delete run
//!   between two reads in the other order would pass), and backs out (deletes its
//!   registration, fails with [`SnapshotProblem::Deleting`] or `NotFound`) otherwise. The
//!   delete (`unpin`) lists the views after writing its markers, so whichever comes second
//!   sees the other: a delete that listed before the view's PUT left its marker for the
//!   view's check, or already deleted the record. Markers: each delete writes its own
//!   (`deletes/<token>`) and the shared `deleting`; a refused delete removes its own, and
//!   the shared one only when no other delete's own marker younger than `clone_deadline` is
//!   there (two deletes at once: the refused one must not lift the marker the other relies
//!   on); "being deleted" is either kind. A dead delete's own marker keeps a refused retry
//!   from lifting the shared one until it is `clone_deadline` old (the snapshot pins
//!   meanwhile; views and clones of it wait). A registration is a lease: the holder
//!   renews it ([`VolumeStore::renew_view`]: the same PUT, then the record checked, never the
//!   marker: the registration was there all along, so any delete under way lists it and is
//!   refused) every third of its lease while open and deletes it
//!   when it closes; `unpin` refuses with [`SnapshotProblem::Attached`] (naming the holders)
//!   while one was stored less than its lease ago by the store's clock (its last-modified
//!   time against the marker's), and clears the expired ones (a holder that died, or lost
//!   the store for a whole lease: such a view's renewal then finds the snapshot gone and
//!   reports that it lost its pin). An operator clears a dead holder's registrations at
//!   once with [`VolumeStore::clear_views`]. The id is derived from the holder and the
//!   opener's instance (its cache directory): a view reopened after a crash replaces its own
//!   registration instead of leaving a second one.
//! - A `deleting` marker without a record (a delete that died at its last step) is cleared by
//!   the next `create_snapshot` of that name.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::{ErrorKind, ObjStoreError, SnapshotProblem};
use crate::location::validate_volume_name;
use crate::manifest::{Manifest, ManifestOwner};
use crate::publish::Landed;
use crate::retry::with_retry;
use crate::store::VolumeStore;

/// A time as the object store records it (`ObjectMeta::last_modified`).
type StoreTime = SystemTime;

/// One snapshot as recorded in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The snapshot's name (same rules as a volume name).
    pub name: String,
    /// The manifest generation it freezes.
    pub generation: u64,
    /// When it was taken (seconds since the Unix epoch, the taker's clock).
    pub created_unix: u64,
    /// Size and block size of the volume at that generation.
    pub volume_size: u64,
    pub block_size: u32,
}

/// A snapshot with what hangs on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub record: SnapshotRecord,
    /// A delete started and did not finish (a retry of the delete completes it).
    pub deleting: bool,
    /// Volumes registered as cloned from it (a registration whose clone never published is
    /// listed too until a delete clears it).
    pub clones: Vec<String>,
}

/// A read-only view's registration under its snapshot (`snapshots/<s>/views/<id>`). When it
/// was stored is the object's last-modified time (the store's clock), not a field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewRegistration {
    /// Who holds the view (the daemon's owner id, `<host>/<uuid>`), as an operator names it to
    /// clear a dead host's registrations.
    pub holder: String,
    /// The snapshot generation the view serves.
    pub generation: u64,
    /// The lease: a registration not renewed for this long no longer blocks a delete.
    pub lease_ms: u64,
}

/// One registration as listed: its id, its content, and when it was stored (renewed), by the
/// store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewEntry {
    pub id: String,
    pub registration: ViewRegistration,
    pub stored: SystemTime,
}

/// The registration id of a view held by `holder` from `instance` (hex, 32 characters).
pub fn view_id(holder: &str, instance: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(holder.as_bytes());
    h.update([0u8]);
    h.update(instance.as_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where a clone came from (`volumes/<clone>/origin`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneOrigin {
    pub volume: String,
    pub snapshot: String,
    pub generation: u64,
}

fn problem(volume: &str, name: &str, problem: SnapshotProblem) -> ObjStoreError {
    ObjStoreError::Snapshot {
        volume: volume.to_string(),
        name: name.to_string(),
        problem,
    }
}

/// Checks a snapshot name (the volume name rules: it is one path segment).
pub fn validate_snapshot_name(volume: &str, name: &str) -> Result<(), ObjStoreError> {
    validate_volume_name(name).map_err(|_| problem(volume, name, SnapshotProblem::InvalidName))
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl VolumeStore {
    fn snapshot_path(&self, name: &str, leaf: &str) -> Path {
        self.layout.snapshot_dir().join(name).join(leaf)
    }

    fn clone_path(&self, name: &str, clone: &str) -> Path {
        self.layout
            .snapshot_dir()
            .join(name)
            .join("clones")
            .join(clone)
    }

    fn view_path(&self, name: &str, id: &str) -> Path {
        self.layout.snapshot_dir().join(name).join("views").join(id)
    }

    /// A store for another volume of the same object store, configuration and key (a clone
    /// reads its origin's frames with the origin's key).
    pub fn sibling(&self, volume: &str) -> Result<VolumeStore, ObjStoreError> {
        Ok(
            VolumeStore::new(self.store.clone(), volume, self.cfg.clone())?
                .with_key(self.key.clone()),
        )
    }

    pub(crate) async fn get_opt(
        &self,
        path: &Path,
        op: &'static str,
    ) -> Result<Option<Bytes>, ObjStoreError> {
        match with_retry(&self.cfg, op, path.as_ref(), |_| async {
            self.store.get(path).await?.bytes().await
        })
        .await
        {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn put(
        &self,
        path: &Path,
        bytes: Bytes,
        op: &'static str,
    ) -> Result<(), ObjStoreError> {
        with_retry(&self.cfg, op, path.as_ref(), |_| {
            self.store.put_opts(
                path,
                PutPayload::from(bytes.clone()),
                PutOptions::from(PutMode::Overwrite),
            )
        })
        .await
        .map(|_| ())
    }

    pub(crate) async fn delete_path(
        &self,
        path: &Path,
        op: &'static str,
    ) -> Result<(), ObjStoreError> {
        match with_retry(&self.cfg, op, path.as_ref(), |_| self.store.delete(path)).await {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Records snapshot `name` of `generation`, which must be a published manifest of this
    /// volume; see the module docs for why the caller must hold its flusher's lock with
    /// `generation` the newest manifest. The record is created at most once: a name already
    /// taken is [`SnapshotProblem::Exists`] (a retry of this call's own PUT after a lost
    /// reply recognises its own bytes).
    pub async fn create_snapshot(
        &self,
        name: &str,
        generation: u64,
    ) -> Result<SnapshotRecord, ObjStoreError> {
        self.create_snapshot_sized(name, generation, 0).await
    }

    /// [`Self::create_snapshot`], recording the volume as `volume_size` bytes when that is
    /// more than the manifest's (a volume grown since its last publish: the blocks past the
    /// manifest's end were never written, so they read as zeros at that size too).
    pub async fn create_snapshot_sized(
        &self,
        name: &str,
        generation: u64,
        volume_size: u64,
    ) -> Result<SnapshotRecord, ObjStoreError> {
        validate_snapshot_name(&self.volume, name)?;
        self.check_newest(generation, name, false).await?;
        // A marker without a record is what a delete that died at its last step leaves: the
        // name is free, and a new snapshot must not be born "deleting".
        if self.deleting(name).await?
            && self
                .get_opt(&self.snapshot_path(name, "record"), "get snapshot")
                .await?
                .is_none()
        {
            for meta in self.delete_markers(name).await? {
                self.delete_path(&meta.location, "delete stale snapshot delete marker")
                    .await?;
            }
            self.delete_path(
                &self.snapshot_path(name, "deleting"),
                "delete stale snapshot marker",
            )
            .await?;
        }
        let m = self.fetch_manifest(generation).await?;
        let record = SnapshotRecord {
            name: name.to_string(),
            generation,
            created_unix: now_unix(),
            volume_size: m.volume_size.max(volume_size),
            block_size: m.block_size,
        };
        let bytes =
            Bytes::from(serde_json::to_vec(&record).map_err(|e| {
                ObjStoreError::InvalidInput(format!("snapshot record `{name}`: {e}"))
            })?);
        let path = self.snapshot_path(name, "record");
        let created = with_retry(&self.cfg, "put snapshot", path.as_ref(), |attempt| {
            let (bytes, path) = (&bytes, &path);
            async move {
                let put = self
                    .store
                    .put_opts(
                        path,
                        PutPayload::from(bytes.clone()),
                        PutOptions::from(PutMode::Create),
                    )
                    .await;
                match put {
                    // A retry finding exactly our record: the first attempt landed and its
                    // reply was lost.
                    Err(e @ object_store::Error::AlreadyExists { .. }) if attempt > 1 => {
                        let stored = self.store.get(path).await?.bytes().await?;
                        if stored == *bytes {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    }
                    other => other.map(|_| ()),
                }
            }
        })
        .await;
        match created {
            Ok(()) => {}
            Err(ObjStoreError::Store {
                source: object_store::Error::AlreadyExists { .. },
                ..
            }) => return Err(problem(&self.volume, name, SnapshotProblem::Exists)),
            Err(e) => return Err(e),
        }
        self.check_newest(generation, name, true).await?;
        tracing::info!(volume = %self.volume, snapshot = name, generation, "snapshot recorded");
        Ok(record)
    }

    /// `generation` must still be the newest manifest, before and after the record is written
    /// (a writer that lost the volume to another may not pin a generation the new owner's GC
    /// can prune: after the record, a newer manifest means the record is withdrawn).
    async fn check_newest(
        &self,
        generation: u64,
        name: &str,
        withdraw: bool,
    ) -> Result<(), ObjStoreError> {
        let newer = self.list_manifests(Some(generation)).await?;
        let Some((latest, _)) = newer.last() else {
            return Ok(());
        };
        if withdraw {
            // Through the delete protocol: a clone made from the record meanwhile either
            // keeps it (it stays, pinned) or fails its own check.
            match self.unpin(name).await {
                Ok(()) => {}
                Err(ObjStoreError::Snapshot { .. }) => {
                    tracing::warn!(volume = %self.volume, snapshot = name, generation, "a snapshot record written by a writer that lost the volume stays: a clone uses it")
                }
                Err(e) => return Err(e),
            }
        }
        Err(ObjStoreError::Fenced {
            volume: self.volume.clone(),
            generation,
            latest: *latest,
            reason:
                "a snapshot must name the newest generation, and another writer published after it",
        })
    }

    /// Snapshot `name`, or `None`.
    pub async fn snapshot(&self, name: &str) -> Result<Option<SnapshotInfo>, ObjStoreError> {
        validate_snapshot_name(&self.volume, name)?;
        let Some(record) = self.read_record(name).await? else {
            return Ok(None);
        };
        let deleting = self.deleting(name).await?;
        let clones = self.registered_clones(name).await?;
        Ok(Some(SnapshotInfo {
            record,
            deleting,
            clones,
        }))
    }

    /// The record of snapshot `name`, or `None`.
    async fn read_record(&self, name: &str) -> Result<Option<SnapshotRecord>, ObjStoreError> {
        let path = self.snapshot_path(name, "record");
        let Some(bytes) = self.get_opt(&path, "get snapshot").await? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            ObjStoreError::corrupt(
                path.as_ref(),
                crate::error::FormatError::Invalid {
                    what: "snapshot record",
                    detail: e.to_string(),
                },
            )
        })
    }

    async fn registered_clones(&self, name: &str) -> Result<Vec<String>, ObjStoreError> {
        Ok(self
            .registrations(name)
            .await?
            .into_iter()
            .map(|(clone, _)| clone)
            .collect())
    }

    /// The clones registered under snapshot `name`, with when each registration was stored
    /// (the store's clock), by name.
    async fn registrations(&self, name: &str) -> Result<Vec<(String, StoreTime)>, ObjStoreError> {
        let dir = self.snapshot_dir_of(name).join("clones");
        let listed: Vec<_> = with_retry(&self.cfg, "list clones", dir.as_ref(), |_| {
            self.store.list(Some(&dir)).try_collect::<Vec<_>>()
        })
        .await?;
        let mut clones: Vec<(String, StoreTime)> = listed
            .iter()
            .filter_map(|m| {
                let clone = m.location.prefix_match(&dir)?.next()?.as_ref().to_string();
                Some((clone, SystemTime::from(m.last_modified)))
            })
            .collect();
        clones.sort();
        Ok(clones)
    }

    fn snapshot_dir_of(&self, name: &str) -> Path {
        self.layout.snapshot_dir().join(name)
    }

    /// Every snapshot of the volume, by name (deleting ones included: they pin until gone).
    pub async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>, ObjStoreError> {
        // One listing names every record, marker and clone registration; then one GET per
        // record.
        let dir = self.layout.snapshot_dir();
        let listed: Vec<_> = with_retry(&self.cfg, "list snapshots", dir.as_ref(), |_| {
            self.store.list(Some(&dir)).try_collect::<Vec<_>>()
        })
        .await?;
        // name -> (has a record, deleting, clones)
        let mut found: std::collections::BTreeMap<String, (bool, bool, Vec<String>)> =
            Default::default();
        for meta in &listed {
            let Some(mut parts) = meta.location.prefix_match(&dir) else {
                continue;
            };
            let (Some(name), Some(leaf)) = (parts.next(), parts.next()) else {
                continue;
            };
            let entry = found.entry(name.as_ref().to_string()).or_default();
            match (leaf.as_ref(), parts.next(), parts.next()) {
                ("record", None, _) => entry.0 = true,
                ("deleting", None, _) | ("deletes", Some(_), None) => entry.1 = true,
                ("clones", Some(clone), None) => entry.2.push(clone.as_ref().to_string()),
                _ => {}
            }
        }
        let mut out = Vec::with_capacity(found.len());
        for (name, (recorded, deleting, mut clones)) in found {
            if !recorded {
                continue;
            }
            if let Some(record) = self.read_record(&name).await? {
                clones.sort();
                out.push(SnapshotInfo {
                    record,
                    deleting,
                    clones,
                });
            }
        }
        Ok(out)
    }

    /// The generations pinned by snapshots (GC keeps them).
    pub(crate) async fn pinned_generations(&self) -> Result<Vec<u64>, ObjStoreError> {
        Ok(self
            .list_snapshots()
            .await?
            .iter()
            .map(|s| s.record.generation)
            .collect())
    }

    /// Deletes snapshot `name`: refused with [`SnapshotProblem::HasClones`] while a clone of
    /// it exists, and with [`SnapshotProblem::Attached`] while a view's registration is
    /// within its lease (see the module docs). Stale registrations (a clone that never published) are
    /// cleared on the way. Deleting a snapshot that is not there is
    /// [`SnapshotProblem::NotFound`]. Its packs are released to the next GC pass.
    pub async fn delete_snapshot(&self, name: &str) -> Result<SnapshotRecord, ObjStoreError> {
        let Some(info) = self.snapshot(name).await? else {
            return Err(problem(&self.volume, name, SnapshotProblem::NotFound));
        };
        self.unpin(name).await?;
        tracing::info!(volume = %self.volume, snapshot = name, generation = info.record.generation, "snapshot deleted");
        Ok(info.record)
    }

    /// The delete protocol: its own marker (`deletes/<token>`) and the shared `deleting`
    /// marker first; then, unless a registered clone has published or a view's lease is live
    /// (refused: its own marker goes, and the shared one too unless another delete's live
    /// marker is there, nothing else changed: a registration without a manifest may be a
    /// creation that has yet to check, and it will see the marker), the expired view
    /// registrations, the registrations of clones that never published, the record, the
    /// markers. A refused delete never takes the shared marker from a delete still under way
    /// (which relies on it to turn views and clones away until its record is gone).
    async fn unpin(&self, name: &str) -> Result<(), ObjStoreError> {
        let token = format!("{:032x}", rand::random::<u128>());
        let own = self.snapshot_dir_of(name).join("deletes").join(token);
        self.put(
            &own,
            Bytes::from_static(b"deleting\n"),
            "put snapshot delete marker",
        )
        .await?;
        let marker = self.snapshot_path(name, "deleting");
        self.put(
            &marker,
            Bytes::from_static(b"deleting\n"),
            "put snapshot marker",
        )
        .await?;
        // The store's clock now: registrations are aged by it, never by this host's.
        let now = with_retry(&self.cfg, "head snapshot marker", marker.as_ref(), |_| {
            self.store.head(&marker)
        })
        .await
        .map(|meta| SystemTime::from(meta.last_modified))?;
        let (mut live, mut creating, mut stale) = (Vec::new(), Vec::new(), Vec::new());
        for (clone, registered) in self.registrations(name).await? {
            if self.sibling(&clone)?.has_published().await? {
                live.push(clone);
            } else if now
                .duration_since(registered)
                .map_or(true, |age| age < self.cfg.clone_deadline)
            {
                creating.push(clone);
            } else {
                stale.push(clone);
            }
        }
        let (mut holders, mut expired) = (Vec::new(), Vec::new());
        for v in self.views(name).await? {
            let lease = std::time::Duration::from_millis(v.registration.lease_ms);
            if now.duration_since(v.stored).map_or(true, |age| age < lease) {
                if !holders.contains(&v.registration.holder) {
                    holders.push(v.registration.holder);
                }
            } else {
                expired.push(v);
            }
        }
        holders.sort();
        let refused = if !live.is_empty() {
            Some(SnapshotProblem::HasClones { clones: live })
        } else if !creating.is_empty() {
            Some(SnapshotProblem::ClonesInCreation { clones: creating })
        } else if !holders.is_empty() {
            Some(SnapshotProblem::Attached { holders })
        } else {
            None
        };
        if let Some(refused) = refused {
            self.delete_path(&own, "delete snapshot delete marker")
                .await?;
            if !self.other_deletes(name, now).await? {
                self.delete_path(&marker, "delete snapshot marker").await?;
            }
            return Err(problem(&self.volume, name, refused));
        }
        for v in expired {
            tracing::warn!(volume = %self.volume, snapshot = name, id = %v.id, holder = %v.registration.holder, "clearing a view registration whose lease expired");
            self.unregister_view(name, &v.id).await?;
        }
        for clone in stale {
            tracing::warn!(volume = %self.volume, snapshot = name, clone, "clearing a clone registration whose clone never published");
            self.delete_path(&self.clone_path(name, &clone), "delete clone registration")
                .await?;
        }
        self.delete_path(&self.snapshot_path(name, "record"), "delete snapshot")
            .await?;
        self.delete_path(&own, "delete snapshot delete marker")
            .await?;
        self.delete_path(&marker, "delete snapshot marker").await
    }

    /// Whether another delete of snapshot `name` is under way: a `deletes/` marker younger
    /// than `StoreConfig::clone_deadline` by the store's clock (`now`). Older ones are what
    /// dead deletes left; they go.
    async fn other_deletes(&self, name: &str, now: SystemTime) -> Result<bool, ObjStoreError> {
        let mut live = false;
        for meta in self.delete_markers(name).await? {
            let age = now.duration_since(SystemTime::from(meta.last_modified));
            if age.map_or(true, |age| age < self.cfg.clone_deadline) {
                live = true;
            } else {
                self.delete_path(&meta.location, "delete stale snapshot delete marker")
                    .await?;
            }
        }
        Ok(live)
    }

    /// The per-delete markers of snapshot `name` (`deletes/<token>`).
    async fn delete_markers(&self, name: &str) -> Result<Vec<ObjectMeta>, ObjStoreError> {
        let dir = self.snapshot_dir_of(name).join("deletes");
        with_retry(
            &self.cfg,
            "list snapshot delete markers",
            dir.as_ref(),
            |_| self.store.list(Some(&dir)).try_collect::<Vec<_>>(),
        )
        .await
    }

    /// Whether snapshot `name` is being deleted: the shared marker (read by key), or any
    /// delete's own marker (a delete under way whose shared marker a refused delete took).
    async fn deleting(&self, name: &str) -> Result<bool, ObjStoreError> {
        let shared = self
            .get_opt(&self.snapshot_path(name, "deleting"), "get snapshot marker")
            .await?
            .is_some();
        Ok(shared || !self.delete_markers(name).await?.is_empty())
    }

    /// Registers a read-only view of snapshot `name` at `generation` held by `holder` (its
    /// id: [`view_id`] of `holder` and `instance`), with lease `StoreConfig::view_lease`,
    /// then checks that the snapshot is neither being deleted nor gone nor another snapshot
    /// of the same name; backs out otherwise ([`SnapshotProblem::Deleting`] or `NotFound`,
    /// the registration deleted). See the module docs. Returns the id. Renewing is the same
    /// call.
    pub async fn register_view(
        &self,
        name: &str,
        generation: u64,
        holder: &str,
        instance: &str,
    ) -> Result<String, ObjStoreError> {
        self.pin_view(name, generation, holder, instance, true)
            .await
    }

    /// Renews the registration [`Self::register_view`] made (the same PUT, which refreshes
    /// its lease), then checks that the record is still there at `generation`. A `deleting`
    /// marker does not make it back out, unlike a first registration: the registration has
    /// been there all along (unless it expired or was cleared), so a delete that put the
    /// marker lists it and is refused, and backing out would let that delete, or the next,
    /// through while the view reads on. Gone, or another snapshot of that name: the
    /// registration is deleted and `NotFound`/`Deleting` returned (the view lost its pin).
    pub async fn renew_view(
        &self,
        name: &str,
        generation: u64,
        holder: &str,
        instance: &str,
    ) -> Result<String, ObjStoreError> {
        self.pin_view(name, generation, holder, instance, false)
            .await
    }

    /// PUTs (or overwrites) the registration of view `(holder, instance)` of snapshot `name`
    /// at `generation`, with this store's lease, then checks the snapshot: on a `first`
    /// registration the markers first, then the record (see the module docs); on a renewal
    /// the record only. Refused: the registration is deleted again. Returns its id.
    async fn pin_view(
        &self,
        name: &str,
        generation: u64,
        holder: &str,
        instance: &str,
        first: bool,
    ) -> Result<String, ObjStoreError> {
        validate_snapshot_name(&self.volume, name)?;
        let id = view_id(holder, instance);
        let reg = ViewRegistration {
            holder: holder.to_string(),
            generation,
            lease_ms: u64::try_from(self.cfg.view_lease.as_millis()).unwrap_or(u64::MAX),
        };
        let bytes = serde_json::to_vec(&reg).map_err(|e| {
            ObjStoreError::InvalidInput(format!("view registration of `{name}`: {e}"))
        })?;
        let path = self.view_path(name, &id);
        self.put(&path, Bytes::from(bytes), "put view registration")
            .await?;
        let refused = if first && self.deleting(name).await? {
            Some(SnapshotProblem::Deleting)
        } else {
            match self.read_record(name).await? {
                Some(r) if r.generation == generation => None,
                Some(_) => Some(SnapshotProblem::Deleting),
                None => Some(SnapshotProblem::NotFound),
            }
        };
        if let Some(refused) = refused {
            self.delete_path(&path, "delete view registration").await?;
            return Err(problem(&self.volume, name, refused));
        }
        Ok(id)
    }

    /// Drops view registration `id` of snapshot `name` (the view closed). Gone already is
    /// fine.
    pub async fn unregister_view(&self, name: &str, id: &str) -> Result<(), ObjStoreError> {
        validate_snapshot_name(&self.volume, name)?;
        self.delete_path(&self.view_path(name, id), "delete view registration")
            .await
    }

    /// The views registered under snapshot `name`, by id. A registration that does not parse
    /// is listed with holder `?` and a lease that never expires (it blocks a delete until an
    /// operator clears it: it cannot be told from a live one).
    pub async fn views(&self, name: &str) -> Result<Vec<ViewEntry>, ObjStoreError> {
        validate_snapshot_name(&self.volume, name)?;
        let dir = self.snapshot_dir_of(name).join("views");
        let listed: Vec<_> = with_retry(&self.cfg, "list views", dir.as_ref(), |_| {
            self.store.list(Some(&dir)).try_collect::<Vec<_>>()
        })
        .await?;
        let mut out = Vec::with_capacity(listed.len());
        for meta in &listed {
            let Some(id) = meta.location.prefix_match(&dir).and_then(|mut p| p.next()) else {
                continue;
            };
            let id = id.as_ref().to_string();
            // Gone since the listing: closed.
            let Some(bytes) = self
                .get_opt(&meta.location, "get view registration")
                .await?
            else {
                continue;
            };
            let registration = serde_json::from_slice(&bytes).unwrap_or(ViewRegistration {
                holder: "?".into(),
                generation: 0,
                lease_ms: u64::MAX,
            });
            out.push(ViewEntry {
                id,
                registration,
                stored: SystemTime::from(meta.last_modified),
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// An operator's remedy for a dead host: deletes every view registration of snapshot
    /// `name` held by `holder` (`None`: every one), whatever its lease. A view of that holder
    /// still open reads on until its next renewal notices the snapshot is gone, and may then
    /// fail its cold reads: clear only holders known dead. Returns the ids cleared.
    pub async fn clear_views(
        &self,
        name: &str,
        holder: Option<&str>,
    ) -> Result<Vec<String>, ObjStoreError> {
        let mut cleared = Vec::new();
        for v in self.views(name).await? {
            if holder.is_none_or(|h| h == v.registration.holder) {
                tracing::warn!(volume = %self.volume, snapshot = name, id = %v.id, holder = %v.registration.holder, "clearing a view registration by request");
                self.unregister_view(name, &v.id).await?;
                cleared.push(v.id);
            }
        }
        Ok(cleared)
    }

    /// Whether this volume ever published a manifest: generation 1 by key (read-after-write,
    /// so a clone that just published is seen even by a stale listing), else any generation
    /// in a listing (generation 1 may have been pruned since, long after it was listable).
    async fn has_published(&self) -> Result<bool, ObjStoreError> {
        let first = self.layout.manifest(1);
        match with_retry(&self.cfg, "head manifest", first.as_ref(), |_| {
            self.store.head(&first)
        })
        .await
        {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(self.latest_generation().await? > 0)
    }

    /// Deletes every object of this volume (`volumes/<v>/`), after taking each of its
    /// snapshots through the delete protocol (so a clone being created from one fails its
    /// check instead of outliving the packs; refused with [`SnapshotProblem::HasClones`] while
    /// a clone exists, nothing deleted but the snapshots before it), then drops its
    /// registration under its origin if it is a clone, and its origin record last (so a purge
    /// cut short after its objects went still finds, when run again, the registration it has
    /// to drop). Returns how many objects went.
    pub async fn purge(&self) -> Result<u64, ObjStoreError> {
        let origin = self.origin().await?;
        for s in self.list_snapshots().await? {
            self.unpin(&s.record.name).await?;
        }
        let root = Path::from_iter(["volumes", self.volume.as_str()]);
        let objects: Vec<_> = with_retry(&self.cfg, "list volume", root.as_ref(), |_| {
            self.store.list(Some(&root)).try_collect::<Vec<_>>()
        })
        .await?;
        let origin_path = self.layout.origin();
        for meta in objects.iter().filter(|m| m.location != origin_path) {
            self.delete_path(&meta.location, "purge").await?;
        }
        match &origin {
            Some(o) => self.unregister_clone(o).await?,
            None if objects.iter().any(|m| m.location == origin_path) => {
                self.delete_path(&origin_path, "purge").await?;
            }
            None => {}
        }
        tracing::info!(volume = %self.volume, objects = objects.len(), "volume purged from the store");
        Ok(objects.len() as u64)
    }

    /// The clones of any of this volume's snapshots that exist (registered and published),
    /// as `(snapshot, clone)`.
    pub async fn clones(&self) -> Result<Vec<(String, String)>, ObjStoreError> {
        let mut out = Vec::new();
        for s in self.list_snapshots().await? {
            for c in s.clones {
                if self.sibling(&c)?.has_published().await? {
                    out.push((s.record.name.clone(), c));
                }
            }
        }
        Ok(out)
    }

    /// Where this volume was cloned from, if it is a clone.
    pub async fn origin(&self) -> Result<Option<CloneOrigin>, ObjStoreError> {
        let path = self.layout.origin();
        let Some(bytes) = self.get_opt(&path, "get origin").await? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            ObjStoreError::corrupt(
                path.as_ref(),
                crate::error::FormatError::Invalid {
                    what: "clone origin",
                    detail: e.to_string(),
                },
            )
        })
    }

    /// Drops this volume's registration under `origin`'s snapshot (what [`Self::origin`]
    /// said before a purge deleted the volume's objects: purge first, unregister last, so the
    /// snapshot stays pinned until the clone is gone), and the origin record if still there.
    pub async fn unregister_clone(&self, origin: &CloneOrigin) -> Result<(), ObjStoreError> {
        // The registration first: the origin record is what tells a retry (after a failure
        // between the two) which registration is still to drop.
        let store = self.sibling(&origin.volume)?;
        store
            .delete_path(
                &store.clone_path(&origin.snapshot, &self.volume),
                "delete clone registration",
            )
            .await?;
        self.delete_path(&self.layout.origin(), "delete origin")
            .await
    }

    /// Creates volume `self` as a clone of `origin`'s snapshot `snapshot`: publishes its
    /// generation 1, which maps every block of the snapshot to the origin's packs (nothing is
    /// copied), with `owner` as its owner record. The volume must have no manifest yet. See
    /// the module docs for the order of the steps and why a concurrent snapshot delete cannot
    /// leave the clone without its packs.
    pub async fn create_clone(
        &self,
        origin: &VolumeStore,
        snapshot: &str,
        owner: Option<String>,
    ) -> Result<Manifest, ObjStoreError> {
        let gone = |p| problem(origin.volume(), snapshot, p);
        let info = origin
            .snapshot(snapshot)
            .await?
            .ok_or_else(|| gone(SnapshotProblem::NotFound))?;
        if info.deleting {
            return Err(gone(SnapshotProblem::Deleting));
        }
        if self.latest_generation().await? > 0 {
            return Err(ObjStoreError::InvalidInput(format!(
                "clone target volume `{}` already has manifests in the store",
                self.volume
            )));
        }
        let source = origin.fetch_manifest(info.record.generation).await?;
        // 1. Register, 2. the origin record, 3. generation 1, 4. check.
        let registered_at = std::time::Instant::now();
        origin
            .put(
                &origin.clone_path(snapshot, &self.volume),
                Bytes::from(self.volume.clone().into_bytes()),
                "put clone registration",
            )
            .await?;
        let record = CloneOrigin {
            volume: origin.volume().to_string(),
            snapshot: snapshot.to_string(),
            generation: info.record.generation,
        };
        let bytes = serde_json::to_vec(&record)
            .map_err(|e| ObjStoreError::InvalidInput(format!("clone origin: {e}")))?;
        self.put(&self.layout.origin(), Bytes::from(bytes), "put origin")
            .await?;
        let mut m = Manifest::new(&self.volume, source.block_size, source.volume_size);
        m.generation = 1;
        for (block, loc) in source.iter() {
            let mut loc = loc.clone();
            loc.pack = loc.pack.in_volume(origin.volume());
            m.insert(block, loc);
        }
        m.owner = owner.map(|id| ManifestOwner {
            id,
            claimed_at: 1,
            released: false,
        });
        // A delete may take the registration for a creation that died once half the deadline
        // is spent: give up then, checked right before the PUT (`publish_before`).
        let landed = self
            .publish_before(&mut m, Some(registered_at + self.cfg.clone_deadline / 2))
            .await?;
        if landed == Landed::TooLate {
            self.undo_clone(origin, snapshot, false).await?;
            return Err(gone(SnapshotProblem::CloneDeadline {
                secs: self.cfg.clone_deadline.as_secs(),
            }));
        }
        let still = origin.snapshot(snapshot).await?;
        let registered = still
            .as_ref()
            .is_some_and(|s| s.clones.contains(&self.volume));
        let pinned = registered
            && still
                .as_ref()
                .is_some_and(|s| !s.deleting && s.record.generation == info.record.generation);
        if !pinned {
            // The snapshot is going, or it is another snapshot of the same name (deleted and
            // taken again), or a delete cleared our registration: the clone must not stay
            // pinned by nothing. A generation 1 this call did not create (`Found`) may be a
            // twin creation's that passed its own check; while the registration stands it is
            // pinned (a delete sees it published and refuses), so it stays. Without the
            // registration no creation's check can have passed, so it goes.
            if landed == Landed::Created || !registered {
                self.undo_clone(origin, snapshot, true).await?;
            }
            return Err(gone(SnapshotProblem::Deleting));
        }
        tracing::info!(volume = %self.volume, origin = %origin.volume(), snapshot, generation = info.record.generation, blocks = m.len(), "clone created");
        Ok(m)
    }

    /// Removes what a clone creation of `self` from `origin`'s `snapshot` wrote: its
    /// generation 1 (when `published`: this creation sent it), then, unless the clone has a
    /// published manifest (another creation's, which they pin), its origin record and its
    /// registration (last: it pins until the rest went).
    async fn undo_clone(
        &self,
        origin: &VolumeStore,
        snapshot: &str,
        published: bool,
    ) -> Result<(), ObjStoreError> {
        if published {
            self.delete_path(&self.layout.manifest(1), "delete clone manifest")
                .await?;
        }
        if self.has_published().await? {
            tracing::warn!(volume = %self.volume, snapshot, "an undone clone creation leaves the published generation 1 of another creation of the same name, and its registration");
            return Ok(());
        }
        self.delete_path(&self.layout.origin(), "delete origin")
            .await?;
        origin
            .delete_path(
                &origin.clone_path(snapshot, &self.volume),
                "delete clone registration",
            )
            .await
    }
}
