//! A zero-copy write whose ticket is dropped uncommitted (the transfer failed after the
//! kernel moved some of its bytes, or the request was abandoned) leaves nothing of itself
//! under the blocks it would have turned Dirty: a later partial write to such a block must
//! not expose those bytes beside its own, in a range that read as zeros (or the store's
//! bytes) until then. See `write.rs`, `Abandon`.

use std::os::unix::fs::FileExt;

use glidefs_cache::*;
use glidefs_testkit::pattern;

const BS: u32 = 16 * 1024;
const B: u64 = BS as u64;

fn open(dir: &std::path::Path) -> Cache {
    let geo = Geometry::new(64 * B, BS).unwrap();
    Cache::open(dir, geo, CacheOptions::default()).unwrap()
}

fn read(c: &Cache, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAA; len];
    assert_eq!(c.read_into(off, &mut buf, &[]).unwrap(), ReadOutcome::Done);
    buf
}

/// Prepares a zero-copy write of `len` bytes at `off` and lands `moved` at its start, as the
/// kernel would before the request failed; returns the ticket, uncommitted.
fn land_part(c: &Cache, gate: &Gate, off: u64, len: u64, moved: &[u8]) -> WriteTicket {
    let WritePrep::Ready(t) = c.prepare_write(gate, off, len, LockMode::Try).unwrap() else {
        panic!("prepare of {len} bytes at {off}: not ready");
    };
    gate.active().write_all_at(moved, t.file_offset()).unwrap();
    t
}

/// The active file's bytes at `[off, off + len)` (zeros past its end).
fn raw(gate: &Gate, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    let mut at = 0;
    while at < len {
        match gate
            .active()
            .read_at(&mut buf[at..], off + at as u64)
            .unwrap()
        {
            0 => break,
            n => at += n,
        }
    }
    buf
}

/// Flushes to a pretend store: every rotated block is read for upload, then the flush
/// completes (its blocks turn Clean).
fn flush_to_store(c: &Cache) {
    let rot = c.rotate().unwrap().unwrap();
    for i in 0..rot.blocks().len() {
        let mut buf = vec![0; BS as usize];
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    c.complete_flush(&rot).unwrap();
}

fn stray(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&x| x != 0).count()
}

#[test]
fn abandoned_bytes_never_resurface_beside_a_later_partial_write() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let gate = c.enter();
    let t = land_part(&c, &gate, 7 * B, B, &[0xEE; BS as usize]);
    assert!(t.punches_on_drop());
    drop(t);
    drop(gate);
    assert_eq!(c.block_info(7).state, BlockState::NotPresent);
    assert_eq!(read(&c, 7 * B, BS as usize), vec![0; BS as usize]);
    c.write(7 * B, &[1; 4096]).unwrap();
    let got = read(&c, 7 * B, BS as usize);
    assert_eq!(&got[..4096], &[1; 4096][..]);
    let n = stray(&got[4096..]);
    assert_eq!(
        n, 0,
        "{n} bytes of an abandoned write appear beside a later partial write"
    );
}

/// A multi-block write over a Dirty block and a NotPresent one: the Dirty block's bytes stay
/// (what the failed write moved over them is what any failed write leaves), the other's go.
#[test]
fn only_the_blocks_that_were_not_dirty_are_punched() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let d = pattern(0, 41, BS as usize);
    c.write(2 * B, &d).unwrap();
    let gate = c.enter();
    // From the middle of block 2 to the end of block 3: everything lands, then it fails.
    let half = B / 2;
    drop(land_part(
        &c,
        &gate,
        2 * B + half,
        half + B,
        &vec![0xEE; (half + B) as usize],
    ));
    assert_eq!(c.block_info(2).state, BlockState::Dirty);
    assert_eq!(c.block_info(3).state, BlockState::NotPresent);
    assert_eq!(raw(&gate, 2 * B, half as usize), d[..half as usize]);
    assert_eq!(stray(&raw(&gate, 3 * B, BS as usize)), 0, "block 3 punched");
    drop(gate);
    c.write(3 * B + 100, &[5; 10]).unwrap();
    let got = read(&c, 3 * B, BS as usize);
    assert_eq!(stray(&got), 10);
}

/// A Clean block takes a failed full-block write in the active file (its bytes stay in the
/// clean file): reads never saw it, and the active file holds none of it afterwards.
#[test]
fn an_abandoned_write_over_a_clean_block_leaves_the_active_file_empty_there() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let v = pattern(0, 42, BS as usize);
    c.write(5 * B, &v).unwrap();
    flush_to_store(&c);
    assert_eq!(c.block_info(5).state, BlockState::Clean);
    let gate = c.enter();
    drop(land_part(&c, &gate, 5 * B, B, &[0xEE; 4096]));
    assert_eq!(stray(&raw(&gate, 5 * B, BS as usize)), 0);
    drop(gate);
    assert_eq!(read(&c, 5 * B, BS as usize), v);
    c.write(5 * B + 8192, &[3; 4096]).unwrap(); // promotes from the clean file
    let mut want = v.clone();
    want[8192..12288].fill(3);
    assert_eq!(read(&c, 5 * B, BS as usize), want);
}

/// A ticket whose blocks turned Dirty early (every one promoted) holds their old content
/// in the active file: dropping it afterwards must not punch them.
#[test]
fn a_ticket_dropped_after_dirty_early_punches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let v = pattern(0, 43, BS as usize);
    c.write(4 * B, &v).unwrap();
    flush_to_store(&c);
    let gate = c.enter();
    let WritePrep::Ready(mut t) = c
        .prepare_write(&gate, 4 * B + 4096, 4096, LockMode::Wait)
        .unwrap()
    else {
        panic!("ready");
    };
    c.dirty_early(&gate, &mut t).unwrap();
    assert_eq!(c.block_info(4).state, BlockState::Dirty);
    assert!(!t.punches_on_drop());
    drop(t);
    drop(gate);
    assert_eq!(read(&c, 4 * B, BS as usize), v);
}

/// Once the cache is latched dead its directory may be a successor's: a ticket dropped
/// then touches no file.
#[test]
fn a_ticket_dropped_after_the_cache_died_touches_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let gate = c.enter();
    let t = land_part(&c, &gate, 9 * B, B, &[0xEE; 4096]);
    c.die();
    drop(t);
    assert_eq!(raw(&gate, 9 * B, 4096), vec![0xEE; 4096]);
}

/// A committed ticket keeps its bytes (the commit disarms it).
#[test]
fn a_committed_ticket_punches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let gate = c.enter();
    let d = pattern(0, 44, BS as usize);
    let t = land_part(&c, &gate, 11 * B, B, &d);
    c.commit_write(&gate, t, None).unwrap();
    drop(gate);
    assert_eq!(read(&c, 11 * B, BS as usize), d);
}
