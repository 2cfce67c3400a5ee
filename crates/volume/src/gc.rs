//! The store's size as this volume last saw it, and GC from the volume (`Volume::collect_garbage`).
//!
//! Stored bytes are the sum of the volume's pack objects: set from a LIST by every
//! compaction pass and GC pass, and raised by every pack this handle uploads in between. GC
//! itself is `VolumeStore::gc` (rules in crates/objstore/src/gc.rs): safe beside flushes and
//! compaction passes without any lock, because a pack stored after the newest manifest is
//! never deleted and every publish re-checks packs uploaded long ago (`MissingPack`).

use std::sync::atomic::{AtomicU64, Ordering};

use glidefs_objstore::{GcOptions, GcReport, StoredPack};

use crate::error::{Result, VolumeError};
use crate::volume::Volume;

/// Pack objects of the volume in the store (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StoredFigures {
    pub packs: AtomicU64,
    pub bytes: AtomicU64,
}

impl StoredFigures {
    /// Adopts a listing.
    pub(crate) fn listed(&self, packs: &[StoredPack]) {
        self.packs.store(packs.len() as u64, Ordering::Relaxed);
        self.bytes
            .store(packs.iter().map(|p| p.size).sum(), Ordering::Relaxed);
    }

    /// Counts one uploaded pack of `bytes`.
    pub(crate) fn uploaded(&self, bytes: u64) {
        self.packs.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl Volume {
    /// One GC pass over this volume's objects, then a LIST to update the stored figures.
    pub async fn collect_garbage(&self, opts: GcOptions) -> Result<GcReport> {
        self.publisher("gc")?;
        let name = &self.cfg.name;
        let report = self
            .store
            .gc(opts)
            .await
            .map_err(|e| VolumeError::store("gc", name, e))?;
        let packs = self
            .store
            .list_packs()
            .await
            .map_err(|e| VolumeError::store("list packs", name, e))?;
        self.stored.listed(&packs);
        Ok(report)
    }
}
