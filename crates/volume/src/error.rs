//! Errors of the volume engine.

use std::sync::Arc;

use glidefs_cache::{CacheError, CacheErrorKind};
use glidefs_objstore::{ErrorKind, KeyId, ObjStoreError, SnapshotProblem};

/// What a caller (the daemon) can do about a [`VolumeError`]. The stable part of an error:
/// callers match every kind (a new kind is a change they must handle); [`VolumeError`]
/// itself is `#[non_exhaustive]`, its variants carry detail for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeErrorKind {
    /// Retry later (object store unavailable, contended state).
    Unavailable,
    /// The request is wrong (range, geometry, configuration).
    InvalidInput,
    /// Stored or cached bytes failed verification.
    Corrupt,
    /// Another writer owns the volume, or this volume died (crash point, fatal I/O): reopen.
    Fenced,
    /// Anything else (local disk failure, permanent store refusal).
    Internal,
    /// The thing asked for (a snapshot) does not exist.
    NotFound,
}

/// Errors of the volume engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("object store {op} failed: volume=`{volume}`: {source}")]
    Store {
        op: &'static str,
        volume: String,
        #[source]
        source: Box<ObjStoreError>,
    },
    #[error("cache base file {op} failed: path=`{path}`: {source}")]
    Base {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("volume `{volume}` geometry mismatch: manifest has {stored}, config asks {requested}")]
    GeometryMismatch {
        volume: String,
        stored: String,
        requested: String,
    },
    #[error("block {block} is marked remote but the manifest (generation {generation}) has no location for it")]
    MissingLocation { block: u64, generation: u64 },
    #[error("fetch of block {block} failed: {source}")]
    Fetch {
        block: u64,
        #[source]
        source: Arc<VolumeError>,
    },
    #[error("read plan needs block {block}, which was not fetched")]
    NotFetched { block: u64 },
    #[error("fetched block {block} has {got} bytes, the read needs bytes up to {needed}")]
    ShortBlock { block: u64, got: usize, needed: u64 },
    #[error("{what} at offset {offset} did not settle after {attempts} attempts")]
    Unsettled {
        what: &'static str,
        offset: u64,
        attempts: u32,
    },
    #[error("background task failed: {0}")]
    Task(String),
    /// Latched: every later write, flush and sync of this volume reports the same error.
    #[error("{0}")]
    Fenced(Fence),
    /// `Volume::open` with an owner id found the volume held by another owner that has not
    /// released it; open with `takeover` to fence that owner and claim the volume.
    #[error(
        "volume `{volume}` is owned by `{owner}` (manifest generation {generation}), which has \
         not released it; open it with takeover to fence that owner and claim the volume (its \
         writes not yet flushed to the store are lost)"
    )]
    OwnedElsewhere {
        volume: String,
        owner: String,
        generation: u64,
    },
    /// This volume is being released or was released (`Volume::release`): writes and syncs
    /// to the store are refused; reopen it (claiming it again) to write.
    #[error("volume `{volume}` is released by this owner (manifest generation {generation}): writes are refused, reopen the volume to use it")]
    Released { volume: String, generation: u64 },
    /// `Volume::close` ran: this handle publishes nothing more (see `base`, clean close).
    #[error("volume `{volume}` was closed: nothing more is flushed to the store through this handle; reopen the volume")]
    Closed { volume: String },
    /// The configuration or the call does not fit (bad owner id, release without owner).
    #[error("volume `{volume}`: {detail}")]
    InvalidConfig { volume: String, detail: String },
    /// A snapshot operation was refused (no such snapshot, name taken, clones use it).
    #[error("snapshot `{volume}@{name}`: {problem}")]
    Snapshot {
        volume: String,
        name: String,
        problem: SnapshotProblem,
    },
    /// The group flush to the object store that was to cover a `flush_to_store` failed
    /// (`group.rs`): what it covers is not known to be in the store.
    #[error("volume `{volume}`: the flush to the object store covering this FLUSH (group {epoch}) failed: {source}")]
    GroupSync {
        volume: String,
        epoch: u64,
        #[source]
        source: std::sync::Arc<VolumeError>,
    },
    /// The volume is a read-only view of a snapshot: writes, flushes to the store,
    /// compaction and GC are refused.
    #[error("volume `{volume}` is {}: {op} refused", read_only_what(snapshot.as_deref()))]
    ReadOnly {
        volume: String,
        /// The snapshot a view serves; `None` for a read-only export of the latest state.
        snapshot: Option<String>,
        op: &'static str,
    },
}

/// What kind of read-only handle `VolumeError::ReadOnly` names.
fn read_only_what(snapshot: Option<&str>) -> String {
    match snapshot {
        Some(s) => format!("the read-only snapshot `{s}`"),
        None => "a read-only export (it holds no claim and publishes nothing)".to_string(),
    }
}

/// Why a volume stopped accepting writes and flushes: another writer published a newer
/// manifest generation, so this writer's view is stale and it must never publish again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The volume.
    pub volume: String,
    /// The manifest generation this writer holds (it tried to publish the next one).
    pub generation: u64,
    /// The newer generation another writer published, when the store told us.
    pub newer: Option<u64>,
    /// The store's reason.
    pub reason: String,
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "volume `{}` is fenced: another writer published ",
            self.volume
        )?;
        match self.newer {
            Some(g) => write!(f, "generation {g}")?,
            None => write!(f, "a newer generation")?,
        }
        write!(
            f,
            " (this writer holds generation {}; {}); writes and flushes are refused, reopen the \
             volume",
            self.generation, self.reason
        )
    }
}

impl VolumeError {
    pub(crate) fn store(op: &'static str, volume: &str, source: ObjStoreError) -> Self {
        if let ObjStoreError::Snapshot {
            volume,
            name,
            problem,
        } = source
        {
            return VolumeError::Snapshot {
                volume,
                name,
                problem,
            };
        }
        VolumeError::Store {
            op,
            volume: volume.to_string(),
            source: Box::new(source),
        }
    }

    /// When the volume's objects are encrypted with another key than the one configured (or
    /// encrypted and no key was configured, or not encrypted and a key was): the key id
    /// stored in the volume's manifest and the configured key's id (`None`: no key).
    pub fn key_mismatch(&self) -> Option<(Option<KeyId>, Option<KeyId>)> {
        match self {
            VolumeError::Store { source, .. } => source.key_mismatch(),
            VolumeError::Fetch { source, .. } => source.key_mismatch(),
            _ => None,
        }
    }

    /// The actionable kind.
    pub fn kind(&self) -> VolumeErrorKind {
        match self {
            VolumeError::Cache(e) => match e.kind() {
                CacheErrorKind::InvalidInput => VolumeErrorKind::InvalidInput,
                CacheErrorKind::Corrupt => VolumeErrorKind::Corrupt,
                CacheErrorKind::Dead => VolumeErrorKind::Fenced,
                CacheErrorKind::Busy => VolumeErrorKind::Unavailable,
                CacheErrorKind::Io => VolumeErrorKind::Internal,
            },
            VolumeError::Store { source, .. } => match source.kind() {
                ErrorKind::Transient => VolumeErrorKind::Unavailable,
                ErrorKind::Fenced => VolumeErrorKind::Fenced,
                ErrorKind::Corrupt => VolumeErrorKind::Corrupt,
                ErrorKind::InvalidInput => VolumeErrorKind::InvalidInput,
                ErrorKind::NotFound | ErrorKind::Permanent => VolumeErrorKind::Internal,
            },
            VolumeError::GeometryMismatch { .. } => VolumeErrorKind::InvalidInput,
            VolumeError::MissingLocation { .. } => VolumeErrorKind::Corrupt,
            VolumeError::Fetch { source, .. } => source.kind(),
            VolumeError::GroupSync { source, .. } => source.kind(),
            VolumeError::Unsettled { .. } => VolumeErrorKind::Unavailable,
            VolumeError::Task(_)
            | VolumeError::Base { .. }
            | VolumeError::NotFetched { .. }
            | VolumeError::ShortBlock { .. } => VolumeErrorKind::Internal,
            VolumeError::Fenced(_)
            | VolumeError::OwnedElsewhere { .. }
            | VolumeError::Released { .. } => VolumeErrorKind::Fenced,
            VolumeError::InvalidConfig { .. }
            | VolumeError::Closed { .. }
            | VolumeError::ReadOnly { .. } => VolumeErrorKind::InvalidInput,
            VolumeError::Snapshot { problem, .. } => match problem {
                SnapshotProblem::NotFound => VolumeErrorKind::NotFound,
                _ => VolumeErrorKind::InvalidInput,
            },
        }
    }
}

pub type Result<T, E = VolumeError> = std::result::Result<T, E>;
