//! How a glidefs volume lives in an object store: immutable packs of compressed, checksummed
//! blocks, and one immutable manifest per generation mapping blocks to pack ranges.
//!
//! The engine (`glidefs-volume`) flushes by building packs ([`PackBuilder`]), uploading them
//! ([`VolumeStore::upload_packs`]), then publishing the next manifest
//! ([`VolumeStore::publish_manifest`]), which is fenced so that only one writer of a volume can
//! ever win a generation. Cold reads fetch exactly one entry ([`VolumeStore::read_block`]);
//! [`VolumeStore::gc`] reclaims what no manifest references. Byte formats: `FORMAT.md`; bucket
//! layout and fencing: `README.md`.
//!
//! Everything is async (tokio), `Send + Sync`, and returns [`ObjStoreError`], whose
//! [`ErrorKind`] tells the caller what to do.

mod compact;
mod compress;
mod config;
mod crypto;
mod error;
pub mod format;
mod gc;
pub mod invariants;
mod layout;
mod location;
mod manifest;
mod open;
mod pack;
mod publish;
mod retry;
mod snapshot;
mod store;
mod warmset;

pub use compact::StoredPack;
pub use compress::CompressionStats;
pub use config::{StoreConfig, MIN_GC_GRACE};
pub use crypto::{KeyError, KeyId, OpenError, VolumeKey, KEY_LEN, SEAL_OVERHEAD};
pub use error::{classify, ErrorKind, ObjStoreError, SnapshotProblem};
pub use format::FormatError;
pub use gc::{GcOptions, GcReport};
pub use layout::PACK_SUFFIX;
pub use location::{validate_volume_name, BlockIndex, BlockLocation, PackId};
pub use manifest::{
    validate_owner_id, Manifest, ManifestOwner, PackUse, COMPACT_SEGMENTS, MAX_OWNER_ID_LEN,
    MAX_REFERENCED_GENERATIONS, SEGMENT_BLOCKS,
};
pub use open::{
    open_store, put_integrity, ParseChoiceError, PutIntegrity, S3Checksum, S3Options,
    UnsignedPayload,
};
pub use pack::{EncodedPack, PackBuilder, DEFAULT_ZSTD_LEVEL};
pub use snapshot::{
    validate_snapshot_name, view_id, CloneOrigin, SnapshotInfo, SnapshotRecord, ViewEntry,
    ViewRegistration,
};
pub use store::VolumeStore;
pub use warmset::{WarmSet, MAX_WARM_BLOCKS};
