//! Errors of the volume manager. Each variant has a stable [`ManagerError::code`], the API's
//! error code; the HTTP status for it is chosen in `api::error`.

use glidefs_volume::{VolumeError, VolumeErrorKind};

use crate::device::DeviceLayerError;

/// Why a manager operation failed; every message names the volume or value at fault.
#[derive(Debug, thiserror::Error)]
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
    #[error("invalid prefix `{value}`: use `/`-separated segments of [A-Za-z0-9._-] (not `.`/`..`), at most 256 characters")]
    InvalidPrefix { value: String },
    #[error("volume `{name}` already exists in this daemon")]
    Duplicate { name: String },
    #[error("volume `{name}` not found")]
    NotFound { name: String },
    #[error("volume `{name}` already has a manifest (generation {generation}) in the object store; pass attach_existing=true to open it, or remove it with purge")]
    ExistsInStore { name: String, generation: u64 },
    #[error("volume `{name}`: {message}")]
    GeometryMismatch { name: String, message: String },
    #[error("volume `{name}` is not open: {reason}")]
    Failed { name: String, reason: String },
    #[error("volume `{name}` is fenced: {message}")]
    Fenced { name: String, message: String },
    #[error("volume `{name}` is owned by another daemon: {message}")]
    OwnedElsewhere { name: String, message: String },
    #[error("volume `{name}`: object store unavailable: {message}")]
    StoreUnavailable { name: String, message: String },
    #[error(transparent)]
    Device(#[from] DeviceLayerError),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Internal(String),
}

impl ManagerError {
    /// The stable API error code.
    pub fn code(&self) -> &'static str {
        match self {
            ManagerError::InvalidName { .. } => "invalid_name",
            ManagerError::InvalidSize { .. } => "invalid_size",
            ManagerError::InvalidBlockSize { .. } => "invalid_block_size",
            ManagerError::InvalidQueues { .. } => "invalid_queues",
            ManagerError::InvalidPrefix { .. } => "invalid_prefix",
            ManagerError::Duplicate { .. } => "duplicate",
            ManagerError::NotFound { .. } => "not_found",
            ManagerError::ExistsInStore { .. } => "volume_exists_in_store",
            ManagerError::GeometryMismatch { .. } => "geometry_mismatch",
            ManagerError::Failed { .. } => "volume_failed",
            ManagerError::Fenced { .. } => "fenced",
            ManagerError::OwnedElsewhere { .. } => "owned_elsewhere",
            ManagerError::StoreUnavailable { .. } => "store_unavailable",
            ManagerError::Device(DeviceLayerError::Unsupported(_)) => "unsupported_kernel",
            ManagerError::Device(DeviceLayerError::Failed { .. }) => "device_failed",
            ManagerError::ShuttingDown => "shutting_down",
            ManagerError::Internal(_) => "internal",
        }
    }

    /// Maps an engine error of operation `op` on volume `name` by its kind.
    pub fn from_volume(name: &str, op: &str, e: &VolumeError) -> Self {
        let message = format!("{op}: {e}");
        match (e, e.kind()) {
            (VolumeError::GeometryMismatch { .. }, _) => ManagerError::GeometryMismatch {
                name: name.to_string(),
                message,
            },
            (VolumeError::OwnedElsewhere { .. }, _) => ManagerError::OwnedElsewhere {
                name: name.to_string(),
                message: format!("{message} (attach with takeover to fence it)"),
            },
            (_, VolumeErrorKind::Fenced) => ManagerError::Fenced {
                name: name.to_string(),
                message,
            },
            (_, VolumeErrorKind::Unavailable) => ManagerError::StoreUnavailable {
                name: name.to_string(),
                message,
            },
            _ => ManagerError::Internal(format!("volume `{name}`: {message}")),
        }
    }
}
