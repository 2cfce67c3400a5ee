//! Snapshots and clones of a volume (store side: crates/objstore/src/snapshot.rs).
//!
//! - `create_snapshot` flushes every write completed before the call to the store and records
//!   the generation that flush published, both under the flusher's lock: the point in time is
//!   the flush's rotation (new writes wait for the rotation gate only, not for the upload),
//!   and the recorded generation is the newest manifest when the record is written, which is
//!   what keeps a concurrent GC from pruning it (objstore's snapshot.rs).
//! - A snapshot pins its packs: GC keeps its manifest; compaction skips every pack a snapshot
//!   maps (`pinned_packs`: rewriting one would only add a copy, the original stays pinned).
//!   A snapshot taken while a pass runs may still see one of its packs rewritten by that pass:
//!   a wasted copy, never a loss (the original is kept by the snapshot's manifest).
//! - `Volume::open` with `VolumeConfig::snapshot` is a read-only view of that generation:
//!   writes, flushes to the store, compaction and GC are refused ([`VolumeError::ReadOnly`]);
//!   reads fill the view's own cache directory.
//! - A view registers under its snapshot in the store when it opens (`ViewPin` in
//!   `pins.rs`; store side: `VolumeStore::register_view`, which checks the snapshot after
//!   registering and backs out when a delete is under way), renews the registration every
//!   third of `StoreConfig::view_lease` while open (`VolumeStore::renew_view`: a delete under
//!   way does not make a renewal back out, it is refused by the registration), and drops it
//!   when it closes. A snapshot delete on any host is refused while a registration's lease
//!   runs (`SnapshotProblem::Attached`). The holder is `VolumeConfig::owner` (the daemon's
//!   owner id; `anonymous` without one), the registration's id is derived from it and the
//!   cache directory, so a view reopened after a crash takes its own registration back. A
//!   killed or dropped view stops renewing and its registration expires after one lease.
//! - [`Volume::create_clone`](crate::Volume::create_clone) publishes a new volume's
//!   generation 1 mapping the snapshot's blocks to the origin's packs, and copies the
//!   origin's warm set (`crate::warm`) to it when there is one; the clone is then opened like
//!   any volume.

use std::collections::HashSet;
use std::sync::Arc;

use glidefs_objstore::{PackId, SnapshotInfo, SnapshotRecord, VolumeStore};

use crate::config::VolumeConfig;
use crate::error::{Result, VolumeError};
use crate::shared::Shared;
use crate::sync::Flusher;

/// A volume's snapshots, over its shared state.
pub(crate) struct Snapshots<'a> {
    pub(crate) v: &'a Shared,
}

impl Snapshots<'_> {
    /// [`Volume::create_snapshot`](crate::Volume::create_snapshot): see there.
    pub(crate) async fn create_snapshot(&self, name: &str) -> Result<SnapshotRecord> {
        let vol = &self.v.cfg.name;
        glidefs_objstore::validate_snapshot_name(vol, name)
            .map_err(|e| VolumeError::store("create snapshot", vol, e))?;
        self.v.publisher("snapshot")?;
        let mut st = self.v.sync.lock().await;
        self.v.check_open()?;
        self.v.check_writable()?;
        let report = Flusher { v: self.v }.sync_locked(&mut st).await?;
        if report.generation == 0 {
            return Err(VolumeError::InvalidConfig {
                volume: vol.clone(),
                detail: "no generation is published yet: nothing to snapshot".into(),
            });
        }
        // The size now, under the sync lock (a resize since the last publish counts).
        let record = self
            .v
            .store
            .create_snapshot_sized(name, report.generation, self.v.size())
            .await
            .map_err(|e| VolumeError::store("create snapshot", vol, e))?;
        drop(st);
        tracing::info!(volume = %vol, snapshot = name, generation = record.generation, "snapshot taken");
        Ok(record)
    }

    /// [`Volume::snapshots`](crate::Volume::snapshots): see there.
    pub(crate) async fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.v
            .store
            .list_snapshots()
            .await
            .map_err(|e| VolumeError::store("list snapshots", &self.v.cfg.name, e))
    }

    /// [`Volume::snapshot`](crate::Volume::snapshot): see there.
    pub(crate) async fn snapshot(&self, name: &str) -> Result<Option<SnapshotInfo>> {
        self.v
            .store
            .snapshot(name)
            .await
            .map_err(|e| VolumeError::store("get snapshot", &self.v.cfg.name, e))
    }

    /// [`Volume::delete_snapshot`](crate::Volume::delete_snapshot): see there.
    pub(crate) async fn delete_snapshot(&self, name: &str) -> Result<SnapshotRecord> {
        self.v.publisher("snapshot delete")?;
        let record = self
            .v
            .store
            .delete_snapshot(name)
            .await
            .map_err(|e| VolumeError::store("delete snapshot", &self.v.cfg.name, e))?;
        self.v.pins.by_generation.lock().remove(&record.generation);
        Ok(record)
    }

    /// [`Volume::clear_snapshot_views`](crate::Volume::clear_snapshot_views): see there.
    pub(crate) async fn clear_snapshot_views(
        &self,
        name: &str,
        holder: Option<&str>,
    ) -> Result<Vec<String>> {
        self.v.publisher("clearing snapshot views")?;
        self.v
            .store
            .clear_views(name, holder)
            .await
            .map_err(|e| VolumeError::store("clear snapshot views", &self.v.cfg.name, e))
    }

    /// Every pack that a snapshot of this volume maps (compaction leaves them alone).
    pub(crate) async fn pinned_packs(&self) -> Result<HashSet<PackId>> {
        let vol = &self.v.cfg.name;
        let snaps = self.snapshots().await?;
        let mut out = HashSet::new();
        let mut live = Vec::with_capacity(snaps.len());
        for s in snaps {
            let g = s.record.generation;
            live.push(g);
            let cached = self.v.pins.by_generation.lock().get(&g).cloned();
            let packs =
                match cached {
                    Some(p) => p,
                    None => {
                        let m =
                            self.v.store.fetch_manifest(g).await.map_err(|e| {
                                VolumeError::store("load snapshot manifest", vol, e)
                            })?;
                        let packs: Arc<HashSet<PackId>> =
                            Arc::new(m.referenced_packs().into_iter().cloned().collect());
                        self.v.pins.by_generation.lock().insert(g, packs.clone());
                        packs
                    }
                };
            out.extend(packs.iter().cloned());
        }
        self.v
            .pins
            .by_generation
            .lock()
            .retain(|g, _| live.contains(g));
        Ok(out)
    }
}

/// Publishes volume `cfg.name`'s generation 1 as a clone of `origin`'s snapshot `snapshot`
/// (see [`Volume::create_clone`](crate::Volume::create_clone), which opens it next).
pub(crate) async fn create_clone(
    cfg: &VolumeConfig,
    store: Arc<dyn object_store::ObjectStore>,
    origin: &str,
    snapshot: &str,
) -> Result<()> {
    let vol = cfg.name.clone();
    // A clone is a new writable volume: a handle that may not publish would still write
    // its generation 1 below, then open as a reader of it.
    if cfg.read_only || cfg.snapshot.is_some() {
        return Err(VolumeError::InvalidConfig {
            volume: vol,
            detail: "a clone is created by a writable handle: the config asks for a read-only export or a snapshot view".into(),
        });
    }
    let err = |e| VolumeError::store("create clone", &vol, e);
    let target = VolumeStore::new(store, &cfg.name, cfg.store.clone())
        .map_err(err)?
        .with_key(cfg.encryption_key.clone());
    let source = target.sibling(origin).map_err(err)?;
    let info = source
        .snapshot(snapshot)
        .await
        .map_err(err)?
        .ok_or_else(|| VolumeError::Snapshot {
            volume: origin.to_string(),
            name: snapshot.to_string(),
            problem: glidefs_objstore::SnapshotProblem::NotFound,
        })?;
    if info.record.volume_size != cfg.size || info.record.block_size != cfg.block_size {
        return Err(VolumeError::GeometryMismatch {
            volume: vol.clone(),
            stored: format!(
                "size={} block_size={} (snapshot {origin}@{snapshot})",
                info.record.volume_size, info.record.block_size
            ),
            requested: format!("size={} block_size={}", cfg.size, cfg.block_size),
        });
    }
    target
        .create_clone(&source, snapshot, cfg.owner.clone())
        .await
        .map_err(err)?;
    // The origin's warm set, for the clone's first attach (a hint: a failure costs the
    // clone its warm start, nothing else).
    match target.copy_warm_set_from(&source).await {
        Ok(Some(set)) => {
            tracing::info!(volume = %vol, origin, blocks = set.blocks.len(), "warm set copied from the origin")
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(volume = %vol, origin, error = %e, "copying the origin's warm set failed; the clone starts cold")
        }
    }
    Ok(())
}
