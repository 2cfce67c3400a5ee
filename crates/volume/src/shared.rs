//! The state every part of a volume works on, and the checks they share.
//!
//! [`Shared`] is what [`crate::Volume`] hands its parts: the config, the cache, the store and
//! its one publisher, the manifest, the fetcher, the flusher's lock, the counters, and the
//! latches (fence, release, close). A part is a view of it (`Io`, `Requests`, `Flusher`,
//! `Compactor`, `Snapshots`) or a function of it (`gc`, `grow`, `stats`); none imports
//! anything above this file, and `volume.rs` builds it at open and is the only public face.
//!
//! Latches, each set once and never cleared:
//! - `fence`: another writer published a newer manifest; writes, flushes and syncs fail with
//!   the first fence's error from then on (here and in the cache's zero-copy write path);
//! - `releasing`: set while `release` runs and for good once it published;
//! - `closed`: set by `close` under the sync lock; no publish through this handle afterwards.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use glidefs_cache::Cache;
use glidefs_objstore::{Manifest, ManifestOwner, VolumeStore};
use parking_lot::RwLock;

use crate::attempt::SyncState;
use crate::config::VolumeConfig;
use crate::counters::{CompactCounters, StoredFigures, UploadCounters};
use crate::error::{Fence, Result, VolumeError};
use crate::fetch::Fetcher;
use crate::pins::PinCache;
use crate::publisher::Publisher;
use crate::readahead::Readahead;
use crate::warm::WarmState;

/// The state a volume's parts share (see the module docs).
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) cfg: VolumeConfig,
    pub(crate) cache: Arc<Cache>,
    pub(crate) store: Arc<VolumeStore>,
    /// `None` for a handle that may not publish (a snapshot view, a read-only export): see
    /// `publisher`.
    pub(crate) publisher: Option<Publisher>,
    pub(crate) manifest: Arc<RwLock<Manifest>>,
    pub(crate) fetcher: Arc<Fetcher>,
    /// The flusher's lock: one `sync_to_store`, compaction publish, snapshot or release at a
    /// time.
    pub(crate) sync: tokio::sync::Mutex<SyncState>,
    pub(crate) uploads: UploadCounters,
    pub(crate) compaction: CompactCounters,
    pub(crate) stored: StoredFigures,
    pub(crate) pins: PinCache,
    /// Sequential-stream detection for readahead (`Volume::note_read`).
    pub(crate) readahead: Readahead,
    /// The warm-set recording and warm of this handle (`warm.rs`).
    pub(crate) warm: WarmState,
    /// The first fencing error, latched (see `fence`).
    pub(crate) fence: OnceLock<Fence>,
    /// Set while `release` runs and for good once it published: writes and syncs refused.
    pub(crate) releasing: AtomicBool,
    /// Set by `close` under the sync lock: no publish through this handle afterwards.
    pub(crate) closed: AtomicBool,
}

impl Shared {
    /// The state of a volume just opened: nothing uploaded, no latch set.
    pub(crate) fn new(
        cfg: VolumeConfig,
        cache: Arc<Cache>,
        store: Arc<VolumeStore>,
        publisher: Option<Publisher>,
        manifest: Arc<RwLock<Manifest>>,
        fetcher: Arc<Fetcher>,
    ) -> Self {
        Self {
            cfg,
            cache,
            store,
            publisher,
            manifest,
            fetcher,
            sync: tokio::sync::Mutex::new(SyncState::default()),
            uploads: UploadCounters::default(),
            compaction: CompactCounters::default(),
            stored: StoredFigures::default(),
            pins: PinCache::default(),
            readahead: Readahead::default(),
            warm: WarmState::default(),
            fence: OnceLock::new(),
            releasing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
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
        if self.is_closed() {
            return Err(VolumeError::Closed {
                volume: self.cfg.name.clone(),
            });
        }
        Ok(())
    }

    /// The owner record of the latest manifest loaded or published.
    pub(crate) fn owner(&self) -> Option<ManifestOwner> {
        self.manifest.read().owner.clone()
    }

    /// Whether `release` completed: the store records this owner as having released it.
    pub(crate) fn is_released(&self) -> bool {
        self.releasing.load(Ordering::Acquire)
            && self
                .manifest
                .read()
                .owner
                .as_ref()
                .is_some_and(|o| o.released)
    }

    /// Generation of the latest manifest loaded or published.
    pub(crate) fn manifest_generation(&self) -> u64 {
        self.manifest.read().generation
    }

    /// The volume's size in bytes now (it grows with `Volume::resize`; `cfg.size` is the
    /// size it was opened with). One atomic load.
    pub(crate) fn size(&self) -> u64 {
        self.cache.geometry().volume_size()
    }

    /// Makes a manifest built from the current one carry the volume's size (see `grow.rs`).
    pub(crate) fn carry_size(&self, next: &mut Manifest) {
        next.volume_size = next.volume_size.max(self.size());
    }
}
