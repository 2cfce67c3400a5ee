//! WRITE, FUA, DISCARD and WRITE_ZEROES.
//!
//! WRITE (inline): `try_enter` + `prepare_write(.., LockMode::Try)` → one `write_from` chunk
//! of the whole request into the active file at the ticket's offset, keepalive
//! [`Keep`] (gate + ticket). `prepare_write` in `Try` mode answers `WouldBlock` (and the
//! request is deferred) for a busy stripe and for any write that needs file I/O first (a
//! promote, a file extension), so the loop thread reads and writes no file itself.
//!
//! Commit (`after_write`): the ticket is committed under the same gate with no CRCs
//! (zero-copy: they are computed before upload). A write to blocks that are all Dirty
//! commits on the loop thread (`try_commit_write`: atomics only); one that turns blocks
//! Dirty needs its WAL record written out (a write(2), under the WAL mutex a FLUSH holds
//! across its write-out), so its commit is deferred, with the gate and the ticket, to the
//! target's lane of the commit pool (`commit_blocking`, see `commit`). A failed commit or transfer
//! completes with `-EIO` and the ticket is dropped uncommitted (in the commit lane when that
//! punches out bytes that landed under blocks that were not Dirty). A deferred write that promoted
//! every block it turns Dirty (the first 4 KiB write to a clean block) turned them Dirty on
//! the blocking thread already (`Cache::dirty_early`, in the protocol's attempt): its commit
//! is on the loop thread, with no hop to the commit pool.
//!
//! WRITE (deferred, `write_blocking`): on the blocking pool, the protocol's first attempt
//! (`Volume::serve_write_here`: gate + prepare waiting for stripe locks, the promote of a
//! clean block); only a write that needs blocks from the store goes on to the whole request
//! protocol on a runtime task (`write_slow`, `Volume::serve_write`: blocks a partial write
//! needs are fetched with no gate held, filled Clean, and the write prepared again). The
//! ready gate and ticket travel with the chunk exactly as inline, submitted from the
//! blocking thread itself: a gate or ticket never waits for an async worker. (The first
//! attempt on the blocking pool saves the hop through an async worker that the common
//! deferred write, a promote, does not need.)
//!
//! DISCARD / WRITE_ZEROES: the range is punched out of the cache's active file
//! (`Volume::write_zeroes`, a write whose data is a hole) in pieces of at most
//! [`ZERO_PIECE`] bytes, skipping blocks that already read as zeroes (never written, no
//! remote copy) so a discard of a fresh volume (mkfs) costs nothing. The next flush publishes
//! whole zeroed blocks unmapped: a `fstrim` frees their space in the store.

use std::sync::Arc;

use glidefs_volume::cache::{BlockState, Commit, Gate, WritePrep, WriteTicket};
use glidefs_volume::{fast_path, FirstAttempt, VolumeError};
use ublk_core::{Action, Chunk, Dispatch, IoDesc};

use super::{Deferred, DispatchCtx, Fast, InFlight, Inner, Keep};
use crate::io_stats::IoRecorder;
use glidefs_model::log::chain;

/// Largest piece of a DISCARD / WRITE_ZEROES punched at once (its blocks' stripe locks are
/// held across the punch).
pub(crate) const ZERO_PIECE: u64 = 8 << 20;

/// The chunk and keepalive that move a WRITE into the active file.
pub(super) fn write_action(io: &IoDesc, gate: Gate, ticket: WriteTicket) -> (Vec<Chunk>, Keep) {
    let chunk = Chunk::write_from(gate.active_arc(), ticket.file_offset(), io.len, 0);
    (vec![chunk], Keep::write(gate, ticket))
}

/// What a deferred WRITE does with its ready gate and ticket (on the blocking thread that
/// prepared it): hands the chunk to the loop; committed and recorded in `after_write`.
fn submit_ready(io: IoDesc) -> impl Fn(Deferred, Gate, WriteTicket) + Send + Sync + 'static {
    move |token, gate, ticket| {
        let (chunks, keep) = write_action(&io, gate, ticket);
        token.submit(chunks, Some(keep));
    }
}

/// The fast path of a WRITE (never blocks: the loop thread's, and a throttled WRITE's after
/// its wait): `try_enter` + `prepare_write(.., Try)`.
pub(super) fn fast(inner: &Inner, io: &IoDesc) -> Fast {
    let Some(gate) = fast_path::try_enter(&inner.volume) else {
        return Fast::Slow;
    };
    match fast_path::try_prepare_write(&inner.volume, &gate, io.offset, u64::from(io.len)) {
        Ok(WritePrep::Ready(ticket)) => {
            IoRecorder::bump(&inner.stats.inline, 1);
            let (chunks, keep) = write_action(io, gate, ticket);
            Fast::Ready(chunks, keep)
        }
        // Busy stripe or a cold partial block: the slow path waits / fetches.
        Ok(WritePrep::WouldBlock | WritePrep::NeedsFetch(_)) => Fast::Slow,
        Err(e) => {
            tracing::warn!(offset = io.offset, len = io.len, error = %chain(&e), "write refused");
            Fast::Failed
        }
    }
}

/// Dispatch of a WRITE (loop thread, never blocks).
pub(super) fn write(inner: &Arc<Inner>, io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch<Keep> {
    match fast(inner, io) {
        Fast::Ready(chunks, keep) => Dispatch::Inline {
            action: Action::Chunks(chunks),
            keepalive: Some(keep),
        },
        Fast::Failed => inner.complete_now(io, -libc::EIO),
        Fast::Slow => inner.defer_blocking(ctx, |inner, guard, token| {
            inner.write_blocking(guard, token)
        }),
    }
}

impl Inner {
    /// Commit of a WRITE after its data landed (`after_write`, loop thread): completes now
    /// when the commit needs no file I/O, else defers it to the commit pool (see the
    /// module docs). A successful FUA write is recorded once it is durable (`make_durable`).
    pub(super) fn commit(
        self: &Arc<Self>,
        io: &IoDesc,
        result: i32,
        keepalive: Option<Keep>,
        ctx: &mut DispatchCtx<'_>,
    ) -> Dispatch<Keep> {
        let Some(mut keep) = keepalive else {
            tracing::error!(
                queue = io.queue,
                tag = io.tag,
                "WRITE finished without its gate and ticket"
            );
            return Dispatch::complete(self.finish(io, -libc::EIO));
        };
        let Some(ticket) = keep.ticket.take() else {
            tracing::error!(
                queue = io.queue,
                tag = io.tag,
                "WRITE keepalive without a ticket"
            );
            return Dispatch::complete(self.finish(io, -libc::EIO));
        };
        let gate = keep.gate;
        if result != io.success_result() {
            // The data did not land (completely): the ticket is dropped uncommitted, which
            // punches out what did land under blocks that were not Dirty (file I/O: in the
            // commit lane, the gate held until after it; see `WriteTicket`).
            let failed = if result < 0 { result } else { -libc::EIO };
            if ticket.punches_on_drop() {
                return self.defer_commit(ctx, move |inner, token| {
                    drop(ticket);
                    drop(gate);
                    inner.complete_deferred(token, failed);
                });
            }
            drop(ticket);
            return Dispatch::complete(self.finish(io, failed));
        }
        match fast_path::try_commit_write(&self.volume, &gate, ticket) {
            Ok(Commit::WouldBlock(ticket)) => self.defer_commit(ctx, move |inner, token| {
                inner.commit_blocking(token, &gate, ticket);
            }),
            committed => Dispatch::complete(self.committed(io, committed.map(|_| ()))),
        }
    }

    /// The result a WRITE whose commit returned `r` completes with: recorded now unless it
    /// is a successful FUA write, which is recorded once it is durable (`make_durable`).
    fn committed(&self, io: &IoDesc, r: glidefs_volume::cache::Result<()>) -> i32 {
        match r {
            Ok(()) if io.fua() => io.success_result(),
            Ok(()) => self.finish(io, io.success_result()),
            Err(e) => {
                tracing::warn!(offset = io.offset, len = io.len, error = %chain(&e), "write commit failed");
                self.finish(io, -libc::EIO)
            }
        }
    }

    /// The deferred commit of a landed WRITE, in the target's commit lane (see `commit`):
    /// never on the runtime, whose threads (async workers in `fill_clean`, the whole
    /// blocking pool in `enter()` or `prepare_write(.., Wait)`) may all be parked on the gate
    /// or the stripes this ticket holds. Runs even when a hand-off abandoned the request:
    /// the bytes are in the active file and the stripes locked until the ticket is committed
    /// or dropped, so committing is as safe as dropping (the volume's close latches the
    /// cache, after which the commit fails and touches nothing).
    fn commit_blocking(&self, token: Deferred, gate: &Gate, ticket: WriteTicket) {
        let io = *token.io();
        let r = self.committed(&io, fast_path::commit_write(&self.volume, gate, ticket));
        token.complete(r);
    }

    /// The deferred WRITE (blocking pool): its first attempt here; a write that needs a
    /// fetch goes on to `write_slow` on a runtime task, with its in-flight guard.
    fn write_blocking(self: Arc<Self>, guard: InFlight, token: Deferred) {
        let io = *token.io();
        let first =
            self.volume
                .serve_write_here(io.offset, u64::from(io.len), token, submit_ready(io));
        match first {
            FirstAttempt::Served(()) => {}
            FirstAttempt::Protocol(token) => {
                let inner = Arc::clone(&self);
                // On a runtime that shut down the task is dropped at once: its token then
                // completes the request with -EIO.
                drop(self.rt.spawn(async move {
                    let _guard = guard;
                    inner.write_slow(token).await;
                }));
            }
            FirstAttempt::Refused(refused) => self.refused(refused, "deferred write"),
        }
    }

    /// The deferred WRITE (runtime task): the engine's request protocol, whose ready gate
    /// and ticket are handed to the loop from the blocking pool (`token.submit` in the
    /// serve closure): they never wait for an async worker, which may itself be parked on a
    /// stripe lock (the fetcher's `fill_clean` locks the block's stripe on a worker).
    pub(super) async fn write_slow(self: Arc<Self>, token: Deferred) {
        let io = *token.io();
        let served = self
            .volume
            .serve_write(io.offset, u64::from(io.len), token, submit_ready(io))
            .await;
        if let Err(refused) = served {
            self.refused(refused, "deferred write");
        }
    }

    /// DISCARD / WRITE_ZEROES of `len` bytes at `offset` (runtime task; see module docs).
    pub(super) async fn zero_range(&self, offset: u64, len: u32) -> Result<(), VolumeError> {
        let bs = self.volume.geometry().bs();
        let runs = zero_runs(offset, u64::from(len), bs, ZERO_PIECE, |b| {
            let info = self.volume.block_info(b);
            info.state == BlockState::NotPresent && !info.remote
        });
        for (start, n) in runs {
            self.volume.write_zeroes(start, n).await?;
        }
        Ok(())
    }
}

/// The ranges `(device offset, len)` of `[offset, offset + len)` to write with zeroes:
/// blocks (of `bs` bytes) for which `is_zero(block)` holds are skipped, the rest is merged
/// into contiguous runs of at most `max` bytes.
pub(crate) fn zero_runs(
    offset: u64,
    len: u64,
    bs: u64,
    max: u64,
    is_zero: impl Fn(u64) -> bool,
) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let end = offset.saturating_add(len);
    let (bs, max) = (bs.max(1), max.max(1));
    let mut pos = offset;
    let mut run: Option<(u64, u64)> = None;
    while pos < end {
        let block = pos / bs;
        let n = (bs - pos % bs).min(end - pos);
        if is_zero(block) {
            out.extend(run.take());
        } else {
            let (mut p, mut left) = (pos, n);
            while left > 0 {
                match &mut run {
                    Some((_, l)) if *l < max => {
                        let take = (max - *l).min(left);
                        *l += take;
                        p += take;
                        left -= take;
                    }
                    _ => {
                        out.extend(run.take());
                        let take = max.min(left);
                        run = Some((p, take));
                        p += take;
                        left -= take;
                    }
                }
            }
        }
        pos += n;
    }
    out.extend(run);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_runs_skip_zero_blocks_and_respect_the_piece_size() {
        // 4 blocks of 64 KiB from offset 4096; block 1 already zero.
        let runs = zero_runs(4096, 4 * 65536 - 4096, 65536, 1 << 20, |b| b == 1);
        assert_eq!(runs, vec![(4096, 61440), (131072, 131072)]);
        // Everything zero: nothing to write.
        assert!(zero_runs(0, 1 << 20, 65536, 1 << 20, |_| true).is_empty());
        // Nothing zero, pieces capped at 100 KiB and contiguous.
        let runs = zero_runs(0, 300 * 1024, 65536, 100 * 1024, |_| false);
        assert_eq!(runs, vec![(0, 102400), (102400, 102400), (204800, 102400)]);
        // Blocks larger than the piece size are split.
        let runs = zero_runs(0, 1 << 21, 1 << 21, 1 << 20, |_| false);
        assert_eq!(runs, vec![(0, 1 << 20), (1 << 20, 1 << 20)]);
    }
}
