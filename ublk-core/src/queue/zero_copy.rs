//! Zero-copy data plane: chunks become `READ_FIXED`/`WRITE_FIXED` on the queue's ring.
//!
//! With `UBLK_F_AUTO_BUF_REG` the kernel registers each request's pages in this ring's
//! sparse buffer table at slot = tag before it completes the FETCH, and unregisters them when
//! the request is committed. A chunk is then a fixed-buffer read or write between the
//! target's fd and that slot, with the buffer "address" being the offset inside the request.
//! No byte passes through user space; zeroes come from `/dev/zero` the same way.

use super::cmd::{push, user_data, CqeKind};
use super::ChunkStart;
use crate::target::{Chunk, ChunkDir};
use io_uring::{opcode, types, IoUring};
use std::os::fd::RawFd;

/// Set up the ring for zero-copy: a sparse buffer table of `depth` slots.
pub(crate) fn prepare_ring(ring: &IoUring, depth: u16) -> std::io::Result<()> {
    ring.submitter().register_buffers_sparse(u32::from(depth))
}

/// Submit one chunk of request `tag`; its completion arrives as a `Chunk` CQE. A
/// [`ChunkDir::Zeros`] chunk reads from `zero_fd` (`/dev/zero`).
pub(crate) fn start_chunk(
    ring: &mut IoUring,
    tag: u16,
    chunk: &Chunk,
    zero_fd: RawFd,
) -> ChunkStart {
    // Inside a kernel-registered buffer the address is the byte offset in the request.
    let addr = usize::try_from(chunk.buf_offset).unwrap_or(usize::MAX);
    let sqe = match chunk.dir {
        ChunkDir::ReadInto | ChunkDir::Zeros => opcode::ReadFixed::new(
            types::Fd(if chunk.dir == ChunkDir::Zeros {
                zero_fd
            } else {
                chunk.fd
            }),
            std::ptr::without_provenance_mut(addr),
            chunk.len,
            tag,
        )
        .offset(chunk.file_offset)
        .build(),
        ChunkDir::WriteFrom => opcode::WriteFixed::new(
            types::Fd(chunk.fd),
            std::ptr::without_provenance(addr),
            chunk.len,
            tag,
        )
        .offset(chunk.file_offset)
        .build(),
    };
    let sqe = sqe.user_data(user_data(CqeKind::Chunk, tag));
    match push(ring, &sqe) {
        Ok(()) => ChunkStart::Submitted,
        Err(e) => ChunkStart::Done(-e.raw_os_error().unwrap_or(libc::EIO)),
    }
}
