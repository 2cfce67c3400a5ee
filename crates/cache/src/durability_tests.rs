//! Unit tests of FLUSH durability across a concurrent rotation (they need the cache's
//! test-only record of which data files were fdatasync'd).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::crash::{CrashHook, CrashPoint};
use crate::files::test_inode;
use crate::{Cache, CacheOptions, Geometry};

/// Parks the first sync at `BeforeWalSync` (inside the WAL's group commit, holding its sync
/// lock) until released: a slow fdatasync.
#[derive(Debug, Default)]
struct SlowFirstSync {
    state: Mutex<(bool, bool, bool)>, // (seen, parked, released)
    cv: Condvar,
}

impl SlowFirstSync {
    fn wait_parked(&self) {
        let mut s = self.state.lock();
        while !s.1 {
            self.cv.wait(&mut s);
        }
    }

    fn release(&self) {
        self.state.lock().2 = true;
        self.cv.notify_all();
    }
}

impl CrashHook for SlowFirstSync {
    fn should_crash(&self, point: CrashPoint) -> bool {
        if point != CrashPoint::BeforeWalSync {
            return false;
        }
        let mut s = self.state.lock();
        if s.0 {
            return false;
        }
        s.0 = true;
        s.1 = true;
        self.cv.notify_all();
        while !s.2 {
            self.cv.wait(&mut s);
        }
        false
    }
}

/// A FLUSH that shares a sync begun by another caller must still find its data synced, even
/// when a rotation moved its write into a new active file after that caller entered `flush`.
#[test]
fn shared_flush_syncs_the_active_file_of_a_rotation_that_happened_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(8 * 4096, 4096).unwrap();
    let hook = Arc::new(SlowFirstSync::default());
    let c = Arc::new(
        Cache::open(
            dir.path(),
            geo,
            CacheOptions {
                crash_hook: hook.clone(),
            },
        )
        .unwrap(),
    );
    c.write(0, &[1; 4096]).unwrap();
    // C: a slow sync in progress (holds the WAL sync lock).
    let first = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    hook.wait_parked();
    // A: enters flush and queues behind C.
    let a = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    std::thread::sleep(Duration::from_millis(200));
    // A rotation, then B writes into the new active file and flushes.
    let rot = c.rotate().unwrap().unwrap();
    c.write(4096, &[2; 4096]).unwrap();
    let new_active = test_inode(c.enter().active());
    let b = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    std::thread::sleep(Duration::from_millis(200));
    hook.release();
    first.join().unwrap().unwrap();
    a.join().unwrap().unwrap();
    b.join().unwrap().unwrap();
    assert!(
        c.synced_inodes.lock().contains(&new_active),
        "B's FLUSH returned but the active file holding its write was never fdatasync'd"
    );
    drop(rot);
}

/// Every WAL sync makes the data its records point at durable first: an eviction's sync also
/// makes a buffered Dirty record durable, so the active file holding that write (here a
/// promoted block: its old, already flushed pages too) must be synced before it.
#[test]
fn eviction_syncs_the_data_files_before_the_records_it_makes_durable() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(8 * 4096, 4096).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    c.set_remote([2]);
    assert!(c.fill_clean(c.fill_token(), 2, &[5; 4096]).unwrap());
    c.write(0, &[1; 4096]).unwrap(); // a Dirty record in the WAL buffer
    let active = test_inode(c.enter().active());
    c.synced_inodes.lock().clear();
    assert_eq!(c.evict_to(0).unwrap(), 1);
    assert!(
        c.synced_inodes.lock().contains(&active),
        "eviction made the Dirty record durable without syncing the active file"
    );
}

/// Same for flush completion: FlushDone's WAL sync also covers buffered Dirty records.
#[test]
fn flush_completion_syncs_the_active_file_before_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(8 * 4096, 4096).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    c.write(0, &[1; 4096]).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    let mut buf = vec![0; 4096];
    c.read_for_flush(&rot, 0, &mut buf).unwrap();
    c.write(4096, &[2; 4096]).unwrap(); // new active file, Dirty record buffered
    let active = test_inode(c.enter().active());
    c.synced_inodes.lock().clear();
    c.complete_flush(&rot).unwrap();
    assert!(
        c.synced_inodes.lock().contains(&active),
        "flush completion made the Dirty record durable without syncing the active file"
    );
}
