//! GC from the volume (`Volume::collect_garbage`), and the store's size as this volume last
//! saw it.
//!
//! Stored bytes (`StoredFigures`, in `counters.rs`) are the sum of the volume's pack objects:
//! set from a LIST by every compaction pass and GC pass, and raised by every pack this handle
//! uploads in between. GC itself is `VolumeStore::gc` (rules in crates/objstore/src/gc.rs): safe beside flushes and
//! compaction passes without any lock, because a pack stored after the newest manifest is
//! never deleted and every publish re-checks packs uploaded long ago (`MissingPack`).

use glidefs_objstore::{GcOptions, GcReport};

use crate::error::{Result, VolumeError};
use crate::shared::Shared;

/// [`Volume::collect_garbage`](crate::Volume::collect_garbage): see there.
pub(crate) async fn collect_garbage(v: &Shared, opts: GcOptions) -> Result<GcReport> {
    v.publisher("gc")?;
    let name = &v.cfg.name;
    let report = v
        .store
        .gc(opts)
        .await
        .map_err(|e| VolumeError::store("gc", name, e))?;
    let packs = v
        .store
        .list_packs()
        .await
        .map_err(|e| VolumeError::store("list packs", name, e))?;
    v.stored.listed(&packs);
    Ok(report)
}
