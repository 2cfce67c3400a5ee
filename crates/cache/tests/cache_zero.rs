//! DISCARD / WRITE_ZEROES as state: `Cache::zero` punches the active file (whole and partial
//! blocks read as zeros, neighbours untouched), a flush reports whole zero blocks and leaves
//! them NotPresent without a remote copy (Unmapped records), and that state survives a process
//! crash and a power loss; a later partial write to such a block sees zeros around it.

use glidefs_cache::*;
use glidefs_testkit::pattern;

mod support;
use support::{data_files, power_loss};

const BS: u32 = 16 * 1024;
const SIZE: u64 = 16 * BS as u64;
const B: u64 = BS as u64;

fn open(dir: &std::path::Path) -> Cache {
    Cache::open(
        dir,
        Geometry::new(SIZE, BS).unwrap(),
        CacheOptions::default(),
    )
    .unwrap()
}

fn read(c: &Cache, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAA; len];
    assert_eq!(c.read_into(off, &mut buf, &[]).unwrap(), ReadOutcome::Done);
    buf
}

/// Reads every block of a rotation (as an upload would), completes it; returns the blocks
/// `read_for_flush` reported all zeros.
fn flush_to_store(c: &Cache, rot: &Rotation) -> Vec<u64> {
    let mut zeros = Vec::new();
    for (i, &b) in rot.blocks().iter().enumerate() {
        let mut buf = vec![0xAA; BS as usize];
        if c.read_for_flush(rot, i, &mut buf).unwrap() {
            assert!(buf.iter().all(|&x| x == 0), "block {b} reported zero");
            zeros.push(b);
        }
    }
    c.complete_flush(rot).unwrap();
    zeros
}

fn image(c: &Cache) -> Vec<u8> {
    read(c, 0, SIZE as usize)
}

#[test]
fn zeroed_ranges_read_as_zeros_and_whole_blocks_leave_the_flush_unmapped() {
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path());
    let mut want = pattern(0, 1, SIZE as usize);
    c.write(0, &want).unwrap();
    let rot = c.rotate().unwrap().unwrap();
    assert!(flush_to_store(&c, &rot).is_empty());
    // Half of block 1, blocks 2 and 3 whole (Clean: no promotion needed), a page of block 4.
    c.zero(B + B / 2, B / 2 + 2 * B + 4096).unwrap();
    want[(B + B / 2) as usize..(4 * B + 4096) as usize].fill(0);
    assert_eq!(image(&c), want);
    for b in 1..=4 {
        assert_eq!(c.block_info(b).state, BlockState::Dirty, "block {b}");
    }
    c.flush().unwrap();
    let rot = c.rotate().unwrap().unwrap();
    assert_eq!(flush_to_store(&c, &rot), vec![2, 3]);
    for b in [2, 3] {
        let i = c.block_info(b);
        assert_eq!(i.state, BlockState::NotPresent, "block {b}");
        assert!(!i.remote, "block {b} has no copy in the store");
    }
    assert_eq!(c.block_info(1).state, BlockState::Clean);
    assert!(c.block_info(1).remote);
    assert_eq!(image(&c), want, "after the flush");

    // A process crash: the Unmapped records replay.
    c.die();
    drop(c);
    let c = open(dir.path());
    assert!(!c.block_info(2).remote);
    assert_eq!(c.block_info(2).state, BlockState::NotPresent);
    assert_eq!(image(&c), want, "after a crash");
    // A partial write to an unmapped block: the rest of it reads as zeros.
    let page = pattern(0, 2, 4096);
    c.write(2 * B + 4096, &page).unwrap();
    want[(2 * B + 4096) as usize..(2 * B + 8192) as usize].copy_from_slice(&page);
    assert_eq!(image(&c), want, "a partial write over an unmapped block");
}

/// A FLUSH acknowledged the unmapping flush (its Unmapped and FlushDone records durable);
/// the power fails after a later unsynced write to another block: the unmapped blocks stay
/// unmapped and read as zeros, the acknowledged data reads back.
#[test]
fn unmapped_blocks_survive_a_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mut want = pattern(0, 3, SIZE as usize);
    let snapshot;
    {
        let c = open(dir.path());
        c.write(0, &want).unwrap();
        let rot = c.rotate().unwrap().unwrap();
        flush_to_store(&c, &rot);
        c.zero(5 * B, 3 * B).unwrap();
        want[(5 * B) as usize..(8 * B) as usize].fill(0);
        c.flush().unwrap();
        let rot = c.rotate().unwrap().unwrap();
        assert_eq!(flush_to_store(&c, &rot), vec![5, 6, 7]);
        c.flush().unwrap();
        snapshot = data_files(dir.path());
        c.write(10 * B, &pattern(0, 4, BS as usize)).unwrap(); // never acknowledged
        c.die();
    }
    power_loss(dir.path(), &snapshot);
    let c = open(dir.path());
    for b in 5..8 {
        let i = c.block_info(b);
        assert!(
            i.state == BlockState::NotPresent && !i.remote,
            "block {b}: {i:?}"
        );
    }
    // (Block 10, Clean before the unacknowledged write, is remote-only now: fetched again.)
    assert_eq!(read(&c, 0, (10 * B) as usize), &want[..(10 * B) as usize]);
    assert_eq!(
        read(&c, 11 * B, (SIZE - 11 * B) as usize),
        &want[(11 * B) as usize..]
    );
    assert!(c.block_info(10).remote);
}
