//! What a request is and what the target asks the queue to do with it: [`IoOp`] and
//! [`IoDesc`] describe a request read from the kernel; an [`Action`] of [`Chunk`]s moves its
//! data (the contract is in `target.rs`). These types import nothing of the queue or the
//! target, so both build on them.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Block-layer operation of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoOp {
    /// Read `len` bytes at `offset` into the request's buffer.
    Read,
    /// Write `len` bytes from the request's buffer at `offset`.
    Write,
    /// Make every completed write durable.
    Flush,
    /// The range's contents are no longer needed.
    Discard,
    /// The range must read back as zeroes.
    WriteZeroes,
}

impl IoOp {
    /// Decode the kernel's `UBLK_IO_OP_*` value; `None` for ops we do not serve.
    pub fn from_kernel(op: u8) -> Option<IoOp> {
        use libublk::sys;
        match u32::from(op) {
            sys::UBLK_IO_OP_READ => Some(IoOp::Read),
            sys::UBLK_IO_OP_WRITE => Some(IoOp::Write),
            sys::UBLK_IO_OP_FLUSH => Some(IoOp::Flush),
            sys::UBLK_IO_OP_DISCARD => Some(IoOp::Discard),
            sys::UBLK_IO_OP_WRITE_ZEROES => Some(IoOp::WriteZeroes),
            _ => None,
        }
    }
}

/// One request as the target sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoDesc {
    /// Operation.
    pub op: IoOp,
    /// Byte offset on the device.
    pub offset: u64,
    /// Length in bytes (0 for FLUSH).
    pub len: u32,
    /// The kernel's `op_flags` as sent: the op in bits 0-7, the `UBLK_IO_F_*` flags (FUA,
    /// NOUNMAP, ...) at their own bit positions above it.
    pub flags: u32,
    /// Hardware queue that carries the request.
    pub queue: u16,
    /// Tag of the request within its queue (unique among in-flight requests of the queue).
    pub tag: u16,
}

impl IoDesc {
    /// Decode a request from its descriptor fields (`struct ublksrv_io_desc`); `Err(op)` for
    /// an op we do not serve.
    pub fn from_kernel(
        op_flags: u32,
        start_sector: u64,
        nr_sectors: u32,
        queue: u16,
        tag: u16,
    ) -> Result<IoDesc, u8> {
        let op_code = (op_flags & 0xff) as u8;
        let op = IoOp::from_kernel(op_code).ok_or(op_code)?;
        Ok(IoDesc {
            op,
            offset: start_sector << 9,
            len: nr_sectors << 9,
            flags: op_flags,
            queue,
            tag,
        })
    }

    /// Forced unit access: the write must be durable when it completes.
    pub fn fua(&self) -> bool {
        self.flags & libublk::sys::UBLK_IO_F_FUA != 0
    }

    /// The write-zeroes request must not deallocate (`REQ_NOUNMAP`).
    pub fn no_unmap(&self) -> bool {
        self.flags & libublk::sys::UBLK_IO_F_NOUNMAP != 0
    }

    /// The result a fully successful request of this op completes with.
    pub fn success_result(&self) -> i32 {
        match self.op {
            IoOp::Read | IoOp::Write => i32::try_from(self.len).unwrap_or(i32::MAX),
            _ => 0,
        }
    }
}

/// One data-plane step of a request: `len` bytes between a target file and the request's
/// buffer at `buf_offset`, or zeroes into the buffer.
///
/// The fd-backed variants own a clone of the target's `Arc<File>` (one atomic increment per
/// chunk, no allocation): the descriptor the queue hands to the kernel is open, and names
/// that file, for as long as the chunk lives, and the queue keeps every chunk of a request
/// until its completion is reaped. A target cannot name a closed or reused fd by mistake,
/// and dropping its own handle on the file early is harmless.
#[derive(Clone)]
pub enum Chunk {
    /// File → request buffer (serves READ).
    ReadInto {
        /// The target's file.
        file: Arc<File>,
        /// Offset in `file`.
        file_offset: u64,
        /// Byte count.
        len: u32,
        /// Offset within the request's buffer.
        buf_offset: u32,
    },
    /// Request buffer → file (serves WRITE).
    WriteFrom {
        /// The target's file.
        file: Arc<File>,
        /// Offset in `file`.
        file_offset: u64,
        /// Byte count.
        len: u32,
        /// Offset within the request's buffer.
        buf_offset: u32,
    },
    /// Zeroes → request buffer (serves READ; no file: the queue uses its own zero source).
    Zeros {
        /// Byte count.
        len: u32,
        /// Offset within the request's buffer.
        buf_offset: u32,
    },
}

impl Chunk {
    /// Read `len` bytes of `file` at `file_offset` into the request's buffer at
    /// `buf_offset`. The chunk holds a clone of `file` (see the type's docs).
    pub fn read_into(file: &Arc<File>, file_offset: u64, len: u32, buf_offset: u32) -> Chunk {
        Chunk::ReadInto {
            file: Arc::clone(file),
            file_offset,
            len,
            buf_offset,
        }
    }

    /// Write `len` bytes of the request's buffer at `buf_offset` to `file` at `file_offset`.
    /// The chunk holds a clone of `file` (see the type's docs).
    pub fn write_from(file: &Arc<File>, file_offset: u64, len: u32, buf_offset: u32) -> Chunk {
        Chunk::WriteFrom {
            file: Arc::clone(file),
            file_offset,
            len,
            buf_offset,
        }
    }

    /// Fill `len` bytes of a READ's buffer at `buf_offset` with zeroes (a hole, an unwritten
    /// block). The queue reads them from its own zero source.
    pub fn zeros(len: u32, buf_offset: u32) -> Chunk {
        Chunk::Zeros { len, buf_offset }
    }

    /// Byte count.
    pub fn len(&self) -> u32 {
        self.span().1
    }

    /// Whether the chunk moves no byte (the queue refuses such a chunk).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Offset within the request's buffer.
    pub fn buf_offset(&self) -> u32 {
        self.span().0
    }

    /// The file and the offset in it; `None` for [`Chunk::Zeros`].
    pub fn file(&self) -> Option<(&Arc<File>, u64)> {
        match self {
            Chunk::ReadInto {
                file, file_offset, ..
            }
            | Chunk::WriteFrom {
                file, file_offset, ..
            } => Some((file, *file_offset)),
            Chunk::Zeros { .. } => None,
        }
    }

    /// `(buf_offset, len)`.
    fn span(&self) -> (u32, u32) {
        match *self {
            Chunk::ReadInto {
                len, buf_offset, ..
            }
            | Chunk::WriteFrom {
                len, buf_offset, ..
            }
            | Chunk::Zeros { len, buf_offset } => (buf_offset, len),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Chunk::ReadInto { .. } => "ReadInto",
            Chunk::WriteFrom { .. } => "WriteFrom",
            Chunk::Zeros { .. } => "Zeros",
        }
    }
}

/// Chunks are equal when they move the same bytes between the same open file (the same
/// `Arc`) and the same part of the buffer.
impl PartialEq for Chunk {
    fn eq(&self, other: &Chunk) -> bool {
        let same_file = match (self.file(), other.file()) {
            (Some((a, a_off)), Some((b, b_off))) => Arc::ptr_eq(a, b) && a_off == b_off,
            (None, None) => true,
            _ => false,
        };
        self.kind() == other.kind() && self.span() == other.span() && same_file
    }
}

impl Eq for Chunk {}

/// Names the file by its fd number (`File`'s own `Debug` asks the kernel for its path).
impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct(self.kind());
        if let Some((file, file_offset)) = self.file() {
            d.field("fd", &file.as_raw_fd())
                .field("file_offset", &file_offset);
        }
        d.field("len", &self.len())
            .field("buf_offset", &self.buf_offset())
            .finish()
    }
}

/// What to do with a request.
#[derive(Debug)]
pub enum Action {
    /// Move data (see [`Chunk`]); an empty list completes like a successful request.
    Chunks(Vec<Chunk>),
    /// Complete now with this result: bytes for READ/WRITE, 0 for others, `-errno` on error.
    Complete(i32),
}

/// Result of starting a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkStart {
    /// Submitted to the ring; a chunk completion follows.
    Submitted,
    /// Already finished with this result (bytes or `-errno`).
    Done(i32),
}

#[cfg(test)]
mod tests {
    use super::*;
    use libublk::sys;

    #[test]
    fn fua_write_decodes_with_its_flag() {
        // The kernel sends UBLK_IO_F_* at their positions inside op_flags (FUA = bit 13).
        let op_flags = sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA;
        let io = IoDesc::from_kernel(op_flags, 8, 8, 1, 5).expect("write decodes");
        assert_eq!(io.op, IoOp::Write);
        assert_eq!((io.offset, io.len, io.queue, io.tag), (4096, 4096, 1, 5));
        assert!(
            io.fua(),
            "FUA bit must survive decoding: flags={:#x}",
            io.flags
        );
        assert!(!io.no_unmap());

        let plain = IoDesc::from_kernel(sys::UBLK_IO_OP_WRITE, 0, 1, 0, 0).unwrap();
        assert!(!plain.fua());
        let wz = IoDesc::from_kernel(
            sys::UBLK_IO_OP_WRITE_ZEROES | sys::UBLK_IO_F_NOUNMAP,
            0,
            8,
            0,
            0,
        )
        .unwrap();
        assert_eq!(wz.op, IoOp::WriteZeroes);
        assert!(wz.no_unmap() && !wz.fua());
    }

    #[test]
    fn a_zeros_chunk_has_no_file_and_a_file_chunk_shares_the_targets() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let zeros = Chunk::zeros(4096, 512);
        assert!(zeros.file().is_none());
        assert_eq!((zeros.buf_offset(), zeros.len()), (512, 4096));
        assert_eq!(format!("{zeros:?}"), "Zeros { len: 4096, buf_offset: 512 }");

        let read = Chunk::read_into(&file, 8192, 1024, 0);
        assert_eq!(Arc::strong_count(&file), 2, "the chunk holds one clone");
        let (named, offset) = read.file().expect("a read chunk names its file");
        assert!(Arc::ptr_eq(named, &file));
        assert_eq!(offset, 8192);
        assert_eq!(
            format!("{read:?}"),
            format!(
                "ReadInto {{ fd: {}, file_offset: 8192, len: 1024, buf_offset: 0 }}",
                file.as_raw_fd()
            )
        );
        // Equal chunks name the same open file, not merely the same offsets.
        let other = Arc::new(tempfile::tempfile().unwrap());
        assert_eq!(read, Chunk::read_into(&file, 8192, 1024, 0));
        assert_ne!(read, Chunk::read_into(&other, 8192, 1024, 0));
        assert_ne!(read, Chunk::write_from(&file, 8192, 1024, 0));
        assert_ne!(zeros, Chunk::zeros(4096, 0));
        drop(read);
        assert_eq!(
            Arc::strong_count(&file),
            1,
            "dropping the chunk releases it"
        );
        // The owning handle costs one word over the old raw fd at most (no allocation).
        assert!(std::mem::size_of::<Chunk>() <= 32);
    }

    #[test]
    fn unknown_op_is_reported() {
        assert_eq!(IoDesc::from_kernel(0x7f, 0, 0, 0, 0), Err(0x7f));
    }
}
