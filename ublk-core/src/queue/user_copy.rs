//! USER_COPY data plane: chunks are copied with pread/pwrite through a per-queue bounce
//! buffer.
//!
//! With `UBLK_F_USER_COPY` the request's pages are reachable as a file range of
//! `/dev/ublkcN`: offset `UBLKSRV_IO_BUF_OFFSET | queue << QID_OFF | tag << TAG_OFF` plus the
//! offset inside the request. A READ chunk preads the target file and pwrites the char
//! device; a WRITE chunk does the reverse. The copy is synchronous on the loop thread, so a
//! chunk is finished when `start_chunk` returns; the bounce buffer is never handed to the
//! kernel beyond one syscall. A zeroes chunk pwrites zeroes to the char device.
//!
//! Every descriptor used here is owned, so no copy can go through a closed, and possibly
//! reused, fd number: the queue owns its own duplicate of the `/dev/ublkcN` descriptor (a
//! queue thread that outlives its device, detached after a join timeout, still holds it),
//! and a chunk owns its target file (see [`Chunk`]). The bounce buffer is page-aligned, so
//! target files opened with `O_DIRECT` work.

use crate::io::ChunkStart;
use crate::target::Chunk;
use libublk::sys;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

/// Per-queue USER_COPY state.
#[derive(Debug)]
pub(crate) struct UserCopy {
    cdev: File,
    queue: u16,
    /// `len + ALIGN` bytes; the copy window starts at `start`, a page boundary.
    bounce: Vec<u8>,
    start: usize,
    len: usize,
}

/// Alignment of the bounce window (`O_DIRECT` on any filesystem we know).
const ALIGN: usize = 4096;

/// `/dev/ublkcN` file offset of byte `offset` of request `(queue, tag)`.
pub(crate) fn user_copy_pos(queue: u16, tag: u16, offset: u32) -> u64 {
    u64::from(sys::UBLKSRV_IO_BUF_OFFSET)
        + ((u64::from(queue) << sys::UBLK_QID_OFF)
            | (u64::from(tag) << sys::UBLK_TAG_OFF)
            | u64::from(offset))
}

impl UserCopy {
    pub(crate) fn new(cdev: OwnedFd, queue: u16, max_io_bytes: u32) -> UserCopy {
        let len = max_io_bytes as usize;
        let bounce = vec![0u8; len + ALIGN];
        let start = bounce.as_ptr().align_offset(ALIGN).min(ALIGN);
        UserCopy {
            cdev: File::from(cdev),
            queue,
            bounce,
            start,
            len,
        }
    }

    /// Copy one chunk of request `tag` now.
    pub(crate) fn start_chunk(&mut self, tag: u16, chunk: &Chunk) -> ChunkStart {
        let len = chunk.len() as usize;
        if len > self.len {
            return ChunkStart::Done(-libc::EINVAL);
        }
        let pos = user_copy_pos(self.queue, tag, chunk.buf_offset());
        let cdev = &self.cdev;
        let buf = &mut self.bounce[self.start..self.start + len];
        let res = match chunk {
            Chunk::ReadInto {
                file, file_offset, ..
            } => pread_full(file, buf, *file_offset).and_then(|()| pwrite_full(cdev, buf, pos)),
            Chunk::WriteFrom {
                file, file_offset, ..
            } => pread_full(cdev, buf, pos).and_then(|()| pwrite_full(file, buf, *file_offset)),
            Chunk::Zeros { .. } => {
                buf.fill(0);
                pwrite_full(cdev, buf, pos)
            }
        };
        ChunkStart::Done(match res {
            Ok(()) => i32::try_from(chunk.len()).unwrap_or(i32::MAX),
            Err(errno) => -errno,
        })
    }
}

/// The errno of a failed copy (EIO where the error has none, e.g. end of file).
fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Read all of `buf` at `offset` (retrying EINTR and short reads); `Err(errno)`, EIO for end
/// of file.
fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> Result<(), i32> {
    file.read_exact_at(buf, offset).map_err(|e| errno(&e))
}

/// Write all of `buf` at `offset` (retrying EINTR and short writes); `Err(errno)`.
fn pwrite_full(file: &File, buf: &[u8], offset: u64) -> Result<(), i32> {
    file.write_all_at(buf, offset).map_err(|e| errno(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;

    #[test]
    fn user_copy_pos_matches_kernel_layout() {
        let base = u64::from(sys::UBLKSRV_IO_BUF_OFFSET);
        assert_eq!(user_copy_pos(0, 0, 0), base);
        assert_eq!(user_copy_pos(0, 1, 0), base + (1 << sys::UBLK_TAG_OFF));
        assert_eq!(
            user_copy_pos(2, 3, 512),
            base + (2 << sys::UBLK_QID_OFF) + (3 << sys::UBLK_TAG_OFF) + 512
        );
    }

    fn rw_file(dir: &tempfile::TempDir, name: &str) -> std::fs::File {
        std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join(name))
            .unwrap()
    }

    #[test]
    fn full_reads_and_writes_and_end_of_file() {
        // Given a file with 4 KiB of sevens at 8 KiB,
        let dir = tempfile::tempdir().unwrap();
        let f = rw_file(&dir, "t");
        pwrite_full(&f, &[7u8; 4096], 8192).unwrap();
        // a full read returns exactly those bytes,
        let mut buf = vec![0u8; 4096];
        pread_full(&f, &mut buf, 8192).unwrap();
        assert!(buf.iter().all(|&b| b == 7));
        // and a read past the end is an I/O error, never a short success.
        assert_eq!(pread_full(&f, &mut buf, 10240), Err(libc::EIO));
    }

    #[test]
    fn chunk_larger_than_bounce_buffer_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let (t, c) = (rw_file(&dir, "t"), rw_file(&dir, "c"));
        let mut uc = UserCopy::new(OwnedFd::from(c), 0, 65536);
        let too_big = Chunk::read_into(&Arc::new(t), 0, 1 << 20, 0);
        assert_eq!(uc.start_chunk(0, &too_big), ChunkStart::Done(-libc::EINVAL));
    }

    #[test]
    fn bounce_window_is_page_aligned_and_full_size() {
        let dir = tempfile::tempdir().unwrap();
        let uc = UserCopy::new(OwnedFd::from(rw_file(&dir, "c")), 0, 65536);
        let window = &uc.bounce[uc.start..uc.start + uc.len];
        assert_eq!(window.as_ptr() as usize % ALIGN, 0);
        assert_eq!(window.len(), 65536);
    }

    #[test]
    fn a_chunk_keeps_its_file_open_after_the_target_dropped_its_own() {
        // The target's file holds 4 KiB of sevens at 8 KiB; the target builds a chunk over
        // it, then lets go of its own handle before the queue runs the chunk.
        let dir = tempfile::tempdir().unwrap();
        let target_file = Arc::new(rw_file(&dir, "t"));
        target_file.write_all_at(&[7u8; 4096], 8192).unwrap();
        let chunk = Chunk::read_into(&target_file, 8192, 4096, 0);
        let fd = target_file.as_raw_fd();
        drop(target_file);
        // The chunk's fd still names the target's file,
        let named = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        assert_eq!(named, dir.path().join("t"));
        // and the copy moves the target's bytes into the request (the "char device" is a
        // plain file here).
        let c = rw_file(&dir, "c");
        let probe = c.try_clone().unwrap();
        let mut uc = UserCopy::new(OwnedFd::from(c), 0, 8192);
        assert_eq!(uc.start_chunk(2, &chunk), ChunkStart::Done(4096));
        let mut back = [0u8; 4096];
        pread_full(&probe, &mut back, user_copy_pos(0, 2, 0)).unwrap();
        assert!(back.iter().all(|&b| b == 7));
        // Dropping the last chunk closes the file.
        drop(chunk);
        assert!(std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map_or(true, |p| p != dir.path().join("t")));
    }

    #[test]
    fn a_write_chunk_moves_the_request_into_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let target_file = Arc::new(rw_file(&dir, "t"));
        let chunk = Chunk::write_from(&target_file, 4096, 1024, 512);
        let c = rw_file(&dir, "c");
        let probe = c.try_clone().unwrap();
        let mut uc = UserCopy::new(OwnedFd::from(c), 1, 8192);
        pwrite_full(&probe, &[5u8; 1024], user_copy_pos(1, 3, 512)).unwrap();
        assert_eq!(uc.start_chunk(3, &chunk), ChunkStart::Done(1024));
        let mut back = [0u8; 1024];
        pread_full(&target_file, &mut back, 4096).unwrap();
        assert!(back.iter().all(|&b| b == 5));
    }

    #[test]
    fn zeroes_chunk_writes_zeroes_at_the_request_offset() {
        // The "char device" is a plain file here: the zeroes land at the per-tag offset.
        let dir = tempfile::tempdir().unwrap();
        let c = rw_file(&dir, "c");
        let probe = c.try_clone().unwrap();
        let mut uc = UserCopy::new(OwnedFd::from(c), 0, 8192);
        let pos = user_copy_pos(0, 1, 512);
        pwrite_full(&probe, &[9u8; 1024], pos).unwrap();
        assert_eq!(
            uc.start_chunk(1, &Chunk::zeros(1024, 512)),
            ChunkStart::Done(1024)
        );
        let mut back = [1u8; 1024];
        pread_full(&probe, &mut back, pos).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }
}
