//! A zero-copy write whose ticket is dropped uncommitted (the transfer failed after the
//! kernel moved some of its bytes, or the request was abandoned) leaves nothing of itself
//! under the blocks it would have turned Dirty: a later partial write to such a block must
//! not expose those bytes beside its own, in a range that read as zeros (or the store's
//! bytes) until then. See `write.rs`, `Abandon`.
//!
//! The last five tests put the punch beside the cache's other actors: a rotation queued
//! behind the ticket, a writer waiting for its stripe, a ticket that outlives its gate, a
//! commit handed back (`WouldBlock`) and then dropped, exclusive writers queued behind it.
//! In each, the punch must hit no byte it does not own. (Written by the fresh-eyes review of
//! the fix.) Their sleeps only give the other thread time to block: a slow machine can make
//! one pass vacuously, never fail falsely.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glidefs_cache::*;
use glidefs_testkit::pattern;

const BS: u32 = 16 * 1024;
const B: u64 = BS as u64;

fn open(dir: &std::path::Path) -> Arc<Cache> {
    let geo = Geometry::new(64 * B, BS).unwrap();
    Arc::new(Cache::open(dir, geo, CacheOptions::default()).unwrap())
}

fn ready(c: &Cache, gate: &Gate, off: u64, len: u64, mode: LockMode) -> WriteTicket {
    match c.prepare_write(gate, off, len, mode).unwrap() {
        WritePrep::Ready(t) => t,
        other => panic!("prepare of {len} at {off}: {other:?}"),
    }
}

fn read(c: &Cache, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAA; len];
    assert_eq!(c.read_into(off, &mut buf, &[]).unwrap(), ReadOutcome::Done);
    buf
}

/// Prepares a zero-copy write of `len` bytes at `off` and lands `moved` at its start, as the
/// kernel would before the request failed; returns the ticket, uncommitted.
fn land_part(c: &Cache, gate: &Gate, off: u64, len: u64, moved: &[u8]) -> WriteTicket {
    let t = ready(c, gate, off, len, LockMode::Try);
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
    let mut t = ready(&c, &gate, 4 * B + 4096, 4096, LockMode::Wait);
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

/// A rotation queued while a ticket is outstanding waits for its gate; the punch hits the
/// file that was active at prepare, and the rotated Dirty block keeps its bytes.
#[test]
fn rotation_waits_for_the_ticket_and_the_punch_spares_rotated_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let d = pattern(0, 7, BS as usize);
    c.write(2 * B, &d).unwrap();
    let gate = c.enter();
    let t = ready(&c, &gate, 2 * B + B / 2, B, LockMode::Wait); // Dirty 2 + NotPresent 3
    gate.active()
        .write_all_at(&vec![0xEE; B as usize], t.file_offset())
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (c2, done2) = (c.clone(), done.clone());
    let rot = std::thread::spawn(move || {
        let r = c2.rotate().unwrap();
        done2.store(true, Ordering::SeqCst);
        r
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !done.load(Ordering::SeqCst),
        "rotation ran under a ticket's gate"
    );
    drop(t);
    drop(gate);
    let rot = rot.join().unwrap().unwrap();
    assert_eq!(rot.blocks(), &[2]);
    let mut want = d.clone();
    want[B as usize / 2..].fill(0xEE); // a failed write over a Dirty block keeps what landed
    assert_eq!(read(&c, 2 * B, BS as usize), want);
    assert_eq!(read(&c, 3 * B, BS as usize), vec![0; BS as usize]);
    let mut buf = vec![0; BS as usize];
    c.read_for_flush(&rot, 0, &mut buf).unwrap();
    assert_eq!(buf, want);
    c.complete_flush(&rot).unwrap();
    assert_eq!(read(&c, 2 * B, BS as usize), want);
}

/// A Try ticket fails while a Wait writer queues for the same NotPresent block: the waiter
/// finds zeros beside its partial write.
#[test]
fn a_waiting_writer_finds_the_failed_bytes_punched() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let gate = c.enter();
    let t = ready(&c, &gate, 5 * B, B, LockMode::Try);
    gate.active()
        .write_all_at(&vec![0xEE; B as usize], 5 * B)
        .unwrap();
    // A second Try ticket on the same block: busy.
    let g2 = c.try_enter().unwrap();
    assert!(matches!(
        c.prepare_write(&g2, 5 * B + 100, 10, LockMode::Try)
            .unwrap(),
        WritePrep::WouldBlock
    ));
    drop(g2);
    let c2 = c.clone();
    let waiter = std::thread::spawn(move || {
        let g = c2.enter();
        let t = ready(&c2, &g, 5 * B + 4096, 4096, LockMode::Wait);
        g.active()
            .write_all_at(&[1; 4096], t.file_offset())
            .unwrap();
        c2.commit_write(&g, t, None).unwrap();
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(t);
    drop(gate);
    waiter.join().unwrap();
    let got = read(&c, 5 * B, BS as usize);
    let mut want = vec![0; BS as usize];
    want[4096..8192].fill(1);
    assert_eq!(got, want);
}

/// A ticket over a Syncing block (promoted, Wait) dropped only after its gate, a flush
/// completion and a new rotation: the punch lands in what is now the flushing file, under a
/// block that is not in that rotation.
#[test]
fn a_ticket_dropped_after_its_gate_and_two_gate_holders_harms_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let v = pattern(0, 8, BS as usize);
    let w = pattern(0, 9, BS as usize);
    c.write(6 * B, &v).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    let gate = c.enter();
    let t = ready(&c, &gate, 6 * B + 4096, 4096, LockMode::Wait); // promoted from flushing
    assert!(t.punches_on_drop());
    gate.active()
        .write_all_at(&[0xEE; 4096], t.file_offset())
        .unwrap();
    drop(gate); // misuse: the ticket outlives its gate
    for i in 0..rot.blocks().len() {
        let mut buf = vec![0; BS as usize];
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    c.complete_flush(&rot).unwrap();
    c.write(9 * B, &w).unwrap();
    let rot2 = c.rotate().unwrap().unwrap();
    drop(t);
    assert_eq!(read(&c, 6 * B, BS as usize), v);
    assert_eq!(read(&c, 9 * B, BS as usize), w);
    let mut buf = vec![0; BS as usize];
    c.read_for_flush(&rot2, 0, &mut buf).unwrap();
    assert_eq!(buf, w);
    c.complete_flush(&rot2).unwrap();
    assert_eq!(read(&c, 9 * B, BS as usize), w);
}

/// A ticket handed back by `try_commit_write` (WouldBlock) and then dropped is an
/// unacknowledged write: punched; a later partial write sees zeros beside it.
#[test]
fn a_ticket_dropped_after_would_block_is_punched() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let gate = c.enter();
    let t = ready(&c, &gate, 12 * B, B, LockMode::Try);
    gate.active()
        .write_all_at(&vec![0xEE; B as usize], 12 * B)
        .unwrap();
    let Commit::WouldBlock(t) = c.try_commit_write(&gate, t).unwrap() else {
        panic!("a transition commits off the loop");
    };
    assert!(t.punches_on_drop());
    drop(t);
    drop(gate);
    c.write(12 * B, &[2; 100]).unwrap();
    let got = read(&c, 12 * B, BS as usize);
    assert_eq!(got.iter().filter(|&&x| x != 0).count(), 100);
}

/// A plain exclusive write waits for an outstanding ticket's stripe; it then lands after the
/// punch, and keeps its bytes.
#[test]
fn an_exclusive_write_after_an_abandoned_ticket_keeps_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let gate = c.enter();
    let t = ready(&c, &gate, 20 * B, 2 * B, LockMode::Try);
    gate.active()
        .write_all_at(&vec![0xEE; 2 * B as usize], 20 * B)
        .unwrap();
    let c2 = c.clone();
    let d = pattern(0, 10, BS as usize);
    let d2 = d.clone();
    let writer = std::thread::spawn(move || {
        c2.write(21 * B, &d2).unwrap();
        c2.zero(20 * B + 10, 20).unwrap();
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(t);
    drop(gate);
    writer.join().unwrap();
    assert_eq!(read(&c, 21 * B, BS as usize), d);
    assert_eq!(read(&c, 20 * B, BS as usize), vec![0; BS as usize]);
}

/// A full file system can refuse the punch (an extent split needs space): the blocks are
/// overwritten with zeros instead, and a later partial write still finds nothing of the
/// failed write beside its own bytes.
#[test]
fn where_the_punch_fails_the_blocks_are_zeroed_instead() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Arc::new(FaultOn::new(IoOp::AbandonPunch, FaultEffect::NoSpace));
    let geo = Geometry::new(64 * B, BS).unwrap();
    let opts = CacheOptions {
        crash_hook: hook.clone(),
    };
    let c = Arc::new(Cache::open(dir.path(), geo, opts).unwrap());
    let gate = c.enter();
    // Two blocks, one moved whole and one in part, before the request failed.
    let t = land_part(&c, &gate, 3 * B, 2 * B, &[0xEE; BS as usize + 4096]);
    assert!(t.punches_on_drop());
    hook.arm();
    drop(t);
    hook.disarm();
    assert_eq!(
        stray(&raw(&gate, 3 * B, 2 * BS as usize)),
        0,
        "zeroed, not punched"
    );
    drop(gate);
    for b in [3, 4] {
        assert_eq!(c.block_info(b).state, BlockState::NotPresent);
        c.write(b * B + 8192, &[2; 4096]).unwrap();
        let got = read(&c, b * B, BS as usize);
        assert_eq!(&got[8192..12288], &[2; 4096][..]);
        let n = stray(&got[..8192]) + stray(&got[12288..]);
        assert_eq!(
            n, 0,
            "block {b}: {n} bytes of the failed write beside a later one"
        );
    }
}
