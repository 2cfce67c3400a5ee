//! READ: inline from local files and holes; cold pieces through the scratch memfd.
//!
//! Inline: under a gate from `try_enter`, the tag's reused plan; when every piece is local
//! (or a hole) the chunks run on the loop thread with the gate as keepalive. Otherwise the
//! request is deferred (`read_cold`) to the engine's request protocol
//! (`Volume::serve_read`: remote blocks fetched with no gate held, a fetch joined only when it
//! reads the location the manifest names now, so a READ never gets bytes older than a write
//! completed before it started; re-planned under a fresh gate; at most
//! `glidefs_volume::MAX_ATTEMPTS` attempts). Its ready plan comes to `serve_cold` on the
//! blocking pool, still under the gate: the remote pieces are staged from the fetched bytes
//! into the tag's scratch slot, the chunks built and submitted from that blocking thread (a
//! gate never waits for an async worker). The gate of the final plan travels with the
//! chunks. (`fetch_block` fills fetched blocks Clean without a gate; a fill that fails, e.g.
//! on a full cache file system, leaves the block uncached but the READ still succeeds.)
//!
//! Readahead: every READ is first reported to `Volume::note_read` (atomics only, plus a
//! spawned fetch per cold block ahead of a sequential stream), so a sequential reader finds
//! the next blocks already fetched, or in flight, and joins their fetch (when it still reads
//! the blocks' current locations).

use std::sync::Arc;

use glidefs_volume::cache::ReadPlan;
use glidefs_volume::{fast_path, ReadyRead, VolumeError};
use ublk_core::{Action, Chunk, Dispatch, IoDesc};

use super::plan::{read_chunks, PlanError, PlanFiles};
use super::scratch::ScratchError;
use super::{Deferred, DispatchCtx, Fast, Inner, Keep};
use crate::io_stats::IoRecorder;
use glidefs_model::log::chain;

/// Why a ready cold READ could not be served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Scratch(#[from] ScratchError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error("no state for queue {queue}")]
    NoQueue { queue: u16 },
}

/// A cold READ ready to run: its chunks, the keepalive (gate, scratch lease), and the bytes
/// staged from the store.
pub(super) struct ColdReady {
    pub(super) chunks: Vec<Chunk>,
    pub(super) keep: Keep,
    pub(super) cold: u64,
}

/// The fast path of a READ (never blocks: the loop thread's, and a throttled READ's after
/// its wait): under a gate from `try_enter`, the tag's reused plan; ready when every piece
/// is local or a hole.
pub(super) fn fast(inner: &Inner, io: &IoDesc) -> Fast {
    let Some(gate) = fast_path::try_enter(&inner.volume) else {
        return Fast::Slow;
    };
    let mut local = ReadPlan::default();
    let mut guard = inner.tag(io).and_then(|t| t.plan.try_lock());
    let plan: &mut ReadPlan = match guard.as_deref_mut() {
        Some(p) => p,
        None => &mut local,
    };
    if let Err(e) = fast_path::plan_read(&inner.volume, &gate, io.offset, u64::from(io.len), plan) {
        tracing::warn!(offset = io.offset, len = io.len, error = %chain(&e), "read plan failed");
        return Fast::Failed;
    }
    if !plan.is_local() {
        // Remote pieces: the gate is dropped here, before anything is fetched.
        return Fast::Slow;
    }
    let files = PlanFiles::of(&gate, None);
    let mut chunks = Vec::with_capacity(plan.segments().len());
    if let Err(e) = read_chunks(plan.segments(), io.len, &files, &mut chunks) {
        tracing::error!(offset = io.offset, len = io.len, error = %chain(&e), "read plan unusable");
        return Fast::Failed;
    }
    IoRecorder::bump(&inner.stats.inline, 1);
    Fast::Ready(chunks, Keep::read(gate, None))
}

/// Dispatch of a READ (loop thread, never blocks).
pub(super) fn read(inner: &Arc<Inner>, io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch<Keep> {
    // Sequential streams start background fetches of the blocks ahead (never blocks).
    inner.volume.note_read(io.offset, u64::from(io.len));
    match fast(inner, io) {
        Fast::Ready(chunks, keep) => Dispatch::Inline {
            action: Action::Chunks(chunks),
            keepalive: Some(keep),
        },
        Fast::Failed => inner.complete_now(io, -libc::EIO),
        Fast::Slow => inner.defer(ctx, |inner, token| inner.read_cold(token)),
    }
}

impl Inner {
    /// The deferred READ (runtime task): the engine's request protocol, served by
    /// `serve_cold` on the blocking pool.
    pub(super) async fn read_cold(self: Arc<Self>, token: Deferred) {
        let io = *token.io();
        let inner = Arc::clone(&self);
        let served = self
            .volume
            .serve_read(io.offset, u64::from(io.len), token, move |token, ready| {
                inner.serve_cold(token, ready);
            })
            .await;
        if let Err(refused) = served {
            self.refused(refused, "cold read");
        }
    }

    /// Serves a ready cold READ (blocking pool, under the plan's gate): stage, submit.
    fn serve_cold(&self, token: Deferred, ready: ReadyRead<'_>) {
        let io = *token.io();
        let first_remote = ready.first_remote;
        match self.stage_cold(&io, ready) {
            Ok(ColdReady { chunks, keep, cold }) => {
                let remote = if first_remote > 0 { first_remote } else { cold };
                if remote > 0 {
                    IoRecorder::bump(&self.stats.cold_reads, 1);
                    IoRecorder::bump(&self.stats.cold_read_bytes, remote);
                }
                IoRecorder::bump(&self.stats.scratch_bytes, cold);
                // Recorded in `after_read`.
                token.submit(chunks, Some(keep));
            }
            Err(e) => {
                tracing::warn!(offset = io.offset, len = io.len, error = %chain(&e), "cold read failed");
                self.complete_deferred(token, -libc::EIO);
            }
        }
    }

    /// The chunks of a ready cold READ: its remote pieces staged in the tag's scratch slot,
    /// local pieces read from the gate's files (which the keepalive holds).
    pub(super) fn stage_cold(
        &self,
        io: &IoDesc,
        ready: ReadyRead<'_>,
    ) -> Result<ColdReady, ReadError> {
        let queue = self
            .queue(io)
            .ok_or(ReadError::NoQueue { queue: io.queue })?;
        let mut cold = 0;
        for piece in ready.remote_pieces()? {
            queue
                .scratch()?
                .stage(io.tag, piece.buf_offset, piece.bytes)?;
            cold += piece.bytes.len() as u64;
        }
        let scratch = queue.scratch()?;
        let slot = scratch.offset(io.tag, 0, u64::from(io.len))?;
        let gate = ready.gate;
        let files = PlanFiles::of(&gate, Some((scratch.file(), slot)));
        let mut chunks = Vec::with_capacity(ready.plan.segments().len());
        read_chunks(ready.plan.segments(), io.len, &files, &mut chunks)?;
        Ok(ColdReady {
            chunks,
            keep: Keep::read(
                gate,
                if cold > 0 {
                    Some(scratch.lease(io.tag, u64::from(io.len))?)
                } else {
                    None
                },
            ),
            cold,
        })
    }
}
