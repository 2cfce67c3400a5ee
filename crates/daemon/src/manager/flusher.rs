//! The per-volume background flusher and the flush bookkeeping shared with `POST .../flush`.
//!
//! Shape (one tokio task per volume): every `TICK` it reads the volume's dirty and syncing
//! block counts (an O(blocks) scan, on the blocking pool) and runs `sync_to_store` when
//!   - dirty bytes >= `threshold`, or
//!   - anything is unflushed and the oldest of it has waited >= `interval`.
//!
//! After a failure it waits (doubling from 1 s up to `interval`) before trying again. It stops
//! when [`Flusher::stop`] is called (an in-progress sync is finished first: `sync_to_store` is
//! not cancel-safe halfway through a publish); a panic inside the task is caught by the join
//! and logged.
//!
//! Flush lag: `dirty_since` is when the flusher (or a requested flush) first saw unflushed data
//! that is still unflushed; lag = now - dirty_since. Its precision is one tick.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use glidefs_volume::{SyncReport, Volume, VolumeError};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use glidefs_model::api::FlushInfo;
use glidefs_model::log::chain;

/// How often the flusher looks at the volume.
const TICK: Duration = Duration::from_secs(1);

/// Flush figures of one volume.
#[derive(Debug, Default)]
pub struct FlushStats {
    pub count: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Total time spent in successful flushes, microseconds.
    pub duration_us: AtomicU64,
    inner: Mutex<FlushTimes>,
}

#[derive(Debug, Default)]
struct FlushTimes {
    dirty_since: Option<Instant>,
    last_success: Option<SystemTime>,
    last_error: Option<String>,
}

impl FlushStats {
    /// Notes that unflushed data exists (`true`) or that none does (`false`).
    pub fn observe_unflushed(&self, unflushed: bool) {
        let mut t = self.inner.lock();
        match (unflushed, t.dirty_since) {
            (true, None) => t.dirty_since = Some(Instant::now()),
            (false, _) => t.dirty_since = None,
            _ => {}
        }
    }

    /// Seconds the oldest unflushed data has waited.
    pub fn lag(&self) -> Duration {
        self.inner
            .lock()
            .dirty_since
            .map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// The figures for the API.
    pub fn info(&self) -> FlushInfo {
        let t = self.inner.lock();
        FlushInfo {
            lag_secs: t.dirty_since.map_or(0.0, |d| d.elapsed().as_secs_f64()),
            count: self.count.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            last_success_unix: t
                .last_success
                .and_then(|s| s.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
            last_error: t.last_error.clone(),
            // Filled in from the volume (`Volume::group_figures`).
            store_flushes: 0,
            store_syncs: 0,
        }
    }
}

/// Runs one `sync_to_store` and records its outcome in `stats`.
pub(crate) async fn flush_now(
    volume: &Volume,
    stats: &FlushStats,
) -> Result<(SyncReport, Duration), VolumeError> {
    let started = Instant::now();
    match volume.sync_to_store().await {
        Ok(report) => {
            let took = started.elapsed();
            stats.count.fetch_add(1, Ordering::Relaxed);
            stats.bytes.fetch_add(report.bytes, Ordering::Relaxed);
            stats.duration_us.fetch_add(
                u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            let mut t = stats.inner.lock();
            t.last_success = Some(SystemTime::now());
            t.last_error = None;
            // Whatever was dirty when the flush started is now in the store; data written
            // during the flush is at most this old.
            if t.dirty_since.is_some_and(|d| d < started) {
                t.dirty_since = Some(started);
            }
            Ok((report, took))
        }
        Err(e) => {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            stats.inner.lock().last_error = Some(e.to_string());
            Err(e)
        }
    }
}

/// When the flusher syncs.
#[derive(Debug, Clone)]
pub(crate) struct FlushPolicy {
    pub threshold_bytes: u64,
    pub interval: Duration,
    /// Compaction and GC passes, run by a second task of the same handle (`space`).
    pub space: super::space::SpacePolicy,
}

/// Handle of a running flusher task.
#[derive(Debug)]
pub(crate) struct Flusher {
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
    space: Mutex<Option<JoinHandle<()>>>,
}

impl Flusher {
    /// Starts the task for `volume`.
    pub(crate) fn start(volume: Arc<Volume>, stats: Arc<FlushStats>, policy: FlushPolicy) -> Self {
        let (stop, rx) = watch::channel(false);
        let space = tokio::spawn(super::space::run(
            volume.clone(),
            policy.space.clone(),
            rx.clone(),
        ));
        let task = tokio::spawn(run(volume, stats, policy, rx));
        Self {
            stop,
            task: Mutex::new(Some(task)),
            space: Mutex::new(Some(space)),
        }
    }

    /// Stops the tasks and waits for them (a sync or pass in progress completes first).
    pub(crate) async fn stop(&self) {
        let _ = self.stop.send(true);
        let tasks = [self.task.lock().take(), self.space.lock().take()];
        for task in tasks.into_iter().flatten() {
            if let Err(e) = task.await {
                tracing::error!(error = %chain(&e), "volume flusher task failed");
            }
        }
    }
}

/// Dirty and syncing bytes: the cache's per-state counters, O(1) and lock-free, so the
/// per-second tick of a thousand volumes costs no blocking-pool thread.
pub(crate) fn unflushed_bytes(volume: &Volume) -> (u64, u64) {
    let s = volume.cache_stats();
    let bs = u64::from(volume.config().block_size);
    (s.dirty * bs, s.syncing * bs)
}

async fn run(
    volume: Arc<Volume>,
    stats: Arc<FlushStats>,
    policy: FlushPolicy,
    mut stop: watch::Receiver<bool>,
) {
    let name = volume.config().name.clone();
    let mut backoff = Duration::ZERO;
    loop {
        let wait = TICK.max(backoff);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        if volume.fenced().is_some() {
            // Nothing can be published any more; keep reporting the lag.
            continue;
        }
        let (dirty, syncing) = unflushed_bytes(&volume);
        stats.observe_unflushed(dirty + syncing > 0);
        if dirty + syncing == 0 {
            continue;
        }
        if dirty < policy.threshold_bytes && stats.lag() < policy.interval {
            continue;
        }
        match flush_now(&volume, &stats).await {
            Ok((r, took)) => {
                backoff = Duration::ZERO;
                tracing::debug!(volume = %name, bytes = r.bytes, generation = r.generation, ms = took.as_millis() as u64, "background flush");
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_secs(1), policy.interval);
                tracing::warn!(volume = %name, error = %chain(&e), retry_in_s = backoff.as_secs(), "background flush failed");
            }
        }
    }
}
