//! The gate-level calls of the ublk target's non-blocking fast path (its queue's loop
//! thread), and of what it does with a ready plan or ticket: functions of a [`Volume`] on its
//! cache. None of them waits for a lock or does file I/O except where said.
//!
//! They are functions called by path (`glidefs_volume::fast_path::plan_read(&volume, ..)`),
//! as the cache's `glidefs_cache::read::plan_read` is, so that the calls alone lead a reader
//! from a request in the queue loop down to the cache.
//!
//! Contract: a plan or ticket is valid only under the [`Gate`] it was made with, and the
//! caller holds that gate until the bytes have moved (the rotation gate of the cache).

use glidefs_cache::{Commit, Gate, LockMode, ReadPlan, Result, WritePrep, WriteTicket};

use crate::volume::Volume;

/// The gate, if no rotation or eviction holds or waits for its write side.
pub fn try_enter(v: &Volume) -> Option<Gate> {
    v.shared.cache.try_enter()
}

/// Plans a read of `len` bytes at `offset` under `gate` into `plan` (cleared first).
pub fn plan_read(
    v: &Volume,
    gate: &Gate,
    offset: u64,
    len: u64,
    plan: &mut ReadPlan,
) -> Result<()> {
    glidefs_cache::read::plan_read(&v.shared.cache, gate, offset, len, plan)
}

/// Prepares a write without waiting: [`WritePrep::WouldBlock`] for a busy stripe lock or a
/// write that needs file I/O first (then run [`Volume::serve_write`]).
pub fn try_prepare_write(v: &Volume, gate: &Gate, offset: u64, len: u64) -> Result<WritePrep> {
    v.shared
        .cache
        .prepare_write(gate, offset, len, LockMode::Try)
}

/// Commits a landed write without file I/O, or hands the ticket back
/// ([`Commit::WouldBlock`]) to be committed with [`commit_write`] off the loop thread.
pub fn try_commit_write(v: &Volume, gate: &Gate, ticket: WriteTicket) -> Result<Commit> {
    v.shared.cache.try_commit_write(gate, ticket)
}

/// Commits a write whose bytes landed in `gate.active()` (may write the WAL: blocking).
pub fn commit_write(v: &Volume, gate: &Gate, ticket: WriteTicket) -> Result<()> {
    v.shared.cache.commit_write(gate, ticket, None)
}
