//! Online resize (grow only): [`Cache::grow`].
//!
//! What records the size: the checkpoint's header (`checkpoint`). Growing writes a fresh
//! checkpoint carrying the new size (the ordinary checkpoint steps: WAL segment switch under
//! the write gate, data files and the old segment synced, the file replaced atomically), and
//! only once it is durable moves the in-memory bounds (state map, then the geometry every
//! range check reads). So:
//! - a crash before the new checkpoint is in place reopens at the old size: nothing can have
//!   addressed a block past the old end (the range checks still used the old size), so no
//!   acknowledged write is lost;
//! - a crash after it reopens at the new size: the checkpoint's states and the WAL records
//!   after it (all naming blocks below the old end until the grow returned) replay unchanged;
//! - a write past the old end is accepted only after `grow` returned, and its WAL record
//!   replays against the new checkpoint's size.
//!
//! `Cache::open` with a larger size than the directory holds grows the same way (its recovery
//! writes a fresh checkpoint with the size asked for): a resize recorded by the caller
//! before the cache moved is completed at the next open. A smaller size is refused.

use crate::cache::Cache;
use crate::error::{CacheError, Result};
use crate::geometry::Geometry;

impl Cache {
    /// Grows the volume to `new_size` bytes (a multiple of the block size, no smaller than the
    /// current size; the same size is a no-op) and returns the new geometry. Durable when it
    /// returns (see the module docs); blocks past the old end read as zeros. Blocking: it
    /// syncs files (never on the ublk loop thread, never while holding a [`crate::Gate`]).
    /// Writes and reads go on meanwhile (the write gate is held only for the WAL segment
    /// switch, as by `checkpoint`).
    ///
    /// On an error the size in memory is unchanged; on disk it may be either (a failure while
    /// or after the checkpoint was replaced, e.g. its directory fsync or removing old WAL
    /// segments, can leave the new size recorded): the next open must then ask for at least
    /// the new size, which is why a caller records the size it asked for first.
    pub fn grow(&self, new_size: u64) -> Result<Geometry> {
        let _admin = self.admin.lock();
        let current = self.geo();
        if new_size < current.volume_size() {
            return Err(CacheError::Shrink {
                current: current.volume_size(),
                requested: new_size,
            });
        }
        let next = Geometry::new(new_size, current.block_size())?;
        if next == current {
            return Ok(current);
        }
        self.writable()?;
        self.checkpoint_locked(&next)?;
        // Durable: now let I/O address the new blocks. The map first, so that whoever sees
        // the new size (Acquire) finds the map grown.
        self.states.grow(next.num_blocks());
        self.shape.grow_to(next);
        tracing::info!(
            dir = %self.dir.display(),
            from = current.volume_size(),
            to = new_size,
            "cache grown"
        );
        Ok(next)
    }
}
