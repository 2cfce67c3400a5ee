//! Cold reads: fetch a block's pack range, verify, keep it locally as Clean.
//!
//! - Coalescing: concurrent misses on the same block share one fetch (a shared future per
//!   block in `inflight`; the leader removes it when done).
//! - The fill token is taken before the block's location is looked up, so a fetch that raced
//!   with a newer flush + eviction of the same block is not stored (see glidefs-cache `evict`).
//! - Fetched bytes go to the clean file only (`fill_clean`), never to the active file.
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
//! `inflight` map (held for one map operation), `block_info` (an atomic load), and the
//! manifest's read lock for one `BTreeMap` lookup (the only writer, `sync_to_store`, holds the
//! write lock just to swap in the next manifest; building it and dropping the old one happen
//! outside the lock, on the blocking pool).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use glidefs_cache::{BlockState, Cache, FillToken};
use glidefs_objstore::{BlockLocation, Manifest, VolumeStore};
use parking_lot::{Mutex, RwLock};

use crate::error::{Result, VolumeError};
use crate::volume::blocking;

pub(crate) type FetchResult = std::result::Result<Bytes, Arc<VolumeError>>;
type SharedFetch = Shared<BoxFuture<'static, FetchResult>>;
type RunResult = std::result::Result<Vec<Bytes>, Arc<VolumeError>>;

/// Most blocks one readahead GET fetches.
pub(crate) const MAX_RUN_BLOCKS: usize = 32;

#[derive(Debug, Default)]
pub(crate) struct FetchCounters {
    pub fetched: AtomicU64,
    pub coalesced: AtomicU64,
    pub readahead: AtomicU64,
    pub fill_refused: AtomicU64,
}

pub(crate) struct Fetcher {
    pub cache: Arc<Cache>,
    pub store: Arc<VolumeStore>,
    pub manifest: Arc<RwLock<Manifest>>,
    inflight: Mutex<HashMap<u64, SharedFetch>>,
    pub counters: FetchCounters,
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
        rt: tokio::runtime::Handle,
    ) -> Self {
        Self {
            cache,
            store,
            manifest,
            inflight: Mutex::new(HashMap::new()),
            counters: FetchCounters::default(),
            rt,
        }
    }

    /// The (shared) fetch of `block`; joins one already in flight.
    pub(crate) fn fetch(self: &Arc<Self>, block: u64) -> SharedFetch {
        let mut inflight = self.inflight.lock();
        if let Some(f) = inflight.get(&block) {
            self.counters.coalesced.fetch_add(1, Ordering::Relaxed);
            return f.clone();
        }
        let this = self.clone();
        let fut = async move {
            let r = this.fetch_once(block).await.map_err(Arc::new);
            this.inflight.lock().remove(&block);
            r
        }
        .boxed()
        .shared();
        inflight.insert(block, fut.clone());
        fut
    }

    async fn fetch_once(&self, block: u64) -> Result<Bytes> {
        let token = self.cache.fill_token();
        let (loc, generation) = {
            let m = self.manifest.read();
            (m.get(block).cloned(), m.generation)
        };
        let Some(loc) = loc else {
            return Err(VolumeError::MissingLocation { block, generation });
        };
        let data = self
            .store
            .read_block(block, &loc)
            .await
            .map_err(|e| VolumeError::store("read block", self.store.volume(), e))?;
        self.counters.fetched.fetch_add(1, Ordering::Relaxed);
        let (cache, bytes) = (self.cache.clone(), data.clone());
        if !blocking(move || Ok(cache.fill_clean(token, block, &bytes)?)).await? {
            self.counters.fill_refused.fetch_add(1, Ordering::Relaxed);
        }
        Ok(data)
    }

    /// Waits for every fetch in flight.
    pub(crate) async fn drain(&self) {
        loop {
            let pending: Vec<SharedFetch> = self.inflight.lock().values().cloned().collect();
            if pending.is_empty() {
                return;
            }
            futures::future::join_all(pending).await;
        }
    }

    /// Starts background fetches of the cold blocks in `blocks` (readahead). Blocks whose
    /// entry frames lie back to back in one pack (a sequentially written range) are fetched
    /// as one run: one ranged GET (`VolumeStore::read_run`) of up to [`MAX_RUN_BLOCKS`]
    /// blocks, each block still registered in `inflight` on its own, so a reader of any of
    /// them joins the run's fetch. Never blocks (one manifest read lock and one `inflight`
    /// lock, each for a few map operations) and may be called from any thread.
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
        // Before the locations are looked up (see `fetch_once`).
        let token = self.cache.fill_token();
        let located: Vec<(u64, BlockLocation)> = {
            let m = self.manifest.read();
            cold.iter()
                .filter_map(|&b| m.get(b).cloned().map(|loc| (b, loc)))
                .collect()
        };
        let mut inflight = self.inflight.lock();
        let located: Vec<_> = located
            .into_iter()
            .filter(|(b, _)| !inflight.contains_key(b))
            .collect();
        for run in back_to_back_runs(located, MAX_RUN_BLOCKS) {
            self.counters
                .readahead
                .fetch_add(run.len() as u64, Ordering::Relaxed);
            let blocks: Vec<u64> = run.iter().map(|(b, _)| *b).collect();
            let this = self.clone();
            let done = blocks.clone();
            let whole: Shared<BoxFuture<'static, RunResult>> = async move {
                let r = this.fetch_run(token, &run).await.map_err(Arc::new);
                let mut inflight = this.inflight.lock();
                for b in &done {
                    inflight.remove(b);
                }
                r
            }
            .boxed()
            .shared();
            for (i, &b) in blocks.iter().enumerate() {
                let one = whole
                    .clone()
                    .map(move |r| r.map(|data| data[i].clone()))
                    .boxed()
                    .shared();
                inflight.insert(b, one);
            }
            let first = blocks[0];
            self.rt.spawn(async move {
                if let Err(e) = whole.await {
                    tracing::debug!(block = first, error = %e, "readahead fetch failed");
                }
            });
        }
    }

    /// Fetches a run of back-to-back blocks with one GET and fills them Clean.
    async fn fetch_run(
        &self,
        token: FillToken,
        run: &[(u64, BlockLocation)],
    ) -> Result<Vec<Bytes>> {
        let data = self
            .store
            .read_run(run)
            .await
            .map_err(|e| VolumeError::store("read blocks", self.store.volume(), e))?;
        self.counters
            .fetched
            .fetch_add(run.len() as u64, Ordering::Relaxed);
        let fills: Vec<(u64, Bytes)> = run
            .iter()
            .map(|(b, _)| *b)
            .zip(data.iter().cloned())
            .collect();
        let cache = self.cache.clone();
        let refused = blocking(move || {
            let mut refused = 0;
            for (block, bytes) in &fills {
                if !cache.fill_clean(token, *block, bytes)? {
                    refused += 1;
                }
            }
            Ok(refused)
        })
        .await?;
        self.counters
            .fill_refused
            .fetch_add(refused, Ordering::Relaxed);
        Ok(data)
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
