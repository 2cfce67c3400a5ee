//! The libc calls std does not offer: punching a hole, reserving space, syncing a directory's
//! entries, starting writeback.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Deallocates `len` bytes at `offset` (reads return zeros afterwards); the file size is kept.
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let off = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
    let n = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: fallocate only reads its integer arguments; the fd is valid for the call because
    // `file` is borrowed for its duration.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes created/renamed/removed entries of `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Starts writeback of a file range without waiting for it (a later fdatasync then has less
/// to do).
pub(crate) fn start_writeback(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let off = libc::off64_t::try_from(offset).map_err(std::io::Error::other)?;
    let n = libc::off64_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: sync_file_range only reads its integer arguments; the fd is valid for the call
    // because `file` is borrowed for its duration.
    let rc =
        unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Allocates `len` bytes of disk for `file` at `offset` without changing its size (writes
/// that extend the file into them need no new blocks).
pub(crate) fn reserve_range(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let off = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
    let n = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: fallocate only reads its integer arguments; the fd is valid for the call because
    // `file` is borrowed for its duration.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, off, n) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
