//! The ublk target for volumes: binds a [`glidefs_volume::Volume`] to a ublk-core device.
//!
//! [`VolumeTarget`](target::VolumeTarget) implements [`ublk_core::Target`] (`target.rs`, the
//! top of these files: each request's dispatch, to `read.rs` and `write.rs`);
//! [`VolumeDevice`](device::VolumeDevice) owns the device. `mod.rs` holds the state they all
//! share (`Inner`: the volume, the queues' tags and scratch, the counters). Both
//! transports use the same target: under zero-copy the queue runs the chunks as
//! `READ_FIXED`/`WRITE_FIXED`, under USER_COPY as pread/pwrite on the char device.
//!
//! Request paths:
//! - WRITE, inline fast path: `try_enter` gives a gate and `prepare_write(.., Try)` a ticket
//!   when no file I/O is needed first: one `write_from` chunk into the active file;
//!   `after_write` commits the ticket, on the loop thread when its blocks were all Dirty,
//!   else (a WAL record to write out) in the target's lane of the commit pool (`commit`).
//! - WRITE, slow path (gate contended, stripe busy, a promote of a Clean/Syncing block or a
//!   file extension before a partial write, cold partial block, ...): deferred to the
//!   blocking pool, which makes the request protocol's first attempt there
//!   (`Volume::serve_write_here`: gate + prepare); a write that needs a fetch goes on to the
//!   whole protocol on a runtime task (`Volume::serve_write`: missing blocks fetched with
//!   *no* gate held); then the same chunk and commit.
//! - READ: the plan of the cache under a gate; local sources and holes inline; any remote
//!   piece defers to the engine's request protocol (`Volume::serve_read`: blocks fetched with
//!   no gate held, re-planned under a fresh gate); the remote pieces are staged in the
//!   queue's scratch memfd and served from the files and the scratch slot.
//! - FLUSH and FUA (`make_durable`): deferred `Volume::flush_durable` (data + WAL on local
//!   disk; with `durability = store` also a group commit to the object store).
//! - DISCARD / WRITE_ZEROES: deferred zero writes (see `write`).
//! - QoS: a READ or WRITE the volume's limits hold back ([`crate::qos`]: the wait is known
//!   at dispatch) is deferred to a runtime task that sleeps the wait and then tries the fast
//!   path from there (`serve_throttled`: the same non-blocking `try_enter` and `Try` calls,
//!   its chunks submitted to the loop), else serves it as a deferred request
//!   (`Volume::serve_read` / `serve_write`); it holds its tag meanwhile, so
//!   the kernel's queue depth backs the guest off. A request is never failed for a limit.
//!   Once the device stops or detaches (`VolumeTarget::unthrottle`) no request waits: those
//!   waiting are served at once, so a wait longer than the stop's deadlines (a low rate)
//!   neither holds the stop up nor runs after it.
//!
//! Invariants:
//! - Rotation gate: every chunk that touches a cache file is submitted with the [`Gate`]
//!   it was planned under inside the request's keepalive ([`Keep`]), so the gate is held
//!   from dispatch (or from the deferred task's planning) until the request's COMMIT is
//!   queued; a WRITE's ticket is committed in `after_write` under that same gate. (The
//!   chunks themselves own their files, so an fd stays valid regardless; the gate is what
//!   keeps a rotation from moving the blocks underneath.)
//! - The loop thread never blocks: it only uses `try_enter`, `LockMode::Try`,
//!   `try_commit_write` and `try_lock`, and reads or writes no file itself (the data moves
//!   through the ring; under USER_COPY the transport's own copies are the exception);
//!   `enter()`, `prepare_write(.., Wait)`, flushes and fetches run on the runtime `rt`
//!   (blocking parts on its blocking pool), commits that write the WAL in the commit pool
//!   (never on the runtime, whose threads may all wait for the locks a commit holds). A
//!   gate is never held while awaiting something that may need the gate's write side
//!   (fetches run gate-free).
//! - Cold-read scratch: fetched bytes are staged in a per-queue memfd slot (`scratch`), never
//!   in the active cache file.
//! - Coverage: READ chunks are built by `plan::read_chunks`, which refuses plans that do not
//!   cover the request exactly; a WRITE is one chunk of the request's full length.
//! - No panics on the loop thread: unexpected states (unknown queue/tag, a WRITE landing
//!   without its write keepalive) complete the request with `-EIO` and log an error.
//! - Every request is recorded once in the stats (see [`crate::io_stats`]).
//! - `VolumeDevice::stop` waits (bounded) for deferred tasks to finish, so no task touches
//!   the volume after it returned.

mod commit;
#[cfg(test)]
mod commit_tests;
pub mod device;
#[cfg(test)]
mod keep_tests;
mod plan;
#[cfg(test)]
mod qos_tests;
mod read;
mod scratch;
pub mod target;
#[cfg(test)]
mod tests;
mod write;

pub use crate::io_stats::{IoStats, OpStats, IO_OPS};
pub use plan::PlanError;
pub use scratch::ScratchError;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_volume::cache::{Gate, ReadPlan, WriteTicket};
use glidefs_volume::{Refused, Volume, VolumeError};
use parking_lot::Mutex;
use ublk_core::{Dispatch, IoDesc, IoOp};

use crate::io_stats::IoRecorder;
use crate::qos::{Direction, Qos};
use commit::Committer;
use glidefs_model::log::chain;
use scratch::Scratch;

/// The target's deferred token and dispatch context (its keepalive type is [`Keep`]).
type Deferred = ublk_core::Deferred<Keep>;
type DispatchCtx<'a> = ublk_core::DispatchCtx<'a, Keep>;

/// What the fast path (`read::fast`, `write::fast`) made of a request.
enum Fast {
    /// Its chunks and keepalive, ready to run (counted as inline).
    Ready(Vec<ublk_core::Chunk>, Keep),
    /// It needs the deferred path (a busy gate or stripe, file I/O or a fetch first).
    Slow,
    /// It fails with `-EIO` (logged).
    Failed,
}

/// Per-tag state, touched by the queue's own loop thread (and read by nobody else).
#[derive(Debug, Default)]
struct TagState {
    /// Reused read plan of the inline path (no allocation once warm).
    plan: Mutex<ReadPlan>,
    /// Dispatch time, nanoseconds since `Inner::epoch`.
    started_ns: AtomicU64,
}

#[derive(Debug)]
struct QueueState {
    tags: Vec<TagState>,
    /// Made at the queue's first cold read (see `scratch`).
    scratch: std::sync::OnceLock<Scratch>,
    queue: u16,
    depth: u16,
    slot_bytes: u32,
}

impl QueueState {
    /// The queue's scratch memfd, made on first use (blocking pool: a cold read's plan).
    fn scratch(&self) -> Result<&Scratch, ScratchError> {
        if let Some(s) = self.scratch.get() {
            return Ok(s);
        }
        let made = Scratch::new(self.queue, self.depth, self.slot_bytes)?;
        // A racing maker's file wins; ours is dropped unused.
        Ok(self.scratch.get_or_init(|| made))
    }
}

/// Counts deferred tasks still running (see `VolumeDevice::stop`).
#[derive(Debug)]
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> InFlight {
        counter.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(counter))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a request keeps alive until its commit, the target's [`ublk_core::Target::Keepalive`]: the
/// gate its chunks were planned under; for a cold READ, the scratch slot of its remote
/// pieces (punched when the keepalive drops); for a WRITE, the ticket `after_write` commits
/// under that gate. Fields drop in order: a ticket dropped uncommitted with its keepalive
/// (a failed submit) punches what it may have landed while the gate still holds off rotation.
#[derive(Debug)]
pub struct Keep {
    ticket: Option<WriteTicket>,
    gate: Gate,
    _scratch: Option<scratch::SlotLease>,
}

impl Keep {
    fn read(gate: Gate, scratch: Option<scratch::SlotLease>) -> Keep {
        Keep {
            gate,
            _scratch: scratch,
            ticket: None,
        }
    }

    fn write(gate: Gate, ticket: WriteTicket) -> Keep {
        Keep {
            gate,
            _scratch: None,
            ticket: Some(ticket),
        }
    }
}

/// Shared state of the target (cloned into deferred tasks).
#[derive(Debug)]
struct Inner {
    volume: Arc<Volume>,
    rt: tokio::runtime::Handle,
    read_only: bool,
    queues: Vec<QueueState>,
    stats: IoRecorder,
    epoch: Instant,
    in_flight: Arc<AtomicUsize>,
    committer: Committer,
    /// The volume's QoS limits, checked at dispatch (`target`).
    qos: Qos,
    /// Set (for good) by `VolumeDevice::stop` and `detach` before the kernel's step: every
    /// QoS wait ends at once and none starts (`throttle_wait`), so a throttled request is
    /// served while the kernel still waits for it, not after the device is gone (a wait at
    /// a low rate outlasts STOP_DEV's deadline and the drain's).
    unthrottled: tokio::sync::watch::Sender<bool>,
    /// Bumped when the limits change (`VolumeTarget::set_qos`): the requests waiting are
    /// admitted again under the new limits (`throttle_wait`).
    qos_changes: tokio::sync::watch::Sender<u64>,
}

impl Inner {
    fn tag(&self, io: &IoDesc) -> Option<&TagState> {
        self.queues
            .get(usize::from(io.queue))?
            .tags
            .get(usize::from(io.tag))
    }

    fn queue(&self, io: &IoDesc) -> Option<&QueueState> {
        self.queues.get(usize::from(io.queue))
    }

    fn mark_start(&self, io: &IoDesc) {
        if let Some(t) = self.tag(io) {
            let ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
            t.started_ns.store(ns, Ordering::Relaxed);
        }
    }

    fn latency(&self, io: &IoDesc) -> Duration {
        let Some(t) = self.tag(io) else {
            return Duration::ZERO;
        };
        let start = Duration::from_nanos(t.started_ns.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(start)
    }

    /// Records the final `result` of `io` and returns it.
    fn finish(&self, io: &IoDesc, result: i32) -> i32 {
        let bytes = match io.op {
            IoOp::Flush => 0,
            _ => u64::from(io.len),
        };
        self.stats.record(io.op, bytes, result, self.latency(io));
        result
    }

    /// Completes `io` now on the loop thread with `result` (recorded).
    fn complete_now(&self, io: &IoDesc, result: i32) -> Dispatch<Keep> {
        IoRecorder::bump(&self.stats.inline, 1);
        Dispatch::complete(self.finish(io, result))
    }

    /// What the QoS limits make `io` wait, when anything (counted in the stats), and the
    /// limits' change count it was admitted under.
    fn throttle(&self, io: &IoDesc, dir: Direction) -> Option<(Duration, u64)> {
        if !self.qos.is_limited() {
            return None;
        }
        // Read before the admission: a change after it re-admits (`throttle_wait`).
        let admitted_at = self.qos_generation();
        let wait = self.qos.admit(dir, u64::from(io.len));
        if wait.is_zero() {
            return None;
        }
        IoRecorder::bump(&self.stats.throttled, 1);
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        IoRecorder::bump(&self.stats.throttled_ns, ns);
        Some((wait, admitted_at))
    }

    /// Sleeps the QoS wait of a request of `len` bytes (runtime task). Cut short once the
    /// target is stopping (`unthrottled`): the request is then served at once. When the
    /// limits change meanwhile, the request is admitted again under the new ones (the
    /// buckets were filled: see `crate::qos`) and waits what they say, if anything.
    /// `admitted_at` is the change count read at dispatch ([`Inner::qos_generation`]): a
    /// change between the dispatch and this task's start re-admits at once.
    async fn throttle_wait(&self, dir: Direction, len: u32, mut wait: Duration, admitted_at: u64) {
        let mut stopping = self.unthrottled.subscribe();
        let mut changes = self.qos_changes.subscribe();
        if *changes.borrow_and_update() != admitted_at {
            wait = self.qos.admit(dir, u64::from(len));
        }
        while !wait.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(wait) => return,
                _ = stopping.wait_for(|stopping| *stopping) => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    wait = self.qos.admit(dir, u64::from(len));
                }
            }
        }
    }

    /// Serves a throttled READ or WRITE once its wait is over (runtime task): on the fast
    /// path when it can, its chunks handed to the loop from here (no further hop, as a
    /// request that never waited), else on the deferred path (`read_cold`, `write_slow`).
    async fn serve_throttled(self: Arc<Self>, token: Deferred) {
        let io = *token.io();
        let fast = match io.op {
            IoOp::Read => read::fast(&self, &io),
            _ => write::fast(&self, &io),
        };
        match fast {
            Fast::Ready(chunks, keep) => token.submit(chunks, Some(keep)),
            Fast::Failed => self.complete_deferred(token, -libc::EIO),
            Fast::Slow if io.op == IoOp::Read => self.read_cold(token).await,
            Fast::Slow => self.write_slow(token).await,
        }
    }

    /// How many times the limits changed so far (read at dispatch, with the admission).
    fn qos_generation(&self) -> u64 {
        *self.qos_changes.borrow()
    }

    /// Checks the request's range against the volume's size now (it grows with a resize;
    /// the kernel never sends more, but a bad range must fail, not panic).
    fn in_range(&self, io: &IoDesc) -> bool {
        io.offset
            .checked_add(u64::from(io.len))
            .is_some_and(|end| end <= self.volume.size())
    }

    /// Takes `ctx`'s token for a deferred request (counted in the stats) and the guard that
    /// counts it as in flight until the work finishing it is dropped.
    fn take_token(&self, ctx: &mut DispatchCtx<'_>) -> (InFlight, Deferred) {
        IoRecorder::bump(&self.stats.deferred, 1);
        (InFlight::new(&self.in_flight), ctx.defer())
    }

    /// Defers `io` to the runtime: `f(inner, token)` finishes it.
    fn defer<F, Fut>(self: &Arc<Self>, ctx: &mut DispatchCtx<'_>, f: F) -> Dispatch<Keep>
    where
        F: FnOnce(Arc<Inner>, Deferred) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (guard, token) = self.take_token(ctx);
        let fut = f(Arc::clone(self), token);
        // On a runtime that shut down the task is dropped at once: its token then completes
        // the request with -EIO.
        drop(self.rt.spawn(async move {
            let _guard = guard;
            fut.await;
        }));
        Dispatch::Deferred
    }

    /// Defers `io` to the runtime's blocking pool: `f(inner, guard, token)` finishes it, or
    /// hands `guard` and `token` on to a runtime task.
    fn defer_blocking<F>(self: &Arc<Self>, ctx: &mut DispatchCtx<'_>, f: F) -> Dispatch<Keep>
    where
        F: FnOnce(Arc<Inner>, InFlight, Deferred) + Send + 'static,
    {
        let (guard, token) = self.take_token(ctx);
        let inner = Arc::clone(self);
        // On a runtime that shut down the closure is dropped at once: its token then
        // completes the request with -EIO. (Called on the loop thread: tokio queues the
        // closure under its pool's lock, never held across I/O, and starts a thread here
        // when none idles, a bounded stall after an idle spell, not a wait on a file.)
        drop(self.rt.spawn_blocking(move || f(inner, guard, token)));
        Dispatch::Deferred
    }

    /// Defers `io` to the target's lane of the commit pool, handed over from here:
    /// `f(inner, token)` finishes it (see `commit`). A panic in `f` drops the token: `-EIO`.
    fn defer_commit<F>(self: &Arc<Self>, ctx: &mut DispatchCtx<'_>, f: F) -> Dispatch<Keep>
    where
        F: FnOnce(Arc<Inner>, Deferred) + Send + 'static,
    {
        let (guard, token) = self.take_token(ctx);
        let inner = Arc::clone(self);
        self.committer.run(Box::new(move || {
            let _guard = guard;
            f(inner, token);
        }));
        Dispatch::Deferred
    }

    /// Fetches `blocks` concurrently (each filled Clean by the volume); the first error wins.
    /// Never called with a gate held.
    /// Fails a deferred request after `what` failed with `e` (logged, recorded).
    fn fail_deferred(&self, token: Deferred, what: &str, e: &VolumeError) {
        let io = *token.io();
        tracing::warn!(op = ?io.op, offset = io.offset, len = io.len, error = %chain(e), "{what} failed");
        self.complete_deferred(token, errno_of(e));
    }

    /// Fails a deferred request the engine's request protocol refused: with the error when
    /// the token came back (a token lost in a panicked task completes with -EIO on drop).
    fn refused(&self, refused: Refused<Deferred>, what: &str) {
        if let Some(token) = refused.state {
            self.fail_deferred(token, what, &refused.error);
        }
    }

    /// Completes a deferred request with `result` (recorded).
    fn complete_deferred(&self, token: Deferred, result: i32) {
        let io = *token.io();
        token.complete(self.finish(&io, result));
    }
}

/// The errno a failed request completes with.
fn errno_of(e: &VolumeError) -> i32 {
    use glidefs_volume::VolumeErrorKind;
    match e.kind() {
        VolumeErrorKind::InvalidInput => -libc::EINVAL,
        _ => -libc::EIO,
    }
}
