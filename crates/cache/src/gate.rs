//! The rotation gate: the cache files behind an `Arc<RwLock<..>>` that hands out owned guards.
//!
//! Every I/O that touches the active, flushing or clean file holds a [`Gate`] (an owned read
//! guard) for as long as the kernel may still move data into or out of those files; for the
//! zero-copy transport that is from SQE submission until the completion is committed, so a
//! `Gate` is `Send + 'static` and can be parked in an in-flight slot as a keepalive.
//! Rotation, flush completion, eviction and checkpoints take the write side.
//!
//! Rule: code that holds a `Gate` passes it down and never locks again. parking_lot's lock is
//! fair: with a writer queued, a second `read` from a thread that already holds a guard waits
//! for the writer, which waits for the first guard: deadlock.

use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::crcs::PageCrcs;
use crate::sync::{
    ArcRwLockReadGuard, AtomicU64, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// The files of one cache directory at one moment.
#[derive(Debug)]
pub struct Files {
    pub(crate) active: Arc<File>,
    pub(crate) active_gen: u64,
    pub(crate) flushing: Option<Arc<File>>,
    pub(crate) flushing_gen: Option<u64>,
    pub(crate) clean: Arc<File>,
    /// Known page CRCs of the active file (moved into the rotation by `rotate`, see `crcs`).
    pub(crate) crcs: Arc<PageCrcs>,
    /// Those of the flushing file, while a flush is pending (promotions copy from them).
    pub(crate) flushing_crcs: Option<Arc<PageCrcs>>,
}

impl Files {
    /// The active file: Dirty blocks at offset `block * block_size` (= the device offset).
    pub fn active(&self) -> &File {
        &self.active
    }

    /// The flushing file (Syncing blocks), while a flush is pending.
    pub fn flushing(&self) -> Option<&File> {
        self.flushing.as_deref()
    }

    /// The clean file: Clean blocks (flushed or fetched), same layout.
    pub fn clean(&self) -> &File {
        &self.clean
    }

    /// [`active`](Files::active) as its shared handle: for a holder that must keep the file
    /// open by itself, beyond the gate (a ublk chunk owns a clone of its file).
    pub fn active_arc(&self) -> &Arc<File> {
        &self.active
    }

    /// [`flushing`](Files::flushing) as its shared handle (see [`active_arc`](Files::active_arc)).
    pub fn flushing_arc(&self) -> Option<&Arc<File>> {
        self.flushing.as_ref()
    }

    /// [`clean`](Files::clean) as its shared handle (see [`active_arc`](Files::active_arc)).
    pub fn clean_arc(&self) -> &Arc<File> {
        &self.clean
    }

    pub fn active_gen(&self) -> u64 {
        self.active_gen
    }
}

/// The rotation gate: the lock over the cache's [`Files`] and its write-side hold times.
#[derive(Debug)]
pub(crate) struct RotationGate {
    lock: Arc<RwLock<Files>>,
    holds: HoldCounters,
}

impl RotationGate {
    pub(crate) fn new(files: Files) -> Self {
        Self {
            lock: Arc::new(RwLock::new(files)),
            holds: HoldCounters::default(),
        }
    }

    /// Enters the gate without waiting; `None` when a writer holds or waits for it.
    pub(crate) fn try_enter(&self) -> Option<Gate> {
        self.lock.try_read_arc().map(Gate)
    }

    /// Enters the gate, waiting for a writer if needed.
    pub(crate) fn enter(&self) -> Gate {
        Gate(self.lock.read_arc())
    }

    /// A brief read of the files (a borrowed guard: not a [`Gate`] to pass down).
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Files> {
        self.lock.read()
    }

    /// Takes the write side (stalls all I/O until dropped); the hold is timed.
    pub(crate) fn write(&self, who: Holder) -> WriteGate<'_> {
        WriteGate::new(self.lock.write(), who, &self.holds)
    }

    pub(crate) fn holds(&self) -> GateHolds {
        self.holds.snapshot()
    }

    /// Whether `gate` was taken from this gate.
    pub(crate) fn owns(&self, gate: &Gate) -> bool {
        Arc::ptr_eq(ArcRwLockReadGuard::rwlock(&gate.0), &self.lock)
    }
}

/// An owned read guard on the rotation gate.
pub struct Gate(pub(crate) ArcRwLockReadGuard<Files>);

impl Deref for Gate {
    type Target = Files;
    fn deref(&self) -> &Files {
        &self.0
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("active_gen", &self.active_gen)
            .finish()
    }
}

/// Who holds the write side of the gate (every holder stalls all I/O of the volume).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    Rotate = 0,
    CompleteFlush = 1,
    Evict = 2,
    Checkpoint = 3,
}

/// How long the write side of the gate was held: the last and the longest hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldTime {
    pub last: Duration,
    pub max: Duration,
}

/// Write-gate hold times per holder since the cache was opened (the I/O stall each causes,
/// not counting the wait for in-flight I/O to leave the gate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateHolds {
    pub rotate: HoldTime,
    pub complete_flush: HoldTime,
    pub evict: HoldTime,
    pub checkpoint: HoldTime,
}

/// Hold-time counters, nanoseconds: `[holder][last, max]`.
#[derive(Debug, Default)]
pub(crate) struct HoldCounters([[AtomicU64; 2]; 4]);

impl HoldCounters {
    fn record(&self, who: Holder, held: Duration) {
        let ns = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX);
        let [last, max] = &self.0[who as usize];
        last.store(ns, Ordering::Relaxed);
        max.fetch_max(ns, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> GateHolds {
        let get = |who: Holder| {
            let [last, max] = &self.0[who as usize];
            HoldTime {
                last: Duration::from_nanos(last.load(Ordering::Relaxed)),
                max: Duration::from_nanos(max.load(Ordering::Relaxed)),
            }
        };
        GateHolds {
            rotate: get(Holder::Rotate),
            complete_flush: get(Holder::CompleteFlush),
            evict: get(Holder::Evict),
            checkpoint: get(Holder::Checkpoint),
        }
    }
}

/// The write side of the gate, timed: the hold is recorded when it is dropped.
pub(crate) struct WriteGate<'a> {
    guard: RwLockWriteGuard<'a, Files>,
    since: Instant,
    who: Holder,
    counters: &'a HoldCounters,
}

impl<'a> WriteGate<'a> {
    pub(crate) fn new(
        guard: RwLockWriteGuard<'a, Files>,
        who: Holder,
        counters: &'a HoldCounters,
    ) -> Self {
        Self {
            guard,
            since: Instant::now(),
            who,
            counters,
        }
    }
}

impl Deref for WriteGate<'_> {
    type Target = Files;
    fn deref(&self) -> &Files {
        &self.guard
    }
}

impl DerefMut for WriteGate<'_> {
    fn deref_mut(&mut self) -> &mut Files {
        &mut self.guard
    }
}

impl Drop for WriteGate<'_> {
    fn drop(&mut self) {
        self.counters.record(self.who, self.since.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static<T: Send + 'static>() {}

    #[test]
    fn gate_is_a_keepalive() {
        assert_send_static::<Gate>();
    }
}
