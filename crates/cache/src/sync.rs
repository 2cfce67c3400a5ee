//! The atomics and locks of the rotation gate (`gate`) and the block state map (`state`).
//!
//! A normal build re-exports std's atomics and parking_lot's locks: nothing but names. Under
//! `--cfg loom` (the model check, `tests/gate_model.rs`) the same names are loom's atomics
//! and locks built from loom's `Mutex` + `Condvar` with the parking_lot behaviour the protocol
//! relies on: the `RwLock` is fair (writer-preferring: with a writer queued every new `read`
//! waits and every `try_read` fails) and hands out owned read guards, and the stripe lock
//! hands out owned guards. `gate` and `state` take their atomics and locks from here only.

#[cfg(not(loom))]
mod imp {
    pub(crate) use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
    pub(crate) use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};

    /// An owned read guard (`RwLock::read_arc`).
    pub(crate) type ArcRwLockReadGuard<T> =
        parking_lot::ArcRwLockReadGuard<parking_lot::RawRwLock, T>;
    /// A lock that guards no data (a stripe lock).
    pub(crate) type UnitMutex = parking_lot::Mutex<()>;
    /// A guard of a [`UnitMutex`].
    pub(crate) type UnitGuard<'a> = parking_lot::MutexGuard<'a, ()>;
    /// An owned guard of a [`UnitMutex`] (`lock_arc`).
    pub(crate) type ArcUnitGuard = parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>;
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};

    use std::ops::{Deref, DerefMut};
    use std::sync::Arc;

    /// Mutual exclusion with parking_lot's interface (no poisoning).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }

    /// A lock that guards no data, with borrowed and owned guards (parking_lot's `lock`,
    /// `lock_arc`, `try_lock_arc`).
    #[derive(Debug, Default)]
    pub(crate) struct UnitMutex {
        held: loom::sync::Mutex<bool>,
        cv: loom::sync::Condvar,
    }

    impl UnitMutex {
        pub(crate) fn new(_: ()) -> Self {
            Self::default()
        }

        fn acquire(&self, wait: bool) -> bool {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            while *held {
                if !wait {
                    return false;
                }
                held = self.cv.wait(held).unwrap_or_else(|e| e.into_inner());
            }
            *held = true;
            true
        }

        fn release(&self) {
            if std::thread::panicking() {
                return; // the model failed and is being torn down
            }
            *self.held.lock().unwrap_or_else(|e| e.into_inner()) = false;
            self.cv.notify_all();
        }

        pub(crate) fn lock(&self) -> UnitGuard<'_> {
            self.acquire(true);
            UnitGuard(self)
        }

        pub(crate) fn lock_arc(self: &Arc<Self>) -> ArcUnitGuard {
            self.acquire(true);
            ArcUnitGuard(Arc::clone(self))
        }

        pub(crate) fn try_lock_arc(self: &Arc<Self>) -> Option<ArcUnitGuard> {
            self.acquire(false).then(|| ArcUnitGuard(Arc::clone(self)))
        }
    }

    #[derive(Debug)]
    pub(crate) struct UnitGuard<'a>(&'a UnitMutex);

    impl Drop for UnitGuard<'_> {
        fn drop(&mut self) {
            self.0.release();
        }
    }

    #[derive(Debug)]
    pub(crate) struct ArcUnitGuard(Arc<UnitMutex>);

    impl Drop for ArcUnitGuard {
        fn drop(&mut self) {
            self.0.release();
        }
    }

    /// The lock's bookkeeping. Readers share the value as an `Arc` snapshot; the writer takes
    /// it out (no reader holds a copy then) and puts it back when it is done.
    #[derive(Debug)]
    struct State<T> {
        readers: usize,
        writer: bool,
        /// Writers waiting for the readers to leave (parking_lot: the writer bit is set).
        queued: usize,
        value: Option<Arc<T>>,
    }

    /// A fair (writer-preferring) reader/writer lock with parking_lot's interface.
    #[derive(Debug)]
    pub(crate) struct RwLock<T> {
        state: loom::sync::Mutex<State<T>>,
        cv: loom::sync::Condvar,
    }

    const HELD: &str = "a guard holds the value until it is dropped";

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self {
                state: loom::sync::Mutex::new(State {
                    readers: 0,
                    writer: false,
                    queued: 0,
                    value: Some(Arc::new(value)),
                }),
                cv: loom::sync::Condvar::new(),
            }
        }

        fn state(&self) -> loom::sync::MutexGuard<'_, State<T>> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Waits while a writer holds the lock *or waits for it* (`wait`), or fails then.
        fn acquire_read(&self, wait: bool) -> Option<Arc<T>> {
            let mut s = self.state();
            while s.writer || s.queued > 0 {
                if !wait {
                    return None;
                }
                s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.readers += 1;
            s.value.clone()
        }

        fn release_read(&self, value: &mut Option<Arc<T>>) {
            if std::thread::panicking() {
                return;
            }
            drop(value.take()); // before the count: a writer unwraps the value at 0
            let mut s = self.state();
            s.readers -= 1;
            if s.readers == 0 {
                self.cv.notify_all();
            }
        }

        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            ReadGuard {
                value: self.acquire_read(true),
                lock: self,
            }
        }

        pub(crate) fn read_arc(self: &Arc<Self>) -> ArcRwLockReadGuard<T> {
            ReadGuard {
                value: self.acquire_read(true),
                lock: Arc::clone(self),
            }
        }

        pub(crate) fn try_read_arc(self: &Arc<Self>) -> Option<ArcRwLockReadGuard<T>> {
            Some(ReadGuard {
                value: Some(self.acquire_read(false)?),
                lock: Arc::clone(self),
            })
        }

        /// Queues (blocking new readers), then waits for the readers to leave.
        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            let mut s = self.state();
            s.queued += 1;
            while s.writer || s.readers > 0 {
                s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.queued -= 1;
            s.writer = true;
            let value = s.value.take().and_then(|v| Arc::try_unwrap(v).ok());
            RwLockWriteGuard { value, lock: self }
        }
    }

    /// A read guard holding its lock as `L`: a borrow or an `Arc`.
    pub(crate) struct ReadGuard<T, L: Deref<Target = RwLock<T>>> {
        value: Option<Arc<T>>,
        lock: L,
    }

    pub(crate) type RwLockReadGuard<'a, T> = ReadGuard<T, &'a RwLock<T>>;
    pub(crate) type ArcRwLockReadGuard<T> = ReadGuard<T, Arc<RwLock<T>>>;

    impl<T> ReadGuard<T, Arc<RwLock<T>>> {
        /// The lock this guard belongs to (parking_lot's `ArcRwLockReadGuard::rwlock`).
        pub(crate) fn rwlock(g: &Self) -> &Arc<RwLock<T>> {
            &g.lock
        }
    }

    impl<T, L: Deref<Target = RwLock<T>>> Deref for ReadGuard<T, L> {
        type Target = T;
        fn deref(&self) -> &T {
            self.value.as_deref().expect(HELD)
        }
    }

    impl<T, L: Deref<Target = RwLock<T>>> Drop for ReadGuard<T, L> {
        fn drop(&mut self) {
            self.lock.release_read(&mut self.value);
        }
    }

    pub(crate) struct RwLockWriteGuard<'a, T> {
        value: Option<T>,
        lock: &'a RwLock<T>,
    }

    impl<T> Deref for RwLockWriteGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.value.as_ref().expect(HELD)
        }
    }

    impl<T> DerefMut for RwLockWriteGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.value.as_mut().expect(HELD)
        }
    }

    impl<T> Drop for RwLockWriteGuard<'_, T> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                return;
            }
            let mut s = self.lock.state();
            s.writer = false;
            s.value = self.value.take().map(Arc::new);
            self.lock.cv.notify_all();
        }
    }
}

pub(crate) use imp::*;
