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

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use glidefs_cache::{Gate, Geometry, WriteTicket};
use glidefs_objstore::{
    validate_owner_id, GcOptions, GcReport, ManifestOwner, SnapshotInfo, SnapshotRecord,
    VolumeStore,
};
use parking_lot::RwLock;

use crate::base::{self, Verdict};
use crate::blocking::blocking;
use crate::compact::{CompactOptions, CompactReport, Compactor};
use crate::config::VolumeConfig;
use crate::error::{Fence, Result, VolumeError};
use crate::fetch::Fetcher;
use crate::group::{GroupFigures, StoreGroup};
use crate::io::Io;
use crate::open;
use crate::pins::ViewPin;
use crate::publisher::Publisher;
use crate::request::{FirstAttempt, ReadyRead, Refused, Requests};
use crate::shared::Shared;
use crate::snapshot::Snapshots;
use crate::stats::VolumeStats;
use crate::sync::{Flusher, SyncReport};

/// One volume. Open with [`Volume::open`]; share as `Arc<Volume>`.
///
/// The volume is its parts' shared state (`Shared`, in `shared.rs`) plus what only the
/// whole handle uses: the group commit of store FLUSHes and a view's registration. This
/// file holds the struct, `open` (its steps in `open.rs`) and `close`, and every other
/// public call as a documented delegation to the part that runs it: the flush, compaction,
/// GC, snapshots and grow (`sync`, `compact`, `gc`, `snapshot`, `grow`), the I/O calls
/// (`io.rs`), the request protocol and cold fetches (`request.rs`), the counters
/// (`stats.rs`). The gate-level calls of the ublk target's fast path are functions of a
/// volume in `fast_path.rs`.
#[derive(Debug)]
pub struct Volume {
    pub(crate) shared: Shared,
    /// Group commit of FLUSHes durable in the store (`group.rs`).
    group: Arc<StoreGroup>,
    /// A snapshot view's registration under its snapshot (see `pins.rs`).
    view_pin: Option<ViewPin>,
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
            let v = &v.shared;
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
        let view = open::view_of(&mut cfg);
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
        let manifest = open::load_manifest(&cfg, &vstore).await?;
        let loaded = start.elapsed();
        let recovered = open::recover_cache(&cfg, geo, manifest, view.read_only).await?;
        let recovered_at = start.elapsed();
        let diverged = matches!(recovered.verdict, Verdict::Diverged(_));
        let held = open::holds_claim(&cfg, &recovered);
        let open::Recovered {
            cache,
            manifest,
            recorded,
            verdict,
            ..
        } = recovered;
        let store = Arc::new(vstore);
        // The one place a publisher is made (see `publisher`).
        let publisher = (!view.read_only).then(|| Publisher::new(store.clone()));
        let claims = cfg.owner.is_some() && publisher.is_some() && !diverged && !held;
        let manifest = match (&cfg.owner, &publisher) {
            // A fenced cache publishes nothing, a claim included.
            (Some(owner), Some(publisher)) if claims => {
                open::claim(&cfg, publisher, manifest, owner).await?
            }
            _ => manifest,
        };
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            volume = %cfg.name,
            generation = manifest.generation,
            manifest_ms = ms(loaded),
            cache_ms = ms(recovered_at - loaded),
            claim_ms = ms(start.elapsed() - recovered_at),
            claimed = claims,
            "volume opened"
        );
        // Last, once nothing else can fail the open: registered, then checked.
        let view_pin = match (&cfg.snapshot, &view.holder) {
            (Some(name), Some(holder)) => {
                Some(ViewPin::register(&cfg, &store, name, holder, manifest.generation).await?)
            }
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
            shared: Shared::new(cfg, cache, store, publisher, manifest, fetcher),
            group,
            view_pin,
        });
        if volume.shared.fetcher.follower.is_some() {
            start_follow_timer(&volume, volume.shared.cfg.follow_interval);
        }
        if let Verdict::Diverged(reason) = verdict {
            let generation = recorded.map_or(0, |b| b.generation);
            let newer = volume.manifest_generation();
            volume.shared.fence(Fence {
                volume: volume.shared.cfg.name.clone(),
                generation,
                newer: Some(newer),
                reason,
            });
        }
        Ok(volume)
    }

    /// The latched fencing error, if any.
    pub fn fenced(&self) -> Option<&Fence> {
        self.shared.fence.get()
    }

    /// The owner record of the latest manifest this volume loaded or published (after an
    /// open with an owner id: this owner's claim).
    pub fn owner(&self) -> Option<ManifestOwner> {
        self.shared.owner()
    }

    /// Whether a `release` was started and its record may be in the store (its PUT was sent,
    /// whatever came back): writes and syncs are refused (`Released`) from then on, and only
    /// `release` again (which flushes first and re-sends the same record) or `close` is left.
    pub fn is_releasing(&self) -> bool {
        self.shared.releasing.load(Ordering::Acquire)
    }

    /// Whether `release` completed: the store records this owner as having released the
    /// volume, and writes are refused.
    pub fn is_released(&self) -> bool {
        self.shared.is_released()
    }

    pub fn config(&self) -> &VolumeConfig {
        &self.shared.cfg
    }

    pub fn geometry(&self) -> Geometry {
        self.shared.cache.geometry()
    }

    /// The cache itself, for tests (feature `testing`): callers serve requests through the
    /// request protocol and the gate-level calls of `request`.
    #[cfg(any(test, feature = "testing"))]
    pub fn cache(&self) -> &Arc<glidefs_cache::Cache> {
        &self.shared.cache
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
        self.shared.warm.stop();
        self.shared.check_fence()?;
        // Under the sync lock: no publish is in flight, and none starts after this.
        let _sync = self.shared.sync.lock().await;
        self.shared.closed.store(true, Ordering::Release);
        let cache = self.shared.cache.clone();
        let dir = self.shared.cfg.dir.clone();
        // Only an owner claims at open, so only an owner's close can spare the next claim;
        // a released volume must be claimed again.
        let mark = (self.shared.cfg.owner.is_some()
            && !self.shared.releasing.load(Ordering::Acquire))
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
            pin.release(&self.shared.cfg.name, &self.shared.store).await;
        }
        closed
    }

    /// Simulates process death (tests, crash drills): the cache latches dead so nothing more
    /// reaches its files, and in-flight fetches are drained so none of them touches the
    /// directory after this returns. Drop the volume afterwards and reopen the directory.
    pub async fn kill(&self) {
        if let Some(pin) = &self.view_pin {
            pin.stop();
        }
        self.shared.warm.stop();
        self.shared.cache.die();
        self.shared.fetcher.drain().await;
    }

    /// A read-only export (`VolumeConfig::read_only`): looks at the store now and adopts
    /// the writer's latest generation if it is newer (see `follow`: the export's cached
    /// copies of blocks that changed are dropped first). Returns the generation served
    /// afterwards. Any other handle: nothing to follow, returns its generation.
    pub async fn follow(&self) -> Result<u64> {
        match &self.shared.fetcher.follower {
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
        if self.shared.cfg.durability == crate::config::Durability::Store {
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
        self.shared.manifest_generation()
    }

    /// A snapshot of the counters; never waits for a `sync_to_store` in progress. Live bytes
    /// are summed from the manifest's per-segment pack use (O(segments × packs per segment),
    /// on the blocking pool), never from a scan of the blocks.
    pub async fn stats(&self) -> VolumeStats {
        crate::stats::stats(&self.shared).await
    }

    // The parts' public calls, each documented here and run by its part over `shared`.

    fn flusher(&self) -> Flusher<'_> {
        Flusher { v: &self.shared }
    }

    fn snapshots_part(&self) -> Snapshots<'_> {
        Snapshots { v: &self.shared }
    }

    /// Makes every write completed before this call durable in the object store.
    pub async fn sync_to_store(&self) -> Result<SyncReport> {
        self.flusher().sync_to_store().await
    }

    /// Gives the volume up (the daemon: `volume rm`, after the final flush), so that another
    /// owner can open it without a takeover. Refuses writes from the start (`Released`),
    /// flushes every write to the store (`sync_to_store`), then publishes the next generation
    /// with the same block map and this owner's record marked released. Afterwards writes
    /// and syncs fail with `Released` (the zero-copy path too: the cache is fenced); `close`
    /// still works. Returns the generation published; calling it again returns it again.
    ///
    /// Call it with no writer active (the device stopped): a zero-copy write racing with it
    /// is flushed by one of up to four syncs, or the release fails with `Unsettled` (writes
    /// allowed again) rather than leave data only in this cache. If another writer published
    /// since (a takeover), the volume is fenced and nothing is released. On any other error
    /// before the release record was sent, the volume stays usable and `release` may be
    /// retried. Once the record may have reached the store (its PUT was sent, whatever the
    /// reply), writes and syncs keep failing with `Released` even if `release` fails: the
    /// store may already say "released", so another owner may attach, and a write accepted
    /// here could never be published (it would fence on this owner's own record). A retry
    /// of `release` re-sends the identical record (the store answers Ok if it had landed);
    /// a close and reopen claims the volume again. Without an owner id: `InvalidConfig`.
    pub async fn release(&self) -> Result<u64> {
        self.flusher().release().await
    }

    /// One compaction pass (see the module docs). Safe beside flushes and guest I/O; two
    /// passes of one volume should not run at once (the second one's copies would be dead).
    pub async fn compact(&self, opts: CompactOptions) -> Result<CompactReport> {
        Compactor { v: &self.shared }.compact(opts).await
    }

    /// One GC pass over this volume's objects, then a LIST to update the stored figures.
    pub async fn collect_garbage(&self, opts: GcOptions) -> Result<GcReport> {
        crate::gc::collect_garbage(&self.shared, opts).await
    }

    /// Grows the volume to `new_size` bytes (a multiple of the block size; the current size
    /// is a no-op) and returns the size it had before. Durable locally when it returns (see
    /// the module docs); the store's manifest records it at the next publish. Reads, writes
    /// and flushes go on meanwhile (it never waits for the store). Blocks past the old end
    /// read as zeros.
    ///
    /// Errors: a smaller size is `Cache(Shrink)`, a size off the block grid
    /// `Cache(InvalidGeometry)` (both kind `InvalidInput`, nothing changed); a fenced, released
    /// or closed volume refuses like a write does; a failure writing the cache's checkpoint
    /// leaves the old size.
    pub async fn resize(&self, new_size: u64) -> Result<u64> {
        crate::grow::resize(&self.shared, new_size).await
    }

    /// The volume's size in bytes now (it grows with [`Volume::resize`]; `config().size` is
    /// the size it was opened with). One atomic load.
    pub fn size(&self) -> u64 {
        self.shared.size()
    }

    /// Takes snapshot `name` of everything written before this call (see the module docs).
    pub async fn create_snapshot(&self, name: &str) -> Result<SnapshotRecord> {
        self.snapshots_part().create_snapshot(name).await
    }

    /// The volume's snapshots.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.snapshots_part().snapshots().await
    }

    /// One snapshot, or `None`.
    pub async fn snapshot(&self, name: &str) -> Result<Option<SnapshotInfo>> {
        self.snapshots_part().snapshot(name).await
    }

    /// Deletes snapshot `name` (refused while a clone uses it or a view on any host has it
    /// open); its packs go with the next GC pass that no other snapshot or the live map keeps
    /// them from.
    pub async fn delete_snapshot(&self, name: &str) -> Result<SnapshotRecord> {
        self.snapshots_part().delete_snapshot(name).await
    }

    /// An operator's remedy for a dead host: drops every registration of a view of snapshot
    /// `name` held by `holder` (`None`: every holder), so a delete no longer waits for their
    /// lease. A view of that holder still open may then fail its cold reads once the snapshot
    /// is deleted. Returns the registration ids dropped.
    pub async fn clear_snapshot_views(
        &self,
        name: &str,
        holder: Option<&str>,
    ) -> Result<Vec<String>> {
        self.snapshots_part()
            .clear_snapshot_views(name, holder)
            .await
    }

    /// Creates volume `cfg.name` in the store as a clone of `origin`'s snapshot `snapshot`
    /// (its generation 1; nothing is copied), then opens it with `cfg` (whose size and block
    /// size must be the snapshot's, and whose encryption key the origin's: the clone reads the
    /// origin's frames and writes its own with it). The clone has its own owner, fencing and GC; it keeps the
    /// snapshot from being deleted until the clone is purged.
    pub async fn create_clone(
        cfg: VolumeConfig,
        store: Arc<dyn object_store::ObjectStore>,
        origin: &str,
        snapshot: &str,
    ) -> Result<Arc<Volume>> {
        crate::snapshot::create_clone(&cfg, store.clone(), origin, snapshot).await?;
        Volume::open(cfg, store).await
    }

    // Warm sets (warm.rs; module docs there).

    /// Starts recording the blocks this volume reads (every read it is told of through
    /// [`Volume::note_read`], hit or miss), each once in first-read order, for `opts.window`
    /// or until `opts.max_blocks` are recorded; then the set is stored as the volume's warm
    /// set, replacing any (see [`Volume::warm_status`] for how it went). Returns at once. One
    /// recording at a time (`InvalidConfig` while one runs); refused on a read-only handle.
    /// Call it on a runtime: the recording ends on a task of it.
    pub async fn record_warm_set(self: &Arc<Self>, opts: crate::RecordOptions) -> Result<()> {
        let invalid = |detail: String| VolumeError::InvalidConfig {
            volume: self.shared.cfg.name.clone(),
            detail,
        };
        opts.check().map_err(invalid)?;
        self.shared.publisher("record a warm set")?;
        let w = &self.shared.warm;
        let recorder = {
            let mut slot = w.recorder.write();
            if self.shared.is_closed() || self.shared.cache.is_dead() {
                return Err(VolumeError::Closed {
                    volume: self.shared.cfg.name.clone(),
                });
            }
            if let Some(r) = slot.as_ref() {
                return Err(invalid(format!(
                    "a warm-set recording is already running ({} blocks so far, {} s left)",
                    r.len(),
                    r.remaining().as_secs()
                )));
            }
            let r = Arc::new(crate::warm::Recorder::new(
                self.shared.cache.geometry().num_blocks(),
                opts,
            ));
            *slot = Some(r.clone());
            w.recording.store(true, Ordering::Relaxed);
            r
        };
        let weak = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            while !recorder.done() {
                tokio::time::sleep(recorder.remaining().min(Duration::from_millis(100))).await;
            }
            if let Some(v) = weak.upgrade() {
                drop(crate::warm::store_recording(&v.shared, &recorder).await);
            }
        });
        *w.recording_task.lock() = Some(task);
        tracing::info!(volume = %self.shared.cfg.name, window = ?opts.window, max_blocks = opts.max_blocks, "warm-set recording started");
        Ok(())
    }

    /// The volume's stored warm set, if it has one.
    pub async fn warm_set(&self) -> Result<Option<glidefs_objstore::WarmSet>> {
        let v = &self.shared;
        v.store
            .warm_set()
            .await
            .map_err(|e| VolumeError::store("get warm set", &v.cfg.name, e))
    }

    /// Drops the volume's warm set: a recording in progress ends without storing anything,
    /// and the stored set is deleted. Refused on a read-only handle.
    pub async fn drop_warm_set(&self) -> Result<()> {
        let v = &self.shared;
        v.publisher("drop the warm set")?;
        let recording = {
            let mut slot = v.warm.recorder.write();
            v.warm.recording.store(false, Ordering::Relaxed);
            slot.take().is_some()
        };
        let task = v.warm.recording_task.lock().take();
        if let Some(task) = task {
            if recording {
                // It has not begun storing, and will not (`store_recording`).
                task.abort();
            } else {
                // It may be storing its set: a PUT under way cannot be called back, so it
                // ends first and the delete below comes after it.
                drop(task.await);
            }
        }
        v.store
            .delete_warm_set()
            .await
            .map_err(|e| VolumeError::store("delete warm set", &v.cfg.name, e))
    }

    /// Starts warming the volume from its stored warm set in the background (see
    /// [`Volume::warm`]), replacing a warm that runs. Call it on a runtime.
    pub fn start_warm(self: &Arc<Self>, budget: u64, gets: usize) {
        let v = Arc::clone(self);
        let task = tokio::spawn(async move {
            if let Err(e) = v.warm(budget, gets).await {
                tracing::warn!(volume = %v.shared.cfg.name, error = %e, "warm failed");
                *v.shared.warm.last_warm.lock() = Some(crate::WarmReport {
                    note: Some(format!("failed: {e}")),
                    ..crate::WarmReport::default()
                });
            }
        });
        if let Some(old) = self.shared.warm.warming.lock().replace(task) {
            old.abort();
        }
    }

    /// Fetches the blocks of the volume's stored warm set that are cold now (in the store
    /// only: never a block written here), in packs' order, with at most `gets` GETs in
    /// flight, until `budget` bytes of frames were fetched; what it did is also kept as the
    /// volume's last warm ([`Volume::warm_status`]). A set of another block size is not used.
    /// The fetches fill the cache as cold reads do: no read returns anything else for it.
    pub async fn warm(&self, budget: u64, gets: usize) -> Result<crate::WarmReport> {
        let report = crate::warm::warm(&self.shared, budget, gets).await?;
        *self.shared.warm.last_warm.lock() = Some(report.clone());
        Ok(report)
    }

    /// The recording in progress, the last recording's and the last warm's outcome.
    pub fn warm_status(&self) -> crate::WarmStatus {
        let w = &self.shared.warm;
        crate::WarmStatus {
            recording: w.recording_status(),
            last_recording: w.last_recording.lock().clone(),
            warming: w.warming.lock().as_ref().is_some_and(|t| !t.is_finished()),
            last_warm: w.last_warm.lock().clone(),
        }
    }

    // The I/O calls and the request protocol (io.rs, request.rs; module docs there).

    fn io(&self) -> Io<'_> {
        Io { v: &self.shared }
    }

    fn requests(&self) -> Requests<'_> {
        Requests { v: &self.shared }
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
        self.io().read(offset, buf).await
    }

    /// Tells the readahead heuristic (and a warm-set recording, see
    /// [`Volume::record_warm_set`]) that `len` bytes at `offset` are being read (by
    /// [`Volume::read`] itself, or by a ublk target serving a READ from the cache); when the
    /// read continues a sequential stream, the cold blocks among the `readahead_blocks`
    /// blocks after it are fetched in the background (see `crate::readahead` for what
    /// makes a stream, and `Fetcher::prefetch`). A stream over cached blocks costs a few
    /// atomic operations per read. Starting the fetches locks the manifest and the
    /// fetcher's in-flight map for a few map operations: on a thread of a tokio runtime that
    /// happens here, on any other thread (a ublk queue's loop thread, which must never wait
    /// for a lock) a task on the volume's runtime does it, so the caller takes no lock.
    pub fn note_read(&self, offset: u64, len: u64) {
        self.io().note_read(offset, len)
    }

    /// Writes `data` at `offset`. A partial write to a block that is only in the object store
    /// fetches that block first. The cache's file I/O (and its wait for the blocks' stripe
    /// locks) runs on the blocking pool, never on an async worker.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.io().write(offset, data).await
    }

    /// The block device's FLUSH: every write completed before the call is durable on local
    /// disk when it returns (concurrent flushes share one fsync).
    pub async fn flush(&self) -> Result<()> {
        self.io().flush().await
    }

    /// Evicts Clean blocks until the local cache fits in `budget` bytes.
    pub async fn evict_to(&self, budget: u64) -> Result<u64> {
        self.io().evict_to(budget).await
    }

    /// Fetches one block from the object store (coalesced with a concurrent fetch of the same
    /// location: see `fetch`) and keeps it locally as Clean. The zero-copy path uses it for
    /// `Source::Remote` segments. A fill that fails (the cache file system is full or
    /// failing) does not fail the call: the fetched bytes are returned, the block just stays
    /// uncached.
    pub async fn fetch_block(&self, block: u64) -> Result<Bytes> {
        self.requests().fetch_block(block).await
    }

    /// Fetches the blocks a partial write needs (`WritePrep::NeedsFetch`), then waits while
    /// an eviction of any of them is still punching its hole: the fill of such a block is
    /// refused (NO_FILL), so retrying the write at once would need the same fetch again and
    /// again and could run out of attempts (-EIO to the guest) while the eviction syncs files.
    /// Once the eviction ends, the next fetch fills the block. Bounded by `EVICTION_WAIT` (30 s).
    /// A fill that failed (cache file system full or failing) fails the call with its error:
    /// the write needs the block in the cache.
    pub async fn fetch_for_write(&self, blocks: &[u64]) -> Result<()> {
        self.requests().fetch_for_write(blocks).await
    }

    /// Runs the read protocol (module docs) for `len` bytes at `offset`: once a plan under a
    /// gate has every remote block fetched, `serve(state, ready)` runs on the blocking pool
    /// and its answer is returned. On failure the state comes back with the error.
    pub async fn serve_read<S, R, F>(
        &self,
        offset: u64,
        len: u64,
        state: S,
        serve: F,
    ) -> std::result::Result<R, Refused<S>>
    where
        S: Send + 'static,
        R: Send + 'static,
        F: Fn(S, ReadyRead<'_>) -> R + Send + Sync + 'static,
    {
        self.requests().serve_read(offset, len, state, serve).await
    }

    /// Runs the write protocol (module docs) for `len` bytes at `offset`: once the write is
    /// prepared under a gate (stripe locks waited for), `serve(state, gate, ticket)` runs on
    /// the blocking pool; the caller moves the data into `gate.active()` at
    /// `ticket.file_offset()` and commits the ticket under that gate
    /// ([`crate::fast_path::commit_write`]). On failure the state comes back with the error.
    pub async fn serve_write<S, R, F>(
        &self,
        offset: u64,
        len: u64,
        state: S,
        serve: F,
    ) -> std::result::Result<R, Refused<S>>
    where
        S: Send + 'static,
        R: Send + 'static,
        F: Fn(S, Gate, WriteTicket) -> R + Send + Sync + 'static,
    {
        self.requests().serve_write(offset, len, state, serve).await
    }

    /// The first attempt of [`Volume::serve_write`], made here: on a blocking-pool thread
    /// (it waits for the gate and stripe locks, and promotes), never on an async worker.
    pub fn serve_write_here<S, R, F>(
        &self,
        offset: u64,
        len: u64,
        state: S,
        serve: F,
    ) -> FirstAttempt<S, R>
    where
        F: Fn(S, Gate, WriteTicket) -> R,
    {
        self.requests().serve_write_here(offset, len, state, serve)
    }

    /// DISCARD / WRITE_ZEROES: makes `len` bytes at `offset` read as zeros by punching the
    /// cache's active file (`Cache::zero_with`), fetching first a partial block that is only
    /// in the store. Whole blocks so zeroed are published unmapped by the next flush: they
    /// take no space in the store and read with no I/O.
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.requests().write_zeroes(offset, len).await
    }
}

/// The cache's state, lock-free (the gate-level calls of the ublk target's fast path are
/// functions of a volume: [`crate::fast_path`]).
impl Volume {
    /// The state of `block` (lock-free).
    pub fn block_info(&self, block: u64) -> glidefs_cache::BlockInfo {
        self.shared.cache.block_info(block)
    }

    /// The cache's per-state counters (O(1), lock-free: see `Cache::stats`).
    pub fn cache_stats(&self) -> glidefs_cache::CacheStats {
        self.shared.cache.stats()
    }
}
