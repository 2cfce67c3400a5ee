//! DISCARD and WRITE_ZEROES: a range made to read as zeros by punching the active file, not
//! by writing zero bytes.
//!
//! [`Cache::zero_with`] is a plain write whose "data" is a hole: the same prepare (stripe
//! locks of every block, promote before write for a partial block, `NeedsFetch` for a partial
//! block only in the store), the same commit (a Dirty record, then the Dirty state). Only the
//! data step differs: the active file is made to reach the range's last block (`cover`, which
//! never shrinks the file) and the range is punched (`fallocate(PUNCH_HOLE)`, which also
//! zeroes partial file-system blocks at the edges). A punch is made durable by the same
//! fdatasync of the active file that a FLUSH runs for written bytes.
//!
//! Whole blocks zeroed this way take no space in the cache and none in the store: the flush
//! finds them all zeros and publishes them unmapped (see `flush`), after which they are
//! NotPresent without a remote copy and read as zeros with no I/O. Page CRCs of the range are
//! forgotten (the flush computes what it needs).

use crate::cache::Cache;
use crate::crash::{CrashPoint, IoOp};
use crate::error::{CacheError, Result};
use crate::gate::Gate;
use crate::state::BlockState;
use crate::write::WriteOutcome;

impl Cache {
    /// Makes `len` bytes at `offset` read as zeros (gate taken here). See the module docs.
    pub fn zero(&self, offset: u64, len: u64) -> Result<WriteOutcome> {
        let gate = self.enter();
        self.zero_with(&gate, offset, len)
    }

    /// [`Cache::zero`] under a gate the caller already holds. Waits for the blocks' stripe
    /// locks: never on the ublk loop thread.
    pub fn zero_with(&self, gate: &Gate, offset: u64, len: u64) -> Result<WriteOutcome> {
        let (first, last) = self.block_span(offset, len)?;
        if len == 0 {
            return Ok(WriteOutcome::Done);
        }
        let (_stripes, ticket) = match self.prepare_exclusive(gate, offset, len)? {
            Ok(ready) => ready,
            Err(blocks) => return Ok(WriteOutcome::NeedsFetch(blocks)),
        };
        self.crash_point(CrashPoint::BeforeDataWrite)?;
        let r = crate::crash::check(&*self.hook, IoOp::DataWrite)
            .map_err(|e| CacheError::io("punch", &self.dir, e))
            .and_then(|()| self.cover(gate.active(), last))
            .and_then(|()| {
                crate::sys::punch_hole(gate.active(), offset, len)
                    .map_err(|e| CacheError::io("punch", &self.dir, e))
            });
        if let Err(e) = r {
            // As a failed pwrite: the range's CRCs no longer hold, and whatever the punch
            // did under blocks that are not Dirty holds nothing (punched again, best effort).
            self.forget_crcs(gate, offset, len);
            let not_dirty =
                (first..=last).filter(|&b| self.states.get(b).state != BlockState::Dirty);
            self.punch_blocks(gate.active(), not_dirty);
            return self.note(Err(e));
        }
        self.crash_point(CrashPoint::AfterDataWrite)?;
        self.commit_write(gate, ticket, None)?;
        Ok(WriteOutcome::Done)
    }
}
