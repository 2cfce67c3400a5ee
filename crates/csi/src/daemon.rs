//! What the driver asks of a glidefs daemon, and how it finds the daemon to ask.
//!
//! The driver never opens a volume itself: every volume operation goes to a daemon's HTTP
//! API (the `glidefs` binary implements [`Daemon`] with its API client). The CSI
//! controller has a daemon of its own (no block devices) for volumes no node holds; a volume
//! a node holds is snapshotted and grown by that node's daemon, which the controller reaches
//! through the address the node registered in the store ([`crate::records::NodeRecord`]).
//!
//! Contract: errors carry the API's stable code (`glidefs/API.md`), which
//! [`DaemonError::status`] maps to a gRPC status; a transport failure is `unavailable`.

use std::sync::Arc;

use async_trait::async_trait;
use glidefs_model::api::QosLimits;

/// What a volume is opened as: a new volume, an existing one, or a clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeRequest {
    pub name: String,
    /// Bytes; `None` for an existing volume (the stored size) or a clone (the snapshot's).
    pub size: Option<u64>,
    pub block_size: Option<u32>,
    /// Open the volume the store has (never create one).
    pub attach_existing: bool,
    /// With `attach_existing`: fence the daemon that owns it.
    pub takeover: bool,
    /// `VOL@SNAP`: create the volume as a clone of that snapshot.
    pub from: Option<String>,
    /// Absolute path, on the daemon's host, of the volume's encryption key.
    pub encryption_key_file: Option<String>,
    /// `local` or `store` (see `Durability`).
    pub durability: Option<String>,
    pub read_only: bool,
    /// QoS limits for the volume's device (empty: none).
    pub qos: QosLimits,
}

/// How a daemon lets a volume go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Flushed to the store and released: the next open anywhere needs no takeover.
    Flush,
    /// Deleted from the store, with everything of it.
    Purge,
    /// Dropped without a flush (`force`): only for a handle another daemon has taken the
    /// volume from (fenced), whose writes can never reach the store anyway.
    Drop,
}

/// What the driver needs to know of an open volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFacts {
    pub name: String,
    pub size: u64,
    pub block_size: u32,
    /// `/dev/ublkbN`, when the daemon has a device for it.
    pub device: Option<String>,
    /// `running`, `fenced`, `failed`, `recovering`.
    pub state: String,
    pub read_only: bool,
}

/// A snapshot, as the daemon reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFacts {
    pub volume: String,
    pub name: String,
    pub size: u64,
    pub created_unix: u64,
}

/// A daemon call that failed: the API's stable code and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("glidefs daemon: {message} ({code})")]
pub struct DaemonError {
    /// The API's error code (`not_found`, `owned_elsewhere`, ...), or `unavailable` when the
    /// daemon could not be reached.
    pub code: String,
    pub message: String,
}

impl DaemonError {
    /// The daemon could not be reached (or answered something that is not the API).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            code: "unavailable".into(),
            message: message.into(),
        }
    }

    /// Whether the code is `code`.
    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }

    /// The gRPC status a CSI call answers with when this is why it failed.
    pub fn status(&self, what: &str) -> tonic::Status {
        use tonic::Code;
        let code = match self.code.as_str() {
            "not_found" | "snapshot_not_found" | "volume_not_in_store" => Code::NotFound,
            "owned_elsewhere" | "fenced" | "device_busy" | "snapshot_in_use"
            | "snapshot_attached" | "read_only" | "volume_failed" | "key_mismatch"
            | "geometry_mismatch" => Code::FailedPrecondition,
            "duplicate" | "volume_exists_in_store" | "snapshot_exists" => Code::AlreadyExists,
            "volume_closing" => Code::Aborted,
            "unavailable" | "not_ready" | "store_unavailable" | "too_many_open_files" => {
                Code::Unavailable
            }
            c if c.starts_with("invalid_") || c == "bad_request" => Code::InvalidArgument,
            "unsupported_kernel" => Code::FailedPrecondition,
            _ => Code::Internal,
        };
        tonic::Status::new(code, format!("{what}: {} ({})", self.message, self.code))
    }
}

/// The calls the driver makes on a daemon (its HTTP API, `glidefs/API.md`).
#[async_trait]
pub trait Daemon: Send + Sync + std::fmt::Debug {
    /// Whether the daemon answers and is ready (`/readyz`).
    async fn ready(&self) -> Result<bool, DaemonError>;
    /// `POST /v1/volumes`.
    async fn open(&self, req: &VolumeRequest) -> Result<VolumeFacts, DaemonError>;
    /// `GET /v1/volumes/{name}`: `None` when this daemon does not serve it.
    async fn show(&self, name: &str) -> Result<Option<VolumeFacts>, DaemonError>;
    /// `DELETE /v1/volumes/{name}` (see [`Close`]).
    async fn close(&self, name: &str, how: Close) -> Result<(), DaemonError>;
    /// `PUT /v1/volumes/{name}/qos`: replaces the volume's QoS limits, live.
    async fn set_qos(&self, name: &str, limits: &QosLimits) -> Result<(), DaemonError>;
    /// `POST /v1/volumes/{name}/resize`.
    async fn resize(&self, name: &str, size: u64) -> Result<VolumeFacts, DaemonError>;
    /// `POST /v1/volumes/{volume}/snapshots`.
    async fn snapshot(&self, volume: &str, name: &str) -> Result<SnapshotFacts, DaemonError>;
    /// `GET /v1/volumes/{volume}/snapshots/{name}`: `None` when there is none.
    async fn snapshot_info(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<Option<SnapshotFacts>, DaemonError>;
    /// `GET /v1/volumes/{volume}/snapshots`.
    async fn snapshots(&self, volume: &str) -> Result<Vec<SnapshotFacts>, DaemonError>;
    /// `DELETE /v1/volumes/{volume}/snapshots/{name}`.
    async fn delete_snapshot(&self, volume: &str, name: &str) -> Result<(), DaemonError>;
}

/// Opens a client of the daemon at `address` (what a node registered: `unix:PATH`,
/// `https://HOST:PORT`).
pub trait Connector: Send + Sync + std::fmt::Debug {
    fn connect(&self, address: &str) -> Result<Arc<dyn Daemon>, DaemonError>;
}
