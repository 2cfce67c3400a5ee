//! Per-page checksums of the active file, and how racing writes keep them truthful.
//!
//! Each 4 KiB page of the active file may have a *known* CRC32C. A known CRC must describe the
//! bytes that are in the file: `read_for_flush` verifies it before upload, and a mismatch
//! means corruption (the flush fails and nothing is uploaded). An unknown CRC is computed from
//! the file at flush time instead (zero-copy writes, recovered rotations).
//!
//! Storage (sparse): a [`PageCrcs`] holds only known CRCs, in chunks of [`CHUNK_PAGES`] pages
//! (a 32-bit known mask + 32 CRCs, 132 bytes) in 64 mutex-sharded hash maps; a chunk is
//! created by its first known CRC and removed when its last one is forgotten. Memory is
//! therefore ~150 bytes per 128 KiB of the active file that the plain (exclusive) path wrote,
//! and nothing for zero-copy writes, which never record a CRC. The store of the active file
//! lives in the gate's `Files`: rotation (write gate) moves it, whole, into the [`Rotation`]
//! (O(1), no copy) and the new active file starts with an empty one; later writes cannot
//! touch the moved store, so it is the snapshot `read_for_flush` verifies against.
//! A partial write that promotes a Syncing block copies that block's known CRCs from the
//! flushing store, so the pages it does not overwrite stay verified.
//!
//! [`Rotation`]: crate::Rotation
//!
//! Concurrent writes to one page are legal (the page ends up holding one of them), so "the
//! CRC of the write that landed last" needs care; a CRC of the write that lost the race
//! would fail verification for ever and wedge flushing. The rules:
//! - Only an *exclusive* writer records a CRC: one that holds the stripe locks of all its
//!   blocks from before its data lands until after the CRC is stored (the plain write path).
//!   Exclusive writers of a block therefore never overlap each other. After storing a block's
//!   CRCs it sets the block's `CRCS` state bit (SeqCst).
//! - Every other writer (zero-copy: the kernel moves the data, no lock is held) records
//!   nothing; at commit it first bumps the epoch of each block's stripe, then forgets the
//!   page CRCs. It does the same in prepare, before its data can land, so a write that never
//!   commits (failed kernel I/O, dropped ticket) leaves no stale CRC either. Forgetting reads
//!   the block's `CRCS` bit first (SeqCst) and skips the store when it is clear: the hot
//!   zero-copy path takes no lock unless the plain path wrote the same block.
//! - An exclusive writer reads the epochs of its stripes before its data lands, stores its
//!   CRCs, then reads the epochs again; if any changed, a non-exclusive write may have
//!   landed after its data, and it forgets its CRCs again.
//! - `CRCS` is cleared only by rotation (write gate: no writer in flight), for the blocks it
//!   moves to Syncing, whose CRCs moved with the store. A set bit with nothing stored only
//!   costs a lookup.
//!
//! Why that is enough (the epochs and the `CRCS` bit are SeqCst, so they have one total
//! order): let a non-exclusive write Z overlap an exclusive write U. If Z's bump comes before
//! U's first epoch read, Z's data landed before U's, so U's CRC is right (or Z's later forget
//! makes it unknown). If it comes between U's two reads, U forgets. If it comes after U's
//! second read, it also comes after U's `CRCS` store, so Z's load of the bit (after its bump)
//! sees it set, and Z's forget (under the shard mutex, after U's insert) removes U's CRC. In
//! no order does a known CRC survive that does not describe the last landed bytes.
//! Forgetting is always safe; it only costs verification.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Pages per chunk of the store (128 KiB of volume).
pub(crate) const CHUNK_PAGES: u64 = 32;
const SHARDS: u64 = 64;

/// The known CRCs of one chunk of pages.
#[derive(Debug, Clone, Copy, Default)]
struct Chunk {
    known: u32,
    crcs: [u32; CHUNK_PAGES as usize],
}

/// The known page CRCs of one cache file (sparse; see module docs).
#[derive(Debug)]
pub(crate) struct PageCrcs {
    shards: Box<[Mutex<HashMap<u64, Chunk>>]>,
}

impl Default for PageCrcs {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

/// `pages` cut at chunk boundaries: (chunk, pages of it).
fn by_chunk(pages: Range<u64>) -> impl Iterator<Item = (u64, Range<u64>)> {
    let mut p = pages.start;
    std::iter::from_fn(move || {
        if p >= pages.end {
            return None;
        }
        let chunk = p / CHUNK_PAGES;
        let end = ((chunk + 1) * CHUNK_PAGES).min(pages.end);
        let r = p..end;
        p = end;
        Some((chunk, r))
    })
}

impl PageCrcs {
    fn shard(&self, chunk: u64) -> &Mutex<HashMap<u64, Chunk>> {
        &self.shards[(chunk % SHARDS) as usize]
    }

    /// Sets (`Some`) or forgets (`None`) the CRC of every page in `pages`, as `f(page)` says.
    /// Setting is for an exclusive writer that just wrote the whole page (module docs).
    pub(crate) fn store(&self, pages: Range<u64>, mut f: impl FnMut(u64) -> Option<u32>) {
        for (chunk, range) in by_chunk(pages) {
            let mut map = self.shard(chunk).lock();
            let mut c = map.get(&chunk).copied().unwrap_or_default();
            for p in range {
                let bit = 1u32 << (p % CHUNK_PAGES);
                match f(p) {
                    Some(crc) => {
                        c.crcs[(p % CHUNK_PAGES) as usize] = crc;
                        c.known |= bit;
                    }
                    None => c.known &= !bit,
                }
            }
            if c.known == 0 {
                map.remove(&chunk);
            } else {
                map.insert(chunk, c);
            }
        }
    }

    /// Forgets the CRCs of `pages`.
    pub(crate) fn forget(&self, pages: Range<u64>) {
        for (chunk, range) in by_chunk(pages) {
            let mut map = self.shard(chunk).lock();
            let Some(c) = map.get_mut(&chunk) else {
                continue;
            };
            for p in range {
                c.known &= !(1u32 << (p % CHUNK_PAGES));
            }
            if c.known == 0 {
                map.remove(&chunk);
            }
        }
    }

    /// The known CRCs of `pages` into `out` (one entry per page).
    pub(crate) fn get(&self, pages: Range<u64>, out: &mut [Option<u32>]) {
        let first = pages.start;
        for (chunk, range) in by_chunk(pages) {
            let map = self.shard(chunk).lock();
            let c = map.get(&chunk);
            for p in range {
                let i = (p % CHUNK_PAGES) as usize;
                out[(p - first) as usize] =
                    c.filter(|c| c.known & (1 << i) != 0).map(|c| c.crcs[i]);
            }
        }
    }

    /// Number of chunks held.
    pub(crate) fn chunks(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Heap bytes held, approximately (hash table slots: key, chunk, control byte).
    pub(crate) fn heap_bytes(&self) -> u64 {
        let slot = (std::mem::size_of::<(u64, Chunk)>() + 1) as u64;
        let tables: u64 = self
            .shards
            .iter()
            .map(|s| s.lock().capacity() as u64 * slot)
            .sum();
        tables + SHARDS * std::mem::size_of::<Mutex<HashMap<u64, Chunk>>>() as u64
    }
}

/// Per-stripe counters of non-exclusive commits (see module docs).
#[derive(Debug)]
pub(crate) struct Epochs(Box<[AtomicU64]>);

impl Epochs {
    pub(crate) fn new(stripes: usize) -> Self {
        Self((0..stripes).map(|_| AtomicU64::new(0)).collect())
    }

    /// Sum of the epochs of `stripes` (each only grows, so the sum changes iff one did).
    pub(crate) fn sum(&self, stripes: impl Iterator<Item = usize>) -> u64 {
        stripes.fold(0u64, |s, i| {
            s.wrapping_add(self.0[i].load(Ordering::SeqCst))
        })
    }

    /// A non-exclusive write to these stripes is committing (call before forgetting).
    pub(crate) fn bump(&self, stripes: impl Iterator<Item = usize>) {
        for i in stripes {
            self.0[i].fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(c: &PageCrcs, page: u64) -> Option<u32> {
        let mut out = [None];
        c.get(page..page + 1, &mut out);
        out[0]
    }

    #[test]
    fn page_crcs_known_bit() {
        let c = PageCrcs::default();
        assert_eq!(one(&c, 129), None);
        c.store(129..130, |_| Some(7));
        assert_eq!(one(&c, 129), Some(7));
        assert_eq!(one(&c, 128), None);
        c.forget(129..130);
        assert_eq!(one(&c, 129), None);
        assert_eq!(c.chunks(), 0, "a chunk with nothing known is dropped");
    }

    #[test]
    fn ranges_cross_chunks_and_only_known_pages_cost_memory() {
        let c = PageCrcs::default();
        c.store(30..70, |p| p.is_multiple_of(2).then_some(p as u32));
        assert_eq!(c.chunks(), 3);
        let mut out = vec![None; 40];
        c.get(30..70, &mut out);
        for (i, v) in out.iter().enumerate() {
            let p = 30 + i as u64;
            assert_eq!(*v, p.is_multiple_of(2).then_some(p as u32), "page {p}");
        }
        c.forget(0..64);
        assert_eq!(c.chunks(), 1);
        c.store(64..70, |_| None);
        assert_eq!(c.chunks(), 0);
    }

    #[test]
    fn epochs_show_non_exclusive_commits() {
        let c = Epochs::new(4);
        let before = c.sum([1, 2].into_iter());
        c.bump([3].into_iter());
        assert_eq!(c.sum([1, 2].into_iter()), before);
        c.bump([2].into_iter());
        assert_ne!(c.sum([1, 2].into_iter()), before);
    }
}
