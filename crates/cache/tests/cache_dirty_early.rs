//! `Cache::dirty_early`: a write whose blocks were all promoted turns them Dirty before its
//! data lands (the deferred ublk write: its commit then needs no file I/O). Readers keep
//! reading the block's content; a write that never lands leaves the old bytes; the Dirty
//! record is in the WAL before anything relies on it; other writes are left alone.
//!
//! From the fresh-eyes review: a zero-length write promotes nothing, so it must change no
//! state (it once turned its block Dirty over bytes that never landed); and a guard for the
//! most delicate case: a Syncing block with known page CRCs, promoted and published Dirty
//! early; in that window an inline (lock-free, Dirty-path) write lands and commits and an
//! exclusive plain write waits for the early ticket's stripe lock; the early ticket then
//! lands part of its data and is dropped. Every flush must verify (no stale CRC), and every
//! acknowledged write must read back, also after a crash.
//!
//! Power loss (another boot: data files lose what no fdatasync covered, the WAL keeps what
//! was written out): the early record may reach the disk before the promoted bytes, before
//! the write's own bytes, or before a FLUSH that then covers it; in every case the block's
//! acknowledged bytes must survive (locally, or in the store when recovery drops the record).

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use glidefs_cache::*;
use glidefs_testkit::pattern;

mod support;
use support::{data_files, power_loss};

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

/// Reads `len` bytes at `off` under `gate` (no second gate: the test may hold a ticket).
fn read_under(c: &Cache, gate: &Gate, off: u64, len: usize) -> Vec<u8> {
    let mut plan = ReadPlan::default();
    glidefs_cache::read::plan_read(c, gate, off, len as u64, &mut plan).unwrap();
    let mut buf = vec![0xAA; len];
    assert_eq!(
        c.copy_planned(gate, &plan, &mut buf, &[]).unwrap(),
        ReadOutcome::Done
    );
    buf
}

fn read(c: &Cache, off: u64, len: usize) -> Vec<u8> {
    read_under(c, &c.enter(), off, len)
}

/// A crash of the process (no clean shutdown; same boot, the page cache survives), then the
/// cache opened again.
fn crash(c: Cache, dir: &std::path::Path) -> Cache {
    c.die();
    drop(c);
    open(dir)
}

/// Block 0 holds `old`, flushed: Clean.
fn clean_block(c: &Cache) -> Vec<u8> {
    let old = pattern(0, 1, BS as usize);
    c.write(0, &old).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    finish_flush(c, &rot);
    c.flush().unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Clean);
    old
}

fn ready(c: &Cache, gate: &Gate, off: u64, len: u64) -> WriteTicket {
    match c.prepare_write(gate, off, len, LockMode::Wait).unwrap() {
        WritePrep::Ready(t) => t,
        other => panic!("prepare {off}+{len}: {other:?}"),
    }
}

/// "The kernel" moves `data` to the ticket's place; the commit completes without file I/O
/// (what the loop thread does).
fn land(c: &Cache, gate: &Gate, t: WriteTicket, data: &[u8]) {
    gate.active().write_all_at(data, t.file_offset()).unwrap();
    assert!(matches!(c.try_commit_write(gate, t).unwrap(), Commit::Done));
}

/// Block 0 Clean (see [`clean_block`]), then a deferred write of page 1, prepared and turned
/// Dirty early: the old content, the gate and the ticket.
fn early_page1(c: &Cache) -> (Vec<u8>, Gate, WriteTicket) {
    let old = clean_block(c);
    let gate = c.enter();
    let mut t = ready(c, &gate, 4096, 4096);
    c.dirty_early(&gate, &mut t).unwrap();
    (old, gate, t)
}

#[test]
fn a_promoted_write_is_dirty_before_its_data_lands_and_commits_without_file_io() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let (old, gate, t) = early_page1(&c);
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    // Readers now read the active file: the promoted old bytes.
    assert_eq!(read_under(&c, &gate, 0, BS as usize), old);
    // "The kernel" moves the data; the commit needs no file I/O (loop thread).
    let new = pattern(0, 2, 4096);
    land(&c, &gate, t, &new);
    let mut want = old.clone();
    want[4096..8192].copy_from_slice(&new);
    assert_eq!(read_under(&c, &gate, 0, BS as usize), want);
    drop(gate);
    // The Dirty record was written out before the state changed: a crash of the process
    // (no clean shutdown) keeps the block Dirty with the landed bytes.
    let c = crash(c, dir.path());
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    assert_eq!(read(&c, 0, BS as usize), want);
}

#[test]
fn an_early_dirty_write_that_never_lands_leaves_the_old_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let old = clean_block(&c);
    let gate = c.enter();
    let mut t = ready(&c, &gate, 8192, 4096);
    c.dirty_early(&gate, &mut t).unwrap();
    // The transfer failed: the ticket is dropped uncommitted.
    drop(t);
    drop(gate);
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    assert_eq!(read(&c, 0, BS as usize), old);
    // The next flush uploads those bytes; a crash after it still reads them.
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(finish_flush(&c, &rot), vec![old.clone()]);
    let c = crash(c, dir.path());
    assert_eq!(read(&c, 0, BS as usize), old);
}

#[test]
fn a_write_beside_an_early_dirty_one_takes_the_dirty_path_and_both_land() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let old = clean_block(&c);
    let gate = c.enter();
    let mut first = ready(&c, &gate, 0, 4096);
    c.dirty_early(&gate, &mut first).unwrap();
    // Another writer of the same block (the loop thread's inline path): the block is Dirty,
    // so it needs no stripe lock (the first ticket still holds it) and no promote.
    let WritePrep::Ready(second) = c.prepare_write(&gate, 12288, 4096, LockMode::Try).unwrap()
    else {
        panic!("a write to a Dirty block is ready at once");
    };
    let b = pattern(0, 3, 4096);
    land(&c, &gate, second, &b);
    let a = pattern(0, 4, 4096);
    land(&c, &gate, first, &a);
    let mut want = old;
    want[..4096].copy_from_slice(&a);
    want[12288..].copy_from_slice(&b);
    assert_eq!(read_under(&c, &gate, 0, BS as usize), want);
    drop(gate);
    c.flush().unwrap();
    let c = crash(c, dir.path());
    assert_eq!(read(&c, 0, BS as usize), want);
}

#[test]
fn writes_not_all_promoted_stay_until_their_commit() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let old = clean_block(&c);
    let gate = c.enter();
    // A full-block write to a Clean block promotes nothing: the active file does not hold
    // the block's content, so it must not turn Dirty before the data lands.
    let mut full = ready(&c, &gate, 0, u64::from(BS));
    c.dirty_early(&gate, &mut full).unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Clean);
    assert_eq!(read_under(&c, &gate, 0, BS as usize), old);
    drop(full);
    // Nor does a partial write to a block never written (nothing promoted), nor one that
    // spans a promoted block and a full one.
    let mut fresh = ready(&c, &gate, u64::from(BS) * 3 + 512, 1024);
    c.dirty_early(&gate, &mut fresh).unwrap();
    assert_eq!(c.block_info(3).state, BlockState::NotPresent);
    let mut span = ready(&c, &gate, 4096, u64::from(BS) * 2 - 4096);
    c.dirty_early(&gate, &mut span).unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Clean);
    assert_eq!(c.block_info(1).state, BlockState::NotPresent);
    // Their commits still write the WAL: not for the loop thread.
    assert!(matches!(
        c.try_commit_write(&gate, fresh).unwrap(),
        Commit::WouldBlock(_)
    ));
    drop(span);
}

#[test]
fn a_failed_early_write_out_degrades_the_cache_and_the_commit_writes_it_or_fails() {
    let dir = tempfile::tempdir().unwrap();
    let hook = std::sync::Arc::new(FaultOn::new(IoOp::WalWrite, FaultEffect::NoSpace));
    let c = Cache::open(
        dir.path(),
        Geometry::new(SIZE, BS).unwrap(),
        CacheOptions {
            crash_hook: hook.clone(),
        },
    )
    .unwrap();
    let old = clean_block(&c);
    let gate = c.enter();
    let mut t = ready(&c, &gate, 4096, 4096);
    hook.arm();
    // The record stays buffered: the block turns Dirty all the same (memory and log agree
    // once it is written) and the cache says why it is degraded.
    c.dirty_early(&gate, &mut t).unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    let why = c.degraded();
    assert!(
        why.as_ref().is_some_and(|r| r.contains("ENOSPC")),
        "{why:?}"
    );
    let new = pattern(0, 5, 4096);
    gate.active().write_all_at(&new, t.file_offset()).unwrap();
    // Not on the loop thread: the record must reach the WAL file first.
    let Commit::WouldBlock(t) = c.try_commit_write(&gate, t).unwrap() else {
        panic!("a commit behind an unwritten record must not complete inline");
    };
    assert!(
        c.commit_write(&gate, t, None).is_err(),
        "still full: the write fails"
    );
    let mut t = ready(&c, &gate, 4096, 4096);
    c.dirty_early(&gate, &mut t).unwrap();
    gate.active().write_all_at(&new, t.file_offset()).unwrap();
    hook.disarm();
    let Commit::WouldBlock(t) = c.try_commit_write(&gate, t).unwrap() else {
        panic!("lagging until a write-out succeeds");
    };
    c.commit_write(&gate, t, None).unwrap();
    drop(gate);
    let c = crash(c, dir.path());
    let mut want = old;
    want[4096..8192].copy_from_slice(&new);
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    assert_eq!(read(&c, 0, BS as usize), want);
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
    let old = clean_block(&c);

    // The protocol's path: prepare (Wait), dirty_early, then the (empty) transfer fails.
    let gate = c.enter();
    let mut t = ready(&c, &gate, 4096, 0);
    c.dirty_early(&gate, &mut t).unwrap();
    drop(t);
    drop(gate);
    assert_eq!(
        c.block_info(0).state,
        BlockState::Clean,
        "a zero-length write published a block Dirty that was never promoted"
    );
    assert_eq!(read(&c, 0, BS as usize), old);

    // The plain path: prepare, commit.
    c.write(8192, &[]).unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Clean);
    assert_eq!(read(&c, 0, BS as usize), old);

    // Nothing to flush, and a crash keeps the block's bytes.
    assert!(c.rotate().unwrap().is_none());
    let c = crash(c, dir.path());
    assert_eq!(read(&c, 0, BS as usize), old);
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
    let mut early = ready(&c, &gate, PAGE as u64, PAGE as u64);
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
    land(&c, &gate, inline, &z);

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
    assert_eq!(read(&c, 0, BS as usize), want);

    // The pending rotation still uploads the old bytes (verified against its CRCs).
    assert_eq!(finish_flush(&c, &rot), vec![old.clone()]);
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    // The next one uploads the block as it is now: every CRC still known must hold.
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(rot.blocks(), &[0]);
    assert_eq!(finish_flush(&c, &rot), vec![want.clone()]);

    // A crash of the process keeps it.
    let c = crash(c, dir.path());
    assert_eq!(read(&c, 0, BS as usize), want);
}

/// Reads block 0 after a power loss; the store holds `stored` for it (recovery may have sent
/// the block back to the store).
fn read_block0_with_store(c: &Cache, stored: &[u8]) -> Vec<u8> {
    let mut buf = vec![0xAA; BS as usize];
    let fetched = [Fetched {
        block: 0,
        data: stored,
    }];
    assert_eq!(
        c.read_into(0, &mut buf, &fetched).unwrap(),
        ReadOutcome::Done
    );
    buf
}

/// A FLUSH (another request's, on another thread) while a ticket is held.
fn flush_beside(c: &Cache) {
    std::thread::scope(|s| s.spawn(|| c.flush().unwrap()).join().unwrap());
}

#[test]
fn power_loss_after_the_early_record_is_written_but_before_any_sync() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let old = clean_block(&c);
    // The disk as it is before the promotion: the promoted copy never reaches it.
    let disk = data_files(dir.path());
    let gate = c.enter();
    let mut t = ready(&c, &gate, 4096, 4096);
    c.dirty_early(&gate, &mut t).unwrap(); // the Dirty record is written out, not synced
    land(&c, &gate, t, &pattern(0, 2, 4096)); // completed, but no FLUSH covered it
    drop(gate);
    c.die();
    drop(c);
    power_loss(dir.path(), &disk);
    let c = open(dir.path());
    // The record is on disk but no marker covers it: not trusted, and the Clean block it
    // names goes back to the store (whose copy is the acknowledged one).
    assert_ne!(c.block_info(0).state, BlockState::Dirty);
    assert_eq!(read_block0_with_store(&c, &old), old);
}

/// Block 0 Clean with `old`; a deferred write of page 1 turns it Dirty early; another
/// request's FLUSH covers that record (its marker says the promoted bytes are on disk); the
/// write's data lands and it completes; with `app_flush` the application's FLUSH follows.
/// Then the power goes: the data files keep what the last FLUSH synced. Returns the reopened
/// cache's directory with `(old, new)`.
fn power_loss_around_a_covering_flush(app_flush: bool) -> (tempfile::TempDir, Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let (old, gate, t) = early_page1(&c);
    flush_beside(&c);
    let mut disk = data_files(dir.path());
    let new = pattern(0, 2, 4096);
    land(&c, &gate, t, &new);
    drop(gate);
    if app_flush {
        // Nothing was appended since the covering marker, so this FLUSH appends no record:
        // only its fdatasync of the data files makes the landed page durable.
        c.flush().unwrap();
        disk = data_files(dir.path());
    }
    // Later writes that no FLUSH covers are lost with the power.
    c.write(u64::from(BS) * 5, &pattern(0, 3, BS as usize))
        .unwrap();
    c.die();
    drop(c);
    power_loss(dir.path(), &disk);
    (dir, old, new)
}

#[test]
fn power_loss_after_a_flush_that_covered_the_early_record_before_the_data_landed() {
    let (dir, old, new) = power_loss_around_a_covering_flush(false);
    let c = open(dir.path());
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    // Every byte the write did not cover is the acknowledged old content (read locally: the
    // store is not asked); the written page is old or new, not a mix of anything else.
    let got = read(&c, 0, BS as usize);
    assert_eq!(got[..4096], old[..4096]);
    assert_eq!(got[8192..], old[8192..]);
    assert!(
        got[4096..8192] == old[4096..8192] || got[4096..8192] == new[..],
        "the unflushed page reads neither its old nor its new bytes"
    );
    // The cache flushes on: the block uploads what it reads.
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(finish_flush(&c, &rot), vec![got]);
}

#[test]
fn power_loss_after_the_flush_that_followed_an_early_dirty_write() {
    let (dir, old, new) = power_loss_around_a_covering_flush(true);
    let c = open(dir.path());
    let mut want = old;
    want[4096..8192].copy_from_slice(&new);
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    assert_eq!(read(&c, 0, BS as usize), want);
}
