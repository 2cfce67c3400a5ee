//! Building the ublk io commands and tagging completions.
//!
//! Every SQE the loop submits carries `user_data = kind << 16 | tag` so a completion names
//! its request without any lookup table; a chunk's SQE also carries the chunk's index in
//! bits 32..64 ([`chunk_user_data`]).

use io_uring::{opcode, squeue, types, IoUring};
use libublk::sys;

/// What a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CqeKind {
    /// FETCH / COMMIT_AND_FETCH on `/dev/ublkcN`: a new request, or an abort.
    Cmd,
    /// One data-plane chunk of a request.
    Chunk,
    /// The poll on the queue's eventfd.
    Wake,
    /// BATCH_IO: the PREP_IO_CMDS of the queue's setup.
    Prep,
    /// BATCH_IO: a completion of the multishot FETCH_IO_CMDS (tags in a provided buffer).
    Fetch,
    /// BATCH_IO: a COMMIT_IO_CMDS; the tag field is the commit buffer's index.
    Commit,
}

const KIND_SHIFT: u64 = 16;
/// A chunk's index in its request's chunk list sits above the kind (bits 32..64).
const CHUNK_SHIFT: u64 = 32;

pub(crate) fn user_data(kind: CqeKind, tag: u16) -> u64 {
    let k: u64 = match kind {
        CqeKind::Cmd => 0,
        CqeKind::Chunk => 1,
        CqeKind::Wake => 2,
        CqeKind::Prep => 3,
        CqeKind::Fetch => 4,
        CqeKind::Commit => 5,
    };
    (k << KIND_SHIFT) | u64::from(tag)
}

/// The user data of chunk `index` of request `tag`.
pub(crate) fn chunk_user_data(tag: u16, index: u32) -> u64 {
    user_data(CqeKind::Chunk, tag) | (u64::from(index) << CHUNK_SHIFT)
}

/// The chunk index of a [`CqeKind::Chunk`] completion (see [`chunk_user_data`]).
pub(crate) fn chunk_index(user_data: u64) -> u32 {
    (user_data >> CHUNK_SHIFT) as u32
}

pub(crate) fn decode(user_data: u64) -> (Option<CqeKind>, u16) {
    let tag = (user_data & 0xffff) as u16;
    let kind = match (user_data >> KIND_SHIFT) & 0xffff {
        0 => Some(CqeKind::Cmd),
        1 => Some(CqeKind::Chunk),
        2 => Some(CqeKind::Wake),
        3 => Some(CqeKind::Prep),
        4 => Some(CqeKind::Fetch),
        5 => Some(CqeKind::Commit),
        _ => None,
    };
    (kind, tag)
}

/// Which io command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IoCmd {
    Fetch,
    CommitAndFetch,
}

/// How the loop encodes io commands for this device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CmdEncoding {
    pub(crate) queue: u16,
    /// `UBLK_F_CMD_IOCTL_ENCODE`: use the ioctl-encoded command numbers.
    pub(crate) ioctl_encode: bool,
    /// `UBLK_F_AUTO_BUF_REG`: ask the kernel to register the request's pages at slot = tag.
    pub(crate) auto_buf_reg: bool,
}

impl CmdEncoding {
    /// The io command SQE for `tag` (fixed file 0 is `/dev/ublkcN`).
    pub(crate) fn sqe(&self, cmd: IoCmd, tag: u16, result: i32) -> squeue::Entry {
        let op = match cmd {
            IoCmd::Fetch => sys::UBLK_U_IO_FETCH_REQ,
            IoCmd::CommitAndFetch => sys::UBLK_U_IO_COMMIT_AND_FETCH_REQ,
        };
        let op = if self.ioctl_encode { op } else { op & 0xff };
        // struct ublksrv_io_cmd { u16 q_id; u16 tag; s32 result; u64 addr; } (addr unused:
        // the data never moves through a daemon buffer in either transport).
        let mut payload = [0u8; 16];
        payload[0..2].copy_from_slice(&self.queue.to_ne_bytes());
        payload[2..4].copy_from_slice(&tag.to_ne_bytes());
        payload[4..8].copy_from_slice(&result.to_ne_bytes());
        let mut builder = opcode::UringCmd16::new(types::Fixed(0), op).cmd(payload);
        if self.auto_buf_reg {
            // struct ublk_auto_buf_reg packed in sqe->addr: index in bits 0-15, flags in
            // 16-23, reserved bits zero. Slot = tag; no fallback flag.
            builder = builder.addr(Some(u64::from(tag)));
        }
        builder.build().user_data(user_data(CqeKind::Cmd, tag))
    }
}

/// Push one SQE, submitting first when the submission queue is full.
pub(crate) fn push(ring: &mut IoUring, sqe: &squeue::Entry) -> std::io::Result<()> {
    loop {
        // SAFETY: the entries we build reference no memory that the kernel may use after
        // submission except (a) the registered buffer table, owned by the ring itself, and
        // (b) file descriptors, which the kernel pins when it consumes the entry: fixed file
        // 0 (`/dev/ublkcN`, registered in the ring), the eventfd and `/dev/zero` (owned by
        // the loop for the ring's life), and a chunk's file, owned by its `Chunk`
        // (`Arc<File>`) which the loop keeps in the request's slot until the chunk's
        // completion is reaped. The io command payload is inline in the SQE. BATCH_IO
        // (`super::batch`): a PREP/COMMIT element array is owned by the loop and left
        // unchanged until that command's completion is reaped; the fetch buffers are a
        // mapping registered with the ring, unregistered before the ring closes.
        if unsafe { ring.submission().push(sqe) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        for kind in [
            CqeKind::Cmd,
            CqeKind::Chunk,
            CqeKind::Wake,
            CqeKind::Prep,
            CqeKind::Fetch,
            CqeKind::Commit,
        ] {
            for tag in [0u16, 1, 4095, u16::MAX] {
                assert_eq!(decode(user_data(kind, tag)), (Some(kind), tag));
            }
        }
        assert_eq!(decode(9 << KIND_SHIFT).0, None);
        for index in [0u32, 1, 255, u32::MAX] {
            let ud = chunk_user_data(77, index);
            assert_eq!(decode(ud), (Some(CqeKind::Chunk), 77));
            assert_eq!(chunk_index(ud), index);
        }
    }
}
