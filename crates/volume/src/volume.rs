//! The volume: the local cache in front of the object store.
//!
//! Levels of durability: a completed `write` is in the cache (lost on crash unless flushed);
//! a completed `flush` (the block device's FLUSH) is durable on local disk; a completed
//! `sync_to_store` is durable in the object store, so the volume survives the loss of the
//! local disk and can move to another host.
//!
//! Threads: no async fn of the volume does file I/O (pread/pwrite/fsync/fallocate, directory
//! operations) or waits for a cache lock that another thread may hold for long (the gate, the
//! stripe locks, the cache's admin lock, the WAL sync lock) on a tokio worker. `open`,
//! `read`, `write`, `flush`, `evict_to`, `close`, the cold fill (`fetch`) and the flush
//! pipeline (`sync`) run such work on the blocking pool; none of those closures waits for a
//! future, so a full set of blocking threads cannot deadlock against the runtime. What stays
//! on the worker is bounded and in memory: the state map (`block_info`, lock-free), `stats`
//! (counters, O(1)), the manifest's read lock (see `fetch`), `Cache::die` in `kill` (the WAL
//! buffer's mutex, held at most for one buffered write of ~64 KiB) and `Cache::fence` (a
//! `OnceLock`). The ownership claim at `open` and `release` publish like a flush does (the
//! successor is built on the blocking pool, the root encoded on the worker; see `sync`).
//!
//! Ownership (`VolumeConfig::owner`): see `Volume::open` (check and claim), `Volume::release`
//! (in `sync`) and `base` (why our own claim is not a foreign publish).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use glidefs_cache::{Cache, CacheOptions, CacheStats, Geometry};
use glidefs_objstore::{validate_owner_id, Manifest, ManifestOwner, VolumeStore};
use parking_lot::RwLock;

use crate::base::{self, record_base};
use crate::blocking::blocking;
use crate::config::VolumeConfig;
use crate::error::{Fence, Result, VolumeError};
use crate::fetch::{FetchedBlock, Fetcher};
use crate::group::{GroupFigures, StoreGroup};
use crate::publisher::{publish_owner_change, Publisher};

/// Longest a partial write waits for an eviction of its block to end (see `fetch_for_write`);
/// after that the attempt counts like any other.
const EVICTION_WAIT: Duration = Duration::from_secs(30);

/// Counters of one volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub cache: CacheStats,
    pub manifest_generation: u64,
    pub blocks_fetched: u64,
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

/// Held across one `sync_to_store` (one flusher per volume).
#[derive(Debug, Default)]
pub(crate) struct SyncState {
    pub pack_seq: u64,
    /// A publish sent and not confirmed: the next flush re-sends it (`sync.rs`).
    pub attempt: Option<crate::sync::PublishAttempt>,
}

/// Upload totals, readable by `stats` while a sync holds `SyncState`.
#[derive(Debug, Default)]
pub(crate) struct UploadCounters {
    pub packs: AtomicU64,
    pub bytes: AtomicU64,
}

/// One volume. Open with [`Volume::open`]; share as `Arc<Volume>`.
#[derive(Debug)]
pub struct Volume {
    pub(crate) cfg: VolumeConfig,
    pub(crate) cache: Arc<Cache>,
    pub(crate) store: Arc<VolumeStore>,
    /// `None` for a handle that may not publish (a snapshot view, a read-only export): see
    /// `publisher`.
    publisher: Option<Publisher>,
    pub(crate) manifest: Arc<RwLock<Manifest>>,
    pub(crate) fetcher: Arc<Fetcher>,
    pub(crate) sync: tokio::sync::Mutex<SyncState>,
    /// Group commit of FLUSHes durable in the store (`group.rs`).
    group: Arc<StoreGroup>,
    pub(crate) uploads: UploadCounters,
    pub(crate) compaction: crate::compact::CompactCounters,
    pub(crate) stored: crate::gc::StoredFigures,
    pub(crate) pins: crate::snapshot::PinCache,
    readahead: crate::readahead::Readahead,
    /// The first fencing error, latched (see `fence`).
    fence: OnceLock<Fence>,
    /// Set while `release` runs and for good once it published: writes and syncs refused.
    pub(crate) releasing: AtomicBool,
    /// Set by `close` under the sync lock: no publish through this handle afterwards.
    closed: AtomicBool,
    /// A snapshot view's registration under its snapshot (see `snapshot.rs`).
    view_pin: Option<crate::snapshot::ViewPin>,
}

/// Claims the volume for `owner` at open: publishes `current`'s successor (same block map)
/// with this owner's record, bracketed by the cache's base file (`publishing G =owner`, then
/// `base G`) so a crash between the publish and the record is recognised as our own claim.
async fn claim(
    cfg: &VolumeConfig,
    publisher: &Publisher,
    current: Manifest,
    owner: &str,
) -> Result<Manifest> {
    let mut next = blocking(move || Ok(current.successor())).await?;
    next.owner = Some(ManifestOwner {
        id: owner.to_string(),
        claimed_at: next.generation,
        released: false,
    });
    publish_owner_change(cfg, publisher, &mut next).await?;
    record_base(cfg, next.generation, None).await?;
    tracing::info!(volume = %cfg.name, owner, generation = next.generation, "volume claimed");
    Ok(next)
}

/// Starts the timer of an export's follower (`follow.rs`): every `interval` a look (as at a cold read),
/// until the volume is dropped, closed or killed.
fn start_follow_timer(volume: &Arc<Volume>, interval: Duration) {
    if interval.is_zero() {
        return;
    }
    let weak: Weak<Volume> = Arc::downgrade(volume);
    drop(tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let Some(v) = weak.upgrade() else { return };
            if v.is_closed() || v.cache.is_dead() {
                return;
            }
            if let Some(f) = &v.fetcher.follower {
                f.tick().await;
            }
        }
    }));
}

impl Volume {
    /// Opens a volume: loads the latest manifest, recovers the local cache, marks the blocks
    /// the store holds. A new volume starts with an empty manifest (generation 0).
    ///
    /// With `cfg.owner` (see [`VolumeConfig::owner`]): when the latest manifest names another
    /// owner that has not released the volume, fails with [`VolumeError::OwnedElsewhere`]
    /// (before touching the cache directory) unless `cfg.takeover`. Then, unless the reopened
    /// cache is fenced (see `base`), claims the volume: publishes the next generation with
    /// the same block map and this owner (`claimed_at` = that generation), which fences
    /// every other writer (their next publish fails). A claim that loses the race to another
    /// publish fails the open with [`VolumeError::Fenced`]. So a volume opened with an owner
    /// id is at generation >= 1 (a new volume: the claim is generation 1).
    pub async fn open(
        mut cfg: VolumeConfig,
        store: Arc<dyn object_store::ObjectStore>,
    ) -> Result<Arc<Self>> {
        // A view registers under its snapshot as its owner id (see `snapshot.rs`).
        let holder = cfg.snapshot.as_ref().map(|_| {
            cfg.owner
                .clone()
                .unwrap_or_else(|| crate::snapshot::ANONYMOUS_HOLDER.into())
        });
        // A view or a read-only export owns nothing: no claim, no release, no publisher.
        let view = cfg.snapshot.is_some() || cfg.read_only;
        if view {
            cfg.owner = None;
        }
        let geo = Geometry::new(cfg.size, cfg.block_size)?;
        if let Some(owner) = &cfg.owner {
            validate_owner_id(owner).map_err(|e| VolumeError::InvalidConfig {
                volume: cfg.name.clone(),
                detail: e.to_string(),
            })?;
        }
        let start = std::time::Instant::now();
        let vstore = VolumeStore::new(store, &cfg.name, cfg.store.clone())
            .map_err(|e| VolumeError::store("open", &cfg.name, e))?
            .with_key(cfg.encryption_key.clone());
        let manifest = match &cfg.snapshot {
            Some(name) => crate::snapshot::load_view(&cfg, &vstore, name).await?,
            None => vstore
                .load_manifest()
                .await
                .map_err(|e| VolumeError::store("load manifest", &cfg.name, e))?
                .unwrap_or_else(|| Manifest::new(&cfg.name, cfg.block_size, cfg.size)),
        };
        if manifest.block_size != cfg.block_size || manifest.volume_size != cfg.size {
            // A larger size than the store's is a resize the store has not published yet (or
            // one the caller recorded before `resize` ran): the volume grows (below). A
            // smaller one is refused (see `grow`).
            if manifest.block_size != cfg.block_size || manifest.volume_size > cfg.size {
                return Err(VolumeError::GeometryMismatch {
                    volume: cfg.name.clone(),
                    stored: format!(
                        "size={} block_size={}",
                        manifest.volume_size, manifest.block_size
                    ),
                    requested: format!("size={} block_size={}", cfg.size, cfg.block_size),
                });
            }
        }
        if let (Some(me), Some(holder)) = (&cfg.owner, &manifest.owner) {
            if holder.id != *me && !holder.released {
                if !cfg.takeover {
                    return Err(VolumeError::OwnedElsewhere {
                        volume: cfg.name.clone(),
                        owner: holder.id.clone(),
                        generation: manifest.generation,
                    });
                }
                tracing::warn!(volume = %cfg.name, owner = %me, previous = %holder.id, generation = manifest.generation, "taking the volume over from its owner: its unpublished writes are lost");
            }
        }
        let mut manifest = manifest;
        if manifest.volume_size < cfg.size {
            tracing::info!(volume = %cfg.name, stored = manifest.volume_size, size = cfg.size, "opening at a larger size than the store's manifest: the volume grows");
            manifest.volume_size = cfg.size;
        }
        let loaded = start.elapsed();
        // Everything that touches the cache directory or scans the state map / manifest runs
        // in one blocking closure: recover the cache, judge it against the store (see
        // `base`), mark the blocks the store holds.
        let (dir, hook, name) = (cfg.dir.clone(), cfg.crash_hook.clone(), cfg.name.clone());
        let owner = cfg.owner.clone();
        let key = cfg.encryption_key.clone();
        let (cache, manifest, recorded, verdict, closed) = blocking(move || {
            let closed = base::take_closed(&dir)?;
            let cache = Cache::open(&dir, geo, CacheOptions { crash_hook: hook })?;
            // Before anything of this cache can reach the store under this key.
            crate::key_id::check_or_record(&dir, &name, key.as_deref())?;
            let recorded = base::load(&dir)?;
            let counts = cache.stats();
            let unpublished = counts.dirty + counts.syncing;
            let mut verdict = base::judge(recorded.as_ref(), &manifest, unpublished, owner.as_deref());
            if view {
                // A view's local state is keyed to the generation it serves: a cache built on
                // any other one (a newer snapshot, the live volume) holds Clean copies of other
                // bytes, so they go whatever `judge` says. Unpublished blocks are a writer's
                // acknowledged writes: never served by a view, never dropped by one.
                if unpublished > 0 {
                    return Err(VolumeError::InvalidConfig {
                        volume: name.clone(),
                        detail: format!(
                            "the cache directory holds {unpublished} unpublished blocks of a writer: a read-only view cannot use it"
                        ),
                    });
                }
                if verdict != base::Verdict::Current {
                    verdict = base::Verdict::Stale;
                }
            }
            if verdict == base::Verdict::Stale {
                // Nothing unpublished, but the Clean copies may predate the newer generation.
                let dropped = cache.evict_to(0)?;
                // Blocks it unmapped are in the store no more: their remote bits go, durably
                // (a checkpoint) before the newer generation is adopted below, so a crash
                // in between finds the cache stale again and clears them again.
                let unmapped = cache.clear_remote_except(manifest.blocks());
                if unmapped > 0 {
                    cache.checkpoint()?;
                }
                tracing::warn!(volume = %name, generation = manifest.generation, dropped, unmapped, "another writer published since this cache was used: local clean copies dropped");
            }
            let adopted = base::Base {
                generation: manifest.generation,
                publishing: None,
            };
            if !matches!(verdict, base::Verdict::Diverged(_)) && recorded.as_ref() != Some(&adopted)
            {
                base::store(&dir, &adopted)?;
            }
            if view && verdict == base::Verdict::Current {
                // A view serves what the store maps and nothing else: a remote bit of a block
                // its map names nowhere (an export's adoption that failed before its
                // checkpoint, whose cleared bits the WAL's replay set again) would fail every
                // read of that block. O(allocated leaves + mapped blocks).
                let stale = cache.clear_remote_except(manifest.blocks());
                if stale > 0 {
                    cache.checkpoint()?;
                    tracing::info!(volume = %name, generation = manifest.generation, stale, "cleared remote bits of blocks the store maps nowhere");
                }
            }
            cache.set_remote(manifest.blocks());
            Ok((Arc::new(cache), manifest, recorded, verdict, closed))
        })
        .await?;
        let recovered = start.elapsed();
        let diverged = matches!(verdict, base::Verdict::Diverged(_));
        // A clean close by this owner on the latest generation: nothing of the predecessor
        // can still land, so the claim it holds stands (see `base`, clean close).
        let held = verdict == base::Verdict::Current
            && !cfg.takeover
            && closed == Some(manifest.generation)
            && recorded
                .as_ref()
                .is_some_and(|b| b.generation == manifest.generation && b.publishing.is_none())
            && manifest
                .owner
                .as_ref()
                .is_some_and(|o| Some(&o.id) == cfg.owner.as_ref() && !o.released);
        let store = Arc::new(vstore);
        // The one place a publisher is made (see `publisher`).
        let publisher = (!view).then(|| Publisher::new(store.clone()));
        let claims = cfg.owner.is_some() && publisher.is_some() && !diverged && !held;
        let manifest = match (&cfg.owner, &publisher) {
            // A fenced cache publishes nothing, a claim included.
            (Some(owner), Some(publisher)) if claims => {
                claim(&cfg, publisher, manifest, owner).await?
            }
            _ => manifest,
        };
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            volume = %cfg.name,
            generation = manifest.generation,
            manifest_ms = ms(loaded),
            cache_ms = ms(recovered - loaded),
            claim_ms = ms(start.elapsed() - recovered),
            claimed = claims,
            "volume opened"
        );
        // Last, once nothing else can fail the open: registered, then checked.
        let view_pin = match (&cfg.snapshot, &holder) {
            (Some(name), Some(holder)) => Some(
                crate::snapshot::ViewPin::register(&cfg, &store, name, holder, manifest.generation)
                    .await?,
            ),
            _ => None,
        };
        let manifest = Arc::new(RwLock::new(manifest));
        // A read-only export follows the writer's newer generations (see `follow`).
        let follower = (cfg.read_only && cfg.snapshot.is_none()).then(|| {
            Arc::new(crate::follow::Follower::new(
                cache.clone(),
                store.clone(),
                manifest.clone(),
                cfg.dir.clone(),
                cfg.follow_interval,
            ))
        });
        let fetcher = Arc::new(Fetcher::new(
            cache.clone(),
            store.clone(),
            manifest.clone(),
            follower,
            tokio::runtime::Handle::current(),
        ));
        let group = Arc::new(StoreGroup::new(&cfg.name));
        let volume = Arc::new(Self {
            cfg,
            cache,
            store,
            publisher,
            manifest,
            fetcher,
            sync: tokio::sync::Mutex::new(SyncState::default()),
            group,
            uploads: UploadCounters::default(),
            compaction: Default::default(),
            stored: Default::default(),
            pins: Default::default(),
            readahead: Default::default(),
            fence: OnceLock::new(),
            releasing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            view_pin,
        });
        if volume.fetcher.follower.is_some() {
            start_follow_timer(&volume, volume.cfg.follow_interval);
        }
        if let base::Verdict::Diverged(reason) = verdict {
            let generation = recorded.map_or(0, |b| b.generation);
            let newer = volume.manifest_generation();
            volume.fence(Fence {
                volume: volume.cfg.name.clone(),
                generation,
                newer: Some(newer),
                reason,
            });
        }
        Ok(volume)
    }

    /// Latches the volume fenced (another writer published a newer manifest): from now on
    /// writes, flushes and syncs fail with the first fence's error, here and in the cache's
    /// zero-copy write path; reads of local and remote data go on. Returns the latched error.
    pub(crate) fn fence(&self, fence: Fence) -> VolumeError {
        let latched = self.fence.get_or_init(|| fence);
        tracing::error!(error = %latched, "volume fenced");
        self.cache.fence(latched.to_string());
        VolumeError::Fenced(latched.clone())
    }

    /// The latched fencing error, if any.
    pub fn fenced(&self) -> Option<&Fence> {
        self.fence.get()
    }

    /// Fails with the latched fencing error once the volume was fenced.
    pub(crate) fn check_fence(&self) -> Result<()> {
        match self.fence.get() {
            Some(f) => Err(VolumeError::Fenced(f.clone())),
            None => Ok(()),
        }
    }

    /// `check_fence`, fails with `Released` while or after `release` runs, and with
    /// `ReadOnly` on a snapshot view or a read-only export.
    pub(crate) fn check_writable(&self) -> Result<()> {
        self.check_fence()?;
        self.publisher("write")?;
        if self.releasing.load(Ordering::Acquire) {
            return Err(VolumeError::Released {
                volume: self.cfg.name.clone(),
                generation: self.manifest_generation(),
            });
        }
        Ok(())
    }

    /// The owner record of the latest manifest this volume loaded or published (after an
    /// open with an owner id: this owner's claim).
    pub fn owner(&self) -> Option<ManifestOwner> {
        self.manifest.read().owner.clone()
    }

    /// Whether a `release` was started and its record may be in the store (its PUT was sent,
    /// whatever came back): writes and syncs are refused (`Released`) from then on, and only
    /// `release` again (which flushes first and re-sends the same record) or `close` is left.
    pub fn is_releasing(&self) -> bool {
        self.releasing.load(Ordering::Acquire)
    }

    /// Whether `release` completed: the store records this owner as having released the
    /// volume, and writes are refused.
    pub fn is_released(&self) -> bool {
        self.releasing.load(Ordering::Acquire)
            && self
                .manifest
                .read()
                .owner
                .as_ref()
                .is_some_and(|o| o.released)
    }

    pub fn config(&self) -> &VolumeConfig {
        &self.cfg
    }

    pub fn geometry(&self) -> Geometry {
        self.cache.geometry()
    }

    /// The cache itself, for tests (feature `testing`): callers serve requests through the
    /// request protocol and the gate-level calls of `request`.
    #[cfg(any(test, feature = "testing"))]
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// Fetches one block from the object store (coalesced with a concurrent fetch of the same
    /// location: see `fetch`) and keeps it locally as Clean. The zero-copy path uses it for
    /// `Source::Remote` segments. A fill that fails (the cache file system is full or
    /// failing) does not fail the call: the fetched bytes are returned, the block just stays
    /// uncached.
    pub async fn fetch_block(&self, block: u64) -> Result<Bytes> {
        Ok(self.fetch_one(block).await?.data)
    }

    async fn fetch_one(&self, block: u64) -> Result<FetchedBlock> {
        if let Some(f) = &self.fetcher.follower {
            // A read-only export: the writer's newer generation, if the last look is old.
            f.tick().await;
        }
        self.fetcher
            .fetch(block)
            .await
            .map_err(|source| VolumeError::Fetch { block, source })
    }

    /// Fetches the blocks a partial write needs (`WritePrep::NeedsFetch`), then waits while
    /// an eviction of any of them is still punching its hole: the fill of such a block is
    /// refused (NO_FILL), so retrying the write at once would need the same fetch again and
    /// again and could run out of attempts (-EIO to the guest) while the eviction syncs files.
    /// Once the eviction ends, the next fetch fills the block. Bounded by [`EVICTION_WAIT`].
    /// A fill that failed (cache file system full or failing) fails the call with its error:
    /// the write needs the block in the cache.
    pub async fn fetch_for_write(&self, blocks: &[u64]) -> Result<()> {
        let fetched = futures::future::join_all(blocks.iter().map(|&b| self.fetch_one(b))).await;
        for (&block, f) in blocks.iter().zip(fetched) {
            if let Some(source) = f?.fill_error {
                return Err(VolumeError::Fetch { block, source });
            }
        }
        let until = Instant::now() + EVICTION_WAIT;
        while blocks.iter().any(|&b| self.cache.eviction_pending(b)) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Fetches `blocks` concurrently (each as [`Volume::fetch_block`]); the first error wins.
    pub(crate) async fn fetch_blocks(&self, blocks: &[u64]) -> Result<Vec<Bytes>> {
        futures::future::join_all(blocks.iter().map(|&b| self.fetch_block(b)))
            .await
            .into_iter()
            .collect()
    }

    /// Reads `buf.len()` bytes at `offset`, fetching cold blocks as needed. The cache's file
    /// I/O runs on the blocking pool (into a staging buffer copied into `buf`), never on an
    /// async worker.
    ///
    /// Returns no byte older than a write completed before the call (a fetch in flight is
    /// joined only if it reads the location the manifest names now, see `fetch`). A cold
    /// block whose fill into the cache fails (full or failing cache file system) is served
    /// from the fetched bytes and stays uncached (`VolumeStats::fills_failed`).
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.note_read(offset, buf.len() as u64);
        let (cache, len) = (self.cache.clone(), buf.len());
        let staged = self
            .serve_read(offset, len as u64, (), move |(), ready| {
                let mut staged = vec![0u8; len];
                ready.copy_into(&cache, &mut staged).map(|()| staged)
            })
            .await
            .map_err(|refused| refused.error)??;
        buf.copy_from_slice(&staged);
        Ok(())
    }

    /// Tells the readahead heuristic that `len` bytes at `offset` are being read (by
    /// [`Volume::read`] itself, or by a ublk target serving a READ from the cache); when the
    /// read continues a sequential stream, the cold blocks among the `readahead_blocks`
    /// blocks after it are fetched in the background (see `crate::readahead` for what
    /// makes a stream, and `Fetcher::prefetch`). A stream over cached blocks costs a few
    /// atomic operations per read. Starting the fetches locks the manifest and the
    /// fetcher's in-flight map for a few map operations: on a thread of a tokio runtime that
    /// happens here, on any other thread (a ublk queue's loop thread, which must never wait
    /// for a lock) a task on the volume's runtime does it, so the caller takes no lock.
    pub fn note_read(&self, offset: u64, len: u64) {
        // (A range past the end of the address space is refused by the read itself.)
        let Some(end) = offset.checked_add(len) else {
            return;
        };
        if self.cfg.readahead_blocks == 0 || len == 0 {
            return;
        }
        let bs = u64::from(self.cfg.block_size);
        let (first, last) = (offset / bs, (end - 1) / bs);
        let window = u64::from(self.cfg.readahead_blocks);
        let Some(ahead) = self
            .readahead
            .note(first, last, window, self.geometry().num_blocks())
        else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            self.fetcher.prefetch(ahead);
        } else {
            self.fetcher.prefetch_soon(ahead);
        }
    }

    /// Writes `data` at `offset`. A partial write to a block that is only in the object store
    /// fetches that block first. The cache's file I/O (and its wait for the blocks' stripe
    /// locks) runs on the blocking pool, never on an async worker.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.write_copied(offset, Bytes::copy_from_slice(data))
            .await
    }

    /// The block device's FLUSH: every write completed before the call is durable on local
    /// disk when it returns (concurrent flushes share one fsync).
    pub async fn flush(&self) -> Result<()> {
        self.check_fence()?;
        let cache = self.cache.clone();
        let (every, name) = (self.cfg.checkpoint_records, self.cfg.name.clone());
        blocking(move || {
            cache.flush()?;
            // Bound replay time even when nothing is flushed to the store for a long time.
            // The FLUSH is already durable: a checkpoint that fails (a nearly full disk) only
            // leaves a longer replay, so it is logged, never the FLUSH's error.
            if cache.checkpoint_due(every) {
                if let Err(e) = cache.checkpoint() {
                    tracing::warn!(volume = %name, error = %e, "checkpoint after a FLUSH failed; the WAL keeps growing until one succeeds");
                }
            }
            Ok(())
        })
        .await
    }

    /// Evicts Clean blocks until the local cache fits in `budget` bytes.
    pub async fn evict_to(&self, budget: u64) -> Result<u64> {
        let cache = self.cache.clone();
        blocking(move || Ok(cache.evict_to(budget)?)).await
    }

    /// Clean shutdown: local durability (FLUSH) and a checkpoint, so the next open replays
    /// nothing. Data not flushed to the store stays in the cache directory. A fenced volume
    /// reports its fence and touches nothing. Waits for a sync in progress; afterwards
    /// `sync_to_store` and `release` fail with `Closed`. An owner's (unreleased) volume then
    /// records the clean close, which spares the next open on this cache its claim (see
    /// `base`).
    ///
    /// Then the cache is latched dead, whether or not this succeeded: work that outlived a
    /// hand-off (a deferred commit or zero write whose request the kernel reissues to the
    /// successor) reaches no file of the directory the successor opens next. What the latch
    /// drops (WAL records a failed write-out left buffered) is what a `kill -9` drops: no
    /// acknowledged write depends on it.
    pub async fn close(&self) -> Result<()> {
        self.check_fence()?;
        // Under the sync lock: no publish is in flight, and none starts after this.
        let _sync = self.sync.lock().await;
        self.closed.store(true, Ordering::Release);
        let cache = self.cache.clone();
        let dir = self.cfg.dir.clone();
        // Only an owner claims at open, so only an owner's close can spare the next claim;
        // a released volume must be claimed again.
        let mark = (self.cfg.owner.is_some() && !self.releasing.load(Ordering::Acquire))
            .then(|| self.manifest_generation());
        let closed = blocking(move || {
            let synced = cache.flush().and_then(|()| cache.checkpoint());
            cache.die();
            synced?;
            if let Some(generation) = mark {
                base::mark_closed(&dir, generation)?;
            }
            Ok(())
        })
        .await;
        if let Some(pin) = &self.view_pin {
            pin.release(&self.cfg.name, &self.store).await;
        }
        closed
    }

    /// The handle's publisher, for `op`; refused (`ReadOnly`) on a handle that has none: a
    /// snapshot view or a read-only export (`VolumeConfig::read_only`). Every operation that
    /// publishes, or that only an owner may do (snapshots, GC, writes), asks for it first.
    pub(crate) fn publisher(&self, op: &'static str) -> Result<&Publisher> {
        self.publisher
            .as_ref()
            .ok_or_else(|| VolumeError::ReadOnly {
                volume: self.cfg.name.clone(),
                snapshot: self.cfg.snapshot.clone(),
                op,
            })
    }

    /// Whether `close` ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Fails with `Closed` once `close` ran (call it holding the sync lock).
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(VolumeError::Closed {
                volume: self.cfg.name.clone(),
            });
        }
        Ok(())
    }

    /// Simulates process death (tests, crash drills): the cache latches dead so nothing more
    /// reaches its files, and in-flight fetches are drained so none of them touches the
    /// directory after this returns. Drop the volume afterwards and reopen the directory.
    pub async fn kill(&self) {
        if let Some(pin) = &self.view_pin {
            pin.stop();
        }
        self.cache.die();
        self.fetcher.drain().await;
    }

    /// A read-only export (`VolumeConfig::read_only`): looks at the store now and adopts
    /// the writer's latest generation if it is newer (see `follow`: the export's cached
    /// copies of blocks that changed are dropped first). Returns the generation served
    /// afterwards. Any other handle: nothing to follow, returns its generation.
    pub async fn follow(&self) -> Result<u64> {
        match &self.fetcher.follower {
            Some(f) => f.follow().await,
            None => Ok(self.manifest_generation()),
        }
    }

    /// Makes every write completed before this call durable in the object store, sharing one
    /// sync ([`Volume::sync_to_store`]) with every caller that arrived while the previous one
    /// ran (group commit, `group.rs`). Returns a generation that holds those writes.
    pub async fn flush_to_store(self: &Arc<Self>) -> Result<u64> {
        let volume = self.clone();
        self.group
            .flush(move || {
                let volume = volume.clone();
                async move { Ok(volume.sync_to_store().await?.generation) }
            })
            .await
    }

    /// The block device's FLUSH (and a FUA write's): durable on local disk
    /// ([`Volume::flush`]), and with [`crate::Durability::Store`] in the object store too
    /// ([`Volume::flush_to_store`]).
    pub async fn flush_durable(self: &Arc<Self>) -> Result<()> {
        self.flush().await?;
        if self.cfg.durability == crate::Durability::Store {
            self.flush_to_store().await?;
        }
        Ok(())
    }

    /// How many group syncs ran for how many `flush_to_store` calls.
    pub fn group_figures(&self) -> GroupFigures {
        self.group.figures()
    }

    /// Generation of the latest manifest this volume loaded or published.
    pub fn manifest_generation(&self) -> u64 {
        self.manifest.read().generation
    }

    /// A snapshot of the counters; never waits for a `sync_to_store` in progress. Live bytes
    /// are summed from the manifest's per-segment pack use (O(segments × packs per segment),
    /// on the blocking pool), never from a scan of the blocks.
    pub async fn stats(&self) -> VolumeStats {
        let manifest = self.manifest.clone();
        let (mapped_blocks, live_bytes) = blocking(move || {
            let m = manifest.read();
            Ok((m.len(), m.live_bytes()))
        })
        .await
        .unwrap_or_default();
        let k = &self.compaction;
        let c = &self.fetcher.counters;
        VolumeStats {
            cache: self.cache.stats(),
            manifest_generation: self.manifest_generation(),
            blocks_fetched: c.fetched.load(Ordering::Relaxed),
            fetches_coalesced: c.coalesced.load(Ordering::Relaxed),
            readahead_started: c.readahead.load(Ordering::Relaxed),
            fills_refused: c.fill_refused.load(Ordering::Relaxed),
            fills_failed: c.fill_failed.load(Ordering::Relaxed),
            packs_uploaded: self.uploads.packs.load(Ordering::Relaxed),
            bytes_uploaded: self.uploads.bytes.load(Ordering::Relaxed),
            mapped_blocks,
            live_bytes,
            stored_packs: self.stored.packs.load(Ordering::Relaxed),
            stored_bytes: self.stored.bytes.load(Ordering::Relaxed),
            compactions: k.passes.load(Ordering::Relaxed),
            packs_compacted: k.packs_rewritten.load(Ordering::Relaxed),
            bytes_compacted: k.bytes_copied.load(Ordering::Relaxed),
        }
    }
}
