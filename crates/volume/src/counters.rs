//! A volume's running totals, readable by `stats` at any time (atomics: never behind the
//! sync lock): uploads, compaction passes, and the store's size as this volume last saw it.

use std::sync::atomic::{AtomicU64, Ordering};

use glidefs_objstore::StoredPack;

/// Upload totals, readable by `stats` while a sync holds `SyncState`.
#[derive(Debug, Default)]
pub(crate) struct UploadCounters {
    pub packs: AtomicU64,
    pub bytes: AtomicU64,
}

/// Compaction totals of a volume (for `VolumeStats`).
#[derive(Debug, Default)]
pub(crate) struct CompactCounters {
    pub passes: AtomicU64,
    pub bytes_copied: AtomicU64,
    pub packs_rewritten: AtomicU64,
    pub seq: AtomicU64,
}

/// Pack objects of the volume in the store (see `gc.rs`).
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
