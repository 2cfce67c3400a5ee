//! glidefs-volume: one volume = the local cache (glidefs-cache) in front of the object store
//! (glidefs-objstore): reads with cold fetches (coalesced, with sequential readahead), writes
//! with backfill of partially overwritten remote blocks, local FLUSH, flush to the store
//! (rotate, packs, manifest), eviction under a disk budget, crash recovery.
//!
//! Concurrency: `read`/`write` may run concurrently from many tasks; `sync_to_store` calls are
//! serialised by an async mutex; blocking file work of flushes runs on the blocking pool.

mod attempt;
mod base;
mod blocking;
mod compact;
mod config;
mod counters;
mod error;
pub mod fast_path;
mod fetch;
mod follow;
mod gc;
mod group;
mod grow;
mod io;
mod key_id;
mod open;
mod pins;
mod publisher;
mod readahead;
mod request;
mod shared;
mod snapshot;
mod stats;
mod sync;
mod volume;
mod warm;

pub use compact::{CompactOptions, CompactReport};
pub use config::{Durability, VolumeConfig};
pub use error::{Fence, Result, VolumeError, VolumeErrorKind};
pub use group::GroupFigures;
pub use request::{FirstAttempt, ReadyRead, Refused, RemotePiece, MAX_ATTEMPTS};
pub use stats::VolumeStats;
pub use sync::SyncReport;
pub use volume::Volume;
pub use warm::{
    RecordOptions, RecordedStatus, RecordingStatus, WarmReport, WarmStatus, MAX_WARM_WINDOW,
};

pub use glidefs_objstore::{
    CloneOrigin, GcOptions, GcReport, KeyError, KeyId, ManifestOwner, SnapshotInfo,
    SnapshotProblem, SnapshotRecord, VolumeKey, WarmSet, MAX_WARM_BLOCKS,
};

pub use glidefs_cache as cache;
/// Replacing a state file durably (tmp, fsync, rename, directory fsync), for the daemon's own
/// state files: [`durable::write_atomic`].
pub use glidefs_cache::durable;
