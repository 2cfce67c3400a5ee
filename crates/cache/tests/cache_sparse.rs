//! Big, mostly empty volumes cost memory and disk in proportion to what was touched: the
//! state map and the CRC store are sparse, the data files are not sized to the volume, and
//! reads of local blocks never run into the end of a file that was not pre-sized.

use std::os::unix::fs::FileExt;

use glidefs_cache::*;

const BS: u32 = 128 * 1024;
const TIB: u64 = 1 << 40;

#[test]
fn a_16_tib_cache_opens_with_nothing_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(16 * TIB, BS).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    let m = c.memory();
    assert_eq!((m.state_leaves, m.crc_chunks), (0, 0));
    assert!(
        m.state_bytes < 4096,
        "state map of an idle 16 TiB volume: {m:?}"
    );
    assert_eq!(c.stats().not_present, geo.num_blocks());
    // Written blocks allocate one 4 KiB leaf per 512 MiB region (+ an 8 KiB mid).
    c.write(5 * TIB, &[7; 4096]).unwrap();
    c.write(5 * TIB + 3 * u64::from(BS), &[8; 4096]).unwrap();
    let m = c.memory();
    assert_eq!(m.state_leaves, 1);
    assert_eq!(m.crc_chunks, 2, "one chunk per written block");
    c.checkpoint().unwrap();
    let cp = std::fs::metadata(dir.path().join("checkpoint"))
        .unwrap()
        .len();
    assert!(cp < 200, "checkpoint of two dirty blocks is {cp} bytes");
    drop(c);
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    assert_eq!(c.stats().dirty, 2);
    let mut buf = vec![0; 4096];
    c.read_into(5 * TIB, &mut buf, &[]).unwrap();
    assert_eq!(buf, vec![7; 4096]);
}

/// A partial first write to a never-written block at the end of everything written so far:
/// the rest of the block must read as zeros from the file (the zero-copy path reads the
/// active file at the planned offset for the whole block), not as a short read.
#[test]
fn partial_first_write_is_covered_by_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(TIB, BS).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    let off = TIB - u64::from(BS); // the last block
    let gate = c.enter();
    let WritePrep::Ready(t) = c
        .prepare_write(&gate, off + 4096, 4096, LockMode::Wait)
        .unwrap()
    else {
        panic!("never-written block: ready");
    };
    gate.active()
        .write_all_at(&[3; 4096], t.file_offset())
        .unwrap();
    c.commit_write(&gate, t, None).unwrap();
    let mut plan = ReadPlan::default();
    glidefs_cache::read::plan_read(&c, &gate, off, u64::from(BS), &mut plan).unwrap();
    assert_eq!(
        plan.segments(),
        &[Segment {
            buf_offset: 0,
            len: u64::from(BS),
            source: Source::Active { file_offset: off }
        }]
    );
    let mut block = vec![0xFF; BS as usize];
    gate.active().read_exact_at(&mut block, off).unwrap();
    assert!(block[..4096].iter().all(|&b| b == 0));
    assert!(block[4096..8192].iter().all(|&b| b == 3));
    assert!(block[8192..].iter().all(|&b| b == 0));
    drop(gate);
    // Rotation and a flush read of the block see the same; recovery keeps it.
    let rot = c.rotate().unwrap().unwrap();
    let mut flushed = vec![0; BS as usize];
    c.read_for_flush(&rot, 0, &mut flushed).unwrap();
    assert!(flushed == block, "flushed bytes differ");
    c.flush().unwrap();
    drop(c);
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    let mut again = vec![0; BS as usize];
    assert_eq!(
        c.read_into(off, &mut again, &[]).unwrap(),
        ReadOutcome::Done
    );
    assert!(again == block, "recovered bytes differ");
}

/// Disk allocated under `dir` (files' blocks, not their sizes).
fn allocated(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .filter(|m| m.is_file())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// A small volume holds a WAL reserve in proportion to its size (room to evict and flush every
/// block on a full disk), not 4 MiB: thousands of small volumes on one cache disk. A grow
/// sizes the next segment's reserve for the new size; big volumes stay at 4 MiB.
#[test]
fn an_idle_small_volume_reserves_wal_space_for_its_size() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let open = |size| {
        Cache::open(
            dir.path(),
            Geometry::new(size, 4096).unwrap(),
            CacheOptions::default(),
        )
        .unwrap()
    };
    let c = open(64 * MIB);
    let held = allocated(dir.path());
    if held == 0 {
        println!(
            "skipped: the filesystem of {} does not allocate on fallocate",
            dir.path().display()
        );
        return;
    }
    // 16 Ki blocks x 2 records x 32 bytes = 1 MiB, plus the checkpoint and boot files.
    assert!(
        (MIB..MIB + 64 * 1024).contains(&held),
        "64 MiB volume holds {held} bytes"
    );
    c.grow(GIB).unwrap();
    let held = allocated(dir.path());
    assert!(
        (4 * MIB..4 * MIB + 64 * 1024).contains(&held),
        "after a grow to 1 GiB: {held} bytes"
    );
    drop(c);
    let c = open(GIB);
    let held = allocated(dir.path());
    assert!(
        (4 * MIB..4 * MIB + 64 * 1024).contains(&held),
        "reopened at 1 GiB: {held} bytes"
    );
    drop(c);
}

/// A small volume checkpoints once half its (smaller) WAL reserve holds records, whatever
/// replay bound the caller asks for, so half the reserve is always left for the records that
/// free space on a full disk (one per block); a big one at the caller's bound.
#[test]
fn a_small_volume_checkpoints_before_its_reserve_is_half_used() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(64 * MIB, 4096).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    // 16 Ki blocks: a 1 MiB reserve of 32 Ki records, a checkpoint due at 16 Ki records.
    let d = [5u8; 4096];
    for b in 0..16 * 1024 - 1 {
        c.write(b * 4096, &d).unwrap();
    }
    assert_eq!(c.records_since_checkpoint(), 16 * 1024 - 1);
    assert!(!c.checkpoint_due(65536));
    assert!(
        c.checkpoint_due(100),
        "the caller's bound comes first when lower"
    );
    c.write((16 * 1024 - 1) * 4096, &d).unwrap();
    assert!(c.checkpoint_due(65536), "half the reserve holds records");
    c.checkpoint().unwrap();
    assert!(!c.checkpoint_due(65536));
    drop(c);
    let dir = tempfile::tempdir().unwrap();
    let c = Cache::open(
        dir.path(),
        Geometry::new(GIB, 4096).unwrap(),
        CacheOptions::default(),
    )
    .unwrap();
    for b in 0..20 * 1024 {
        c.write(b * 4096, &d).unwrap();
    }
    assert!(
        !c.checkpoint_due(65536),
        "a 4 MiB reserve: the caller's bound"
    );
}

const GIB: u64 = 1 << 30;
