//! Zero-copy data plane: chunks become `READ_FIXED`/`WRITE_FIXED` on the queue's ring.
//!
//! With `UBLK_F_AUTO_BUF_REG` the kernel registers each request's pages in this ring's
//! sparse buffer table at slot = tag before it completes the FETCH, and unregisters them when
//! the request is committed. A chunk is then a fixed-buffer read or write between the
//! target's fd and that slot, with the buffer "address" being the offset inside the request.
//! No byte passes through user space; zeroes come from `/dev/zero` the same way.

use super::cmd::{push, user_data, CqeKind};
use super::ChunkStart;
use crate::target::Chunk;
use io_uring::{opcode, types, IoUring};
use std::os::fd::{AsRawFd, RawFd};

/// Set up the ring for zero-copy: a sparse buffer table of `depth` slots.
pub(crate) fn prepare_ring(ring: &IoUring, depth: u16) -> std::io::Result<()> {
    ring.submitter().register_buffers_sparse(u32::from(depth))
}

/// Submit one chunk of request `tag`; its completion arrives as a `Chunk` CQE. A
/// [`Chunk::Zeros`] reads from `zero_fd` (`/dev/zero`). The SQE names the chunk's file by
/// its fd: the caller keeps `chunk` (which owns that file) until the completion is reaped.
pub(crate) fn start_chunk(
    ring: &mut IoUring,
    tag: u16,
    chunk: &Chunk,
    zero_fd: RawFd,
) -> ChunkStart {
    // Inside a kernel-registered buffer the address is the byte offset in the request.
    let addr = usize::try_from(chunk.buf_offset()).unwrap_or(usize::MAX);
    let len = chunk.len();
    let sqe = match chunk {
        Chunk::ReadInto {
            file, file_offset, ..
        } => opcode::ReadFixed::new(
            types::Fd(file.as_raw_fd()),
            std::ptr::without_provenance_mut(addr),
            len,
            tag,
        )
        .offset(*file_offset)
        .build(),
        Chunk::Zeros { .. } => opcode::ReadFixed::new(
            types::Fd(zero_fd),
            std::ptr::without_provenance_mut(addr),
            len,
            tag,
        )
        .build(),
        Chunk::WriteFrom {
            file, file_offset, ..
        } => opcode::WriteFixed::new(
            types::Fd(file.as_raw_fd()),
            std::ptr::without_provenance(addr),
            len,
            tag,
        )
        .offset(*file_offset)
        .build(),
    };
    let sqe = sqe.user_data(user_data(CqeKind::Chunk, tag));
    match push(ring, &sqe) {
        Ok(()) => ChunkStart::Submitted,
        Err(e) => ChunkStart::Done(-e.raw_os_error().unwrap_or(libc::EIO)),
    }
}
