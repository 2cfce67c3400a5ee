//! Per-queue scratch memory for cold reads.
//!
//! Cold-read scratch invariant: bytes fetched from the object store for a READ are staged
//! here and the kernel reads them from here; the read path never writes into the active
//! cache file (a concurrent write to the same block would be clobbered).
//!
//! One memfd per queue, `depth * max_io_bytes` long (sparse: memory is used only where a
//! slot was written). Tag `t` owns the slot `[t * max_io_bytes, (t + 1) * max_io_bytes)`;
//! a request's byte at buffer offset `o` is staged at `slot + o`. Tags are unique among a
//! queue's in-flight requests, so a slot has one user at a time: from staging until the
//! request's COMMIT, during which the request's keepalive holds an `Arc` of the file.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Why scratch memory could not be created or written.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    #[error("scratch memfd for queue {queue} ({bytes} bytes): {step} failed: {source}")]
    Create {
        queue: u16,
        bytes: u64,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("scratch slot of tag {tag}: {len} bytes at buffer offset {buf_offset} exceed the slot of {slot_bytes} bytes")]
    OutOfSlot {
        tag: u16,
        buf_offset: u64,
        len: u64,
        slot_bytes: u32,
    },
    #[error(
        "scratch write for tag {tag} at file offset {file_offset} ({len} bytes) failed: {source}"
    )]
    Write {
        tag: u16,
        file_offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
}

/// The scratch memfd of one queue.
#[derive(Debug)]
pub(crate) struct Scratch {
    file: Arc<File>,
    slot_bytes: u32,
}

impl Scratch {
    /// A sparse memfd with `depth` slots of `slot_bytes`.
    pub(crate) fn new(queue: u16, depth: u16, slot_bytes: u32) -> Result<Scratch, ScratchError> {
        let bytes = u64::from(depth) * u64::from(slot_bytes);
        let err = |step, source| ScratchError::Create {
            queue,
            bytes,
            step,
            source,
        };
        // SAFETY: the name is a NUL-terminated literal and memfd_create has no other memory
        // arguments; a non-negative result is a new fd that nobody else owns.
        let fd = unsafe { libc::memfd_create(c"glidefs-scratch".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(err("memfd_create", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created above and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(bytes).map_err(|e| err("ftruncate", e))?;
        Ok(Scratch {
            file: Arc::new(file),
            slot_bytes,
        })
    }

    /// File offset of buffer offset `buf_offset` of tag `tag`, checking that `len` bytes fit.
    pub(crate) fn offset(&self, tag: u16, buf_offset: u64, len: u64) -> Result<u64, ScratchError> {
        slot_offset(self.slot_bytes, tag, buf_offset, len)
    }

    /// Stages `data` for tag `tag` at buffer offset `buf_offset`.
    pub(crate) fn stage(&self, tag: u16, buf_offset: u64, data: &[u8]) -> Result<(), ScratchError> {
        let file_offset = self.offset(tag, buf_offset, data.len() as u64)?;
        self.file
            .write_all_at(data, file_offset)
            .map_err(|source| ScratchError::Write {
                tag,
                file_offset,
                len: data.len(),
                source,
            })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The file, for a request's keepalive.
    pub(crate) fn file(&self) -> Arc<File> {
        Arc::clone(&self.file)
    }
}

/// Pure slot arithmetic (see module docs).
pub(crate) fn slot_offset(
    slot_bytes: u32,
    tag: u16,
    buf_offset: u64,
    len: u64,
) -> Result<u64, ScratchError> {
    let fits = buf_offset
        .checked_add(len)
        .is_some_and(|end| end <= u64::from(slot_bytes));
    if !fits {
        return Err(ScratchError::OutOfSlot {
            tag,
            buf_offset,
            len,
            slot_bytes,
        });
    }
    Ok(u64::from(tag) * u64::from(slot_bytes) + buf_offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_per_tag_and_bounded() {
        assert_eq!(slot_offset(65536, 0, 0, 65536).unwrap(), 0);
        assert_eq!(slot_offset(65536, 3, 4096, 512).unwrap(), 3 * 65536 + 4096);
        assert!(slot_offset(65536, 3, 65000, 1024).is_err());
        assert!(slot_offset(65536, 0, u64::MAX, 1).is_err());
    }

    #[test]
    fn staged_bytes_land_in_the_tag_slot() {
        let s = Scratch::new(0, 4, 8192).unwrap();
        s.stage(2, 100, b"hello").unwrap();
        let mut got = [0u8; 5];
        s.file.read_exact_at(&mut got, 2 * 8192 + 100).unwrap();
        assert_eq!(&got, b"hello");
        assert!(matches!(
            s.stage(3, 8190, b"toolong"),
            Err(ScratchError::OutOfSlot { tag: 3, .. })
        ));
    }
}
