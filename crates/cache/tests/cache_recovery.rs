//! Given/when/then tests of the cache: write/read paths, rotation, promotion, eviction, fills,
//! and crash-restart (drop without a clean shutdown, reopen the same directory).

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use glidefs_cache::*;
use glidefs_testkit::pattern;

const BS: u32 = 16 * 1024;
const SIZE: u64 = 64 * BS as u64;

fn geo() -> Geometry {
    Geometry::new(SIZE, BS).unwrap()
}

fn open(dir: &std::path::Path) -> Cache {
    Cache::open(dir, geo(), CacheOptions::default()).unwrap()
}

fn open_with(dir: &std::path::Path, hook: Arc<dyn CrashHook>) -> Cache {
    Cache::open(dir, geo(), CacheOptions { crash_hook: hook }).unwrap()
}

fn read(c: &Cache, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAA; len];
    assert_eq!(c.read_into(off, &mut buf, &[]).unwrap(), ReadOutcome::Done);
    buf
}

/// Uploads a pending rotation "for real" from the cache's point of view: reads every block
/// (returning them as the store would hold them) and completes.
fn flush_to_store(c: &Cache) -> Vec<(u64, Vec<u8>)> {
    let rot = c.pending_flush().or_else(|| c.rotate().unwrap());
    let Some(rot) = rot else { return vec![] };
    let mut out = Vec::new();
    for (i, &b) in rot.blocks().iter().enumerate() {
        let mut buf = vec![0; BS as usize];
        c.read_for_flush(&rot, i, &mut buf).unwrap();
        out.push((b, buf));
    }
    c.complete_flush(&rot).unwrap();
    out
}

#[test]
fn unwritten_reads_zero_and_writes_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    assert_eq!(read(&c, 0, 8192), vec![0; 8192]);
    let data = pattern(0, 1, 3 * BS as usize / 2);
    c.write(BS as u64 / 2, &data).unwrap();
    assert_eq!(read(&c, BS as u64 / 2, data.len()), data);
    assert_eq!(read(&c, 0, 512), vec![0; 512]);
    assert!(c.write(SIZE - 10, &[0; 20]).is_err());
}

#[test]
fn flushed_writes_survive_a_crash_and_unflushed_ones_read_old_or_new() {
    let dir = tempfile::tempdir().unwrap();
    let a = pattern(0, 2, 8192);
    let b = pattern(0, 3, 8192);
    {
        let c = open(dir.path());
        c.write(0, &a).unwrap();
        c.write(5 * BS as u64, &a).unwrap();
        c.flush().unwrap();
        c.write(0, &b).unwrap(); // block already Dirty: lands in place
        c.write(9 * BS as u64, &b).unwrap(); // new block, record only buffered
        c.die(); // crash: buffered WAL records are lost
    }
    let c = open(dir.path());
    assert_eq!(read(&c, 5 * BS as u64, 8192), a);
    let r = read(&c, 0, 8192);
    assert!(r == a || r == b, "block 0 must be old or new");
    let r = read(&c, 9 * BS as u64, 8192);
    assert!(r == vec![0; 8192] || r == b, "block 9 must be old or new");
}

#[test]
fn promote_before_write_keeps_both_old_and_new_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let old = pattern(0, 4, BS as usize);
    c.write(0, &old).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Syncing);
    // partial write to the syncing block: promoted first, then the new bytes land
    let new = pattern(0, 5, 4096);
    c.write(4096, &new).unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    let mut want = old.clone();
    want[4096..8192].copy_from_slice(&new);
    assert_eq!(read(&c, 0, BS as usize), want);
    // the flush still sees the rotation-time bytes
    let mut buf = vec![0; BS as usize];
    c.read_for_flush(&rot, 0, &mut buf).unwrap();
    assert_eq!(buf, old);
    c.complete_flush(&rot).unwrap();
    assert_eq!(c.block_info(0).state, BlockState::Dirty);
    assert!(c.block_info(0).remote);
    c.flush().unwrap();
    drop(c);
    let c = open(dir.path());
    assert_eq!(read(&c, 0, BS as usize), want);
}

#[test]
fn interrupted_flush_is_pending_after_restart_and_completes() {
    let dir = tempfile::tempdir().unwrap();
    let d = pattern(0, 6, 3 * BS as usize);
    {
        let c = open(dir.path());
        c.write(BS as u64, &d).unwrap();
        let rot = c.rotate().unwrap().unwrap();
        assert!(matches!(c.rotate(), Err(CacheError::FlushPending { .. })));
        assert_eq!(rot.blocks(), &[1, 2, 3]);
        c.flush().unwrap();
    } // crash mid-flush
    let c = open(dir.path());
    let rot = c.pending_flush().expect("pending rotation after restart");
    assert_eq!(rot.blocks(), &[1, 2, 3]);
    assert_eq!(read(&c, BS as u64, d.len()), d);
    let uploaded = flush_to_store(&c);
    assert_eq!(uploaded.len(), 3);
    assert_eq!(uploaded[0].1, d[..BS as usize]);
    assert_eq!(c.block_info(2).state, BlockState::Clean);
    assert_eq!(read(&c, BS as u64, d.len()), d);
    drop(c);
    let c = open(dir.path());
    assert_eq!(c.block_info(2).state, BlockState::Clean);
    assert_eq!(read(&c, BS as u64, d.len()), d);
}

/// The upload of blocks 1, 2, 3 reads `d` (their bytes as of the rotation).
fn assert_as_of_rotation(uploaded: &[(u64, Vec<u8>)], d: &[u8]) {
    let blocks: Vec<u64> = uploaded.iter().map(|(b, _)| *b).collect();
    assert_eq!(blocks, [1, 2, 3]);
    for (i, (_, bytes)) in uploaded.iter().enumerate() {
        let at = i * BS as usize;
        assert!(
            bytes[..] == d[at..at + BS as usize],
            "block {} as of the rotation",
            i + 1
        );
    }
}

/// A write promotes a block of a pending rotation; the process dies (with or without a
/// checkpoint after the promotion). The recovered rotation still names the promoted block and
/// reads its bytes as of the rotation, as the lost in-memory one did: a rotation published
/// without it would give the store an image the volume never had (the block's older store
/// version beside the rotation's newer blocks). Issue 45, sim seeds 1044027 and 1003780.
fn promoted_block_stays_in_the_recovered_rotation(checkpoint: bool) {
    let dir = tempfile::tempdir().unwrap();
    let d = pattern(0, 16, 3 * BS as usize);
    let later = pattern(0, 17, 4096);
    {
        let c = open(dir.path());
        c.write(BS as u64, &d).unwrap();
        let rot = c.rotate().unwrap().unwrap();
        assert_eq!(rot.blocks(), &[1, 2, 3]);
        // The upload fails (nothing completes); then block 2 is written: promoted.
        c.write(2 * BS as u64 + 4096, &later).unwrap();
        assert_eq!(c.block_info(2).state, BlockState::Dirty);
        c.flush().unwrap();
        if checkpoint {
            c.checkpoint().unwrap();
        }
        c.die();
    }
    let c = open(dir.path());
    let rot = c.pending_flush().expect("pending rotation after restart");
    assert_eq!(
        rot.blocks(),
        &[1, 2, 3],
        "the promoted block left the rotation"
    );
    let mut want = d.clone();
    want[BS as usize + 4096..BS as usize + 8192].copy_from_slice(&later);
    assert_eq!(read(&c, BS as u64, d.len()), want);
    assert_as_of_rotation(&flush_to_store(&c), &d);
    assert_eq!(c.block_info(2).state, BlockState::Dirty);
    assert!(c.block_info(2).remote);
    // The next rotation takes the promoted block's new bytes, and only it.
    let uploaded = flush_to_store(&c);
    assert_eq!(uploaded.len(), 1);
    assert_eq!(uploaded[0].0, 2);
    assert_eq!(uploaded[0].1[..], want[BS as usize..2 * BS as usize]);
    c.checkpoint().unwrap();
    drop(c);
    let c = open(dir.path());
    assert!(
        c.pending_flush().is_none(),
        "no rotation is left after both completed"
    );
    assert_eq!(read(&c, BS as u64, d.len()), want);
}

#[test]
fn a_promoted_block_stays_in_the_rotation_recovered_from_the_log() {
    promoted_block_stays_in_the_recovered_rotation(false);
}

#[test]
fn a_promoted_block_stays_in_the_rotation_recovered_from_a_checkpoint() {
    promoted_block_stays_in_the_recovered_rotation(true);
}

/// A checkpoint written by a binary from before the `ROTATED` mark (version 2, a block
/// promoted out of the pending rotation plainly Dirty) still loads: its Syncing blocks are the
/// rotation and upload as of it, every block reads its acknowledged bytes. The promoted block
/// cannot be told from a block first written after the rotation, so it stays out, as that
/// binary had it (the documented limit of such an upgrade, see `checkpoint`). A checkpoint
/// with a pending rotation is version 3, which that binary refuses.
#[test]
fn a_checkpoint_from_before_the_mark_still_loads_with_its_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let d = pattern(0, 18, 3 * BS as usize);
    let part = pattern(0, 17, 4096);
    let fresh = pattern(0, 19, BS as usize);
    {
        let c = open(dir.path());
        c.write(BS as u64, &d).unwrap();
        let rot = c.rotate().unwrap().unwrap();
        assert_eq!(rot.blocks(), &[1, 2, 3]);
        c.write(2 * BS as u64 + 4096, &part).unwrap();
        c.write(9 * BS as u64, &fresh).unwrap();
        c.flush().unwrap();
        c.checkpoint().unwrap();
        c.die();
    }
    // What that binary wrote: version 2, no bit 6 in any run.
    let p = dir.path().join("checkpoint");
    let mut b = std::fs::read(&p).unwrap();
    assert_eq!(b[4], 3, "a checkpoint with a pending rotation is version 3");
    b[4] = 2;
    let body = b.len() - 4;
    let runs = u64::from_le_bytes(b[44..52].try_into().unwrap()) as usize;
    for r in 0..runs {
        b[52 + r * 17 + 16] &= !0x40;
    }
    let crc = crc32c::crc32c(&b[..body]);
    b[body..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&p, b).unwrap();
    let c = open(dir.path());
    let rot = c.pending_flush().expect("pending rotation");
    assert_eq!(rot.blocks(), &[1, 3]);
    let mut want = d.clone();
    want[BS as usize + 4096..BS as usize + 8192].copy_from_slice(&part);
    assert_eq!(read(&c, BS as u64, d.len()), want);
    for (b, bytes) in flush_to_store(&c) {
        let at = (b as usize - 1) * BS as usize;
        assert!(
            bytes[..] == d[at..at + BS as usize],
            "block {b} as of the rotation"
        );
    }
    assert_eq!(read(&c, 9 * BS as u64, BS as usize), fresh);
    c.checkpoint().unwrap();
    assert_eq!(
        std::fs::read(&p).unwrap()[4],
        2,
        "no rotation pending: version 2"
    );
}

#[test]
fn eviction_drops_only_clean_blocks_and_fills_bring_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let d = pattern(0, 7, 4 * BS as usize);
    c.write(0, &d).unwrap();
    let uploaded = flush_to_store(&c);
    c.write(10 * BS as u64, &d[..4096]).unwrap(); // dirty, never evicted
    assert_eq!(c.evict_to(0).unwrap(), 4);
    assert_eq!(c.block_info(10).state, BlockState::Dirty);
    assert_eq!(c.block_info(1).state, BlockState::NotPresent);
    let mut buf = vec![0; 2 * BS as usize];
    assert_eq!(
        c.read_into(BS as u64 / 2, &mut buf[..BS as usize], &[])
            .unwrap(),
        ReadOutcome::NeedsFetch(vec![0, 1])
    );
    // a partial write to an evicted remote block needs its old bytes first
    assert_eq!(
        c.write(BS as u64 + 100, &[1, 2, 3]).unwrap(),
        WriteOutcome::NeedsFetch(vec![1])
    );
    // a fill under a stale token is refused; a fresh one is stored
    let stale = c.fill_token();
    c.evict_to(0).unwrap();
    let fresh = c.fill_token();
    let _ = stale;
    assert!(c.fill_clean(fresh, 1, &uploaded[1].1).unwrap());
    assert_eq!(c.block_info(1).state, BlockState::Clean);
    let fetched = [Fetched {
        block: 0,
        data: &uploaded[0].1,
    }];
    assert_eq!(
        c.read_into(0, &mut buf, &fetched).unwrap(),
        ReadOutcome::Done
    );
    assert_eq!(buf, d[..2 * BS as usize]);
    c.write(BS as u64 + 100, &[1, 2, 3]).unwrap();
    let mut want = d[BS as usize..2 * BS as usize].to_vec();
    want[100..103].copy_from_slice(&[1, 2, 3]);
    assert_eq!(read(&c, BS as u64, BS as usize), want);
}

#[test]
fn stale_fill_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    c.write(0, &pattern(0, 8, BS as usize)).unwrap();
    let up = flush_to_store(&c);
    c.evict_to(0).unwrap();
    let token = c.fill_token();
    // meanwhile the block is rewritten, flushed and evicted again
    c.write(0, &pattern(0, 9, BS as usize)).unwrap();
    flush_to_store(&c);
    c.evict_to(0).unwrap();
    assert!(!c.fill_clean(token, 0, &up[0].1).unwrap());
    assert_eq!(c.block_info(0).state, BlockState::NotPresent);
}

#[test]
fn zero_copy_shaped_write_and_read_plan() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(open(dir.path()));
    let gate = c.try_enter().expect("uncontended gate");
    // Block 0 was never written and the active file is empty: `Try` (the loop thread) must
    // not extend the file itself; `Wait` (off the loop) does.
    assert!(matches!(
        c.prepare_write(&gate, 4096, 8192, LockMode::Try).unwrap(),
        WritePrep::WouldBlock
    ));
    let WritePrep::Ready(t) = c.prepare_write(&gate, 4096, 8192, LockMode::Wait).unwrap() else {
        panic!("expected Ready");
    };
    let data = pattern(0, 10, 8192);
    // "the kernel" writes into the active file at the ticket's offset
    gate.active().write_all_at(&data, t.file_offset()).unwrap();
    c.commit_write(&gate, t, None).unwrap();
    let mut plan = ReadPlan::default();
    glidefs_cache::read::plan_read(&c, &gate, 0, 4 * 4096, &mut plan).unwrap();
    assert_eq!(
        plan.segments(),
        &[Segment {
            buf_offset: 0,
            len: 4 * 4096,
            source: Source::Active { file_offset: 0 }
        }]
    );
    // A rotation waits for the held gate; meanwhile try_enter refuses instead of parking.
    let c2 = c.clone();
    let rotator = std::thread::spawn(move || c2.rotate().unwrap().unwrap());
    while c.try_enter().is_some() {
        std::thread::yield_now();
    }
    drop(gate);
    let rot = rotator.join().unwrap();
    let gate = c.enter();
    glidefs_cache::read::plan_read(&c, &gate, 0, 4 * 4096, &mut plan).unwrap();
    assert_eq!(
        plan.segments()[0].source,
        Source::Flushing { file_offset: 0 }
    );
    // the zero-copy CRCs are computed from the file at flush time
    let mut buf = vec![0; BS as usize];
    drop(gate);
    c.read_for_flush(&rot, 0, &mut buf).unwrap();
    assert_eq!(&buf[4096..3 * 4096], &data[..]);
}

#[test]
fn checksum_mismatch_in_flushing_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    c.write(0, &pattern(0, 11, 4096)).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    // corrupt the flushing file behind the cache's back
    let gate = c.enter();
    gate.flushing()
        .unwrap()
        .write_all_at(&[0xFF; 16], 0)
        .unwrap();
    drop(gate);
    let mut buf = vec![0; BS as usize];
    let err = c.read_for_flush(&rot, 0, &mut buf).unwrap_err();
    assert_eq!(err.kind(), CacheErrorKind::Corrupt);
}

#[test]
fn checkpoint_truncates_the_log_and_recovery_uses_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = pattern(0, 12, 4096);
    {
        let c = open(dir.path());
        for b in 0..20 {
            c.write(b * BS as u64, &d).unwrap();
        }
        assert_eq!(c.records_since_checkpoint(), 20);
        c.checkpoint().unwrap();
        assert_eq!(c.records_since_checkpoint(), 0);
        c.write(30 * BS as u64, &d).unwrap();
        c.write(30 * BS as u64 + 4096, &d).unwrap(); // block already Dirty: no record
        assert_eq!(c.records_since_checkpoint(), 1);
        c.flush().unwrap();
    }
    let wal_files = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("wal.")
        })
        .count();
    assert_eq!(wal_files, 1);
    let c = open(dir.path());
    for b in (0..20).chain([30]) {
        assert_eq!(read(&c, b * BS as u64, 4096), d, "block {b}");
    }
    assert_eq!(c.stats().dirty, 21);
}

/// Every cache-level crash point: run a scenario that crosses it, reopen, and check that every
/// write acknowledged by a completed flush() reads back, and every other write reads old or
/// new.
#[test]
fn crash_at_every_cache_edge_loses_no_flushed_write() {
    use CrashPoint::*;
    let points = [
        BeforeDataWrite,
        AfterDataWrite,
        AfterWalAppend,
        BeforeWalSync,
        AfterWalSync,
        BeforeRotate,
        AfterFlushComplete,
        BeforeCheckpoint,
        AfterCheckpoint,
        BeforeHolePunch,
    ];
    for point in points {
        for nth in 0..2 {
            let dir = tempfile::tempdir().unwrap();
            let hook = Arc::new(CrashAt::new(point, nth));
            // oracle: per 4 KiB page, the acknowledged-durable value and possible newer ones
            let mut durable: Vec<Vec<u8>> = vec![vec![0; 4096]; 40];
            let mut maybe: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 40];
            {
                let c = open_with(dir.path(), hook.clone());
                let mut pending: Vec<(usize, Vec<u8>)> = Vec::new();
                let mut step = 0u8;
                'run: for round in 0..8 {
                    for p in [round, round + 7, round + 15, (3 * round + 1) % 40] {
                        step += 1;
                        let data = pattern(0, u64::from(step), 4096);
                        maybe[p].push(data.clone());
                        if c.write(p as u64 * 4096, &data).is_err() {
                            break 'run;
                        }
                        pending.push((p, data));
                    }
                    if c.flush().is_err() {
                        break 'run;
                    }
                    for (p, d) in pending.drain(..) {
                        durable[p] = d;
                        maybe[p].clear();
                    }
                    let ok = match round % 4 {
                        0 => c.checkpoint().is_ok(),
                        1 => (|| -> Result<()> {
                            if let Some(rot) = c.rotate()? {
                                let mut buf = vec![0; BS as usize];
                                for i in 0..rot.blocks().len() {
                                    c.read_for_flush(&rot, i, &mut buf)?;
                                }
                                c.complete_flush(&rot)?;
                            }
                            Ok(())
                        })()
                        .is_ok(),
                        2 => c.evict_to(0).is_ok(),
                        _ => true,
                    };
                    if !ok {
                        break 'run;
                    }
                }
                assert!(hook.fired(), "{point:?}#{nth} never reached");
            }
            let c = open(dir.path());
            // evicted blocks need their remote bytes: serve them from the "store" = durable
            for p in 0..40usize {
                let mut buf = vec![0; 4096];
                let off = p as u64 * 4096;
                let block = off / BS as u64;
                let mut full = vec![0u8; BS as usize];
                for q in 0..(BS as usize / 4096) {
                    let idx = block as usize * (BS as usize / 4096) + q;
                    if idx < 40 {
                        full[q * 4096..(q + 1) * 4096].copy_from_slice(&durable[idx]);
                    }
                }
                let f = [Fetched { block, data: &full }];
                assert_eq!(c.read_into(off, &mut buf, &f).unwrap(), ReadOutcome::Done);
                assert!(
                    buf == durable[p] || maybe[p].contains(&buf),
                    "{point:?}#{nth}: page {p} lost an acknowledged write"
                );
            }
        }
    }
}
