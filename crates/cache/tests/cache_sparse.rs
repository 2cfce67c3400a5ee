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
    c.plan_read(&gate, off, u64::from(BS), &mut plan).unwrap();
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
