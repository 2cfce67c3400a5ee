//! A volume's counters ([`VolumeStats`]), read from the parts' shared state without waiting
//! for a sync in progress.

use std::sync::atomic::Ordering;

use glidefs_cache::CacheStats;

use crate::blocking::blocking;
use crate::shared::Shared;

/// Counters of one volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub cache: CacheStats,
    pub manifest_generation: u64,
    pub blocks_fetched: u64,
    /// Ranged GETs of blocks made (cold reads, readahead, warm), and the bytes they moved.
    pub store_gets: u64,
    pub bytes_fetched: u64,
    pub fetches_coalesced: u64,
    pub readahead_started: u64,
    pub fills_refused: u64,
    /// Fetched blocks whose fill into the cache failed (I/O error of the cache file system):
    /// their reads were served from the fetched bytes, the blocks stayed uncached.
    pub fills_failed: u64,
    /// Packs and bytes uploaded (flushes and compaction).
    pub packs_uploaded: u64,
    pub bytes_uploaded: u64,
    /// Blocks the manifest maps, and the bytes of their entry frames (live data in the store).
    pub mapped_blocks: u64,
    pub live_bytes: u64,
    /// Pack objects in the store and their bytes, as of the last compaction or GC pass plus
    /// this handle's uploads since (0 before the first pass).
    pub stored_packs: u64,
    pub stored_bytes: u64,
    /// Compaction passes that published, packs they rewrote and bytes they copied.
    pub compactions: u64,
    pub packs_compacted: u64,
    pub bytes_compacted: u64,
}

/// The counters of `v` (see `Volume::stats`).
pub(crate) async fn stats(v: &Shared) -> VolumeStats {
    let manifest = v.manifest.clone();
    let (mapped_blocks, live_bytes) = blocking(move || {
        let m = manifest.read();
        Ok((m.len(), m.live_bytes()))
    })
    .await
    .unwrap_or_default();
    let k = &v.compaction;
    let c = &v.fetcher.counters;
    VolumeStats {
        cache: v.cache.stats(),
        manifest_generation: v.manifest_generation(),
        blocks_fetched: c.fetched.load(Ordering::Relaxed),
        store_gets: c.gets.load(Ordering::Relaxed),
        bytes_fetched: c.get_bytes.load(Ordering::Relaxed),
        fetches_coalesced: c.coalesced.load(Ordering::Relaxed),
        readahead_started: c.readahead.load(Ordering::Relaxed),
        fills_refused: c.fill_refused.load(Ordering::Relaxed),
        fills_failed: c.fill_failed.load(Ordering::Relaxed),
        packs_uploaded: v.uploads.packs.load(Ordering::Relaxed),
        bytes_uploaded: v.uploads.bytes.load(Ordering::Relaxed),
        mapped_blocks,
        live_bytes,
        stored_packs: v.stored.packs.load(Ordering::Relaxed),
        stored_bytes: v.stored.bytes.load(Ordering::Relaxed),
        compactions: k.passes.load(Ordering::Relaxed),
        packs_compacted: k.packs_rewritten.load(Ordering::Relaxed),
        bytes_compacted: k.bytes_copied.load(Ordering::Relaxed),
    }
}
