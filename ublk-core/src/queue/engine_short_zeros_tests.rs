//! A short `/dev/zero` read (a zero-copy zeros chunk) on a real io_uring: the rest is
//! submitted under the same index and the request completes once, with its full length.
//! The request's buffer is a user buffer registered at slot 0 (= tag) and mapped at a fixed
//! address, so that "address = offset inside the request" (what a kernel-registered ublk
//! buffer means) holds for the part the test reads for real.

use super::*;
use crate::queue::handle::{EventFd, QueueHandle};
use crate::queue::iod::IodArea;
use std::sync::Mutex;

#[derive(Default)]
struct Reads(Mutex<Vec<i32>>);

impl Target for Reads {
    type Keepalive = ();
    fn dispatch(&self, _io: &IoDesc, _ctx: &mut DispatchCtx<'_, ()>) -> Dispatch<()> {
        unreachable!("the test sets the slot up itself")
    }
    fn after_read(&self, _io: &IoDesc, result: i32, _k: Option<&mut ()>) -> i32 {
        self.0.lock().unwrap().push(result);
        result
    }
}

/// Where the request's bytes 0x10000.. are mapped (the lowest address mmap allows).
const AT: usize = 0x10000;
const TAIL: usize = 0x2000;

fn loop_with(target: Arc<Reads>) -> Option<(QueueLoop<Reads>, *mut u8)> {
    let ring = IoUring::new(16).ok()?;
    let null = std::fs::File::open("/dev/null").unwrap();
    ring.submitter().register_files(&[null.as_raw_fd()]).ok()?;
    // SAFETY: a fresh anonymous mapping at a fixed address nothing else uses
    // (NOREPLACE fails instead of replacing anything).
    let p = unsafe {
        libc::mmap(
            AT as *mut libc::c_void,
            TAIL,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || p as usize != AT {
        eprintln!("cannot map at {AT:#x}: skipped");
        return None;
    }
    let p = p.cast::<u8>();
    // SAFETY: `p` is the mapping of TAIL bytes just made.
    unsafe { std::ptr::write_bytes(p, 0xA5, TAIL) };
    let iov = libc::iovec {
        iov_base: p.cast(),
        iov_len: TAIL,
    };
    // SAFETY: the mapping stays for the rest of the test process (never unmapped).
    unsafe { ring.submitter().register_buffers(&[iov]) }.ok()?;
    let iod_file = tempfile::tempfile().unwrap();
    iod_file.set_len(1 << 16).unwrap();
    let iod = IodArea::map(iod_file.as_raw_fd(), 0, 1).ok()?;
    let wake = Arc::new(EventFd::new().unwrap());
    let (tx, rx) = mpsc::channel();
    let lp = QueueLoop::new(LoopParts {
        ring,
        iod,
        enc: CmdEncoding {
            queue: 0,
            ioctl_encode: true,
            auto_buf_reg: false,
        },
        plane: Plane::ZeroCopy {
            zero: std::fs::File::open("/dev/zero").unwrap(),
        },
        target,
        depth: 1,
        handle: QueueHandle::new(tx, Arc::clone(&wake), 0),
        rx,
        wake,
        stop: Arc::new(AtomicBool::new(false)),
        fault_after: None,
        pooled: false,
        batch: None,
    });
    Some((lp, p))
}

#[test]
fn a_short_zeros_chunk_is_finished_by_its_rest_and_commits_once() {
    let target = Arc::new(Reads::default());
    let Some((mut lp, p)) = loop_with(Arc::clone(&target)) else {
        return;
    };
    // A READ of 72 KiB in two zeros chunks, as `run_action` leaves it (both started).
    let len = u32::try_from(AT + TAIL).unwrap();
    let io = IoDesc {
        op: IoOp::Read,
        offset: 0,
        len,
        flags: 0,
        queue: 0,
        tag: 0,
    };
    let slot = &mut lp.slots[0];
    slot.state = SlotState::InChunks;
    slot.io = Some(io);
    slot.pending = 2;
    slot.bytes_expected = u64::from(len);
    slot.chunks = vec![
        Chunk::zeros(AT as u32, 0),
        Chunk::zeros(TAIL as u32, AT as u32),
    ];
    // Chunk 1 ends short (one page of its two), then chunk 0 ends whole.
    lp.on_chunk(0, 1, 4096);
    lp.on_chunk(0, 0, AT as i32);
    let slot = &lp.slots[0];
    assert_eq!(slot.state, SlotState::InChunks, "the rest is still pending");
    assert_eq!((slot.pending, slot.bytes_done), (1, (AT + 4096) as u64));
    assert_eq!(
        (slot.chunks[1].buf_offset(), slot.chunks[1].len()),
        ((AT + 4096) as u32, 4096)
    );
    assert!(target.0.lock().unwrap().is_empty());
    // The rest runs for real: a READ_FIXED of /dev/zero into the request's last page.
    lp.ring.submit_and_wait(1).unwrap();
    lp.reap();
    let chunk_cqes: Vec<_> = lp
        .cqes
        .iter()
        .filter(|c| cmd::decode(c.0).0 == Some(CqeKind::Chunk))
        .copied()
        .collect();
    assert_eq!(chunk_cqes.len(), 1);
    assert_eq!(cmd::chunk_index(chunk_cqes[0].0), 1);
    assert_eq!(chunk_cqes[0].1, 4096);
    lp.process_cqes();
    assert_eq!(*target.0.lock().unwrap(), vec![i32::try_from(len).unwrap()]);
    assert_eq!(lp.slots[0].state, SlotState::Armed);
    // SAFETY: the mapping of TAIL bytes made by `loop_with`.
    let tail = unsafe { std::slice::from_raw_parts(p, TAIL) };
    assert!(
        tail[..4096].iter().all(|&b| b == 0xA5),
        "the done part is not read again"
    );
    assert!(tail[4096..].iter().all(|&b| b == 0), "the rest reads zeros");
}
