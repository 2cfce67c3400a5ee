//! Power loss after a flush staged a block into the clean file, before the flush completed.
//!
//! `read_for_flush` writes each Syncing block into the clean file at the block's offset, in
//! place of the block's older clean copy. Until the WAL records that made the block Dirty
//! and Syncing are durable, a power loss can bring the block back as Clean (its records lost),
//! reading the clean file at that offset: the staged bytes must then not be there, or the
//! block would read the unacknowledged write now and its older version from the store once
//! evicted (its content changing with no write in between).
//!
//! Power loss is modelled by file: every file but `clean.data` goes back to its bytes at the
//! last WAL sync (a crash hook copies the directory at each, once the sync's records are
//! written out: what it makes durable), `clean.data` keeps what was written to it (the kernel
//! wrote that page back first), and `boot_id` names an earlier boot.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use glidefs_cache::*;
use glidefs_testkit::pattern;

const BS: u32 = 16 * 1024;
const SIZE: u64 = 16 * BS as u64;
const BLOCK: u64 = 3;

type Files = Vec<(PathBuf, Vec<u8>)>;

fn geo() -> Geometry {
    Geometry::new(SIZE, BS).unwrap()
}

/// Every regular file of the cache directory with its bytes.
fn files(dir: &Path) -> Files {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    v.sort();
    v
}

/// Copies the directory at each WAL sync; fails WAL syncs while `fail_syncs` is set.
#[derive(Debug)]
struct SyncedFiles {
    dir: PathBuf,
    last: Mutex<Files>,
    fail_syncs: AtomicBool,
}

impl CrashHook for SyncedFiles {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        if op != IoOp::WalSync {
            return None;
        }
        if self.fail_syncs.load(Ordering::Acquire) {
            return Some(std::io::Error::other("injected: WAL fdatasync fails"));
        }
        *self.last.lock().unwrap() = files(&self.dir);
        None
    }
}

/// The power loss of the module docs, back to the last WAL sync `hook` saw.
fn power_loss_keeping_the_clean_file(hook: &SyncedFiles) {
    for (p, bytes) in hook.last.lock().unwrap().iter() {
        if p.file_name().and_then(|n| n.to_str()) != Some("clean.data") {
            std::fs::write(p, bytes).unwrap();
        }
    }
    std::fs::write(hook.dir.join("boot_id"), "a-boot-before-the-power-loss\n").unwrap();
}

/// Flushes `BLOCK` as `a` to the store (Clean, `a` in the clean file, everything synced),
/// rewrites it with `b` (a full block, or zeros: a DISCARD) without a FLUSH, and starts a
/// flush that stages it, then the process dies (the upload failed). With `fail_syncs` the
/// WAL syncs fail from the staging on: `read_for_flush` must fail (nothing staged, nothing to
/// publish).
fn stage_an_unflushed_rewrite(
    dir: &Path,
    a: &[u8],
    b: &[u8],
    fail_syncs: bool,
) -> Arc<SyncedFiles> {
    let hook = Arc::new(SyncedFiles {
        dir: dir.to_path_buf(),
        last: Mutex::new(Vec::new()),
        fail_syncs: AtomicBool::new(false),
    });
    let opts = CacheOptions {
        crash_hook: hook.clone(),
    };
    let c = Cache::open(dir, geo(), opts).unwrap();
    let off = BLOCK * u64::from(BS);
    assert_eq!(c.write(off, a).unwrap(), WriteOutcome::Done);
    c.flush().unwrap();
    let rot = c.rotate().unwrap().unwrap();
    let mut buf = vec![0; BS as usize];
    c.read_for_flush(&rot, 0, &mut buf).unwrap();
    c.complete_flush(&rot).unwrap();
    assert_eq!(c.block_info(BLOCK).state, BlockState::Clean);
    assert_eq!(c.write(off, b).unwrap(), WriteOutcome::Done);
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(rot.blocks(), &[BLOCK]);
    hook.fail_syncs.store(fail_syncs, Ordering::Release);
    match c.read_for_flush(&rot, 0, &mut buf) {
        Ok(_) if !fail_syncs => assert_eq!(buf, b),
        Err(_) if fail_syncs => assert!(c.pending_flush().is_some(), "the rotation stays"),
        r => panic!("read_for_flush with the log's syncs failing={fail_syncs}: {r:?}"),
    }
    c.die();
    hook
}

/// Reads `BLOCK`, filling it from `store` when it is not local.
fn read_block(c: &Cache, store: &[u8]) -> Vec<u8> {
    let fetched = [Fetched {
        block: BLOCK,
        data: store,
    }];
    let mut buf = vec![0xAA; BS as usize];
    assert_eq!(
        c.read_into(BLOCK * u64::from(BS), &mut buf, &fetched)
            .unwrap(),
        ReadOutcome::Done
    );
    buf
}

/// After the power loss: the block reads one content, before and after its eviction (fetched
/// from a store that holds `a`), and that content is `a` (acknowledged) or `b` (written, not
/// acknowledged).
fn assert_one_content(dir: &Path, a: &[u8], b: &[u8]) {
    let c = Cache::open(dir, geo(), CacheOptions::default()).unwrap();
    let first = read_block(&c, a);
    let state = c.block_info(BLOCK);
    c.flush().unwrap();
    c.evict_to(0).unwrap();
    let again = read_block(&c, a);
    let name = |d: &[u8]| match d {
        d if d == a => "the acknowledged version",
        d if d == b => "the unacknowledged rewrite",
        _ => "neither version",
    };
    assert!(
        first == again && (first == a || first == b),
        "block {BLOCK} ({state:?} after recovery) read {} and then, evicted and fetched from \
         the store, {}",
        name(&first),
        name(&again)
    );
}

/// Given a Clean block rewritten without a FLUSH and staged by a flush whose upload failed,
/// when the power fails with the staged bytes on disk and the WAL as of its last sync, then
/// the block keeps one content.
#[test]
fn a_staged_rewrite_without_a_flush_does_not_change_a_clean_block() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (pattern(0, 1, BS as usize), pattern(0, 2, BS as usize));
    let hook = stage_an_unflushed_rewrite(dir.path(), &a, &b, false);
    power_loss_keeping_the_clean_file(&hook);
    assert_one_content(dir.path(), &a, &b);
}

/// The same with a rewrite of zeros (a DISCARD), whose staging punches the clean copy.
#[test]
fn a_punched_discard_without_a_flush_does_not_change_a_clean_block() {
    let dir = tempfile::tempdir().unwrap();
    let (a, zeros) = (pattern(0, 1, BS as usize), vec![0u8; BS as usize]);
    let hook = stage_an_unflushed_rewrite(dir.path(), &a, &zeros, false);
    power_loss_keeping_the_clean_file(&hook);
    assert_one_content(dir.path(), &a, &zeros);
}

/// The same when the WAL cannot be synced (a failing disk): the flush fails before it
/// stages the block or hands it to the store (which would otherwise hold a version the
/// cache, back Clean over its old copy after the power loss, does not).
#[test]
fn a_flush_whose_log_cannot_be_synced_fails_before_staging() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (pattern(0, 1, BS as usize), pattern(0, 2, BS as usize));
    let hook = stage_an_unflushed_rewrite(dir.path(), &a, &b, true);
    let clean = std::fs::read(dir.path().join("clean.data")).unwrap();
    let at = (BLOCK * u64::from(BS)) as usize;
    assert_eq!(
        &clean[at..at + BS as usize],
        &a[..],
        "the older copy stays in place"
    );
    power_loss_keeping_the_clean_file(&hook);
    assert_one_content(dir.path(), &a, &b);
}
