//! A sync with nothing appended since a durable marker that covers every record before it
//! appends no new marker. Then rewrites of Dirty blocks (no new record) still survive a power
//! loss, and the cleanups that wait for a durable marker (`Wal::durable_seq`: a flushing
//! file's deletion, an evicted block's hole) still run once a checkpoint made that marker
//! durable.

use std::collections::HashSet;
use std::sync::Arc;

use glidefs_cache::*;
use glidefs_testkit::pattern;
use parking_lot::Mutex;

mod support;
use support::{data_files, power_loss};

const BS: u32 = 16 * 1024;
const SIZE: u64 = 16 * BS as u64;

fn geo() -> Geometry {
    Geometry::new(SIZE, BS).unwrap()
}

/// Fails the listed file operations with ENOSPC until cleared.
#[derive(Debug, Default)]
struct Faults(Mutex<HashSet<IoOp>>);

impl CrashHook for Faults {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        self.0
            .lock()
            .contains(&op)
            .then(|| std::io::Error::from_raw_os_error(libc::ENOSPC))
    }
}

fn open(dir: &std::path::Path, hook: Arc<dyn CrashHook>) -> Cache {
    Cache::open(dir, geo(), CacheOptions { crash_hook: hook }).unwrap()
}

fn read(c: &Cache, block: u64) -> Vec<u8> {
    let mut buf = vec![0xAA; BS as usize];
    assert_eq!(
        c.read_into(block * BS as u64, &mut buf, &[]).unwrap(),
        ReadOutcome::Done
    );
    buf
}

/// Given Dirty blocks rewritten after the marker that covers their Dirty records (no new
/// record), with or without a checkpoint or a reopen in between, when a FLUSH (which appends
/// no marker now) is followed by a power loss, then every block reads its last flushed bytes.
#[test]
fn rewrites_of_dirty_blocks_flushed_without_a_marker_survive_a_power_loss() {
    for variant in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        {
            let c = open(dir.path(), Arc::new(NoCrash));
            c.write(0, &pattern(0, 1, BS as usize)).unwrap();
            c.write(u64::from(BS), &pattern(1, 1, BS as usize)).unwrap();
            c.flush().unwrap(); // Dirty records + a marker covering them
            c.flush().unwrap(); // nothing new: no marker
            match variant {
                1 => c.checkpoint().unwrap(),
                2 => {
                    c.die();
                }
                _ => {}
            }
        }
        let c = open(dir.path(), Arc::new(NoCrash));
        let seq = c.wal_seq();
        c.write(0, &pattern(0, 2, BS as usize)).unwrap();
        c.write(u64::from(BS) + 4096, &pattern(1, 2, 4096)).unwrap();
        c.flush().unwrap();
        assert_eq!(c.wal_seq(), seq, "variant {variant}: no record, no marker");
        let snap = data_files(dir.path());
        // Unflushed: must not matter.
        c.write(0, &pattern(0, 3, BS as usize)).unwrap();
        c.die();
        drop(c);
        power_loss(dir.path(), &snap);
        let c = open(dir.path(), Arc::new(NoCrash));
        assert_eq!(read(&c, 0), pattern(0, 2, BS as usize), "variant {variant}");
        let mut b1 = pattern(1, 1, BS as usize);
        b1[4096..8192].copy_from_slice(&pattern(1, 2, 4096));
        assert_eq!(read(&c, 1), b1, "variant {variant}");
    }
}

/// Given a flush completion and an eviction whose marker reached the WAL file but whose
/// fdatasync failed (their cleanups wait for `durable_seq`), then a checkpoint that makes
/// that marker durable (`sync_retired`), when the next FLUSH finds nothing appended since
/// the marker (so it appends none), then the cleanups still run: the flushing file is
/// deleted, the evicted block's hole is punched (fills of it are allowed again) and the
/// cache is no longer degraded.
#[test]
fn cleanups_waiting_for_a_marker_a_checkpoint_made_durable_run_at_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let c = open(dir.path(), faults.clone());
    c.write(0, &pattern(0, 21, BS as usize)).unwrap();
    c.flush().unwrap();
    let rot = c.rotate().unwrap().unwrap();
    let mut buf = vec![0; BS as usize];
    c.read_for_flush(&rot, 0, &mut buf).unwrap();
    let flushing = dir.path().join(format!("data.{:016}", rot.gen()));
    faults.0.lock().insert(IoOp::WalSync);
    assert!(c.complete_flush(&rot).is_err(), "the WAL sync fails");
    assert!(flushing.exists());
    assert_eq!(c.block_info(0).state, BlockState::Clean);
    assert!(c.evict_to(0).is_err(), "the WAL sync fails");
    assert!(c.eviction_pending(0));
    faults.0.lock().clear();
    // The checkpoint syncs the old segment, whose last record is the eviction's marker.
    c.checkpoint().unwrap();
    c.flush().unwrap();
    assert!(
        !flushing.exists(),
        "the completed flushing file was not deleted"
    );
    assert!(
        !c.eviction_pending(0),
        "the evicted block's hole was not punched: its fills stay refused"
    );
    assert_eq!(c.degraded(), None);
}
