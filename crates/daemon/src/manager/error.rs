//! Errors of the volume manager. Each variant has a stable [`ManagerError::code`], the API's
//! error code; the HTTP status for it is chosen in `api::error`.
//!
//! An error that another error caused keeps it as its source ([`Detail`], or a typed field),
//! so logs show the whole chain (`glidefs_model::log::chain`); the message embeds the
//! cause's text as well, so API clients see it.

use std::fmt;
use std::path::PathBuf;

use glidefs_volume::{SnapshotProblem, VolumeError, VolumeErrorKind};

use glidefs_model::BoxError;
use glidefs_ublk::export::ExportError;

/// Why a manager operation failed; every message names the volume or value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    #[error(
        "invalid volume name `{name}`: use 1..=128 characters of [A-Za-z0-9._-], not `.` or `..`"
    )]
    InvalidName { name: String },
    #[error("invalid size {value}: {reason}")]
    InvalidSize { value: String, reason: String },
    #[error("invalid block_size {value}: must be a power of two in 4K..=16M")]
    InvalidBlockSize { value: String },
    #[error("invalid {field} {value}: {reason}")]
    InvalidQueues {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("invalid QoS limit {field}: {reason}")]
    InvalidQos { field: &'static str, reason: String },
    #[error("invalid warm-set recording: {reason}")]
    InvalidWarmSet { reason: String },
    #[error("volume `{name}` is recording its warm set already: {detail}")]
    WarmSetRecording { name: String, detail: String },
    #[error("invalid prefix `{value}`: use `/`-separated segments of [A-Za-z0-9._-] (not `.`, `..` or `volumes`, which could nest a volume inside another's objects), at most 256 characters")]
    InvalidPrefix { value: String },
    #[error("volume `{name}` already exists in this daemon")]
    Duplicate { name: String },
    #[error("volume `{name}` not found")]
    NotFound { name: String },
    #[error("volume `{name}` already has a manifest (generation {generation}) in the object store; pass attach_existing=true to open it, or remove it with purge")]
    ExistsInStore { name: String, generation: u64 },
    /// A read-only export, or an `attach_existing` without a size, of a volume the store has
    /// no manifest of: there is nothing to attach (an empty volume would be served as if it
    /// were the one asked for).
    #[error("volume `{name}` has no manifest in the object store{prefix}: there is nothing to attach (check the name and prefix; a read-only export needs an existing volume, an attach_existing a size to create one)")]
    NotInStore { name: String, prefix: String },
    #[error("durability {value:?} is not one of `local`, `store`")]
    InvalidDurability { value: String },
    #[error("volume `{name}`: {detail}")]
    GeometryMismatch {
        name: String,
        #[source]
        detail: Detail,
    },
    /// `reason` is the status the volume was left in (shown by list and inspect too); the
    /// error that put it there was returned, and logged, when it happened.
    #[error("volume `{name}` is not open: {reason}")]
    Failed { name: String, reason: String },
    #[error("volume `{name}` is fenced: {detail}")]
    Fenced {
        name: String,
        #[source]
        detail: Detail,
    },
    #[error(
        "volume `{name}` is owned by another daemon: {detail} (attach with takeover to fence it)"
    )]
    OwnedElsewhere {
        name: String,
        #[source]
        detail: Detail,
    },
    /// The encryption key source of a create request is invalid, or the key cannot be read.
    #[error("volume `{name}`: invalid encryption key: {detail}")]
    InvalidEncryptionKey {
        name: String,
        #[source]
        detail: Detail,
    },
    /// The volume in the store is encrypted with another key (or with one, and none was
    /// given, or with none, and one was given); the detail names both key ids.
    #[error("volume `{name}`: the encryption key does not match the volume in the object store: {detail}")]
    KeyMismatch {
        name: String,
        #[source]
        detail: Detail,
    },
    #[error("volume `{name}`: object store unavailable: {detail}")]
    StoreUnavailable {
        name: String,
        #[source]
        detail: Detail,
    },
    /// A resize grew the volume (engine and `state.json`) but its block device kept its size.
    #[error("volume `{name}` grew from {from} to {to} bytes (engine and state.json), but its block device was not resized: {detail}; resize to {to} again to retry the device")]
    DeviceNotResized {
        name: String,
        from: u64,
        to: u64,
        #[source]
        detail: Detail,
    },
    #[error(transparent)]
    Device(#[from] ExportError),
    #[error("invalid snapshot `{value}`: {reason}")]
    InvalidSnapshot { value: String, reason: String },
    #[error("snapshot `{volume}@{snapshot}` not found")]
    SnapshotNotFound { volume: String, snapshot: String },
    #[error("snapshot `{volume}@{snapshot}` already exists")]
    SnapshotExists { volume: String, snapshot: String },
    #[error("snapshot `{volume}@{snapshot}` is in use: {by}")]
    SnapshotInUse {
        volume: String,
        snapshot: String,
        by: String,
    },
    /// A snapshot delete refused while read-only views on some host have it open (their
    /// registrations in the store; issue 45 item 5).
    #[error("snapshot `{volume}@{snapshot}` is attached read-only by {}; detach it there first, or clear a dead holder's registrations (`?clear_views=HOLDER`)", holders.join(", "))]
    SnapshotAttached {
        volume: String,
        snapshot: String,
        holders: Vec<String>,
    },
    #[error("volume `{name}` is read-only: {detail}")]
    ReadOnly { name: String, detail: Detail },
    #[error("volume `{name}` not created: {detail}")]
    TooManyOpenFiles { name: String, detail: Detail },
    /// A remove or the daemon's shutdown is taking the volume away: a call that reached it
    /// meanwhile, or was running on it (the engine's error, if any, is the source).
    #[error("volume `{name}` is being removed (or the daemon is stopping): {detail}")]
    Closing {
        name: String,
        #[source]
        detail: Detail,
    },
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Internal(Detail),
}

impl ManagerError {
    /// The stable API error code.
    pub fn code(&self) -> &'static str {
        match self {
            ManagerError::InvalidName { .. } => "invalid_name",
            ManagerError::InvalidSize { .. } => "invalid_size",
            ManagerError::InvalidBlockSize { .. } => "invalid_block_size",
            ManagerError::InvalidQueues { .. } => "invalid_queues",
            ManagerError::InvalidQos { .. } => "invalid_qos",
            ManagerError::InvalidPrefix { .. } => "invalid_prefix",
            ManagerError::InvalidWarmSet { .. } => "invalid_warm_set",
            ManagerError::WarmSetRecording { .. } => "warm_set_recording",
            ManagerError::Duplicate { .. } => "duplicate",
            ManagerError::NotFound { .. } => "not_found",
            ManagerError::ExistsInStore { .. } => "volume_exists_in_store",
            ManagerError::NotInStore { .. } => "volume_not_in_store",
            ManagerError::InvalidDurability { .. } => "invalid_durability",
            ManagerError::GeometryMismatch { .. } => "geometry_mismatch",
            ManagerError::Failed { .. } => "volume_failed",
            ManagerError::Fenced { .. } => "fenced",
            ManagerError::OwnedElsewhere { .. } => "owned_elsewhere",
            ManagerError::StoreUnavailable { .. } => "store_unavailable",
            ManagerError::DeviceNotResized { .. } => "device_failed",
            ManagerError::InvalidEncryptionKey { .. } => "invalid_encryption_key",
            ManagerError::KeyMismatch { .. } => "key_mismatch",
            ManagerError::Device(ExportError::Unsupported(_)) => "unsupported_kernel",
            ManagerError::Device(ExportError::Failed { .. }) => "device_failed",
            ManagerError::Device(ExportError::Busy { .. }) => "device_busy",
            // `ExportError` is `#[non_exhaustive]` in `glidefs-ublk`: a kind added there is a
            // device failure until it is given a code of its own.
            ManagerError::Device(_) => "device_failed",
            ManagerError::InvalidSnapshot { .. } => "invalid_snapshot",
            ManagerError::SnapshotNotFound { .. } => "snapshot_not_found",
            ManagerError::SnapshotExists { .. } => "snapshot_exists",
            ManagerError::SnapshotInUse { .. } => "snapshot_in_use",
            ManagerError::SnapshotAttached { .. } => "snapshot_attached",
            ManagerError::ReadOnly { .. } => "read_only",
            ManagerError::TooManyOpenFiles { .. } => "too_many_open_files",
            ManagerError::Closing { .. } => "volume_closing",
            ManagerError::ShuttingDown => "shutting_down",
            ManagerError::State(_) | ManagerError::Internal(_) => "internal",
        }
    }

    /// Maps an engine error of operation `op` on volume `name` by its kind; the error is kept
    /// as the source.
    pub fn from_volume(name: &str, op: &str, e: VolumeError) -> Self {
        let name = name.to_string();
        match (&e, e.kind()) {
            (
                VolumeError::Snapshot {
                    volume,
                    name: snapshot,
                    problem,
                },
                _,
            ) => {
                let (volume, snapshot) = (volume.clone(), snapshot.clone());
                match problem {
                    SnapshotProblem::NotFound => {
                        ManagerError::SnapshotNotFound { volume, snapshot }
                    }
                    SnapshotProblem::Exists => ManagerError::SnapshotExists { volume, snapshot },
                    SnapshotProblem::InvalidName => ManagerError::InvalidSnapshot {
                        value: snapshot,
                        reason: problem.to_string(),
                    },
                    SnapshotProblem::Attached { holders } => ManagerError::SnapshotAttached {
                        volume,
                        snapshot,
                        holders: holders.clone(),
                    },
                    SnapshotProblem::Deleting
                    | SnapshotProblem::HasClones { .. }
                    | SnapshotProblem::ClonesInCreation { .. }
                    | SnapshotProblem::CloneDeadline { .. } => ManagerError::SnapshotInUse {
                        volume,
                        snapshot,
                        by: problem.to_string(),
                    },
                }
            }
            (VolumeError::ReadOnly { .. }, _) => ManagerError::ReadOnly {
                name,
                detail: Detail::caused(op, e),
            },
            // Only a remove or a shutdown closes a volume the daemon serves.
            (VolumeError::Closed { .. }, _) => ManagerError::Closing {
                name,
                detail: Detail::caused(op, e),
            },
            (VolumeError::GeometryMismatch { .. }, _) => ManagerError::GeometryMismatch {
                name,
                detail: Detail::caused(op, e),
            },
            _ if e.key_mismatch().is_some() => ManagerError::KeyMismatch {
                name,
                detail: Detail::caused(op, e),
            },
            (VolumeError::OwnedElsewhere { .. }, _) => ManagerError::OwnedElsewhere {
                name,
                detail: Detail::caused(op, e),
            },
            (_, VolumeErrorKind::Fenced) => ManagerError::Fenced {
                name,
                detail: Detail::caused(op, e),
            },
            (_, VolumeErrorKind::Unavailable) => ManagerError::StoreUnavailable {
                name,
                detail: Detail::caused(op, e),
            },
            _ => ManagerError::Internal(Detail::caused(format!("volume `{name}`: {op}"), e)),
        }
    }

    /// An `internal` error: `what` failed because of `cause`.
    pub fn internal(what: impl Into<String>, cause: impl Into<BoxError>) -> Self {
        ManagerError::Internal(Detail::caused(what, cause))
    }
}

/// What failed, and the error that made it fail when there is one (kept as the source).
/// Shown as `what: cause`, or `what` alone.
#[derive(Debug)]
pub struct Detail {
    what: String,
    cause: Option<BoxError>,
}

impl Detail {
    /// A failure with no underlying error.
    pub fn new(what: impl Into<String>) -> Self {
        Detail {
            what: what.into(),
            cause: None,
        }
    }

    /// `what` failed because of `cause`.
    pub fn caused(what: impl Into<String>, cause: impl Into<BoxError>) -> Self {
        Detail {
            what: what.into(),
            cause: Some(cause.into()),
        }
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Some(cause) => write!(f, "{}: {cause}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for Detail {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// State file errors, naming the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    #[error("state file `{path}`: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("state file `{path}` is damaged or of an unknown version: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "state file `{path}` is of an unknown version {version} (this glidefs reads {supported})"
    )]
    Version {
        path: PathBuf,
        version: u32,
        supported: u32,
    },
}
