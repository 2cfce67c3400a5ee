//! Cold reads: fetch a block's pack range, verify, keep it locally as Clean.
//!
//! - Coalescing: concurrent misses on the same block share one fetch, but only a fetch of the
//!   same location: every fetch in flight is registered in `inflight` with the
//!   [`BlockLocation`] it reads, and a reader looks the block's location up itself (after it
//!   saw the block cold) and joins only a fetch of that location, else starts its own. A
//!   location names immutable bytes (a pack id is never reused), so a joiner gets exactly the
//!   version the manifest named when it looked; a fetch started before a write of the block
//!   was flushed (the manifest swapped to the new location before the cache marks the block
//!   Clean, so before it can be evicted) reads the old location and is never joined by a read
//!   that starts after that write completed. Several fetches of one block (of different
//!   locations) can be in flight; each removes its own entry (by id) when done.
//! - The fill token is taken before the block's location is looked up, so a fetch that raced
//!   with a newer flush + eviction of the same block is not stored (see glidefs-cache `evict`):
//!   the old bytes a superseded fetch brings back go to its own readers only, never into the
//!   cache.
//! - A location can outlive its pack: GC deletes a pack once no retained manifest names it,
//!   and a compaction pass moves cold blocks (same bytes, new pack) without any write. A
//!   fetch whose pack is gone looks the block up again and reads it where the manifest names
//!   it now (`read_located`), instead of failing the read. If the manifest maps it nowhere
//!   now, the block was unmapped (TRIM, or zeros written) and that was flushed after the
//!   lookup: the read overlapped that write, so it returns zeros, the block's new contents,
//!   and nothing is filled ([`Located::Unmapped`]).
//! - A read-only export (`crate::follow`) also reloads: when the pack is gone and the map it
//!   serves still names that location (the writer compacted and GC deleted what only older
//!   generations name), the fetch has the export adopt the store's latest generation and reads
//!   where that names the block, at most [`MAX_RELOADS`] times; then the error. Its fill is
//!   refused (the adoption bumps the fill epoch), so a block fetched across an adoption is
//!   served but not kept; the next read fetches it again.
//! - The same holds between a reader's look at the block (cold, remote) and `fetch`'s
//!   lookup: a manifest that maps the block nowhere by then was published by a flush that
//!   unmapped it after the reader looked, so the fetch returns zeros and fills nothing.
//!   Only a block the cache still says is in the store alone (NotPresent, remote) with no
//!   location is an inconsistency (`MissingLocation`): both are read under the manifest's
//!   read lock, and the cache marks a block remote only after a manifest naming it is
//!   published, and keeps an unmapped block Syncing (or Dirty) until its flush completes.
//! - Fetched bytes go to the clean file only (`fill_clean_crc`, with the raw crc the fetch
//!   verified them against, so the fill does not hash them again), never to the active file.
//! - A fill that fails (ENOSPC, EIO on the cache file system) does not fail the fetch: the
//!   bytes are verified and returned, the block just stays uncached (logged, counted in
//!   `fill_failed`); the error travels with the result ([`FetchedBlock::fill_error`]) for a
//!   partial write, which needs the block in the cache.
//!
//! Threads: the fetch itself is async (the store's GET); the fill (`fill_clean`: the block's
//! stripe lock, a pwrite of the clean file, a WAL append that may write out the WAL buffer)
//! runs on the blocking pool, never on an async worker. The stripe lock may be held for as
//! long as the kernel moves the data of a zero-copy WRITE ticket, or by a plain write on the
//! blocking pool: a worker parked there would stall every task on it. The blocking fill waits
//! for nothing async (a ticket is released by the ublk loop thread or by the blocking thread
//! that holds it), so it cannot deadlock against the runtime.
//!
//! What does run on the worker is bounded and in memory: `fill_token` (an atomic load), the
//! `inflight` map (held for a few map operations), `block_info` (an atomic load), and the
//! manifest's read lock for one `BTreeMap` lookup per block (the only writer,
//! `sync_to_store`, holds the write lock just to swap in the next manifest; building it and
//! dropping the old one happen outside the lock, on the blocking pool).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use glidefs_cache::{BlockState, Cache, FillToken};
use glidefs_objstore::{BlockLocation, ErrorKind, Manifest, VolumeStore};
use parking_lot::{Mutex, RwLock};

use crate::blocking::blocking;
use crate::error::{Result, VolumeError};

/// A fetched block: its verified bytes, and why they could not be kept in the cache.
#[derive(Debug, Clone)]
pub(crate) struct FetchedBlock {
    pub data: Bytes,
    /// The fill's error (the cache file system failed); `None` when the block was filled or
    /// the fill was refused (a newer version, an eviction in progress).
    pub fill_error: Option<Arc<VolumeError>>,
}

pub(crate) type FetchResult = std::result::Result<FetchedBlock, Arc<VolumeError>>;
type SharedFetch = Shared<BoxFuture<'static, FetchResult>>;
/// A run's outcome: the run's own failure (its GET failed), or one outcome per block (after
/// the run's pack was found gone, each block is read on its own, and may fail on its own).
type RunResult = std::result::Result<Vec<FetchResult>, Arc<VolumeError>>;
type SharedRun = Shared<BoxFuture<'static, RunResult>>;

/// A run [`Fetcher::launch`] started.
pub(crate) struct Launched {
    /// The blocks it fetches, in order.
    pub run: Vec<u64>,
    /// Bytes its GET moves (the blocks' stored frames).
    pub bytes: u64,
    /// Its outcome: the run's own failure, or one per block.
    pub outcome: SharedRun,
}

/// What [`Fetcher::read_located`] found.
enum Located {
    /// The block's bytes, verified against the raw crc (the second field) of the location
    /// they were read at, which the fill records instead of hashing them again.
    Data(Bytes, u32),
    /// The block's pack is gone and the manifest maps the block nowhere now (see the module
    /// docs): it reads as zeros and is not filled.
    Unmapped,
}

/// Most times one fetch follows its block to a new location after finding its pack gone.
const MAX_MOVES: u32 = 4;

/// Most times one fetch of a read-only export reloads the manifest after finding its pack
/// gone (see the module docs).
pub(crate) const MAX_RELOADS: u32 = 3;

/// Most blocks one readahead GET fetches.
pub(crate) const MAX_RUN_BLOCKS: usize = 32;

#[derive(Debug, Default)]
pub(crate) struct FetchCounters {
    pub fetched: AtomicU64,
    /// Ranged GETs of blocks (a run's counts once; retries inside the store's not counted)
    /// and the bytes of the frames they asked for.
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    pub coalesced: AtomicU64,
    pub readahead: AtomicU64,
    pub fill_refused: AtomicU64,
    pub fill_failed: AtomicU64,
}

/// One fetch in flight.
struct InFlight {
    /// Tells this fetch from a later one of the same block (its entry is removed by id).
    id: u64,
    /// What it reads: only a reader that looked up this same location joins it.
    loc: BlockLocation,
    fut: SharedFetch,
}

pub(crate) struct Fetcher {
    pub cache: Arc<Cache>,
    pub store: Arc<VolumeStore>,
    pub manifest: Arc<RwLock<Manifest>>,
    /// Fetches in flight per block (usually one; more while a superseded one finishes).
    inflight: Mutex<HashMap<u64, Vec<InFlight>>>,
    next_id: AtomicU64,
    pub counters: FetchCounters,
    /// A read-only export's follower (see `crate::follow`); `None` for every other handle.
    pub follower: Option<Arc<crate::follow::Follower>>,
    /// The runtime readahead fetches run on: `prefetch` is also called from threads outside
    /// it (a ublk queue's loop thread).
    rt: tokio::runtime::Handle,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("inflight", &self.inflight.lock().len())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Fetcher {
    pub(crate) fn new(
        cache: Arc<Cache>,
        store: Arc<VolumeStore>,
        manifest: Arc<RwLock<Manifest>>,
        follower: Option<Arc<crate::follow::Follower>>,
        rt: tokio::runtime::Handle,
    ) -> Self {
        Self {
            cache,
            store,
            manifest,
            inflight: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            counters: FetchCounters::default(),
            follower,
            rt,
        }
    }

    /// The (shared) fetch of `block` at the location the manifest names now; joins one
    /// already in flight for that location. Call it only once the block was seen cold.
    pub(crate) fn fetch(self: &Arc<Self>, block: u64) -> SharedFetch {
        // Before the location is looked up (see `fill_clean`).
        let token = self.cache.fill_token();
        let (loc, generation, info) = {
            let m = self.manifest.read();
            // Both under the manifest lock (see the module docs: a block unmapped since).
            (
                m.get(block).cloned(),
                m.generation,
                self.cache.block_info(block),
            )
        };
        let Some(loc) = loc else {
            let r = if info.state == BlockState::NotPresent && info.remote {
                Err(Arc::new(VolumeError::MissingLocation { block, generation }))
            } else {
                tracing::debug!(volume = %self.store.volume(), block, generation,
                    "a block seen remote was unmapped before its fetch: zeros");
                Ok(FetchedBlock {
                    data: self.zeros(),
                    fill_error: None,
                })
            };
            return futures::future::ready(r).boxed().shared();
        };
        let mut inflight = self.inflight.lock();
        let fetches = inflight.entry(block).or_default();
        if let Some(f) = fetches.iter().find(|f| f.loc == loc) {
            self.counters.coalesced.fetch_add(1, Ordering::Relaxed);
            return f.fut.clone();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let this = self.clone();
        let at = loc.clone();
        let fut = async move {
            let r = this.fetch_once(token, block, &at).await.map_err(Arc::new);
            this.finished(&[block], id);
            r
        }
        .boxed()
        .shared();
        fetches.push(InFlight {
            id,
            loc,
            fut: fut.clone(),
        });
        fut
    }

    /// Removes the entries of fetch `id` for `blocks`.
    fn finished(&self, blocks: &[u64], id: u64) {
        let mut inflight = self.inflight.lock();
        for b in blocks {
            if let Some(fetches) = inflight.get_mut(b) {
                fetches.retain(|f| f.id != id);
                if fetches.is_empty() {
                    inflight.remove(b);
                }
            }
        }
    }

    async fn fetch_once(
        &self,
        token: FillToken,
        block: u64,
        loc: &BlockLocation,
    ) -> Result<FetchedBlock> {
        let (data, crc) = match self.read_located(block, loc).await? {
            Located::Data(data, crc) => (data, crc),
            Located::Unmapped => {
                return Ok(FetchedBlock {
                    data: self.zeros(),
                    fill_error: None,
                })
            }
        };
        self.counters.fetched.fetch_add(1, Ordering::Relaxed);
        let (cache, bytes) = (self.cache.clone(), data.clone());
        let fill = blocking(move || Ok(cache.fill_clean_crc(token, block, &bytes, crc)?)).await;
        let fill_error = self.fill_outcome(block, fill);
        Ok(FetchedBlock { data, fill_error })
    }

    /// Reads `block` at `loc`. If its pack is gone and the manifest names another location for
    /// the block now, reads that one instead: GC deletes a pack once no retained manifest
    /// names it, and a block can move after the lookup without being written (a compaction
    /// pass copies it into a new pack; its bytes are the same there), or be written and
    /// flushed (its newer bytes are then what a read overlapping that write may return). The
    /// fill token, taken before the first lookup, stays valid for the later one (an older
    /// token only refuses more fills).
    async fn read_located(&self, block: u64, loc: &BlockLocation) -> Result<Located> {
        let mut at = loc.clone();
        let (mut moves, mut reloads) = (0, 0);
        loop {
            self.counted_get(u64::from(at.len));
            let e = match self.store.read_block(block, &at).await {
                Ok(data) => return Ok(Located::Data(data, at.raw_crc)),
                Err(e) => e,
            };
            if e.kind() == ErrorKind::NotFound && moves < MAX_MOVES {
                let (mut now, generation) = {
                    let m = self.manifest.read();
                    (m.get(block).cloned(), m.generation)
                };
                if let Some(f) = &self.follower {
                    if now.as_ref() == Some(&at) && reloads < MAX_RELOADS {
                        // A read-only export: the writer moved on (see the module docs).
                        reloads += 1;
                        if f.after_not_found(generation).await {
                            now = self.manifest.read().get(block).cloned();
                        }
                        if now.as_ref() == Some(&at) {
                            // Not moved in the latest either: the same GET again (a
                            // listing may lag; bounded by `MAX_RELOADS`).
                            continue;
                        }
                    }
                }
                let Some(now) = now else {
                    tracing::debug!(volume = %self.store.volume(), block, gone = %at.pack,
                        "a block's pack is gone and the block is unmapped now: zeros");
                    return Ok(Located::Unmapped);
                };
                if now != at {
                    tracing::debug!(volume = %self.store.volume(), block, gone = %at.pack,
                        now = %now.pack, "a block's pack is gone: reading where it is now");
                    at = now;
                    moves += 1;
                    continue;
                }
            }
            return Err(VolumeError::store("read block", self.store.volume(), e));
        }
    }

    /// A block of zeros (what an unmapped block reads as).
    fn zeros(&self) -> Bytes {
        Bytes::from(vec![0u8; self.cache.geometry().block_size() as usize])
    }

    /// Counts a fill's outcome; a failed fill is logged and handed back (not fatal).
    fn fill_outcome(&self, block: u64, fill: Result<bool>) -> Option<Arc<VolumeError>> {
        match fill {
            Ok(true) => None,
            Ok(false) => {
                self.counters.fill_refused.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(e) => {
                self.counters.fill_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(volume = %self.store.volume(), block, error = %e, "fetched block not kept in the cache (the read goes on with the fetched bytes)");
                Some(Arc::new(e))
            }
        }
    }

    fn counted_get(&self, bytes: u64) {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        self.counters.get_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Waits for every fetch in flight.
    pub(crate) async fn drain(&self) {
        loop {
            let pending: Vec<SharedFetch> = self
                .inflight
                .lock()
                .values()
                .flatten()
                .map(|f| f.fut.clone())
                .collect();
            if pending.is_empty() {
                return;
            }
            futures::future::join_all(pending).await;
        }
    }

    /// [`Fetcher::prefetch`] from a task on the runtime: the caller (a ublk queue's loop
    /// thread) takes no lock at all.
    pub(crate) fn prefetch_soon(self: &Arc<Self>, blocks: std::ops::Range<u64>) {
        let this = Arc::clone(self);
        drop(self.rt.spawn(async move { this.prefetch(blocks) }));
    }

    /// Starts background fetches of the cold blocks in `blocks` (readahead). Blocks whose
    /// entry frames lie back to back in one pack (a sequentially written range) are fetched
    /// as one run: one ranged GET (`VolumeStore::read_run`) of up to [`MAX_RUN_BLOCKS`]
    /// blocks, each block still registered in `inflight` on its own (with its location), so
    /// a reader of any of them that looks up the same location joins the run's fetch. A block
    /// already in flight for its current location is skipped. Never blocks (one manifest
    /// read lock and one `inflight` lock, each for a few map operations) and may be called
    /// from any thread.
    pub(crate) fn prefetch(self: &Arc<Self>, blocks: std::ops::Range<u64>) {
        let cold: Vec<u64> = blocks
            .filter(|&b| {
                let info = self.cache.block_info(b);
                info.state == BlockState::NotPresent && info.remote
            })
            .collect();
        if cold.is_empty() {
            return;
        }
        // Before the locations are looked up (see `fetch`).
        let token = self.cache.fill_token();
        let located: Vec<(u64, BlockLocation)> = {
            let m = self.manifest.read();
            cold.iter()
                .filter_map(|&b| m.get(b).cloned().map(|loc| (b, loc)))
                .collect()
        };
        self.launch(token, located);
    }

    /// Starts background fetches of `located` (blocks with the location the manifest named
    /// after `token` was taken), as runs of frames back to back in one pack (in the order
    /// given), each block registered in `inflight` with its location; a block already in
    /// flight for that location is left out. Every run is spawned (it completes whether or
    /// not anyone awaits it); returned for those who want to (`crate::warm`).
    pub(crate) fn launch(
        self: &Arc<Self>,
        token: FillToken,
        located: Vec<(u64, BlockLocation)>,
    ) -> Vec<Launched> {
        let mut inflight = self.inflight.lock();
        let located: Vec<_> = located
            .into_iter()
            .filter(|(b, loc)| {
                !inflight
                    .get(b)
                    .is_some_and(|fetches| fetches.iter().any(|f| f.loc == *loc))
            })
            .collect();
        let mut launched = Vec::new();
        for run in back_to_back_runs(located, MAX_RUN_BLOCKS) {
            self.counters
                .readahead
                .fetch_add(run.len() as u64, Ordering::Relaxed);
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let entries: Vec<(u64, BlockLocation)> = run.clone();
            let blocks: Vec<u64> = run.iter().map(|(b, _)| *b).collect();
            let bytes = run.iter().map(|(_, loc)| u64::from(loc.len)).sum();
            let this = self.clone();
            let done = blocks.clone();
            let whole: SharedRun = async move {
                let r = this.fetch_run(token, &run).await;
                this.finished(&done, id);
                r
            }
            .boxed()
            .shared();
            for (i, (b, loc)) in entries.into_iter().enumerate() {
                let one = whole
                    .clone()
                    .map(move |r| r.and_then(|fetched| fetched[i].clone()))
                    .boxed()
                    .shared();
                inflight
                    .entry(b)
                    .or_default()
                    .push(InFlight { id, loc, fut: one });
            }
            let first = blocks[0];
            let spawned = whole.clone();
            self.rt.spawn(async move {
                if let Err(e) = spawned.await {
                    tracing::debug!(block = first, error = %e, "readahead fetch failed");
                }
            });
            launched.push(Launched {
                run: blocks.clone(),
                bytes,
                outcome: whole,
            });
        }
        launched
    }

    /// Fetches a run of back-to-back blocks with one GET and fills them Clean. When the run's
    /// pack is gone, each block is read where the manifest names it now (`read_located`),
    /// and a block that cannot be read fails only its own outcome: the other blocks' readers
    /// (who joined the run for their own block) still get theirs.
    async fn fetch_run(&self, token: FillToken, run: &[(u64, BlockLocation)]) -> RunResult {
        self.counted_get(run.iter().map(|(_, loc)| u64::from(loc.len)).sum());
        let data: Vec<Result<Located>> = match self.store.read_run(run).await {
            Ok(data) => data
                .into_iter()
                .zip(run)
                .map(|(d, (_, loc))| Ok(Located::Data(d, loc.raw_crc)))
                .collect(),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let mut data = Vec::with_capacity(run.len());
                for (block, loc) in run {
                    data.push(self.read_located(*block, loc).await);
                }
                data
            }
            Err(e) => {
                let e = VolumeError::store("read blocks", self.store.volume(), e);
                return Err(Arc::new(e));
            }
        };
        // The blocks read (not failed, not unmapped) are filled, in run order.
        let fills: Vec<(u64, Bytes, u32)> = run
            .iter()
            .zip(&data)
            .filter_map(|((b, _), d)| match d {
                Ok(Located::Data(bytes, crc)) => Some((*b, bytes.clone(), *crc)),
                _ => None,
            })
            .collect();
        let read = fills.len();
        self.counters
            .fetched
            .fetch_add(read as u64, Ordering::Relaxed);
        let cache = self.cache.clone();
        // One outcome per block: a failed fill does not stop the others.
        let outcomes = blocking(move || {
            Ok(fills
                .iter()
                .map(|(block, bytes, crc)| Ok(cache.fill_clean_crc(token, *block, bytes, *crc)?))
                .collect::<Vec<Result<bool>>>())
        })
        .await;
        let outcomes: Vec<Result<bool>> = match outcomes {
            Ok(o) => o,
            // The blocking task itself failed: no block was filled, the bytes are good.
            Err(e) => {
                let e = e.to_string();
                (0..read)
                    .map(|_| Err(VolumeError::Task(e.clone())))
                    .collect()
            }
        };
        // The fills' outcomes, in order, belong to the blocks that were read.
        let mut outcomes = outcomes.into_iter();
        Ok(run
            .iter()
            .zip(data)
            .map(|((block, _), data)| match data.map_err(Arc::new)? {
                Located::Data(data, _) => {
                    let fill = outcomes.next().unwrap_or(Ok(false));
                    Ok(FetchedBlock {
                        data,
                        fill_error: self.fill_outcome(*block, fill),
                    })
                }
                Located::Unmapped => Ok(FetchedBlock {
                    data: self.zeros(),
                    fill_error: None,
                }),
            })
            .collect())
    }
}

/// Splits `located` (in block order) into runs of at most `max` blocks whose frames lie back
/// to back in one pack.
fn back_to_back_runs(
    located: Vec<(u64, BlockLocation)>,
    max: usize,
) -> Vec<Vec<(u64, BlockLocation)>> {
    let mut runs: Vec<Vec<(u64, BlockLocation)>> = Vec::new();
    for (block, loc) in located {
        let follows = runs.last().and_then(|r| r.last()).is_some_and(|(_, prev)| {
            prev.pack == loc.pack && prev.offset + u64::from(prev.len) == loc.offset
        });
        match runs.last_mut() {
            Some(run) if follows && run.len() < max.max(1) => run.push((block, loc)),
            _ => runs.push(vec![(block, loc)]),
        }
    }
    runs
}
