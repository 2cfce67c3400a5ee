//! Power loss: after a crash some files lose their unsynced writes (a file keeps an older
//! length or older bytes) while the WAL keeps records that reached the disk. `Cache::open`
//! must still open, every block must read its last acknowledged content, and the volume must
//! be able to flush again (`read_for_flush` works).

use glidefs_cache::*;
use glidefs_testkit::pattern;
use glidefs_testkit::rng::Rng;

mod support;
use support::{data_files, power_loss};

const BS: u32 = 16 * 1024;
const SIZE: u64 = 64 * BS as u64;

fn geo() -> Geometry {
    Geometry::new(SIZE, BS).unwrap()
}

fn open(dir: &std::path::Path) -> Cache {
    Cache::open(dir, geo(), CacheOptions::default()).unwrap()
}

/// Given a fetched block whose Fill record reached the WAL but whose bytes did not reach
/// `clean.data` (the file never grew on disk), when the cache is opened, then it opens and the
/// block is remote again (fetched when needed), not an error that fails the volume.
#[test]
fn fill_record_past_the_end_of_the_clean_file_drops_the_block_back_to_remote() {
    let dir = tempfile::tempdir().unwrap();
    let block = 9u64;
    {
        let c = open(dir.path());
        c.set_remote([block]);
        assert!(c
            .fill_clean(c.fill_token(), block, &pattern(0, 4, BS as usize))
            .unwrap());
        c.flush().unwrap(); // the Fill record is in the WAL on disk
        c.die();
    }
    // Power loss: the clean file's growth never reached the disk.
    let clean = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("clean.data"))
        .unwrap();
    clean.set_len(0).unwrap();
    drop(clean);
    let c = Cache::open(dir.path(), geo(), CacheOptions::default())
        .expect("recovery must not fail on a fill whose bytes were lost");
    let info = c.block_info(block);
    assert_eq!(info.state, BlockState::NotPresent);
    assert!(
        info.remote,
        "the block must be fetched again from the store"
    );
    let mut buf = vec![0; BS as usize];
    assert_eq!(
        c.read_into(block * BS as u64, &mut buf, &[]).unwrap(),
        ReadOutcome::NeedsFetch(vec![block])
    );
    // And the cache works on: a write, a flush.
    c.write(0, &pattern(0, 5, 4096)).unwrap();
    c.flush().unwrap();
}

fn read(c: &Cache, off: u64, len: usize, store: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let fetched: Vec<Fetched<'_>> = store
        .iter()
        .map(|(b, d)| Fetched { block: *b, data: d })
        .collect();
    let mut buf = vec![0xAA; len];
    assert_eq!(
        c.read_into(off, &mut buf, &fetched).unwrap(),
        ReadOutcome::Done
    );
    buf
}

/// A write that fills the blocks it needs from `store` first.
fn write_fetching(c: &Cache, off: u64, data: &[u8], store: &[(u64, Vec<u8>)]) {
    loop {
        match c.write(off, data).unwrap() {
            WriteOutcome::Done => return,
            WriteOutcome::NeedsFetch(blocks) => {
                for b in blocks {
                    let (_, bytes) = store.iter().find(|(x, _)| *x == b).unwrap();
                    c.fill_clean(c.fill_token(), b, bytes).unwrap();
                }
            }
        }
    }
}

/// Reads every block of a rotation and completes it, as an upload would; returns the blocks.
fn flush_to_store(c: &Cache, rot: &Rotation) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, &b) in rot.blocks().iter().enumerate() {
        let mut buf = vec![0; BS as usize];
        c.read_for_flush(rot, i, &mut buf).unwrap();
        out.push((b, buf));
    }
    c.complete_flush(rot).unwrap();
    out
}

/// Given blocks whose content a FLUSH acknowledged (block 3 Clean: flushed to the store;
/// block 5 Syncing: flushed locally, its upload pending), when a partial write to each promotes
/// it into the active file, its Dirty record reaches the disk but the promoted bytes do not,
/// and the power fails, then after recovery every block reads its last acknowledged content
/// and the pending flush and a new one complete.
#[test]
fn power_loss_after_a_promoting_partial_write_keeps_the_acknowledged_block() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c_) = (
        pattern(0, 1, BS as usize),
        pattern(0, 2, BS as usize),
        pattern(0, 3, BS as usize),
    );
    let (s3, s5) = (3 * BS as u64, 5 * BS as u64);
    let mut store;
    let snapshot;
    {
        let c = open(dir.path());
        c.write(s3, &a).unwrap();
        c.write(s5, &b).unwrap();
        c.flush().unwrap();
        let rot = c.rotate().unwrap().unwrap();
        store = flush_to_store(&c, &rot);
        c.write(s5, &c_).unwrap();
        c.flush().unwrap();
        let _pending = c.rotate().unwrap().unwrap(); // block 5 Syncing, upload pending
        c.flush().unwrap();
        snapshot = data_files(dir.path());
        // Partial writes: promotions; their Dirty records are written out at once.
        c.write(s3 + 4096, &pattern(0, 7, 4096)).unwrap();
        c.write(s5 + 8192, &pattern(0, 8, 4096)).unwrap();
        assert_eq!(c.block_info(3).state, BlockState::Dirty);
        assert_eq!(c.block_info(5).state, BlockState::Dirty);
        c.die();
    }
    power_loss(dir.path(), &snapshot);
    let c = open(dir.path());
    assert_eq!(
        read(&c, s3, BS as usize, &store),
        a,
        "block 3 lost its flushed bytes"
    );
    assert_eq!(
        read(&c, s5, BS as usize, &store),
        c_,
        "block 5 lost its flushed bytes"
    );
    // The pending upload and a new flush go through.
    let rot = c
        .pending_flush()
        .expect("the upload of block 5 is still pending");
    for (blk, bytes) in flush_to_store(&c, &rot) {
        store.retain(|(x, _)| *x != blk);
        store.push((blk, bytes));
    }
    write_fetching(&c, s3 + 4096, &pattern(0, 9, 4096), &store);
    c.flush().unwrap();
    let rot = c.rotate().unwrap().unwrap();
    let flushed = flush_to_store(&c, &rot);
    let mut want = a.clone();
    want[4096..8192].copy_from_slice(&pattern(0, 9, 4096));
    assert_eq!(flushed, vec![(3, want)]);
    assert_eq!(read(&c, s5, BS as usize, &store), c_);
}

/// Given a write a FLUSH acknowledged and a later full-block write to a new block past the
/// end of the active file whose Dirty record reached the disk but whose bytes (and the file's
/// growth) did not, when the power fails, then the acknowledged write reads back, the
/// unacknowledged block reads its previous version (zeros), and the volume flushes again.
#[test]
fn power_loss_keeps_flushed_writes_and_drops_a_record_whose_bytes_were_lost() {
    let dir = tempfile::tempdir().unwrap();
    let x = pattern(0, 11, BS as usize);
    let snapshot;
    {
        let c = open(dir.path());
        c.write(7 * BS as u64, &x).unwrap();
        c.flush().unwrap();
        snapshot = data_files(dir.path());
        c.write(9 * BS as u64, &pattern(0, 12, BS as usize))
            .unwrap();
        c.die();
    }
    power_loss(dir.path(), &snapshot);
    let c = open(dir.path());
    assert_eq!(read(&c, 7 * BS as u64, BS as usize, &[]), x);
    assert_eq!(
        read(&c, 9 * BS as u64, BS as usize, &[]),
        vec![0; BS as usize]
    );
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(flush_to_store(&c, &rot), vec![(7, x)]);
}

/// A data file's state for [`restore`]: `None` when it did not exist.
type Snapshot = Vec<(std::path::PathBuf, Vec<u8>)>;

/// Power loss back to `snapshot` (taken right after a sync): files in it get its bytes back,
/// data files created since lose their unsynced bytes, files deleted since stay deleted (a
/// deletion only follows a sync that allowed it). The WAL keeps everything written out.
fn restore(dir: &std::path::Path, snapshot: &Snapshot) {
    for (p, _) in data_files(dir) {
        match snapshot.iter().find(|(s, _)| *s == p) {
            Some((_, bytes)) => std::fs::write(&p, bytes).unwrap(),
            None => std::fs::write(&p, b"").unwrap(),
        }
    }
    std::fs::write(dir.join("boot_id"), "a-boot-before-the-power-loss\n").unwrap();
}

/// Random writes (full and partial), FLUSHes, flushes to a model store and evictions; the
/// power fails at a random point, and every data file loses what it gained since the last
/// sync while the WAL keeps all it was given. After recovery every block reads what it held at
/// that sync (what the last FLUSH acknowledged), and flushing works.
#[test]
fn random_power_losses_keep_every_acknowledged_block() {
    const BLOCKS: u64 = 8;
    let bs = BS as usize;
    for seed in 1..=60u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut cur = vec![vec![0u8; bs]; BLOCKS as usize];
        let mut store: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut acked = cur.clone();
        let mut snapshot = data_files(dir.path());
        let c = open(dir.path());
        let ops = 5 + rng.below(40);
        for op in 0..ops {
            let b = rng.below(BLOCKS);
            let tag = (seed as u8).wrapping_mul(7).wrapping_add(op as u8);
            match rng.below(10) {
                0..=2 => {
                    let d = pattern(0, u64::from(tag), bs);
                    c.write(b * BS as u64, &d).unwrap();
                    cur[b as usize] = d;
                }
                3..=5 => {
                    let page = rng.below(u64::from(BS) / 4096) as usize;
                    let d = pattern(0, u64::from(tag), 4096);
                    write_fetching(&c, b * BS as u64 + page as u64 * 4096, &d, &store);
                    cur[b as usize][page * 4096..(page + 1) * 4096].copy_from_slice(&d);
                }
                6 => {
                    c.flush().unwrap();
                    acked = cur.clone();
                    snapshot = data_files(dir.path());
                }
                7 | 8 => {
                    let rot = c.pending_flush().or_else(|| c.rotate().unwrap());
                    if let Some(rot) = rot {
                        for (blk, bytes) in flush_to_store(&c, &rot) {
                            store.retain(|(x, _)| *x != blk);
                            store.push((blk, bytes));
                        }
                        acked = cur.clone();
                        snapshot = data_files(dir.path());
                    }
                }
                _ => {
                    if c.evict_to(rng.below(BLOCKS) * u64::from(BS)).unwrap() > 0 {
                        acked = cur.clone();
                        snapshot = data_files(dir.path());
                    }
                }
            }
        }
        for blk in 0..BLOCKS {
            assert_eq!(read(&c, blk * BS as u64, bs, &store), cur[blk as usize]);
        }
        c.die();
        drop(c);
        restore(dir.path(), &snapshot);
        let c = open(dir.path());
        for blk in 0..BLOCKS {
            assert!(
                read(&c, blk * BS as u64, bs, &store) == acked[blk as usize],
                "seed {seed}: block {blk} lost its acknowledged content ({:?})",
                c.block_info(blk)
            );
        }
        let rot = c.pending_flush().or_else(|| c.rotate().unwrap());
        if let Some(rot) = rot {
            for (blk, bytes) in flush_to_store(&c, &rot) {
                assert_eq!(
                    bytes, acked[blk as usize],
                    "seed {seed}: block {blk} uploaded"
                );
            }
        }
    }
}

/// Given a Dirty block whose file lost its bytes although the log trusts them (a filesystem
/// that lost synced data), when the cache is opened, then it opens, the block reads zeros
/// instead of failing every read, and the volume flushes again.
#[test]
fn a_dirty_block_past_the_end_of_its_file_reads_zeros_and_flushes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let c = open(dir.path());
        c.write(5 * BS as u64, &pattern(0, 40, BS as usize))
            .unwrap();
        c.flush().unwrap();
        c.die();
    }
    for (p, _) in data_files(dir.path()) {
        std::fs::write(p, b"").unwrap();
    }
    let c = open(dir.path());
    assert_eq!(c.block_info(5).state, BlockState::Dirty);
    assert_eq!(
        read(&c, 5 * BS as u64, BS as usize, &[]),
        vec![0; BS as usize]
    );
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(flush_to_store(&c, &rot), vec![(5, vec![0; BS as usize])]);
}
