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
use std::ops::Deref;
use std::sync::Arc;

use parking_lot::{ArcRwLockReadGuard, RawRwLock};

/// The files of one cache directory at one moment.
#[derive(Debug)]
pub struct Files {
    pub(crate) active: Arc<File>,
    pub(crate) active_gen: u64,
    pub(crate) flushing: Option<Arc<File>>,
    pub(crate) flushing_gen: Option<u64>,
    pub(crate) clean: Arc<File>,
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

    pub fn active_gen(&self) -> u64 {
        self.active_gen
    }
}

/// An owned read guard on the rotation gate.
pub struct Gate(pub(crate) ArcRwLockReadGuard<RawRwLock, Files>);

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

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static<T: Send + 'static>() {}

    #[test]
    fn gate_is_a_keepalive() {
        assert_send_static::<Gate>();
    }
}
