//! The libc calls std does not offer: punching a hole, reserving space, syncing a directory's
//! entries, starting writeback, copying a range between files inside the kernel.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
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

/// The kernel's internal "operation not supported" errno, which some file systems return.
const ENOTSUPP: i32 = 524;

/// Copies `len` bytes at `offset` of `src` to the same offset of `dst` (same file system)
/// inside the kernel, with `copy_file_range`. Where the file system shares extents (XFS with
/// reflink, Btrfs) the kernel clones the range: a metadata update that moves no data, and
/// later writes to either file copy only what they change. Elsewhere it copies in the kernel
/// (no user-space buffer). Where the kernel refuses the call (`ENOSYS`, `EXDEV`, `EINVAL`,
/// `EOPNOTSUPP`, `ENOTSUPP`, or `EPERM` from a seccomp filter) the rest is copied with
/// pread/pwrite. A source that ends before
/// `offset + len` is an error (`UnexpectedEof`), as `read_exact_at` would say.
///
/// Durability is that of a write: the copy is durable once `dst` is synced (a clone is
/// logged in the file system's journal, which `fdatasync` of `dst` forces).
pub(crate) fn copy_range(src: &File, dst: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let end = offset
        .checked_add(len)
        .ok_or_else(|| std::io::Error::other("copy range overflows"))?;
    let mut at = offset;
    while at < end {
        let mut off_in = libc::loff_t::try_from(at).map_err(std::io::Error::other)?;
        let mut off_out = off_in;
        let want = usize::try_from(end - at).map_err(std::io::Error::other)?;
        // SAFETY: copy_file_range reads and updates only the two offsets, which are live
        // locals borrowed for the call; both fds are valid for the call because `src` and
        // `dst` are borrowed for its duration.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        match n {
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("source ends before byte {at} of the range {offset}+{len}"),
                ))
            }
            n if n > 0 => at += n.unsigned_abs() as u64,
            _ => {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    // EPERM: a seccomp filter that denies the call; ENOTSUPP (524, a kernel
                    // errno some network file systems leak).
                    Some(
                        libc::ENOSYS
                        | libc::EXDEV
                        | libc::EINVAL
                        | libc::EOPNOTSUPP
                        | libc::EPERM
                        | ENOTSUPP,
                    ) => {
                        return copy_through_buffer(src, dst, at, end - at);
                    }
                    _ => return Err(e),
                }
            }
        }
    }
    Ok(())
}

/// `copy_range`'s fallback: pread into a buffer, pwrite it back out.
fn copy_through_buffer(src: &File, dst: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
    src.read_exact_at(&mut buf, offset)?;
    dst.write_all_at(&buf, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_range_copies_only_the_range_and_refuses_a_short_source() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let src: Vec<u8> = (0..3 * 65536u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&a, &src).unwrap();
        std::fs::write(&b, vec![7u8; 3 * 65536]).unwrap();
        let (fa, fb) = (
            File::open(&a).unwrap(),
            std::fs::OpenOptions::new().write(true).open(&b).unwrap(),
        );
        copy_range(&fa, &fb, 65536, 65536).unwrap();
        let got = std::fs::read(&b).unwrap();
        assert!(got[..65536].iter().all(|&x| x == 7), "before the range");
        assert_eq!(&got[65536..131072], &src[65536..131072], "the range");
        assert!(got[131072..].iter().all(|&x| x == 7), "after the range");
        let e = copy_range(&fa, &fb, 2 * 65536, 2 * 65536).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        copy_through_buffer(&fa, &fb, 0, 4096).unwrap();
        assert_eq!(&std::fs::read(&b).unwrap()[..4096], &src[..4096]);
    }

    /// A hole in the source (a punched page, a never-written tail inside the file) copies as
    /// zeros over whatever the destination held, as a pread+pwrite of it would; and where the
    /// kernel refuses the call (here `EXDEV`: the destination on another file system, when
    /// /dev/shm is one) the fallback copies the same range with the same result.
    #[test]
    fn copy_range_copies_holes_as_zeros_also_through_the_fallback() {
        let bs = 65536u64;
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let src = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&a)
            .unwrap();
        src.write_all_at(&vec![0x11; bs as usize], bs).unwrap();
        punch_hole(&src, bs + 4096, 8192).unwrap();
        src.set_len(3 * bs).unwrap(); // block 2: a hole up to the end of the file
        let mut want = vec![0x11u8; bs as usize];
        want[4096..12288].fill(0);
        let shm = tempfile::tempdir_in("/dev/shm").ok();
        let dirs: Vec<&Path> = std::iter::once(dir.path())
            .chain(shm.as_ref().map(|d| d.path()))
            .collect();
        for d in dirs {
            let b = d.join("b");
            std::fs::write(&b, vec![7u8; 3 * bs as usize]).unwrap();
            let dst = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
            copy_range(&src, &dst, bs, 2 * bs).unwrap();
            let got = std::fs::read(&b).unwrap();
            assert!(
                got[..bs as usize].iter().all(|&x| x == 7),
                "{}",
                d.display()
            );
            assert!(
                got[bs as usize..2 * bs as usize] == want[..],
                "{}",
                d.display()
            );
            assert!(
                got[2 * bs as usize..].iter().all(|&x| x == 0),
                "{}",
                d.display()
            );
        }
    }
}
