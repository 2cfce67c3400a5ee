//! Queue loops that share threads: a [`LoopPool`] of a few threads serves the queues of
//! many devices, so threads do not grow with the device count.
//!
//! Each queue keeps everything it has in the thread-per-queue model: its own io_uring
//! (`/dev/ublkcN` as fixed file 0, zero-copy buffer slot = tag), its descriptor mapping, its
//! slots and its eventfd; the [`engine`](super::engine) is the same code. What changes is who
//! waits: instead of blocking in `io_uring_enter` on one ring, a pool thread waits in
//! `epoll_wait` on the eventfds of all its queues, and turns the queues that woke.
//!
//! Contracts:
//! - A queue's ring is built, armed, turned and closed on one pool thread (the kernel wants
//!   every command of a ublk queue from one task, and the ring is `SINGLE_ISSUER`).
//! - A queue's eventfd is both the ring's registered completion eventfd (the kernel writes
//!   it when it queues a completion or deferred completion work) and the wake-up of posts and
//!   stop requests. The pool watches it edge-triggered: every write is an event, whatever the
//!   counter holds, so the counter is never read (one syscall less per wake-up). A turn
//!   submits, runs the deferred completions (GETEVENTS) and processes them; `settle` then
//!   looks for work no future write announces. A write that lands after `epoll_wait`
//!   returned is reported by the next one, so no wake-up is lost between a turn and the next
//!   wait (see `QueueLoop::settle`).
//! - A stopping queue is turned at least every [`STOP_POLL`] (its drain deadline is a
//!   timer, not an event).
//! - A queue leaves the pool when its loop ends (every tag aborted by STOP_DEV or
//!   QUIESCE_DEV, or its stop flag): its ring fd is closed first, then its handle is marked
//!   exited, then its owner is told, in that order, so an owner that saw the end may close
//!   `/dev/ublkcN`. As when a queue thread exits, the kernel cancels the FETCHes still armed
//!   afterwards, in a worker of its own (a recovery waits for the device to be QUIESCED).
//! - What a queue does on its loop thread delays every queue of that thread: targets must not
//!   block there (the [`Target`] contract), and USER_COPY's copies, synchronous on the loop
//!   thread, delay the thread's other queues by as long as a copy from the target's file
//!   takes (a page-cache miss included). A thread of its own per queue (no pool) isolates
//!   devices from each other at the cost of a thread per queue.
//! - A panic outside a target's hooks (those are caught by the engine) would leave every
//!   device of the thread unserved: the process aborts, and the kernel holds the devices'
//!   I/O for the next server (USER_RECOVERY), as after a failed ring.

use super::engine::{LoopExit, Pace, QueueLoop};
use super::handle::{EventFd, QueueHandle};
use super::thread::{setup, ExitSignal, QueueSpec, QueueThread, Runner, Wiring, DRAIN_BUDGET};
use crate::error::{Error, Result};
use crate::target::Target;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How often a stopping queue is turned while it drains.
pub(crate) const STOP_POLL: Duration = Duration::from_millis(10);

/// The most threads a pool runs.
pub const MAX_POOL_THREADS: usize = 256;

/// A pool of queue-loop threads shared by devices (see the module docs). Cloning shares the
/// pool; its threads end once the last clone is gone and their queues have all left.
#[derive(Clone)]
pub struct LoopPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for LoopPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopPool")
            .field("threads", &self.inner.threads.len())
            .field("queues", &self.queues())
            .finish()
    }
}

impl PartialEq for LoopPool {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for LoopPool {}

struct PoolInner {
    threads: Vec<PoolThread>,
}

/// The caller's side of one pool thread.
struct PoolThread {
    tx: mpsc::Sender<AddQueue>,
    ctl: Arc<EventFd>,
    queues: Arc<AtomicUsize>,
    closing: Arc<AtomicBool>,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        for t in &self.threads {
            t.closing.store(true, Ordering::Release);
            t.ctl.wake();
        }
    }
}

/// Builds a queue's loop on the pool thread.
type AddQueue = (
    Box<dyn FnOnce() -> std::io::Result<Box<dyn Member>> + Send>,
    mpsc::SyncSender<std::io::Result<()>>,
);

impl LoopPool {
    /// Start `threads` loop threads (1..=[`MAX_POOL_THREADS`]), named `ublk-loop-N`.
    pub fn new(threads: usize) -> Result<LoopPool> {
        if !(1..=MAX_POOL_THREADS).contains(&threads) {
            return Err(Error::InvalidConfig(format!(
                "queue loop pool size {threads} is outside 1..={MAX_POOL_THREADS}"
            )));
        }
        let mut started = Vec::with_capacity(threads);
        for i in 0..threads {
            let fail = |source: std::io::Error| Error::PoolSetup { thread: i, source };
            let ctl = Arc::new(EventFd::new().map_err(fail)?);
            let epoll = Epoll::new().map_err(fail)?;
            epoll.add(ctl.raw(), CTL_KEY, false).map_err(fail)?;
            let (tx, rx) = mpsc::channel();
            let queues = Arc::new(AtomicUsize::new(0));
            let closing = Arc::new(AtomicBool::new(false));
            let (w_ctl, w_queues, w_closing) =
                (Arc::clone(&ctl), Arc::clone(&queues), Arc::clone(&closing));
            std::thread::Builder::new()
                .name(format!("ublk-loop-{i}"))
                .spawn(move || {
                    // Built here: its queues never leave this thread.
                    let mut worker = Worker {
                        epoll,
                        ctl: w_ctl,
                        rx,
                        queues: w_queues,
                        closing: w_closing,
                        members: Vec::new(),
                        free: Vec::new(),
                    };
                    worker.serve();
                })
                .map_err(fail)?;
            started.push(PoolThread {
                tx,
                ctl,
                queues,
                closing,
            });
        }
        Ok(LoopPool {
            inner: Arc::new(PoolInner { threads: started }),
        })
    }

    /// Threads in the pool.
    pub fn threads(&self) -> usize {
        self.inner.threads.len()
    }

    /// Queues the pool serves now.
    pub fn queues(&self) -> usize {
        self.inner
            .threads
            .iter()
            .map(|t| t.queues.load(Ordering::Relaxed))
            .sum()
    }

    /// Serve one queue on the least loaded thread; returns once its FETCHes are queued (or
    /// its setup failed), as `spawn_queue` does for a thread of its own.
    pub(crate) fn spawn_queue<T: Target>(
        &self,
        spec: QueueSpec,
        target: Arc<T>,
    ) -> Result<QueueThread<T::Keepalive>> {
        let wiring = Wiring::new(&spec)?;
        let exit = Arc::new(ExitSignal::default());
        let owner = wiring.owner(spec.queue, Runner::Pooled(Arc::clone(&exit), false));
        let thread = self
            .inner
            .threads
            .iter()
            .min_by_key(|t| t.queues.load(Ordering::Relaxed))
            .ok_or_else(|| {
                spec.setup_error(std::io::Error::other("the loop pool has no threads"))
            })?;
        let build = {
            let spec = spec.clone();
            move || -> std::io::Result<Box<dyn Member>> {
                let handle = wiring.handle.clone();
                let lp = setup(&spec, target, wiring, true)?;
                Ok(Box::new(Pooled {
                    lp: Some(lp),
                    pace: Pace::new(),
                    handle,
                    exit,
                }))
            }
        };
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        thread.queues.fetch_add(1, Ordering::Relaxed);
        let sent = thread.tx.send((Box::new(build), ready_tx));
        thread.ctl.wake();
        let ready = match sent {
            Ok(()) => ready_rx.recv().unwrap_or_else(|_| {
                Err(std::io::Error::other("the pool thread ended during setup"))
            }),
            Err(_) => Err(std::io::Error::other("the pool thread has ended")),
        };
        if let Err(e) = ready {
            thread.queues.fetch_sub(1, Ordering::Relaxed);
            return Err(spec.setup_error(e));
        }
        Ok(owner)
    }
}

/// One queue as its pool thread sees it (type-erased over the target).
trait Member {
    fn wake_fd(&self) -> RawFd;
    fn turn(&mut self) -> Option<LoopExit>;
    fn settle(&mut self) -> bool;
    fn stopping(&self) -> bool;
    /// The loop ended: close the ring, mark the handle exited, tell the owner.
    fn close(self: Box<Self>, exit: LoopExit);
}

struct Pooled<T: Target> {
    lp: Option<QueueLoop<T>>,
    pace: Pace,
    handle: QueueHandle<T::Keepalive>,
    exit: Arc<ExitSignal>,
}

impl<T: Target> Member for Pooled<T> {
    fn wake_fd(&self) -> RawFd {
        self.lp.as_ref().map_or(-1, QueueLoop::wake_fd)
    }

    fn turn(&mut self) -> Option<LoopExit> {
        let lp = self.lp.as_mut()?;
        lp.turn(&mut self.pace, DRAIN_BUDGET)
    }

    fn settle(&mut self) -> bool {
        self.lp.as_mut().is_some_and(|lp| lp.settle(&self.pace))
    }

    fn stopping(&self) -> bool {
        self.lp.as_ref().is_some_and(QueueLoop::stopping)
    }

    fn close(mut self: Box<Self>, exit: LoopExit) {
        drop(self.lp.take());
        self.handle.mark_exited();
        self.exit.set(Ok(exit));
    }
}

/// The epoll key of a pool thread's own control eventfd.
const CTL_KEY: u64 = u64::MAX;

struct Entry {
    member: Box<dyn Member>,
    /// Woken (its eventfd fired) or left with work by its last turn.
    ready: bool,
}

/// A pool thread's state.
struct Worker {
    epoll: Epoll,
    ctl: Arc<EventFd>,
    rx: mpsc::Receiver<AddQueue>,
    queues: Arc<AtomicUsize>,
    closing: Arc<AtomicBool>,
    members: Vec<Option<Entry>>,
    free: Vec<usize>,
}

impl Worker {
    fn serve(&mut self) {
        super::thread::mark_io_flusher();
        if catch_unwind(AssertUnwindSafe(|| self.serve_loop())).is_err() {
            let e = std::io::Error::other("a queue loop pool thread panicked");
            super::engine::ring_failed(&e);
        }
    }

    fn serve_loop(&mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut ctl_ready = true;
        loop {
            if ctl_ready {
                self.ctl.drain();
                while let Ok((build, ready)) = self.rx.try_recv() {
                    let _ = ready.send(self.add(build));
                }
            }
            if self.done() {
                return;
            }
            let (again, stopping) = self.turn_ready();
            // The pass may have closed the last queue of a dropped pool: nothing would wake
            // the wait below any more (the control eventfd is written only by live clones).
            if self.done() {
                return;
            }
            let timeout = if again {
                0
            } else if stopping {
                i32::try_from(STOP_POLL.as_millis()).unwrap_or(10)
            } else {
                -1
            };
            ctl_ready = false;
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => 0,
                Err(e) => super::engine::ring_failed(&e),
            };
            for ev in &events[..n] {
                let key = ev.u64;
                if key == CTL_KEY {
                    ctl_ready = true;
                } else if let Some(Some(entry)) = usize::try_from(key)
                    .ok()
                    .and_then(|i| self.members.get_mut(i))
                {
                    entry.ready = true;
                }
            }
        }
    }

    /// The pool was dropped and every queue of this thread has left.
    fn done(&self) -> bool {
        self.closing.load(Ordering::Acquire) && self.members.iter().all(Option::is_none)
    }

    /// Build a queue's loop here and start watching its eventfd.
    fn add(
        &mut self,
        build: Box<dyn FnOnce() -> std::io::Result<Box<dyn Member>> + Send>,
    ) -> std::io::Result<()> {
        let member = build()?;
        let index = self.free.pop().unwrap_or(self.members.len());
        let key = u64::try_from(index).unwrap_or(CTL_KEY);
        // On failure the member drops here: its ring closes and the kernel cancels the
        // FETCHes it queued.
        if let Err(e) = self.epoll.add(member.wake_fd(), key, true) {
            if index < self.members.len() {
                self.free.push(index);
            }
            return Err(e);
        }
        let entry = Entry {
            member,
            // The first turn processes what arming reaped.
            ready: true,
        };
        if index == self.members.len() {
            self.members.push(Some(entry));
        } else {
            self.members[index] = Some(entry);
        }
        Ok(())
    }

    /// Turn every queue that woke, has work left, or is stopping. Returns (some queue must
    /// turn again before the thread sleeps, some queue is stopping).
    fn turn_ready(&mut self) -> (bool, bool) {
        let (mut again, mut stopping) = (false, false);
        for index in 0..self.members.len() {
            let Some(entry) = self.members[index].as_mut() else {
                continue;
            };
            let member_stopping = entry.member.stopping();
            if !entry.ready && !member_stopping {
                continue;
            }
            let Some(exit) = entry.member.turn() else {
                entry.ready = entry.member.settle();
                again |= entry.ready;
                stopping |= member_stopping || entry.member.stopping();
                continue;
            };
            if let Some(entry) = self.members[index].take() {
                if let Err(e) = self.epoll.delete(entry.member.wake_fd()) {
                    tracing::warn!(error = %e, "removing a queue's eventfd from the pool's epoll failed");
                }
                self.free.push(index);
                self.queues.fetch_sub(1, Ordering::Relaxed);
                entry.member.close(exit);
            }
        }
        (again, stopping)
    }
}

/// An epoll instance watching eventfds for `EPOLLIN`.
struct Epoll(OwnedFd);

impl Epoll {
    fn new() -> std::io::Result<Epoll> {
        // SAFETY: no memory arguments; a non-negative return is a new fd we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watch `fd` under `key`; `edge`: report every write (`EPOLLET`) instead of "readable"
    /// (the reader then never needs to read the counter).
    fn add(&self, fd: RawFd, key: u64, edge: bool) -> std::io::Result<()> {
        let mut events = libc::EPOLLIN as u32;
        if edge {
            events |= libc::EPOLLET as u32;
        }
        let mut ev = libc::epoll_event { events, u64: key };
        // SAFETY: `ev` is a live local the kernel reads during the call; `fd` is an open
        // eventfd owned by the caller, which removes it (`delete`) before closing it.
        let rc = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn delete(&self, fd: RawFd) -> std::io::Result<()> {
        // SAFETY: EPOLL_CTL_DEL ignores the event argument (null is allowed since 2.6.9).
        let rc = unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wait up to `timeout_ms` (-1: no limit); returns how many of `events` were filled.
    fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> std::io::Result<usize> {
        let max = i32::try_from(events.len()).unwrap_or(i32::MAX);
        // SAFETY: the kernel writes at most `max` entries into `events`, which is live and
        // that long for the whole call.
        let n =
            unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(usize::try_from(n).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn pool_size_is_checked() {
        assert!(LoopPool::new(0).is_err());
        assert!(LoopPool::new(MAX_POOL_THREADS + 1).is_err());
        let pool = LoopPool::new(2).unwrap();
        assert_eq!((pool.threads(), pool.queues()), (2, 0));
        assert_eq!(pool.clone(), pool);
        assert_ne!(LoopPool::new(1).unwrap(), pool);
    }

    #[test]
    fn exit_signal_waits_for_the_end_or_the_deadline() {
        let s = Arc::new(ExitSignal::default());
        assert!(s
            .wait_until(Instant::now() + Duration::from_millis(20))
            .is_none());
        let t = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                s.set(Ok(LoopExit::Aborted));
            })
        };
        let got = s.wait_until(Instant::now() + Duration::from_secs(10));
        assert!(matches!(got, Some(Ok(LoopExit::Aborted))));
        t.join().unwrap();
    }

    /// A stand-in queue: its eventfd wakes the pool; its turn ends the loop once `end` is
    /// raised; `closed` records that the pool closed it.
    struct FakeQueue {
        wake: Arc<EventFd>,
        end: Arc<AtomicBool>,
        closed: Arc<AtomicBool>,
    }

    impl Member for FakeQueue {
        fn wake_fd(&self) -> RawFd {
            self.wake.raw()
        }

        fn turn(&mut self) -> Option<LoopExit> {
            self.end
                .load(Ordering::Acquire)
                .then_some(LoopExit::Stopped)
        }

        fn settle(&mut self) -> bool {
            self.wake.drain();
            false
        }

        fn stopping(&self) -> bool {
            false
        }

        fn close(self: Box<Self>, _exit: LoopExit) {
            self.closed.store(true, Ordering::Release);
        }
    }

    /// Adds a [`FakeQueue`] to thread `t` of `pool` the way `spawn_queue` adds a real one.
    fn add_fake(pool: &LoopPool, t: usize) -> (Arc<EventFd>, Arc<AtomicBool>, Arc<AtomicBool>) {
        let wake = Arc::new(EventFd::new().unwrap());
        let end = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicBool::new(false));
        let member = FakeQueue {
            wake: Arc::clone(&wake),
            end: Arc::clone(&end),
            closed: Arc::clone(&closed),
        };
        let thread = &pool.inner.threads[t];
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        thread.queues.fetch_add(1, Ordering::Relaxed);
        thread
            .tx
            .send((
                Box::new(move || Ok(Box::new(member) as Box<dyn Member>)),
                ready_tx,
            ))
            .unwrap();
        thread.ctl.wake();
        ready_rx.recv().unwrap().unwrap();
        (wake, end, closed)
    }

    /// The module's contract: a pool's threads end once the last clone is gone *and* their
    /// queues have all left. A queue that leaves after the pool was dropped must not leave
    /// its thread parked in `epoll_wait` forever (nothing writes the control eventfd any
    /// more, and the queue's own eventfd has just been removed from the epoll set).
    #[test]
    fn a_pool_thread_ends_when_its_last_queue_leaves_after_the_pool_was_dropped() {
        let pool = LoopPool::new(1).unwrap();
        let (wake, end, closed) = add_fake(&pool, 0);
        // The worker holds the other reference to its queue counter until it returns.
        let worker_alive = Arc::clone(&pool.inner.threads[0].queues);
        drop(pool);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            Arc::strong_count(&worker_alive),
            2,
            "the thread must keep serving its queue after the pool is dropped"
        );
        // The queue's loop ends (as after STOP_DEV or its stop flag).
        end.store(true, Ordering::Release);
        wake.wake();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !closed.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "the queue was never closed");
            std::thread::sleep(Duration::from_millis(5));
        }
        while Arc::strong_count(&worker_alive) > 1 {
            assert!(
                Instant::now() < deadline,
                "pool thread still running 5 s after its last queue left a dropped pool \
                 (parked in epoll_wait with nothing left to wake it: leaked)"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn edge_triggered_epoll_reports_every_write_without_a_read() {
        let ep = Epoll::new().unwrap();
        let e = EventFd::new().unwrap();
        ep.add(e.raw(), 3, true).unwrap();
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 4];
        e.wake();
        e.wake();
        assert_eq!(
            ep.wait(&mut events, 1000).unwrap(),
            1,
            "two writes before a wait: one event"
        );
        assert_eq!(
            ep.wait(&mut events, 0).unwrap(),
            0,
            "nothing new: no event, counter unread"
        );
        e.wake();
        assert_eq!(
            ep.wait(&mut events, 1000).unwrap(),
            1,
            "a write on a non-zero counter is an event"
        );
        let key = events[0].u64;
        assert_eq!(key, 3);
    }

    #[test]
    fn epoll_reports_a_written_eventfd_by_its_key() {
        let ep = Epoll::new().unwrap();
        let e = EventFd::new().unwrap();
        ep.add(e.raw(), 7, false).unwrap();
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 4];
        assert_eq!(ep.wait(&mut events, 0).unwrap(), 0);
        e.wake();
        assert_eq!(ep.wait(&mut events, 1000).unwrap(), 1);
        let key = events[0].u64;
        assert_eq!(key, 7);
        e.drain();
        assert_eq!(
            ep.wait(&mut events, 0).unwrap(),
            0,
            "level-triggered: drained"
        );
        ep.delete(e.raw()).unwrap();
    }
}
