//! What keeps a snapshot's data in the store: an open view's registration under its
//! snapshot (`ViewPin`, renewed while the view is open; see `snapshot.rs` for the protocol)
//! and the packs snapshots map, which compaction leaves alone (`PinCache`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use glidefs_objstore::{PackId, VolumeStore};

use crate::config::VolumeConfig;
use crate::error::{Result, VolumeError};

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
    pub(crate) by_generation: parking_lot::Mutex<BTreeMap<u64, Arc<HashSet<PackId>>>>,
}
