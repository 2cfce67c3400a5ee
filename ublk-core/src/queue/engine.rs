//! The queue loop shared by both transports.
//!
//! One loop owns one io_uring (`SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN`) with
//! `/dev/ublkcN` as fixed file 0, driven by one thread: its own (`run`: the thread waits in
//! `io_uring_enter`) or a pool thread (`turn` + `settle`: the thread waits in `epoll_wait` on
//! the eventfds of many loops, see [`super::pool`]). Per tag the loop keeps a [`Slot`]:
//!
//! ```text
//! Armed --FETCH cqe--> dispatch --Inline(Complete)-----------------> commit --> Armed
//!                               \--Inline(Chunks)--> InChunks --all done--> hooks, commit
//!                                \--Deferred------> Deferred --posted action--> (as Inline)
//!                 InChunks --WRITE done--> after_write --> Deferred (commit off the loop) / landed
//!                 landed --FUA WRITE--> make_durable --> Deferred / commit
//! Armed --UBLK_IO_RES_ABORT--> Gone (the device is stopping; the tag never returns)
//! Armed --request while stopping--> Parked (left unanswered for the successor)
//! ```
//!
//! Invariants:
//! - Only `UBLK_IO_RES_ABORT` retires a tag. Any other negative command result is logged and
//!   leaves the tag unarmed without ending the loop.
//! - A request's chunks (each owning its file) and its keepalive live in its slot from
//!   acceptance of the action until the chunks are all reaped (the kernel moves no more data
//!   for it); a WRITE's keepalive is then handed to `Target::after_write`, which may keep it
//!   past the loop (a commit deferred off it).
//! - The loop never blocks on anything but `io_uring_enter` (pooled: the pool's
//!   `epoll_wait`); it is woken by its own completions or by the eventfd (deferred results,
//!   stop): polled inside the ring, or, pooled, registered as the ring's completion eventfd
//!   and watched by the pool. While the poll is not armed (re-arming it failed) every wait
//!   is bounded (10 ms) and re-arming is retried, so a deferred result is never left unseen.
//! - A failing ring ends the loop: an `io_uring_enter` error other than the transient ones
//!   (EINTR, EBUSY, EAGAIN, ETIME) is retried [`RING_RETRIES`] times, then the loop aborts
//!   the process, its slots still alive (`queue::ring_failed`): a queue that can no longer
//!   serve must not leave its device LIVE with requests nobody answers. The kernel
//!   then holds the device's I/O (USER_RECOVERY) for the next server, as after a `kill -9`.
//!   The CQ needs no worst-case size for correctness: the kernel keeps overflowing
//!   completions (IORING_FEAT_NODROP) and answers EBUSY, on which the loop reaps. With
//!   BATCH_IO that holds too, but at a cost: the multishot FETCH's completions never
//!   overflow; one that does not fit (or finds an overflow pending) ends the FETCH with
//!   -ENOBUFS (its tags stay queued in the driver), and the loop resets the fetch buffer ring
//!   and re-arms it ([`super::batch`]). A CQ that stays full would make that repeat; it is
//!   bounded and logged.
//! - A slot's `seq` grows with every request, so a deferred post for an older request of the
//!   same tag is recognised and dropped.
//! - Chunks are validated before any starts: each must match the op's direction and stay
//!   inside the request, and together they must cover a READ/WRITE exactly; otherwise the
//!   request completes with an error and no byte moves.
//! - A COMMIT the ring refuses is kept and pushed again before the next wait: a tag is never
//!   lost to a full or failing submission queue.
//! - Stopping (the owner's flag; the kernel's QUIESCE_DEV or STOP_DEV instead abort the tags
//!   and need no flag): requests fetched from then on are parked unanswered (with
//!   `USER_RECOVERY_REISSUE` the kernel hands them to the successor); requests already
//!   dispatched are finished — chunks always, deferred ones for up to the drain budget — and
//!   every queued COMMIT is submitted before the loop returns. A slot's keepalive is never
//!   dropped while its chunks may still run: the loop waits for every chunk completion, and
//!   the slots outlive the ring.
//!
//! With `UBLK_F_BATCH_IO` ([`super::batch`]) the slots are the same; what changes is how they
//! meet the driver. `Armed` means "idle in the driver" (all tags are PREPed at setup); a
//! multishot FETCH delivers the tags of new requests, and every `commit` of a pass is
//! gathered and sent as one COMMIT_IO_CMDS at the end of it (after the completions and the
//! posts were processed). Differences from the per-tag commands:
//! - STOP_DEV / QUIESCE_DEV end the FETCH with `UBLK_IO_RES_ABORT`; the loop leaves by itself
//!   (`Aborted`) once nothing it holds or sent is unanswered. A FETCH the driver is busy
//!   delivering at that moment is not aborted, so, as with the per-tag commands after a
//!   QUIESCE_DEV, the owner's stop flags end the loop then.
//!   A FETCH re-armed after them is refused with `-ENODEV`, which is that same result.
//! - A FETCH that ends otherwise (`-ENOBUFS`, a completion the driver could not post) is
//!   armed again before the next wait, after its buffer ring is reset; while stopping it is
//!   not, and the requests the driver still queues go to the successor (reissued), as parked
//!   ones do.
//! - A COMMIT the driver handles only in part names the element it refused (dropped and
//!   logged; the tag is not ours, so its slot stays `Armed`); the elements after it are sent
//!   again. One that fails as a whole is sent again whole, a bounded number of times (then
//!   dropped: its tags left `Unarmed`, logged). While a COMMIT is in flight the loop's wait is
//!   bounded (1 ms), so what is sent again does not wait for unrelated traffic.

use super::batch::{Batch, CommitDone, Fetched};
use super::cmd::{self, CmdEncoding, CqeKind, IoCmd};
use super::handle::{DispatchCtx, EventFd, Posted, QueueHandle};
use super::iod::IodArea;
use super::user_copy::UserCopy;
use super::zero_copy;
use crate::io::ChunkStart;
use crate::target::{Action, Chunk, Dispatch, IoDesc, IoOp, Target};
use io_uring::{opcode, types, IoUring};
use libublk::sys;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// A FETCH / COMMIT_AND_FETCH is queued in the kernel; no request.
    Armed,
    /// The target holds a `Deferred` token.
    Deferred,
    /// Chunks in flight.
    InChunks,
    /// The command failed with a result other than ABORT; no request, not armed.
    Unarmed,
    /// Aborted by the kernel: the device is going away.
    Gone,
    /// Fetched while stopping: left unanswered for the successor.
    Parked,
}

struct Slot<K> {
    state: SlotState,
    seq: u32,
    io: Option<IoDesc>,
    pending: u32,
    first_err: i32,
    bytes_done: u64,
    bytes_expected: u64,
    /// The request's chunks, from their start until the last one is reaped: each owns its
    /// file (see [`Chunk`]), so the fd in a chunk's SQE stays open and names that file until
    /// its completion.
    chunks: Vec<Chunk>,
    keepalive: Option<K>,
    /// Which answer a `Deferred` slot waits for.
    awaits: Awaits,
}

/// What a deferred request's posted action answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaits {
    /// [`Target::dispatch`]: chunks or a result.
    Dispatch,
    /// [`Target::after_write`]: the write's result once committed (a FUA write then goes
    /// to `make_durable`).
    Landed,
    /// [`Target::make_durable`]: the final result.
    Durable,
}

/// How data moves for this queue.
pub(crate) enum Plane {
    /// Kernel zero-copy; `zero` is `/dev/zero`, the source of [`Chunk::Zeros`].
    ZeroCopy {
        zero: std::fs::File,
    },
    UserCopy(UserCopy),
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopExit {
    /// Every tag was aborted by the kernel (the device was stopped).
    Aborted,
    /// The owner asked the loop to stop (device left for a successor, or a forced stop).
    Stopped,
}

/// Consecutive failed waits on the ring after which the loop gives up (see the module docs).
const RING_RETRIES: u32 = 3;

/// BATCH_IO: the longest wait while a COMMIT_IO_CMDS is in flight (1 ms): a part of it the
/// driver did not handle is sent again by then even on an idle queue.
const COMMIT_WAIT_NS: u32 = 1_000_000;

/// A loop's timers and counters across waits (or, pooled, across turns).
pub(crate) struct Pace {
    /// Until when a stopping loop waits for deferred requests.
    deferred_deadline: Option<Instant>,
    last_report: Instant,
    failed_waits: u32,
    /// A pooled loop's first turn processes what `arm` reaped.
    first: bool,
}

impl Pace {
    pub(crate) fn new() -> Pace {
        Pace {
            deferred_deadline: None,
            last_report: Instant::now(),
            failed_waits: 0,
            first: true,
        }
    }
}

pub(crate) struct QueueLoop<T: Target> {
    // Drop order: the ring first (cancels whatever the kernel still holds), then the
    // descriptor mapping.
    ring: IoUring,
    iod: IodArea,
    enc: CmdEncoding,
    plane: Plane,
    target: Arc<T>,
    slots: Vec<Slot<T::Keepalive>>,
    handle: QueueHandle<T::Keepalive>,
    rx: mpsc::Receiver<Posted<T::Keepalive>>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    aborted: usize,
    cqes: Vec<(u64, i32, u32)>,
    /// COMMITs the ring refused, pushed again before the next wait.
    unsent: VecDeque<(u16, i32)>,
    /// The eventfd poll is queued (false after a failed re-arm, until a retry succeeds).
    wake_armed: bool,
    /// Requests dispatched, and the injected-fault threshold
    /// ([`crate::QueueOptions::fault_ring_after`]).
    dispatched: u64,
    fault_after: Option<u64>,
    /// Served by a pool thread ([`super::pool`]): the eventfd is the ring's registered
    /// completion eventfd, watched by the pool, instead of a poll inside the ring.
    pooled: bool,
    /// `UBLK_F_BATCH_IO` ([`super::batch`]): requests come from one multishot FETCH and a
    /// turn's results go out in one COMMIT_IO_CMDS. Declared after `ring`, so dropped after
    /// it (the ring reads its buffers until it closes).
    batch: Option<Batch>,
    /// Tags of the fetch completion being processed (reused).
    fetched: Vec<u16>,
}

pub(crate) struct LoopParts<T: Target> {
    pub(crate) ring: IoUring,
    pub(crate) iod: IodArea,
    pub(crate) enc: CmdEncoding,
    pub(crate) plane: Plane,
    pub(crate) target: Arc<T>,
    pub(crate) depth: u16,
    pub(crate) handle: QueueHandle<T::Keepalive>,
    pub(crate) rx: mpsc::Receiver<Posted<T::Keepalive>>,
    pub(crate) wake: Arc<EventFd>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) fault_after: Option<u64>,
    pub(crate) pooled: bool,
    pub(crate) batch: Option<Batch>,
}

impl<T: Target> QueueLoop<T> {
    pub(crate) fn new(p: LoopParts<T>) -> QueueLoop<T> {
        let slots = (0..p.depth)
            .map(|_| Slot {
                state: SlotState::Armed,
                seq: 0,
                io: None,
                pending: 0,
                first_err: 0,
                bytes_done: 0,
                bytes_expected: 0,
                chunks: Vec::new(),
                keepalive: None,
                awaits: Awaits::Dispatch,
            })
            .collect();
        QueueLoop {
            ring: p.ring,
            iod: p.iod,
            enc: p.enc,
            plane: p.plane,
            target: p.target,
            slots,
            handle: p.handle,
            rx: p.rx,
            wake: p.wake,
            stop: p.stop,
            aborted: 0,
            cqes: Vec::with_capacity(usize::from(p.depth) * 2),
            unsent: VecDeque::new(),
            wake_armed: true,
            dispatched: 0,
            fault_after: p.fault_after,
            pooled: p.pooled,
            batch: p.batch,
            fetched: Vec::new(),
        }
    }

    /// Queue a FETCH for every tag and the eventfd poll (pooled: register the eventfd as
    /// the ring's completion eventfd instead), submit, and report any command the kernel
    /// rejected at once (so the device is never started with a queue that cannot serve).
    pub(crate) fn arm(&mut self) -> std::io::Result<()> {
        if self.pooled {
            // Before the FETCHes: every completion from the first one on writes it.
            self.ring.submitter().register_eventfd(self.wake.raw())?;
        }
        if let Some(batch) = &mut self.batch {
            batch.arm(&mut self.ring)?;
        } else {
            for tag in 0..self.slots.len() {
                let tag = u16::try_from(tag).unwrap_or(u16::MAX);
                cmd::push(&mut self.ring, &self.enc.sqe(IoCmd::Fetch, tag, -1))?;
            }
        }
        if !self.pooled {
            self.arm_wake()?;
        }
        self.ring.submit()?;
        // Early rejections complete inline; look without waiting (`run` processes the rest).
        self.reap();
        for &(ud, res, _) in &self.cqes {
            let kind = cmd::decode(ud).0;
            if matches!(kind, Some(CqeKind::Cmd | CqeKind::Fetch)) && res < 0 {
                return Err(std::io::Error::from_raw_os_error(-res));
            }
        }
        Ok(())
    }

    fn arm_wake(&mut self) -> std::io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(self.wake.raw()), libc::POLLIN as u32)
            .build()
            .user_data(cmd::user_data(CqeKind::Wake, 0));
        cmd::push(&mut self.ring, &sqe)
    }

    /// Serve requests until every tag is aborted or the stop flag is raised. After the flag:
    /// park new requests, finish dispatched ones (chunks always; deferred ones for up to
    /// `drain`), submit every queued COMMIT, then return (see the module docs).
    pub(crate) fn run(mut self, drain: Duration) -> std::io::Result<LoopExit> {
        self.process_cqes();
        let mut pace = Pace::new();
        let exit = loop {
            if let Some(exit) = self.before_wait(&mut pace, drain) {
                break exit;
            }
            let waited = if self.fault_due() {
                Err(std::io::Error::from_raw_os_error(libc::EBADFD))
            } else if self.stop.load(Ordering::Acquire) || !self.wake_armed {
                let ts = types::Timespec::new().nsec(10_000_000);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            } else {
                // A batch COMMIT completes as it is submitted: waiting for its completion too
                // would return at once, so the wait is for one completion more (see
                // `Batch::commits_in_flight`). Its completion may refuse part of it (the rest
                // queued again) or fail it as a whole: with nothing else to come that would
                // wait for unrelated traffic, so while commits are in flight the wait is
                // bounded and the next pass sends what was queued again.
                let commits = self.batch.as_ref().map_or(0, Batch::commits_in_flight);
                if commits > 0 {
                    let ts = types::Timespec::new().nsec(COMMIT_WAIT_NS);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1 + commits, &args)
                } else {
                    self.ring.submit_and_wait(1)
                }
            };
            self.after_wait(waited, &mut pace);
        };
        self.finish();
        Ok(exit)
    }

    /// One pass of a pooled loop (see [`super::pool`]): the checks `run` makes before it
    /// waits, then submit what is queued and run the ring's deferred completions without
    /// waiting, then process them. `Some` once the loop has ended (its last COMMITs
    /// submitted); the caller then drops it, which closes the ring.
    pub(crate) fn turn(&mut self, pace: &mut Pace, drain: Duration) -> Option<LoopExit> {
        if pace.first {
            pace.first = false;
            self.process_cqes();
        }
        if let Some(exit) = self.before_wait(pace, drain) {
            self.finish();
            return Some(exit);
        }
        let idle = {
            let sq = self.ring.submission();
            sq.is_empty() && !sq.taskrun() && !sq.cq_overflow()
        };
        let waited = if self.fault_due() {
            Err(std::io::Error::from_raw_os_error(libc::EBADFD))
        } else if idle {
            // Nothing to submit and no deferred completion queued (IORING_SETUP_TASKRUN_FLAG:
            // the kernel sets SQ_TASKRUN before it writes the eventfd): no syscall.
            Ok(0)
        } else {
            // `submit` enters with GETEVENTS when SQ_TASKRUN or an overflow is flagged, which
            // runs the deferred completions.
            self.ring.submit()
        };
        self.after_wait(waited, pace);
        None
    }

    /// After a pooled turn: say whether the loop has work that no future wake-up announces
    /// (so it must turn again before the pool sleeps). The pool watches the eventfd
    /// edge-triggered, so anything that lands after its `epoll_wait` returned (a post, a
    /// completion, deferred completion work) is reported by the next one; what this looks
    /// for is work already there: queued SQEs, refused COMMITs, unreaped completions, the
    /// kernel's SQ_TASKRUN or overflow flags, a failed wait to retry.
    pub(crate) fn settle(&mut self, pace: &Pace) -> bool {
        // Posts that arrived during the turn, answered now rather than after another wait.
        self.drain_posted();
        self.flush_commits();
        let sq = self.ring.submission();
        let queued = !sq.is_empty() || sq.taskrun() || sq.cq_overflow();
        drop(sq);
        let rearm = !self.stopping() && self.batch.as_ref().is_some_and(Batch::rearm_due);
        queued
            || rearm
            || !self.unsent.is_empty()
            || self.batch.as_ref().is_some_and(Batch::commits_pending)
            || !self.cqes.is_empty()
            || !self.ring.completion().is_empty()
            || pace.failed_waits > 0
    }

    /// The queue's eventfd (pooled: the one the pool watches).
    pub(crate) fn wake_fd(&self) -> std::os::fd::RawFd {
        self.wake.raw()
    }

    /// The owner asked the loop to stop (a pooled loop is then turned at least every
    /// [`super::pool::STOP_POLL`] until it ends).
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn fault_due(&self) -> bool {
        self.fault_after.is_some_and(|n| self.dispatched >= n)
    }

    /// The checks before each wait: push refused COMMITs, re-arm the wake poll, and decide
    /// whether the loop ends (every tag aborted, or stopping and done draining).
    fn before_wait(&mut self, pace: &mut Pace, drain: Duration) -> Option<LoopExit> {
        self.push_unsent();
        self.flush_commits();
        self.rearm_fetch();
        if !self.wake_armed {
            self.rearm_wake();
        }
        if self.all_aborted() {
            return Some(LoopExit::Aborted);
        }
        if !self.stop.load(Ordering::Acquire) {
            return None;
        }
        let deadline = *pace
            .deferred_deadline
            .get_or_insert_with(|| Instant::now() + drain);
        let chunks = self.count(SlotState::InChunks);
        let deferred = self.count(SlotState::Deferred);
        let commits_done =
            self.unsent.is_empty() && self.batch.as_ref().is_none_or(Batch::commits_idle);
        if chunks == 0 && commits_done && (deferred == 0 || Instant::now() >= deadline) {
            if deferred > 0 {
                tracing::warn!(
                    queue = self.enc.queue,
                    deferred,
                    "stopping with deferred requests unfinished (the kernel reissues or fails them)"
                );
            }
            return Some(LoopExit::Stopped);
        }
        if chunks > 0 && pace.last_report.elapsed() >= Duration::from_secs(5) {
            pace.last_report = Instant::now();
            tracing::warn!(
                queue = self.enc.queue,
                chunks,
                "stopping: still waiting for chunks the kernel works on"
            );
        }
        None
    }

    /// What follows each wait: count a failed one (abort the process after
    /// [`RING_RETRIES`] in a row), then reap and process completions and posts.
    fn after_wait(&mut self, waited: std::io::Result<usize>, pace: &mut Pace) {
        match waited {
            Ok(_) => pace.failed_waits = 0,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN | libc::ETIME)
                ) => {}
            Err(e) => {
                pace.failed_waits += 1;
                tracing::error!(queue = self.enc.queue, error = %e, attempt = pace.failed_waits, "waiting on the queue's ring failed");
                if pace.failed_waits > RING_RETRIES {
                    // Aborts with the slots (keepalives) still alive: nothing the kernel
                    // may still be doing with their buffers is released first.
                    ring_failed(&e);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.reap();
        self.process_cqes();
        self.drain_posted();
        self.flush_commits();
    }

    /// The loop ends: COMMITs queued by the last pass complete requests that were fully
    /// served, so they go to the kernel before the ring closes.
    fn finish(&mut self) {
        self.push_unsent();
        self.flush_commits();
        if let Err(e) = self.ring.submit() {
            tracing::error!(queue = self.enc.queue, error = %e, "submitting the final commits failed");
        }
    }

    /// Retry queueing the eventfd poll after a failed re-arm (the loop meanwhile waits at
    /// most 10 ms at a time; see the module docs).
    fn rearm_wake(&mut self) {
        if self.arm_wake().is_ok() {
            tracing::info!(queue = self.enc.queue, "wake poll armed again");
            self.wake_armed = true;
        }
    }

    fn count(&self, state: SlotState) -> usize {
        self.slots.iter().filter(|s| s.state == state).count()
    }

    /// Push the COMMITs the ring refused earlier, in order; stop at the first refusal.
    fn push_unsent(&mut self) {
        while let Some(&(tag, result)) = self.unsent.front() {
            let sqe = self.enc.sqe(IoCmd::CommitAndFetch, tag, result);
            if let Err(e) = cmd::push(&mut self.ring, &sqe) {
                tracing::warn!(queue = self.enc.queue, tag, error = %e, "commit still refused; retrying");
                return;
            }
            self.unsent.pop_front();
        }
    }

    fn reap(&mut self) {
        for cqe in self.ring.completion() {
            self.cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
    }

    /// Every tag is aborted (legacy), or the batch FETCH was aborted and nothing we hold or
    /// sent is left unanswered: the device is stopping or quiesced.
    fn all_aborted(&self) -> bool {
        match &self.batch {
            None => self.aborted == self.slots.len(),
            Some(b) => {
                b.fetch_aborted()
                    && b.commits_idle()
                    && self.count(SlotState::InChunks) == 0
                    && self.count(SlotState::Deferred) == 0
            }
        }
    }

    /// BATCH_IO: send the results gathered so far as one COMMIT_IO_CMDS (kept for the next
    /// try when the ring refuses it).
    fn flush_commits(&mut self) {
        if let Some(b) = &mut self.batch {
            if let Err(e) = b.flush(&mut self.ring) {
                tracing::warn!(queue = self.enc.queue, error = %e, "queueing the batch commit failed; will retry");
            }
        }
    }

    /// BATCH_IO: arm the FETCH again after it ended, unless stopping (requests left in the
    /// driver then go to the successor, as parked ones do).
    fn rearm_fetch(&mut self) {
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        if let Some(b) = self.batch.as_mut().filter(|b| b.rearm_due()) {
            if let Err(e) = b.rearm(&mut self.ring) {
                tracing::warn!(queue = self.enc.queue, error = %e, "re-arming the batch fetch failed; will retry");
            }
        }
    }

    /// BATCH_IO: a FETCH completion: serve its tags.
    fn on_fetch(&mut self, res: i32, flags: u32) {
        let Some(batch) = &mut self.batch else {
            return;
        };
        let mut tags = std::mem::take(&mut self.fetched);
        tags.clear();
        let fetched = batch.on_fetch(res, flags, &mut tags);
        if let Fetched::Ended { res, aborted } = fetched {
            tracing::debug!(queue = self.enc.queue, res, aborted, "batch fetch ended");
        }
        for &tag in &tags {
            let armed = self
                .slots
                .get(usize::from(tag))
                .is_some_and(|s| s.state == SlotState::Armed);
            if armed {
                self.on_request(tag);
            } else {
                tracing::error!(
                    queue = self.enc.queue,
                    tag,
                    "fetched a tag that is not idle; ignored"
                );
            }
        }
        self.fetched = tags;
    }

    /// BATCH_IO: a COMMIT_IO_CMDS completion (`id`: its buffer).
    fn on_commit(&mut self, id: u16, res: i32) {
        let Some(batch) = &mut self.batch else {
            return;
        };
        match batch.on_commit(id, res) {
            CommitDone::All(_) => {}
            CommitDone::Partial {
                handled,
                refused: (tag, result),
                errno,
                requeued,
            } => {
                // The driver refuses a tag below the depth only when it is not ours (EBUSY:
                // idle in the driver). `commit` left the slot Armed, so the driver's next
                // request on it is served; a fetch already processed may even have started it.
                tracing::error!(
                    queue = self.enc.queue,
                    tag,
                    result,
                    handled,
                    ?errno,
                    requeued,
                    "the driver refused a commit (tag not ours: left armed); the rest is sent again"
                );
            }
            CommitDone::Failed {
                errno,
                requeued,
                attempt,
            } => {
                tracing::warn!(
                    queue = self.enc.queue,
                    errno,
                    requeued,
                    attempt,
                    "a batch commit failed as a whole; every result is sent again"
                );
            }
            CommitDone::Dropped { errno, results } => {
                tracing::error!(
                    queue = self.enc.queue,
                    errno,
                    dropped = results.len(),
                    "a batch commit failed as a whole {} times in a row; its results are dropped (those requests never complete)",
                    super::batch::COMMIT_RETRIES
                );
                for (tag, _) in results {
                    if let Some(slot) = self.slots.get_mut(usize::from(tag)) {
                        if slot.state == SlotState::Armed {
                            slot.state = SlotState::Unarmed;
                        }
                    }
                }
            }
            CommitDone::Unknown => {
                tracing::error!(
                    queue = self.enc.queue,
                    id,
                    res,
                    "completion of an unknown batch commit"
                )
            }
        }
    }

    fn process_cqes(&mut self) {
        let batch = std::mem::take(&mut self.cqes);
        for &(ud, res, flags) in &batch {
            match cmd::decode(ud) {
                (Some(CqeKind::Cmd), tag) => self.on_cmd(tag, res),
                (Some(CqeKind::Fetch), _) => self.on_fetch(res, flags),
                (Some(CqeKind::Commit), id) => self.on_commit(id, res),
                (Some(CqeKind::Prep), _) => {
                    // Answered in `arm`; a late copy of it is only logged.
                    if res < 0 {
                        tracing::error!(queue = self.enc.queue, res, "batch PREP failed");
                    }
                }
                (Some(CqeKind::Chunk), tag) => self.on_chunk(tag, cmd::chunk_index(ud), res),
                (Some(CqeKind::Wake), _) => {
                    self.wake.drain();
                    if let Err(e) = self.arm_wake() {
                        tracing::error!(queue = self.enc.queue, error = %e, "re-arming the wake poll failed; polling every 10 ms until it succeeds");
                        self.wake_armed = false;
                    }
                }
                (None, _) => {
                    tracing::warn!(queue = self.enc.queue, user_data = ud, "unknown completion")
                }
            }
        }
        let mut batch = batch;
        batch.clear();
        if self.cqes.is_empty() {
            self.cqes = batch;
        }
    }

    fn on_cmd(&mut self, tag: u16, res: i32) {
        let Some(slot) = self.slots.get_mut(usize::from(tag)) else {
            tracing::error!(
                queue = self.enc.queue,
                tag,
                "command completion for unknown tag"
            );
            return;
        };
        if res == sys::UBLK_IO_RES_ABORT {
            if slot.state != SlotState::Gone {
                slot.state = SlotState::Gone;
                self.aborted += 1;
            }
            return;
        }
        if res != sys::UBLK_IO_RES_OK as i32 {
            tracing::warn!(
                queue = self.enc.queue,
                tag,
                res,
                "io command failed (tag left unarmed)"
            );
            slot.state = SlotState::Unarmed;
            return;
        }
        self.on_request(tag);
    }

    /// The driver handed us a request on `tag` (its descriptor is in the mapped area).
    fn on_request(&mut self, tag: u16) {
        let raw = self.iod.get(tag);
        let slot = &mut self.slots[usize::from(tag)];
        slot.seq = slot.seq.wrapping_add(1);
        self.dispatched += 1;
        if self.stop.load(Ordering::Acquire) {
            // Leave it for the successor: no answer, no data moved.
            slot.state = SlotState::Parked;
            return;
        }
        let io = match IoDesc::from_kernel(
            raw.op_flags,
            raw.start_sector,
            raw.nr_sectors,
            self.enc.queue,
            tag,
        ) {
            Ok(io) => io,
            Err(op) => {
                tracing::debug!(queue = self.enc.queue, tag, op, "unsupported op");
                self.commit(tag, -libc::EOPNOTSUPP);
                return;
            }
        };
        slot.io = Some(io);
        slot.awaits = Awaits::Dispatch;
        let seq = slot.seq;
        self.dispatch(io, seq);
    }

    fn dispatch(&mut self, io: IoDesc, seq: u32) {
        let mut ctx = DispatchCtx::new(&self.handle, io, seq);
        let target = &self.target;
        let answer = catch_unwind(AssertUnwindSafe(|| target.dispatch(&io, &mut ctx)));
        let took_token = ctx.took_deferred();
        match answer {
            Ok(Dispatch::Inline { action, keepalive }) => {
                self.run_action(io.tag, action, keepalive)
            }
            Ok(Dispatch::Deferred) if took_token => {
                self.slots[usize::from(io.tag)].state = SlotState::Deferred
            }
            Ok(Dispatch::Deferred) => {
                tracing::error!(
                    queue = io.queue,
                    tag = io.tag,
                    "target deferred without taking a token: -EIO"
                );
                self.commit(io.tag, -libc::EIO);
            }
            Err(_) => {
                tracing::error!(queue = io.queue, tag = io.tag, op = ?io.op, "target dispatch panicked: -EIO");
                self.commit(io.tag, -libc::EIO);
            }
        }
    }

    fn run_action(&mut self, tag: u16, action: Action, keepalive: Option<T::Keepalive>) {
        let slot = &mut self.slots[usize::from(tag)];
        slot.keepalive = keepalive;
        let Some(io) = slot.io else {
            self.commit(tag, -libc::EIO);
            return;
        };
        let awaits = std::mem::replace(&mut slot.awaits, Awaits::Dispatch);
        if awaits != Awaits::Dispatch {
            // Only a result may answer after_write or make_durable: the data has landed.
            let res = match action {
                Action::Complete(res) => complete_result(&io, res),
                Action::Chunks(_) => {
                    tracing::error!(
                        queue = io.queue,
                        tag,
                        ?awaits,
                        "a landed write answered with chunks: -EIO"
                    );
                    -libc::EIO
                }
            };
            if awaits == Awaits::Landed {
                self.landed(io, res);
            } else {
                self.commit(tag, res);
            }
            return;
        }
        let chunks = match action {
            Action::Complete(res) => {
                self.commit(tag, complete_result(&io, res));
                return;
            }
            Action::Chunks(chunks) => chunks,
        };
        if let Err(errno) = check_chunks(&io, &chunks) {
            tracing::error!(queue = io.queue, tag, op = ?io.op, offset = io.offset, len = io.len, errno, "target chunks rejected");
            self.commit(tag, -errno);
            return;
        }
        slot.state = SlotState::InChunks;
        slot.first_err = 0;
        slot.pending = u32::try_from(chunks.len()).unwrap_or(u32::MAX);
        slot.bytes_done = 0;
        slot.bytes_expected = chunks.iter().map(|c| u64::from(c.len())).sum();
        if chunks.is_empty() {
            self.finish_chunks(tag);
            return;
        }
        // The slot holds the chunks (and so their files) until the last one is reaped
        // (`finish_chunks`), which cannot happen before the last one started: every chunk
        // is accounted once.
        let count = chunks.len();
        slot.chunks = chunks;
        for i in 0..count {
            let Some(chunk) = self.slots[usize::from(tag)].chunks.get(i) else {
                break;
            };
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let started = match &mut self.plane {
                Plane::ZeroCopy { zero } => {
                    zero_copy::start_chunk(&mut self.ring, tag, index, chunk, zero.as_raw_fd())
                }
                Plane::UserCopy(uc) => uc.start_chunk(tag, chunk),
            };
            if let ChunkStart::Done(res) = started {
                self.account(tag, res);
            }
        }
        // Zero-copy chunks go to the kernel with the next `io_uring_enter`, together with
        // everything else this batch of completions produced.
    }

    fn on_chunk(&mut self, tag: u16, index: u32, res: i32) {
        let in_chunks = self
            .slots
            .get(usize::from(tag))
            .is_some_and(|s| s.state == SlotState::InChunks);
        if !in_chunks {
            tracing::error!(
                queue = self.enc.queue,
                tag,
                "chunk completion for a tag without chunks"
            );
            return;
        }
        if self.resubmit_zeros(tag, index, res) {
            return;
        }
        self.account(tag, res);
    }

    /// A zero-copy [`Chunk::Zeros`] that moved only part of its bytes (`/dev/zero` may stop
    /// early, see [`zero_copy::rest_of_zeros`]): counts what it moved and submits the rest
    /// under the same index; `true` when it did (the chunk is still pending). A failed
    /// submission fails the chunk.
    fn resubmit_zeros(&mut self, tag: u16, index: u32, res: i32) -> bool {
        let Plane::ZeroCopy { zero } = &self.plane else {
            return false;
        };
        let slot = &mut self.slots[usize::from(tag)];
        let Some(chunk) = slot.chunks.get_mut(index as usize) else {
            return false;
        };
        let Some(rest) = zero_copy::rest_of_zeros(chunk, res) else {
            return false;
        };
        slot.bytes_done += u64::from(res.unsigned_abs());
        *chunk = rest;
        let started = zero_copy::start_chunk(&mut self.ring, tag, index, chunk, zero.as_raw_fd());
        if let ChunkStart::Done(err) = started {
            self.account(tag, err);
        }
        true
    }

    /// One chunk finished with `res` (bytes moved or `-errno`).
    fn account(&mut self, tag: u16, res: i32) {
        let slot = &mut self.slots[usize::from(tag)];
        if res < 0 {
            if slot.first_err == 0 {
                slot.first_err = res;
            }
        } else {
            slot.bytes_done += u64::from(res.unsigned_abs());
        }
        slot.pending = slot.pending.saturating_sub(1);
        if slot.pending == 0 {
            self.finish_chunks(tag);
        }
    }

    fn finish_chunks(&mut self, tag: u16) {
        let slot = &mut self.slots[usize::from(tag)];
        let Some(io) = slot.io else { return };
        let mut result = if slot.first_err != 0 {
            slot.first_err
        } else if slot.bytes_done != slot.bytes_expected {
            // A short transfer (end of file, truncated target) is an I/O error.
            -libc::EIO
        } else {
            io.success_result()
        };
        if result < 0 {
            // The request fails with this: say which and why (a chunk's errno, or how many
            // bytes its chunks moved), or the guest's EIO has no trace in the daemon's log.
            tracing::warn!(
                queue = io.queue,
                tag,
                op = ?io.op,
                offset = io.offset,
                len = io.len,
                chunk_errno = -slot.first_err,
                bytes_done = slot.bytes_done,
                bytes_expected = slot.bytes_expected,
                result,
                "request chunks failed"
            );
        }
        // The kernel moves no more data for this request: its chunks and keepalive may go
        // now (a WRITE's keepalive goes to the target, which may commit it off the loop).
        drop(std::mem::take(&mut slot.chunks));
        let mut keepalive = slot.keepalive.take();
        if io.op == IoOp::Write {
            let landed = self.ask(io, Awaits::Landed, |target, ctx| {
                target.after_write(&io, result, keepalive, ctx)
            });
            if let Some(res) = landed {
                self.landed(io, res);
            }
            return;
        }
        if io.op == IoOp::Read {
            let target = &self.target;
            let hooked = catch_unwind(AssertUnwindSafe(|| {
                target.after_read(&io, result, keepalive.as_mut())
            }));
            result = hooked.unwrap_or_else(|_| {
                tracing::error!(queue = io.queue, tag, "after-read hook panicked: -EIO");
                -libc::EIO
            });
        }
        drop(keepalive);
        self.commit(tag, result);
    }

    /// A WRITE's data landed and the target answered `result` for it: a successful FUA
    /// write is made durable before its commit, anything else commits now.
    fn landed(&mut self, io: IoDesc, result: i32) {
        if io.op == IoOp::Write && io.fua() && result == io.success_result() {
            let durable = self.ask(io, Awaits::Durable, |target, ctx| {
                target.make_durable(&io, ctx)
            });
            if let Some(res) = durable {
                self.commit(io.tag, res);
            }
            return;
        }
        self.commit(io.tag, result);
    }

    /// Asks the target a question about a landed WRITE (`after_write`, `make_durable`):
    /// `Some(result)` when it answered now (a panic or an answer with chunks is `-EIO`),
    /// `None` when it deferred (the slot then waits for `awaits`' posted result).
    fn ask(
        &mut self,
        io: IoDesc,
        awaits: Awaits,
        f: impl FnOnce(&T, &mut DispatchCtx<'_, T::Keepalive>) -> Dispatch<T::Keepalive>,
    ) -> Option<i32> {
        let tag = io.tag;
        let seq = self.slots[usize::from(tag)].seq;
        let mut ctx = DispatchCtx::new(&self.handle, io, seq);
        let target = &self.target;
        let answer = catch_unwind(AssertUnwindSafe(|| f(target, &mut ctx)));
        let took_token = ctx.took_deferred();
        match answer {
            Ok(Dispatch::Inline {
                action: Action::Complete(res),
                keepalive: _,
            }) => Some(complete_result(&io, res)),
            Ok(Dispatch::Deferred) if took_token => {
                let slot = &mut self.slots[usize::from(tag)];
                slot.state = SlotState::Deferred;
                slot.awaits = awaits;
                None
            }
            Ok(other) => {
                tracing::error!(queue = io.queue, tag, ?awaits, answer = ?other, "a landed write must be completed or deferred: -EIO");
                Some(-libc::EIO)
            }
            Err(_) => {
                tracing::error!(
                    queue = io.queue,
                    tag,
                    ?awaits,
                    "the target panicked on a landed write: -EIO"
                );
                Some(-libc::EIO)
            }
        }
    }

    /// Queue COMMIT_AND_FETCH for `tag` (kept for a retry when the ring refuses it; BATCH_IO:
    /// gathered for the turn's COMMIT_IO_CMDS), then drop the request's keepalive.
    fn commit(&mut self, tag: u16, result: i32) {
        if let Some(b) = &mut self.batch {
            // Sent with the rest of the turn (`flush_commits`).
            b.commit(tag, result);
        } else if !self.unsent.is_empty() {
            self.unsent.push_back((tag, result));
        } else if let Err(e) = cmd::push(
            &mut self.ring,
            &self.enc.sqe(IoCmd::CommitAndFetch, tag, result),
        ) {
            tracing::warn!(queue = self.enc.queue, tag, error = %e, "queueing commit failed; will retry");
            self.unsent.push_back((tag, result));
        }
        let slot = &mut self.slots[usize::from(tag)];
        slot.state = SlotState::Armed;
        slot.io = None;
        slot.pending = 0;
        slot.first_err = 0;
        slot.awaits = Awaits::Dispatch;
        drop(std::mem::take(&mut slot.chunks));
        drop(slot.keepalive.take());
    }

    fn drain_posted(&mut self) {
        while let Ok(posted) = self.rx.try_recv() {
            let Some(slot) = self.slots.get(usize::from(posted.tag)) else {
                continue;
            };
            if slot.state == SlotState::Deferred && slot.seq == posted.seq {
                self.run_action(posted.tag, posted.action, posted.keepalive);
            } else {
                tracing::debug!(
                    queue = self.enc.queue,
                    tag = posted.tag,
                    "stale deferred post dropped"
                );
            }
        }
    }
}

impl<T: Target> Drop for QueueLoop<T> {
    fn drop(&mut self) {
        // Before the ring (first field) closes: the kernel must not touch the fetch buffers
        // once they are unmapped (see `super::batch`).
        if let Some(b) = &mut self.batch {
            b.unregister(&self.ring);
        }
    }
}

/// The result a request completed by [`Action::Complete`] commits with: READ/WRITE must
/// report their full length (a short or zero count would make the kernel requeue the rest,
/// forever for 0), anything else non-negative is -EIO; errors and other ops pass through.
pub(crate) fn complete_result(io: &IoDesc, res: i32) -> i32 {
    let rw = matches!(io.op, IoOp::Read | IoOp::Write);
    if rw && res >= 0 && res.unsigned_abs() != io.len {
        tracing::error!(queue = io.queue, tag = io.tag, op = ?io.op, len = io.len, res, "completion must be the full length: -EIO");
        return -libc::EIO;
    }
    res
}

/// Validate a chunk against its request before giving it to the kernel (its file needs no
/// check: a chunk owns an open one, see [`Chunk`]).
fn check_chunk(io: &IoDesc, chunk: &Chunk) -> Result<(), i32> {
    let dir_ok = matches!(
        (io.op, chunk),
        (IoOp::Read, Chunk::ReadInto { .. } | Chunk::Zeros { .. })
            | (IoOp::Write, Chunk::WriteFrom { .. })
    );
    let end = u64::from(chunk.buf_offset()) + u64::from(chunk.len());
    if !dir_ok || chunk.is_empty() || end > u64::from(io.len) {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// Validate every chunk, then (READ/WRITE) that they cover `[0, len)` exactly once: a gap
/// or an overlap is `EIO`. Allocates only when the chunks are not in buffer order.
pub(crate) fn check_chunks(io: &IoDesc, chunks: &[Chunk]) -> Result<(), i32> {
    for chunk in chunks {
        check_chunk(io, chunk)?;
    }
    if !matches!(io.op, IoOp::Read | IoOp::Write) {
        return Ok(());
    }
    let covers = |spans: &mut dyn Iterator<Item = (u32, u32)>| {
        let mut next = 0u64;
        for (off, len) in spans {
            if u64::from(off) != next {
                return false;
            }
            next += u64::from(len);
        }
        next == u64::from(io.len)
    };
    let in_order = chunks
        .windows(2)
        .all(|w| w[0].buf_offset() <= w[1].buf_offset());
    let span = |c: &Chunk| (c.buf_offset(), c.len());
    let ok = if in_order {
        covers(&mut chunks.iter().map(span))
    } else {
        let mut spans: Vec<(u32, u32)> = chunks.iter().map(span).collect();
        spans.sort_unstable();
        covers(&mut spans.into_iter())
    };
    if ok {
        Ok(())
    } else {
        Err(libc::EIO)
    }
}

/// A queue loop whose ring failed (see `engine`'s module docs): the device cannot be served
/// any more, and leaving it LIVE would hang its I/O with nobody to answer. Abort the process,
/// loudly: the kernel then holds the device's I/O (USER_RECOVERY) until the next server
/// recovers it, as after a `kill -9` (systemd restarts the daemon).
pub(crate) fn ring_failed(e: &std::io::Error) -> ! {
    let thread = std::thread::current();
    let queue = thread.name().unwrap_or("a queue thread");
    tracing::error!(queue, error = %e, "the queue's io_uring failed: aborting so that the device is recovered by the next start");
    eprintln!("{queue}: io_uring failed ({e}); aborting the process (the device waits, QUIESCED, for the next server to recover it)");
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(op: IoOp, len: u32) -> IoDesc {
        IoDesc {
            op,
            offset: 0,
            len,
            flags: 0,
            queue: 0,
            tag: 0,
        }
    }

    fn file() -> Arc<std::fs::File> {
        Arc::new(tempfile::tempfile().unwrap())
    }

    #[test]
    fn chunks_must_match_direction_and_stay_inside_the_request() {
        let f = file();
        let read = io(IoOp::Read, 8192);
        assert_eq!(
            check_chunk(&read, &Chunk::read_into(&f, 0, 4096, 4096)),
            Ok(())
        );
        assert_eq!(
            check_chunk(&read, &Chunk::read_into(&f, 0, 4096, 4097)),
            Err(libc::EINVAL)
        );
        assert_eq!(
            check_chunk(&read, &Chunk::write_from(&f, 0, 4096, 0)),
            Err(libc::EINVAL)
        );
        assert_eq!(
            check_chunk(&read, &Chunk::read_into(&f, 0, 0, 0)),
            Err(libc::EINVAL)
        );
        let write = io(IoOp::Write, 4096);
        assert_eq!(
            check_chunk(&write, &Chunk::write_from(&f, 0, 4096, 0)),
            Ok(())
        );
        let flush = io(IoOp::Flush, 0);
        assert_eq!(
            check_chunk(&flush, &Chunk::write_from(&f, 0, 512, 0)),
            Err(libc::EINVAL)
        );
        assert_eq!(check_chunk(&read, &Chunk::zeros(4096, 0)), Ok(()));
        assert_eq!(
            check_chunk(&write, &Chunk::zeros(4096, 0)),
            Err(libc::EINVAL),
            "zeros only serve READ"
        );
    }

    #[test]
    fn read_and_write_chunks_must_cover_the_request_exactly() {
        let read = io(IoOp::Read, 8192);
        let write = io(IoOp::Write, 8192);
        let f = file();
        let r = |off, len| Chunk::read_into(&f, 0, len, off);
        let w = |off, len| Chunk::write_from(&f, 0, len, off);
        // Exact covers, in order or not, zeroes included.
        assert_eq!(check_chunks(&read, &[r(0, 4096), r(4096, 4096)]), Ok(()));
        assert_eq!(
            check_chunks(&read, &[r(4096, 4096), Chunk::zeros(4096, 0)]),
            Ok(())
        );
        assert_eq!(check_chunks(&write, &[w(0, 8192)]), Ok(()));
        // Under-covered (a gap, a short tail, nothing at all) or overlapping: EIO.
        assert_eq!(check_chunks(&read, &[r(0, 4096)]), Err(libc::EIO));
        assert_eq!(check_chunks(&read, &[]), Err(libc::EIO));
        assert_eq!(check_chunks(&write, &[w(4096, 4096)]), Err(libc::EIO));
        assert_eq!(
            check_chunks(&write, &[w(0, 4096), w(2048, 4096)]),
            Err(libc::EIO)
        );
        assert_eq!(
            check_chunks(&read, &[r(0, 4096), r(0, 4096), r(4096, 4096)]),
            Err(libc::EIO)
        );
        // Ops without data take an empty list.
        assert_eq!(check_chunks(&io(IoOp::Flush, 0), &[]), Ok(()));
    }

    #[test]
    fn read_write_completions_must_be_the_full_length() {
        let write = io(IoOp::Write, 4096);
        assert_eq!(complete_result(&write, 4096), 4096);
        assert_eq!(
            complete_result(&write, 0),
            -libc::EIO,
            "0 would requeue forever"
        );
        assert_eq!(complete_result(&write, 512), -libc::EIO);
        assert_eq!(complete_result(&write, -libc::ENOSPC), -libc::ENOSPC);
        assert_eq!(complete_result(&io(IoOp::Flush, 0), 0), 0);
        assert_eq!(complete_result(&io(IoOp::Discard, 4096), 0), 0);
    }
}

#[cfg(test)]
#[path = "engine_short_zeros_tests.rs"]
mod short_zeros_tests;
