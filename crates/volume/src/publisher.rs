//! The capability to publish a volume's manifests: a flush, a compaction's remap, a claim at
//! open, a release. (A snapshot's record and a clone's generation 1 are published by the
//! object store's own protocols, `glidefs_objstore::snapshot`.)
//!
//! Contract: a handle that may not publish, a snapshot view or a read-only export, holds no
//! [`Publisher`]. `Volume::open` makes one only for a writable handle, before its claim, and
//! this type holds the crate's only call to `VolumeStore::publish_manifest`, the store's one
//! checked, fenced conditional put (its invariants: `glidefs_objstore::invariants`). So no
//! code path of a view can reach a manifest write, whatever checks it forgets: an operation
//! that publishes takes the publisher first (`Volume::publisher`), and a view has none to
//! give.

use std::sync::Arc;

use glidefs_objstore::{Manifest, ObjStoreError, VolumeStore};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Publisher {
    store: Arc<VolumeStore>,
}

impl Publisher {
    /// For a handle that may publish (`Volume::open` only).
    pub(crate) fn new(store: Arc<VolumeStore>) -> Self {
        Self { store }
    }

    /// Publishes `m` as the volume's next generation (`VolumeStore::publish_manifest`: fenced,
    /// idempotent for an identical retry).
    pub(crate) async fn publish(&self, m: &mut Manifest) -> Result<(), ObjStoreError> {
        self.store.publish_manifest(m).await
    }
}

/// Publishes `next`, whose only change is the owner record (a claim or a release), after
/// recording `publishing G =owner` in the base file (the caller records `base G` once it
/// adopted `next`). A lost race is `Fenced` (not latched here).
pub(crate) async fn publish_owner_change(
    cfg: &crate::config::VolumeConfig,
    publisher: &Publisher,
    next: &mut Manifest,
) -> crate::error::Result<()> {
    let g = next.generation;
    crate::base::record_base(cfg, g - 1, Some((g, crate::base::OWNER_TAG.to_string()))).await?;
    match publisher.publish(next).await {
        Ok(()) => {}
        Err(ObjStoreError::Fenced { latest, reason, .. }) => {
            return Err(crate::error::VolumeError::Fenced(crate::error::Fence {
                volume: cfg.name.clone(),
                generation: g - 1,
                newer: (latest >= g).then_some(latest),
                reason: format!("publishing the owner record of generation {g}: {reason}"),
            }));
        }
        Err(e) => {
            return Err(crate::error::VolumeError::store(
                "publish owner record",
                &cfg.name,
                e,
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use crate::{Volume, VolumeConfig, VolumeError};

    const SIZE: u64 = 4 << 20;

    /// Only a writable handle holds a publisher; a view and a read-only export hold none,
    /// and every operation that publishes is refused on them before it reaches the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_writable_handle_holds_a_publisher() {
        let store: Arc<dyn object_store::ObjectStore> = Arc::new(InMemory::new());
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut cfg = VolumeConfig::new("v", dirs[0].path(), SIZE);
        cfg.owner = Some("host-a".into());
        let writer = Volume::open(cfg, store.clone()).await.unwrap();
        assert!(writer.shared.publisher("flush").is_ok());
        writer.write(0, &[7; 4096]).await.unwrap();
        writer.sync_to_store().await.unwrap();
        writer.create_snapshot("s1").await.unwrap();
        let generation = writer.manifest_generation();

        let mut ro = VolumeConfig::new("v", dirs[1].path(), SIZE);
        ro.read_only = true;
        ro.owner = Some("host-b".into());
        let export = Volume::open(ro, store.clone()).await.unwrap();
        let mut sv = VolumeConfig::new("v", dirs[2].path(), SIZE);
        sv.snapshot = Some("s1".into());
        let view = Volume::open(sv, store.clone()).await.unwrap();
        for handle in [&export, &view] {
            for refused in [
                handle.shared.publisher("flush").err(),
                handle.release().await.err(),
                handle.create_snapshot("s2").await.err(),
                handle.compact(Default::default()).await.err(),
            ] {
                assert!(
                    matches!(refused, Some(VolumeError::ReadOnly { .. })),
                    "{refused:?}"
                );
            }
        }
        // Nothing was published beside the writer: its next flush is the next generation,
        // not fenced by a newer one.
        let store_view =
            glidefs_objstore::VolumeStore::new(store.clone(), "v", Default::default()).unwrap();
        assert_eq!(store_view.latest_generation().await.unwrap(), generation);
        writer.write(4096, &[8; 4096]).await.unwrap();
        let report = writer.sync_to_store().await.unwrap();
        assert_eq!(report.generation, generation + 1);
    }
}
