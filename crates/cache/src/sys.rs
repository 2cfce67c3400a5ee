//! The libc calls std does not offer: punching a hole, reserving space, syncing a directory's
//! entries, starting writeback, copying a file range through the kernel.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use parking_lot::Mutex;
use rustix::pipe::{PipeFlags, SpliceFlags};

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

/// A pipe for [`copy_range`]: (read end, write end, capacity).
type CopyPipe = (OwnedFd, OwnedFd, usize);

/// Empty pipes kept for the next copies (process-wide, whatever the number of volumes or
/// threads: at most `2 * PIPES_KEPT` file descriptors stay open between copies).
static PIPES: Mutex<Vec<CopyPipe>> = Mutex::new(Vec::new());
const PIPES_KEPT: usize = 4;

/// Largest pipe asked for (the unprivileged default limit of `/proc/sys/fs/pipe-max-size`).
const PIPE_MAX: usize = 1 << 20;

/// Copies `len` bytes at `offset` of `src` to the same offset of `dst` inside the kernel:
/// `splice` from `src` into a pipe (page references, no copy), then from the pipe into `dst`
/// (one copy into its page cache). Unlike `copy_file_range`, it never shares extents (a
/// reflink on XFS would lock both files and make the next write a copy-on-write); unlike
/// pread + pwrite, the bytes never cross into user memory. Holes read as zeros. A source
/// shorter than the range fails with `UnexpectedEof`. Pipes come from a small pool; one that
/// saw a failure (it may hold bytes) is closed, never reused.
pub(crate) fn copy_range(src: &File, dst: &File, offset: u64, len: usize) -> std::io::Result<()> {
    let pooled = PIPES.lock().pop();
    let pipe = match pooled {
        Some(p) => p,
        None => {
            let (r, w) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
            let cap = rustix::pipe::fcntl_setpipe_size(&w, len.clamp(1, PIPE_MAX))
                .or_else(|_| rustix::pipe::fcntl_getpipe_size(&w))?;
            (r, w, cap.max(1))
        }
    };
    splice_through(src, dst, offset, len, (&pipe.0, &pipe.1, pipe.2))?;
    let mut kept = PIPES.lock();
    if kept.len() < PIPES_KEPT {
        kept.push(pipe);
    }
    Ok(())
}

fn splice_through(
    src: &File,
    dst: &File,
    offset: u64,
    len: usize,
    (pipe_r, pipe_w, cap): (&OwnedFd, &OwnedFd, usize),
) -> std::io::Result<()> {
    let (mut off_in, mut off_out) = (offset, offset);
    let mut left = len;
    while left > 0 {
        let filled = retry(|| {
            rustix::pipe::splice(
                src,
                Some(&mut off_in),
                pipe_w,
                None,
                left.min(cap),
                SpliceFlags::MOVE,
            )
        })?;
        if filled == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut drained = 0;
        while drained < filled {
            let n = retry(|| {
                rustix::pipe::splice(
                    pipe_r,
                    None,
                    dst,
                    Some(&mut off_out),
                    filled - drained,
                    SpliceFlags::MOVE,
                )
            })?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            drained += n;
        }
        left -= filled;
    }
    Ok(())
}

/// Runs `f` again while it is interrupted by a signal.
fn retry(mut f: impl FnMut() -> rustix::io::Result<usize>) -> std::io::Result<usize> {
    loop {
        match f() {
            Err(rustix::io::Errno::INTR) => {}
            r => return r.map_err(std::io::Error::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[test]
    fn copy_range_copies_bytes_and_holes_and_refuses_a_short_source() {
        let dir = tempfile::tempdir().unwrap();
        let create = |name: &str| {
            File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(dir.path().join(name))
                .unwrap()
        };
        let (src, dst) = (create("src"), create("dst"));
        // 3 MiB: more than one pipe's worth; a hole in the middle.
        let len = 3 << 20;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        src.write_all_at(&data[..1 << 20], 4096).unwrap();
        src.write_all_at(&data[2 << 20..], 4096 + (2 << 20))
            .unwrap();
        dst.write_all_at(&vec![0xEE; len + 8192], 0).unwrap();
        copy_range(&src, &dst, 4096, len).unwrap();
        let mut back = vec![0u8; len + 8192];
        dst.read_exact_at(&mut back, 0).unwrap();
        assert!(
            back[..4096].iter().all(|&b| b == 0xEE),
            "bytes before the range changed"
        );
        assert!(back[4096..4096 + (1 << 20)] == data[..1 << 20]);
        assert!(
            back[4096 + (1 << 20)..4096 + (2 << 20)]
                .iter()
                .all(|&b| b == 0),
            "a hole copies as zeros"
        );
        assert!(back[4096 + (2 << 20)..4096 + len] == data[2 << 20..]);
        assert!(
            back[4096 + len..].iter().all(|&b| b == 0xEE),
            "bytes after the range changed"
        );
        // Past the source's end: refused, and the next copy works again (that pipe is closed).
        let e = copy_range(&src, &dst, 4096 + len as u64 - 100, 4096).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        copy_range(&src, &dst, 4096, 8192).unwrap();
        dst.read_exact_at(&mut back[..8192], 4096).unwrap();
        assert!(back[..8192] == data[..8192]);
        // Copies side by side keep at most PIPES_KEPT pipes open afterwards.
        std::thread::scope(|s| {
            for _ in 0..3 * PIPES_KEPT {
                s.spawn(|| copy_range(&src, &dst, 4096, 1 << 20).unwrap());
            }
        });
        assert!(PIPES.lock().len() <= PIPES_KEPT);
    }
}
