//! The per-volume space keeper: compaction and GC passes on a timer (`[space]` in the config).
//!
//! One tokio task per open volume, started and stopped with its flusher (`Flusher`): every
//! `compact_every` it runs one `Volume::compact` pass (a bounded amount of copying: the rate
//! limit), every `gc_every` one `Volume::collect_garbage` pass with the `[gc]` rules. Both are
//! safe beside flushes and guest I/O (see their docs); a pass in progress completes before the
//! task stops. Nothing runs on a fenced, released or read-only volume (a snapshot attachment or
//! a read-only export: it may not publish). Failures are logged and retried at
//! the next period.

use std::sync::Arc;
use std::time::Duration;

use glidefs_volume::{CompactOptions, GcOptions, Volume};
use tokio::sync::watch;
use tokio::time::Instant;

use glidefs_model::log::chain;

/// What the keeper runs, and how often (`None`: never). The options also serve
/// `POST /v1/volumes/{name}/compact`.
#[derive(Debug, Clone, Default)]
pub struct SpacePolicy {
    pub compact: CompactOptions,
    pub compact_every: Option<Duration>,
    pub gc: GcOptions,
    pub gc_every: Option<Duration>,
}

pub(crate) async fn run(volume: Arc<Volume>, policy: SpacePolicy, mut stop: watch::Receiver<bool>) {
    let name = volume.config().name.clone();
    let now = Instant::now();
    let mut next_compact = policy.compact_every.map(|every| now + every);
    let mut next_gc = policy.gc_every.map(|every| now + every);
    loop {
        let Some(wake) = next_compact.into_iter().chain(next_gc).min() else {
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        // A snapshot attachment or a read-only export owns nothing to compact or collect.
        let cfg = volume.config();
        let idle = volume.fenced().is_some()
            || volume.is_released()
            || cfg.snapshot.is_some()
            || cfg.read_only;
        if let (Some(at), Some(every)) = (next_compact, policy.compact_every) {
            if Instant::now() >= at {
                next_compact = Some(Instant::now() + every);
                if !idle {
                    let started = Instant::now();
                    match volume.compact(policy.compact).await {
                        Ok(r) if r.generation.is_some() => tracing::info!(volume = %name,
                            packs = r.packs_rewritten, copied = r.bytes_written,
                            moved = r.blocks_moved, publishes = r.publishes,
                            stored = r.stored_bytes, live = r.live_bytes,
                            ms = started.elapsed().as_millis() as u64,
                            "compaction pass published"),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(volume = %name, error = %chain(&e),
                            "compaction pass failed; next one in {} s", every.as_secs()),
                    }
                }
            }
        }
        if let (Some(at), Some(every)) = (next_gc, policy.gc_every) {
            if Instant::now() >= at {
                next_gc = Some(Instant::now() + every);
                if !idle {
                    match volume.collect_garbage(policy.gc.clone()).await {
                        Ok(r) => tracing::debug!(volume = %name, packs = r.packs_deleted.len(),
                            bytes = r.bytes_deleted, "gc pass"),
                        Err(e) => tracing::warn!(volume = %name, error = %chain(&e),
                            "gc pass failed; next one in {} s", every.as_secs()),
                    }
                }
            }
        }
    }
}
