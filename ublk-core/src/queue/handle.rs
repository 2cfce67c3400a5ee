//! Finishing requests from other threads: the queue handle and the deferred token.
//!
//! A [`QueueHandle`] is a channel sender plus the queue's eventfd. Posting a message writes
//! the eventfd, which completes the loop's poll request and wakes it out of
//! `io_uring_enter`; the loop then drains the channel. Messages carry the tag and the tag's
//! dispatch sequence number, so a message that arrives for a request that is no longer
//! waiting (a stale or duplicate post) is ignored instead of touching a reused tag.

use crate::io::{Action, Chunk, IoDesc};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

/// A non-blocking eventfd used to wake a queue loop.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd has no memory arguments; a non-negative return is a new fd we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Add one to the counter (wakes a poller). Never blocks: the counter cannot realistically
    /// overflow, and EAGAIN would mean it is already readable.
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to an fd we own.
        let _ = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                std::ptr::from_ref(&one).cast::<libc::c_void>(),
                8,
            )
        };
    }

    /// Reset the counter (no-op when it is already zero).
    pub(crate) fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local from an fd we own (non-blocking).
        let _ = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                std::ptr::from_mut(&mut value).cast::<libc::c_void>(),
                8,
            )
        };
    }

    pub(crate) fn raw(&self) -> i32 {
        self.0.as_raw_fd()
    }
}

/// A deferred request's outcome, posted to the loop; `K` is the target's keepalive type.
pub(crate) struct Posted<K> {
    pub(crate) tag: u16,
    pub(crate) seq: u32,
    pub(crate) action: Action,
    pub(crate) keepalive: Option<K>,
}

/// Cloneable, `Send + Sync` way into one queue loop from any thread. `K` is the keepalive
/// type of the queue's target ([`Target::Keepalive`](crate::Target::Keepalive)): what a
/// [`Deferred`] posts travels typed to the loop.
pub struct QueueHandle<K = ()> {
    tx: mpsc::Sender<Posted<K>>,
    wake: Arc<EventFd>,
    queue: u16,
    /// Cleared once the loop has returned (its ring closed): nothing posted is used.
    live: Arc<AtomicBool>,
}

// Not derived: a derive would require `K: Clone` / `K: Debug`.
impl<K> Clone for QueueHandle<K> {
    fn clone(&self) -> Self {
        QueueHandle {
            tx: self.tx.clone(),
            wake: Arc::clone(&self.wake),
            queue: self.queue,
            live: Arc::clone(&self.live),
        }
    }
}

impl<K> std::fmt::Debug for QueueHandle<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueHandle")
            .field("queue", &self.queue)
            .field("live", &self.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<K> QueueHandle<K> {
    pub(crate) fn new(
        tx: mpsc::Sender<Posted<K>>,
        wake: Arc<EventFd>,
        queue: u16,
    ) -> QueueHandle<K> {
        QueueHandle {
            tx,
            wake,
            queue,
            live: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Called by the queue thread once its loop has returned.
    pub(crate) fn mark_exited(&self) {
        self.live.store(false, Ordering::Release);
    }

    /// The queue this handle reaches.
    pub fn queue(&self) -> u16 {
        self.queue
    }

    /// Post a message and wake the loop. Returns false when the loop is gone (the request
    /// then died with the device; nothing else to do).
    fn post(&self, msg: Posted<K>) -> bool {
        let ok = self.tx.send(msg).is_ok();
        self.wake.wake();
        ok
    }
}

/// A request the target promised to finish later (from any thread).
///
/// Finish it exactly once with [`complete`](Deferred::complete),
/// [`submit`](Deferred::submit) or [`finish`](Deferred::finish). Dropping it unfinished (a
/// task that panicked or was cancelled) completes the request with `-EIO`, so no request is
/// ever left hanging in the kernel. `K` is the target's keepalive type.
pub struct Deferred<K = ()> {
    handle: QueueHandle<K>,
    io: IoDesc,
    seq: u32,
    done: bool,
}

impl<K> std::fmt::Debug for Deferred<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("handle", &self.handle)
            .field("io", &self.io)
            .field("seq", &self.seq)
            .field("done", &self.done)
            .finish()
    }
}

impl<K> Deferred<K> {
    /// The request.
    pub fn io(&self) -> &IoDesc {
        &self.io
    }

    /// Whether nobody waits for the answer any more: the queue loop that fetched the request
    /// has returned (a hand-off or stop left the request to the kernel, which reissues it to
    /// the successor or fails it). A target stops work done only for this answer (retries,
    /// fetches) and finishes the token without touching its data. Once true, stays true.
    pub fn is_abandoned(&self) -> bool {
        !self.handle.live.load(Ordering::Acquire)
    }

    /// Complete with `result` (bytes for READ/WRITE, 0 for others, `-errno`).
    pub fn complete(self, result: i32) {
        self.finish(Action::Complete(result), None);
    }

    /// Move data with `chunks`, holding `keepalive` until the commit.
    pub fn submit(self, chunks: Vec<Chunk>, keepalive: Option<K>) {
        self.finish(Action::Chunks(chunks), keepalive);
    }

    /// Hand `action` to the loop, holding `keepalive` until the commit.
    pub fn finish(mut self, action: Action, keepalive: Option<K>) {
        self.done = true;
        self.send(action, keepalive);
    }

    fn send(&self, action: Action, keepalive: Option<K>) {
        let posted = Posted {
            tag: self.io.tag,
            seq: self.seq,
            action,
            keepalive,
        };
        if !self.handle.post(posted) {
            tracing::debug!(
                queue = self.io.queue,
                tag = self.io.tag,
                "deferred result after queue exit dropped"
            );
        }
    }
}

impl<K> Drop for Deferred<K> {
    fn drop(&mut self) {
        if !self.done {
            tracing::warn!(
                queue = self.io.queue,
                tag = self.io.tag,
                "deferred request dropped unfinished: completing with -EIO"
            );
            self.send(Action::Complete(-libc::EIO), None);
        }
    }
}

/// Per-dispatch context handed to [`Target::dispatch`](crate::Target::dispatch) (and the
/// after-write hooks). `K` is the target's keepalive type.
pub struct DispatchCtx<'a, K = ()> {
    handle: &'a QueueHandle<K>,
    io: IoDesc,
    seq: u32,
    deferred: bool,
}

impl<K> std::fmt::Debug for DispatchCtx<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchCtx")
            .field("handle", self.handle)
            .field("io", &self.io)
            .field("seq", &self.seq)
            .field("deferred", &self.deferred)
            .finish()
    }
}

impl<'a, K> DispatchCtx<'a, K> {
    pub(crate) fn new(handle: &'a QueueHandle<K>, io: IoDesc, seq: u32) -> DispatchCtx<'a, K> {
        DispatchCtx {
            handle,
            io,
            seq,
            deferred: false,
        }
    }

    /// Take the token for finishing this request later; then return
    /// [`Dispatch::Deferred`](crate::Dispatch::Deferred).
    pub fn defer(&mut self) -> Deferred<K> {
        self.deferred = true;
        Deferred {
            handle: self.handle.clone(),
            io: self.io,
            seq: self.seq,
            done: false,
        }
    }

    /// A handle to this queue (for work not tied to this request).
    pub fn queue_handle(&self) -> &QueueHandle<K> {
        self.handle
    }

    pub(crate) fn took_deferred(&self) -> bool {
        self.deferred
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::IoOp;

    fn io(tag: u16) -> IoDesc {
        IoDesc {
            op: IoOp::Read,
            offset: 0,
            len: 4096,
            flags: 0,
            queue: 0,
            tag,
        }
    }

    fn handle() -> (QueueHandle, mpsc::Receiver<Posted<()>>) {
        let (tx, rx) = mpsc::channel();
        (
            QueueHandle::new(tx, Arc::new(EventFd::new().unwrap()), 0),
            rx,
        )
    }

    #[test]
    fn finished_token_posts_its_action_once() {
        let (h, rx) = handle();
        let mut ctx = DispatchCtx::new(&h, io(3), 9);
        let token = ctx.defer();
        assert!(ctx.took_deferred());
        std::thread::spawn(move || token.complete(4096))
            .join()
            .unwrap();
        let p = rx.try_recv().unwrap();
        assert_eq!((p.tag, p.seq), (3, 9));
        assert!(matches!(p.action, Action::Complete(4096)));
        assert!(rx.try_recv().is_err(), "exactly one post");
    }

    #[test]
    fn dropped_token_completes_with_eio() {
        let (h, rx) = handle();
        let token = DispatchCtx::new(&h, io(5), 1).defer();
        drop(token);
        let p = rx.try_recv().unwrap();
        assert_eq!(p.tag, 5);
        assert!(matches!(p.action, Action::Complete(e) if e == -libc::EIO));
    }

    #[test]
    fn eventfd_wakes_and_drains() {
        let e = EventFd::new().unwrap();
        e.wake();
        e.wake();
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live local.
        let n = unsafe { libc::read(e.raw(), std::ptr::from_mut(&mut v).cast(), 8) };
        assert_eq!((n, v), (8, 2));
        e.drain(); // already zero: must not block
    }
}
