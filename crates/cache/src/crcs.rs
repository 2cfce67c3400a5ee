//! Per-page checksums of the active file, and how racing writes keep them truthful.
//!
//! Each 4 KiB page has a CRC32C and a "known" bit. A known CRC must describe the bytes that
//! are in the file: `read_for_flush` verifies it before upload, and a mismatch means
//! corruption (the flush fails and nothing is uploaded). An unknown CRC is computed from the
//! file at flush time instead (zero-copy writes, recovered rotations).
//!
//! Concurrent writes to one page are legal (the page ends up holding one of them), so "the
//! CRC of the write that landed last" needs care; a CRC of the write that lost the race
//! would fail verification for ever and wedge flushing. The rules:
//! - Only an *exclusive* writer records a CRC: one that holds the stripe locks of all its
//!   blocks from before its data lands until after the CRC is stored (the plain write path).
//!   Exclusive writers of a block therefore never overlap each other.
//! - Every other writer (zero-copy: the kernel moves the data, no lock is held) records
//!   nothing; at commit it first bumps the epoch of each block's stripe, then forgets the
//!   page CRCs. It does the same in prepare, before its data can land, so a write that never
//!   commits (failed kernel I/O, dropped ticket) leaves no stale CRC either.
//! - An exclusive writer reads the epochs of its stripes before its data lands, stores its
//!   CRCs, then reads the epochs again; if any changed, a non-exclusive write may have
//!   landed after its data, and it forgets its CRCs again.
//!
//! Why that is enough (all of these atomics are SeqCst, so they have one total order): let a
//! non-exclusive write Z overlap an exclusive write U. If Z's bump comes before U's first
//! epoch read, Z's data landed before U's, so U's CRC is right (or Z's later forget makes it
//! unknown). If Z's bump comes between U's two reads, U forgets. If it comes after U's second
//! read, Z's forget comes after U's store. In no order does a known CRC survive that does not
//! describe the last landed bytes. Forgetting is always safe; it only costs verification.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Per-4 KiB-page CRC32C with a "known" bit per page, and the non-exclusive-write epochs.
#[derive(Debug)]
pub(crate) struct PageCrcs {
    crcs: Box<[AtomicU32]>,
    known: Box<[AtomicU64]>,
    /// Bumped by every non-exclusive commit, per block stripe.
    epochs: Box<[AtomicU64]>,
}

impl PageCrcs {
    pub(crate) fn new(num_pages: u64, stripes: usize) -> Self {
        Self {
            crcs: (0..num_pages).map(|_| AtomicU32::new(0)).collect(),
            known: (0..num_pages.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            epochs: (0..stripes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn idx(page: u64) -> usize {
        usize::try_from(page).unwrap_or(usize::MAX)
    }

    /// Records the CRC of a page whose whole content the caller just wrote, as an exclusive
    /// writer (see the module docs).
    pub(crate) fn set(&self, page: u64, crc: u32) {
        self.crcs[Self::idx(page)].store(crc, Ordering::Relaxed);
        self.known[Self::idx(page / 64)].fetch_or(1 << (page % 64), Ordering::SeqCst);
    }

    pub(crate) fn forget(&self, page: u64) {
        self.known[Self::idx(page / 64)].fetch_and(!(1 << (page % 64)), Ordering::SeqCst);
    }

    pub(crate) fn get(&self, page: u64) -> Option<u32> {
        let known = self.known[Self::idx(page / 64)].load(Ordering::Acquire) & (1 << (page % 64));
        (known != 0).then(|| self.crcs[Self::idx(page)].load(Ordering::Relaxed))
    }

    /// Sum of the epochs of `stripes` (each only grows, so the sum changes iff one did).
    pub(crate) fn epoch_sum(&self, stripes: impl Iterator<Item = usize>) -> u64 {
        stripes.fold(0u64, |s, i| {
            s.wrapping_add(self.epochs[i].load(Ordering::SeqCst))
        })
    }

    /// A non-exclusive write to these stripes is committing (call before `forget`).
    pub(crate) fn bump(&self, stripes: impl Iterator<Item = usize>) {
        for i in stripes {
            self.epochs[i].fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_crcs_known_bit() {
        let c = PageCrcs::new(130, 4);
        assert_eq!(c.get(129), None);
        c.set(129, 7);
        assert_eq!(c.get(129), Some(7));
        c.forget(129);
        assert_eq!(c.get(129), None);
    }

    #[test]
    fn epochs_show_non_exclusive_commits() {
        let c = PageCrcs::new(8, 4);
        let before = c.epoch_sum([1, 2].into_iter());
        c.bump([3].into_iter());
        assert_eq!(c.epoch_sum([1, 2].into_iter()), before);
        c.bump([2].into_iter());
        assert_ne!(c.epoch_sum([1, 2].into_iter()), before);
    }
}
