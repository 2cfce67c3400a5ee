//! Flush support: rotation, reading the syncing blocks, completion.
//!
//! A flush to the object store, as the volume drives it:
//! 1. `rotate()` (write gate): a fresh sparse active file; every Dirty block becomes Syncing
//!    and now reads from the flushing file; the active file's page-CRC store moves into the
//!    [`Rotation`] (later writes record into a fresh store, not into the snapshot). Logged.
//!    Under the gate this is O(dirty blocks): the state map's dirty set names them (no scan
//!    of the map), the CRC store moves as one `Arc`; sorting the block list happens after.
//! 2. `read_for_flush()` per block (read gate): bytes from the flushing file, page CRCs
//!    verified (or computed, where unknown: zero-copy writes, recovered rotations). A block
//!    still Syncing is also staged into the clean file at its offset; if that write fails
//!    (full disk) the block is left out and becomes NotPresent + REMOTE at step 4. Staging
//!    overwrites the block's older clean copy in place, so it waits until the WAL's records
//!    are on disk up to the Rotate record: before that, a power loss that loses the block's
//!    Dirty record brings the block back Clean, reading the clean file, which must still hold
//!    the older copy (or the block would read the unacknowledged write, then its older
//!    version from the store once evicted). With the record on disk but no marker covering
//!    it, recovery sends the block back to the store instead (`drop_untrusted`). The first
//!    `read_for_flush` of a rotation makes them so (one fdatasync of the log, no marker, no
//!    data file); if that fails, so does the flush (nothing may be published either: the
//!    store would hold a version the cache, back Clean over its old copy, does not). A block
//!    whose bytes are all zeros (a DISCARD, WRITE_ZEROES, or zeros written) is not staged:
//!    `read_for_flush` says so, the volume publishes it unmapped (no pack holds it), and it
//!    becomes NotPresent without REMOTE at step 4 (reads cost no I/O; its old clean copy is
//!    punched).
//! 3. The volume uploads packs and publishes the manifest.
//! 4. `complete_flush()`: clean file synced; then (write gate, O(rotated blocks)) an Unstaged
//!    record per block left out at step 2, then FlushDone, logged; Syncing blocks become
//!    Clean + REMOTE, those left out NotPresent + REMOTE, unmapped ones NotPresent (an
//!    Unmapped record each, before FlushDone; blocks re-written meanwhile stay Dirty);
//!    the data files and then the WAL are synced, and only then is the flushing file deleted
//!    (if that sync fails, e.g. on a full disk, the next sync that succeeds deletes it; the
//!    completion's state changes stand, see `space`).
//!
//! If 3 fails nothing changes: the rotation stays pending (`pending_flush()`), its blocks stay
//! readable and writable (promotion), and the next flush retries it before rotating again.
//! A promoted block still belongs to the rotation: the flush publishes its bytes as of the
//! rotation (from the flushing file), so the store gets the image of one moment. After a
//! crash the pending rotation is rebuilt from the blocks marked `ROTATED` (Syncing, or
//! promoted since; see `state`), the same blocks as the rotation that was lost.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::cache::Cache;
use crate::crash::{CrashPoint, IoOp};
use crate::crcs::PageCrcs;
use crate::error::{CacheError, Result};
use crate::files::{data_path, open_data_file};
use crate::gate::Holder;
use crate::geometry::PAGE_SIZE;
use crate::rotation::Rotation;
use crate::state::{BlockState, Flushed};
use crate::wal::Record;

impl Cache {
    /// The rotation waiting for upload, if any (an earlier flush failed or the process
    /// restarted mid-flush). The volume finishes it before rotating again.
    pub fn pending_flush(&self) -> Option<Arc<Rotation>> {
        self.pending.lock().clone()
    }

    /// Rotates the active file. `Ok(None)` when nothing is dirty. Fails with `FlushPending`
    /// while an earlier rotation is not complete.
    pub fn rotate(&self) -> Result<Option<Arc<Rotation>>> {
        let _admin = self.admin.lock();
        self.writable()?;
        if let Some(p) = self.pending.lock().as_ref() {
            return Err(CacheError::FlushPending { gen: p.gen });
        }
        let new_gen = self.gate.read().active_gen + 1;
        let new_path = data_path(&self.dir, new_gen);
        let new_file = Arc::new(open_data_file(&new_path)?);
        crate::sys::sync_dir(&self.dir).map_err(|e| CacheError::io("fsync dir", &self.dir, e))?;
        let fresh = Arc::new(PageCrcs::default());
        let (mut blocks, crcs, rotate_seq) = {
            let mut files = self.write_gate(Holder::Rotate);
            self.crash_point(CrashPoint::BeforeRotate)?;
            if self.states.dirty_is_empty() {
                drop(files);
                let _ = std::fs::remove_file(&new_path);
                return Ok(None);
            }
            let rotate_seq = self.wal.append_buffered(Record::Rotate { new_gen })?;
            // Every block that became Dirty since the last rotation, each once (`state`).
            // Their CRCs move with the store: the bit no longer points at the live one.
            // `ROTATED` stays until the completion, whatever writes promote (`state`).
            let blocks = self.states.rotate();
            let crcs = std::mem::replace(&mut files.crcs, fresh);
            files.flushing_crcs = Some(crcs.clone());
            let old = std::mem::replace(&mut files.active, new_file);
            files.flushing = Some(old);
            files.flushing_gen = Some(files.active_gen);
            files.active_gen = new_gen;
            (blocks, crcs, rotate_seq)
        };
        blocks.sort_unstable();
        let rot = Arc::new(Rotation {
            gen: new_gen - 1,
            blocks,
            crcs: Some(crcs),
            unstaged: Default::default(),
            unmapped: Default::default(),
            rotate_seq,
        });
        *self.pending.lock() = Some(rot.clone());
        Ok(Some(rot))
    }

    /// Reads block `rot.blocks()[idx]` as of the rotation into `buf` (one block long),
    /// verifying the page CRCs recorded at write time, and stages it into the clean file if it
    /// is still Syncing. Returns `true` when the block is all zeros: it is then not staged,
    /// and the caller must publish it unmapped (see the module docs); `complete_flush` leaves
    /// it NotPresent without a remote copy.
    pub fn read_for_flush(&self, rot: &Rotation, idx: usize, buf: &mut [u8]) -> Result<bool> {
        let bs = self.geo().block_size() as usize;
        if buf.len() != bs {
            return Err(CacheError::BadLength {
                expected: bs,
                got: buf.len(),
            });
        }
        let block = *rot.blocks.get(idx).ok_or(CacheError::OutOfRange {
            offset: idx as u64,
            len: 1,
            size: rot.blocks.len() as u64,
        })?;
        // The clean file changes in place below (the staging, or the punch of a zero block's
        // old copy), and the store gets the block, only once the records that made the block
        // Dirty and then Syncing are on disk (see the module docs).
        self.log_rotation(rot)?;
        let gate = self.enter();
        self.alive()?;
        let off = block * self.geo().bs();
        let flushing = gate
            .flushing()
            .ok_or_else(|| self.missing_flushing(block))?;
        flushing
            .read_exact_at(buf, off)
            .map_err(|e| CacheError::io("flush pread", &self.dir, e))?;
        if let Some(crcs) = &rot.crcs {
            let ppb = u64::from(self.geo().pages_per_block());
            let mut known = vec![None; ppb as usize];
            crcs.get(block * ppb..(block + 1) * ppb, &mut known);
            for (page, expected) in known.into_iter().enumerate() {
                let Some(expected) = expected else { continue };
                let p = PAGE_SIZE as usize;
                let found = crc32c::crc32c(&buf[page * p..(page + 1) * p]);
                if found != expected {
                    return Err(CacheError::ChecksumMismatch {
                        block,
                        page: page as u32,
                        expected,
                        found,
                    });
                }
            }
        }
        if is_zero(buf) {
            // Its old clean copy (if any) is dead: nothing reads the clean file at this
            // offset while the block is not Clean, and it never is Clean again before a fill
            // or a staging writes it.
            if self.states.get(block).state == BlockState::Syncing {
                self.punch_blocks(gate.clean(), std::iter::once(block));
            }
            rot.unmapped.lock().insert(block);
            return Ok(true);
        }
        if self.states.get(block).state == BlockState::Syncing {
            let r = crate::crash::check(&*self.hook, IoOp::Stage)
                .and_then(|()| gate.clean().write_all_at(buf, off));
            if let Err(e) = r {
                // Not the flush's error (the bytes in `buf` are good): the block is left out
                // of the clean file and fetched again when needed (see `space`). Nothing reads
                // the clean file at this offset while the block is not Clean.
                self.punch_blocks(gate.clean(), std::iter::once(block));
                let _ = self.note::<()>(Err(CacheError::io("stage pwrite", &self.dir, e)));
                rot.unstaged.lock().push(block);
            }
        }
        Ok(false)
    }

    /// Puts the WAL's records on disk up to `rot`'s Rotate record (and so every Dirty record
    /// of its blocks) when they are not yet: one log fdatasync per rotation, by its first
    /// `read_for_flush`, without a `Synced` marker or any data file sync
    /// ([`crate::wal::Wal::sync_records`]: after a power loss recovery then sends a block
    /// whose Dirty record it does not trust back to the store, never to the clean file). A
    /// failure (noted: the cache is degraded) is the flush's: the rotation stays pending.
    fn log_rotation(&self, rot: &Rotation) -> Result<()> {
        if rot.rotate_seq <= self.wal.on_disk_seq() {
            return Ok(());
        }
        self.note(self.wal.sync_records()).map(drop)
    }

    /// Starts writing back the clean-file copies staged by `read_for_flush` for blocks
    /// `rot.blocks()[range]` (optional; makes the sync in `complete_flush` cheaper).
    pub fn start_writeback(&self, rot: &Rotation, range: std::ops::Range<usize>) -> Result<()> {
        let Some(blocks) = rot.blocks.get(range) else {
            return Ok(());
        };
        let clean = self.gate.read().clean.clone();
        let bs = self.geo().bs();
        let mut i = 0;
        while i < blocks.len() {
            let start = blocks[i];
            let mut end = start + 1;
            i += 1;
            while i < blocks.len() && blocks[i] == end {
                end += 1;
                i += 1;
            }
            crate::sys::start_writeback(&clean, start * bs, (end - start) * bs)
                .map_err(|e| CacheError::io("sync_file_range", &self.dir, e))?;
        }
        Ok(())
    }

    /// Marks the rotation durable in the object store (call after the manifest that points at
    /// every block of `rot` was published). See the module docs for the order of steps.
    pub fn complete_flush(&self, rot: &Rotation) -> Result<()> {
        let _admin = self.admin.lock();
        self.alive()?;
        let clean = self.gate.read().clean.clone();
        self.sync_files(&[clean])?;
        let unstaged = std::mem::take(&mut *rot.unstaged.lock());
        let unmapped = std::mem::take(&mut *rot.unmapped.lock());
        let done_seq;
        let old = {
            let mut files = self.write_gate(Holder::CompleteFlush);
            if files.flushing_gen != Some(rot.gen) {
                return Err(CacheError::Corrupt {
                    path: self.dir.clone(),
                    what: format!(
                        "complete_flush for generation {} but flushing generation is {:?}",
                        rot.gen, files.flushing_gen
                    ),
                });
            }
            // Fills whose token predates this completion are refused from here on: a block
            // turning NotPresent below must not take a fetch of its previous version (the
            // bump is seen by any fill that sees the new state: Release CAS after AcqRel).
            self.epoch.bump();
            // Blocks whose staging failed have no clean copy: they leave this flush
            // NotPresent (remote only). Their records go before FlushDone, so no write-out,
            // short write or crash can keep the FlushDone without them (replay would make
            // them Clean over the hole in the clean file).
            let unstaged: HashSet<u64> = unstaged
                .into_iter()
                .filter(|&b| self.states.get(b).state == BlockState::Syncing)
                .collect();
            for &b in &unstaged {
                self.wal.append_buffered(Record::Unstaged { block: b })?;
            }
            for &b in &unmapped {
                self.wal.append_buffered(Record::Unmapped { block: b })?;
            }
            done_seq = self
                .wal
                .append_buffered(Record::FlushDone { gen: rot.gen })?;
            for &b in &rot.blocks {
                // Published unmapped: no pack holds it, so never REMOTE.
                let how = if unmapped.contains(&b) {
                    Flushed::Unmapped
                } else if unstaged.contains(&b) {
                    Flushed::Unstaged
                } else {
                    Flushed::Staged
                };
                self.states.complete_rotated(b, how);
            }
            files.flushing_gen = None;
            files.flushing_crcs = None;
            files.flushing.take()
        };
        *self.pending.lock() = None;
        let p = data_path(&self.dir, rot.gen);
        if let Err(e) = self.sync_log() {
            // The flushing file goes once a later sync makes FlushDone durable (see `space`).
            self.deferred.lock().remove.push((done_seq, p));
            return Err(e);
        }
        self.crash_point(CrashPoint::AfterFlushComplete)?;
        drop(old);
        std::fs::remove_file(&p).map_err(|e| CacheError::io("remove", &p, e))?;
        Ok(())
    }
}

/// Whether `buf` holds only zero bytes (checked a page at a time, so a block of data
/// usually answers after its first page).
fn is_zero(buf: &[u8]) -> bool {
    buf.chunks(PAGE_SIZE as usize)
        .all(|page| page.iter().fold(0u8, |acc, &b| acc | b) == 0)
}
