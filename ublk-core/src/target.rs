//! The target contract: what a block device answers, and how its data moves.
//!
//! The queue loop reads each request from the kernel, describes it as an [`IoDesc`] and
//! calls [`Target::dispatch`] on the queue's own thread. The target answers with a
//! [`Dispatch`]:
//!
//! - [`Dispatch::Inline`]: an [`Action`] to run now, on the loop thread:
//!   - [`Action::Chunks`]: data-plane chunks. A [`Chunk::read_into`] moves `len` bytes from
//!     `(fd, file_offset)` into the request's buffer at `buf_offset` (serves READ); a
//!     [`Chunk::write_from`] moves them from the request's buffer into the file (serves
//!     WRITE). The queue submits every chunk, counts completions per tag, keeps the first
//!     error, and commits the request once all chunks are done: READ/WRITE complete with the
//!     request's byte count, other ops with 0. A short transfer counts as `-EIO`.
//!   - [`Action::Complete`]: complete the request now with this result (bytes or `-errno`).
//! - [`Dispatch::Deferred`]: the target took a [`Deferred`](crate::Deferred) token from the
//!   [`DispatchCtx`](crate::DispatchCtx) and will finish the request later from any thread.
//!   The token posts its action through the queue's channel and wakes the loop with an
//!   eventfd; a token dropped unfinished completes the request with `-EIO`.
//!
//! Contracts:
//! - **What may block where.** `dispatch`, `after_read` and `after_write` run on the queue's
//!   loop thread and must never block: no waiting on locks (use `try_*` and defer when
//!   contended), no network, no fsync. Anything that may wait is deferred.
//! - **Who owns the fds.** A chunk names a file descriptor the target owns. It must stay open
//!   until the request is committed; the simplest way is to hold the file (or an `Arc` of it)
//!   in the target or in the request's keepalive. The queue never closes target fds.
//! - **Keepalive.** A [`Keepalive`] attached to an action is held by the queue from the
//!   moment the action is accepted until `after_read`/`after_write` ran and the request's
//!   COMMIT is queued, i.e. for the whole time the kernel may move data into or out of the
//!   target's file for this request. It is dropped on the loop thread. Use it to hold a
//!   lock guard (e.g. the cache's rotation read guard) across the kernel I/O.
//! - **Hooks.** `after_read`/`after_write` run once per READ/WRITE that went through chunks,
//!   after the last chunk completed and before the commit, with the result the queue computed
//!   and mutable access to the keepalive; they return the result to commit.

use std::any::Any;
use std::os::fd::RawFd;

/// A value the queue holds for one request until it is committed (see module docs).
pub type Keepalive = Box<dyn Any + Send>;

/// Block-layer operation of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoOp {
    /// Read `len` bytes at `offset` into the request's buffer.
    Read,
    /// Write `len` bytes from the request's buffer at `offset`.
    Write,
    /// Make every completed write durable.
    Flush,
    /// The range's contents are no longer needed.
    Discard,
    /// The range must read back as zeroes.
    WriteZeroes,
}

impl IoOp {
    /// Decode the kernel's `UBLK_IO_OP_*` value; `None` for ops we do not serve.
    pub fn from_kernel(op: u8) -> Option<IoOp> {
        use libublk::sys;
        match u32::from(op) {
            sys::UBLK_IO_OP_READ => Some(IoOp::Read),
            sys::UBLK_IO_OP_WRITE => Some(IoOp::Write),
            sys::UBLK_IO_OP_FLUSH => Some(IoOp::Flush),
            sys::UBLK_IO_OP_DISCARD => Some(IoOp::Discard),
            sys::UBLK_IO_OP_WRITE_ZEROES => Some(IoOp::WriteZeroes),
            _ => None,
        }
    }
}

/// One request as the target sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoDesc {
    /// Operation.
    pub op: IoOp,
    /// Byte offset on the device.
    pub offset: u64,
    /// Length in bytes (0 for FLUSH).
    pub len: u32,
    /// The kernel's `UBLK_IO_F_*` flags (FUA, NOUNMAP, ...).
    pub flags: u32,
    /// Hardware queue that carries the request.
    pub queue: u16,
    /// Tag of the request within its queue (unique among in-flight requests of the queue).
    pub tag: u16,
}

impl IoDesc {
    /// Forced unit access: the write must be durable when it completes.
    pub fn fua(&self) -> bool {
        self.flags & libublk::sys::UBLK_IO_F_FUA != 0
    }

    /// The result a fully successful request of this op completes with.
    pub fn success_result(&self) -> i32 {
        match self.op {
            IoOp::Read | IoOp::Write => i32::try_from(self.len).unwrap_or(i32::MAX),
            _ => 0,
        }
    }
}

/// Direction of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkDir {
    /// File → request buffer.
    ReadInto,
    /// Request buffer → file.
    WriteFrom,
}

/// One data-plane step of a request: `len` bytes between `(fd, file_offset)` and the
/// request's buffer at `buf_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Direction.
    pub dir: ChunkDir,
    /// The target's file (kept open by the target until the request commits).
    pub fd: RawFd,
    /// Offset in `fd`.
    pub file_offset: u64,
    /// Byte count.
    pub len: u32,
    /// Offset within the request's buffer.
    pub buf_offset: u32,
}

impl Chunk {
    /// Read `len` bytes of `fd` at `file_offset` into the request's buffer at `buf_offset`.
    pub fn read_into(fd: RawFd, file_offset: u64, len: u32, buf_offset: u32) -> Chunk {
        Chunk {
            dir: ChunkDir::ReadInto,
            fd,
            file_offset,
            len,
            buf_offset,
        }
    }

    /// Write `len` bytes of the request's buffer at `buf_offset` to `fd` at `file_offset`.
    pub fn write_from(fd: RawFd, file_offset: u64, len: u32, buf_offset: u32) -> Chunk {
        Chunk {
            dir: ChunkDir::WriteFrom,
            fd,
            file_offset,
            len,
            buf_offset,
        }
    }
}

/// What to do with a request.
#[derive(Debug)]
pub enum Action {
    /// Move data (see [`Chunk`]); an empty list completes like a successful request.
    Chunks(Vec<Chunk>),
    /// Complete now with this result: bytes for READ/WRITE, 0 for others, `-errno` on error.
    Complete(i32),
}

/// The target's answer to [`Target::dispatch`].
pub enum Dispatch {
    /// Run `action` now on the loop thread, holding `keepalive` until the commit.
    Inline {
        action: Action,
        keepalive: Option<Keepalive>,
    },
    /// The target took a [`Deferred`](crate::Deferred) token and finishes later.
    Deferred,
}

impl Dispatch {
    /// Inline action without a keepalive.
    pub fn inline(action: Action) -> Dispatch {
        Dispatch::Inline {
            action,
            keepalive: None,
        }
    }

    /// Complete now with `result`.
    pub fn complete(result: i32) -> Dispatch {
        Dispatch::inline(Action::Complete(result))
    }
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dispatch::Inline { action, keepalive } => f
                .debug_struct("Inline")
                .field("action", action)
                .field("keepalive", &keepalive.is_some())
                .finish(),
            Dispatch::Deferred => f.write_str("Deferred"),
        }
    }
}

/// A block device's behaviour. One instance serves every queue of a device (it is shared by
/// the queue threads), so per-queue state belongs behind `io.queue`.
pub trait Target: Send + Sync + 'static {
    /// Decide what to do with one request; runs on the loop thread and must not block.
    fn dispatch(&self, io: &IoDesc, ctx: &mut crate::DispatchCtx<'_>) -> Dispatch;

    /// After every chunk of a READ completed; returns the result to commit.
    fn after_read(&self, _io: &IoDesc, result: i32, _keepalive: Option<&mut Keepalive>) -> i32 {
        result
    }

    /// After every chunk of a WRITE completed; returns the result to commit.
    fn after_write(&self, _io: &IoDesc, result: i32, _keepalive: Option<&mut Keepalive>) -> i32 {
        result
    }
}

impl<T: Target> Target for std::sync::Arc<T> {
    fn dispatch(&self, io: &IoDesc, ctx: &mut crate::DispatchCtx<'_>) -> Dispatch {
        (**self).dispatch(io, ctx)
    }
    fn after_read(&self, io: &IoDesc, result: i32, keepalive: Option<&mut Keepalive>) -> i32 {
        (**self).after_read(io, result, keepalive)
    }
    fn after_write(&self, io: &IoDesc, result: i32, keepalive: Option<&mut Keepalive>) -> i32 {
        (**self).after_write(io, result, keepalive)
    }
}
