//! The per-queue request descriptor array the kernel shares with us.
//!
//! `/dev/ublkcN` exposes, for queue `q`, `queue_depth` `ublksrv_io_desc` records at offset
//! `UBLKSRV_CMD_BUF_OFFSET + q * size(UBLK_MAX_QUEUE_DEPTH)`. The kernel writes a tag's
//! record before completing its FETCH; we read it after reaping that completion.

use libublk::sys;
use std::os::fd::RawFd;

/// Read-only mapping of one queue's descriptors. Unmapped on drop.
#[derive(Debug)]
pub(crate) struct IodArea {
    base: *const sys::ublksrv_io_desc,
    len: usize,
    depth: u16,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory arguments.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v).unwrap_or(4096)
}

fn area_len(depth: usize) -> usize {
    (depth * std::mem::size_of::<sys::ublksrv_io_desc>()).next_multiple_of(page_size())
}

impl IodArea {
    pub(crate) fn map(cdev: RawFd, queue: u16, depth: u16) -> std::io::Result<IodArea> {
        let len = area_len(usize::from(depth));
        let stride = area_len(sys::UBLK_MAX_QUEUE_DEPTH as usize);
        let offset = sys::UBLKSRV_CMD_BUF_OFFSET as usize + usize::from(queue) * stride;
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a fresh shared read-only mapping of the char device; no existing memory is
        // touched. The result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                cdev,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(IodArea {
            base: ptr.cast::<sys::ublksrv_io_desc>().cast_const(),
            len,
            depth,
        })
    }

    /// The descriptor of `tag` (call only after its FETCH completed).
    pub(crate) fn get(&self, tag: u16) -> sys::ublksrv_io_desc {
        assert!(
            tag < self.depth,
            "tag {tag} out of range (depth {})",
            self.depth
        );
        // SAFETY: `tag < depth`, so the record lies inside the live mapping; the kernel wrote
        // it before completing the FETCH we reaped, and a volatile read copes with memory the
        // kernel owns.
        unsafe { std::ptr::read_volatile(self.base.add(usize::from(tag))) }
    }
}

impl Drop for IodArea {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping created in `map`, unmapped once.
        unsafe {
            libc::munmap(self.base.cast_mut().cast::<libc::c_void>(), self.len);
        }
    }
}
