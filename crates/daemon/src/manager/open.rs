//! Opening a volume, shared by create, restore and the background re-open: the engine part
//! (manifest, WAL replay, claim; nothing attached yet) and the device part (the device,
//! bounded like every device step, the flusher, and the warm from the volume's warm set).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use glidefs_model::api::Durability;
use glidefs_model::log::chain;
use glidefs_ublk::export::ExportSpec;
use glidefs_volume::{Volume, VolumeConfig, VolumeError};
use parking_lot::Mutex;

use super::flusher::{FlushPolicy, FlushStats, Flusher};
use super::spec::{self, SnapshotRef, VolumeSpec};
use super::{device_step, ManagerError, Open, VolumeManager};

impl VolumeManager {
    /// Opens the volume, attaches its device and starts its flusher.
    pub(super) async fn open_volume(
        &self,
        spec: &VolumeSpec,
        dir: &std::path::Path,
        flush: &Arc<FlushStats>,
        takeover: bool,
        clone_from: Option<&SnapshotRef>,
    ) -> Result<Open, ManagerError> {
        let volume = self.open_engine(spec, dir, takeover, clone_from).await?;
        self.start_volume(spec, volume, flush).await
    }

    /// The engine part of [`Self::open_volume`]: the store and cache steps (manifest, WAL
    /// replay, claim), nothing attached yet, so dropping it mid-way leaves no device behind.
    pub(super) async fn open_engine(
        &self,
        spec: &VolumeSpec,
        dir: &std::path::Path,
        takeover: bool,
        clone_from: Option<&SnapshotRef>,
    ) -> Result<Arc<Volume>, ManagerError> {
        let d = &self.opts.defaults;
        // A snapshot attachment opens the origin's objects, read-only, at the snapshot.
        let store_name = spec.snapshot.as_ref().map_or(&spec.name, |s| &s.volume);
        let mut cfg = VolumeConfig::new(store_name, dir, spec.size);
        cfg.snapshot = spec.snapshot.as_ref().map(|s| s.snapshot.clone());
        // A read-only export claims nothing (claiming would fence the writer) and may not
        // publish anything (a compaction or GC through it would fence the owner too).
        cfg.read_only = spec.read_only;
        // A snapshot attachment claims nothing either; the engine registers it under its
        // snapshot as this owner id (the holder a delete on another host names).
        cfg.owner = if spec.read_only && spec.snapshot.is_none() {
            None
        } else {
            self.opts.owner.clone()
        };
        cfg.takeover = takeover;
        cfg.block_size = spec.block_size;
        cfg.durability = match spec.durability {
            Durability::Local => glidefs_volume::Durability::Local,
            Durability::Store => glidefs_volume::Durability::Store,
        };
        cfg.disk_budget = if d.disk_budget.0 == 0 {
            u64::MAX
        } else {
            d.disk_budget.0
        };
        cfg.store = self.opts.store.clone();
        cfg.encryption_key = spec::load_key_async(
            &spec.name,
            spec.encryption_key.as_ref(),
            &self.opts.encryption_keys,
        )
        .await?;
        let store = self.store_for(spec.prefix.as_deref());
        let volume = match clone_from {
            Some(f) => Volume::create_clone(cfg, store, &f.volume, &f.snapshot)
                .await
                .map_err(|e| ManagerError::from_volume(&spec.name, "create clone", e))?,
            None => match Volume::open(cfg.clone(), store.clone()).await {
                Err(VolumeError::OwnedElsewhere { owner, .. })
                    if !cfg.takeover && same_data_dir(&owner, cfg.owner.as_deref()) =>
                {
                    // The record names this data directory's id under another host name:
                    // the host was renamed. Its cache is this one, so nothing of the
                    // previous holder can be lost: claim it back under the new name.
                    tracing::warn!(volume = %spec.name, previous = %owner, owner = ?cfg.owner, "the volume's owner record names this data directory under another host name (the host was renamed): claiming it under the new name");
                    cfg.takeover = true;
                    Volume::open(cfg, store).await
                }
                other => other,
            }
            .map_err(|e| ManagerError::from_volume(&spec.name, "open", e))?,
        };
        Ok(volume)
    }

    /// The device part of [`Self::open_volume`]: attaches `volume`'s device (bounded by
    /// `DEVICE_STEP_TIMEOUT`; closes the volume when it fails), starts its flusher and its
    /// warm (`volume_defaults.warm_budget`, in the background).
    pub(super) async fn start_volume(
        &self,
        spec: &VolumeSpec,
        volume: Arc<Volume>,
        flush: &Arc<FlushStats>,
    ) -> Result<Open, ManagerError> {
        let d = &self.opts.defaults;
        let dev_spec = ExportSpec {
            queues: spec.queues,
            queue_depth: spec.queue_depth,
            read_only: spec.read_only,
            max_io_bytes: u32::try_from(d.max_io_bytes.0).unwrap_or(1 << 20),
            qos: spec.qos,
        };
        let (exporter, name, v) = (self.devices.clone(), spec.name.clone(), volume.clone());
        let previous = spec.device_id;
        let attached = device_step(&spec.name, "attach", move || {
            Ok(match previous {
                Some(id) => exporter.reattach(&name, v, &dev_spec, id)?,
                None => exporter.attach(&name, v, &dev_spec)?,
            })
        })
        .await;
        let device = match attached {
            Ok(dev) => dev,
            Err(e) => {
                if let Err(ce) = volume.close().await {
                    tracing::warn!(volume = %spec.name, error = %chain(&ce), "close after failed attach");
                }
                return Err(e);
            }
        };
        let policy = FlushPolicy {
            threshold_bytes: d.flush_threshold_bytes.0,
            interval: Duration::from_secs(d.flush_interval_secs),
            space: self.opts.space.clone(),
        };
        let flusher = Flusher::start(volume.clone(), flush.clone(), policy);
        // The warm set's blocks, ahead of the guest (nothing to fetch for a volume whose
        // blocks are here already: one GET of the set).
        if d.warm_budget.0 > 0 {
            volume.start_warm(d.warm_budget.0, usize::from(d.warm_parallel));
        }
        Ok(Open {
            volume,
            device: Mutex::new(Some(device)),
            flusher,
            closing: AtomicBool::new(false),
        })
    }
}

/// Whether owner ids `a` and `b` (`<hostname>/<data directory id>`, see
/// `server::owner_id`) name the same data directory, whatever the host names.
fn same_data_dir(a: &str, b: Option<&str>) -> bool {
    let dir = |id: &str| id.rsplit_once('/').map(|(_, d)| d.to_string());
    b.is_some_and(|b| dir(a).is_some() && dir(a) == dir(b))
}

#[cfg(test)]
mod tests {
    use super::same_data_dir;

    #[test]
    fn a_renamed_host_is_the_same_data_directory() {
        let dir = "0a0a0a0a-0000-4000-8000-00000000000a";
        let old = format!("old-host/{dir}");
        assert!(same_data_dir(&old, Some(&format!("new-host/{dir}"))));
        assert!(same_data_dir(&old, Some(&old)));
        assert!(!same_data_dir(
            &old,
            Some("new-host/0b0b0b0b-0000-4000-8000-00000000000b")
        ));
        assert!(!same_data_dir(&old, None));
        assert!(!same_data_dir("no-slash", Some("no-slash")));
    }
}
