//! READ: inline from local files and holes; cold pieces through the scratch memfd.
//!
//! Inline: under a gate from `try_enter`, the tag's reused plan; when every piece is local
//! (or a hole) the chunks run on the loop thread with the gate as keepalive. Otherwise the
//! request is deferred (`read_cold`): remote blocks are fetched with no gate held
//! (`fetch_block` fills them Clean; the fill takes no gate; a fill that fails, e.g. on a full
//! cache file system, leaves the block uncached but still hands back its bytes, so the READ
//! succeeds; a fetch is joined only when it reads the location the manifest names at the
//! time of the call, so a READ never gets bytes older than a write completed before it
//! started, see `glidefs_volume`'s `fetch`), then the blocking pool enters
//! the gate, re-plans, stages any piece that is still remote from the fetched bytes into the
//! tag's scratch slot, builds the chunks and submits them from that blocking thread (a gate
//! never waits for an async worker); blocks that turned remote since are fetched and the
//! step repeats. The gate of the final plan travels with the chunks.
//!
//! Readahead: every READ is first reported to `Volume::note_read` (atomics only, plus a
//! spawned fetch per cold block ahead of a sequential stream), so a sequential reader finds
//! the next blocks already fetched, or in flight, and joins their fetch (when it still reads
//! the blocks' current locations).

use std::os::fd::AsRawFd;
use std::sync::Arc;

use bytes::Bytes;
use glidefs_cache::{CacheError, ReadPlan};
use ublk_core::{Action, Chunk, Deferred, Dispatch, DispatchCtx, IoDesc};

use super::plan::{read_chunks, remote_pieces, PlanError, PlanFds};
use super::scratch::ScratchError;
use super::{Inner, ReadKeep, MAX_ATTEMPTS};
use crate::daemon::logging::chain;
use crate::ublk::io_stats::IoRecorder;

/// Why a deferred READ failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("planning the read: {0}")]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Scratch(#[from] ScratchError),
    #[error("fetched block {block} has {got} bytes, the plan needs bytes up to {needed}")]
    ShortBlock { block: u64, got: usize, needed: u64 },
    #[error("no state for queue {queue}")]
    NoQueue { queue: u16 },
    #[error("read at {offset}: block {block} is remote but was not fetched")]
    NotFetched { offset: u64, block: u64 },
}

/// Outcome of one attempt of a cold read.
enum ReadStep {
    /// Submitted or completed.
    Done,
    /// These blocks must be fetched first (no gate held any more).
    Fetch {
        blocks: Vec<u64>,
        remote: u64,
        token: Deferred,
    },
}

/// One step of a cold read.
pub(super) enum ColdStep {
    /// Serve with these chunks, holding the keepalive; `cold` bytes came from scratch.
    Ready {
        chunks: Vec<Chunk>,
        keep: ReadKeep,
        cold: u64,
    },
    /// These blocks must be fetched first; `remote` bytes of the request are not local.
    Fetch { blocks: Vec<u64>, remote: u64 },
}

impl Inner {
    /// Dispatch of a READ (loop thread, never blocks).
    pub(super) fn read(self: &Arc<Self>, io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch {
        // Sequential streams start background fetches of the blocks ahead (never blocks).
        self.volume.note_read(io.offset, u64::from(io.len));
        if let Some(gate) = self.cache.try_enter() {
            let mut local = ReadPlan::default();
            let mut guard = self.tag(io).and_then(|t| t.plan.try_lock());
            let plan: &mut ReadPlan = match guard.as_deref_mut() {
                Some(p) => p,
                None => &mut local,
            };
            if let Err(e) = self
                .cache
                .plan_read(&gate, io.offset, u64::from(io.len), plan)
            {
                tracing::warn!(offset = io.offset, len = io.len, error = %chain(&e), "read plan failed");
                return self.complete_now(io, -libc::EIO);
            }
            if plan.is_local() {
                let fds = PlanFds {
                    active: gate.active().as_raw_fd(),
                    flushing: gate.flushing().map(AsRawFd::as_raw_fd),
                    clean: gate.clean().as_raw_fd(),
                    scratch: None,
                };
                let mut chunks = Vec::with_capacity(plan.segments().len());
                if let Err(e) = read_chunks(plan.segments(), io.len, &fds, &mut chunks) {
                    tracing::error!(offset = io.offset, len = io.len, error = %chain(&e), "read plan unusable");
                    return self.complete_now(io, -libc::EIO);
                }
                IoRecorder::bump(&self.stats.inline, 1);
                let keep = ReadKeep {
                    _gate: gate,
                    _scratch: None,
                };
                return Dispatch::Inline {
                    action: Action::Chunks(chunks),
                    keepalive: Some(Box::new(keep)),
                };
            }
            // Remote pieces: the gate is dropped here, before anything is fetched.
        }
        self.defer(ctx, |inner, token| inner.read_cold(token))
    }

    /// The deferred READ (runtime task).
    async fn read_cold(self: Arc<Self>, token: Deferred) {
        let mut token = token;
        let mut fetched: Vec<(u64, Bytes)> = Vec::new();
        let mut first_remote = None;
        for _ in 0..MAX_ATTEMPTS {
            let (inner, have) = (Arc::clone(&self), fetched.clone());
            // A panic in the closure drops the token, which completes the request with -EIO.
            let Ok(step) =
                tokio::task::spawn_blocking(move || inner.read_step(token, &have, first_remote))
                    .await
            else {
                return;
            };
            let (blocks, remote) = match step {
                ReadStep::Done => return,
                ReadStep::Fetch {
                    blocks,
                    remote,
                    token: t,
                } => {
                    token = t;
                    (blocks, remote)
                }
            };
            first_remote.get_or_insert(remote);
            // No gate is held here: a fetch fills the cache without one, and a rotation
            // waiting for the gate's write side must not wait on us.
            match self.fetch_all(&blocks).await {
                Ok(data) => fetched.extend(blocks.into_iter().zip(data)),
                Err(e) => return self.fail_deferred(token, "cold read fetch", &e),
            }
        }
        self.unsettled(token, "cold read");
    }

    /// One attempt of a cold read (blocking pool): plan under a fresh gate and submit from
    /// here (the gate never waits for an async worker), or hand the token back with the
    /// blocks to fetch. `first_remote`: remote bytes of the first attempt, for the stats.
    fn read_step(
        &self,
        token: Deferred,
        have: &[(u64, Bytes)],
        first_remote: Option<u64>,
    ) -> ReadStep {
        let io = *token.io();
        match self.plan_cold(&io, have) {
            Ok(ColdStep::Ready { chunks, keep, cold }) => {
                let remote = first_remote.unwrap_or(cold);
                if remote > 0 {
                    IoRecorder::bump(&self.stats.cold_reads, 1);
                    IoRecorder::bump(&self.stats.cold_read_bytes, remote);
                }
                IoRecorder::bump(&self.stats.scratch_bytes, cold);
                // Recorded in `after_read`.
                token.submit(chunks, Some(Box::new(keep)));
                ReadStep::Done
            }
            Ok(ColdStep::Fetch { blocks, remote }) => ReadStep::Fetch {
                blocks,
                remote,
                token,
            },
            Err(e) => {
                tracing::warn!(offset = io.offset, len = io.len, error = %chain(&e), "cold read failed");
                self.complete_deferred(token, -libc::EIO);
                ReadStep::Done
            }
        }
    }

    /// One planning step of a cold read (blocking pool: `enter` may wait for a rotation).
    pub(super) fn plan_cold(
        &self,
        io: &IoDesc,
        have: &[(u64, Bytes)],
    ) -> Result<ColdStep, ReadError> {
        let gate = self.cache.enter();
        let mut plan = ReadPlan::default();
        self.cache
            .plan_read(&gate, io.offset, u64::from(io.len), &mut plan)?;
        let mut missing: Vec<u64> = plan
            .remote_blocks()
            .filter(|b| !have.iter().any(|(h, _)| h == b))
            .collect();
        if !missing.is_empty() {
            missing.dedup();
            let remote = remote_pieces(plan.segments()).map(|p| p.1).sum();
            return Ok(ColdStep::Fetch {
                blocks: missing,
                remote,
            });
        }
        let queue = self
            .queue(io)
            .ok_or(ReadError::NoQueue { queue: io.queue })?;
        let mut cold = 0;
        for (buf_offset, len, block, within) in remote_pieces(plan.segments()) {
            let data = have
                .iter()
                .find(|(h, _)| *h == block)
                .map(|(_, d)| d)
                .ok_or(ReadError::NotFetched {
                    offset: io.offset,
                    block,
                })?;
            let needed = within + len;
            let piece = usize::try_from(within)
                .ok()
                .zip(usize::try_from(needed).ok())
                .and_then(|(a, b)| data.get(a..b))
                .ok_or(ReadError::ShortBlock {
                    block,
                    got: data.len(),
                    needed,
                })?;
            queue.scratch()?.stage(io.tag, buf_offset, piece)?;
            cold += len;
        }
        let scratch = queue.scratch()?;
        let slot = scratch.offset(io.tag, 0, u64::from(io.len))?;
        let fds = PlanFds {
            active: gate.active().as_raw_fd(),
            flushing: gate.flushing().map(AsRawFd::as_raw_fd),
            clean: gate.clean().as_raw_fd(),
            scratch: Some((scratch.fd(), slot)),
        };
        let mut chunks = Vec::with_capacity(plan.segments().len());
        read_chunks(plan.segments(), io.len, &fds, &mut chunks)?;
        Ok(ColdStep::Ready {
            chunks,
            keep: ReadKeep {
                _gate: gate,
                _scratch: if cold > 0 {
                    Some(scratch.lease(io.tag, u64::from(io.len))?)
                } else {
                    None
                },
            },
            cold,
        })
    }
}
