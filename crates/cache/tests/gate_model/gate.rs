//! The rotation gate of the model: a fair (writer-preferring) reader/writer lock built from
//! loom's `Mutex` + `Condvar`, guarding which data file is active and which is flushing.
//!
//! Mirrors `Arc<parking_lot::RwLock<Files>>` (`cache.rs::Cache::{enter, try_enter,
//! write_gate}`, `gate.rs::Gate`): parking_lot sets its writer bit before it waits for the
//! readers to leave, so once a writer is queued every new `read` waits and every `try_read`
//! fails. That fairness is what turns "take the gate again while holding a guard" into a
//! deadlock, so the model must have it too (loom's own `RwLock` does not promise it).

use loom::sync::{Condvar, Mutex};

/// `gate.rs::Files`: which data file (`data.<gen>`) is active and which is flushing. The
/// clean file is never replaced, so it is not part of the gate's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Files {
    pub(crate) active: usize,
    pub(crate) flushing: Option<usize>,
}

#[derive(Debug)]
struct Lock {
    readers: usize,
    writer: bool,
    /// Writers waiting for the readers to leave (parking_lot: the writer bit is already set).
    queued: usize,
    files: Files,
}

#[derive(Debug)]
pub(crate) struct FairGate {
    lock: Mutex<Lock>,
    cv: Condvar,
}

/// A read guard (`gate.rs::Gate`): the files as they were when it was taken; they cannot
/// change while any guard is held.
#[derive(Debug)]
pub(crate) struct Gate<'a> {
    gate: &'a FairGate,
    pub(crate) files: Files,
}

/// The write side (`gate.rs::WriteGate`); the files it changes are published when it drops.
#[derive(Debug)]
pub(crate) struct WriteGate<'a> {
    gate: &'a FairGate,
    pub(crate) files: Files,
}

impl FairGate {
    pub(crate) fn new(files: Files) -> Self {
        Self {
            lock: Mutex::new(Lock {
                readers: 0,
                writer: false,
                queued: 0,
                files,
            }),
            cv: Condvar::new(),
        }
    }

    /// `RwLock::read_arc` (`Cache::enter`): waits while a writer holds the lock *or waits
    /// for it*.
    pub(crate) fn read(&self) -> Gate<'_> {
        let mut l = self.lock.lock().unwrap();
        while l.writer || l.queued > 0 {
            l = self.cv.wait(l).unwrap();
        }
        l.readers += 1;
        Gate {
            gate: self,
            files: l.files,
        }
    }

    /// `RwLock::try_read_arc` (`Cache::try_enter`): never waits for the gate; `None` when a
    /// writer holds it or waits for it. (The inner mutex is only the model's bookkeeping.)
    pub(crate) fn try_read(&self) -> Option<Gate<'_>> {
        let mut l = self.lock.lock().unwrap();
        if l.writer || l.queued > 0 {
            return None;
        }
        l.readers += 1;
        Some(Gate {
            gate: self,
            files: l.files,
        })
    }

    /// `RwLock::write` (`Cache::write_gate`): queues (blocking new readers), then waits for
    /// the readers to leave.
    pub(crate) fn write(&self) -> WriteGate<'_> {
        let mut l = self.lock.lock().unwrap();
        l.queued += 1;
        while l.writer || l.readers > 0 {
            l = self.cv.wait(l).unwrap();
        }
        l.queued -= 1;
        l.writer = true;
        WriteGate {
            gate: self,
            files: l.files,
        }
    }
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return; // an invariant failed: the model is being torn down
        }
        let mut l = self.gate.lock.lock().unwrap();
        l.readers -= 1;
        if l.readers == 0 {
            self.gate.cv.notify_all();
        }
    }
}

impl Drop for WriteGate<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let mut l = self.gate.lock.lock().unwrap();
        l.writer = false;
        l.files = self.files;
        self.gate.cv.notify_all();
    }
}
