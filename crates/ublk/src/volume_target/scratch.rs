//! Per-queue scratch memory for cold reads.
//!
//! Cold-read scratch invariant: bytes fetched from the object store for a READ are staged
//! here and the kernel reads them from here; the read path never writes into the active
//! cache file (a concurrent write to the same block would be clobbered).
//!
//! One memfd per queue, made at the queue's first cold read (queues the kernel clamped away,
//! or that never read cold, have none), `depth * max_io_bytes` long and sparse. Tag `t` owns
//! the slot `[t * max_io_bytes, (t + 1) * max_io_bytes)`; a request's byte at buffer offset
//! `o` is staged at `slot + o`. Tags are unique among a queue's in-flight requests, so a slot
//! has one user at a time: from staging until the request's COMMIT, during which the
//! request's keepalive holds a [`SlotLease`]. Dropping the lease punches the slot's bytes
//! out again, so scratch holds memory only while a cold read is in flight (not `depth *
//! max_io_bytes` per queue forever once touched).

use glidefs_model::log::chain;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Why scratch memory could not be created or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

/// A staged slot, held by the request's keepalive until its COMMIT; its drop frees the
/// slot's memory (hole punch).
#[derive(Debug)]
pub(crate) struct SlotLease {
    file: Arc<File>,
    offset: u64,
    len: u64,
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        use rustix::fs::{fallocate, FallocateFlags};
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        if let Err(e) = fallocate(&*self.file, flags, self.offset, self.len) {
            // Only memory stays in use; the next stage overwrites the slot anyway.
            tracing::debug!(offset = self.offset, len = self.len, error = %chain(&e), "punching a scratch slot failed");
        }
    }
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

    /// The memfd (a chunk reading a staged slot holds a clone).
    pub(crate) fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// The lease of tag `tag`'s first `len` bytes, for the request's keepalive.
    pub(crate) fn lease(&self, tag: u16, len: u64) -> Result<SlotLease, ScratchError> {
        Ok(SlotLease {
            file: Arc::clone(&self.file),
            offset: self.offset(tag, 0, len)?,
            len,
        })
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

    #[test]
    fn a_released_slot_gives_its_memory_back() {
        use std::os::unix::fs::MetadataExt;
        let s = Scratch::new(0, 4, 1 << 20).unwrap();
        let used = || s.file.metadata().unwrap().blocks() * 512;
        let lease = s.lease(1, 1 << 20).unwrap();
        s.stage(1, 0, &vec![0xAB; 1 << 20]).unwrap();
        s.stage(2, 0, &[0xCD; 4096]).unwrap(); // another tag's slot, not leased here
        assert!(used() >= (1 << 20) + 4096, "staged: {} bytes", used());
        drop(lease);
        assert!(
            used() < 1 << 20,
            "tag 1's slot still holds memory after its lease ended: {} bytes",
            used()
        );
        let mut got = [0u8; 4096];
        s.file.read_exact_at(&mut got, 2 << 20).unwrap();
        assert_eq!(got, [0xCD; 4096], "the punch stayed inside tag 1's slot");
    }
}
