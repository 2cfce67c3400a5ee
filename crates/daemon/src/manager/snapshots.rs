//! Snapshots of the daemon's volumes (`/v1/volumes/{name}/snapshots`), and what creating or
//! purging a volume must check about them. Engine side: crates/volume/src/snapshot.rs; store
//! side and the clone/delete protocol: crates/objstore/src/snapshot.rs.
//!
//! - Create flushes the volume and records the generation (the engine holds new writes for
//!   the flush's rotation only). List, show and delete work on the store's records.
//! - A snapshot is attached read-only with `POST /v1/volumes {"from": "VOL@SNAP",
//!   "read_only": true}` (a device of its own; `VolumeSpec::snapshot`), and cloned with the
//!   same request without `read_only` (a new volume whose generation 1 maps the snapshot).
//! - Delete is refused (`snapshot_in_use`) while a clone uses the snapshot, or while a device
//!   of this daemon is attached to it; under the admin lock, so an attachment being created
//!   cannot slip in between. A device attached on another daemon is known by its
//!   registration in the store (the engine registers every snapshot view under its snapshot
//!   as this daemon's owner id): the store refuses the delete (`snapshot_attached`, naming
//!   the holders) until it is detached or its lease expires; `?clear_views=HOLDER` drops a
//!   dead holder's registrations first.
//! - Only an owner records, deletes or purges: a read-only export (`read_only`, e.g. another
//!   daemon's volume attached with `attach_existing`) claims nothing, so a snapshot create or
//!   delete through it, or a purge of it, is refused (`read_only`) before the store is touched;
//!   its snapshots may be listed and shown, and it may be removed without purge.
//! - Purge of a volume is refused while a clone of one of its snapshots exists (the clone
//!   reads its packs) or one of its snapshots is attached here; the purge itself takes every
//!   snapshot through the delete protocol first (`VolumeStore::purge`, which also covers a
//!   clone being created on another daemon); purging a clone drops its registration last.

use glidefs_objstore::{SnapshotInfo, SnapshotRecord, VolumeStore};

use crate::manager::error::{Detail, ManagerError};
use crate::manager::spec::{valid_name, SnapshotRef, VolumeSpec};
use crate::manager::{Open, VolumeManager};
use glidefs_model::api::SnapshotDoc;

/// `store_unavailable` for an object-store error of `op` on volume `name`; a refused snapshot
/// operation keeps its own code (`snapshot_in_use`, `snapshot_not_found`, ...).
pub(super) fn store_err(
    name: &str,
    op: &'static str,
) -> impl Fn(glidefs_objstore::ObjStoreError) -> ManagerError {
    let name = name.to_string();
    move |e| match e {
        glidefs_objstore::ObjStoreError::Snapshot {
            volume,
            name: snapshot,
            problem,
        } => ManagerError::from_volume(
            &name,
            op,
            glidefs_volume::VolumeError::Snapshot {
                volume,
                name: snapshot,
                problem,
            },
        ),
        e => ManagerError::StoreUnavailable {
            name: name.clone(),
            detail: Detail::caused(op, e),
        },
    }
}

fn check_snapshot_name(value: &str) -> Result<(), ManagerError> {
    if valid_name(value) {
        Ok(())
    } else {
        Err(ManagerError::InvalidSnapshot {
            value: value.to_string(),
            reason: "a snapshot name is 1..=128 characters of [A-Za-z0-9._-], not `.`/`..`".into(),
        })
    }
}

/// `read_only` for a read-only export (`spec.read_only`: it claimed nothing, the volume's
/// objects are its owner's), which may not `what`.
fn not_owner(spec: &VolumeSpec, what: &str) -> Result<(), ManagerError> {
    if !spec.read_only {
        return Ok(());
    }
    Err(ManagerError::ReadOnly {
        name: spec.name.clone(),
        detail: Detail::new(format!(
            "it is a read-only export, not the volume's owner, and may not {what}"
        )),
    })
}

impl VolumeManager {
    fn doc(&self, volume: &str, info: SnapshotInfo) -> SnapshotDoc {
        let r = info.record;
        let attached = self.attachments_of(volume, &r.name);
        SnapshotDoc {
            volume: volume.to_string(),
            name: r.name,
            generation: r.generation,
            created_unix: r.created_unix,
            size: r.volume_size,
            block_size: r.block_size,
            clones: info.clones,
            deleting: info.deleting,
            attached,
        }
    }

    /// The document of a snapshot just created or deleted (no clones, not deleting).
    fn record_doc(&self, volume: &str, record: SnapshotRecord) -> SnapshotDoc {
        let info = SnapshotInfo {
            record,
            deleting: false,
            clones: Vec::new(),
        };
        self.doc(volume, info)
    }

    /// Devices of this daemon attached read-only to `volume@snapshot`.
    fn attachments_of(&self, volume: &str, snapshot: &str) -> Vec<String> {
        self.volumes
            .read()
            .values()
            .filter(|e| {
                e.spec
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.volume == volume && s.snapshot == snapshot)
            })
            .map(|e| e.spec.name.clone())
            .collect()
    }

    /// The open volume `name` that snapshots are taken of (not itself an attachment), after
    /// checking the snapshot name, if any; `change`: the caller records or deletes a snapshot,
    /// which only the volume's owner may (not a read-only export).
    fn snapshot_source(
        &self,
        name: &str,
        snapshot: Option<&str>,
        change: bool,
    ) -> Result<std::sync::Arc<Open>, ManagerError> {
        if let Some(s) = snapshot {
            check_snapshot_name(s)?;
        }
        let entry = self.entry(name)?;
        if let Some(s) = &entry.spec.snapshot {
            return Err(ManagerError::ReadOnly {
                name: name.to_string(),
                detail: Detail::new(format!(
                    "it is an attachment of snapshot {s}; snapshot volume `{}` instead",
                    s.volume
                )),
            });
        }
        if change {
            not_owner(&entry.spec, "record or delete its snapshots")?;
        }
        entry.open()
    }

    /// Takes snapshot `snapshot` of volume `name` now.
    pub async fn snapshot_create(
        &self,
        name: &str,
        snapshot: &str,
    ) -> Result<SnapshotDoc, ManagerError> {
        let open = self.snapshot_source(name, Some(snapshot), true)?;
        let record = open
            .volume
            .create_snapshot(snapshot)
            .await
            .map_err(|e| open.error(name, "snapshot", e))?;
        tracing::info!(volume = %name, snapshot, generation = record.generation, "snapshot created");
        Ok(self.record_doc(name, record))
    }

    /// Every snapshot of volume `name`.
    pub async fn snapshot_list(&self, name: &str) -> Result<Vec<SnapshotDoc>, ManagerError> {
        let open = self.snapshot_source(name, None, false)?;
        let all = open
            .volume
            .snapshots()
            .await
            .map_err(|e| open.error(name, "list snapshots", e))?;
        Ok(all.into_iter().map(|i| self.doc(name, i)).collect())
    }

    /// Snapshot `snapshot` of volume `name`.
    pub async fn snapshot_show(
        &self,
        name: &str,
        snapshot: &str,
    ) -> Result<SnapshotDoc, ManagerError> {
        let open = self.snapshot_source(name, Some(snapshot), false)?;
        let info = open
            .volume
            .snapshot(snapshot)
            .await
            .map_err(|e| open.error(name, "show snapshot", e))?
            .ok_or_else(|| ManagerError::SnapshotNotFound {
                volume: name.to_string(),
                snapshot: snapshot.to_string(),
            })?;
        Ok(self.doc(name, info))
    }

    /// Deletes snapshot `snapshot` of volume `name` (see the module docs for when not), after
    /// dropping the view registrations of `clear_views` (a dead holder's), if given.
    pub async fn snapshot_delete(
        &self,
        name: &str,
        snapshot: &str,
        clear_views: Option<&str>,
    ) -> Result<SnapshotDoc, ManagerError> {
        check_snapshot_name(snapshot)?;
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let open = self.snapshot_source(name, None, true)?;
        let attached = self.attachments_of(name, snapshot);
        if !attached.is_empty() {
            return Err(ManagerError::SnapshotInUse {
                volume: name.to_string(),
                snapshot: snapshot.to_string(),
                by: format!(
                    "attached read-only as {}; remove that first",
                    attached.join(", ")
                ),
            });
        }
        if let Some(holder) = clear_views {
            let cleared = open
                .volume
                .clear_snapshot_views(snapshot, Some(holder))
                .await
                .map_err(|e| open.error(name, "clear view registrations", e))?;
            tracing::warn!(volume = %name, snapshot, holder, cleared = cleared.len(), "view registrations cleared by request");
        }
        let record = open
            .volume
            .delete_snapshot(snapshot)
            .await
            .map_err(|e| open.error(name, "delete snapshot", e))?;
        drop(admin);
        tracing::info!(volume = %name, snapshot, generation = record.generation, "snapshot deleted");
        Ok(self.record_doc(name, record))
    }

    /// The record of snapshot `from` for a create (`vstore`: the new volume's store, whose
    /// prefix the origin shares).
    pub(super) async fn snapshot_record(
        &self,
        vstore: &VolumeStore,
        from: &SnapshotRef,
    ) -> Result<SnapshotRecord, ManagerError> {
        let fail = store_err(vstore.volume(), "read the snapshot");
        let origin = vstore.sibling(&from.volume).map_err(&fail)?;
        let info = origin
            .snapshot(&from.snapshot)
            .await
            .map_err(&fail)?
            .ok_or_else(|| ManagerError::SnapshotNotFound {
                volume: from.volume.clone(),
                snapshot: from.snapshot.clone(),
            })?;
        if info.deleting {
            return Err(ManagerError::SnapshotInUse {
                volume: from.volume.clone(),
                snapshot: from.snapshot.clone(),
                by: "it is being deleted".into(),
            });
        }
        Ok(info.record)
    }

    /// The store of `spec`'s volume (its prefix).
    pub(super) fn volume_store(&self, spec: &VolumeSpec) -> Result<VolumeStore, ManagerError> {
        VolumeStore::new(
            self.store_for(spec.prefix.as_deref()),
            &spec.name,
            self.opts.store.clone(),
        )
        .map_err(store_err(&spec.name, "open the store"))
    }

    /// Whether `spec`'s objects may be purged: not a snapshot attachment (it has none of its
    /// own), not a read-only export (the objects are the owner's), none of its snapshots
    /// attached in this daemon, and no clone of any of its snapshots exists.
    pub(super) async fn check_purge(&self, spec: &VolumeSpec) -> Result<(), ManagerError> {
        if let Some(s) = &spec.snapshot {
            return Err(ManagerError::ReadOnly {
                name: spec.name.clone(),
                detail: Detail::new(format!(
                    "it is an attachment of snapshot {s} and has no objects of its own to purge; remove it without purge"
                )),
            });
        }
        not_owner(spec, "purge it; remove it without purge")?;
        let attached: Vec<String> = self
            .volumes
            .read()
            .values()
            .filter_map(|e| {
                let s = e.spec.snapshot.as_ref()?;
                (s.volume == spec.name && e.spec.prefix == spec.prefix)
                    .then(|| format!("{} ({s})", e.spec.name))
            })
            .collect();
        if !attached.is_empty() {
            return Err(ManagerError::SnapshotInUse {
                volume: spec.name.clone(),
                snapshot: "*".into(),
                by: format!(
                    "its snapshots are attached as {}; remove those first",
                    attached.join(", ")
                ),
            });
        }
        let clones = self
            .volume_store(spec)?
            .clones()
            .await
            .map_err(store_err(&spec.name, "check snapshots before purge"))?;
        if let Some((snapshot, _)) = clones.first() {
            let by: Vec<String> = clones
                .iter()
                .map(|(s, c)| format!("{c} (from {s})"))
                .collect();
            return Err(ManagerError::SnapshotInUse {
                volume: spec.name.clone(),
                snapshot: snapshot.clone(),
                by: format!(
                    "clones read this volume's packs: {}; purge them first",
                    by.join(", ")
                ),
            });
        }
        Ok(())
    }
}
