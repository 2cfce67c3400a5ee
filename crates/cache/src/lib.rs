//! glidefs-cache: the local write cache of one volume — block state map, cache files,
//! rotation gate, write-ahead log, checkpoints. No async, no object store, no kernel.
//!
//! Layout of a cache directory:
//! - `data.<gen>`: the active file (Dirty blocks) and, during a flush, the flushing file
//!   (Syncing blocks); sparse, block `b` at offset `b * block_size`;
//! - `clean.data`: Clean blocks (flushed or fetched), same layout;
//! - `wal.<segment>`: the write-ahead log; `checkpoint`: the state map at a WAL sequence;
//! - `boot_id`: the boot of the machine that wrote the log (tells power loss from a process
//!   crash at recovery, see `boot`).
//!
//! `checkpoint` and `boot_id` are replaced with [`durable::write_atomic`] (tmp, fsync, rename,
//! directory fsync), which the volume and the daemon use for their state files too.
//!
//! Durability contract: `Cache::flush` returns only after every write completed before it is
//! on local disk; `Cache::open` rebuilds exactly the state of the durable log, so every write
//! acknowledged by a completed flush survives a crash. Writes not covered by a completed flush
//! may be lost after a crash, block by block: a block then reads as its previous version (a
//! process crash never yields torn or zeroed bytes for it). Against power loss the same holds
//! for every block whose state an unflushed write changed (recovery after a reboot applies
//! only WAL records whose data a sync made durable, see `cache`); unflushed writes into an
//! already-Dirty block may be torn per page (ordinary block-device semantics).
//!
//! The gate-level API (`try_enter`, `prepare_write`, `commit_write`, [`read::plan_read`]) is shaped for
//! the zero-copy transport; `read_into` / `write` are the plain paths (USER_COPY, tests).

mod boot;
mod cache;
mod checkpoint;
pub mod crash;
mod crcs;
#[cfg(test)]
mod durability_tests;
pub mod durable;
mod error;
mod evict;
mod files;
mod flush;
mod gate;
mod geometry;
mod grow;
#[cfg(loom)]
pub mod loom_api;
#[cfg(loom)]
mod loom_faults;
pub mod read;
mod rotation;
mod space;
mod state;
mod sync;
mod sys;
mod wal;
mod write;
mod zero;

pub use cache::{Cache, CacheMemory, CacheOptions, CacheStats};
pub use crash::{CrashAt, CrashHook, CrashPoint, FaultEffect, FaultOn, IoOp, NoCrash};
pub use error::{CacheError, CacheErrorKind, Result};
pub use evict::FillToken;
pub use gate::{Files, Gate, GateHolds, HoldTime};
pub use geometry::{Geometry, DEFAULT_BLOCK_SIZE, PAGE_SIZE};
pub use read::{Fetched, ReadOutcome, ReadPlan, Segment, Source};
pub use rotation::Rotation;
pub use state::{BlockInfo, BlockState};
pub use write::{Commit, LockMode, WriteOutcome, WritePrep, WriteTicket};
