//! Online resize (grow only): [`Volume::resize`](crate::Volume::resize).
//!
//! Where the size lives and in which order it moves:
//! 1. the cache grows durably: its checkpoint records the new size before any block past the
//!    old end can be addressed (see `glidefs_cache`'s `grow` module); a crash before that reopens
//!    at the old size, after it at the new one;
//! 2. every manifest built from then on (flush, compaction, release: `Shared::carry_size`)
//!    carries the cache's size, so the store learns it at the next publish. The in-memory
//!    manifest takes it too (for readers; a flush swapping in its published manifest may put
//!    the old number back there, which changes nothing: successors take the cache's size).
//!
//! No lock of the flush pipeline is taken: a resize never waits for the object store (a slow
//! or unreachable store does not hold it up). That is safe because a manifest is built from
//! the cache's size read after its rotation: a rotation can only hold a block past the old
//! end if that block was written after the grow, and then the size read after the rotation
//! is the new one (the grow's Release store of the size happens before the write's range
//! check). A publish whose outcome was unknown before the resize is re-sent unchanged (old
//! size, and only blocks below the old end): the one after it carries the new size. The
//! caller keeps resize and `release` apart (the daemon runs both under its admin lock): a
//! release racing a resize may record either size.
//!
//! Reopening: `Volume::open` with a size larger than the store's manifest or the cache
//! directory grows both (a resize the caller recorded first, e.g. in the daemon's
//! `state.json`, completes at the next open); a smaller one is refused (`GeometryMismatch`
//! from the manifest, or the cache's). So a caller that records the new size before calling
//! `resize` reopens at the new size after any crash once its record is durable, and at the
//! old one before.

use crate::blocking::blocking;
use crate::error::Result;
use crate::shared::Shared;

/// [`Volume::resize`](crate::Volume::resize): see there.
pub(crate) async fn resize(v: &Shared, new_size: u64) -> Result<u64> {
    v.check_open()?;
    v.check_writable()?;
    let before = v.size();
    let cache = v.cache.clone();
    let geo = blocking(move || Ok(cache.grow(new_size)?)).await?;
    {
        let mut m = v.manifest.write();
        m.volume_size = m.volume_size.max(geo.volume_size());
    }
    if geo.volume_size() != before {
        tracing::info!(volume = %v.cfg.name, from = before, to = geo.volume_size(), "volume grown");
    }
    Ok(before)
}
