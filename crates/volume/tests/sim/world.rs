//! The simulated world: hosts over one in-memory store, the volumes, snapshots and handles
//! they hold, and what each must read.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use glidefs_objstore::{StoreConfig, VolumeStore};
use glidefs_testkit::FaultyStore;
use glidefs_volume::{Volume, VolumeConfig};
use object_store::ObjectStore;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::task::JoinHandle;

use super::model::*;

/// Hosts in a world.
pub const HOSTS: usize = 3;
/// Volume names: created fresh (`v`, `w`) or as clones (`c*`); a purged name is used again.
pub const NAMES: [&str; 5] = ["v", "w", "c1", "c2", "c3"];
/// Snapshot names (few, so that names are deleted and taken again).
pub const SNAPS: [&str; 3] = ["s1", "s2", "s3"];

/// `Vol::owner_host` when a dead takeover may or may not have claimed the volume.
pub const UNKNOWN_OWNER: usize = usize::MAX;

/// One host: its owner id and its own view of the store (faults are per host).
pub struct Host {
    pub id: String,
    pub faulty: Arc<FaultyStore>,
    /// How far this host's clock is from the store's (seconds; GC ages objects by it).
    pub skew: i64,
}

impl Host {
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.faulty.clone()
    }

    /// This host's clock now.
    pub fn clock(&self) -> SystemTime {
        let d = Duration::from_secs(self.skew.unsigned_abs());
        if self.skew < 0 {
            SystemTime::now() - d
        } else {
            SystemTime::now() + d
        }
    }
}

/// Clock skews a host may have: none, minutes behind, or ahead by more than GC's grace (an
/// hour), which makes every young upload look old to its passes.
const SKEWS: [i64; 4] = [0, 0, -600, 7200];

/// The handle that writes a volume.
pub struct Writer {
    pub host: usize,
    pub v: Arc<Volume>,
}

/// A read-only export of a volume's latest state (`snapshot: None`) or a view of a snapshot.
pub struct Reader {
    pub host: usize,
    pub vol: String,
    pub snapshot: Option<String>,
    /// A view: the snapshot's image when it opened (its name may be taken again later).
    pub want: Option<Img>,
    /// An export: the oldest published state it may still serve (`Content::check_export`).
    pub floor: usize,
    pub v: Arc<Volume>,
}

/// A volume of the world.
pub struct Vol {
    /// `(origin, snapshot)` for a clone.
    pub origin: Option<(String, String)>,
    pub content: Content,
    pub writer: Option<Writer>,
    /// The host whose claim the store's latest manifest carries (a new host must take over).
    pub owner_host: usize,
    /// The size a writer opens it with (bytes): what the daemon records (in `state.json`, or
    /// a CSI controller in its volume) before it calls `resize`, so that an open after a
    /// crash or on another host completes a resize the store has not published.
    pub size: u64,
}

/// What a suspended operation was doing when its store call was held.
#[derive(Debug, Clone)]
pub enum PendingKind {
    Sync(String),
    Compact(String),
    Snapshot(String, String),
    Clone {
        name: String,
        origin: String,
        snap: String,
    },
    Takeover(String),
    DeleteSnapshot(String, String),
}

/// What a suspended operation returns.
pub enum Outcome {
    Unit(Result<(), OpError>),
    Opened(Result<Arc<Volume>, OpError>),
}

/// An operation's error: its message, and whether it says the writer is fenced.
#[derive(Debug)]
pub struct OpError {
    pub fenced: bool,
    pub message: String,
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<glidefs_volume::VolumeError> for OpError {
    fn from(e: glidefs_volume::VolumeError) -> Self {
        Self {
            fenced: e.kind() == glidefs_volume::VolumeErrorKind::Fenced,
            message: e.to_string(),
        }
    }
}

impl From<glidefs_objstore::ObjStoreError> for OpError {
    fn from(e: glidefs_objstore::ObjStoreError) -> Self {
        Self {
            fenced: false,
            message: e.to_string(),
        }
    }
}

/// An operation held at one of its store calls while others run.
pub struct Pending {
    pub host: usize,
    pub kind: PendingKind,
    pub task: JoinHandle<Outcome>,
    /// Steps left before it is resolved.
    pub steps_left: u32,
}

pub struct World {
    pub rng: StdRng,
    pub root: tempfile::TempDir,
    pub hosts: Vec<Host>,
    pub vols: BTreeMap<String, Vol>,
    /// `(volume, snapshot)` → the image it holds.
    pub snaps: BTreeMap<(String, String), Img>,
    pub readers: Vec<Reader>,
    pub pending: Option<Pending>,
    next_tag: u64,
    pub trace: Vec<String>,
    pub step: usize,
    /// What this world runs: every operation, or all but the ones a known open defect breaks.
    pub scope: super::Scope,
}

impl World {
    pub fn new(seed: u64, scope: super::Scope) -> Self {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let mut rng = StdRng::seed_from_u64(seed);
        let hosts = (0..HOSTS)
            .map(|h| Host {
                id: format!("host-{h}/0000000{h}-0000-4000-8000-00000000000{h}"),
                faulty: Arc::new(FaultyStore::with_seed(mem.clone(), seed ^ h as u64)),
                skew: SKEWS[rng.random_range(0..SKEWS.len())],
            })
            .collect();
        Self {
            rng,
            root: scratch(),
            hosts,
            vols: BTreeMap::new(),
            snaps: BTreeMap::new(),
            readers: Vec::new(),
            pending: None,
            next_tag: 0,
            trace: Vec::new(),
            step: 0,
            scope,
        }
    }

    pub fn log(&mut self, line: String) {
        self.trace.push(format!("{:>3} {line}", self.step));
    }

    pub fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    pub fn pick<T: Clone>(&mut self, from: &[T]) -> Option<T> {
        if from.is_empty() {
            return None;
        }
        Some(from[self.rng.random_range(0..from.len())].clone())
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    /// The cache directory of `kind` (`w` writer, `x` export, `s` snapshot view) of `vol` on
    /// `host`: the same one every time, so that a host reopens what it held before.
    pub fn dir(&self, host: usize, kind: &str, vol: &str) -> PathBuf {
        self.root.path().join(format!("h{host}/{kind}-{vol}"))
    }

    pub fn config(&self, host: usize, kind: &str, vol: &str, size: u64) -> VolumeConfig {
        let mut c = VolumeConfig::new(vol, self.dir(host, kind, vol), size);
        c.block_size = BS;
        c.pack_bytes = 4 * BS as u64;
        c.readahead_blocks = 2;
        c.store.retry_base_delay = std::time::Duration::from_millis(1);
        c.store.retry_max_delay = std::time::Duration::from_millis(2);
        c.store.max_retries = 3;
        // One upload at a time: the order of store calls, and so which call a fault hits,
        // is the same on every run of a seed.
        c.store.upload_concurrency = 1;
        c
    }

    /// A writer's config, at the size the world recorded for `vol` (a new volume: the
    /// initial size; a clone sets the snapshot's).
    pub fn writer_config(&self, host: usize, vol: &str, takeover: bool) -> VolumeConfig {
        let size = self.vols.get(vol).map_or(crate::common::SIZE, |v| v.size);
        let mut c = self.config(host, "w", vol, size);
        c.owner = Some(self.hosts[host].id.clone());
        c.takeover = takeover;
        c
    }

    /// A reader's config: `size` is what the store says (the daemon attaches a read-only
    /// export at its latest manifest's size and a view at its snapshot's: [`World::stored_size`]).
    pub fn reader_config(
        &self,
        host: usize,
        vol: &str,
        snapshot: Option<&str>,
        size: u64,
    ) -> VolumeConfig {
        let kind = if snapshot.is_some() { "s" } else { "x" };
        let mut c = self.config(host, kind, vol, size);
        c.snapshot = snapshot.map(str::to_string);
        c.read_only = snapshot.is_none();
        // A view registers under its snapshot as its host (what the daemon passes); an
        // export claims nothing.
        if snapshot.is_some() {
            c.owner = Some(self.hosts[host].id.clone());
        }
        c
    }

    /// `vol`'s store as `host` sees it.
    pub fn vstore(&self, host: usize, vol: &str) -> VolumeStore {
        VolumeStore::new(self.hosts[host].store(), vol, StoreConfig::default()).unwrap()
    }

    /// The size the store records for `vol`'s latest manifest (the initial size while it has
    /// none) or for its snapshot `snapshot`.
    pub async fn stored_size(
        &self,
        host: usize,
        vol: &str,
        snapshot: Option<&str>,
    ) -> Result<u64, String> {
        let s = self.vstore(host, vol);
        let size = match snapshot {
            Some(name) => s
                .snapshot(name)
                .await
                .map_err(|e| format!("snapshot record of `{vol}@{name}`: {e}"))?
                .map(|i| i.record.volume_size),
            None => s
                .load_manifest()
                .await
                .map_err(|e| format!("manifest of `{vol}`: {e}"))?
                .map(|m| m.volume_size),
        };
        Ok(size.unwrap_or(crate::common::SIZE))
    }

    /// Volumes that have a writer not busy in the pending operation.
    pub fn idle_writers(&self) -> Vec<String> {
        self.vols
            .iter()
            .filter(|(n, v)| v.writer.is_some() && !self.busy(n))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// True when the pending operation uses `vol`'s writer (or creates `vol`).
    pub fn busy(&self, vol: &str) -> bool {
        let Some(p) = &self.pending else { return false };
        match &p.kind {
            PendingKind::Sync(v)
            | PendingKind::Compact(v)
            | PendingKind::Snapshot(v, _)
            | PendingKind::Takeover(v) => v == vol,
            PendingKind::Clone { name, .. } => name == vol,
            PendingKind::DeleteSnapshot(..) => false,
        }
    }

    /// True when the pending operation deletes snapshot `vol@name`.
    pub fn deleting(&self, vol: &str, name: &str) -> bool {
        matches!(&self.pending, Some(Pending { kind: PendingKind::DeleteSnapshot(v, n), .. }) if v == vol && n == name)
    }

    /// True when `host` runs the pending operation.
    pub fn host_busy(&self, host: usize) -> bool {
        self.pending.as_ref().is_some_and(|p| p.host == host)
    }

    /// Names no volume has now (nor a pending clone is making).
    pub fn free_names(&self, prefix: char) -> Vec<String> {
        NAMES
            .iter()
            .filter(|n| n.starts_with(prefix) && !self.vols.contains_key(**n) && !self.busy(n))
            .map(|n| n.to_string())
            .collect()
    }

    /// Clones of `vol`'s snapshots (in the model).
    pub fn clones_of(&self, vol: &str) -> Vec<String> {
        self.vols
            .iter()
            .filter(|(_, v)| v.origin.as_ref().is_some_and(|(o, _)| o == vol))
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// A directory for a world's caches: in `/dev/shm` where there is one (every open creates
/// and fsyncs cache files; on a disk that is most of a seed's time), else the temp dir.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("glidefs-sim")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// Reads a whole handle and decodes it; the pages past its size read as zeros (see
/// [`MAX_PAGES`]).
pub async fn read_img(v: &Volume) -> Result<Img, String> {
    let mut buf = vec![0; v.size() as usize];
    v.read(0, &mut buf)
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    let mut img = decode_img(&buf)?;
    if img.len() > MAX_PAGES {
        return Err(format!(
            "the handle is {} bytes, more than any size the world gave it",
            v.size()
        ));
    }
    img.resize(MAX_PAGES, 0);
    Ok(img)
}

/// Page range `first..first+tags.len()` written with `tags`.
pub fn write_bytes(first: usize, tags: &[u64]) -> Vec<u8> {
    tags.iter()
        .enumerate()
        .flat_map(|(k, &t)| page_bytes(t, first + k))
        .collect()
}
