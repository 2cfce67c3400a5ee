//! A read-only export follows the writer's newer generations (issue 45 item 6).
//!
//! A read-only export (`VolumeConfig::read_only`, not a snapshot view: a view serves one fixed
//! generation) serves a volume another host owns and keeps writing. Its block map is a
//! manifest it loaded; the writer moves on (flushes, compactions), and GC deletes the packs
//! only older generations name. So the export looks at the store again and adopts the latest
//! generation:
//! - after a fetch found its pack gone (NotFound) and the export's map still names that
//!   location: the fetch reloads and reads where the newer map names the block (at most
//!   `fetch::MAX_RELOADS` times per fetch; then the error);
//! - at a cold read, when the last look is older than `VolumeConfig::follow_interval`;
//! - every `follow_interval` on a timer task (so a fully cached export follows too), and on
//!   [`crate::Volume::follow`].
//!
//! One look at a time (an async mutex); a look lists the manifests (one LIST) and fetches
//! the latest only when it is newer than the one served. A newer generation is adopted so:
//! 1. the blocks whose location differs between the two maps (written, moved by a compaction,
//!    unmapped, newly mapped) are found by one merge of the two maps (O(mapped blocks), on
//!    the blocking pool);
//! 2. under the manifest's write lock, the map is swapped and the remote bits of those blocks
//!    set (mapped now) or cleared (unmapped now): a fetch reads a block's state and location
//!    under the read lock, so it sees both old or both new;
//! 3. the cache drops its Clean copies of those blocks (`Cache::drop_clean`), which first
//!    refuses every fill whose token predates it: a fetch that started against the old map
//!    (token taken before its lookup, so before step 2) can never install old bytes as Clean
//!    under the new map; a fill that was already past its check is waited out and its block
//!    dropped with the others. Such a fill sets its block's remote bit as it stores its copy,
//!    so `drop_clean` clears the unmapped blocks' bits again, after that wait and before
//!    their copies go (else an unmapped block reads as remote with no location: EIO; test
//!    `cache_drop_clean_fill`, found by the simulation);
//! 4. durably (a checkpoint when remote bits were cleared, then the base file records the
//!    new generation, see `base`): a reopen that finds the base at the store's latest keeps
//!    the copies, which are the new generation's; a crash before the base is recorded finds
//!    it older than the store's latest, and the open drops every Clean copy (`Stale`).
//!
//! What a reader sees: no block is ever a mix (a block is served whole, from the cache or
//! from one fetch), and a block never reads older than the generation the export served when
//! the read started. A read of many blocks concurrent with an adoption may return some from
//! the older generation and some from the newer one: an export of a live volume is not a
//! point-in-time image (a snapshot view is). A store that went back (the latest generation
//! older than the one served: wiped, or another bucket) is not followed backwards; a newer
//! map of another block size is refused (logged); one of a larger volume is adopted, the
//! export keeps serving its own size.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_cache::Cache;
use glidefs_objstore::{Manifest, VolumeStore};
use parking_lot::{Mutex, RwLock};

use crate::base;
use crate::blocking::blocking;
use crate::error::{Result, VolumeError};

/// What follows the store for one read-only export.
pub(crate) struct Follower {
    cache: Arc<Cache>,
    store: Arc<VolumeStore>,
    manifest: Arc<RwLock<Manifest>>,
    dir: PathBuf,
    interval: Duration,
    /// Held across one look at the store, to the end of its adoption's blocking part (an
    /// owned guard moves into it: a look whose caller gave up, e.g. a read that timed out,
    /// still finishes its drop, checkpoint and base before the next look starts).
    looking: Arc<tokio::sync::Mutex<()>>,
    /// When the last look started.
    last: Mutex<Instant>,
    /// Generations adopted since open.
    pub(crate) adopted: AtomicU64,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("interval", &self.interval)
            .field("adopted", &self.adopted)
            .finish()
    }
}

/// Why a look was asked for.
#[derive(Debug, Clone, Copy)]
enum Why {
    /// The interval elapsed (a cold read, the timer): skipped if another look was since.
    Due,
    /// A fetch found its pack gone while the map named generation `.0`: skipped if the map
    /// changed since.
    NotFound(u64),
    /// `Volume::follow`: always.
    Asked,
}

impl Follower {
    pub(crate) fn new(
        cache: Arc<Cache>,
        store: Arc<VolumeStore>,
        manifest: Arc<RwLock<Manifest>>,
        dir: PathBuf,
        interval: Duration,
    ) -> Self {
        Self {
            cache,
            store,
            manifest,
            dir,
            interval,
            looking: Arc::new(tokio::sync::Mutex::new(())),
            last: Mutex::new(Instant::now()),
            adopted: AtomicU64::new(0),
        }
    }

    fn due(&self) -> bool {
        self.last.lock().elapsed() >= self.interval
    }

    /// Before a cold read: looks at the store if the last look is older than the interval.
    /// A failed look is logged, never the read's error (the read goes on against the map it
    /// has; a pack gone from under it makes the fetch look again).
    pub(crate) async fn tick(&self) {
        if self.due() {
            if let Err(e) = self.look(Why::Due).await {
                tracing::warn!(volume = %self.store.volume(), error = %e,
                    "a read-only export could not look for the writer's newer generations");
            }
        }
    }

    /// A fetch found its pack gone while the map named generation `seen`: looks (unless a
    /// look since changed the map). Returns whether the map changed.
    pub(crate) async fn after_not_found(&self, seen: u64) -> bool {
        match self.look(Why::NotFound(seen)).await {
            Ok(()) => {}
            Err(e) => tracing::warn!(volume = %self.store.volume(), error = %e,
                "a read-only export could not reload the manifest after a pack was gone"),
        }
        self.manifest.read().generation != seen
    }

    /// Looks now; the generation served afterwards.
    pub(crate) async fn follow(&self) -> Result<u64> {
        self.look(Why::Asked).await?;
        Ok(self.manifest.read().generation)
    }

    async fn look(&self, why: Why) -> Result<()> {
        let one = self.looking.clone().lock_owned().await;
        let served = self.manifest.read().generation;
        match why {
            Why::Due if !self.due() => return Ok(()),
            Why::NotFound(seen) if seen != served => return Ok(()),
            _ => {}
        }
        *self.last.lock() = Instant::now();
        let volume = self.store.volume().to_string();
        let latest = self
            .store
            .latest_generation()
            .await
            .map_err(|e| VolumeError::store("list manifests", &volume, e))?;
        if latest < served {
            tracing::warn!(volume, latest, served,
                "the store's latest manifest is older than the one this export serves: not followed");
        }
        if latest <= served {
            return Ok(());
        }
        let newer = self
            .store
            .fetch_manifest(latest)
            .await
            .map_err(|e| VolumeError::store("load manifest", &volume, e))?;
        if newer.block_size != self.cache.geometry().block_size() {
            return Err(VolumeError::GeometryMismatch {
                volume,
                stored: format!("block_size={}", newer.block_size),
                requested: format!("block_size={}", self.cache.geometry().block_size()),
            });
        }
        self.adopt(newer, one).await
    }

    /// Adopts `newer` (steps 1-4 of the module docs). `one` is the `looking` guard: it goes
    /// with the blocking part, so that part ends before another look can begin even if this
    /// future is dropped meanwhile (else it could clear a remote bit that the next
    /// adoption set, or write the base over the next one's).
    async fn adopt(&self, newer: Manifest, one: tokio::sync::OwnedMutexGuard<()>) -> Result<()> {
        let old = self.manifest.read().clone();
        let (from, to) = (old.generation, newer.generation);
        let (changed, newer) = blocking(move || Ok((changed_blocks(&old, &newer), newer))).await?;
        let num_blocks = self.cache.geometry().num_blocks();
        let mut unmapped = Vec::new();
        let old = {
            let mut m = self.manifest.write();
            for &b in changed.iter().filter(|&&b| b < num_blocks) {
                if newer.get(b).is_some() {
                    self.cache.set_remote([b]);
                } else {
                    self.cache.clear_remote([b]);
                    unmapped.push(b);
                }
            }
            std::mem::replace(&mut *m, newer)
        };
        self.adopted.fetch_add(1, Ordering::Relaxed);
        let (cache, dir) = (self.cache.clone(), self.dir.clone());
        let n = changed.len();
        let dropped = blocking(move || {
            let _one = one;
            drop(old);
            // The unmapped blocks' bits once more: a fill past its check sets them again.
            let dropped = cache.drop_clean(&changed, &unmapped)?;
            if !unmapped.is_empty() {
                cache.checkpoint()?;
            }
            // After `close` or `kill` the directory is no longer ours to write.
            if !cache.is_dead() {
                base::store(
                    &dir,
                    &base::Base {
                        generation: to,
                        publishing: None,
                    },
                )?;
            }
            Ok(dropped)
        })
        .await?;
        tracing::info!(volume = %self.store.volume(), from, to, changed = n, dropped,
            "read-only export follows the writer's newer generation");
        Ok(())
    }
}

/// Blocks whose location differs between `old` and `new` (mapped in one only, or at
/// different locations), ascending: one merge of the two maps.
fn changed_blocks(old: &Manifest, new: &Manifest) -> Vec<u64> {
    let mut out = Vec::new();
    let (mut a, mut b) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => return out,
            (Some(&(x, _)), None) => {
                out.push(x);
                a.next();
            }
            (None, Some(&(y, _))) => {
                out.push(y);
                b.next();
            }
            (Some(&(x, lx)), Some(&(y, ly))) => {
                if x < y {
                    out.push(x);
                    a.next();
                } else if y < x {
                    out.push(y);
                    b.next();
                } else {
                    if lx != ly {
                        out.push(x);
                    }
                    a.next();
                    b.next();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glidefs_objstore::{BlockLocation, PackId};

    fn loc(pack: &str, entry: u32) -> BlockLocation {
        BlockLocation {
            pack: PackId::new(pack).unwrap(),
            entry,
            offset: u64::from(entry) * 100,
            len: 100,
            raw_crc: 0,
        }
    }

    #[test]
    fn changed_blocks_are_those_whose_location_differs() {
        let mut old = Manifest::new("v", 4096, 4096 * 16);
        let mut new = Manifest::new("v", 4096, 4096 * 16);
        for b in 0..6 {
            old.insert(b, loc("p-1", b as u32));
        }
        // 0, 1 unchanged; 2 rewritten; 3 moved (same bytes, another pack); 4 unmapped;
        // 5 unchanged; 9 newly mapped.
        for b in [0, 1, 5] {
            new.insert(b, loc("p-1", b as u32));
        }
        new.insert(2, loc("p-2", 0));
        new.insert(3, loc("p-3", 3));
        new.insert(9, loc("p-2", 1));
        assert_eq!(changed_blocks(&old, &new), vec![2, 3, 4, 9]);
        assert_eq!(changed_blocks(&new, &old), vec![2, 3, 4, 9]);
        assert!(changed_blocks(&old, &old).is_empty());
        let empty = Manifest::new("v", 4096, 4096 * 16);
        assert_eq!(changed_blocks(&empty, &old), (0..6).collect::<Vec<_>>());
    }
}
