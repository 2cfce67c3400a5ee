//! The cache's online grow (`Cache::grow`) against what runs around it: a write straddling
//! the old end that races the grow is refused (before the grow publishes the size) or, once
//! FLUSHed, recovered whole after a crash; grows across the state map's growth segments keep
//! every block's state through crashes, a reopen and a second grow; a grow while a rotation
//! is pending recovers both the rotation and the blocks past the old end after a crash; a
//! power loss after a grow keeps every FLUSH-acknowledged write past the old end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use glidefs_cache::*;
use glidefs_testkit::pattern;

mod support;
use support::{data_files, power_loss};

const BS: u32 = 4096;
const OLD: u64 = 8 * BS as u64;
const NEW: u64 = 20 * BS as u64;

fn open_at(dir: &std::path::Path, size: u64) -> Result<Cache> {
    Cache::open(dir, Geometry::new(size, BS)?, CacheOptions::default())
}

fn read(c: &Cache, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAA; len];
    assert_eq!(c.read_into(off, &mut buf, &[]).unwrap(), ReadOutcome::Done);
    buf
}

/// A write straddling the old end that races the grow is either refused (OutOfRange, before the
/// grow published the size) or, once acknowledged by a FLUSH, is recovered whole after a crash at
/// the new size: never half applied, never lost.
#[test]
fn writes_straddling_the_old_end_racing_a_grow_are_refused_or_durable() {
    for round in 0..4u64 {
        let dir = tempfile::tempdir().unwrap();
        let c = Arc::new(open_at(dir.path(), OLD).unwrap());
        let base = pattern(100 + round, 0, OLD as usize);
        c.write(0, &base).unwrap();
        c.flush().unwrap();
        let at = OLD - 2 * 4096;
        let acked: Mutex<Option<Vec<u8>>> = Mutex::new(None);
        let refused = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let w = s.spawn(|| {
                // Writes go on until the grow has returned and 8 more were made after it
                // (those must all succeed), however long the grow takes to start.
                let mut i = 0u64;
                let mut after_grow = 0u32;
                while after_grow < 8 {
                    if stop.load(Ordering::Acquire) {
                        after_grow += 1;
                    }
                    i += 1;
                    let d = pattern(round, i, 4 * 4096);
                    match c.write(at, &d) {
                        Ok(_) => {
                            c.flush().unwrap();
                            *acked.lock().unwrap() = Some(d);
                        }
                        Err(CacheError::OutOfRange { .. }) => {
                            assert_eq!(after_grow, 0, "refused after the grow returned");
                            refused.store(true, Ordering::Release)
                        }
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            });
            if round % 2 == 1 {
                std::thread::yield_now();
            }
            c.grow(NEW).unwrap();
            stop.store(true, Ordering::Release);
            w.join().unwrap();
        });
        let want = acked
            .lock()
            .unwrap()
            .clone()
            .expect("a write after the grow");
        assert_eq!(read(&c, at, want.len()), want, "round {round}: hot");
        c.die();
        drop(c);
        let c = open_at(dir.path(), NEW).unwrap();
        assert_eq!(
            read(&c, at, want.len()),
            want,
            "round {round}: after the crash"
        );
        assert_eq!(
            read(&c, 0, at as usize),
            &base[..at as usize],
            "round {round}"
        );
        let _ = refused.load(Ordering::Acquire);
    }
}

/// Growing far (across the state map's growth segments: the first top slots cover 2 Mi blocks each)
/// keeps every block's state, live and after a crash and reopen (the reopened map allocates its top
/// table at the new size, so the same blocks move from growth segments to first slots), and a
/// second grow after the reopen works the same.
#[test]
fn grow_across_state_map_segments_survives_crashes_and_regrowth() {
    const MID: u64 = 4096 * 512; // blocks per top slot
    let dir = tempfile::tempdir().unwrap();
    let sizes = [
        3 * MID * BS as u64 + 7 * BS as u64,
        9 * MID * BS as u64 + BS as u64,
    ];
    let mut written: Vec<(u64, Vec<u8>)> = Vec::new();
    let c = open_at(dir.path(), OLD).unwrap();
    let d0 = pattern(7, 0, 4096);
    c.write(OLD - 4096, &d0).unwrap();
    written.push((OLD - 4096, d0));
    c.flush().unwrap();
    let mut c = c;
    for (step, &size) in sizes.iter().enumerate() {
        c.grow(size).unwrap();
        let blocks = size / u64::from(BS);
        let targets = [MID, MID + 1, 2 * MID + 3, blocks - MID / 2, blocks - 1];
        for (i, &b) in targets.iter().enumerate() {
            let d = pattern(8 + step as u64, i as u64, 4096);
            c.write(b * u64::from(BS), &d).unwrap();
            written.retain(|(o, _)| *o != b * u64::from(BS));
            written.push((b * u64::from(BS), d));
        }
        c.flush().unwrap();
        if step == 0 {
            c.checkpoint().unwrap();
            // More writes after the checkpoint: WAL replay against the grown map.
            let d = pattern(99, 1, 4096);
            let off = (blocks - 2) * u64::from(BS);
            c.write(off, &d).unwrap();
            written.push((off, d));
            c.flush().unwrap();
        }
        for (off, d) in &written {
            assert_eq!(&read(&c, *off, 4096), d, "step {step} hot, offset {off}");
        }
        c.die();
        drop(c);
        c = open_at(dir.path(), size).unwrap();
        for (off, d) in &written {
            assert_eq!(
                &read(&c, *off, 4096),
                d,
                "step {step} reopened, offset {off}"
            );
        }
        let s = c.stats();
        assert_eq!(s.dirty, written.len() as u64, "step {step}: {s:?}");
    }
}

/// A grow while a rotation is pending (its flushing file not yet in the store) records the pending
/// rotation in the grow's checkpoint; a crash after writes past the old end recovers both the
/// rotation and the new blocks, and the rotation's blocks read back for the flush.
#[test]
fn grow_with_a_pending_rotation_then_crash() {
    let dir = tempfile::tempdir().unwrap();
    let c = open_at(dir.path(), OLD).unwrap();
    let low = pattern(5, 1, 2 * 4096);
    c.write(4096, &low).unwrap();
    c.flush().unwrap();
    let rot = c.rotate().unwrap().expect("dirty blocks");
    assert_eq!(rot.blocks(), &[1, 2]);
    c.grow(NEW).unwrap();
    let high = pattern(5, 2, 4096);
    c.write(NEW - 4096, &high).unwrap();
    let across = pattern(5, 3, 8192);
    c.write(OLD - 4096, &across).unwrap();
    c.flush().unwrap();
    c.die();
    drop(c);
    drop(rot);
    let c = open_at(dir.path(), NEW).unwrap();
    assert_eq!(read(&c, 4096, low.len()), low);
    assert_eq!(read(&c, NEW - 4096, 4096), high);
    assert_eq!(read(&c, OLD - 4096, 8192), across);
    let rot = c.pending_flush().expect("the rotation is recovered");
    let mut buf = vec![0; BS as usize];
    for i in 0..rot.blocks().len() {
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    c.complete_flush(&rot).unwrap();
    let rot = c.rotate().unwrap().expect("the writes after the grow");
    let blocks = rot.blocks().to_vec();
    assert!(
        blocks.contains(&(NEW / 4096 - 1)) && blocks.contains(&(OLD / 4096)),
        "{blocks:?}"
    );
    for i in 0..rot.blocks().len() {
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    c.complete_flush(&rot).unwrap();
    c.checkpoint().unwrap();
    drop(c);
    let c = open_at(dir.path(), NEW).unwrap();
    assert_eq!(read(&c, NEW - 4096, 4096), high);
    assert_eq!(read(&c, OLD - 4096, 8192), across);
}

/// A power loss (reboot: unsynced data bytes lost, WAL records beyond the last Synced marker
/// untrusted) after a grow: writes past the old end that a FLUSH acknowledged read back,
/// unacknowledged overwrites of them fall back to the acknowledged bytes, and the cache flushes
/// again.
#[test]
fn power_loss_after_a_grow_keeps_acknowledged_writes_past_the_old_end() {
    let dir = tempfile::tempdir().unwrap();
    let c = open_at(dir.path(), OLD).unwrap();
    let low = pattern(11, 1, 4096);
    c.write(0, &low).unwrap();
    c.flush().unwrap();
    c.grow(NEW).unwrap();
    let high = pattern(11, 2, 2 * 4096);
    c.write(NEW - 2 * 4096, &high).unwrap();
    let across = pattern(11, 3, 2 * 4096);
    c.write(OLD - 4096, &across).unwrap();
    c.flush().unwrap();
    let snap = data_files(dir.path());
    // Not acknowledged: overwrite part of `high`, and a new block past the old end.
    c.write(NEW - 4096, &pattern(11, 4, 4096)).unwrap();
    c.write(OLD + 4 * 4096, &pattern(11, 5, 4096)).unwrap();
    c.die();
    drop(c);
    power_loss(dir.path(), &snap);
    let c = open_at(dir.path(), NEW).unwrap();
    assert_eq!(read(&c, 0, 4096), low);
    assert_eq!(
        read(&c, NEW - 2 * 4096, 2 * 4096),
        high,
        "acknowledged past the old end"
    );
    assert_eq!(
        read(&c, OLD - 4096, 2 * 4096),
        across,
        "acknowledged across the old end"
    );
    let rot = c.rotate().unwrap().expect("dirty blocks");
    let mut buf = vec![0; BS as usize];
    for i in 0..rot.blocks().len() {
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    c.complete_flush(&rot).unwrap();
}
