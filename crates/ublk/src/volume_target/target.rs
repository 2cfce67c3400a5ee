//! [`VolumeTarget`], the ublk-core [`Target`] of a volume: its construction, and each
//! request's dispatch on its queue's loop thread (READ and WRITE to `read.rs` and
//! `write.rs`; FLUSH, FUA, DISCARD and WRITE_ZEROES deferred to the runtime) and what follows
//! a request's chunks (`after_read`, `after_write`). The top of the target's files: `mod.rs`
//! holds the state they all share (`Inner`), which this file does not add to.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use glidefs_model::log::chain;
use glidefs_volume::Volume;
use ublk_core::{Dispatch, IoDesc, IoOp, Target};

use super::commit::Committer;
use super::{errno_of, read, write, DispatchCtx, Inner, IoStats, Keep, QueueState, TagState};
use crate::io_stats::IoRecorder;
use crate::qos::{Direction, Qos};
use glidefs_model::api::QosLimits;

/// The ublk target serving one volume (see the module docs).
#[derive(Debug)]
pub struct VolumeTarget {
    pub(super) inner: Arc<Inner>,
}

impl VolumeTarget {
    /// A target for `volume` with `queues` queues of `depth` tags, requests of at most
    /// `max_io_bytes`; deferred work runs on `rt`, commits that write the WAL in the
    /// target's lane of the commit pool (the error: the pool's first thread could not be
    /// started).
    pub(crate) fn new(
        volume: Arc<Volume>,
        rt: tokio::runtime::Handle,
        queues: u16,
        depth: u16,
        max_io_bytes: u32,
        read_only: bool,
        qos: &QosLimits,
    ) -> Result<VolumeTarget, std::io::Error> {
        let queues = (0..queues)
            .map(|queue| QueueState {
                tags: (0..depth).map(|_| TagState::default()).collect(),
                scratch: std::sync::OnceLock::new(),
                queue,
                depth,
                slot_bytes: max_io_bytes,
            })
            .collect();
        let committer = Committer::start(&volume.config().name)?;
        Ok(VolumeTarget {
            inner: Arc::new(Inner {
                volume,
                rt,
                read_only,
                queues,
                stats: IoRecorder::default(),
                epoch: Instant::now(),
                in_flight: Arc::new(AtomicUsize::new(0)),
                committer,
                qos: Qos::new(qos),
                unthrottled: tokio::sync::watch::Sender::new(false),
                qos_changes: tokio::sync::watch::Sender::new(0),
            }),
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> IoStats {
        self.inner.stats.snapshot()
    }

    /// Deferred tasks still running.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    /// Replaces the QoS limits; requests from the next one on see them (see [`crate::qos`]).
    pub fn set_qos(&self, limits: &QosLimits) {
        self.inner.qos.set(limits);
        self.inner.qos_changes.send_modify(|n| *n += 1);
    }

    /// Ends every QoS wait now and lets no request wait from here on (the device is
    /// stopping or detaching: see `VolumeDevice::stop`). For good.
    pub(crate) fn unthrottle(&self) {
        self.inner.unthrottled.send_replace(true);
    }
}

impl Target for VolumeTarget {
    type Keepalive = Keep;

    fn dispatch(&self, io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch<Keep> {
        let inner = &self.inner;
        inner.mark_start(io);
        if inner.tag(io).is_none() {
            tracing::error!(
                queue = io.queue,
                tag = io.tag,
                "request on an unknown queue/tag"
            );
            return inner.complete_now(io, -libc::EIO);
        }
        if io.op != IoOp::Flush && !inner.in_range(io) {
            tracing::warn!(
                offset = io.offset,
                len = io.len,
                size = inner.volume.size(),
                "request beyond the volume"
            );
            return inner.complete_now(io, -libc::EIO);
        }
        let len = io.len;
        match io.op {
            IoOp::Read => match inner.throttle(io, Direction::Read) {
                None => read::read(inner, io, ctx),
                Some((wait, admitted_at)) => {
                    inner.volume.note_read(io.offset, u64::from(io.len));
                    inner.defer(ctx, move |inner, token| async move {
                        inner
                            .throttle_wait(Direction::Read, len, wait, admitted_at)
                            .await;
                        inner.serve_throttled(token).await;
                    })
                }
            },
            IoOp::Write if inner.read_only => inner.complete_now(io, -libc::EROFS),
            IoOp::Write => match inner.throttle(io, Direction::Write) {
                None => write::write(inner, io, ctx),
                Some((wait, admitted_at)) => inner.defer(ctx, move |inner, token| async move {
                    inner
                        .throttle_wait(Direction::Write, len, wait, admitted_at)
                        .await;
                    inner.serve_throttled(token).await;
                }),
            },
            IoOp::Flush if inner.read_only => inner.complete_now(io, 0),
            IoOp::Flush => inner.defer(ctx, |inner, token| async move {
                let r = match inner.volume.flush_durable().await {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::warn!(error = %chain(&e), "FLUSH failed");
                        errno_of(&e)
                    }
                };
                inner.complete_deferred(token, r);
            }),
            IoOp::Discard | IoOp::WriteZeroes if inner.read_only => {
                inner.complete_now(io, -libc::EROFS)
            }
            IoOp::Discard | IoOp::WriteZeroes => inner.defer(ctx, |inner, token| async move {
                let io = *token.io();
                let r = match inner.zero_range(io.offset, io.len).await {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::warn!(op = ?io.op, offset = io.offset, len = io.len, error = %chain(&e), "zeroing failed");
                        errno_of(&e)
                    }
                };
                inner.complete_deferred(token, r);
            }),
        }
    }

    fn after_read(&self, io: &IoDesc, result: i32, _keepalive: Option<&mut Keep>) -> i32 {
        self.inner.finish(io, result)
    }

    fn after_write(
        &self,
        io: &IoDesc,
        result: i32,
        keepalive: Option<Keep>,
        ctx: &mut DispatchCtx<'_>,
    ) -> Dispatch<Keep> {
        self.inner.commit(io, result, keepalive, ctx)
    }

    fn make_durable(&self, _io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch<Keep> {
        self.inner.defer(ctx, |inner, token| async move {
            let io = *token.io();
            let r = match inner.volume.flush_durable().await {
                Ok(()) => {
                    IoRecorder::bump(&inner.stats.fua_writes, 1);
                    io.success_result()
                }
                Err(e) => {
                    tracing::warn!(offset = io.offset, len = io.len, error = %chain(&e), "FUA flush failed");
                    errno_of(&e)
                }
            };
            inner.complete_deferred(token, r);
        })
    }
}
