//! The WAL segment reserve sized by the volume (two records per block, `wal::reserve_bytes`;
//! a checkpoint once half of it holds records, `Cache::checkpoint_due`): on a disk that fills
//! up, the records that free space (Unstaged and FlushDone of a flush, Evict) still fit in
//! the space the current WAL segment holds (it keeps half its reserve allocated past its
//! records as they grow), so a flush to the store still frees space.
//!
//! The full disk is modelled as in `cache_review_power.rs` (`FullDisk`: data writes, fills,
//! stagings and WAL reservations fail with ENOSPC) plus, for the WAL, the real limit: the
//! segment cannot grow past the disk space it holds when the disk fills. That limit is the
//! process's file-size limit (`RLIMIT_FSIZE`, with `SIGXFSZ` ignored): a write-out that
//! crosses it is a short write and the next one fails (EFBIG), as a write past a file's
//! allocation does on a full file system. This file holds one test: the limit is per process.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use glidefs_cache::*;
use glidefs_testkit::pattern;

const BS: u32 = 4096;
/// 8 Ki blocks: a reserve of two records per block is 512 KiB (16 Ki records), well under
/// the 4 MiB cap (128 Ki records).
const SIZE: u64 = 32 << 20;
/// The volume's default `checkpoint_records`.
const EVERY: u64 = 64 * 1024;

fn data_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("data.{gen:016}"))
}

fn newest_segment(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("wal."))
        })
        .max()
        .unwrap()
}

/// A disk that fills up: data writes, fills, stagings and WAL reservations fail with ENOSPC.
#[derive(Debug, Default)]
struct FullDisk {
    full: AtomicBool,
}

impl FullDisk {
    /// The disk is full from now on: the WAL segment `seg` can take only the space it holds.
    fn fill(&self, seg: &Path) -> u64 {
        let held = std::fs::metadata(seg).unwrap().blocks() * 512;
        // SAFETY: plain libc calls with valid arguments; this test binary runs one test.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: held as libc::rlim_t,
                rlim_max: libc::RLIM_INFINITY,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        }
        self.full.store(true, Ordering::Release);
        held
    }

    fn free(&self) {
        // SAFETY: as in `fill`.
        unsafe {
            let lim = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        }
        self.full.store(false, Ordering::Release);
    }
}

impl CrashHook for FullDisk {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        if !self.full.load(Ordering::Acquire) {
            return None;
        }
        match op {
            IoOp::WalReserve
            | IoOp::DataWrite
            | IoOp::Promote
            | IoOp::Stage
            | IoOp::Fill
            | IoOp::Cover => Some(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            _ => None,
        }
    }
}

/// The volume's FLUSH (`Volume::flush`): local durability, then a checkpoint when due; a
/// checkpoint that fails (full disk) is only logged.
fn guest_flush(c: &Cache) -> Result<()> {
    c.flush()?;
    if c.checkpoint_due(EVERY) {
        let _ = c.checkpoint();
    }
    Ok(())
}

/// Given a small volume whose guest reads its blocks (a Fill record each), sends a FLUSH just
/// before half the segment's reserve holds records (no checkpoint is due), then rewrites
/// those blocks (a Dirty record each), and the disk fills up (another volume, say): the
/// FLUSH still succeeds, and the flush to the store completes and deletes its flushing file,
/// although it needs an Unstaged record per block (no staging fits) on top of the two
/// records per block already in the segment: the segment keeps half its reserve (one record
/// per block) allocated past its records (`Seg::keep_reserve`). Every write stays readable
/// (from the store: remote only).
#[test]
fn a_flush_on_a_full_disk_frees_space_after_fills_and_writes_filled_the_reserve() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(FullDisk::default());
    let opts = CacheOptions {
        crash_hook: disk.clone(),
    };
    let c = Cache::open(dir.path(), Geometry::new(SIZE, BS).unwrap(), opts).unwrap();
    let seg = newest_segment(dir.path());
    if std::fs::metadata(&seg).unwrap().blocks() == 0 {
        println!("skipped: the file system does not allocate on fallocate");
        return;
    }
    let blocks = SIZE / u64::from(BS) - 2;
    c.set_remote(0..blocks);
    // The guest reads the volume (cold cache): a Fill record per block.
    for b in 0..blocks {
        let data = pattern(b * u64::from(BS), 1, BS as usize);
        assert!(c.fill_clean(c.fill_token(), b, &data).unwrap());
    }
    guest_flush(&c).unwrap();
    assert!(
        !c.checkpoint_due(EVERY),
        "just under half the reserve: no checkpoint yet"
    );
    // It rewrites them: a Dirty record per block.
    for b in 0..blocks {
        let data = pattern(b * u64::from(BS), 2, BS as usize);
        assert_eq!(
            c.write(b * u64::from(BS), &data).unwrap(),
            WriteOutcome::Done
        );
    }
    // The disk fills up.
    let held = disk.fill(&newest_segment(dir.path()));
    guest_flush(&c).expect("the FLUSH acknowledges the writes (its marker fits)");
    // The flush to the store: nothing can be staged, so every block leaves it NotPresent.
    let rot = c.rotate().unwrap().unwrap();
    let mut buf = vec![0; BS as usize];
    for i in 0..rot.blocks().len() {
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    let completed = c.complete_flush(&rot);
    // What the volume does next: evict, checkpoint, later FLUSHes.
    for _ in 0..3 {
        let _ = c.evict_to(0);
        let _ = c.checkpoint();
        let _ = guest_flush(&c);
    }
    let freed = !data_path(dir.path(), 1).exists();
    let wal_len = std::fs::metadata(newest_segment(dir.path())).unwrap().len();
    disk.free();
    assert!(
        freed,
        "completing the flush frees its {} MiB file on a full disk (complete_flush: {completed:?}; \
         the WAL segment held {held} bytes when the disk filled, {wal_len} are written; degraded: {:?})",
        SIZE >> 20,
        c.degraded()
    );
    // Every write is still there.
    for b in [0, blocks / 2, blocks - 1] {
        let mut got = vec![0; BS as usize];
        let out = c.read_into(b * u64::from(BS), &mut got, &[]).unwrap();
        assert_eq!(
            out,
            ReadOutcome::NeedsFetch(vec![b]),
            "block {b} is remote only"
        );
    }
}
