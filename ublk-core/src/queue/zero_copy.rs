//! Zero-copy data plane: chunks become `READ_FIXED`/`WRITE_FIXED` on the queue's ring.
//!
//! With `UBLK_F_AUTO_BUF_REG` the kernel registers each request's pages in this ring's
//! sparse buffer table at slot = tag before it completes the FETCH, and unregisters them when
//! the request is committed. A chunk is then a fixed-buffer read or write between the
//! target's fd and that slot, with the buffer "address" being the offset inside the request.
//! No byte passes through user space; zeroes come from `/dev/zero` the same way (a read of
//! it may stop early: the queue submits the rest, see [`rest_of_zeros`]).

use super::cmd::{chunk_user_data, push};
use crate::io::ChunkStart;
use crate::target::Chunk;
use io_uring::{opcode, types, IoUring};
use std::os::fd::{AsRawFd, RawFd};

/// Set up the ring for zero-copy: a sparse buffer table of `depth` slots.
pub(crate) fn prepare_ring(ring: &IoUring, depth: u16) -> std::io::Result<()> {
    ring.submitter().register_buffers_sparse(u32::from(depth))
}

/// Submit chunk `index` of request `tag`; its completion arrives as a `Chunk` CQE carrying
/// both. A [`Chunk::Zeros`] reads from `zero_fd` (`/dev/zero`), which may move fewer bytes
/// than asked (see [`rest_of_zeros`]). The SQE names the chunk's file by its fd: the caller
/// keeps `chunk` (which owns that file) until the completion is reaped.
pub(crate) fn start_chunk(
    ring: &mut IoUring,
    tag: u16,
    index: u32,
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
    let sqe = sqe.user_data(chunk_user_data(tag, index));
    match push(ring, &sqe) {
        Ok(()) => ChunkStart::Submitted,
        Err(e) => ChunkStart::Done(-e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// What is left of a [`Chunk::Zeros`] whose read of `/dev/zero` moved only `done` bytes
/// (`0 < done < len`), to submit again; `None` for any other chunk or count. The kernel's
/// `/dev/zero` stops early when the reader should reschedule under `IOCB_NOWAIT` (how
/// io_uring first issues a read) or has a signal pending, and io_uring completes a partial
/// read of a character device as it is (it retries only regular files and block devices):
/// on a loaded machine a READ of never-written blocks would otherwise fail with EIO.
/// A regular file's short read is its end, an error (see `finish_chunks`).
pub(crate) fn rest_of_zeros(chunk: &Chunk, done: i32) -> Option<Chunk> {
    let Chunk::Zeros { len, buf_offset } = *chunk else {
        return None;
    };
    let done = u32::try_from(done).ok().filter(|&d| d > 0 && d < len)?;
    Some(Chunk::zeros(len - done, buf_offset + done))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_short_zeros_read_leaves_the_rest_of_the_chunk() {
        let z = Chunk::zeros(256 << 10, 4096);
        let rest = rest_of_zeros(&z, 120 << 10).expect("short");
        assert_eq!(
            (rest.buf_offset(), rest.len()),
            (4096 + (120 << 10), 136 << 10)
        );
        assert!(matches!(rest, Chunk::Zeros { .. }));
        // Complete, failed, empty or over-long counts leave nothing to resubmit.
        for done in [256 << 10, 0, -libc::EIO, (256 << 10) + 1] {
            assert!(rest_of_zeros(&z, done).is_none(), "done = {done}");
        }
        // A file's short read is its end: never resubmitted.
        let f = Arc::new(std::fs::File::open("/dev/null").unwrap());
        assert!(rest_of_zeros(&Chunk::read_into(&f, 0, 8192, 0), 4096).is_none());
    }
}
