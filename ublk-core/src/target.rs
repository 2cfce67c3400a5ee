//! The target contract: what a block device answers, and how its data moves.
//!
//! The queue loop reads each request from the kernel, describes it as an [`IoDesc`] and
//! calls [`Target::dispatch`] on the queue's own thread. The target answers with a
//! [`Dispatch`]:
//!
//! - [`Dispatch::Inline`]: an [`Action`] to run now, on the loop thread:
//!   - [`Action::Chunks`]: data-plane chunks. A [`Chunk::ReadInto`] moves `len` bytes from
//!     `(file, file_offset)` into the request's buffer at `buf_offset` (serves READ); a
//!     [`Chunk::WriteFrom`] moves them from the request's buffer into the file (serves
//!     WRITE); a [`Chunk::Zeros`] fills part of a READ's buffer with zeroes. The queue
//!     submits every chunk, counts completions per tag, keeps the first error, and commits
//!     the request once all chunks are done: READ/WRITE complete with the request's byte
//!     count, other ops with 0. A short transfer counts as `-EIO`.
//!   - [`Action::Complete`]: complete the request now with this result (bytes or `-errno`).
//!     For READ/WRITE a non-negative result must be the request's full length: anything
//!     else (0 included, which the kernel would requeue forever) completes with `-EIO`.
//!     Completing a READ this way leaves the request buffer as it is (a null device).
//! - [`Dispatch::Deferred`]: the target took a [`Deferred`](crate::Deferred) token from the
//!   [`DispatchCtx`] and will finish the request later from any thread.
//!   The token posts its action through the queue's channel and wakes the loop with an
//!   eventfd; a token dropped unfinished completes the request with `-EIO`.
//!
//! Contracts:
//! - **What may block where.** `dispatch`, `after_read` and `after_write` run on the queue's
//!   loop thread and must never block: no waiting on locks (use `try_*` and defer when
//!   contended), no network, no fsync. Anything that may wait is deferred.
//! - **Who owns the fds.** A file-backed chunk owns a clone of the target's `Arc<File>`
//!   (one atomic increment, no allocation), and the queue keeps a request's chunks until
//!   every one of them completed. So the descriptor the kernel is given is open and names
//!   that file for as long as the kernel may use it: a type-level fact, not a promise of the
//!   target, which may drop its own handle at any time (the queue's drop of the last chunk
//!   then closes the file, on the loop thread, once the kernel is done with it). A
//!   [`Chunk::Zeros`] has no file at all. An owning `Arc` was chosen over `unsafe`
//!   constructors taking a raw fd: the targets keep their files in `Arc`s anyway, so the
//!   guarantee costs an atomic increment per chunk and leaves no `unsafe` in any target.
//! - **Keepalive.** [`Target::Keepalive`] is the target's own type. A keepalive attached to
//!   an action is held by the queue from the moment the action is accepted until
//!   `after_read`/`after_write` ran and the request's COMMIT is queued, i.e. for the whole
//!   time the kernel may move data into or out of the target's file for this request, and
//!   it is handed to those hooks as the target gave it (no downcast). It is dropped on the
//!   loop thread. Use it for what the file's lifetime does not cover: a lock guard (e.g. the
//!   cache's rotation read guard) held across the kernel I/O, a ticket to commit after it.
//! - **Coverage.** The chunks of a READ or WRITE must cover the request exactly: every byte
//!   of `[0, len)` once, no overlaps, nothing outside (checked before any chunk starts). A
//!   READ range that should read as zeroes is covered by a [`Chunk::Zeros`]. A request whose
//!   chunks do not cover it (an empty list included) completes with `-EIO` and no chunk runs:
//!   acknowledging it would leak stale buffer contents (READ) or lose data (WRITE).
//! - **Hooks.** `after_read`/`after_write` run once per READ/WRITE that went through chunks,
//!   after the last chunk completed and before the commit, with the result the queue computed
//!   and mutable access to the keepalive; they return the result to commit.
//! - **FUA.** A WRITE with [`IoDesc::fua`] must be durable when it completes. Chunks land in
//!   the page cache (no `RWF_DSYNC` per chunk), so after `after_write` succeeded and the
//!   keepalive was dropped, the queue calls [`Target::make_durable`]; the target completes at
//!   once when its writes are already durable, or defers (e.g. an fdatasync on another
//!   thread) and completes the token once they are. The loop thread never waits for it.

use crate::queue::handle::DispatchCtx;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

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
    /// The kernel's `op_flags` as sent: the op in bits 0-7, the `UBLK_IO_F_*` flags (FUA,
    /// NOUNMAP, ...) at their own bit positions above it.
    pub flags: u32,
    /// Hardware queue that carries the request.
    pub queue: u16,
    /// Tag of the request within its queue (unique among in-flight requests of the queue).
    pub tag: u16,
}

impl IoDesc {
    /// Decode a request from its descriptor fields (`struct ublksrv_io_desc`); `Err(op)` for
    /// an op we do not serve.
    pub fn from_kernel(
        op_flags: u32,
        start_sector: u64,
        nr_sectors: u32,
        queue: u16,
        tag: u16,
    ) -> Result<IoDesc, u8> {
        let op_code = (op_flags & 0xff) as u8;
        let op = IoOp::from_kernel(op_code).ok_or(op_code)?;
        Ok(IoDesc {
            op,
            offset: start_sector << 9,
            len: nr_sectors << 9,
            flags: op_flags,
            queue,
            tag,
        })
    }

    /// Forced unit access: the write must be durable when it completes.
    pub fn fua(&self) -> bool {
        self.flags & libublk::sys::UBLK_IO_F_FUA != 0
    }

    /// The write-zeroes request must not deallocate (`REQ_NOUNMAP`).
    pub fn no_unmap(&self) -> bool {
        self.flags & libublk::sys::UBLK_IO_F_NOUNMAP != 0
    }

    /// The result a fully successful request of this op completes with.
    pub fn success_result(&self) -> i32 {
        match self.op {
            IoOp::Read | IoOp::Write => i32::try_from(self.len).unwrap_or(i32::MAX),
            _ => 0,
        }
    }
}

/// One data-plane step of a request: `len` bytes between a target file and the request's
/// buffer at `buf_offset`, or zeroes into the buffer.
///
/// The fd-backed variants own a clone of the target's `Arc<File>` (one atomic increment per
/// chunk, no allocation): the descriptor the queue hands to the kernel is open, and names
/// that file, for as long as the chunk lives, and the queue keeps every chunk of a request
/// until its completion is reaped. A target cannot name a closed or reused fd by mistake,
/// and dropping its own handle on the file early is harmless.
#[derive(Clone)]
pub enum Chunk {
    /// File → request buffer (serves READ).
    ReadInto {
        /// The target's file.
        file: Arc<File>,
        /// Offset in `file`.
        file_offset: u64,
        /// Byte count.
        len: u32,
        /// Offset within the request's buffer.
        buf_offset: u32,
    },
    /// Request buffer → file (serves WRITE).
    WriteFrom {
        /// The target's file.
        file: Arc<File>,
        /// Offset in `file`.
        file_offset: u64,
        /// Byte count.
        len: u32,
        /// Offset within the request's buffer.
        buf_offset: u32,
    },
    /// Zeroes → request buffer (serves READ; no file: the queue uses its own zero source).
    Zeros {
        /// Byte count.
        len: u32,
        /// Offset within the request's buffer.
        buf_offset: u32,
    },
}

impl Chunk {
    /// Read `len` bytes of `file` at `file_offset` into the request's buffer at
    /// `buf_offset`. The chunk holds a clone of `file` (see the type's docs).
    pub fn read_into(file: &Arc<File>, file_offset: u64, len: u32, buf_offset: u32) -> Chunk {
        Chunk::ReadInto {
            file: Arc::clone(file),
            file_offset,
            len,
            buf_offset,
        }
    }

    /// Write `len` bytes of the request's buffer at `buf_offset` to `file` at `file_offset`.
    /// The chunk holds a clone of `file` (see the type's docs).
    pub fn write_from(file: &Arc<File>, file_offset: u64, len: u32, buf_offset: u32) -> Chunk {
        Chunk::WriteFrom {
            file: Arc::clone(file),
            file_offset,
            len,
            buf_offset,
        }
    }

    /// Fill `len` bytes of a READ's buffer at `buf_offset` with zeroes (a hole, an unwritten
    /// block). The queue reads them from its own zero source.
    pub fn zeros(len: u32, buf_offset: u32) -> Chunk {
        Chunk::Zeros { len, buf_offset }
    }

    /// Byte count.
    pub fn len(&self) -> u32 {
        self.span().1
    }

    /// Whether the chunk moves no byte (the queue refuses such a chunk).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Offset within the request's buffer.
    pub fn buf_offset(&self) -> u32 {
        self.span().0
    }

    /// The file and the offset in it; `None` for [`Chunk::Zeros`].
    pub fn file(&self) -> Option<(&Arc<File>, u64)> {
        match self {
            Chunk::ReadInto {
                file, file_offset, ..
            }
            | Chunk::WriteFrom {
                file, file_offset, ..
            } => Some((file, *file_offset)),
            Chunk::Zeros { .. } => None,
        }
    }

    /// `(buf_offset, len)`.
    fn span(&self) -> (u32, u32) {
        match *self {
            Chunk::ReadInto {
                len, buf_offset, ..
            }
            | Chunk::WriteFrom {
                len, buf_offset, ..
            }
            | Chunk::Zeros { len, buf_offset } => (buf_offset, len),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Chunk::ReadInto { .. } => "ReadInto",
            Chunk::WriteFrom { .. } => "WriteFrom",
            Chunk::Zeros { .. } => "Zeros",
        }
    }
}

/// Chunks are equal when they move the same bytes between the same open file (the same
/// `Arc`) and the same part of the buffer.
impl PartialEq for Chunk {
    fn eq(&self, other: &Chunk) -> bool {
        let same_file = match (self.file(), other.file()) {
            (Some((a, a_off)), Some((b, b_off))) => Arc::ptr_eq(a, b) && a_off == b_off,
            (None, None) => true,
            _ => false,
        };
        self.kind() == other.kind() && self.span() == other.span() && same_file
    }
}

impl Eq for Chunk {}

/// Names the file by its fd number (`File`'s own `Debug` asks the kernel for its path).
impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct(self.kind());
        if let Some((file, file_offset)) = self.file() {
            d.field("fd", &file.as_raw_fd())
                .field("file_offset", &file_offset);
        }
        d.field("len", &self.len())
            .field("buf_offset", &self.buf_offset())
            .finish()
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

/// The target's answer to [`Target::dispatch`] (and to the after-write hooks); `K` is the
/// target's [`Target::Keepalive`].
pub enum Dispatch<K = ()> {
    /// Run `action` now on the loop thread, holding `keepalive` until the commit.
    Inline {
        action: Action,
        keepalive: Option<K>,
    },
    /// The target took a [`Deferred`](crate::Deferred) token and finishes later.
    Deferred,
}

impl<K> Dispatch<K> {
    /// Inline action without a keepalive.
    pub fn inline(action: Action) -> Dispatch<K> {
        Dispatch::Inline {
            action,
            keepalive: None,
        }
    }

    /// Complete now with `result`.
    pub fn complete(result: i32) -> Dispatch<K> {
        Dispatch::inline(Action::Complete(result))
    }
}

impl<K> std::fmt::Debug for Dispatch<K> {
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
    /// What the queue holds for one request until it is committed (see the module docs):
    /// the target's own type, handed back to `after_read`/`after_write` as it was given.
    /// `()` for a target that needs none.
    type Keepalive: Send + 'static;

    /// Decide what to do with one request; runs on the loop thread and must not block.
    fn dispatch(
        &self,
        io: &IoDesc,
        ctx: &mut DispatchCtx<'_, Self::Keepalive>,
    ) -> Dispatch<Self::Keepalive>;

    /// After every chunk of a READ completed; returns the result to commit.
    fn after_read(
        &self,
        _io: &IoDesc,
        result: i32,
        _keepalive: Option<&mut Self::Keepalive>,
    ) -> i32 {
        result
    }

    /// After every chunk of a WRITE completed (`result`: the bytes moved, or `-errno`): the
    /// target's commit of the write. The kernel moves no more data for the request, so the
    /// keepalive is the target's now. Runs on the loop thread and must not block: answer
    /// `Dispatch::complete(result)` (the default), or, when committing needs work that may
    /// block (a log write, a lock a slow thread holds), take `ctx.defer()`, move the
    /// keepalive into that work, return [`Dispatch::Deferred`] and complete the token with
    /// the write's result once it is committed. Only `Action::Complete` answers are accepted
    /// (chunks complete with `-EIO`). A FUA write whose answer is success goes on to
    /// [`make_durable`](Target::make_durable).
    fn after_write(
        &self,
        io: &IoDesc,
        result: i32,
        keepalive: Option<Self::Keepalive>,
        ctx: &mut DispatchCtx<'_, Self::Keepalive>,
    ) -> Dispatch<Self::Keepalive> {
        let _ = (io, keepalive, ctx);
        Dispatch::complete(result)
    }

    /// A FUA WRITE landed (`after_write` answered success, the keepalive is gone): make it
    /// durable. Runs on the loop thread and must not block: return
    /// `Dispatch::complete(io.success_result())` when the data already is durable, or take
    /// `ctx.defer()`, return [`Dispatch::Deferred`] and complete the token once it is. Only
    /// `Action::Complete` answers are accepted here (chunks complete with `-EIO`). The
    /// default treats every landed write as durable (memory and null targets).
    fn make_durable(
        &self,
        io: &IoDesc,
        _ctx: &mut DispatchCtx<'_, Self::Keepalive>,
    ) -> Dispatch<Self::Keepalive> {
        Dispatch::complete(io.success_result())
    }
}

impl<T: Target> Target for std::sync::Arc<T> {
    type Keepalive = T::Keepalive;

    fn dispatch(
        &self,
        io: &IoDesc,
        ctx: &mut DispatchCtx<'_, T::Keepalive>,
    ) -> Dispatch<T::Keepalive> {
        (**self).dispatch(io, ctx)
    }
    fn after_read(&self, io: &IoDesc, result: i32, keepalive: Option<&mut T::Keepalive>) -> i32 {
        (**self).after_read(io, result, keepalive)
    }
    fn after_write(
        &self,
        io: &IoDesc,
        result: i32,
        keepalive: Option<T::Keepalive>,
        ctx: &mut DispatchCtx<'_, T::Keepalive>,
    ) -> Dispatch<T::Keepalive> {
        (**self).after_write(io, result, keepalive, ctx)
    }
    fn make_durable(
        &self,
        io: &IoDesc,
        ctx: &mut DispatchCtx<'_, T::Keepalive>,
    ) -> Dispatch<T::Keepalive> {
        (**self).make_durable(io, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libublk::sys;

    #[test]
    fn fua_write_decodes_with_its_flag() {
        // The kernel sends UBLK_IO_F_* at their positions inside op_flags (FUA = bit 13).
        let op_flags = sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA;
        let io = IoDesc::from_kernel(op_flags, 8, 8, 1, 5).expect("write decodes");
        assert_eq!(io.op, IoOp::Write);
        assert_eq!((io.offset, io.len, io.queue, io.tag), (4096, 4096, 1, 5));
        assert!(
            io.fua(),
            "FUA bit must survive decoding: flags={:#x}",
            io.flags
        );
        assert!(!io.no_unmap());

        let plain = IoDesc::from_kernel(sys::UBLK_IO_OP_WRITE, 0, 1, 0, 0).unwrap();
        assert!(!plain.fua());
        let wz = IoDesc::from_kernel(
            sys::UBLK_IO_OP_WRITE_ZEROES | sys::UBLK_IO_F_NOUNMAP,
            0,
            8,
            0,
            0,
        )
        .unwrap();
        assert_eq!(wz.op, IoOp::WriteZeroes);
        assert!(wz.no_unmap() && !wz.fua());
    }

    #[test]
    fn a_zeros_chunk_has_no_file_and_a_file_chunk_shares_the_targets() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let zeros = Chunk::zeros(4096, 512);
        assert!(zeros.file().is_none());
        assert_eq!((zeros.buf_offset(), zeros.len()), (512, 4096));
        assert_eq!(format!("{zeros:?}"), "Zeros { len: 4096, buf_offset: 512 }");

        let read = Chunk::read_into(&file, 8192, 1024, 0);
        assert_eq!(Arc::strong_count(&file), 2, "the chunk holds one clone");
        let (named, offset) = read.file().expect("a read chunk names its file");
        assert!(Arc::ptr_eq(named, &file));
        assert_eq!(offset, 8192);
        assert_eq!(
            format!("{read:?}"),
            format!(
                "ReadInto {{ fd: {}, file_offset: 8192, len: 1024, buf_offset: 0 }}",
                file.as_raw_fd()
            )
        );
        // Equal chunks name the same open file, not merely the same offsets.
        let other = Arc::new(tempfile::tempfile().unwrap());
        assert_eq!(read, Chunk::read_into(&file, 8192, 1024, 0));
        assert_ne!(read, Chunk::read_into(&other, 8192, 1024, 0));
        assert_ne!(read, Chunk::write_from(&file, 8192, 1024, 0));
        assert_ne!(zeros, Chunk::zeros(4096, 0));
        drop(read);
        assert_eq!(
            Arc::strong_count(&file),
            1,
            "dropping the chunk releases it"
        );
        // The owning handle costs one word over the old raw fd at most (no allocation).
        assert!(std::mem::size_of::<Chunk>() <= 32);
    }

    #[test]
    fn unknown_op_is_reported() {
        assert_eq!(IoDesc::from_kernel(0x7f, 0, 0, 0, 0), Err(0x7f));
    }
}
