//! Injectable crash points at every durability edge.
//!
//! Each edge calls [`CrashHook::should_crash`]; when it answers `true` the operation "dies"
//! there: it returns [`crate::CacheError::Crashed`], the cache latches dead (every later call
//! fails, buffered WAL records are never written), and the test drops everything and reopens
//! from the same directory, exactly like a process that was killed at that instant.
//!
//! The same hook injects I/O faults ([`CrashHook::io_fault`]): the file operation fails with
//! the given error (ENOSPC, EIO) and the cache carries on, as it must on a full or failing
//! disk (cargo tests cannot fill a real filesystem).

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A durability edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// USER_COPY write: before the data reaches the cache file.
    BeforeDataWrite,
    /// USER_COPY write: data in the cache file, state not yet committed.
    AfterDataWrite,
    /// A state change was appended to the WAL buffer (not yet written or synced).
    AfterWalAppend,
    /// flush(): data files synced, WAL not yet synced.
    BeforeWalSync,
    /// flush(): WAL synced, not yet reported to the caller.
    AfterWalSync,
    /// Rotation: new active file created, rotation not yet logged.
    BeforeRotate,
    /// Flush to store: before a pack upload starts.
    BeforePackUpload,
    /// Flush to store: packs uploaded, manifest not yet published.
    AfterPackUpload,
    /// Flush to store: manifest published, blocks not yet marked clean.
    AfterManifestPublish,
    /// Flush to store: blocks marked clean and logged, flushing file not yet deleted.
    AfterFlushComplete,
    /// Checkpoint: snapshot taken, checkpoint file not yet written.
    BeforeCheckpoint,
    /// Checkpoint: checkpoint file renamed into place, old WAL segments not yet deleted.
    AfterCheckpoint,
    /// Eviction: evictions logged and synced, holes not yet punched.
    BeforeHolePunch,
}

impl CrashPoint {
    /// Every crash point, in declaration order (so a test that crosses them all cannot miss
    /// one added later).
    pub const ALL: [CrashPoint; 13] = [
        CrashPoint::BeforeDataWrite,
        CrashPoint::AfterDataWrite,
        CrashPoint::AfterWalAppend,
        CrashPoint::BeforeWalSync,
        CrashPoint::AfterWalSync,
        CrashPoint::BeforeRotate,
        CrashPoint::BeforePackUpload,
        CrashPoint::AfterPackUpload,
        CrashPoint::AfterManifestPublish,
        CrashPoint::AfterFlushComplete,
        CrashPoint::BeforeCheckpoint,
        CrashPoint::AfterCheckpoint,
        CrashPoint::BeforeHolePunch,
    ];
}

/// A write or sync of a cache file that an injected I/O fault can fail (see
/// [`CrashHook::io_fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoOp {
    /// Writing buffered WAL records out to the segment file.
    WalWrite,
    /// fdatasync of a WAL segment.
    WalSync,
    /// fdatasync of a data file (active, flushing, clean).
    DataSync,
    /// A plain write's data into the active file.
    DataWrite,
    /// Copying a Clean or Syncing block into the active file before a partial write.
    Promote,
    /// Staging a Syncing block into the clean file (`read_for_flush`).
    Stage,
    /// Storing a fetched block into the clean file (`fill_clean`).
    Fill,
    /// Reserving disk space for a new WAL segment (fallocate, see `wal`).
    WalReserve,
    /// Extending the active file to the end of a block a partial write lands in (`cover`).
    Cover,
    /// Punching the blocks of a zero-copy write dropped uncommitted (`write.rs`, `Abandon`);
    /// where it fails, zeros are written over them instead.
    AbandonPunch,
}

/// Decides whether the process "dies" at a crash point, and (tests) which file operations
/// fail as if the disk were full or broken.
pub trait CrashHook: Send + Sync + Debug {
    fn should_crash(&self, point: CrashPoint) -> bool;

    /// An error to fail `op` with before it touches the file (ENOSPC, EIO), or `None` to run
    /// it. Production: never.
    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        let _ = op;
        None
    }
}

/// Fails `op` when `hook` injects a fault for it.
pub(crate) fn check(hook: &dyn CrashHook, op: IoOp) -> std::io::Result<()> {
    match hook.io_fault(op) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Never crashes (production).
#[derive(Debug, Default)]
pub struct NoCrash;

impl CrashHook for NoCrash {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }
}

/// Crashes at the `nth` (0-based) time `point` is reached, then at every later edge.
#[derive(Debug)]
pub struct CrashAt {
    point: CrashPoint,
    nth: u64,
    seen: AtomicU64,
}

impl CrashAt {
    pub fn new(point: CrashPoint, nth: u64) -> Self {
        Self {
            point,
            nth,
            seen: AtomicU64::new(0),
        }
    }

    /// Whether the crash has fired.
    pub fn fired(&self) -> bool {
        self.seen.load(Ordering::Relaxed) > self.nth
    }
}

impl CrashHook for CrashAt {
    fn should_crash(&self, point: CrashPoint) -> bool {
        if self.fired() {
            return true;
        }
        if point == self.point {
            return self.seen.fetch_add(1, Ordering::Relaxed) >= self.nth;
        }
        false
    }
}

/// What an armed [`FaultOn`] does to its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultEffect {
    /// Fail it as a full cache file system would (`StorageFull`, "injected ENOSPC").
    NoSpace,
    /// Panic inside it (an attempt that dies half way, locks held).
    Panic,
}

/// Test hook: while armed, every `op` suffers `effect`; never crashes at a [`CrashPoint`].
#[derive(Debug)]
pub struct FaultOn {
    op: IoOp,
    effect: FaultEffect,
    armed: AtomicBool,
}

impl FaultOn {
    /// A disarmed hook for `op`.
    pub fn new(op: IoOp, effect: FaultEffect) -> Self {
        Self {
            op,
            effect,
            armed: AtomicBool::new(false),
        }
    }

    /// From now on, `op` suffers the effect.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// From now on, `op` runs normally.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }
}

impl CrashHook for FaultOn {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        if op != self.op || !self.armed.load(Ordering::SeqCst) {
            return None;
        }
        match self.effect {
            FaultEffect::NoSpace => Some(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "injected ENOSPC",
            )),
            FaultEffect::Panic => panic!("injected panic in {op:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_on_fails_only_its_op_and_only_while_armed() {
        let hook = FaultOn::new(IoOp::Fill, FaultEffect::NoSpace);
        assert!(check(&hook, IoOp::Fill).is_ok(), "disarmed");
        hook.arm();
        let err = check(&hook, IoOp::Fill).expect_err("armed");
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        assert!(check(&hook, IoOp::Promote).is_ok(), "another op");
        assert!(!hook.should_crash(CrashPoint::BeforeRotate));
        hook.disarm();
        assert!(check(&hook, IoOp::Fill).is_ok(), "disarmed again");
    }

    #[test]
    fn fault_on_panics_in_its_op_while_armed() {
        let hook = FaultOn::new(IoOp::Promote, FaultEffect::Panic);
        assert!(check(&hook, IoOp::Promote).is_ok());
        hook.arm();
        let died = std::panic::catch_unwind(|| check(&hook, IoOp::Promote));
        assert!(died.is_err(), "an armed Panic hook returned");
    }
}
