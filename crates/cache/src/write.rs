//! The write path: prepare (promote, lock) → data lands in the active file → commit (CRC, WAL,
//! state).
//!
//! Phase order for every write (also for zero-copy, where the kernel moves the data):
//! `prepare_write` → data into the active file at the device offset → `commit_write`, all under
//! one [`Gate`]. Invariants:
//! - A block that is already Dirty needs nothing: no lock, no WAL record (its Dirty record is
//!   already in the log). This is the hot path. Only after a failed WAL write-out (a full
//!   disk) may that record still sit in the buffer: the write then writes the buffer out
//!   before it completes, or fails (`Wal::ensure_written`).
//! - A block that is not Dirty is handled under its stripe lock, held (inside the
//!   [`WriteTicket`]) from prepare to commit, so two writers never promote the same block and
//!   no partial writer copies old bytes over a full-block write still in flight.
//! - Promote before write: a Syncing block (bytes in the flushing file) or a Clean block
//!   (clean file) is copied into the active file in `prepare_write`, before the new data can
//!   land. Its state changes only at commit, so readers keep reading the old source meanwhile,
//!   except that a caller that may block may publish a ticket whose blocks were all promoted
//!   Dirty right after prepare ([`Cache::dirty_early`]: the active file already holds their
//!   whole content, and the Dirty record is written out first).
//! - A partial write to a NotPresent block with a remote copy needs the old bytes first:
//!   `NeedsFetch`. The caller fetches, `fill_clean`s and retries (the block is then Clean and
//!   gets promoted). Full-block writes never need old bytes.
//! - Commit appends the Dirty record *before* publishing the Dirty state (Release): whoever
//!   sees Dirty and then calls `flush()` makes that record durable too.
//! - Page CRCs (see `crcs`): the plain path (`write`/`write_with`) is an exclusive writer: it
//!   holds the stripe locks of *all* its blocks, Dirty ones included, from prepare until its
//!   CRCs are stored, so overlapping plain writes never record the CRC of the write that lost
//!   the race. Writes without an exclusive ticket (zero-copy) record no CRC: prepare and
//!   commit both bump the stripes' epochs and forget the pages' CRCs (prepare: so a ticket
//!   dropped after the kernel moved some bytes leaves no stale CRC; commit: see `crcs`). A
//!   failed plain pwrite forgets its range's CRCs too.
//! - The active file holds bytes only under Dirty blocks (and a promoted copy, between prepare
//!   and commit): a partial first write to a NotPresent block lands beside whatever the file
//!   holds there (`cover` adds no zeros). So a write that fails after some of its bytes landed
//!   punches them out again under its stripe locks: the plain path itself, a zero-copy ticket
//!   when it is dropped uncommitted (`Abandon`; not once the cache is latched dead, when the
//!   directory may be a successor's). Otherwise a later partial write would expose the bytes
//!   of a write that failed beside its own, in a range that read as zeros (or the store's
//!   bytes) until then.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::cache::{Cache, STRIPES};
use crate::crash::{CrashPoint, IoOp};
use crate::error::{CacheError, Result};
use crate::gate::Gate;
use crate::geometry::PAGE_SIZE;
use crate::state::BlockState;
use crate::sync::{ArcUnitGuard, UnitGuard};
use crate::wal::Record;

/// How `prepare_write` may take a stripe lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Block until free (off the ublk loop thread).
    Wait,
    /// Never wait, neither for a stripe lock nor for file I/O (a promote's copy, a write that
    /// extends the active file): answer [`WritePrep::WouldBlock`] instead (on the ublk loop
    /// thread, which then defers the request).
    Try,
}

/// A prepared write: the data may now be written into the active file at `file_offset()`.
/// Holds the stripe locks of the blocks that change state; pass it to `commit_write`.
pub struct WriteTicket {
    offset: u64,
    len: u64,
    first: u64,
    count: u32,
    transition: bool,
    /// Every block the write turns Dirty was promoted by prepare (a partial write to a Clean or
    /// Syncing block): its whole current content is in the active file already, so it may
    /// turn Dirty before the data lands ([`Cache::dirty_early`]).
    promoted: bool,
    /// Set when the caller holds the stripe locks of every block across the data write: the
    /// CRC epoch sum read before the data landed (see `crcs`).
    exclusive: Option<u64>,
    /// Armed for a non-exclusive ticket that turns blocks Dirty, until it is committed or its
    /// blocks turn Dirty early: what dropping it uncommitted punches.
    abandon: Option<Abandon>,
    _stripes: Vec<ArcUnitGuard>,
}

/// The blocks of a non-exclusive ticket that were not Dirty under its stripe locks, and the
/// active file they live in: if the ticket is dropped uncommitted (the transfer failed after
/// the kernel moved some bytes, or the request was abandoned), those bytes are punched out
/// (see the module docs). Runs while the ticket still holds the stripe locks (fields drop
/// after `Drop::drop`), so no writer can have turned those blocks Dirty meanwhile.
struct Abandon {
    active: Arc<File>,
    blocks: Vec<u64>,
    bs: u64,
    dead: Arc<AtomicBool>,
    hook: Arc<dyn crate::crash::CrashHook>,
}

impl Abandon {
    fn punch(self) {
        // A cache latched dead may have handed its directory to a successor: touch nothing.
        if self.dead.load(Ordering::Acquire) {
            return;
        }
        for b in self.blocks {
            let (off, len) = (b * self.bs, self.bs);
            // A punch can fail where an overwrite of the same (allocated) range does not
            // (an extent split on a full file system): zeros then, which a later partial
            // write reads the same way.
            let r = crate::crash::check(&*self.hook, IoOp::AbandonPunch)
                .and_then(|()| crate::sys::punch_hole(&self.active, off, len))
                .or_else(|_| {
                    let zeros = vec![0; len as usize];
                    self.active.write_all_at(&zeros, off)
                });
            if let Err(e) = r {
                tracing::warn!(block = b, error = %e, "cannot punch or zero the bytes of an abandoned write");
            }
        }
    }
}

impl Drop for WriteTicket {
    fn drop(&mut self) {
        if let Some(abandon) = self.abandon.take() {
            abandon.punch();
        }
    }
}

impl std::fmt::Debug for WriteTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTicket")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("transition", &self.transition)
            .finish()
    }
}

impl WriteTicket {
    /// Where the data goes in `gate.active()` (the active file mirrors the device layout).
    pub fn file_offset(&self) -> u64 {
        self.offset
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether dropping this ticket uncommitted does file I/O (punches the blocks it would
    /// have turned Dirty): a caller on the ublk loop thread drops such a ticket elsewhere.
    pub fn punches_on_drop(&self) -> bool {
        self.abandon.is_some()
    }
}

/// Stripe locks held by an exclusive (plain) write.
pub(crate) struct StripeGuards<'a> {
    _one: Option<UnitGuard<'a>>,
    _many: Vec<UnitGuard<'a>>,
}

/// Answer of `prepare_write`.
#[derive(Debug)]
pub enum WritePrep {
    Ready(WriteTicket),
    /// These blocks have a remote copy that a partial write must merge with: fetch them,
    /// `fill_clean`, retry.
    NeedsFetch(Vec<u64>),
    /// `LockMode::Try` and a stripe lock was busy or the write needs file I/O first: defer
    /// the request.
    WouldBlock,
}

/// Answer of [`Cache::try_commit_write`].
#[derive(Debug)]
pub enum Commit {
    /// Committed.
    Done,
    /// Committing needs file I/O: commit this ticket with `commit_write` off the loop thread.
    WouldBlock(WriteTicket),
}

/// Answer of the plain `write`.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    Done,
    NeedsFetch(Vec<u64>),
}

impl Cache {
    /// Prepares a write of `len` bytes at `offset` under `gate` (see module docs).
    pub fn prepare_write(
        &self,
        gate: &Gate,
        offset: u64,
        len: u64,
        mode: LockMode,
    ) -> Result<WritePrep> {
        self.prepare(gate, offset, len, Some(mode))
    }

    /// `mode = None`: the caller already holds the stripe locks of every block of the range
    /// (`lock_all_stripes`) and keeps them until after `commit_write`: an exclusive writer.
    pub(crate) fn prepare(
        &self,
        gate: &Gate,
        offset: u64,
        len: u64,
        mode: Option<LockMode>,
    ) -> Result<WritePrep> {
        self.check_gate(gate);
        self.writable()?;
        self.geo().check_range(offset, len)?;
        let bs = self.geo().bs();
        let (first, last) = (offset / bs, (offset + len.max(1) - 1) / bs);
        let count = u32::try_from(last - first + 1).map_err(|_| CacheError::OutOfRange {
            offset,
            len,
            size: self.geo().volume_size(),
        })?;
        // Exclusive: the epochs are read before the data can land (see `crcs`).
        let exclusive = mode
            .is_none()
            .then(|| self.epochs.sum(self.stripes_of(first, last)));
        let ticket = |transition, promoted, abandon, stripes| WriteTicket {
            offset,
            len,
            first,
            count,
            transition,
            promoted,
            exclusive,
            abandon,
            _stripes: stripes,
        };
        // A zero-length write lands nothing and promotes nothing: it must turn no block
        // Dirty (at commit or in `dirty_early`), whose active file never got its bytes.
        if len == 0 || (first..=last).all(|b| self.states.get(b).state == BlockState::Dirty) {
            if exclusive.is_none() {
                self.forget_crcs(gate, offset, len);
            }
            return Ok(WritePrep::Ready(ticket(false, false, None, Vec::new())));
        }
        let mut guards = Vec::new();
        if let Some(mode) = mode {
            let mut idx: Vec<usize> = (first..=last)
                .filter(|&b| self.states.get(b).state != BlockState::Dirty)
                .map(|b| self.stripe(b))
                .collect();
            idx.sort_unstable();
            idx.dedup();
            guards.reserve(idx.len());
            for i in idx {
                let lock = &self.stripes[i];
                match mode {
                    LockMode::Wait => guards.push(lock.lock_arc()),
                    LockMode::Try => match lock.try_lock_arc() {
                        Some(g) => guards.push(g),
                        None => return Ok(WritePrep::WouldBlock),
                    },
                }
            }
        }
        // Under the stripe locks the states of these blocks are stable.
        let needs: Vec<u64> = self
            .geo()
            .pieces(offset, len)
            .filter(|&(b, _, n)| {
                let i = self.states.get(b);
                i.state == BlockState::NotPresent && i.remote && n < bs
            })
            .map(|(b, _, _)| b)
            .collect();
        if !needs.is_empty() {
            return Ok(WritePrep::NeedsFetch(needs));
        }
        if mode == Some(LockMode::Try) && self.needs_file_io(gate, offset, len)? {
            return Ok(WritePrep::WouldBlock);
        }
        let mut promoted = true;
        for (b, _, n) in self.geo().pieces(offset, len) {
            let state = self.states.get(b).state;
            if n == bs {
                // A full-block write needs no old bytes (nor does a Dirty block).
                promoted &= state == BlockState::Dirty;
                continue;
            }
            promoted &= state != BlockState::NotPresent;
            let src = match state {
                BlockState::Syncing => gate.flushing(),
                BlockState::Clean => Some(gate.clean()),
                BlockState::NotPresent => {
                    self.cover(gate.active(), b)?;
                    continue;
                }
                BlockState::Dirty => continue,
            };
            let Some(src) = src else {
                return Err(self.missing_flushing(b));
            };
            self.promote(gate, src, b)?;
            if state == BlockState::Syncing {
                self.promote_crcs(gate, b);
            }
        }
        if exclusive.is_none() {
            self.forget_crcs(gate, offset, len);
        }
        // What a drop before the commit punches: every block not Dirty now. (A block that was
        // Dirty before the locks were taken stays Dirty: the gate holds off rotation. So every
        // block listed is under a stripe lock this ticket holds.)
        let abandon = mode.is_some().then(|| Abandon {
            active: gate.active_arc().clone(),
            blocks: (first..=last)
                .filter(|&b| self.states.get(b).state != BlockState::Dirty)
                .collect(),
            bs,
            dead: self.dead.clone(),
            hook: self.hook.clone(),
        });
        Ok(WritePrep::Ready(ticket(true, promoted, abandon, guards)))
    }

    /// Whether preparing a write of `[offset, offset + len)` reads or writes a file: a
    /// partial write to a Clean or Syncing block (promote), or to a NotPresent block beyond
    /// the active file's end (cover). One `fstat` at most (no disk I/O). The caller holds the
    /// stripe locks of the blocks that are not Dirty.
    fn needs_file_io(&self, gate: &Gate, offset: u64, len: u64) -> Result<bool> {
        let bs = self.geo().bs();
        let mut cover_to = 0;
        for (b, _, n) in self.geo().pieces(offset, len) {
            if n == bs {
                continue;
            }
            match self.states.get(b).state {
                BlockState::Syncing | BlockState::Clean => return Ok(true),
                BlockState::NotPresent => cover_to = (b + 1) * bs,
                BlockState::Dirty => {}
            }
        }
        Ok(cover_to > 0 && self.active_len(gate.active())? < cover_to)
    }

    fn active_len(&self, active: &std::fs::File) -> Result<u64> {
        Ok(active
            .metadata()
            .map_err(|e| CacheError::io("stat", &self.dir, e))?
            .len())
    }

    pub(crate) fn missing_flushing(&self, block: u64) -> CacheError {
        CacheError::Corrupt {
            path: self.dir.clone(),
            what: format!("block {block} is Syncing but no flushing file is open"),
        }
    }

    /// Makes the active file reach the end of `block` (a partial first write to a block that
    /// was never written lands only its own bytes; the rest must read as zeros, not as the end
    /// of the file). Writes one zero byte at the block's last byte when the file is shorter:
    /// never shrinks the file, so racing extensions are safe. The caller holds the block's
    /// stripe lock and the block is NotPresent: that byte holds nothing.
    pub(crate) fn cover(&self, active: &std::fs::File, block: u64) -> Result<()> {
        let end = (block + 1) * self.geo().bs();
        if self.active_len(active)? < end {
            let r = crate::crash::check(&*self.hook, IoOp::Cover)
                .and_then(|()| active.write_all_at(&[0], end - 1));
            r.map_err(|e| CacheError::io("extend pwrite", &self.dir, e))?;
        }
        Ok(())
    }

    /// Copies a block's current bytes into the active file (promote before write), inside the
    /// kernel (`sys::copy_range`: no user buffer, one copy). On a failed copy (full disk) the
    /// partial copy is punched out again: the block is not Dirty, so those bytes hold nothing
    /// but space.
    fn promote(&self, gate: &Gate, src: &std::fs::File, block: u64) -> Result<()> {
        let off = block * self.geo().bs();
        let len = self.geo().block_size() as usize;
        let r = crate::crash::check(&*self.hook, IoOp::Promote)
            .and_then(|()| crate::sys::copy_range(src, gate.active(), off, len));
        if r.is_err() {
            self.punch_blocks(gate.active(), std::iter::once(block));
        }
        self.note(r.map_err(|e| CacheError::io("promote copy", &self.dir, e)))
    }

    /// A promoted Syncing block's bytes in the active file are those of the flushing file: so
    /// are its known CRCs (the pages this write covers are set or forgotten again later). The
    /// caller holds the block's stripe lock and the block is not Dirty: nobody else writes it.
    fn promote_crcs(&self, gate: &Gate, block: u64) {
        let Some(from) = &gate.flushing_crcs else {
            return;
        };
        let pages = self.block_pages(block);
        let mut known = vec![None; (pages.end - pages.start) as usize];
        from.get(pages.clone(), &mut known);
        if known.iter().any(Option::is_some) {
            gate.crcs
                .store(pages.clone(), |p| known[(p - pages.start) as usize]);
            self.states.mark_crcs(block);
        }
    }

    fn block_pages(&self, block: u64) -> std::ops::Range<u64> {
        let ppb = u64::from(self.geo().pages_per_block());
        block * ppb..(block + 1) * ppb
    }

    /// Publishes the blocks of a prepared write Dirty now, before its data lands, when prepare
    /// promoted every one of them (`promoted`): their whole current content is already in the
    /// active file, so readers switching to it read the same bytes, and a write that then
    /// never lands (a failed transfer, a dropped ticket) leaves a Dirty block that holds its
    /// old content, or part of a write that failed. The Dirty record is appended and written
    /// out first (as `commit_write` does); the ticket's commit then needs no file I/O
    /// (`try_commit_write` on the loop thread). For callers that may block anyway (a deferred
    /// write that just promoted): it saves the commit's hop to a thread that may block. A
    /// failed write-out (full disk) keeps the record buffered (`Wal::lagging`): the commit
    /// writes it out or fails the write. Does nothing for any other ticket. The caller holds
    /// `gate` from prepare to commit (no rotation can move the blocks in between).
    pub fn dirty_early(&self, gate: &Gate, ticket: &mut WriteTicket) -> Result<()> {
        self.check_gate(gate);
        if !ticket.transition || !ticket.promoted {
            return Ok(());
        }
        self.alive()?;
        let logged = self.turn_dirty(ticket)?;
        ticket.transition = false;
        ticket.abandon = None;
        // A failed write-out marks the cache degraded and leaves `lagging` set: the commit's
        // `ensure_written` retries it (or fails the write); a ticket dropped instead leaves
        // it to the next write-out.
        let _ = self.note(logged);
        Ok(())
    }

    /// [`Cache::commit_write`] without file I/O (zero-copy, on the ublk loop thread), or
    /// [`Commit::WouldBlock`] with the ticket, untouched, when committing needs it: blocks
    /// that turn Dirty need their WAL record written out, and so does an earlier record a
    /// failed write-out left buffered (a full disk). The caller then commits on a thread that
    /// may block. (Should another thread's write-out fail between the check and the commit,
    /// this commit writes the buffer out itself: a window of a few instructions on a disk
    /// that is failing anyway.)
    pub fn try_commit_write(&self, gate: &Gate, ticket: WriteTicket) -> Result<Commit> {
        if ticket.transition || self.wal.lagging() {
            return Ok(Commit::WouldBlock(ticket));
        }
        self.commit_write(gate, ticket, None).map(|()| Commit::Done)
    }

    /// Commits a write after its data reached the active file: page CRCs (from `data` when the
    /// caller has the bytes; zero-copy passes `None` and the CRCs are computed from the file
    /// before upload), then the WAL record and the Dirty state for blocks that changed.
    pub fn commit_write(
        &self,
        gate: &Gate,
        mut ticket: WriteTicket,
        data: Option<&[u8]>,
    ) -> Result<()> {
        // The data landed (the caller's contract): nothing to punch, whatever happens below.
        ticket.abandon = None;
        self.check_gate(gate);
        self.alive()?;
        self.record_crcs(gate, &ticket, data);
        if ticket.transition {
            // Written out before the request completes: a daemon killed after completing it
            // (user recovery keeps the device) must leave a WAL that still says Dirty.
            // A failed write-out (full disk) fails this write, but the record stays appended
            // (written by the next write-out that succeeds) and the data is in the file: the
            // blocks turn Dirty all the same, so memory and the log agree.
            let logged = self.turn_dirty(&ticket)?;
            self.note(logged)?;
        } else {
            // Blocks already Dirty: their record may be one a failed write-out left buffered
            // (a full disk). This write completes only once it is in the WAL file, else a
            // process crash would forget the block was Dirty and lose this write too.
            self.note(self.wal.ensure_written())?;
        }
        drop(ticket);
        Ok(())
    }

    /// Appends the ticket's Dirty record and writes it out (visible: see `Wal::append_visible`),
    /// then publishes its blocks Dirty. Returns the write-out's outcome: a failed one keeps the
    /// record buffered and the states change all the same (memory and the log agree). `Err`
    /// only for a dead cache.
    fn turn_dirty(&self, ticket: &WriteTicket) -> Result<Result<u64>> {
        let logged = self.wal.append_visible(Record::Dirty {
            first: ticket.first,
            count: ticket.count,
        });
        if let Err(CacheError::Dead) = logged {
            return Err(CacheError::Dead);
        }
        self.crash_point(CrashPoint::AfterWalAppend)?;
        for b in ticket.first..ticket.first + u64::from(ticket.count) {
            self.states.set_state(b, BlockState::Dirty);
        }
        Ok(logged)
    }

    /// Page CRCs of a committed write (rules in `crcs`): an exclusive writer with the bytes
    /// records them, marks its blocks `CRCS` (and forgets them again if a non-exclusive commit
    /// raced with it); any other commit bumps the stripe epochs, then forgets.
    fn record_crcs(&self, gate: &Gate, ticket: &WriteTicket, data: Option<&[u8]>) {
        let (offset, len) = (ticket.offset, ticket.len);
        let last_block = ticket.first + u64::from(ticket.count) - 1;
        let (data, e0) = match (data, ticket.exclusive) {
            (Some(d), Some(e0)) if d.len() as u64 == len => (d, e0),
            _ => {
                self.forget_crcs(gate, offset, len);
                return;
            }
        };
        let pages = self.pages_of(offset, len);
        let (page, end) = (u64::from(PAGE_SIZE), offset + len);
        gate.crcs.store(pages.clone(), |p| {
            let (start, stop) = (p * page, (p + 1) * page);
            (start >= offset && stop <= end).then(|| {
                let from = (start - offset) as usize;
                crc32c::crc32c(&data[from..from + PAGE_SIZE as usize])
            })
        });
        for b in ticket.first..=last_block {
            self.states.mark_crcs(b);
        }
        if self.epochs.sum(self.stripes_of(ticket.first, last_block)) != e0 {
            gate.crcs.forget(pages);
        }
    }

    fn pages_of(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let page = u64::from(PAGE_SIZE);
        offset / page..(offset + len).div_ceil(page)
    }

    /// Before data that will not get an exclusive CRC lands, and at its commit: bump the
    /// range's stripe epochs, then forget its CRCs (blocks whose `CRCS` bit is clear have
    /// none: no lock), so a write that never commits (failed I/O, dropped ticket) cannot leave
    /// an older write's CRC over bytes it changed. See `crcs`.
    pub(crate) fn forget_crcs(&self, gate: &Gate, offset: u64, len: u64) {
        let bs = self.geo().bs();
        let (first, last) = (offset / bs, (offset + len.max(1) - 1) / bs);
        self.epochs.bump(self.stripes_of(first, last));
        let pages = self.pages_of(offset, len);
        for b in first..=last {
            if self.states.has_crcs(b) {
                let bp = self.block_pages(b);
                gate.crcs
                    .forget(pages.start.max(bp.start)..pages.end.min(bp.end));
            }
        }
    }

    /// Stripe indices of blocks `first..=last`, each once (not sorted).
    fn stripes_of(&self, first: u64, last: u64) -> impl Iterator<Item = usize> + '_ {
        let n = (last - first + 1).min(STRIPES as u64);
        (first..first + n).map(|b| self.stripe(b))
    }

    /// Locks the stripes of every block in `first..=last`, in ascending stripe order (the one
    /// lock order of this crate). No allocation for a single block.
    pub(crate) fn lock_all_stripes(&self, first: u64, last: u64) -> StripeGuards<'_> {
        if first == last {
            return StripeGuards {
                _one: Some(self.stripes[self.stripe(first)].lock()),
                _many: Vec::new(),
            };
        }
        let mut idx: Vec<usize> = self.stripes_of(first, last).collect();
        idx.sort_unstable();
        idx.dedup();
        StripeGuards {
            _one: None,
            _many: idx.into_iter().map(|i| self.stripes[i].lock()).collect(),
        }
    }

    /// The first and last block of a checked range (`len` 0 counts as one byte).
    pub(crate) fn block_span(&self, offset: u64, len: u64) -> Result<(u64, u64)> {
        self.geo().check_range(offset, len)?;
        let bs = self.geo().bs();
        Ok((offset / bs, (offset + len.max(1) - 1) / bs))
    }

    /// Locks the stripes of every block of the range and prepares an exclusive write: the
    /// guards (hold them until after the commit) and the ticket, or the blocks to fetch first.
    pub(crate) fn prepare_exclusive(
        &self,
        gate: &Gate,
        offset: u64,
        len: u64,
    ) -> Result<std::result::Result<(StripeGuards<'_>, WriteTicket), Vec<u64>>> {
        let (first, last) = self.block_span(offset, len)?;
        let stripes = self.lock_all_stripes(first, last);
        match self.prepare(gate, offset, len, None)? {
            WritePrep::Ready(t) => Ok(Ok((stripes, t))),
            WritePrep::NeedsFetch(b) => Ok(Err(b)),
            WritePrep::WouldBlock => Err(CacheError::Corrupt {
                path: self.dir.clone(),
                what: "waiting stripe lock reported WouldBlock".into(),
            }),
        }
    }

    /// Plain write (USER_COPY and tests): takes the gate, prepares, writes, commits.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<WriteOutcome> {
        let gate = self.enter();
        self.write_with(&gate, offset, data)
    }

    /// Plain write under a gate the caller already holds.
    /// Overlapping plain writes to one block are serialised by its stripe lock (held across
    /// the pwrite and the CRC store), so the recorded page CRCs always describe the bytes that
    /// landed last. Waits for that lock: never on the ublk loop thread with a contended block.
    pub fn write_with(&self, gate: &Gate, offset: u64, data: &[u8]) -> Result<WriteOutcome> {
        let (first, last) = self.block_span(offset, data.len() as u64)?;
        let (_stripes, ticket) = match self.prepare_exclusive(gate, offset, data.len() as u64)? {
            Ok(ready) => ready,
            Err(blocks) => return Ok(WriteOutcome::NeedsFetch(blocks)),
        };
        self.crash_point(CrashPoint::BeforeDataWrite)?;
        let r = crate::crash::check(&*self.hook, IoOp::DataWrite)
            .and_then(|()| gate.active().write_all_at(data, offset));
        if let Err(e) = r {
            // Some bytes may have landed: the range's old CRCs no longer hold, and under a
            // block that is not Dirty they would break the zeros a later partial write of it
            // expects (and take space): punched out (the stripe locks are held).
            self.forget_crcs(gate, offset, data.len() as u64);
            let not_dirty =
                (first..=last).filter(|&b| self.states.get(b).state != BlockState::Dirty);
            self.punch_blocks(gate.active(), not_dirty);
            return self.note(Err(CacheError::io("pwrite", &self.dir, e)));
        }
        self.crash_point(CrashPoint::AfterDataWrite)?;
        self.commit_write(gate, ticket, Some(data))?;
        Ok(WriteOutcome::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static<T: Send + 'static>() {}

    #[test]
    fn ticket_can_travel_with_the_gate_across_kernel_io() {
        assert_send_static::<WriteTicket>();
        assert_send_static::<WritePrep>();
    }
}
