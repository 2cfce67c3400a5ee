//! Review of the power-loss recovery (issue 20): interleavings and crash points after which a
//! FLUSH-acknowledged write must still read back. Power loss is modelled as in
//! `cache_power_loss.rs`: files go back to their last synced bytes, the WAL keeps what reached
//! it, and the `boot_id` file names an earlier boot.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use glidefs_cache::*;
use glidefs_testkit::pattern;

const BS: u32 = 16 * 1024;
const SIZE: u64 = 64 * BS as u64;

fn geo() -> Geometry {
    Geometry::new(SIZE, BS).unwrap()
}

fn data_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("data.{gen:016}"))
}

fn reboot(dir: &Path) {
    std::fs::write(dir.join("boot_id"), "a-boot-before-the-power-loss\n").unwrap();
}

fn read_block(c: &Cache, block: u64) -> Vec<u8> {
    let mut buf = vec![0xAA; BS as usize];
    assert_eq!(
        c.read_into(block * BS as u64, &mut buf, &[]).unwrap(),
        ReadOutcome::Done,
        "block {block} must be local"
    );
    buf
}

/// Runs `complete_flush` from inside a FLUSH's WAL sync, right after the FLUSH took its
/// write-out (before it picks the data files to sync), and then fails the completion's own
/// WAL sync (the machine loses power before it).
#[derive(Debug, Default)]
struct RaceHook {
    armed: AtomicBool,
    cache: OnceLock<Arc<Cache>>,
    rot: Mutex<Option<Arc<Rotation>>>,
    done: Mutex<Option<std::thread::JoinHandle<Result<()>>>>,
}

impl RaceHook {
    /// Starts `complete_flush` on a thread named "complete" and returns once it holds the
    /// write gate (it then waits for the WAL lock the caller, a FLUSH, holds).
    fn start_completion(&self) {
        let cache = self.cache.get().unwrap().clone();
        let rot = self.rot.lock().unwrap().take().unwrap();
        let h = std::thread::Builder::new()
            .name("complete".into())
            .spawn(move || cache.complete_flush(&rot))
            .unwrap();
        *self.done.lock().unwrap() = Some(h);
        let cache = self.cache.get().unwrap();
        while let Some(g) = cache.try_enter() {
            drop(g);
            std::thread::yield_now();
        }
    }
}

impl CrashHook for RaceHook {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        let me = std::thread::current();
        if op == IoOp::DataSync && me.name() == Some("complete") {
            // The completion's first sync (the clean file) succeeds, the one of its WAL sync
            // never happens: power is lost first.
            thread_local!(static SEEN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
            let n = SEEN.with(|s| {
                s.set(s.get() + 1);
                s.get()
            });
            if n > 1 {
                return Some(std::io::Error::other("power lost"));
            }
        }
        if op == IoOp::WalWrite && self.armed.swap(false, Ordering::AcqRel) {
            self.start_completion();
        }
        None
    }
}

/// Given a write made durable by a FLUSH whose WAL sync raced with the completion of a store
/// flush (the FLUSH fixes which records its `Synced` marker covers, then the completion logs
/// FlushDone and takes the flushing file away, then the FLUSH picks the files to sync), when
/// the power fails before the completion's own sync, then the write still reads back.
///
/// The marker covers the Rotate record but not the FlushDone, so recovery puts the block back
/// into the flushing file: the FLUSH must have synced that file.
#[test]
fn a_flush_racing_a_flush_completion_syncs_the_file_its_marker_covers() {
    let dir = tempfile::tempdir().unwrap();
    let block = 7u64;
    let data = pattern(0, 9, BS as usize);
    let hook = Arc::new(RaceHook::default());
    {
        let opts = CacheOptions {
            crash_hook: hook.clone(),
        };
        let c = Arc::new(Cache::open(dir.path(), geo(), opts).unwrap());
        hook.cache.set(c.clone()).unwrap();
        assert_eq!(
            c.write(block * BS as u64, &data).unwrap(),
            WriteOutcome::Done
        );
        let rot = c.rotate().unwrap().unwrap();
        let mut buf = vec![0; BS as usize];
        c.read_for_flush(&rot, 0, &mut buf).unwrap();
        assert_eq!(buf, data);
        // (the volume uploads and publishes the manifest here)
        // `read_for_flush` wrote the log out and synced it up to the Rotate record; a fetched
        // block's Fill record (buffered) gives the FLUSH something to write out before it
        // picks, where the race starts.
        let fetched = block + 2;
        c.set_remote([fetched]);
        assert!(c.fill_clean(c.fill_token(), fetched, &data).unwrap());
        *hook.rot.lock().unwrap() = Some(rot);
        hook.armed.store(true, Ordering::Release);
        c.flush().expect("the FLUSH acknowledges the write");
        let done = hook.done.lock().unwrap().take().unwrap();
        assert!(done.join().unwrap().is_err(), "power is lost in its sync");
        c.die();
    }
    // Power loss: data.1 never saw a sync of its own; the WAL is as the FLUSH synced it.
    std::fs::write(data_path(dir.path(), 1), b"").unwrap();
    reboot(dir.path());
    let c = Cache::open(dir.path(), geo(), CacheOptions::default()).unwrap();
    let got = read_block(&c, block);
    assert!(
        got == data,
        "a FLUSH-acknowledged write reads back after the power loss: {:?}, {} of {} bytes zero",
        c.block_info(block),
        got.iter().filter(|&&b| b == 0).count(),
        got.len()
    );
}

/// Fails the data-file sync of a flush completion's WAL sync (the process dies there).
#[derive(Debug, Default)]
struct DieInCompletion {
    armed: AtomicBool,
    seen: std::sync::atomic::AtomicU32,
}

impl CrashHook for DieInCompletion {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        if op == IoOp::DataSync
            && self.armed.load(Ordering::Acquire)
            && self.seen.fetch_add(1, Ordering::AcqRel) >= 1
        {
            return Some(std::io::Error::other("killed"));
        }
        None
    }
}

/// Given a FLUSH-acknowledged write whose store flush completed in memory (FlushDone written
/// out to the WAL, not synced) when the process died, when the restart in the same boot
/// recovers (applying FlushDone, so the flushing file is unreferenced and deleted) and the
/// power fails before its new checkpoint is durable, then after the reboot the write still
/// reads back: recovery must not delete a file the durable log still needs.
#[test]
fn a_power_loss_during_a_same_boot_recovery_keeps_the_files_the_durable_log_needs() {
    let dir = tempfile::tempdir().unwrap();
    let block = 7u64;
    let data = pattern(0, 11, BS as usize);
    let hook = Arc::new(DieInCompletion::default());
    {
        let opts = CacheOptions {
            crash_hook: hook.clone(),
        };
        let c = Cache::open(dir.path(), geo(), opts).unwrap();
        assert_eq!(
            c.write(block * BS as u64, &data).unwrap(),
            WriteOutcome::Done
        );
        c.flush().expect("the FLUSH acknowledges the write");
        let rot = c.rotate().unwrap().unwrap();
        let mut buf = vec![0; BS as usize];
        c.read_for_flush(&rot, 0, &mut buf).unwrap();
        hook.armed.store(true, Ordering::Release);
        // clean-file sync passes; the process dies in the WAL sync after FlushDone is written
        // out (page cache only).
        assert!(c.complete_flush(&rot).is_err());
        assert!(c.is_dead());
    }
    assert!(data_path(dir.path(), 1).exists());
    // Restart in the same boot: recovery applies FlushDone (data.1 is unreferenced then), and
    // the power fails when it writes its new checkpoint (modelled: the checkpoint cannot be
    // created), after whatever it did before reached the disk.
    let tmp = dir.path().join("checkpoint.tmp");
    std::fs::create_dir(&tmp).unwrap();
    assert!(Cache::open(dir.path(), geo(), CacheOptions::default()).is_err());
    std::fs::remove_dir(&tmp).unwrap();
    reboot(dir.path());
    let c = Cache::open(dir.path(), geo(), CacheOptions::default())
        .expect("recovery after the power loss opens");
    let got = read_block(&c, block);
    assert!(
        got == data,
        "a FLUSH-acknowledged write reads back: {:?}, {} of {} bytes zero",
        c.block_info(block),
        got.iter().filter(|&&b| b == 0).count(),
        got.len()
    );
}

/// A full disk: WAL segment space cannot be reserved, and a WAL write-out succeeds only into
/// a segment that holds reserved space (the newest segment is the one records go to).
#[derive(Debug)]
struct FullDisk {
    dir: PathBuf,
    full: AtomicBool,
}

impl FullDisk {
    fn newest_segment_reserved(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let newest = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("wal."))
            })
            .max();
        newest
            .and_then(|p| std::fs::metadata(p).ok())
            // The smallest reserve a segment gets (small volumes: 256 KiB).
            .is_some_and(|m| m.blocks() * 512 >= 256 << 10)
    }
}

impl CrashHook for FullDisk {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        let enospc = || Some(std::io::Error::from_raw_os_error(libc::ENOSPC));
        if !self.full.load(Ordering::Acquire) {
            return None;
        }
        match op {
            IoOp::WalReserve | IoOp::DataWrite | IoOp::Promote | IoOp::Stage | IoOp::Fill => {
                enospc()
            }
            IoOp::WalWrite if !self.newest_segment_reserved() => enospc(),
            _ => None,
        }
    }
}

/// Given a disk that filled up, when a checkpoint (a FLUSH triggers one every so many
/// records) cannot reserve its new WAL segment and then fails to write the checkpoint file,
/// then eviction still frees space: its Evict record must go to a segment that holds reserved
/// space, or nothing could ever free space again (every later Evict and FlushDone record
/// fails to be written).
#[test]
fn a_checkpoint_on_a_full_disk_keeps_the_wal_in_a_reserved_segment() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(FullDisk {
        dir: dir.path().to_path_buf(),
        full: AtomicBool::new(false),
    });
    let opts = CacheOptions {
        crash_hook: disk.clone(),
    };
    let c = Cache::open(dir.path(), geo(), opts).unwrap();
    let block = 3u64;
    c.set_remote([block]);
    assert!(c
        .fill_clean(c.fill_token(), block, &pattern(0, 5, BS as usize))
        .unwrap());
    c.flush().unwrap();
    // The disk fills up: the segment cannot be reserved, the checkpoint file not written.
    disk.full.store(true, Ordering::Release);
    let tmp = dir.path().join("checkpoint.tmp");
    std::fs::create_dir(&tmp).unwrap();
    assert!(c.checkpoint().is_err());
    std::fs::remove_dir(&tmp).unwrap();
    // Eviction frees the clean copy.
    assert_eq!(
        c.evict_to(0).expect("eviction works on a full disk"),
        1,
        "the Clean block is evicted"
    );
    assert_eq!(c.block_info(block).state, BlockState::NotPresent);
    assert!(!c.eviction_pending(block), "its hole is punched");
}
