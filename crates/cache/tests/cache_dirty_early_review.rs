//! Review of `Cache::dirty_early` (a promoted write publishes its blocks Dirty before its data
//! lands).
//!
//! - A zero-length write promotes nothing (no piece), so `promoted` held vacuously: its block
//!   turned Dirty over an active file that never received its bytes (reads failed or read
//!   zeros). A zero-length write must change no state.
//! - Guard for the most delicate case: a Syncing block with known page CRCs, promoted and
//!   published Dirty early; in that window an inline (lock-free, Dirty-path) write lands and
//!   commits and an exclusive plain write waits for the early ticket's stripe lock; the early
//!   ticket then lands part of its data and is dropped. Every flush must verify (no stale
//!   CRC), and every acknowledged write must read back, also after a crash.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use glidefs_cache::*;
use glidefs_testkit::pattern;

const BS: u32 = 16 * 1024;
const PAGE: usize = 4096;
const SIZE: u64 = 64 * BS as u64;

fn open(dir: &std::path::Path) -> Cache {
    Cache::open(
        dir,
        Geometry::new(SIZE, BS).unwrap(),
        CacheOptions::default(),
    )
    .unwrap()
}

fn read_block(c: &Cache, block: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BS as usize];
    let off = block * u64::from(BS);
    assert_eq!(c.read_into(off, &mut buf, &[]).unwrap(), ReadOutcome::Done);
    buf
}

/// Uploads `rot` (every block must verify) and completes it.
fn finish_flush(c: &Cache, rot: &Rotation) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0..rot.blocks().len() {
        let mut buf = vec![0u8; BS as usize];
        c.read_for_flush(rot, i, &mut buf)
            .expect("a flush verifies every known page CRC");
        out.push(buf);
    }
    c.complete_flush(rot).unwrap();
    out
}

#[test]
fn a_zero_length_write_to_a_clean_block_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let old = pattern(0, 1, BS as usize);
    c.write(0, &old).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    finish_flush(&c, &rot);
    assert_eq!(c.block_info(0).state, BlockState::Clean);

    // The protocol's path: prepare (Wait), dirty_early, then the (empty) transfer fails.
    let gate = c.enter();
    let WritePrep::Ready(mut t) = c.prepare_write(&gate, 4096, 0, LockMode::Wait).unwrap() else {
        panic!("a zero-length write is ready");
    };
    c.dirty_early(&gate, &mut t).unwrap();
    drop(t);
    drop(gate);
    assert_eq!(
        c.block_info(0).state,
        BlockState::Clean,
        "a zero-length write published a block Dirty that was never promoted"
    );
    assert_eq!(read_block(&c, 0), old);

    // The plain path: prepare, commit.
    c.write(8192, &[]).unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Clean);
    assert_eq!(read_block(&c, 0), old);

    // Nothing to flush, and a crash keeps the block's bytes.
    assert!(c.rotate().unwrap().is_none());
    c.die();
    drop(c);
    let c = open(dir.path());
    assert_eq!(read_block(&c, 0), old);
}

#[test]
fn early_dirty_syncing_block_with_crcs_inline_and_exclusive_writers_and_a_dropped_ticket() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    // Block 0 written by the plain path: every page CRC known. Rotated: Syncing, its CRCs in
    // the flushing store.
    let old = pattern(0, 1, BS as usize);
    c.write(0, &old).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Syncing);

    let gate = c.enter();
    // The deferred write of page 1: promote from the flushing file (CRCs copied), Dirty now.
    let WritePrep::Ready(mut early) = c
        .prepare_write(&gate, PAGE as u64, PAGE as u64, LockMode::Wait)
        .unwrap()
    else {
        panic!("a Syncing block is local");
    };
    c.dirty_early(&gate, &mut early).unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Dirty);

    // In the window: an inline zero-copy write of page 2 takes the Dirty path (no stripe
    // lock), lands and commits on the loop thread: acknowledged.
    let z = pattern(2 * PAGE as u64, 7, PAGE);
    let WritePrep::Ready(inline) = c
        .prepare_write(&gate, 2 * PAGE as u64, PAGE as u64, LockMode::Try)
        .unwrap()
    else {
        panic!("a Dirty block takes the inline path");
    };
    gate.active()
        .write_all_at(&z, inline.file_offset())
        .unwrap();
    assert!(matches!(
        c.try_commit_write(&gate, inline).unwrap(),
        Commit::Done
    ));

    let u = pattern(3 * PAGE as u64, 9, PAGE);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        // An exclusive plain write of page 3 (records its CRC): it must wait for the early
        // ticket's stripe lock, so no data of that ticket can land after its CRC is stored.
        let writer = s.spawn(|| {
            c.write(3 * PAGE as u64, &u).unwrap();
            done.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !done.load(Ordering::SeqCst),
            "an exclusive write ran beside an early-Dirty ticket"
        );
        // The early ticket's transfer fails after moving 100 bytes: dropped uncommitted.
        gate.active()
            .write_all_at(&[0x5A; 100], early.file_offset())
            .unwrap();
        drop(early);
        drop(gate);
        writer.join().unwrap();
    });

    let mut want = old.clone();
    want[PAGE..PAGE + 100].fill(0x5A);
    want[2 * PAGE..3 * PAGE].copy_from_slice(&z);
    want[3 * PAGE..].copy_from_slice(&u);
    assert_eq!(read_block(&c, 0), want);

    // The pending rotation still uploads the old bytes (verified against its CRCs).
    assert_eq!(finish_flush(&c, &rot), vec![old.clone()]);
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    // The next one uploads the block as it is now: every CRC still known must hold.
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(rot.blocks(), &[0]);
    assert_eq!(finish_flush(&c, &rot), vec![want.clone()]);

    // A crash of the process keeps it.
    c.die();
    drop(c);
    let c = open(dir.path());
    assert_eq!(read_block(&c, 0), want);
}
