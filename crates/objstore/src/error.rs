//! Errors of this crate and the small [`ErrorKind`] a caller acts on.
//!
//! Every failure is an [`ObjStoreError`] whose message names the operation and the object or
//! volume involved. [`ObjStoreError::kind`] maps it to what the caller should do:
//! retry later ([`ErrorKind::Transient`]), give up on this writer ([`ErrorKind::Fenced`]),
//! treat data as lost or damaged ([`ErrorKind::Corrupt`]), fix the request
//! ([`ErrorKind::InvalidInput`]), or report ([`ErrorKind::Permanent`], [`ErrorKind::NotFound`]).
//!
//! Transient vs permanent for object store errors is decided in exactly one place,
//! [`classify`]: `NotFound` is NotFound; `AlreadyExists`/`Precondition` are conflicts (the
//! manifest publisher turns them into `Fenced`); a `Generic` error is transient when its source
//! chain holds an `std::io::Error` of a network-ish kind (reset, refused, aborted, timed out,
//! broken pipe, unexpected EOF, interrupted, would-block, not connected) or no `io::Error` at all
//! (HTTP stores report 5xx and connection failures that way after their own retries); any other
//! `io::Error` kind (permission denied, disk full, invalid data, ...) is permanent, as are the
//! remaining variants (permission, authentication, invalid path, not supported, ...).

use crate::crypto::{KeyId, OpenError};

/// What a caller should do about an error. The stable part of an error: callers match every
/// kind (a new kind is a change they must handle); [`ObjStoreError`] itself is
/// `#[non_exhaustive]`, its variants carry detail for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The store may succeed later (network, throttling, 5xx); retrying is safe.
    Transient,
    /// The object does not exist.
    NotFound,
    /// Another writer published a newer manifest; this writer must stop writing the volume.
    Fenced,
    /// Stored bytes failed a magic, version, length or checksum check.
    Corrupt,
    /// The request itself is wrong (bad name, bad size, manifest violating an invariant).
    InvalidInput,
    /// The store refused for good (permissions, configuration, unsupported operation).
    Permanent,
}

/// How an `object_store::Error` should be treated; see the module docs.
pub fn classify(err: &object_store::Error) -> ErrorKind {
    use object_store::Error as E;
    match err {
        E::NotFound { .. } => ErrorKind::NotFound,
        E::AlreadyExists { .. } | E::Precondition { .. } => ErrorKind::Fenced,
        E::Generic { .. } | E::JoinError { .. } => match first_io_kind(err) {
            None => ErrorKind::Transient,
            Some(kind) if is_transient_io(kind) => ErrorKind::Transient,
            Some(_) => ErrorKind::Permanent,
        },
        _ => ErrorKind::Permanent,
    }
}

fn is_transient_io(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        kind,
        K::ConnectionReset
            | K::ConnectionRefused
            | K::ConnectionAborted
            | K::NotConnected
            | K::TimedOut
            | K::BrokenPipe
            | K::UnexpectedEof
            | K::Interrupted
            | K::WouldBlock
    )
}

fn first_io_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut current = err.source();
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        current = e.source();
    }
    None
}

/// Every error this crate returns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjStoreError {
    /// An object store call failed (after retries, if it was retryable).
    #[error("object store {op} failed: path=`{path}` attempts={attempts}: {source}")]
    Store {
        /// The call: "put", "get_range", "head", "list", "delete", ...
        op: &'static str,
        /// The object or prefix.
        path: String,
        /// How many times it was tried.
        attempts: u32,
        /// The last error.
        #[source]
        source: object_store::Error,
    },
    /// A newer manifest exists: another writer owns the volume now.
    #[error(
        "manifest publish fenced: volume=`{volume}` generation={generation} latest={latest}: {reason}"
    )]
    Fenced {
        /// The volume.
        volume: String,
        /// The generation this writer tried to publish.
        generation: u64,
        /// The newest generation in the store as far as this writer knows.
        latest: u64,
        /// Why the publish was refused.
        reason: &'static str,
    },
    /// Stored bytes failed verification.
    #[error("corrupt object: path=`{path}`: {source}")]
    Corrupt {
        /// The object that failed.
        path: String,
        /// What check failed.
        #[source]
        source: FormatError,
    },
    /// The volume's objects are encrypted with another key than the one given (or encrypted
    /// and no key was given, or not encrypted and a key was given).
    #[error("encryption key mismatch: path=`{path}`: {source}")]
    KeyMismatch {
        /// The object whose key id was checked.
        path: String,
        /// `FormatError::KeyMismatch`, with the stored and the given key ids.
        #[source]
        source: FormatError,
    },
    /// The caller asked for something that cannot be done.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A manifest references a pack that is not in the store.
    #[error(
        "manifest publish refused: volume=`{volume}` generation={generation} references missing pack `{pack}`"
    )]
    MissingPack {
        /// The volume.
        volume: String,
        /// The generation being published.
        generation: u64,
        /// The pack that was not found.
        pack: String,
    },
    /// A snapshot operation was refused.
    #[error("snapshot `{volume}@{name}`: {problem}")]
    Snapshot {
        /// The snapshot's volume.
        volume: String,
        /// The snapshot's name.
        name: String,
        /// What is wrong.
        problem: SnapshotProblem,
    },
    /// An object store URL could not be turned into a store.
    #[error("cannot open object store `{url}`: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// zstd could not set up or run compression (never stored raw behind the caller's back).
    #[error("zstd {op} failed (level {level}): {source}")]
    Compression {
        /// What zstd was doing (`create compressor`, `compress block N`).
        op: String,
        /// The compression level asked for.
        level: i32,
        #[source]
        source: std::io::Error,
    },
}

/// Why a snapshot operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotProblem {
    #[error("no such snapshot")]
    NotFound,
    #[error("a snapshot of that name exists")]
    Exists,
    #[error("the name must be 1..=128 characters of [A-Za-z0-9._-] and not `.`/`..`")]
    InvalidName,
    #[error("it is being deleted")]
    Deleting,
    #[error("clones use it: {}; remove (purge) them first", clones.join(", "))]
    HasClones { clones: Vec<String> },
    #[error("clones are being created from it: {}; try again when they are done", clones.join(", "))]
    ClonesInCreation { clones: Vec<String> },
    #[error("read-only views attach it, held by {}; detach them first (an operator may clear a dead holder's registrations, or wait for their lease to expire)", holders.join(", "))]
    Attached { holders: Vec<String> },
    #[error("the clone's creation outlasted its deadline ({secs} s) before it published; nothing was created")]
    CloneDeadline { secs: u64 },
}

impl ObjStoreError {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ObjStoreError::Store { source, .. } => match classify(source) {
                // A conflict outside of a publish is not a fencing decision.
                ErrorKind::Fenced => ErrorKind::Permanent,
                kind => kind,
            },
            ObjStoreError::Fenced { .. } => ErrorKind::Fenced,
            ObjStoreError::Corrupt { .. } => ErrorKind::Corrupt,
            ObjStoreError::InvalidInput(_)
            | ObjStoreError::KeyMismatch { .. }
            | ObjStoreError::MissingPack { .. }
            | ObjStoreError::BadUrl { .. } => ErrorKind::InvalidInput,
            ObjStoreError::Compression { .. } => ErrorKind::Permanent,
            ObjStoreError::Snapshot { problem, .. } => match problem {
                SnapshotProblem::NotFound => ErrorKind::NotFound,
                _ => ErrorKind::InvalidInput,
            },
        }
    }

    /// Stored bytes failed a check: `Corrupt`, or `KeyMismatch` when the check that failed
    /// is the key id's.
    pub(crate) fn corrupt(path: impl Into<String>, source: FormatError) -> Self {
        match source {
            FormatError::KeyMismatch { .. } => ObjStoreError::KeyMismatch {
                path: path.into(),
                source,
            },
            source => ObjStoreError::Corrupt {
                path: path.into(),
                source,
            },
        }
    }

    /// The key ids of a [`ObjStoreError::KeyMismatch`]: (stored in the object, given).
    pub fn key_mismatch(&self) -> Option<(Option<KeyId>, Option<KeyId>)> {
        match self {
            ObjStoreError::KeyMismatch {
                source: FormatError::KeyMismatch { stored, given, .. },
                ..
            } => Some((*stored, *given)),
            _ => None,
        }
    }
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Fewer bytes than the format needs.
    #[error("{what}: truncated: need {need} bytes, have {have}")]
    Truncated {
        /// The record being decoded.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// The magic number is wrong: not our record, or garbage.
    #[error("{what}: bad magic {found:02x?}")]
    BadMagic {
        /// The record being decoded.
        what: &'static str,
        /// The bytes found where the magic belongs.
        found: Vec<u8>,
    },
    /// A version this build does not understand.
    #[error("{what}: unsupported version {version}")]
    UnsupportedVersion {
        /// The record being decoded.
        what: &'static str,
        /// The version found.
        version: u32,
    },
    /// A checksum does not match the bytes it covers.
    #[error("{what}: crc32c mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The record being decoded.
        what: &'static str,
        /// The checksum recorded in the bytes (or the location).
        stored: u32,
        /// The checksum of the bytes as read.
        computed: u32,
    },
    /// The object is encrypted with another key than the one given, or is encrypted and no
    /// key was given, or is not encrypted and a key was given.
    #[error(
        "{what}: {} but {}",
        describe_stored(.stored),
        describe_given(.given)
    )]
    KeyMismatch {
        /// The record being decoded.
        what: &'static str,
        /// The key id the object records (`None`: not encrypted).
        stored: Option<KeyId>,
        /// The id of the key given (`None`: no key).
        given: Option<KeyId>,
    },
    /// An encrypted record failed authentication under the right key id: the bytes, or the
    /// context they are bound to (block, segment, generation), were changed.
    #[error("{what}: {source}")]
    Decrypt {
        /// The record being decoded.
        what: &'static str,
        /// The failure.
        #[source]
        source: OpenError,
    },
    /// A field holds a value the format forbids.
    #[error("{what}: invalid field: {detail}")]
    Invalid {
        /// The record being decoded.
        what: &'static str,
        /// Which field and which value.
        detail: String,
    },
}

fn describe_stored(stored: &Option<KeyId>) -> String {
    match stored {
        Some(id) => format!("is encrypted with key id {id}"),
        None => "is not encrypted".to_string(),
    }
}

fn describe_given(given: &Option<KeyId>) -> String {
    match given {
        Some(id) => format!("the key given has id {id}"),
        None => "no key was given".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(kind: std::io::ErrorKind) -> object_store::Error {
        object_store::Error::Generic {
            store: "test",
            source: Box::new(std::io::Error::new(kind, "boom")),
        }
    }

    #[test]
    fn classification_follows_io_kind_and_variant() {
        assert_eq!(
            classify(&generic(std::io::ErrorKind::ConnectionReset)),
            ErrorKind::Transient
        );
        assert_eq!(
            classify(&generic(std::io::ErrorKind::TimedOut)),
            ErrorKind::Transient
        );
        assert_eq!(
            classify(&generic(std::io::ErrorKind::PermissionDenied)),
            ErrorKind::Permanent
        );
        let opaque = object_store::Error::Generic {
            store: "S3",
            source: "server returned 503".into(),
        };
        assert_eq!(classify(&opaque), ErrorKind::Transient);
        let nf = object_store::Error::NotFound {
            path: "x".into(),
            source: "gone".into(),
        };
        assert_eq!(classify(&nf), ErrorKind::NotFound);
        let denied = object_store::Error::PermissionDenied {
            path: "x".into(),
            source: "no".into(),
        };
        assert_eq!(classify(&denied), ErrorKind::Permanent);
        let exists = object_store::Error::AlreadyExists {
            path: "x".into(),
            source: "exists".into(),
        };
        assert_eq!(classify(&exists), ErrorKind::Fenced);
        let wrapped = ObjStoreError::Store {
            op: "put",
            path: "x".into(),
            attempts: 1,
            source: exists,
        };
        assert_eq!(wrapped.kind(), ErrorKind::Permanent);
    }
}
