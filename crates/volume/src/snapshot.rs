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
//! - A view registers under its snapshot in the store when it opens ([`ViewPin`]; store side:
//!   `VolumeStore::register_view`, which checks the snapshot after registering and backs out
//!   when a delete is under way), renews the registration every third of
//!   `StoreConfig::view_lease` while open (`VolumeStore::renew_view`: a delete under way
//!   does not make a renewal back out, it is refused by the registration), and drops it when
//!   it closes. A snapshot delete on
//!   any host is refused while a registration's lease runs (`SnapshotProblem::Attached`). The
//!   holder is `VolumeConfig::owner` (the daemon's owner id; `anonymous` without one), the
//!   registration's id is derived from it and the cache directory, so a view reopened after
//!   a crash takes its own registration back. A killed or dropped view stops renewing and its
//!   registration expires after one lease.
//! - [`Volume::create_clone`] publishes a new volume's generation 1 mapping the snapshot's
//!   blocks to the origin's packs; the clone is then opened like any volume.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use glidefs_objstore::{PackId, SnapshotInfo, SnapshotRecord, VolumeStore};

use crate::config::VolumeConfig;
use crate::error::{Result, VolumeError};
use crate::volume::Volume;

/// The block map of snapshot `name` for a read-only view (`VolumeConfig::snapshot`), after
/// checking the view's geometry against the snapshot's.
pub(crate) async fn load_view(
    cfg: &VolumeConfig,
    store: &VolumeStore,
    name: &str,
) -> Result<glidefs_objstore::Manifest> {
    let vol = &cfg.name;
    let info = store
        .snapshot(name)
        .await
        .map_err(|e| VolumeError::store("open snapshot", vol, e))?
        .ok_or_else(|| VolumeError::Snapshot {
            volume: vol.clone(),
            name: name.to_string(),
            problem: glidefs_objstore::SnapshotProblem::NotFound,
        })?;
    store
        .fetch_manifest(info.record.generation)
        .await
        .map_err(|e| VolumeError::store("load snapshot manifest", vol, e))
}

/// The holder a view registers as when it was opened without an owner id.
pub(crate) const ANONYMOUS_HOLDER: &str = "anonymous";

/// An open view's registration under its snapshot, and the task renewing it (stopped when
/// this is dropped).
#[derive(Debug)]
pub(crate) struct ViewPin {
    snapshot: String,
    id: String,
    renewal: tokio::task::JoinHandle<()>,
}

impl Drop for ViewPin {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

impl ViewPin {
    /// Registers the view `cfg` describes (serving `generation` of snapshot `name`) as
    /// `holder` and starts its renewal. Refused (`VolumeError::Snapshot`) when the snapshot
    /// is being deleted, is gone, or is another snapshot of that name by now.
    pub(crate) async fn register(
        cfg: &VolumeConfig,
        store: &Arc<VolumeStore>,
        name: &str,
        holder: &str,
        generation: u64,
    ) -> Result<Self> {
        let instance = cfg.dir.display().to_string();
        let id = store
            .register_view(name, generation, holder, &instance)
            .await
            .map_err(|e| VolumeError::store("register the view", &cfg.name, e))?;
        let every = (store.config().view_lease / 3).max(std::time::Duration::from_millis(1));
        let (store, vol, snap, holder) = (
            store.clone(),
            cfg.name.clone(),
            name.to_string(),
            holder.to_string(),
        );
        let renewal = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match store
                    .renew_view(&snap, generation, &holder, &instance)
                    .await
                {
                    Ok(_) => {}
                    Err(e @ glidefs_objstore::ObjStoreError::Snapshot { .. }) => {
                        tracing::error!(volume = %vol, snapshot = %snap, error = %e, "the view lost its registration and the snapshot is going or gone (cleared by an operator, or not renewed for a whole lease): its cold reads may fail");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(volume = %vol, snapshot = %snap, error = %e, "renewing the view's registration failed; trying again");
                    }
                }
            }
        });
        Ok(Self {
            snapshot: name.to_string(),
            id,
            renewal,
        })
    }

    /// Stops the renewal (the process died, or the view is closing).
    pub(crate) fn stop(&self) {
        self.renewal.abort();
    }

    /// Stops the renewal and drops the registration (the view closed). A failure leaves the
    /// registration to expire after its lease.
    pub(crate) async fn release(&self, vol: &str, store: &VolumeStore) {
        self.stop();
        if let Err(e) = store.unregister_view(&self.snapshot, &self.id).await {
            tracing::warn!(volume = %vol, snapshot = %self.snapshot, error = %e, "dropping the view's registration failed: it blocks deletes of the snapshot until its lease expires");
        }
    }
}

/// Packs mapped by each snapshot generation, loaded once per generation.
#[derive(Debug, Default)]
pub(crate) struct PinCache {
    by_generation: parking_lot::Mutex<BTreeMap<u64, Arc<HashSet<PackId>>>>,
}

impl Volume {
    /// Takes snapshot `name` of everything written before this call (see the module docs).
    pub async fn create_snapshot(&self, name: &str) -> Result<SnapshotRecord> {
        let vol = &self.cfg.name;
        glidefs_objstore::validate_snapshot_name(vol, name)
            .map_err(|e| VolumeError::store("create snapshot", vol, e))?;
        self.publisher("snapshot")?;
        let mut st = self.sync.lock().await;
        self.check_open()?;
        self.check_writable()?;
        let report = self.sync_locked(&mut st).await?;
        if report.generation == 0 {
            return Err(VolumeError::InvalidConfig {
                volume: vol.clone(),
                detail: "no generation is published yet: nothing to snapshot".into(),
            });
        }
        // The size now, under the sync lock (a resize since the last publish counts).
        let record = self
            .store
            .create_snapshot_sized(name, report.generation, self.size())
            .await
            .map_err(|e| VolumeError::store("create snapshot", vol, e))?;
        drop(st);
        tracing::info!(volume = %vol, snapshot = name, generation = record.generation, "snapshot taken");
        Ok(record)
    }

    /// The volume's snapshots.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.store
            .list_snapshots()
            .await
            .map_err(|e| VolumeError::store("list snapshots", &self.cfg.name, e))
    }

    /// One snapshot, or `None`.
    pub async fn snapshot(&self, name: &str) -> Result<Option<SnapshotInfo>> {
        self.store
            .snapshot(name)
            .await
            .map_err(|e| VolumeError::store("get snapshot", &self.cfg.name, e))
    }

    /// Deletes snapshot `name` (refused while a clone uses it or a view on any host has it
    /// open); its packs go with the next GC pass that no other snapshot or the live map keeps
    /// them from.
    pub async fn delete_snapshot(&self, name: &str) -> Result<SnapshotRecord> {
        self.publisher("snapshot delete")?;
        let record = self
            .store
            .delete_snapshot(name)
            .await
            .map_err(|e| VolumeError::store("delete snapshot", &self.cfg.name, e))?;
        self.pins.by_generation.lock().remove(&record.generation);
        Ok(record)
    }

    /// An operator's remedy for a dead host: drops every registration of a view of snapshot
    /// `name` held by `holder` (`None`: every holder), so a delete no longer waits for their
    /// lease. A view of that holder still open may then fail its cold reads once the snapshot
    /// is deleted. Returns the registration ids dropped.
    pub async fn clear_snapshot_views(
        &self,
        name: &str,
        holder: Option<&str>,
    ) -> Result<Vec<String>> {
        self.publisher("clearing snapshot views")?;
        self.store
            .clear_views(name, holder)
            .await
            .map_err(|e| VolumeError::store("clear snapshot views", &self.cfg.name, e))
    }

    /// Every pack that a snapshot of this volume maps (compaction leaves them alone).
    pub(crate) async fn pinned_packs(&self) -> Result<HashSet<PackId>> {
        let vol = &self.cfg.name;
        let snaps = self.snapshots().await?;
        let mut out = HashSet::new();
        let mut live = Vec::with_capacity(snaps.len());
        for s in snaps {
            let g = s.record.generation;
            live.push(g);
            let cached = self.pins.by_generation.lock().get(&g).cloned();
            let packs = match cached {
                Some(p) => p,
                None => {
                    let m = self
                        .store
                        .fetch_manifest(g)
                        .await
                        .map_err(|e| VolumeError::store("load snapshot manifest", vol, e))?;
                    let packs: Arc<HashSet<PackId>> =
                        Arc::new(m.referenced_packs().into_iter().cloned().collect());
                    self.pins.by_generation.lock().insert(g, packs.clone());
                    packs
                }
            };
            out.extend(packs.iter().cloned());
        }
        self.pins
            .by_generation
            .lock()
            .retain(|g, _| live.contains(g));
        Ok(out)
    }

    /// Creates volume `cfg.name` in the store as a clone of `origin`'s snapshot `snapshot`
    /// (its generation 1; nothing is copied), then opens it with `cfg` (whose size and block
    /// size must be the snapshot's, and whose encryption key the origin's: the clone reads the
    /// origin's frames and writes its own with it). The clone has its own owner, fencing and GC; it keeps the
    /// snapshot from being deleted until the clone is purged.
    pub async fn create_clone(
        cfg: VolumeConfig,
        store: Arc<dyn object_store::ObjectStore>,
        origin: &str,
        snapshot: &str,
    ) -> Result<Arc<Volume>> {
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
        let target = VolumeStore::new(store.clone(), &cfg.name, cfg.store.clone())
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
        Volume::open(cfg, store).await
    }
}
