//! Running on a full or failing disk: which I/O errors the cache survives, the cleanups it
//! defers until the log is durable, and the degraded state it reports.
//!
//! Failure model (the fault hook in `crash` injects each):
//! - A failed write of a cache file (ENOSPC, EIO: a WAL write-out, a write's data, a
//!   promotion's copy, a staging, a fill) is the error of the operation that hit it, never a
//!   dead cache: reads go on, and so do writes, flushes and evictions once space returns.
//!   Bytes a failed write may have left behind under a block that does not hold them are
//!   punched out (they would both take space and break the "zeros around a partial write"
//!   rule of the active file).
//! - WAL records whose write-out or fdatasync failed stay appended and are written again by
//!   the next sync (see `wal`): a FLUSH acknowledges only when every record before it is durable.
//! - A failed fdatasync of a data file latches the cache dead: the kernel may have dropped
//!   those pages, and no later sync can prove them durable (what PostgreSQL does on a failed
//!   fsync). On ext4, XFS and tmpfs a full disk fails the write itself (delayed allocation
//!   reserves space at write time), not the fdatasync.
//! - Work that must wait until records are durable (punching evicted blocks, deleting a
//!   completed flushing file) is kept when the sync fails and done by the next sync that
//!   covers those records, so space comes back without a restart.
//! - A staging failure in `read_for_flush` is not the flush's error: the block is left out of
//!   the clean file and becomes NotPresent + REMOTE when the flush completes (fetched again
//!   when needed), so completing a flush frees the flushing file even on a full disk.
//!
//! `Cache::degraded` says why the cache is degraded (the last I/O error) until a sync leaves
//! nothing behind; `CacheStats::degraded` is the same as a flag.

use std::sync::atomic::Ordering;

use crate::cache::Cache;
use crate::error::{CacheError, CacheErrorKind, Result};
use crate::state::{BlockState, NO_FILL};

impl Cache {
    /// Why the cache is degraded: the last I/O error on its files (a full or failing disk),
    /// while the WAL is behind or cleanups that free space wait. `None` when healthy. Reads
    /// work while degraded; writes and flushes fail until space returns. O(1) lock.
    pub fn degraded(&self) -> Option<String> {
        if !self.degraded.load(Ordering::Acquire) {
            return None;
        }
        self.last_io_error.lock().clone()
    }

    /// Passes `r` through, marking the cache degraded when it is an I/O error.
    pub(crate) fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if e.kind() == CacheErrorKind::Io {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cache I/O failed; cache degraded");
                *self.last_io_error.lock() = Some(e.to_string());
                self.degraded.store(true, Ordering::Release);
            }
        }
        r
    }

    /// After a successful WAL sync: runs the deferred cleanups its records allow, and clears
    /// the degraded state when nothing is left behind. A cleanup that fails again stays
    /// deferred (the cache stays degraded); it is not the error of the sync that ran it.
    pub(crate) fn after_sync(&self) {
        let durable = self.wal.durable_seq();
        let (punch, remove) = {
            let mut d = self.deferred.lock();
            let punch: Vec<_> = d
                .punch
                .iter()
                .filter(|(s, _)| *s <= durable)
                .copied()
                .collect();
            d.punch.retain(|(s, _)| *s > durable);
            let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut d.remove)
                .into_iter()
                .partition(|(s, _)| *s <= durable);
            d.remove = later;
            (punch, now)
        };
        let bs = self.geo().bs();
        let mut failed = None;
        for (seq, b) in punch {
            // Under the stripe lock a NotPresent block stays so (writes take it, fills are
            // refused while NO_FILL); a block written meanwhile keeps its bytes (a later
            // flush may stage them at this offset): no punch then.
            let _stripe = self.stripes[self.stripe(b)].lock();
            if self.states.get(b).state != BlockState::NotPresent {
                self.states.clear_bits(b, NO_FILL);
                continue;
            }
            match crate::sys::punch_hole(&self.clean, b * bs, bs) {
                Ok(()) => self.states.clear_bits(b, NO_FILL),
                Err(e) => {
                    self.deferred.lock().punch.push((seq, b));
                    failed = Some(CacheError::io("punch hole", &self.dir, e));
                }
            }
        }
        for (seq, p) in remove {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    failed = Some(CacheError::io("remove", &p, e));
                    self.deferred.lock().remove.push((seq, p));
                }
            }
        }
        if let Some(e) = failed {
            let _ = self.note::<()>(Err(e));
            return;
        }
        let idle = {
            let d = self.deferred.lock();
            d.punch.is_empty() && d.remove.is_empty()
        };
        if idle && !self.wal.behind() {
            self.degraded.store(false, Ordering::Release);
        }
    }

    /// Punches `blocks` of `file` (bytes a failed write may have left under blocks that do
    /// not hold them). Best effort: a failure only costs space.
    pub(crate) fn punch_blocks(&self, file: &std::fs::File, blocks: impl Iterator<Item = u64>) {
        let bs = self.geo().bs();
        for b in blocks {
            if let Err(e) = crate::sys::punch_hole(file, b * bs, bs) {
                tracing::warn!(block = b, error = %e, "cannot punch the bytes of a failed write");
            }
        }
    }
}
