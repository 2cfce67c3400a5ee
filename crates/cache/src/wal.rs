//! The write-ahead log: fixed-size, checksummed, sequence-numbered records in segment files.
//!
//! Record (32 bytes, little endian): magic `GWAL` | version u8 | kind u8 | 2 reserved |
//! seq u64 | a u64 | b u32 | crc32c of bytes 0..28.
//!
//! Contracts:
//! - Appends go to an in-memory buffer (no syscall per record); the buffer is written to the
//!   segment when it grows past [`WRITE_OUT_BYTES`], on every [`Wal::sync`], and at once for
//!   [`Wal::append_visible`] (records a completed write depends on: they must survive a crash
//!   of the process, which the kernel's ublk user recovery hides from the guest).
//! - Sequence numbers are contiguous across segments. Replay applies records in order and stops
//!   at the first record that is torn, fails its checksum, or breaks the sequence.
//! - [`Wal::sync`] is a group commit: a caller whose writes completed before it called sync is
//!   covered by any sync that *began* after that moment, so concurrent FLUSHes share fsyncs.
//! - I/O errors (ENOSPC, EIO) never kill the log: a failed write-out or fdatasync is the error
//!   of the append or sync that ran it, the records stay appended, and the next write-out and
//!   sync that succeed write (again) and sync every byte no successful fdatasync covered (see
//!   `Seg`). Each segment reserves disk space when it is created and keeps half of it
//!   allocated past its records (`Seg::keep_reserve`), so the records that free space
//!   (Evict, Unstaged, FlushDone) can still be written on a full filesystem.
//! - A dead WAL (injected crash) never writes again: buffered records are dropped, as they
//!   would be when the process dies.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::crash::{CrashHook, IoOp};
use crate::error::{CacheError, Result};

pub(crate) const RECORD_BYTES: usize = 32;
const MAGIC: &[u8; 4] = b"GWAL";
const VERSION: u8 = 1;
/// When an append writes the buffer out to the segment file (never an fsync).
#[derive(Debug, Clone, Copy)]
enum WriteOut {
    /// At once: the record must survive a crash of the process.
    Now,
    /// Once the buffer holds [`WRITE_OUT_BYTES`].
    WhenFull,
    /// Not from this append (under the write gate).
    Never,
}

/// Buffered bytes that trigger a write (no sync) to the segment file.
pub(crate) const WRITE_OUT_BYTES: usize = 64 * 1024;

/// A logged state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// Blocks `first..first+count` became Dirty in the active file.
    Dirty { first: u64, count: u32 },
    /// Dirty blocks became Syncing; `new_gen` is the new active file.
    Rotate { new_gen: u64 },
    /// The flush of flushing file `gen` is durable in the store: Syncing blocks are Clean.
    FlushDone { gen: u64 },
    /// A fetched block was stored Clean; `crc` is the CRC32C of the whole block.
    Fill { block: u64, crc: u32 },
    /// A Clean block was evicted.
    Evict { block: u64 },
    /// A Syncing block of the flushing file has no copy in the clean file (its staging
    /// failed): when the next [`Record::FlushDone`] completes that flush, the block becomes
    /// NotPresent (remote only), not Clean. Appended before that FlushDone, so any prefix of
    /// the log that holds the FlushDone also holds it.
    Unstaged { block: u64 },
    /// A block of the flushing file read as all zeros and is published unmapped (no pack
    /// holds it): when the next [`Record::FlushDone`] completes that flush, the block becomes
    /// NotPresent without a remote copy (it reads as zeros, with no I/O). Appended before that
    /// FlushDone, like [`Record::Unstaged`].
    Unmapped { block: u64 },
    /// The data files were synced after every record up to `upto` was appended: their data
    /// is durable once this marker is (see [`Wal::sync`]).
    Synced { upto: u64 },
}

impl Record {
    fn encode(&self, seq: u64, out: &mut Vec<u8>) {
        let (kind, a, b) = match *self {
            Record::Dirty { first, count } => (1u8, first, count),
            Record::Rotate { new_gen } => (2, new_gen, 0),
            Record::FlushDone { gen } => (3, gen, 0),
            Record::Fill { block, crc } => (4, block, crc),
            Record::Evict { block } => (5, block, 0),
            Record::Synced { upto } => (6, upto, 0),
            Record::Unstaged { block } => (7, block, 0),
            Record::Unmapped { block } => (8, block, 0),
        };
        let start = out.len();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[VERSION, kind, 0, 0]);
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }

    /// Decodes one record; `None` when torn or corrupt.
    fn decode(buf: &[u8]) -> Option<(u64, Record)> {
        let buf: &[u8; RECORD_BYTES] = buf.try_into().ok()?;
        let crc = u32::from_le_bytes(buf[28..32].try_into().ok()?);
        if &buf[0..4] != MAGIC || buf[4] != VERSION || crc32c::crc32c(&buf[..28]) != crc {
            return None;
        }
        let seq = u64::from_le_bytes(buf[8..16].try_into().ok()?);
        let a = u64::from_le_bytes(buf[16..24].try_into().ok()?);
        let b = u32::from_le_bytes(buf[24..28].try_into().ok()?);
        let rec = match buf[5] {
            1 => Record::Dirty { first: a, count: b },
            2 => Record::Rotate { new_gen: a },
            3 => Record::FlushDone { gen: a },
            4 => Record::Fill { block: a, crc: b },
            5 => Record::Evict { block: a },
            6 => Record::Synced { upto: a },
            7 => Record::Unstaged { block: a },
            8 => Record::Unmapped { block: a },
            _ => return None,
        };
        Some((seq, rec))
    }
}

/// A created, not yet current, WAL segment.
#[derive(Debug)]
pub(crate) struct PreparedSegment {
    file: Arc<File>,
    path: PathBuf,
    segment: u64,
    reserve: Reserve,
}

/// The disk space a segment holds past its records (see [`Seg::keep_reserve`]).
#[derive(Debug, Clone, Copy)]
struct Reserve {
    /// The segment's reserve ([`reserve_bytes`]); 0: none is kept (no fallocate support).
    step: u64,
    /// Bytes from offset 0 known allocated.
    held: u64,
    /// The last extension failed (logged once until one succeeds).
    failed: bool,
}

/// One segment file and its records that are not known durable yet.
///
/// `unsynced` holds every byte appended since the last successful fdatasync, starting at file
/// offset `base`; its first `written` bytes are in the file (page cache). A failed write keeps
/// its progress (a partial write resumes at the right offset); a failed fdatasync resets
/// `written` to 0, so the next write-out writes those bytes again (after a failed fsync the
/// kernel may have dropped the pages, and a later fsync that succeeds would not bring them
/// back): an acknowledged sync never covers a record that did not reach the disk.
#[derive(Debug)]
struct Seg {
    file: Arc<File>,
    path: PathBuf,
    segment: u64,
    base: u64,
    unsynced: Vec<u8>,
    written: usize,
    reserve: Reserve,
}

/// Reserved bytes kept past the records besides half the segment's reserve: the records
/// appended between two write-outs (a buffer's worth) and a few per flush.
const RESERVE_SLACK: u64 = 2 * WRITE_OUT_BYTES as u64;

impl Seg {
    fn new(file: Arc<File>, path: PathBuf, segment: u64, reserve: Reserve) -> Self {
        Self {
            file,
            path,
            segment,
            base: 0,
            unsynced: Vec::with_capacity(WRITE_OUT_BYTES + RECORD_BYTES),
            written: 0,
            reserve,
        }
    }

    /// Keeps half the segment's reserve (one record per block) allocated past its records,
    /// whatever they are and however long no checkpoint switched segments: when the disk
    /// fills, the records that free space (an Evict or Unstaged per block at most, plus a few
    /// per flush) still fit. Records that do not free space (Fill, Dirty) may fill the first
    /// half at any rate between two FLUSHes (a FLUSH checkpoints only once they are there), so
    /// the reserve made at creation is not enough: before a write-out whose records would
    /// leave less than that, the allocation is extended (one fallocate per half reserve of
    /// records). A failed extension (full disk) is only logged: what is held stays held.
    fn keep_reserve(&mut self, hook: &dyn CrashHook) {
        let r = &mut self.reserve;
        let end = self.base + self.unsynced.len() as u64;
        if r.step == 0 || end + r.step / 2 + RESERVE_SLACK <= r.held {
            return;
        }
        let want = end + r.step + RESERVE_SLACK;
        let done = crate::crash::check(hook, IoOp::WalReserve)
            .and_then(|()| crate::sys::reserve_range(&self.file, r.held, want - r.held));
        match done {
            Ok(()) => {
                r.held = want;
                r.failed = false;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => r.step = 0,
            Err(e) => {
                if !r.failed {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot extend the WAL segment's reserve");
                }
                r.failed = true;
            }
        }
    }

    fn pending(&self) -> usize {
        self.unsynced.len() - self.written
    }

    /// Writes the bytes not yet in the file (pwrite at their offset, resuming after a partial
    /// write).
    fn write_out(&mut self, hook: &dyn CrashHook) -> Result<()> {
        while self.written < self.unsynced.len() {
            let r = crate::crash::check(hook, IoOp::WalWrite).and_then(|()| {
                self.file.write_at(
                    &self.unsynced[self.written..],
                    self.base + self.written as u64,
                )
            });
            match r {
                Ok(0) => {
                    let e = std::io::Error::from(std::io::ErrorKind::WriteZero);
                    return Err(CacheError::io("wal write", &self.path, e));
                }
                Ok(n) => self.written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CacheError::io("wal write", &self.path, e)),
            }
        }
        Ok(())
    }

    /// The first `len` bytes are durable.
    fn synced(&mut self, len: usize) {
        let len = len.min(self.written);
        self.unsynced.drain(..len);
        self.base += len as u64;
        self.written -= len;
    }
}

#[derive(Debug)]
struct Inner {
    cur: Seg,
    next_seq: u64,
    dead: bool,
    /// Segments switched away from whose records may not be durable yet (a checkpoint syncs
    /// them later, outside the lock); every `sync` syncs them first.
    retired: Vec<Seg>,
    /// The last sequence number that needs no new [`Record::Synced`] marker: every record up
    /// to it is covered by a marker (or the checkpoint the log was opened at), and the marker
    /// itself is the last record. A sync that finds nothing appended past it and every byte
    /// synced appends no marker (see [`Wal::sync_with`]).
    covered: u64,
}

impl Inner {
    fn write_out(&mut self, hook: &dyn CrashHook) -> Result<()> {
        if self.dead {
            return Err(CacheError::Dead);
        }
        for seg in &mut self.retired {
            seg.write_out(hook)?;
        }
        self.cur.keep_reserve(hook);
        self.cur.write_out(hook)
    }

    /// Whether every byte written or buffered is known durable.
    fn all_synced(&self) -> bool {
        self.retired
            .iter()
            .chain(std::iter::once(&self.cur))
            .all(|s| s.unsynced.is_empty())
    }

    /// The segments with unsynced bytes (retired first) and how many of their bytes are in
    /// the file now.
    fn to_sync(&self) -> Vec<(Arc<File>, PathBuf, usize)> {
        self.retired
            .iter()
            .chain(std::iter::once(&self.cur))
            .map(|s| (s.file.clone(), s.path.clone(), s.written))
            .collect()
    }

    fn seg_mut(&mut self, file: &Arc<File>) -> Option<&mut Seg> {
        if Arc::ptr_eq(&self.cur.file, file) {
            return Some(&mut self.cur);
        }
        self.retired.iter_mut().find(|s| Arc::ptr_eq(&s.file, file))
    }

    /// Records the outcome of fdatasync'ing `file` after `len` of its bytes were written.
    fn synced(&mut self, file: &Arc<File>, len: usize, ok: bool) {
        if let Some(seg) = self.seg_mut(file) {
            if ok {
                seg.synced(len);
            } else {
                seg.written = 0;
            }
        }
        self.retired.retain(|s| !s.unsynced.is_empty());
    }
}

/// The log writer.
#[derive(Debug)]
pub(crate) struct Wal {
    dir: PathBuf,
    inner: Mutex<Inner>,
    sync_lock: Mutex<()>,
    hook: Arc<dyn CrashHook>,
    /// Number of syncs that began / completed (serialised by `sync_lock`).
    begun: AtomicU64,
    completed: AtomicU64,
    /// The largest `upto` of a durable [`Record::Synced`] marker: records up to here are
    /// durable and so is their data.
    durable: AtomicU64,
    /// The last record known on disk, trusted or not (`durable`, or [`Wal::sync_records`]).
    on_disk: AtomicU64,
    /// Set (under `inner`) when a write-out or an fdatasync failed: some appended record may
    /// not be in the file, so a process crash could forget it. Cleared by the next write-out
    /// of every segment that succeeds. See [`Wal::ensure_written`].
    lagging: AtomicBool,
    /// Unit tests: paths of the segments fdatasync'd by `sync`, in order.
    #[cfg(test)]
    pub(crate) synced: Mutex<Vec<PathBuf>>,
}

pub(crate) fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("wal.{segment:016}"))
}

/// Existing segments, oldest first.
pub(crate) fn list_segments(dir: &Path) -> Result<Vec<u64>> {
    let mut segs = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| CacheError::io("read_dir", dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| CacheError::io("read_dir", dir, e))?;
        let name = entry.file_name();
        if let Some(n) = name.to_str().and_then(|n| n.strip_prefix("wal.")) {
            if let Ok(seg) = n.parse::<u64>() {
                segs.push(seg);
            }
        }
    }
    segs.sort_unstable();
    Ok(segs)
}

/// Reads all segments and returns the records after `after_seq`, stopping at the first torn,
/// corrupt or out-of-sequence record. Also returns the last valid sequence number.
pub(crate) fn replay(dir: &Path, after_seq: u64) -> Result<(Vec<Record>, u64)> {
    let mut out = Vec::new();
    let mut last = after_seq;
    'segments: for seg in list_segments(dir)? {
        let path = segment_path(dir, seg);
        let bytes = std::fs::read(&path).map_err(|e| CacheError::io("wal read", &path, e))?;
        for chunk in bytes.chunks(RECORD_BYTES) {
            let Some((seq, rec)) = Record::decode(chunk) else {
                tracing::warn!(path = %path.display(), last_seq = last, "WAL replay stopped at a torn record");
                break 'segments;
            };
            if seq <= after_seq {
                continue;
            }
            if seq != last + 1 {
                tracing::warn!(path = %path.display(), seq, expected = last + 1, "WAL replay stopped at a sequence gap");
                break 'segments;
            }
            last = seq;
            out.push(rec);
        }
    }
    Ok((out, last))
}

/// Disk space reserved for each segment when it is created (fallocate, file size unchanged):
/// records written within it need no new blocks, so a full filesystem can still take the
/// Evict and FlushDone records whose sync frees space. Best effort at open (the old segments
/// were just deleted, and a cache that cannot open serves nothing); a checkpoint's segment
/// whose reservation fails for lack of space is refused (see [`Wal::prepare_segment`]).
///
/// Sized by the volume ([`reserve_bytes`]): room for two records per block, at least
/// [`RESERVE_MIN_BYTES`] and at most [`RESERVE_MAX_BYTES`]. A 64 MiB volume reserves
/// 1 MiB, a volume of 256 MiB or more 4 MiB: a daemon with thousands of small volumes does
/// not hold 4 MiB of cache disk for each before any data. Half of it, one record per block, is
/// kept allocated past the records however many there are (`Seg::keep_reserve` extends the
/// allocation as they grow): freeing the whole cache writes at most one per block (an Evict
/// for a Clean block or an Unstaged for a Syncing one) plus a few per flush (FlushDone,
/// Synced). A FLUSH also checkpoints (a new segment) once half the reserve holds records
/// (`Cache::checkpoint_due`), which bounds a segment's size, not its headroom: between two
/// FLUSHes the guest's reads and writes may append two records per block (Fill, Dirty).
pub(crate) const RESERVE_MAX_BYTES: u64 = 4 << 20;
/// The smallest segment reserve (see [`RESERVE_MAX_BYTES`]).
pub(crate) const RESERVE_MIN_BYTES: u64 = 256 << 10;

/// The reserve of a new segment of a volume of `blocks` blocks (see [`RESERVE_MAX_BYTES`]).
pub(crate) fn reserve_bytes(blocks: u64) -> u64 {
    blocks
        .saturating_mul(2 * RECORD_BYTES as u64)
        .clamp(RESERVE_MIN_BYTES, RESERVE_MAX_BYTES)
}

/// Creates (truncates) segment `segment` and reserves its space; `require_reserve`: a failed
/// reservation for lack of space removes the file and is the error (other failures, such
/// as a filesystem without fallocate, are only logged).
fn create_segment(
    dir: &Path,
    segment: u64,
    reserve: u64,
    hook: &dyn CrashHook,
    require_reserve: bool,
) -> Result<(Arc<File>, PathBuf, Reserve)> {
    let path = segment_path(dir, segment);
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .map_err(|e| CacheError::io("wal create", &path, e))?;
    let reserved = crate::crash::check(hook, IoOp::WalReserve)
        .and_then(|()| crate::sys::reserve_range(&file, 0, reserve));
    let mut held = Reserve {
        step: reserve,
        held: reserve,
        failed: false,
    };
    if let Err(e) = reserved {
        if require_reserve && e.kind() == std::io::ErrorKind::StorageFull {
            drop(file);
            let _ = std::fs::remove_file(&path);
            return Err(CacheError::io("wal reserve", &path, e));
        }
        tracing::warn!(path = %path.display(), error = %e, "cannot reserve WAL space");
        held.held = 0;
        held.failed = true;
        if e.kind() == std::io::ErrorKind::Unsupported {
            held.step = 0;
        }
    }
    crate::sys::sync_dir(dir).map_err(|e| CacheError::io("fsync dir", dir, e))?;
    Ok((Arc::new(file), path, held))
}

impl Wal {
    /// Starts a fresh segment `segment` reserving `reserve` bytes ([`reserve_bytes`]); the
    /// next record gets `next_seq`.
    pub(crate) fn create(
        dir: &Path,
        segment: u64,
        next_seq: u64,
        reserve: u64,
        hook: Arc<dyn CrashHook>,
    ) -> Result<Self> {
        let (file, path, reserve) = create_segment(dir, segment, reserve, &*hook, false)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            inner: Mutex::new(Inner {
                cur: Seg::new(file, path, segment, reserve),
                next_seq,
                dead: false,
                retired: Vec::new(),
                covered: next_seq - 1,
            }),
            sync_lock: Mutex::new(()),
            hook,
            begun: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            durable: AtomicU64::new(next_seq - 1),
            on_disk: AtomicU64::new(next_seq - 1),
            lagging: AtomicBool::new(false),
            #[cfg(test)]
            synced: Mutex::new(Vec::new()),
        })
    }

    /// Appends a record to the buffer; returns its sequence number. A failed write-out of a
    /// full buffer is not this record's error: the bytes stay buffered for the next one.
    pub(crate) fn append(&self, rec: Record) -> Result<u64> {
        self.append_with(rec, WriteOut::WhenFull)
    }

    /// Appends a record and writes the buffer out now (one write(2) into the page cache, no
    /// fsync): the record survives a crash of this process, though not of the host (that is
    /// what [`Wal::sync`] is for). For records a completed request depends on: a block turning
    /// Dirty must not be forgotten by a successor daemon that recovers the device, or a FLUSH
    /// sent to that successor would acknowledge a write it lost. When the write-out fails
    /// (ENOSPC, EIO) the error is returned but the record stays appended (buffered, written
    /// by the next write-out that succeeds): the caller's state change must still happen.
    pub(crate) fn append_visible(&self, rec: Record) -> Result<u64> {
        self.append_with(rec, WriteOut::Now)
    }

    /// Appends a record without ever writing the buffer out (no syscall, so nothing the kernel
    /// could throttle): for appends under the write gate, which stalls all I/O. The next
    /// `append` or `sync` writes the buffer.
    pub(crate) fn append_buffered(&self, rec: Record) -> Result<u64> {
        self.append_with(rec, WriteOut::Never)
    }

    fn append_with(&self, rec: Record, write_out: WriteOut) -> Result<u64> {
        let mut inner = self.inner.lock();
        if inner.dead {
            return Err(CacheError::Dead);
        }
        let seq = inner.next_seq;
        rec.encode(seq, &mut inner.cur.unsynced);
        inner.next_seq += 1;
        match write_out {
            WriteOut::Now => self.write_out(&mut inner)?,
            WriteOut::WhenFull if inner.cur.pending() >= WRITE_OUT_BYTES => {
                if let Err(e) = self.write_out(&mut inner) {
                    tracing::warn!(error = %e, "WAL write-out failed; records stay buffered");
                }
            }
            WriteOut::WhenFull | WriteOut::Never => {}
        }
        Ok(seq)
    }

    /// Writes every buffered byte of every segment out; keeps [`Wal::lagging`] true while
    /// one may be missing from its file.
    fn write_out(&self, inner: &mut Inner) -> Result<()> {
        let r = inner.write_out(&*self.hook);
        self.lagging.store(r.is_err(), Ordering::Release);
        r
    }

    /// Makes sure every appended record is in its file (the page cache: it survives a crash
    /// of this process), writing the buffer out if an earlier write-out or sync failed. Costs
    /// one atomic load when none did. A write to a block that is already Dirty appends no
    /// record and calls this before it completes: the block's Dirty record may be one a
    /// failed write-out left buffered (see `Cache::commit_write`).
    pub(crate) fn ensure_written(&self) -> Result<()> {
        if !self.lagging.load(Ordering::Acquire) {
            return Ok(());
        }
        self.write_out(&mut self.inner.lock())
    }

    /// Whether an earlier write-out failed and records may sit in the buffer only (one
    /// atomic load).
    pub(crate) fn lagging(&self) -> bool {
        self.lagging.load(Ordering::Acquire)
    }

    /// Last appended sequence number.
    pub(crate) fn last_seq(&self) -> u64 {
        self.inner.lock().next_seq - 1
    }

    /// The last record known durable together with its data (covered by a durable
    /// [`Record::Synced`] marker of this session, or by recovery).
    pub(crate) fn durable_seq(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// The last record known to be on disk, whether or not a marker covers it (see
    /// [`Wal::sync_records`]).
    pub(crate) fn on_disk_seq(&self) -> u64 {
        self.on_disk.load(Ordering::Acquire).max(self.durable_seq())
    }

    /// Makes every record appended before this call durable *without* a [`Record::Synced`]
    /// marker and without syncing any data file (one write-out and fdatasync of the log):
    /// after a power loss recovery finds them but trusts none of their data, so the blocks
    /// they name cannot come back Clean (`drop_untrusted` in `Cache::open` sends them back to
    /// the store). For a caller that needs a record on disk, not its data (see
    /// `Cache::read_for_flush`). Moves [`Wal::on_disk_seq`], never [`Wal::durable_seq`], and
    /// never satisfies a FLUSH waiting in [`Wal::sync_with`].
    pub(crate) fn sync_records(&self) -> Result<u64> {
        let _serial = self.sync_lock.lock();
        let (upto, segs) = {
            let mut inner = self.inner.lock();
            if inner.dead {
                return Err(CacheError::Dead);
            }
            self.write_out(&mut inner)?;
            (inner.next_seq - 1, inner.to_sync())
        };
        for (f, path, len) in &segs {
            self.sync_one(f, path, *len)?;
        }
        self.on_disk.fetch_max(upto, Ordering::AcqRel);
        Ok(upto)
    }

    /// [`Wal::sync_with`] for data that does not depend on which records it covers (tests).
    #[cfg(test)]
    pub(crate) fn sync(&self, sync_data: impl FnOnce() -> Result<()>) -> Result<()> {
        self.sync_with(|| (self.last_seq(), ()), |()| sync_data())
    }

    /// Makes every record appended before this call durable; `sync_data` runs first (data files
    /// must be durable before the records that point at them). Then a [`Record::Synced`]
    /// marker naming the last record `pick` saw is appended and made durable with them: after
    /// a power loss, recovery trusts the data of exactly the records a durable marker covers
    /// (see `Cache::open`). A failure leaves every record appended (a later sync writes and
    /// syncs them again); the caller's FLUSH fails. When nothing was appended since a durable
    /// marker that covered every record before it, `sync_data` still runs but no marker is
    /// appended (a FLUSH after rewrites of Dirty blocks costs no WAL write or fdatasync).
    ///
    /// `pick` returns `(upto, files)`: the last appended record ([`Wal::last_seq`]) and the
    /// data files `sync_data` syncs, read together while no record can move data out of those
    /// files (the caller holds the read gate, which rotation and flush completion need for
    /// their records). Picked apart, a flush completion between them would leave the marker
    /// covering the flushing file's blocks (up to the Rotate) while the files synced no
    /// longer include it.
    pub(crate) fn sync_with<T>(
        &self,
        pick: impl FnOnce() -> (u64, T),
        sync_data: impl FnOnce(T) -> Result<()>,
    ) -> Result<()> {
        let seen = self.begun.load(Ordering::Acquire);
        let _serial = self.sync_lock.lock();
        if self.completed.load(Ordering::Acquire) > seen {
            return Ok(()); // a sync that began after our writes completed covered us
        }
        let me = self.begun.fetch_add(1, Ordering::AcqRel) + 1;
        // Records appended while we waited for the lock may still sit in the buffer; write
        // them too (those appended after `pick` are written out with the marker).
        self.write_out(&mut self.inner.lock())?;
        let (upto, files) = pick();
        sync_data(files)?;
        // The marker goes to the current segment. Records a checkpoint's segment switch wrote
        // out to an older segment count too: retired segments are synced first (replay stops
        // at the first torn record).
        let segs = {
            let mut inner = self.inner.lock();
            if inner.dead {
                return Err(CacheError::Dead);
            }
            let seq = inner.next_seq;
            if seq - 1 == inner.covered && inner.all_synced() {
                // Nothing was appended since a durable marker that covers every record before
                // it (data written since to blocks already Dirty needs no record: `sync_data`
                // made it durable). Another marker would cover nothing new; on a full disk it
                // would eat the room kept for the records that free space.
                // That marker may have become durable without a sync of ours (a checkpoint's
                // `sync_retired` after our fdatasync failed): `durable` must learn it here, or
                // the cleanups waiting for it (`Cache::after_sync`) would wait for a record
                // that may never come.
                drop(inner);
                self.durable.fetch_max(seq - 1, Ordering::AcqRel);
                self.completed.store(me, Ordering::Release);
                return Ok(());
            }
            Record::Synced { upto }.encode(seq, &mut inner.cur.unsynced);
            inner.next_seq += 1;
            if upto == seq - 1 {
                // Covers everything before it once durable (`all_synced` says when).
                inner.covered = seq;
            }
            self.write_out(&mut inner)?;
            inner.to_sync()
        };
        for (f, path, len) in &segs {
            self.sync_one(f, path, *len)?;
        }
        self.durable.fetch_max(upto, Ordering::AcqRel);
        self.completed.store(me, Ordering::Release);
        Ok(())
    }

    /// fdatasync of one segment whose first `len` unsynced bytes were written; records the
    /// outcome (on failure they are written again before the next sync).
    fn sync_one(&self, f: &Arc<File>, path: &Path, len: usize) -> Result<()> {
        let r = crate::crash::check(&*self.hook, IoOp::WalSync).and_then(|()| f.sync_data());
        let mut inner = self.inner.lock();
        inner.synced(f, len, r.is_ok());
        if r.is_err() {
            // Its bytes are written again before the next sync (the kernel may drop them).
            self.lagging.store(true, Ordering::Release);
        }
        drop(inner);
        #[cfg(test)]
        self.synced.lock().push(path.to_path_buf());
        r.map_err(|e| CacheError::io("wal fdatasync", path, e))
    }

    /// Makes a segment switched away from by [`Wal::switch_to`] durable (the checkpoint's
    /// sync, outside the write gate); later syncs skip it once it is.
    pub(crate) fn sync_retired(&self, file: &Arc<File>, path: &Path) -> Result<()> {
        let _serial = self.sync_lock.lock();
        let len = {
            let mut inner = self.inner.lock();
            match inner.seg_mut(file) {
                Some(seg) => match seg.write_out(&*self.hook) {
                    Ok(()) => seg.written,
                    Err(e) => {
                        self.lagging.store(true, Ordering::Release);
                        return Err(e);
                    }
                },
                None => return Ok(()), // a FLUSH synced it meanwhile
            }
        };
        self.sync_one(file, path, len)
    }

    /// Creates segment file `segment` (outside any lock; it becomes current in [`Wal::switch_to`]).
    /// Fails when the disk has no room for its reserve: switching to it would leave the records
    /// that free space (Evict, FlushDone) nowhere to go on a full disk, while the current
    /// segment still holds its reserve.
    /// `reserve`: see [`reserve_bytes`].
    pub(crate) fn prepare_segment(&self, segment: u64, reserve: u64) -> Result<PreparedSegment> {
        let (file, path, reserve) = create_segment(&self.dir, segment, reserve, &*self.hook, true)?;
        Ok(PreparedSegment {
            file,
            path,
            segment,
            reserve,
        })
    }

    /// Makes `next` the current segment; records appended after this call go there. Returns
    /// the old segment file (the caller syncs it with [`Wal::sync_retired`]; until then every
    /// `sync` writes and syncs it too) and the last sequence number appended to the old
    /// segments. Takes no I/O: the old segment's buffered records move with it.
    pub(crate) fn switch_to(&self, next: PreparedSegment) -> Result<(Arc<File>, PathBuf, u64)> {
        let mut inner = self.inner.lock();
        if inner.dead {
            return Err(CacheError::Dead);
        }
        let old = std::mem::replace(
            &mut inner.cur,
            Seg::new(next.file, next.path, next.segment, next.reserve),
        );
        let (file, path) = (old.file.clone(), old.path.clone());
        inner.retired.push(old);
        Ok((file, path, inner.next_seq - 1))
    }

    /// Forgets every retired segment (a checkpoint now covers their records).
    pub(crate) fn drop_retired(&self) {
        self.inner.lock().retired.clear();
    }

    pub(crate) fn segment(&self) -> u64 {
        self.inner.lock().cur.segment
    }

    /// Whether records are appended that no successful sync covered yet, or a write-out is
    /// behind (what `Cache::degraded` reports while a disk is full).
    pub(crate) fn behind(&self) -> bool {
        let inner = self.inner.lock();
        inner.cur.pending() > 0 || inner.retired.iter().any(|s| s.pending() > 0)
    }

    /// Drops buffered records and refuses further writes (the process "died").
    pub(crate) fn kill(&self) {
        let mut inner = self.inner.lock();
        inner.dead = true;
        let cur = &mut inner.cur;
        cur.unsynced.truncate(cur.written);
        for seg in &mut inner.retired {
            seg.unsynced.truncate(seg.written);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new log in `dir`: segment 1, first record 1, the smallest reserve, no faults.
    fn fresh_wal(dir: &Path) -> Wal {
        Wal::create(
            dir,
            1,
            1,
            RESERVE_MIN_BYTES,
            Arc::new(crate::crash::NoCrash),
        )
        .unwrap()
    }

    #[test]
    fn records_round_trip_and_torn_tail_stops_replay() {
        let dir = tempfile::tempdir().unwrap();
        let wal = fresh_wal(dir.path());
        let recs = [
            Record::Dirty { first: 3, count: 2 },
            Record::Rotate { new_gen: 2 },
            Record::Fill { block: 9, crc: 77 },
            Record::Evict { block: 9 },
            Record::FlushDone { gen: 1 },
            Record::Unstaged { block: 4 },
            Record::Unmapped { block: 5 },
        ];
        for r in recs {
            wal.append(r).unwrap();
        }
        wal.sync(|| Ok(())).unwrap();
        let marker = Record::Synced { upto: 7 };
        let (got, last) = replay(dir.path(), 0).unwrap();
        assert_eq!(got, [&recs[..], &[marker]].concat());
        assert_eq!(last, 8);
        // records at or before the checkpoint sequence are skipped
        let (got, _) = replay(dir.path(), 2).unwrap();
        assert_eq!(got, [&recs[2..], &[marker]].concat());

        // Tear the 4th record: replay keeps exactly the first three.
        let path = segment_path(dir.path(), 1);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[3 * RECORD_BYTES + 20] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (got, last) = replay(dir.path(), 0).unwrap();
        assert_eq!(got, recs[..3].to_vec());
        assert_eq!(last, 3);
        // A half-written record is torn too.
        std::fs::write(&path, &bytes[..RECORD_BYTES + 7]).unwrap();
        assert_eq!(replay(dir.path(), 0).unwrap().0, recs[..1].to_vec());
    }

    /// `sync_records` puts the records on disk with no marker (recovery does not trust their
    /// data) and satisfies no FLUSH: the next sync still syncs the data and writes a marker.
    #[test]
    fn sync_records_puts_records_on_disk_without_a_marker() {
        let dir = tempfile::tempdir().unwrap();
        let wal = fresh_wal(dir.path());
        let before = wal.durable_seq();
        let dirty = Record::Dirty { first: 2, count: 1 };
        let seq = wal.append(dirty).unwrap();
        let rotate = wal.append_buffered(Record::Rotate { new_gen: 2 }).unwrap();
        assert_eq!(wal.sync_records().unwrap(), rotate);
        assert!(wal.on_disk_seq() >= rotate && seq < rotate);
        assert_eq!(wal.durable_seq(), before, "no marker covers them");
        assert_eq!(wal.synced.lock().len(), 1, "one fdatasync of the log");
        let (got, _) = replay(dir.path(), 0).unwrap();
        assert_eq!(got, vec![dirty, Record::Rotate { new_gen: 2 }]);
        let data_synced = AtomicBool::new(false);
        wal.sync(|| {
            data_synced.store(true, Ordering::Release);
            Ok(())
        })
        .unwrap();
        assert!(
            data_synced.load(Ordering::Acquire),
            "the FLUSH syncs the data"
        );
        assert_eq!(wal.durable_seq(), rotate);
        let (got, _) = replay(dir.path(), 0).unwrap();
        assert_eq!(got.last(), Some(&Record::Synced { upto: rotate }));
    }

    #[test]
    fn killed_wal_drops_buffered_records() {
        let dir = tempfile::tempdir().unwrap();
        let wal = fresh_wal(dir.path());
        wal.append(Record::Evict { block: 1 }).unwrap();
        wal.sync(|| Ok(())).unwrap();
        wal.append(Record::Evict { block: 2 }).unwrap();
        wal.kill();
        assert!(wal.sync(|| Ok(())).is_err());
        assert_eq!(
            replay(dir.path(), 0).unwrap().0,
            vec![Record::Evict { block: 1 }, Record::Synced { upto: 1 }]
        );
    }

    /// A sync with nothing appended since a durable marker that covers every record before it
    /// runs `sync_data` but appends no marker; one after a new record, or after a marker that
    /// did not cover a record appended while its data synced, appends one.
    #[test]
    fn a_sync_with_nothing_new_appends_no_marker() {
        let dir = tempfile::tempdir().unwrap();
        let wal = fresh_wal(dir.path());
        let data_syncs = std::cell::Cell::new(0);
        let sync = || {
            wal.sync(|| {
                data_syncs.set(data_syncs.get() + 1);
                Ok(())
            })
            .unwrap()
        };
        sync(); // just opened: everything is covered
        assert_eq!((wal.last_seq(), data_syncs.get()), (0, 1));
        wal.append(Record::Evict { block: 1 }).unwrap();
        sync();
        sync();
        sync();
        assert_eq!(
            (wal.last_seq(), data_syncs.get()),
            (2, 4),
            "one marker for three syncs"
        );
        // A record appended between `pick` and the marker is not covered by it: the next sync
        // must append a marker that covers it.
        wal.sync_with(
            || (wal.last_seq(), ()),
            |()| wal.append(Record::Evict { block: 2 }).map(drop),
        )
        .unwrap();
        assert_eq!(wal.last_seq(), 4, "Evict 2 (3), marker upto 2 (4)");
        sync();
        assert_eq!(wal.last_seq(), 5);
        sync();
        let recs = replay(dir.path(), 0).unwrap().0;
        assert_eq!(
            recs,
            vec![
                Record::Evict { block: 1 },
                Record::Synced { upto: 1 },
                Record::Evict { block: 2 },
                Record::Synced { upto: 2 },
                Record::Synced { upto: 4 },
            ]
        );
    }

    /// A FLUSH that runs between a checkpoint's segment switch and the checkpoint's sync of the
    /// old segment must still make the records written out to that old segment durable.
    #[test]
    fn sync_covers_records_in_a_switched_away_segment() {
        let dir = tempfile::tempdir().unwrap();
        let wal = fresh_wal(dir.path());
        wal.append(Record::Dirty { first: 1, count: 1 }).unwrap();
        let next = wal.prepare_segment(2, RESERVE_MIN_BYTES).unwrap();
        let (old, old_path, _) = wal.switch_to(next).unwrap();
        wal.sync(|| Ok(())).unwrap(); // the checkpoint has not synced `old` yet
        assert!(
            wal.synced.lock().contains(&old_path),
            "FLUSH returned while the Dirty record sat unsynced in the old segment"
        );
        // once the checkpoint synced it, later syncs skip it
        wal.sync_retired(&old, &old_path).unwrap();
        wal.synced.lock().clear();
        wal.append(Record::Evict { block: 2 }).unwrap();
        wal.sync(|| Ok(())).unwrap();
        assert!(!wal.synced.lock().contains(&old_path));
    }

    #[test]
    fn segments_continue_the_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let wal = fresh_wal(dir.path());
        wal.append(Record::Evict { block: 1 }).unwrap();
        let next = wal.prepare_segment(2, RESERVE_MIN_BYTES).unwrap();
        let (old, old_path, last) = wal.switch_to(next).unwrap();
        wal.sync_retired(&old, &old_path).unwrap();
        assert_eq!(last, 1);
        wal.append(Record::Evict { block: 2 }).unwrap();
        wal.sync(|| Ok(())).unwrap();
        assert_eq!(list_segments(dir.path()).unwrap(), vec![1, 2]);
        let (got, last) = replay(dir.path(), 0).unwrap();
        assert_eq!(got.len(), 3); // two evictions, the sync's marker
        assert_eq!(got[2], Record::Synced { upto: 2 });
        assert_eq!(last, 3);
    }
}
