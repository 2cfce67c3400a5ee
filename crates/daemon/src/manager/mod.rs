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
//! Create (numbered steps; a failure undoes the earlier ones):
//! 1. validate ([`spec::ValidCreate`]); a name already registered is `duplicate`; a volume
//!    that would leave the daemon short of file descriptors is `too_many_open_files`
//!    ([`crate::limits::check_headroom`]);
//! 2. load the manifest under `[prefix/]volumes/<name>/`: present without `attach_existing` is
//!    `volume_exists_in_store`; with it, omitted size / block size come from the manifest
//!    (held to a request's limits: at most 256T, a valid block size);
//!    absent: a `read_only` export (not of a snapshot) is `volume_not_in_store`; a leftover
//!    local cache directory of a fresh (not attach) create is deleted, its
//!    data belonged to no volume this daemon knows;
//! 3. a new volume or a clone is recorded as pending in `state.json` ([`pending`]); open the
//!    volume (its claim, or the clone's registration and generation 1), attach its device on
//!    the blocking pool, start its flusher;
//! 4. register it and rewrite `state.json` (the same write drops the pending record).
//!
//! Undo of a new volume's create deletes its objects in the store only when every generation
//! there is this daemon's (generation 1 its claim, the latest still its own): another daemon
//! creating the same name at the same time may have won the claim (see `undo_claim`).
//!
//! Remove (`purge=false`, `force=false`): flush to the store while the device still serves (a
//! failure leaves the volume untouched; the bulk of it before taking `admin`, so other creates
//! and removes do not wait behind the upload), refuse with `device_busy` while something has the
//! block device open (a mounted filesystem: [`Exporter::stop_if_unused`]; the volume is left
//! serving), stop the flusher and the device, flush the tail, close, delete the cache
//! directory, rewrite `state.json`. `force=true` skips both flushes (local data not in the
//! store is lost) and the in-use check; `purge=true` skips the flushes too (not the in-use
//! check) and, recorded as pending in `state.json` first, deletes every object under the
//! volume's store prefix (a crash half way is finished at the next start, [`pending`]).
//! If the tail flush (or the release after it) fails, the volume stays listed as `failed` with its cache directory kept
//! and the volume still open, without device or flusher (`EntryState::Stopped`): a plain
//! remove again retries the flush and finishes, `force` or `purge` drop it, and a shutdown
//! closes it (it stays in `state.json`, so the next start serves it again). If only deleting
//! the cache directory fails, the volume is closed already: `EntryState::Closed`, and a remove
//! again (a plain one when the first flushed) deletes the directory. A
//! `recovering` volume is not open: a plain remove answers `store_unavailable`, `force` or
//! `purge` cancel its re-open attempt (without waiting for the store), then remove it. Once a remove (or a shutdown) starts
//! stopping a volume, other calls on it answer `volume_closing` (409), and so do calls it
//! overtook, whatever the engine said (closed, released, objects purged); once it is gone,
//! `not_found`.
//!
//! Shutdown: end the re-open tasks, stop every flusher and device, `close()` every volume
//! (local durability); the state file is kept, so the next start re-attaches them all.
//!
//! Every device step (attach, reattach, stop, detach) is bounded by `DEVICE_STEP_TIMEOUT`:
//! a wedged device fails its volume's step instead of hanging a create, a restore or the
//! daemon's exit.
//!
//! Ownership: the daemon has an owner id (`ManagerOptions::owner`); opening a volume claims it
//! in the object store (a new volume's claim is its generation 1), a plain remove releases it,
//! and attaching a volume another daemon holds needs `takeover` (which fences that daemon).
//!
//! Restart after a crash: `state.json` records each volume's device id. [`VolumeManager::restore`]
//! reopens the volumes, `RESTORE_PARALLEL` at a time (each its own cache and device, so
//! their order does not matter), each one's cache replaying its WAL, and asks the exporter to
//! [`reattach`](Exporter::reattach) that device: a device the dead daemon left QUIESCED is
//! taken over with I/O held meanwhile (the filesystem above stays mounted); a missing one is
//! created again, with the same id when it is free. A volume whose open fails because the
//! object store does not answer is `recovering` and re-opened in the background with backoff
//! until the store answers (see [`reopen`]); its QUIESCED device keeps holding I/O meanwhile.

pub(crate) mod error;
pub(crate) mod flusher;
mod grow;
mod inflight;
mod pending;
pub(crate) mod reopen;
pub(crate) mod snapshots;
pub mod space;
pub(crate) mod spec;
pub(crate) mod state;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use glidefs_objstore::{StoreConfig, VolumeStore};
use glidefs_volume::{Volume, VolumeConfig, VolumeError, VolumeStats};
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use parking_lot::{Mutex, RwLock};

use crate::config::VolumeDefaults;
pub use error::{Detail, ManagerError};
use flusher::{FlushPolicy, FlushStats, Flusher};
use glidefs_model::api::{
    CompactResult, CreateVolume, DeviceInfo, Durability, FlushReport, RemoveReport, SpaceInfo,
    VolumeInfo, VolumeState,
};
use glidefs_model::log::chain;
use glidefs_ublk::export::{Export, ExportError, ExportSpec, Exporter, IoStats};
pub use reopen::ReopenBackoff;
use spec::{SnapshotRef, ValidCreate, VolumeSpec};

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
    /// shutdown ([`reopen::ReopenGate`]).
    reopen: reopen::ReopenGate,
}

impl Entry {
    fn new(spec: VolumeSpec, dir: PathBuf, flush: Arc<FlushStats>, state: EntryState) -> Self {
        Self {
            spec,
            dir,
            flush,
            state: Mutex::new(state),
            reopen: reopen::ReopenGate::default(),
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
                detail: Detail::new(reopen::recovering_message(*attempts, error)),
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
    pending: Mutex<BTreeMap<String, pending::Record>>,
}

impl std::fmt::Debug for VolumeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("opts", &self.opts)
            .field("volumes", &self.volumes.read().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Runs blocking work on the blocking pool; a panic there becomes `internal`.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ManagerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ManagerError::internal("blocking task failed", e))?
}

/// How many volumes [`VolumeManager::restore`] opens at a time. Each open waits mostly on the
/// store (manifest, claim) and on its device's control commands (user recovery of a QUIESCED
/// device, or a new device), so a restart after a crash with many volumes takes about
/// 1/RESTORE_PARALLEL of the serial time; the in-flight opens cost a few threads of the
/// blocking pool.
const RESTORE_PARALLEL: usize = 16;

/// Longest a device step (attach, reattach, stop, detach: kernel control commands) may take
/// before the manager gives up on it: a wedged device must not hang a create, a restore or the
/// daemon's exit. The step's thread is left to finish (or to die with the process).
const DEVICE_STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// [`blocking`] for a device step, bounded by [`DEVICE_STEP_TIMEOUT`].
async fn device_step<T: Send + 'static>(
    volume: &str,
    step: &str,
    f: impl FnOnce() -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ManagerError> {
    match tokio::time::timeout(DEVICE_STEP_TIMEOUT, blocking(f)).await {
        Ok(r) => r,
        Err(_) => {
            tracing::error!(volume, step, timeout = ?DEVICE_STEP_TIMEOUT, "device step timed out; giving up on it");
            Err(ManagerError::Device(ExportError::Failed {
                volume: volume.to_string(),
                source: format!("{step} did not finish within {DEVICE_STEP_TIMEOUT:?}").into(),
            }))
        }
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

    /// Re-opens every volume listed in `state.json` (as `attach_existing`). A volume whose
    /// open fails because the object store does not answer is `recovering`: a background task
    /// opens it once the store answers ([`reopen`]). A volume that fails to open for another
    /// reason stays listed as `failed` with the reason. Returns how many opened now.
    pub async fn restore(self: &Arc<Self>) -> Result<usize, ManagerError> {
        let _admin = self.admin.lock().await;
        let path = self.opts.state_path.clone();
        let (specs, pending) = blocking(move || Ok(state::load_all(&path)?)).await?;
        let started = std::time::Instant::now();
        // What a crash interrupted: creates and clones undone, purges finished; a volume
        // whose purge could not finish is `failed` (not opened: it is half deleted).
        let (specs, mut changed) = self.resume_pending(specs, pending).await;
        let count = specs.len();
        // Volumes open side by side (each waits mostly on the store and on its device's
        // control commands), RESTORE_PARALLEL at a time, in state.json's order.
        let results: Vec<_> = futures::stream::iter(specs.into_iter().map(|spec| async move {
            let dir = self.opts.volumes_dir.join(&spec.name);
            let flush = Arc::new(FlushStats::default());
            let opened = self.open_volume(&spec, &dir, &flush, false, None).await;
            (spec, dir, flush, opened)
        }))
        .buffered(RESTORE_PARALLEL)
        .collect()
        .await;
        let mut opened = 0;
        let mut recovering = Vec::new();
        for (mut spec, dir, flush, result) in results {
            let state = match result {
                Ok(open) => {
                    opened += 1;
                    let id = open.device_id();
                    tracing::info!(volume = %spec.name, device = ?id, "volume re-attached");
                    if id.is_some() && id != spec.device_id {
                        spec.device_id = id;
                        changed = true;
                    }
                    EntryState::Open(Arc::new(open))
                }
                Err(e) if reopen::worth_retrying(&e) => {
                    tracing::warn!(volume = %spec.name, error = %chain(&e), "volume recovering: the object store does not answer; retrying in the background");
                    EntryState::Recovering {
                        attempts: 1,
                        error: e.to_string(),
                    }
                }
                Err(e) => {
                    tracing::error!(volume = %spec.name, error = %chain(&e), "volume could not be re-attached");
                    EntryState::Failed(format!("re-attach at start failed: {e}"))
                }
            };
            let is_recovering = matches!(state, EntryState::Recovering { .. });
            let entry = Arc::new(Entry::new(spec.clone(), dir, flush, state));
            if is_recovering {
                recovering.push(entry.clone());
            }
            self.volumes.write().insert(spec.name, entry);
        }
        if changed {
            self.persist().await?;
        }
        tracing::info!(
            volumes = count,
            opened,
            recovering = recovering.len(),
            parallel = RESTORE_PARALLEL,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "state.json restored"
        );
        for entry in recovering {
            self.spawn_reopen(entry);
        }
        Ok(opened)
    }

    /// Opens the volume, attaches its device and starts its flusher.
    async fn open_volume(
        &self,
        spec: &VolumeSpec,
        dir: &std::path::Path,
        flush: &Arc<FlushStats>,
        takeover: bool,
        clone_from: Option<&SnapshotRef>,
    ) -> Result<Open, ManagerError> {
        let volume = self.open_engine(spec, dir, takeover, clone_from).await?;
        self.start_volume(spec, volume, flush).await
    }

    /// The engine part of [`Self::open_volume`]: the store and cache steps (manifest, WAL
    /// replay, claim), nothing attached yet, so dropping it mid-way leaves no device behind.
    async fn open_engine(
        &self,
        spec: &VolumeSpec,
        dir: &std::path::Path,
        takeover: bool,
        clone_from: Option<&SnapshotRef>,
    ) -> Result<Arc<Volume>, ManagerError> {
        let d = &self.opts.defaults;
        // A snapshot attachment opens the origin's objects, read-only, at the snapshot.
        let store_name = spec.snapshot.as_ref().map_or(&spec.name, |s| &s.volume);
        let mut cfg = VolumeConfig::new(store_name, dir, spec.size);
        cfg.snapshot = spec.snapshot.as_ref().map(|s| s.snapshot.clone());
        // A read-only export claims nothing (claiming would fence the writer) and may not
        // publish anything (a compaction or GC through it would fence the owner too).
        cfg.read_only = spec.read_only;
        // A snapshot attachment claims nothing either; the engine registers it under its
        // snapshot as this owner id (the holder a delete on another host names).
        cfg.owner = if spec.read_only && spec.snapshot.is_none() {
            None
        } else {
            self.opts.owner.clone()
        };
        cfg.takeover = takeover;
        cfg.block_size = spec.block_size;
        cfg.durability = match spec.durability {
            Durability::Local => glidefs_volume::Durability::Local,
            Durability::Store => glidefs_volume::Durability::Store,
        };
        cfg.disk_budget = if d.disk_budget.0 == 0 {
            u64::MAX
        } else {
            d.disk_budget.0
        };
        cfg.store = self.opts.store.clone();
        cfg.encryption_key = spec::load_key_async(
            &spec.name,
            spec.encryption_key.as_ref(),
            &self.opts.encryption_keys,
        )
        .await?;
        let store = self.store_for(spec.prefix.as_deref());
        let volume = match clone_from {
            Some(f) => Volume::create_clone(cfg, store, &f.volume, &f.snapshot)
                .await
                .map_err(|e| ManagerError::from_volume(&spec.name, "create clone", e))?,
            None => match Volume::open(cfg.clone(), store.clone()).await {
                Err(VolumeError::OwnedElsewhere { owner, .. })
                    if !cfg.takeover && same_data_dir(&owner, cfg.owner.as_deref()) =>
                {
                    // The record names this data directory's id under another host name:
                    // the host was renamed. Its cache is this one, so nothing of the
                    // previous holder can be lost: claim it back under the new name.
                    tracing::warn!(volume = %spec.name, previous = %owner, owner = ?cfg.owner, "the volume's owner record names this data directory under another host name (the host was renamed): claiming it under the new name");
                    cfg.takeover = true;
                    Volume::open(cfg, store).await
                }
                other => other,
            }
            .map_err(|e| ManagerError::from_volume(&spec.name, "open", e))?,
        };
        Ok(volume)
    }

    /// The device part of [`Self::open_volume`]: attaches `volume`'s device (bounded by
    /// `DEVICE_STEP_TIMEOUT`; closes the volume when it fails) and starts its flusher.
    async fn start_volume(
        &self,
        spec: &VolumeSpec,
        volume: Arc<Volume>,
        flush: &Arc<FlushStats>,
    ) -> Result<Open, ManagerError> {
        let d = &self.opts.defaults;
        let dev_spec = ExportSpec {
            queues: spec.queues,
            queue_depth: spec.queue_depth,
            read_only: spec.read_only,
            max_io_bytes: u32::try_from(d.max_io_bytes.0).unwrap_or(1 << 20),
        };
        let (exporter, name, v) = (self.devices.clone(), spec.name.clone(), volume.clone());
        let previous = spec.device_id;
        let attached = device_step(&spec.name, "attach", move || {
            Ok(match previous {
                Some(id) => exporter.reattach(&name, v, &dev_spec, id)?,
                None => exporter.attach(&name, v, &dev_spec)?,
            })
        })
        .await;
        let device = match attached {
            Ok(dev) => dev,
            Err(e) => {
                if let Err(ce) = volume.close().await {
                    tracing::warn!(volume = %spec.name, error = %chain(&ce), "close after failed attach");
                }
                return Err(e);
            }
        };
        let policy = FlushPolicy {
            threshold_bytes: d.flush_threshold_bytes.0,
            interval: Duration::from_secs(d.flush_interval_secs),
            space: self.opts.space.clone(),
        };
        let flusher = Flusher::start(volume.clone(), flush.clone(), policy);
        Ok(Open {
            volume,
            device: Mutex::new(Some(device)),
            flusher,
            closing: AtomicBool::new(false),
        })
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

    /// Creates (or attaches) a volume; see the module docs for the steps. Runs to its end
    /// even when the caller stops waiting.
    pub async fn create(self: &Arc<Self>, req: &CreateVolume) -> Result<VolumeInfo, ManagerError> {
        let req = req.clone();
        self.detached("create", move |m| async move { m.create_now(&req).await })
            .await
    }

    async fn create_now(&self, req: &CreateVolume) -> Result<VolumeInfo, ManagerError> {
        let valid = ValidCreate::from_request(req, &self.opts.defaults)?;
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let name = valid.name.clone();
        // A live pending record: a create, clone or purge of the name still runs (or undoes
        // itself after failing), with no registration and maybe no reservation.
        if self.volumes.read().contains_key(&name)
            || self.creates.reserved(&name)
            || self.pending_live(&name)
        {
            return Err(ManagerError::Duplicate { name });
        }
        // Creates in flight have not opened all their descriptors yet: count them as taken.
        let need = crate::limits::volume_need(valid.queues);
        crate::limits::check_headroom(valid.queues, self.creates.pending_fds()).map_err(|e| {
            ManagerError::TooManyOpenFiles {
                name: name.clone(),
                detail: Detail::new(e.to_string()),
            }
        })?;
        // A plain create runs beside others until it registers ([`inflight`]); one from a
        // snapshot keeps `admin` throughout.
        let (mut admin, _in_flight) = if valid.from.is_none() {
            let in_flight = self.creates.reserve(&name, need).await;
            drop(admin);
            (None, Some(in_flight))
        } else {
            (Some(admin), None)
        };
        let key = spec::load_key_async(
            &name,
            valid.encryption_key.as_ref(),
            &self.opts.encryption_keys,
        )
        .await?;
        let store = self.store_for(valid.prefix.as_deref());
        let vstore = VolumeStore::new(store, &name, self.opts.store.clone())
            .map_err(|_| ManagerError::InvalidName { name: name.clone() })?
            .with_key(key);
        // `from`: the snapshot's geometry; a read-only attachment has no objects of its own.
        let source = match &valid.from {
            Some(f) => Some(self.snapshot_record(&vstore, f).await?),
            None => None,
        };
        let attachment = valid.from.as_ref().filter(|_| valid.read_only);
        let manifest = if attachment.is_some() {
            Ok(None)
        } else {
            vstore.load_manifest().await
        };
        let manifest = manifest.map_err(|e| match e.kind() {
            _ if e.key_mismatch().is_some() => ManagerError::KeyMismatch {
                name: name.clone(),
                detail: Detail::caused("load manifest", e),
            },
            glidefs_objstore::ErrorKind::Transient => ManagerError::StoreUnavailable {
                name: name.clone(),
                detail: Detail::caused("load manifest", e),
            },
            _ => ManagerError::internal(format!("volume `{name}`: load manifest"), e),
        })?;
        let (size, block_size) = match (&manifest, valid.attach_existing) {
            (None, _) if source.is_some() => {
                let r = source
                    .as_ref()
                    .map_or((0, 0), |r| (r.volume_size, r.block_size));
                let asked = (valid.size.unwrap_or(r.0), valid.block_size.unwrap_or(r.1));
                if asked != r {
                    return Err(ManagerError::GeometryMismatch {
                        name,
                        detail: Detail::new(format!(
                            "snapshot {} has size {} with block size {}; the request asks for size {} with block size {} (resize the clone after creating it)",
                            valid.from.as_ref().map(ToString::to_string).unwrap_or_default(),
                            r.0, r.1, asked.0, asked.1
                        )),
                    });
                }
                r
            }
            (Some(m), false) => {
                return Err(ManagerError::ExistsInStore {
                    name,
                    generation: m.generation,
                })
            }
            (Some(m), true) => {
                spec::check_stored_geometry(&name, m.volume_size, m.block_size)?;
                // What the request names must be what the store holds (checked here, before
                // the size arithmetic below, so a mismatch is reported as one).
                let size = valid.size.unwrap_or(m.volume_size);
                let bs = valid.block_size.unwrap_or(m.block_size);
                if (size, bs) != (m.volume_size, m.block_size) {
                    return Err(ManagerError::GeometryMismatch {
                        name,
                        detail: Detail::new(format!(
                            "the store holds size {} with block size {}; the request asks for size {size} with block size {bs}",
                            m.volume_size, m.block_size
                        )),
                    });
                }
                (size, bs)
            }
            // Nothing to attach, and no size to create it with: say so (a caller that
            // attaches what it believes exists, e.g. the CSI node plugin, learns it is gone).
            (None, _) if valid.read_only || (valid.attach_existing && valid.size.is_none()) => {
                return Err(ManagerError::NotInStore {
                    name,
                    prefix: valid
                        .prefix
                        .as_deref()
                        .map(|p| format!(" under prefix `{p}`"))
                        .unwrap_or_default(),
                })
            }
            (None, _) => {
                let size = valid.size.ok_or_else(|| ManagerError::InvalidSize {
                    value: "(missing)".to_string(),
                    reason: format!(
                        "volume `{name}` has no manifest in the store, so size is required"
                    ),
                })?;
                let bs = valid
                    .block_size
                    .unwrap_or(u32::try_from(self.opts.defaults.block_size.0).unwrap_or(128 << 10));
                (size, bs)
            }
        };
        if !size.is_multiple_of(u64::from(block_size)) {
            return Err(ManagerError::InvalidSize {
                value: size.to_string(),
                reason: format!("must be a multiple of the block size {block_size}"),
            });
        }
        let dir = self.opts.volumes_dir.join(&name);
        let existed = tokio::fs::try_exists(&dir).await.unwrap_or(false);
        if existed && manifest.is_none() && !valid.attach_existing {
            tracing::warn!(volume = %name, dir = %dir.display(), "deleting a leftover cache directory of an unknown volume");
            remove_dir(&dir).await?;
        }
        let spec = VolumeSpec {
            name: name.clone(),
            size,
            block_size,
            queues: valid.queues,
            queue_depth: valid.queue_depth,
            prefix: valid.prefix.clone(),
            read_only: valid.read_only,
            device_id: None,
            snapshot: attachment.cloned(),
            encryption_key: valid.encryption_key.clone(),
            durability: valid.durability,
        };
        let flush = Arc::new(FlushStats::default());
        let mut spec = spec;
        let clone_from = valid.from.as_ref().filter(|_| attachment.is_none());
        // A new volume or a clone: recorded before its first store write (the claim, the
        // clone's registration), so a crash from here on is undone at the next start.
        let new_in_store = manifest.is_none() && attachment.is_none();
        if new_in_store {
            let op = match clone_from {
                Some(from) => state::Pending::Clone {
                    spec: spec.clone(),
                    from: from.clone(),
                },
                None => state::Pending::Create { spec: spec.clone() },
            };
            let held = match admin.as_ref() {
                Some(_) => None,
                None => Some(self.admin.lock().await),
            };
            self.pending
                .lock()
                .insert(name.clone(), pending::Record::live(op));
            if let Err(e) = self.persist().await {
                self.pending.lock().remove(&name);
                drop(held);
                if !existed || !valid.attach_existing {
                    let _ = remove_dir(&dir).await;
                }
                return Err(e);
            }
            drop(held);
        }
        let opened = self
            .open_volume(&spec, &dir, &flush, valid.takeover, clone_from)
            .await;
        let open = match opened {
            Ok(o) => {
                spec.device_id = o.device_id();
                Arc::new(o)
            }
            Err(e) => {
                if !existed || (manifest.is_none() && !valid.attach_existing) {
                    let _ = remove_dir(&dir).await;
                }
                if new_in_store {
                    drop(admin.take());
                    self.undo_failed_create(&name).await;
                }
                return Err(e);
            }
        };
        let entry = Arc::new(Entry::new(
            spec,
            dir.clone(),
            flush,
            EntryState::Open(open.clone()),
        ));
        // A shutdown or hand-off that began while this create ran waits for it (it holds
        // its [`inflight::InFlight`] until it returns) and lists the registry afterwards: the
        // volume is registered and persisted like any other, and closed (or handed over) with
        // the rest.
        let admin = match admin.take() {
            Some(held) => held,
            None => self.admin.lock().await,
        };
        self.volumes.write().insert(name.clone(), entry.clone());
        // The same write registers the volume and drops its pending record.
        let record = self.pending.lock().remove(&name);
        if let Err(e) = self.persist().await {
            self.volumes.write().remove(&name);
            if let Some(r) = record {
                self.pending.lock().insert(name.clone(), r);
            }
            let _ = self.teardown(&entry, &open, true).await;
            drop(admin);
            if new_in_store {
                self.undo_failed_create(&name).await;
            }
            return Err(e);
        }
        drop(admin);
        tracing::info!(volume = %name, size, block_size, attached = manifest.is_some(), "volume created");
        Ok(self.info(&entry).await)
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

    /// Refuses a remove while something has the volume's block device open (a mounted
    /// filesystem): [`Exporter::stop_if_unused`], bounded like every device step. The device
    /// keeps serving after a refusal; after `Ok` it may be stopped already.
    async fn stop_if_unused(&self, name: &str, open: &Open) -> Result<(), ManagerError> {
        let Some(id) = open.device_id() else {
            return Ok(());
        };
        let devices = self.devices.clone();
        let volume = name.to_string();
        device_step(name, "stop if unused", move || {
            Ok(devices.stop_if_unused(&volume, id)?)
        })
        .await
    }

    /// Removes a volume; see the module docs. Runs to its end even when the caller stops
    /// waiting.
    pub async fn remove(
        self: &Arc<Self>,
        name: &str,
        purge: bool,
        force: bool,
    ) -> Result<RemoveReport, ManagerError> {
        let name = name.to_string();
        self.detached("remove", move |m| async move {
            m.remove_now(&name, purge, force).await
        })
        .await
    }

    async fn remove_now(
        &self,
        name: &str,
        purge: bool,
        force: bool,
    ) -> Result<RemoveReport, ManagerError> {
        let skip_flush = purge || force;
        let shutting_down = || *self.stop.borrow();
        if shutting_down() {
            return Err(ManagerError::ShuttingDown);
        }
        if !skip_flush {
            // The bulk of the upload, before `admin` (as a `flush` call beside the remove
            // would): other creates and removes need not wait behind it. The flush under
            // `admin` below then uploads only what was written meanwhile.
            let early = self
                .entry(name)
                .ok()
                .and_then(|e| Some((e.open().ok()?, e)));
            if let Some((open, entry)) = early {
                flusher::flush_now(&open.volume, &entry.flush)
                    .await
                    .map_err(|e| match shutting_down() {
                        // The shutdown closed the volume under this flush.
                        true => ManagerError::ShuttingDown,
                        false => ManagerError::from_volume(name, "flush before remove", e),
                    })?;
            }
        }
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let entry = match self.entry(name) {
            Err(ManagerError::NotFound { .. }) if purge && self.interrupted(name) => {
                // A create or clone that a crash (or a store outage) interrupted.
                let purged_objects = self.purge_interrupted(name).await?;
                drop(admin);
                return Ok(RemoveReport {
                    name: name.to_string(),
                    purged_objects,
                });
            }
            other => other?,
        };
        if purge {
            self.check_purge(&entry.spec).await?;
        }
        if skip_flush && matches!(*entry.state.lock(), EntryState::Recovering { .. }) {
            // Cancel the re-open attempt (one waiting on the store is dropped) and wait for
            // it to end; the state read below is then what it left (`Open` if it got there).
            entry.reopen.stop().await;
        }
        let state = entry.state.lock().clone();
        match state {
            EntryState::Open(open) => {
                if !skip_flush {
                    flusher::flush_now(&open.volume, &entry.flush)
                        .await
                        .map_err(|e| ManagerError::from_volume(name, "flush before remove", e))?;
                }
                if !force {
                    self.stop_if_unused(name, &open).await?;
                }
                self.teardown(&entry, &open, skip_flush).await?;
            }
            // Flush (or release) again; with force or purge, close it unflushed.
            EntryState::Stopped { open, .. } => {
                self.teardown(&entry, &open, skip_flush).await?;
            }
            EntryState::Failed(reason)
            | EntryState::Closed {
                in_store: false,
                reason,
            } if !skip_flush => {
                return Err(ManagerError::Failed {
                    name: name.to_string(),
                    reason: format!(
                        "{reason}; its local cache may hold data not in the store: remove with force=true or purge=true"
                    ),
                });
            }
            EntryState::Recovering { attempts, error } if !skip_flush => {
                return Err(ManagerError::StoreUnavailable {
                    name: name.to_string(),
                    detail: Detail::new(format!(
                        "{}; its local cache may hold data not in the store: wait for it to open, or remove with force=true or purge=true",
                        reopen::recovering_message(attempts, &error)
                    )),
                });
            }
            // The re-open task of a recovering volume sees the entry gone and ends.
            // A closed volume whose directory is left: only that is to do.
            EntryState::Failed(_) | EntryState::Recovering { .. } | EntryState::Closed { .. } => {}
        }
        if purge {
            // Before anything is deleted: a crash from here on finishes the purge at the
            // next start instead of serving a half-deleted volume.
            let op = state::Pending::Purge {
                spec: entry.spec.clone(),
            };
            self.pending
                .lock()
                .insert(name.to_string(), pending::Record::live(op));
            self.persist().await?;
        }
        if let Err(e) = remove_dir(&entry.dir).await {
            // The volume is closed: say so instead of looking `running` (later calls would
            // fail with `closed`), and what a remove again does.
            let (in_store, advice) = match skip_flush {
                false => (true, "every write is in the store: remove again"),
                true => (false, "remove with force=true or purge=true again"),
            };
            *entry.state.lock() = EntryState::Closed {
                in_store,
                reason: format!("device stopped and volume closed, but {e}; {advice}"),
            };
            return Err(e);
        }
        let purged_objects = if purge {
            match self.purge(&entry.spec).await {
                Ok(n) => n,
                Err(e) => {
                    // The device and the cache are gone already: say so instead of looking
                    // `running`; a later remove with purge finishes the job.
                    *entry.state.lock() = EntryState::Failed(format!(
                        "device and local cache removed, but purging the store failed ({e}): remove with purge=true again"
                    ));
                    self.pending
                        .lock()
                        .entry(name.to_string())
                        .and_modify(|r| r.live = false);
                    return Err(e);
                }
            }
        } else {
            0
        };
        self.volumes.write().remove(name);
        self.pending.lock().remove(name);
        self.persist().await?;
        drop(admin);
        tracing::info!(volume = %name, purge, force, purged_objects, "volume removed");
        Ok(RemoveReport {
            name: name.to_string(),
            purged_objects,
        })
    }

    /// Undoes a failed create of a new volume: opening it may have published this daemon's
    /// ownership claim (generation 1), which would make a retry `volume_exists_in_store`.
    ///
    /// Only what this daemon wrote is undone. The create found no manifest, but another daemon
    /// creating the same name at the same time may have claimed it first (then this open
    /// failed with `owned_elsewhere` or `fenced` and wrote nothing), or published since. So
    /// the volume's objects are deleted only when its generation 1 is this daemon's claim
    /// (owner = ours, claimed at 1) and its latest generation is still ours; otherwise (or
    /// when that cannot be read) the store is left alone.
    async fn undo_claim(&self, spec: &VolumeSpec) -> Result<u64, ManagerError> {
        if self.only_ours(spec).await? {
            return self.purge(spec).await;
        }
        tracing::info!(volume = %spec.name, "undone create: the volume in the store is not (only) this daemon's; left alone");
        Ok(0)
    }

    /// Whether every generation of `spec`'s volume in the store was published by this daemon:
    /// generation 1 is its claim and the latest is still its own (see [`Self::undo_claim`]).
    async fn only_ours(&self, spec: &VolumeSpec) -> Result<bool, ManagerError> {
        let Some(me) = self.opts.owner.as_deref() else {
            // Without an owner id nothing was claimed, and nothing tells whose objects are.
            return Ok(false);
        };
        let store = self.store_for(spec.prefix.as_deref());
        let fail = |e: glidefs_objstore::ObjStoreError| ManagerError::StoreUnavailable {
            name: spec.name.clone(),
            detail: Detail::caused("check the claim of a failed create", e),
        };
        // Without its key an encrypted volume's manifest does not load: nothing is undone.
        let key = spec::load_key_async(
            &spec.name,
            spec.encryption_key.as_ref(),
            &self.opts.encryption_keys,
        )
        .await
        .unwrap_or(None);
        let vstore = VolumeStore::new(store, &spec.name, self.opts.store.clone())
            .map_err(fail)?
            .with_key(key);
        let claimed_by_me_at = |m: &glidefs_objstore::Manifest| {
            m.owner
                .as_ref()
                .filter(|o| o.id == me && !o.released)
                .map(|o| o.claimed_at)
        };
        let Some(latest) = vstore.load_manifest().await.map_err(fail)? else {
            return Ok(false);
        };
        if claimed_by_me_at(&latest).is_none() {
            return Ok(false);
        }
        let first = if latest.generation == 1 {
            latest
        } else {
            match vstore.fetch_manifest(1).await {
                Ok(m) => m,
                Err(e) if e.kind() == glidefs_objstore::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(fail(e)),
            }
        };
        Ok(claimed_by_me_at(&first) == Some(1))
    }

    /// The id of another daemon whose unreleased claim the latest manifest of `spec`'s
    /// volume carries (read from the manifest's root: no key needed). A purge of such a volume
    /// would delete what that daemon serves: a name this daemon purged half way and another
    /// host created again, or a volume taken over since.
    async fn held_elsewhere(&self, spec: &VolumeSpec) -> Result<Option<String>, ManagerError> {
        let latest =
            self.volume_store(spec)?
                .current_owner()
                .await
                .map_err(snapshots::store_err(
                    &spec.name,
                    "read the owner before a purge",
                ))?;
        let me = self.opts.owner.as_deref();
        Ok(latest
            .and_then(|(_, owner)| owner)
            .filter(|o| !o.released && Some(o.id.as_str()) != me)
            .map(|o| o.id))
    }

    /// Deletes every object under `[prefix/]volumes/<name>/` (`VolumeStore::purge`: its
    /// snapshots go first through the delete protocol, a clone's registration last). Refused
    /// while a clone of one of its snapshots exists (checked by `remove` before anything is
    /// torn down too: [`Self::check_purge`]).
    async fn purge(&self, spec: &VolumeSpec) -> Result<u64, ManagerError> {
        self.check_purge(spec).await?;
        if let Some(holder) = self.held_elsewhere(spec).await? {
            return Err(ManagerError::OwnedElsewhere {
                name: spec.name.clone(),
                detail: Detail::new(format!(
                    "the store's latest manifest is claimed by `{holder}`; a purge deletes only a volume this daemon holds, or one no one holds (remove it without purge)"
                )),
            });
        }
        self.volume_store(spec)?
            .purge()
            .await
            .map_err(snapshots::store_err(&spec.name, "purge"))
    }

    /// Runs `sync_to_store` now and waits for it.
    pub async fn flush(&self, name: &str) -> Result<FlushReport, ManagerError> {
        let entry = self.entry(name)?;
        let open = entry.open()?;
        let (r, took) = flusher::flush_now(&open.volume, &entry.flush)
            .await
            .map_err(|e| open.error(name, "flush", e))?;
        Ok(FlushReport {
            name: name.to_string(),
            generation: r.generation,
            blocks: r.blocks,
            packs: r.packs,
            bytes: r.bytes,
            evicted: r.evicted,
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// One compaction pass of `name` now, then (with `gc`) one GC pass, with the daemon's
    /// `[space]` and `[gc]` options.
    pub async fn compact(&self, name: &str, gc: bool) -> Result<CompactResult, ManagerError> {
        let started = std::time::Instant::now();
        let entry = self.entry(name)?;
        let open = entry.open()?;
        let v = &open.volume;
        let fail = |what, e| open.error(name, what, e);
        let c = v
            .compact(self.opts.space.compact)
            .await
            .map_err(|e| fail("compact", e))?;
        let mut out = CompactResult {
            name: name.to_string(),
            packs_below_threshold: c.packs_below_threshold,
            packs_rewritten: c.packs_rewritten,
            bytes_copied: c.bytes_written,
            blocks_moved: c.blocks_moved,
            publishes: c.publishes,
            generation: c.generation,
            ..Default::default()
        };
        if gc {
            let r = v
                .collect_garbage(self.opts.space.gc.clone())
                .await
                .map_err(|e| fail("gc", e))?;
            out.gc_packs_deleted = r.packs_deleted.len() as u64;
            out.gc_bytes_deleted = r.bytes_deleted;
        }
        let s = v.stats().await;
        out.stored_bytes = s.stored_bytes;
        out.live_bytes = s.live_bytes;
        out.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(out)
    }

    /// One volume's description.
    pub async fn inspect(&self, name: &str) -> Result<VolumeInfo, ManagerError> {
        let entry = self.entry(name)?;
        Ok(self.info(&entry).await)
    }

    /// Every volume, by name.
    pub async fn list(&self) -> Vec<VolumeInfo> {
        let entries: Vec<_> = self.volumes.read().values().cloned().collect();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            out.push(self.info(&e).await);
        }
        out
    }

    async fn info(&self, entry: &Entry) -> VolumeInfo {
        let spec = &entry.spec;
        let bs = u64::from(spec.block_size);
        let mut info = VolumeInfo {
            name: spec.name.clone(),
            state: VolumeState::Failed,
            error: None,
            size: spec.size,
            block_size: spec.block_size,
            queues: spec.queues,
            queue_depth: spec.queue_depth,
            read_only: spec.read_only,
            prefix: spec.prefix.clone(),
            cache_dir: entry.dir.display().to_string(),
            device: DeviceInfo::default(),
            dirty_bytes: 0,
            syncing_bytes: 0,
            cache_bytes: 0,
            remote_blocks: 0,
            manifest_generation: 0,
            fenced: false,
            cold_reads: 0,
            flush: entry.flush.info(),
            space: Default::default(),
            snapshot: spec.snapshot.as_ref().map(ToString::to_string),
            encryption_key_id: None,
            durability: spec.durability,
        };
        let open = match entry.open() {
            Ok(o) => o,
            Err(e) => {
                if matches!(*entry.state.lock(), EntryState::Recovering { .. }) {
                    info.state = VolumeState::Recovering;
                }
                info.error = Some(e.to_string());
                return info;
            }
        };
        let mut written = 0;
        if let Some(dev) = open.device.lock().as_ref() {
            written = dev.io_stats().op(ublk_core::IoOp::Write).bytes;
            info.device = DeviceInfo {
                id: dev.id(),
                path: dev.path(),
                transport: dev.transport(),
            };
        }
        info.encryption_key_id = open
            .volume
            .config()
            .encryption_key
            .as_ref()
            .map(|k| k.id().to_string());
        let group = open.volume.group_figures();
        info.flush.store_flushes = group.flushes;
        info.flush.store_syncs = group.syncs;
        let s = open.volume.stats().await;
        info.dirty_bytes = s.cache.dirty * bs;
        info.syncing_bytes = s.cache.syncing * bs;
        info.cache_bytes = (s.cache.clean + s.cache.dirty + s.cache.syncing) * bs;
        info.remote_blocks = s.cache.remote;
        info.manifest_generation = s.manifest_generation;
        info.cold_reads = s.blocks_fetched;
        info.space = SpaceInfo {
            stored_bytes: s.stored_bytes,
            live_bytes: s.live_bytes,
            mapped_blocks: s.mapped_blocks,
            uploaded_bytes: s.bytes_uploaded,
            guest_written_bytes: written,
            write_amplification: (written > 0).then(|| s.bytes_uploaded as f64 / written as f64),
            compactions: s.compactions,
            compacted_bytes: s.bytes_compacted,
        };
        match open.volume.fenced() {
            Some(f) => {
                info.state = VolumeState::Fenced;
                info.fenced = true;
                info.error = Some(f.to_string());
            }
            None => info.state = VolumeState::Running,
        }
        info
    }

    /// Names of the volumes still `recovering` (restored, not open yet: `/readyz` waits for
    /// them).
    pub fn recovering(&self) -> Vec<String> {
        self.volumes
            .read()
            .values()
            .filter(|e| matches!(*e.state.lock(), EntryState::Recovering { .. }))
            .map(|e| e.spec.name.clone())
            .collect()
    }

    /// Figures of every volume for `/metrics`.
    pub async fn metrics(&self) -> Vec<VolumeMetrics> {
        let entries: Vec<_> = self.volumes.read().values().cloned().collect();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let open = e.open().ok();
            let recovering = matches!(*e.state.lock(), EntryState::Recovering { .. });
            let (io, stats, fenced) = match &open {
                Some(o) => {
                    let io = o.device.lock().as_ref().map(|d| d.io_stats());
                    let stats = o.volume.stats().await;
                    (
                        io.unwrap_or_default(),
                        Some(stats),
                        o.volume.fenced().is_some(),
                    )
                }
                None => (IoStats::default(), None, false),
            };
            out.push(VolumeMetrics {
                name: e.spec.name.clone(),
                io,
                stats,
                recovering,
                block_size: u64::from(e.spec.block_size),
                fenced,
                flush: e.flush.clone(),
            });
        }
        out
    }

    /// Stops every device and flusher and closes every volume (local durability). Later
    /// create/remove calls fail with `shutting_down`. Idempotent.
    pub async fn shutdown(&self) {
        self.close_all(false).await;
    }

    /// Hand-off: like [`VolumeManager::shutdown`], but every device is detached instead of
    /// deleted (it stays, QUIESCED, holding I/O) and `state.json` keeps its id, so the next
    /// daemon on this data directory takes it over at its start. Returns how many devices
    /// were kept. Idempotent (a second call keeps nothing).
    pub async fn handoff(&self) -> usize {
        self.close_all(true).await
    }

    async fn close_all(&self, keep_devices: bool) -> usize {
        {
            let mut admin = self.admin.lock().await;
            if *admin {
                return 0;
            }
            *admin = true;
            self.stop.send_replace(true);
        }
        // Creates in flight register or fail first ([`inflight`]).
        self.creates.drain().await;
        let _admin = self.admin.lock().await;
        let entries: Vec<_> = self.volumes.read().values().cloned().collect();
        // Re-open attempts end first (they hold no admin lock): a volume one opened is closed
        // below like the others.
        for e in &entries {
            e.reopen.stop().await;
        }
        let entries: Vec<_> = self.volumes.read().values().cloned().collect();
        let mut kept = 0;
        for e in entries {
            let Some(open) = e.open_or_stopped() else {
                continue;
            };
            let name = &e.spec.name;
            if keep_devices {
                open.closing.store(true, Ordering::Release);
                let start = std::time::Instant::now();
                open.flusher.stop().await;
                tracing::info!(volume = %name, waited_ms = start.elapsed().as_millis() as u64, "flusher stopped (a flush in progress completes first)");
                let device = open.device.lock().take();
                if let Some(dev) = device {
                    match device_step(name, "detach", move || Ok(dev.detach()?)).await {
                        Ok(Some(id)) => {
                            kept += 1;
                            tracing::info!(volume = %name, device = id, "device detached for the next daemon");
                        }
                        Ok(None) => {}
                        Err(err) => {
                            tracing::error!(volume = %name, error = %chain(&err), "detaching the device failed")
                        }
                    }
                }
                if let Err(err) = open.volume.close().await {
                    tracing::error!(volume = %name, error = %chain(&err), "close during hand-off failed");
                } else {
                    tracing::info!(volume = %name, "volume closed");
                }
            } else if let Err(err) = self.teardown(&e, &open, true).await {
                tracing::error!(volume = %name, error = %chain(&err), "shutdown of volume failed");
            } else {
                tracing::info!(volume = %name, "volume closed");
            }
        }
        kept
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

/// Whether owner ids `a` and `b` (`<hostname>/<data directory id>`, see
/// `server::owner_id`) name the same data directory, whatever the host names.
pub(crate) fn same_data_dir(a: &str, b: Option<&str>) -> bool {
    let dir = |id: &str| id.rsplit_once('/').map(|(_, d)| d.to_string());
    b.is_some_and(|b| dir(a).is_some() && dir(a) == dir(b))
}

#[cfg(test)]
mod tests {
    use super::same_data_dir;

    #[test]
    fn a_renamed_host_is_the_same_data_directory() {
        let dir = "0a0a0a0a-0000-4000-8000-00000000000a";
        let old = format!("old-host/{dir}");
        assert!(same_data_dir(&old, Some(&format!("new-host/{dir}"))));
        assert!(same_data_dir(&old, Some(&old)));
        assert!(!same_data_dir(
            &old,
            Some("new-host/0b0b0b0b-0000-4000-8000-00000000000b")
        ));
        assert!(!same_data_dir(&old, None));
        assert!(!same_data_dir("no-slash", Some("no-slash")));
    }
}
