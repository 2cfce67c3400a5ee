//! Errors of the local cache, with a small kind a caller can act on.

use std::path::PathBuf;

use crate::crash::CrashPoint;

/// What a caller can do about a [`CacheError`]. The stable part of an error: callers match
/// every kind (a new kind is a change they must handle); [`CacheError`] itself is
/// `#[non_exhaustive]`, its variants carry detail for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheErrorKind {
    /// The request itself is wrong (range outside the volume, bad geometry).
    InvalidInput,
    /// Local bytes or metadata failed verification.
    Corrupt,
    /// The cache is closed, died at an injected crash point, or refuses writes because its
    /// volume was fenced by another writer; reopen it.
    Dead,
    /// The operation cannot run in the current state (e.g. a flush is already pending).
    Busy,
    /// The local disk failed.
    Io,
}

/// Errors of the local cache.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    #[error("cache I/O failed: {op} on `{path}`: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("range out of bounds: offset={offset} len={len} volume_size={size}")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("invalid geometry: {0}")]
    InvalidGeometry(String),
    #[error("geometry mismatch with cache dir `{path}`: stored {stored}, requested {requested}")]
    GeometryMismatch {
        path: PathBuf,
        stored: String,
        requested: String,
    },
    #[error("corrupt cache state in `{path}`: {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("checksum mismatch: block={block} page={page} expected={expected:#010x} found={found:#010x}")]
    ChecksumMismatch {
        block: u64,
        page: u32,
        expected: u32,
        found: u32,
    },
    #[error("cache died at injected crash point {0:?}")]
    Crashed(CrashPoint),
    #[error("cache is dead after an earlier fatal error; reopen it")]
    Dead,
    #[error("writes refused: the volume is fenced ({reason})")]
    Fenced { reason: String },
    #[error("a flush is already pending (flushing generation {gen}); complete it first")]
    FlushPending { gen: u64 },
    #[error("wrong buffer length: expected {expected}, got {got}")]
    BadLength { expected: usize, got: usize },
    #[error("cannot shrink the volume from {current} to {requested} bytes: a volume only grows")]
    Shrink { current: u64, requested: u64 },
}

impl CacheError {
    /// The actionable kind of this error.
    pub fn kind(&self) -> CacheErrorKind {
        match self {
            CacheError::OutOfRange { .. }
            | CacheError::InvalidGeometry(_)
            | CacheError::GeometryMismatch { .. }
            | CacheError::Shrink { .. }
            | CacheError::BadLength { .. } => CacheErrorKind::InvalidInput,
            CacheError::Corrupt { .. } | CacheError::ChecksumMismatch { .. } => {
                CacheErrorKind::Corrupt
            }
            CacheError::Crashed(_) | CacheError::Dead | CacheError::Fenced { .. } => {
                CacheErrorKind::Dead
            }
            CacheError::FlushPending { .. } => CacheErrorKind::Busy,
            CacheError::Io { .. } => CacheErrorKind::Io,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CacheError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

impl From<crate::durable::AtomicWriteError> for CacheError {
    /// The step becomes the operation, the replaced file the path.
    fn from(e: crate::durable::AtomicWriteError) -> Self {
        CacheError::io(e.step.as_str(), e.path, e.source)
    }
}

/// Result alias of this crate.
pub type Result<T, E = CacheError> = std::result::Result<T, E>;
