//! A full or failing cache disk (injected through the crash hook's `io_fault`): the operation
//! that hits ENOSPC fails, the cache stays usable (reads, then writes and flushes once space
//! returns), reports itself degraded meanwhile, and completing a flush frees space. What a
//! full disk left half-logged never costs a completed write in a later process crash.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use glidefs_cache::*;
use glidefs_testkit::pattern;
use parking_lot::Mutex;

mod support;
use support::{data_files, power_loss};

const BS: u32 = 16 * 1024;
const SIZE: u64 = 64 * BS as u64;

fn geo() -> Geometry {
    Geometry::new(SIZE, BS).unwrap()
}

/// Fails the listed file operations with ENOSPC (a full disk) until cleared.
#[derive(Debug, Default)]
struct FullDisk(Mutex<HashSet<IoOp>>);

impl FullDisk {
    fn fill(&self, ops: &[IoOp]) {
        self.0.lock().extend(ops.iter().copied());
    }

    fn free(&self) {
        self.0.lock().clear();
    }
}

impl CrashHook for FullDisk {
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

fn open(dir: &std::path::Path) -> (Cache, Arc<FullDisk>) {
    let disk = Arc::new(FullDisk::default());
    (open_with(dir, geo(), disk.clone()), disk)
}

/// Opens the cache in `dir` with geometry `geo` and fault hook `hook`.
fn open_with(dir: &std::path::Path, geo: Geometry, hook: Arc<dyn CrashHook>) -> Cache {
    Cache::open(dir, geo, CacheOptions { crash_hook: hook }).unwrap()
}

fn read(c: &Cache, block: u64) -> Vec<u8> {
    let mut buf = vec![0xAA; BS as usize];
    assert_eq!(
        c.read_into(block * BS as u64, &mut buf, &[]).unwrap(),
        ReadOutcome::Done
    );
    buf
}

fn is_enospc(e: &CacheError) -> bool {
    matches!(e, CacheError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC))
}

fn wal_segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("wal."))
        .collect();
    v.sort();
    v
}

/// Given a healthy cache, when the WAL write-out hits ENOSPC, then that write and FLUSHes
/// fail with ENOSPC, reads go on, and the cache says it is degraded; once space returns a
/// FLUSH succeeds, writes work, the cache is healthy again and a restart finds every write.
#[test]
fn wal_write_out_enospc_fails_the_write_not_the_cache_and_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c_) = (
        pattern(0, 1, BS as usize),
        pattern(0, 2, BS as usize),
        pattern(0, 3, BS as usize),
    );
    {
        let (c, disk) = open(dir.path());
        c.write(0, &a).unwrap();
        c.flush().unwrap();
        disk.fill(&[IoOp::WalWrite]);
        let e = c.write(BS as u64, &b).unwrap_err();
        assert!(is_enospc(&e), "{e}");
        let e = c.flush().unwrap_err();
        assert!(is_enospc(&e), "{e}");
        assert_eq!(read(&c, 0), a, "reads must go on on a full disk");
        assert!(c.degraded().is_some_and(|r| r.contains("No space")));
        assert!(c.stats().degraded);
        assert!(!c.is_dead());
        disk.free();
        c.flush().unwrap();
        assert_eq!(c.degraded(), None);
        assert!(!c.stats().degraded);
        c.write(2 * BS as u64, &c_).unwrap();
        c.flush().unwrap();
        c.die();
    }
    let (c, _) = open(dir.path());
    assert_eq!(read(&c, 0), a);
    // The failed write's data landed and its record was written once space returned.
    assert_eq!(read(&c, 1), b);
    assert_eq!(read(&c, 2), c_);
}

/// Given a write whose record was written out, when the FLUSH's WAL fdatasync fails and the
/// kernel drops those WAL pages (a later fsync would succeed without them), then the next
/// FLUSH writes the records again before it acknowledges: the write survives a crash.
#[test]
fn failed_wal_sync_rewrites_the_records_before_a_later_flush_acknowledges_them() {
    let dir = tempfile::tempdir().unwrap();
    let x = pattern(0, 4, BS as usize);
    {
        let (c, disk) = open(dir.path());
        c.write(0, &pattern(0, 5, BS as usize)).unwrap();
        c.flush().unwrap();
        let seg = wal_segments(dir.path()).pop().unwrap();
        let synced_len = std::fs::metadata(&seg).unwrap().len();
        c.write(3 * BS as u64, &x).unwrap();
        disk.fill(&[IoOp::WalSync]);
        assert!(is_enospc(&c.flush().unwrap_err()));
        // The failed writeback lost the pages written since the last good sync.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(synced_len)
            .unwrap();
        disk.free();
        c.flush().unwrap();
        c.die();
    }
    let (c, _) = open(dir.path());
    assert_eq!(c.block_info(3).state, BlockState::Dirty);
    assert_eq!(
        read(&c, 3),
        x,
        "a FLUSH acknowledged a write whose record was lost"
    );
}

/// Given a flush whose blocks cannot be staged into the clean file (full disk), then the
/// upload still reads every block, the flush completes, the flushing file is deleted (space
/// freed), and the blocks are NotPresent + REMOTE (fetched when needed), also after a restart.
#[test]
fn a_flush_completes_on_a_full_disk_and_frees_the_flushing_file() {
    let dir = tempfile::tempdir().unwrap();
    let blocks: Vec<Vec<u8>> = (0..4).map(|i| pattern(0, 10 + i, BS as usize)).collect();
    {
        let (c, disk) = open(dir.path());
        for (i, d) in blocks.iter().enumerate() {
            c.write(i as u64 * BS as u64, d).unwrap();
        }
        c.flush().unwrap();
        let rot = c.rotate().unwrap().unwrap();
        let flushing = dir.path().join(format!("data.{:016}", rot.gen()));
        assert!(flushing.exists());
        disk.fill(&[IoOp::Stage]);
        for (i, want) in blocks.iter().enumerate() {
            let mut buf = vec![0; BS as usize];
            c.read_for_flush(&rot, i, &mut buf).unwrap();
            assert_eq!(&buf, want);
        }
        assert!(c.degraded().is_some());
        c.complete_flush(&rot).unwrap();
        assert!(!flushing.exists(), "the flushing file must be freed");
        for b in 0..4 {
            let info = c.block_info(b);
            assert_eq!(info.state, BlockState::NotPresent, "block {b}");
            assert!(info.remote);
        }
        let mut buf = vec![0; BS as usize];
        assert_eq!(
            c.read_into(0, &mut buf, &[]).unwrap(),
            ReadOutcome::NeedsFetch(vec![0])
        );
        disk.free();
        c.flush().unwrap();
        assert_eq!(c.degraded(), None);
        c.die();
    }
    let (c, _) = open(dir.path());
    for b in 0..4 {
        let info = c.block_info(b);
        assert_eq!(
            info.state,
            BlockState::NotPresent,
            "block {b} after restart"
        );
        assert!(info.remote);
    }
}

/// Given flush completion or eviction whose WAL sync fails (full disk), then the space they
/// free (the flushing file, the evicted blocks' holes) is freed by the next sync that
/// succeeds, without a restart.
#[test]
fn space_freeing_work_waits_for_the_log_and_runs_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (c, disk) = open(dir.path());
    c.write(0, &pattern(0, 21, BS as usize)).unwrap();
    c.flush().unwrap();
    let rot = c.rotate().unwrap().unwrap();
    let mut buf = vec![0; BS as usize];
    c.read_for_flush(&rot, 0, &mut buf).unwrap();
    let flushing = dir.path().join(format!("data.{:016}", rot.gen()));
    disk.fill(&[IoOp::WalWrite]);
    assert!(is_enospc(&c.complete_flush(&rot).unwrap_err()));
    assert!(flushing.exists());
    assert_eq!(c.block_info(0).state, BlockState::Clean);
    assert!(is_enospc(&c.evict_to(0).unwrap_err()));
    assert_eq!(c.block_info(0).state, BlockState::NotPresent);
    assert!(c.eviction_pending(0));
    assert!(c.degraded().is_some());
    disk.free();
    c.flush().unwrap();
    assert!(
        !flushing.exists(),
        "the completed flushing file was not deleted"
    );
    assert!(
        !c.eviction_pending(0),
        "the evicted block's hole was not punched"
    );
    assert_eq!(c.degraded(), None);
    // The evicted block's staged bytes are gone from the clean file.
    let clean = std::fs::read(dir.path().join("clean.data")).unwrap();
    assert!(clean[..BS as usize].iter().all(|&x| x == 0));
}

/// A fill that cannot be stored (full disk) is not an error: the caller has the bytes.
#[test]
fn a_fill_on_a_full_disk_fails_and_the_cache_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (c, disk) = open(dir.path());
    c.set_remote([4]);
    disk.fill(&[IoOp::Fill]);
    let err = c
        .fill_clean(c.fill_token(), 4, &pattern(0, 30, BS as usize))
        .unwrap_err();
    assert!(is_enospc(&err), "{err}");
    assert!(!c.is_dead());
    assert_eq!(c.block_info(4).state, BlockState::NotPresent);
    assert!(c.degraded().is_some());
    disk.free();
    assert!(c
        .fill_clean(c.fill_token(), 4, &pattern(0, 30, BS as usize))
        .unwrap());
    c.flush().unwrap();
    assert_eq!(c.degraded(), None);
}

/// A failed fdatasync of a data file latches the cache dead: the kernel may have dropped the
/// pages, and no later sync could prove them durable (a FLUSH must never acknowledge them).
#[test]
fn a_failed_data_file_sync_latches_the_cache_dead() {
    let dir = tempfile::tempdir().unwrap();
    let (c, disk) = open(dir.path());
    c.write(0, &pattern(0, 50, BS as usize)).unwrap();
    disk.fill(&[IoOp::DataSync]);
    assert!(is_enospc(&c.flush().unwrap_err()));
    disk.free();
    assert!(c.is_dead());
    assert!(matches!(c.flush(), Err(CacheError::Dead)));
    assert!(c.degraded().is_some());
}

/// A write whose Dirty record could not be written out (ENOSPC) fails, but its block turns
/// Dirty in memory anyway (`commit_write`). A second write to that block takes the hot path
/// (already Dirty: no WAL record) and completes. Before it completes, the buffered record
/// must reach the WAL file (`Wal::ensure_written`): otherwise a process crash (same boot)
/// drops it, recovery does not know the block is Dirty and punches the active file under it,
/// and the acknowledged second write is lost (review 3; it was, before the fix).
#[test]
fn a_write_completed_over_an_unlogged_dirty_block_survives_a_process_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (pattern(0, 1, BS as usize), pattern(0, 2, BS as usize));
    {
        let (c, disk) = open(dir.path());
        disk.fill(&[IoOp::WalWrite]);
        // First write: its record's write-out fails, so the write fails (not acknowledged).
        c.write(0, &a).unwrap_err();
        // Space comes back (or not: the second write needs no WAL I/O at all).
        disk.free();
        // Second write to the same block: completes, so it is acknowledged.
        assert_eq!(c.write(0, &b).unwrap(), WriteOutcome::Done);
        assert_eq!(read(&c, 0), b);
        // kill -9 (same boot): buffered WAL records are gone.
        c.die();
    }
    let (c, _) = open(dir.path());
    assert!(
        read(&c, 0) == b,
        "the completed write of block 0 was lost by a process crash (reads {})",
        if read(&c, 0).iter().all(|&x| x == 0) {
            "zeros"
        } else {
            "other bytes"
        }
    );
}

/// Fails the first staging into the clean file with ENOSPC; crashes the process (the cache
/// latches dead, unwritten WAL records are dropped) at a FLUSH's `BeforeWalSync` once armed.
#[derive(Debug, Default)]
struct StageFailsThenCrash {
    stage_fails: AtomicBool,
    crash: AtomicBool,
}

impl CrashHook for StageFailsThenCrash {
    fn should_crash(&self, point: CrashPoint) -> bool {
        point == CrashPoint::BeforeWalSync && self.crash.load(Ordering::SeqCst)
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        (op == IoOp::Stage && self.stage_fails.swap(false, Ordering::SeqCst))
            .then(|| std::io::Error::from_raw_os_error(libc::ENOSPC))
    }
}

/// Kinds of the WAL records on disk (byte 5 of each 32-byte record), all segments in order.
fn wal_kinds(dir: &std::path::Path) -> Vec<u8> {
    wal_segments(dir)
        .iter()
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect::<Vec<u8>>()
        .chunks(32)
        .filter(|c| c.len() == 32 && &c[..4] == b"GWAL")
        .map(|c| c[5])
        .collect()
}

/// A block whose staging into the clean file failed (full disk) is left out: `read_for_flush`
/// punches the clean file under it. `complete_flush` used to log FlushDone (Syncing -> Clean)
/// and then, as a separate append, an Evict record for it; a FLUSH running at the same time
/// (a guest fsync; it writes the WAL buffer out before it waits for the gate) could write
/// FlushDone out before the Evict was appended, and a process crash then (here: at that
/// FLUSH's `BeforeWalSync`) left a log saying "Clean" over a hole: the FLUSH-acknowledged
/// block read zeros (review 3). Now an Unstaged record precedes FlushDone.
#[test]
fn an_unstaged_block_survives_a_crash_after_a_flush_wrote_its_flush_done_out() {
    const SMALL: u32 = 4096;
    const BLOCKS: u64 = 1 << 20; // a long completion loop: the window between the appends
    let geo = Geometry::new(BLOCKS * u64::from(SMALL), SMALL).unwrap();
    let v = pattern(0, 7, SMALL as usize);
    // The interleaving is a race (a spinning thread); before the fix it was hit on the first
    // attempt in every run here.
    for attempt in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(StageFailsThenCrash::default());
        let c = Arc::new(open_with(dir.path(), geo, hook.clone()));
        // Block 0 holds v. Every other block is written too, so the completion's loop over the
        // rotation is long: zero-copy writes whose data is zeros (the kernel's pages land on
        // the sparse file's holes, so no byte has to move here).
        c.write(0, &v).unwrap();
        // Some block far away was read earlier (cached Clean): the clean file is long.
        let far = BLOCKS - 1;
        c.set_remote([far]);
        assert!(c
            .fill_clean(c.fill_token(), far, &pattern(0, 9, SMALL as usize))
            .unwrap());
        {
            let gate = c.enter();
            let (off, len) = (u64::from(SMALL), geo.volume_size() - 2 * u64::from(SMALL));
            match c.prepare_write(&gate, off, len, LockMode::Wait).unwrap() {
                WritePrep::Ready(t) => c.commit_write(&gate, t, None).unwrap(),
                _ => panic!("a full-block write of never-written blocks needs nothing"),
            }
        }
        c.flush().unwrap(); // v is acknowledged
        let rot = c.rotate().unwrap().unwrap();
        hook.stage_fails.store(true, Ordering::SeqCst);
        // The upload reads the rotation (only block 0 here: the others hold zeros, which is
        // what a clean copy left out reads as anyway). Block 0's staging fails: left out.
        let mut buf = vec![0u8; SMALL as usize];
        c.read_for_flush(&rot, 0, &mut buf).unwrap();
        assert_eq!(buf, v);
        // (the packs are uploaded and the manifest published here)
        let before = c.wal_seq();
        let guest_fsync = {
            let (c, hook) = (c.clone(), hook.clone());
            std::thread::spawn(move || {
                while c.wal_seq() == before {
                    std::hint::spin_loop();
                }
                // FlushDone is appended: a guest FLUSH arrives; the process dies in it.
                hook.crash.store(true, Ordering::SeqCst);
                c.flush().unwrap_err();
            })
        };
        let _ = c.complete_flush(&rot);
        guest_fsync.join().unwrap();
        drop(c);
        let kinds = wal_kinds(dir.path());
        let (flush_done, unstaged) = (kinds.contains(&3), kinds.contains(&7));
        let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
        let info = c.block_info(0);
        let mut got = vec![0xAA; SMALL as usize];
        match c.read_into(0, &mut got, &[]) {
            Ok(ReadOutcome::Done) => assert!(
                got == v,
                "attempt {attempt}: FLUSH-acknowledged block 0 reads {} after a process crash \
                 (state {:?}, remote {}; on disk: FlushDone {flush_done}, Unstaged {unstaged})",
                if got.iter().all(|&x| x == 0) { "zeros" } else { "other bytes" },
                info.state,
                info.remote
            ),
            Ok(ReadOutcome::NeedsFetch(_)) => {} // fetched from the store: fine
            Err(e) => panic!(
                "attempt {attempt}: FLUSH-acknowledged block 0 is unreadable after a process \
                 crash (state {:?}, remote {}; on disk: FlushDone {flush_done}, Unstaged {unstaged}): {e}",
                info.state, info.remote
            ),
        }
    }
}

/// A 4 KiB block size for the stale-fill race: many blocks in the rotation, so the loop of
/// `complete_flush` that turns blocks NotPresent runs long (the race window).
const PAGE: u64 = 4096;
const FILL_BLOCKS: u64 = 16 * 1024;

/// Block `block`'s local bytes (4 KiB blocks); `None` when it must be fetched.
fn read_local(c: &Cache, block: u64) -> Option<Vec<u8>> {
    let mut buf = vec![0xAA; PAGE as usize];
    match c.read_into(block * PAGE, &mut buf, &[]).unwrap() {
        ReadOutcome::Done => Some(buf),
        ReadOutcome::NeedsFetch(b) if b == [block] => None,
        o => panic!("unexpected read outcome {o:?}"),
    }
}

/// One round; returns whether the stale fill landed (block 0 then reads the old version).
fn stale_fill_round() -> bool {
    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(FullDisk::default());
    let geo = Geometry::new(FILL_BLOCKS * PAGE, PAGE as u32).unwrap();
    let c = Arc::new(open_with(dir.path(), geo, disk.clone()));
    let old = vec![0x11u8; PAGE as usize]; // version 0, in the store (old manifest)
    let new = vec![0x22u8; PAGE as usize]; // version 1, written by the guest
    c.set_remote([0]);
    // The volume starts a fetch of block 0 (cold read): token, then location (version 0).
    let stale = c.fill_token();
    // Meanwhile the guest overwrites block 0 (and the rest): completed writes.
    let mut data = vec![0x33u8; (FILL_BLOCKS * PAGE) as usize];
    data[..PAGE as usize].copy_from_slice(&new);
    assert_eq!(c.write(0, &data).unwrap(), WriteOutcome::Done);
    c.flush().unwrap();
    // A flush to the store on a full disk: no block can be staged into clean.data.
    let rot = c.rotate().unwrap().unwrap();
    disk.0.lock().insert(IoOp::Stage);
    let mut buf = vec![0; PAGE as usize];
    for i in 0..rot.blocks().len() {
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    // (upload + manifest publish of version 1 happen here)
    disk.0.lock().clear();
    // The slow fetch of version 0 finishes now and tries to fill.
    let stop = Arc::new(AtomicBool::new(false));
    let filler = {
        let (c, stop, old) = (c.clone(), stop.clone(), old.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                if c.fill_clean(stale, 0, &old).unwrap() {
                    return true;
                }
                std::hint::spin_loop();
            }
            false
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(5));
    c.complete_flush(&rot).unwrap();
    stop.store(true, Ordering::Release);
    let filled = filler.join().unwrap();
    match read_local(&c, 0) {
        // Fetched from the store when read: version 1 (what the flush uploaded).
        None => {
            assert!(!filled);
            false
        }
        Some(got) => {
            assert!(filled);
            assert_ne!(got, new, "only the stale fill can have made block 0 local");
            assert_eq!(got, old);
            true
        }
    }
}

/// Given a block overwritten while a fetch of its old version is in flight, and a flush that
/// cannot stage it (full disk), when the stale fetch fills while `complete_flush` runs, then
/// the fill must be refused: the block must read the acknowledged (flushed) version.
#[test]
fn a_stale_fill_cannot_land_on_an_unstaged_block_while_its_flush_completes() {
    for r in 0..10 {
        assert!(
            !stale_fill_round(),
            "round {r}: block 0 reads the version before an acknowledged, flushed write \
             (a fill with a token older than the write landed while complete_flush \
             turned the unstaged block NotPresent: review 4, it did before the fix)"
        );
    }
}

/// Given a FLUSH-acknowledged block whose staging into the clean file failed (full disk), when
/// its flush completes (or completes but cannot sync its log) and then the power fails (data
/// files back to what the last sync left, WAL as written out, another boot), then the block
/// reads its acknowledged bytes, or must be fetched from the store, which holds them: never a
/// Clean block over the hole in the clean file.
#[test]
fn an_unstaged_block_survives_a_power_loss_after_its_flush_completes() {
    for wal_sync_fails in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let x = pattern(0, 21, BS as usize);
        let stored;
        {
            let (c, disk) = open(dir.path());
            c.write(3 * BS as u64, &x).unwrap();
            c.flush().unwrap(); // x is acknowledged
            let rot = c.rotate().unwrap().unwrap();
            disk.fill(&[IoOp::Stage]);
            let mut buf = vec![0; BS as usize];
            c.read_for_flush(&rot, 0, &mut buf).unwrap();
            stored = buf; // uploaded and published
            disk.free();
            if wal_sync_fails {
                disk.fill(&[IoOp::WalSync]);
                c.complete_flush(&rot).unwrap_err();
            } else {
                c.complete_flush(&rot).unwrap();
            }
            let snapshot = data_files(dir.path());
            c.die();
            power_loss(dir.path(), &snapshot);
        }
        assert_eq!(stored, x);
        let (c, _) = open(dir.path());
        let mut got = vec![0xAA; BS as usize];
        match c.read_into(3 * BS as u64, &mut got, &[]).unwrap() {
            ReadOutcome::Done => assert!(
                got == x,
                "wal sync fails: {wal_sync_fails}: the acknowledged block reads {} after a \
                 power loss ({:?})",
                if got.iter().all(|&b| b == 0) {
                    "zeros"
                } else {
                    "other bytes"
                },
                c.block_info(3)
            ),
            ReadOutcome::NeedsFetch(b) => assert_eq!(b, [3]),
        }
    }
}

/// Given Dirty and Clean blocks, when a DISCARD's punch hits ENOSPC (`Cache::zero`), then it
/// fails with ENOSPC, the cache is degraded, and every block still reads its last written
/// bytes (a failed DISCARD changes nothing a reader sees); once space returns the DISCARD
/// succeeds, reads zeros, and that survives a FLUSH and a process crash.
#[test]
fn a_discard_on_a_full_disk_fails_and_changes_nothing_until_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let b = BS as u64;
    let (clean, dirty) = (pattern(0, 5, BS as usize), pattern(0, 6, BS as usize));
    {
        let (c, disk) = open(dir.path());
        c.write(0, &clean).unwrap();
        let rot = c.rotate().unwrap().unwrap();
        let mut buf = vec![0; BS as usize];
        assert!(!c.read_for_flush(&rot, 0, &mut buf).unwrap());
        c.complete_flush(&rot).unwrap();
        c.write(b, &dirty).unwrap();
        c.flush().unwrap();
        disk.fill(&[IoOp::DataWrite]);
        // Block 0 (Clean) and block 1 (Dirty) whole, and half of block 2 (never written).
        let e = c.zero(0, 2 * b + b / 2).unwrap_err();
        assert!(is_enospc(&e), "{e}");
        assert!(c.degraded().is_some_and(|r| r.contains("No space")));
        assert_eq!(read(&c, 0), clean, "the Clean block after a failed DISCARD");
        assert_eq!(read(&c, 1), dirty, "the Dirty block after a failed DISCARD");
        assert_eq!(read(&c, 2), vec![0; BS as usize]);
        disk.free();
        assert_eq!(c.zero(0, 2 * b + b / 2).unwrap(), WriteOutcome::Done);
        c.flush().unwrap();
        assert_eq!(c.degraded(), None);
        for block in 0..3 {
            assert_eq!(read(&c, block), vec![0; BS as usize], "block {block}");
        }
        c.die();
    }
    let (c, _) = open(dir.path());
    for block in 0..3 {
        assert_eq!(
            read(&c, block),
            vec![0; BS as usize],
            "block {block} after a crash"
        );
    }
}
