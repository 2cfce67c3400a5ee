//! The volume manager: the daemon's registry of volumes, each an open
//! [`glidefs_volume::Volume`], its block device (through a [`Exporter`]) and its background
//! [`flusher`]; persisted in `state.json` so a restarted daemon re-attaches them.
//!
//! Concurrency: create, remove, restore and shutdown are serialised by one async `admin` lock
//! (they change the registry and the state file together), except that a plain create (not
//! from a snapshot) holds it only to reserve its name and to register the volume, and runs
//! its store and device steps beside other creates ([`inflight`]), and that the background
//! re-open of a `recovering` volume never holds it through its open ([`reopen`]); list,
//! inspect, flush and metrics read the registry under a short sync lock and work on an
//! `Arc<Entry>` afterwards.
//!
//! Every device step (attach, reattach, stop, detach) is bounded by `DEVICE_STEP_TIMEOUT`:
//! a wedged device fails its volume's step instead of hanging a create, a restore or the
//! daemon's exit.
//!
//! Ownership: the daemon has an owner id (`ManagerOptions::owner`); opening a volume claims it
//! in the object store (a new volume's claim is its generation 1), a plain remove releases it,
//! and attaching a volume another daemon holds needs `takeover` (which fences that daemon).
//!
//! The operations, one file each: [`create`], [`remove`] (and [`purge`], the store side of a
//! purge and of undoing a create), [`restore`] (a start after a crash or a hand-off, with
//! [`pending`] and [`reopen`]), [`shutdown`] (and the hand-off), [`grow`] (resize),
//! [`snapshots`], [`flush`] (flush and compact on demand), [`inspect`] (inspect, list,
//! metrics). [`open`] opens a volume for create, restore and re-open. This file holds the
//! manager, its registry entries and the helpers they share.

mod blocking;
mod create;
pub(crate) mod error;
mod flush;
pub(crate) mod flusher;
mod grow;
mod inflight;
mod inspect;
mod open;
mod pending;
mod purge;
mod qos;
mod recovering;
mod remove;
pub(crate) mod reopen;
mod restore;
mod shutdown;
pub(crate) mod snapshots;
pub mod space;
pub(crate) mod spec;
pub(crate) mod state;
mod warm;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use glidefs_objstore::StoreConfig;
use glidefs_volume::{Volume, VolumeStats};
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use parking_lot::{Mutex, RwLock};

use crate::config::VolumeDefaults;
use blocking::{blocking, device_step};
pub use error::{Detail, ManagerError};
use flusher::{FlushStats, Flusher};
use glidefs_model::log::chain;
use glidefs_ublk::export::{Export, Exporter, IoStats};
pub use recovering::ReopenBackoff;
use spec::VolumeSpec;

/// What the manager needs from the configuration.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// Parent of the volumes' cache directories.
    pub volumes_dir: PathBuf,
    /// The persisted volume list.
    pub state_path: PathBuf,
    /// Defaults of create requests and flusher policy.
    pub defaults: VolumeDefaults,
    /// Upload concurrency and retries.
    pub store: StoreConfig,
    /// Who this daemon is in the object store's ownership records (`host/id`); `None`
    /// records no owner (every volume attachable anywhere, last writer fences the others).
    pub owner: Option<String>,
    /// Delays between the background attempts to open a `recovering` volume.
    pub reopen: ReopenBackoff,
    /// Compaction and GC passes of every open volume (default: none).
    pub space: space::SpacePolicy,
    /// The `GLIDEFS_KEY_*` variables the daemon started with (volumes created with
    /// `encryption_key_env` read their key there).
    pub encryption_keys: crate::environment::KeyVars,
}

/// An open volume with its device and flusher.
struct Open {
    volume: Arc<Volume>,
    device: Mutex<Option<Box<dyn Export>>>,
    flusher: Flusher,
    /// Set once a remove or a shutdown starts taking the volume away (`teardown`, the
    /// hand-off): later calls are refused ([`Entry::open`]), and what fails in calls already
    /// running is put down to it ([`Open::error`]) rather than answered `internal`.
    closing: AtomicBool,
}

impl Open {
    /// Kernel id of the device, when there is one.
    fn device_id(&self) -> Option<u32> {
        self.device.lock().as_ref().and_then(|d| d.id())
    }

    fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// The error of operation `op` of a call on this volume (`name`): `volume_closing` once
    /// a remove or a shutdown started taking it away (the engine's error, such as a closed
    /// handle, a released claim or objects a purge deleted, kept as the source), else
    /// [`ManagerError::from_volume`].
    fn error(&self, name: &str, op: &str, e: glidefs_volume::VolumeError) -> ManagerError {
        if !self.closing() {
            return ManagerError::from_volume(name, op, e);
        }
        ManagerError::Closing {
            name: name.to_string(),
            detail: Detail::caused(op, e),
        }
    }
}

impl std::fmt::Debug for Open {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Open")
            .field("volume", &self.volume.config().name)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
enum EntryState {
    Open(Arc<Open>),
    /// Not open yet: opening failed because the object store did not answer; a background
    /// task retries ([`reopen`]). `attempts` so far and the last `error`.
    Recovering {
        attempts: u32,
        error: String,
    },
    /// Not open; the reason.
    Failed(String),
    /// A remove stopped the device, then its final flush to the store (or the release of
    /// ownership after it) failed: the volume stays open with no device or flusher, its cache
    /// holding what the store lacks, and a plain remove tries again (the flush and the
    /// release; the release alone once its record may have landed, see `teardown`); `force` or
    /// `purge` close it and drop it; a shutdown or hand-off closes it (the next daemon opens
    /// it again with a device). Every other call answers as for `Failed`.
    Stopped {
        open: Arc<Open>,
        reason: String,
    },
    /// A remove stopped the device and closed the volume, then deleting the cache directory
    /// failed. `in_store`: the remove flushed and released first, so the store holds every
    /// write and a plain remove again just deletes the directory; otherwise (a forced remove)
    /// the cache may hold what the store lacks and only `force` or `purge` finish. Every other
    /// call answers as for `Failed`.
    Closed {
        in_store: bool,
        reason: String,
    },
}

/// One registered volume.
#[derive(Debug)]
struct Entry {
    spec: VolumeSpec,
    dir: PathBuf,
    flush: Arc<FlushStats>,
    state: Mutex<EntryState>,
    /// The background re-open of a `recovering` volume: stopped by a forced remove or a
    /// shutdown ([`recovering::ReopenGate`]).
    reopen: recovering::ReopenGate,
}

impl Entry {
    fn new(spec: VolumeSpec, dir: PathBuf, flush: Arc<FlushStats>, state: EntryState) -> Self {
        Self {
            spec,
            dir,
            flush,
            state: Mutex::new(state),
            reopen: recovering::ReopenGate::default(),
        }
    }

    fn open(&self) -> Result<Arc<Open>, ManagerError> {
        match &*self.state.lock() {
            EntryState::Open(o) if o.closing() => Err(ManagerError::Closing {
                name: self.spec.name.clone(),
                detail: Detail::new("it takes no more calls"),
            }),
            EntryState::Open(o) => Ok(o.clone()),
            EntryState::Recovering { attempts, error } => Err(ManagerError::StoreUnavailable {
                name: self.spec.name.clone(),
                detail: Detail::new(recovering::recovering_message(*attempts, error)),
            }),
            EntryState::Failed(reason)
            | EntryState::Stopped { reason, .. }
            | EntryState::Closed { reason, .. } => Err(ManagerError::Failed {
                name: self.spec.name.clone(),
                reason: reason.clone(),
            }),
        }
    }

    /// The open volume of an `Open` or `Stopped` entry (for a shutdown to close).
    fn open_or_stopped(&self) -> Option<Arc<Open>> {
        match &*self.state.lock() {
            EntryState::Open(o) | EntryState::Stopped { open: o, .. } => Some(o.clone()),
            EntryState::Recovering { .. } | EntryState::Failed(_) | EntryState::Closed { .. } => {
                None
            }
        }
    }
}

/// Figures of one volume for `/metrics`.
#[derive(Debug)]
pub struct VolumeMetrics {
    pub name: String,
    pub io: IoStats,
    /// `None` for a volume that is not open (recovering or failed).
    pub stats: Option<VolumeStats>,
    /// Being re-opened in the background (the store did not answer at start).
    pub recovering: bool,
    pub block_size: u64,
    pub fenced: bool,
    pub flush: Arc<FlushStats>,
}

/// The registry of volumes. Share as `Arc<VolumeManager>`.
pub struct VolumeManager {
    opts: ManagerOptions,
    store: Arc<dyn ObjectStore>,
    devices: Arc<dyn Exporter>,
    /// Serialises create / remove / restore / shutdown; `true` once shutting down. A plain
    /// create holds it only at its start and end ([`inflight`]).
    admin: tokio::sync::Mutex<bool>,
    /// Creates in flight without `admin` ([`inflight`]).
    creates: inflight::Creates,
    /// Set once shutting down (with the `admin` flag): the background re-open tasks end, and
    /// a remove does not start its flush.
    stop: tokio::sync::watch::Sender<bool>,
    volumes: RwLock<BTreeMap<String, Arc<Entry>>>,
    /// Store operations in flight or interrupted, persisted with the volumes ([`pending`]).
    pending: Mutex<BTreeMap<String, state::Record>>,
}

impl std::fmt::Debug for VolumeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("opts", &self.opts)
            .field("volumes", &self.volumes.read().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl VolumeManager {
    /// A manager with no volumes yet (see [`VolumeManager::restore`]).
    pub fn new(
        opts: ManagerOptions,
        store: Arc<dyn ObjectStore>,
        devices: Arc<dyn Exporter>,
    ) -> Self {
        Self {
            opts,
            store,
            devices,
            admin: tokio::sync::Mutex::new(false),
            creates: inflight::Creates::default(),
            stop: tokio::sync::watch::Sender::new(false),
            volumes: RwLock::new(BTreeMap::new()),
            pending: Mutex::new(BTreeMap::new()),
        }
    }

    /// The object store of volumes under `prefix`.
    fn store_for(&self, prefix: Option<&str>) -> Arc<dyn ObjectStore> {
        match prefix {
            Some(p) => Arc::new(PrefixStore::new(self.store.clone(), p)),
            None => self.store.clone(),
        }
    }

    /// Records `spec` for `entry`'s volume: the registry entry is replaced and `state.json`
    /// written; when the write fails the old entry is put back and nothing changed. The same
    /// spec again is a no-op. Under the admin lock (every `state.json` write is).
    async fn record_spec(&self, entry: &Arc<Entry>, spec: VolumeSpec) -> Result<(), ManagerError> {
        if spec == entry.spec {
            return Ok(());
        }
        let old = entry.spec.clone();
        let replaced = self.replace_spec(entry, spec);
        if let Err(e) = self.persist().await {
            self.replace_spec(&replaced, old);
            return Err(e);
        }
        Ok(())
    }

    /// Replaces `entry` in the registry by one with `spec` (same directory, flush figures and
    /// state); returns the new entry. Under the admin lock, or under the entry's re-open
    /// attempt (see `reopen`), which a remove waits for.
    fn replace_spec(&self, entry: &Arc<Entry>, spec: VolumeSpec) -> Arc<Entry> {
        let state = entry.state.lock().clone();
        let replaced = Arc::new(Entry::new(
            spec,
            entry.dir.clone(),
            entry.flush.clone(),
            state,
        ));
        self.volumes
            .write()
            .insert(replaced.spec.name.clone(), replaced.clone());
        replaced
    }

    fn entry(&self, name: &str) -> Result<Arc<Entry>, ManagerError> {
        self.volumes
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| ManagerError::NotFound {
                name: name.to_string(),
            })
    }

    /// The open volume `name`, for in-process users (tests, tools).
    pub fn volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.entry(name).ok()?.open().ok().map(|o| o.volume.clone())
    }

    fn specs(&self) -> Vec<VolumeSpec> {
        self.volumes
            .read()
            .values()
            .map(|e| e.spec.clone())
            .collect()
    }

    async fn persist(&self) -> Result<(), ManagerError> {
        let (path, specs) = (self.opts.state_path.clone(), self.specs());
        let pending = self.pending_ops();
        blocking(move || Ok(state::save(&path, &specs, &pending)?)).await
    }

    /// Runs `f` on this manager as a task of its own, so that it runs to its end even when
    /// the caller stops waiting: an HTTP client that hangs up drops its handler's future, and
    /// a create dropped between its attach and its registration would leave a device and an
    /// ownership claim nobody knows of (a remove, its device stopped but its entry kept).
    async fn detached<T, Fut>(
        self: &Arc<Self>,
        what: &'static str,
        f: impl FnOnce(Arc<Self>) -> Fut,
    ) -> Result<T, ManagerError>
    where
        T: Send + 'static,
        Fut: std::future::Future<Output = Result<T, ManagerError>> + Send + 'static,
    {
        tokio::spawn(f(Arc::clone(self)))
            .await
            .map_err(|e| ManagerError::internal(format!("the {what} task"), e))?
    }

    /// Stops the flusher and the device, optionally flushes the tail, closes the volume.
    /// On error the entry is marked failed (the device is gone either way), or `Stopped` when
    /// the flush or the release failed (a plain remove tries again). Idempotent up to the
    /// close: a `Stopped` entry's flusher and device are gone already.
    async fn teardown(
        &self,
        entry: &Entry,
        open: &Arc<Open>,
        skip_flush: bool,
    ) -> Result<(), ManagerError> {
        let name = &entry.spec.name;
        open.closing.store(true, Ordering::Release);
        open.flusher.stop().await;
        let device = open.device.lock().take();
        if let Some(dev) = device {
            if let Err(e) = device_step(name, "stop", move || Ok(dev.stop()?)).await {
                // The status `inspect` shows; the error itself goes to the caller.
                *entry.state.lock() = EntryState::Failed(format!("device stop failed: {e}"));
                return Err(e);
            }
        }
        // A retry after a release whose record may have landed: syncs are refused, and
        // `release` flushes first anyway.
        if !skip_flush && !open.volume.is_releasing() {
            if let Err(e) = flusher::flush_now(&open.volume, &entry.flush).await {
                *entry.state.lock() = EntryState::Stopped {
                    open: Arc::clone(open),
                    reason: format!(
                        "device stopped, but the final flush failed (the local cache keeps what the store lacks: remove again to retry the flush; force or purge drop it): {e}"
                    ),
                };
                return Err(ManagerError::from_volume(name, "final flush", e));
            }
        }
        // Everything is in the store: give up ownership so another daemon may attach the
        // volume without a takeover.
        if !skip_flush && open.volume.config().owner.is_some() {
            if let Err(e) = open.volume.release().await {
                *entry.state.lock() = EntryState::Stopped {
                    open: Arc::clone(open),
                    reason: format!(
                        "device stopped and data flushed, but releasing ownership failed (remove again, or with force): {e}"
                    ),
                };
                return Err(ManagerError::from_volume(name, "release", e));
            }
        }
        if let Err(e) = open.volume.close().await {
            tracing::warn!(volume = %name, error = %chain(&e), "close during remove");
        }
        Ok(())
    }
}

/// Deletes a cache directory (or whatever else sits at its path); a missing one is fine.
async fn remove_dir(dir: &std::path::Path) -> Result<(), ManagerError> {
    let is_dir = tokio::fs::symlink_metadata(dir)
        .await
        .is_ok_and(|m| m.is_dir());
    let removed = if is_dir {
        tokio::fs::remove_dir_all(dir).await
    } else {
        tokio::fs::remove_file(dir).await
    };
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ManagerError::internal(
            format!("cannot delete cache directory `{}`", dir.display()),
            e,
        )),
    }
}
