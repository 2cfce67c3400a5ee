//! Online resize (grow only): [`Volume::resize`].
//!
//! Where the size lives and in which order it moves:
//! 1. the cache grows durably: its checkpoint records the new size before any block past the
//!    old end can be addressed (see `glidefs_cache`'s `grow` module); a crash before that reopens
//!    at the old size, after it at the new one;
//! 2. every manifest built from then on (flush, compaction, release: [`Volume::carry_size`])
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

use glidefs_objstore::Manifest;

use crate::blocking::blocking;
use crate::error::Result;
use crate::volume::Volume;

impl Volume {
    /// Grows the volume to `new_size` bytes (a multiple of the block size; the current size
    /// is a no-op) and returns the size it had before. Durable locally when it returns (see
    /// the module docs); the store's manifest records it at the next publish. Reads, writes
    /// and flushes go on meanwhile (it never waits for the store). Blocks past the old end
    /// read as zeros.
    ///
    /// Errors: a smaller size is `Cache(Shrink)`, a size off the block grid
    /// `Cache(InvalidGeometry)` (both kind `InvalidInput`, nothing changed); a fenced, released
    /// or closed volume refuses like a write does; a failure writing the cache's checkpoint
    /// leaves the old size.
    pub async fn resize(&self, new_size: u64) -> Result<u64> {
        self.check_open()?;
        self.check_writable()?;
        let before = self.size();
        let cache = self.cache.clone();
        let geo = blocking(move || Ok(cache.grow(new_size)?)).await?;
        {
            let mut m = self.manifest.write();
            m.volume_size = m.volume_size.max(geo.volume_size());
        }
        if geo.volume_size() != before {
            tracing::info!(volume = %self.cfg.name, from = before, to = geo.volume_size(), "volume grown");
        }
        Ok(before)
    }

    /// The volume's size in bytes now (it grows with [`Volume::resize`]; `config().size` is
    /// the size it was opened with). One atomic load.
    pub fn size(&self) -> u64 {
        self.cache.geometry().volume_size()
    }

    /// Makes a manifest built from the current one carry the volume's size (see the module
    /// docs).
    pub(crate) fn carry_size(&self, next: &mut Manifest) {
        next.volume_size = next.volume_size.max(self.size());
    }
}
