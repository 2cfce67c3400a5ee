//! Overlapping concurrent writes to one page must never wedge a flush.
//!
//! Concurrent overlapping writes are legal for a block device (the page then holds one of the
//! writes). The page CRC the cache records for flush-time verification must describe the bytes
//! that landed last; a CRC of the write that lost the race would make `read_for_flush` report
//! a checksum mismatch for a stable file, so the block could never be flushed again.

use std::os::unix::fs::FileExt;
use std::sync::{Arc, Barrier};

use glidefs_cache::*;

const BS: u32 = 16 * 1024;
const PAGE: usize = 4096;
const THREADS: usize = 4;
const WRITES: usize = 40;

/// `len` bytes, every byte of which names the writer (thread, iteration).
fn fill(thread: usize, i: usize, len: usize) -> Vec<u8> {
    let tag = ((thread * WRITES + i) % 251 + 1) as u8;
    vec![tag; len]
}

fn rounds() -> usize {
    std::env::var("CRC_RACE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

/// Writers hammer the same bytes (page 0, or pages 0-1 for the odd threads, so single- and
/// multi-page writes overlap), some through the plain path, `zero_copy` ones through
/// prepare/commit without data. Then the block is flushed: it must verify, and hold one
/// writer's bytes per page.
fn hammer_then_flush(zero_copy: bool) {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(4 * BS as u64, BS).unwrap();
    let c = Arc::new(Cache::open(dir.path(), geo, CacheOptions::default()).unwrap());
    for round in 0..rounds() {
        // Make the block Dirty first: the racing writes then take the lock-free hot path.
        c.write(0, &[0xEE; PAGE]).unwrap();
        let barrier = Arc::new(Barrier::new(THREADS));
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (c, barrier) = (c.clone(), barrier.clone());
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..WRITES {
                        let len = if t % 2 == 0 { PAGE } else { 2 * PAGE };
                        let data = fill(t, i, len);
                        if zero_copy && t == THREADS - 1 {
                            let gate = c.enter();
                            let WritePrep::Ready(ticket) = c
                                .prepare_write(&gate, 0, len as u64, LockMode::Wait)
                                .unwrap()
                            else {
                                panic!("block is local and Dirty");
                            };
                            gate.active()
                                .write_all_at(&data, ticket.file_offset())
                                .unwrap();
                            c.commit_write(&gate, ticket, None).unwrap();
                        } else {
                            assert_eq!(c.write(0, &data).unwrap(), WriteOutcome::Done);
                        }
                    }
                });
            }
        });
        let mut now = vec![0; BS as usize];
        assert_eq!(c.read_into(0, &mut now, &[]).unwrap(), ReadOutcome::Done);
        let rot = c.rotate().unwrap().expect("block 0 is dirty");
        let mut buf = vec![0; BS as usize];
        if let Err(e) = c.read_for_flush(&rot, 0, &mut buf) {
            panic!("round {round}: flush of racing writes failed: {e}");
        }
        assert_eq!(buf, now, "round {round}: flushed bytes = bytes read");
        for p in 0..2 {
            let page = &buf[p * PAGE..(p + 1) * PAGE];
            assert!(
                page.iter().all(|&b| b == page[0]) && page[0] != 0,
                "round {round}: page {p} is not one whole write"
            );
        }
        c.complete_flush(&rot).unwrap();
    }
}

#[test]
fn racing_plain_writes_to_one_page_always_flush() {
    hammer_then_flush(false);
}

#[test]
fn racing_plain_and_zero_copy_writes_to_one_page_always_flush() {
    hammer_then_flush(true);
}

/// Real corruption is still caught after racing writes: a flipped byte in the flushing file
/// is a checksum mismatch, never uploaded.
#[test]
fn corruption_after_racing_writes_is_still_reported() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(4 * BS as u64, BS).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    c.write(0, &[1; PAGE]).unwrap();
    c.write(0, &[2; PAGE]).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    let gate = c.enter();
    gate.flushing().unwrap().write_all_at(&[0xAB], 17).unwrap();
    drop(gate);
    let mut buf = vec![0; BS as usize];
    let err = c.read_for_flush(&rot, 0, &mut buf).unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::ChecksumMismatch {
                block: 0,
                page: 0,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.kind(), CacheErrorKind::Corrupt);
}

/// A zero-copy write whose ticket is dropped without commit (the kernel I/O failed after
/// moving some bytes) must not leave an earlier write's CRC behind: the page holds other
/// bytes now, and a stale known CRC would fail every flush of the block.
#[test]
fn abandoned_zero_copy_write_does_not_wedge_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(4 * BS as u64, BS).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    c.write(0, &[1; PAGE]).unwrap(); // Dirty, page 0's CRC known
    let gate = c.enter();
    let WritePrep::Ready(ticket) = c
        .prepare_write(&gate, 0, PAGE as u64, LockMode::Try)
        .unwrap()
    else {
        panic!("dirty block: ready");
    };
    gate.active()
        .write_all_at(&[9; 100], ticket.file_offset())
        .unwrap(); // part of the data moved, then the request failed
    drop(ticket);
    drop(gate);
    let rot = c.rotate().unwrap().unwrap();
    let mut buf = vec![0; BS as usize];
    c.read_for_flush(&rot, 0, &mut buf)
        .expect("the flush must not be wedged by a stale CRC");
    assert_eq!(&buf[..100], &[9; 100][..]);
    assert_eq!(&buf[100..PAGE], &[1; PAGE - 100][..]);
}

/// A partial write to a Syncing block promotes its bytes into the active file together with
/// their known CRCs: a page the write did not touch is still verified at the next flush.
#[test]
fn promoted_pages_stay_verified() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(4 * BS as u64, BS).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    c.write(0, &[1; BS as usize]).unwrap();
    let first = c.rotate().unwrap().unwrap();
    c.write(PAGE as u64, &[2; PAGE]).unwrap(); // promotes block 0 from the flushing file
    let mut buf = vec![0; BS as usize];
    c.read_for_flush(&first, 0, &mut buf).unwrap();
    c.complete_flush(&first).unwrap();
    let second = c.rotate().unwrap().unwrap();
    let gate = c.enter();
    gate.flushing()
        .unwrap()
        .write_all_at(&[0xAB], 2 * PAGE as u64 + 5)
        .unwrap();
    drop(gate);
    let err = c.read_for_flush(&second, 0, &mut buf).unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::ChecksumMismatch {
                block: 0,
                page: 2,
                ..
            }
        ),
        "{err}"
    );
}
