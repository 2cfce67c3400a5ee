//! Warm sets end to end on the engine (`warm.rs`): a recording keeps the blocks read, each
//! once in first-read order, up to its most, and stores them; a clone gets a copy; the
//! clone's warm fetches exactly the set's blocks that are still only in the store (never one
//! the clone rewrote, whose bytes stay the clone's), in few ranged GETs, after which reading
//! the set costs no GET at all; the byte budget is kept; dropping the set ends a recording
//! and deletes it; a set of another block size is not used. Every read is checked against
//! the oracle of what was written.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_testkit::fault::Op;
use glidefs_testkit::FaultyStore;
use glidefs_volume::cache::BlockState;
use glidefs_volume::{RecordOptions, Volume, VolumeConfig, WarmSet};

use common::*;

const CLONE: &str = "vol-clone";

fn clone_cfg(dir: &std::path::Path, name: &str) -> VolumeConfig {
    let mut cfg = config(dir);
    cfg.name = name.into();
    // Only the warm fetches ahead here.
    cfg.readahead_blocks = 0;
    cfg
}

/// Reads block `b` of `v` (which tells the recording, as a ublk READ does).
async fn read(v: &Volume, b: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BS as usize];
    v.read(b * u64::from(BS), &mut buf).await.unwrap();
    buf
}

/// Waits (bounded) until the recording of `v` ended and was stored.
async fn recorded(v: &Volume) -> u64 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = v.warm_status();
        if s.recording.is_none() {
            if let Some(r) = s.last_recording {
                assert_eq!(r.error, None);
                return r.blocks;
            }
        }
        assert!(Instant::now() < until, "the recording did not end: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An origin with every block written and flushed, its warm set recorded over reads of
/// `reads` (at most `max` blocks), and snapshot `base`.
async fn origin_with_set(
    store: &Arc<dyn object_store::ObjectStore>,
    reads: &[u64],
    max: usize,
) -> (tempfile::TempDir, Arc<Volume>, Oracle) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.readahead_blocks = 0;
    let v = Volume::open(cfg, store.clone()).await.unwrap();
    let mut oracle = Oracle::new();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&v, &mut oracle, 1, &all).await;
    v.sync_to_store().await.unwrap();
    v.record_warm_set(RecordOptions {
        window: Duration::from_secs(60),
        max_blocks: max,
    })
    .await
    .unwrap();
    for &b in reads {
        read(&v, b).await;
    }
    recorded(&v).await;
    v.create_snapshot("base").await.unwrap();
    (dir, v, oracle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_set_warms_a_clone_and_never_fetches_what_the_clone_rewrote() {
    let faulty = Arc::new(FaultyStore::new(mem()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    // Block 3 twice, then more than the 6 blocks the recording keeps.
    let (_odir, v, oracle) = origin_with_set(&store, &[9, 3, 3, 12, 0, 5, 7, 1, 2], 6).await;
    let set = v.warm_set().await.unwrap().expect("stored");
    assert_eq!(
        set.blocks,
        vec![9, 3, 12, 0, 5, 7],
        "first-read order, once"
    );
    assert_eq!(set.block_size, BS);
    assert!(v.warm_status().recording.is_none());

    let cdir = tempfile::tempdir().unwrap();
    let c = Volume::create_clone(
        clone_cfg(cdir.path(), CLONE),
        store.clone(),
        "vol-test",
        "base",
    )
    .await
    .unwrap();
    assert_eq!(
        c.warm_set().await.unwrap(),
        Some(set.clone()),
        "the clone has a copy"
    );
    // The clone rewrites block 12 before its warm: the warm must leave it alone.
    let mut cloned = oracle.clone();
    let pages_per_block = BS as usize / PAGE;
    let mut mine = Vec::new();
    for p in 12 * pages_per_block..13 * pages_per_block {
        let d = page_data(7, p);
        mine.extend_from_slice(&d);
        cloned.write(p, d);
    }
    c.write(12 * u64::from(BS), &mine).await.unwrap();

    let before = faulty.counts();
    let r = c.warm(u64::MAX, 2).await.unwrap();
    let after = faulty.counts();
    assert_eq!(r.set_blocks, 6);
    assert_eq!(r.fetched_blocks, 5, "{r:?}");
    assert_eq!((r.skipped, r.failed, r.over_budget), (1, 0, 0), "{r:?}");
    // The origin wrote its blocks in order into packs of 4 (0..=3, 4..=7, 8..=11,
    // 12..=15): the cold blocks 0, 3 | 5, 7 | 9 are none back to back, one GET each.
    assert_eq!(r.gets, 5, "{r:?}");
    assert_eq!(
        after.calls(Op::Get) - before.calls(Op::Get),
        r.gets + 1,
        "one GET of the set, then the runs"
    );
    assert!(
        r.fetched_bytes >= 5 * u64::from(BS) && r.fetched_bytes < 6 * u64::from(BS),
        "{r:?}"
    );
    assert_eq!(c.warm_status().last_warm, Some(r.clone()));
    for b in [9, 3, 0, 5, 7] {
        assert_ne!(c.block_info(b).state, BlockState::NotPresent, "block {b}");
    }
    assert_eq!(
        c.block_info(12).state,
        BlockState::Dirty,
        "the rewrite stays"
    );
    // The set is here: reading it fetches nothing; everything reads what was written.
    let gets = faulty.counts().calls(Op::Get);
    for b in [9, 3, 12, 0, 5, 7] {
        let got = read(&c, b).await;
        cloned.assert_pages(b as usize * pages_per_block, &got, "clone, warmed block");
    }
    assert_eq!(
        faulty.counts().calls(Op::Get),
        gets,
        "no GET for a warmed set"
    );
    cloned.assert_pages(0, &read_all(&c).await, "clone");
    oracle.assert_pages(0, &read_all(&v).await, "origin");

    // A second warm finds everything here.
    let again = c.warm(u64::MAX, 2).await.unwrap();
    assert_eq!((again.fetched_blocks, again.skipped), (0, 6), "{again:?}");

    // A budget of one frame's worth fetches one block, in packs' order (block 0 first).
    let c2dir = tempfile::tempdir().unwrap();
    let c2 = Volume::create_clone(
        clone_cfg(c2dir.path(), "vol-clone2"),
        store.clone(),
        "vol-test",
        "base",
    )
    .await
    .unwrap();
    let r2 = c2.warm(u64::from(BS) + 256, 2).await.unwrap();
    assert_eq!((r2.fetched_blocks, r2.over_budget), (1, 5), "{r2:?}");
    assert_ne!(c2.block_info(0).state, BlockState::NotPresent);
    oracle.assert_pages(0, &read_all(&c2).await, "second clone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_ends_a_recording_and_a_set_of_another_block_size_is_not_used() {
    let store = mem();
    let (_odir, v, _oracle) = origin_with_set(&store, &[1, 2], 2).await;
    assert_eq!(v.warm_set().await.unwrap().unwrap().blocks, vec![1, 2]);
    // One recording at a time.
    let opts = RecordOptions {
        window: Duration::from_secs(60),
        max_blocks: 16,
    };
    v.record_warm_set(opts).await.unwrap();
    let e = v.record_warm_set(opts).await.unwrap_err();
    assert!(e.to_string().contains("already running"), "{e}");
    read(&v, 4).await;
    assert_eq!(v.warm_status().recording.unwrap().blocks, 1);
    // A drop ends it storing nothing, and deletes the stored set.
    v.drop_warm_set().await.unwrap();
    assert!(v.warm_status().recording.is_none());
    assert_eq!(v.warm_set().await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(v.warm_set().await.unwrap(), None, "nothing stored later");
    // Bad options are refused.
    let e = v
        .record_warm_set(RecordOptions {
            window: Duration::from_secs(60),
            max_blocks: 0,
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("at most 0 blocks"), "{e}");

    // A set naming blocks of another size is left alone.
    let vs = vstore(&store);
    vs.put_warm_set(&WarmSet::new(BS * 2, 0, 1, vec![0, 1]))
        .await
        .unwrap();
    let r = v.warm(u64::MAX, 2).await.unwrap();
    assert_eq!(r.fetched_blocks, 0);
    assert!(r.note.unwrap().contains("not used"));
    // No set: nothing to do.
    v.drop_warm_set().await.unwrap();
    let r = v.warm(u64::MAX, 2).await.unwrap();
    assert_eq!(r.set_blocks, 0);
    assert!(r.note.unwrap().contains("no warm set"));
}

/// Resident memory of this process, in bytes (Linux `/proc/self/statm`).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Review of the warm sets (5d3c722): a recording keeps at most `max_blocks` blocks, so what
/// it holds should be bounded by that, not by the size of the volume. The engine keeps every
/// other per-block structure sparse (the state map costs a few bytes per 256 GiB never
/// written; cache files grow as blocks are written), and the daemon accepts volumes up to
/// 256 TiB (`limits::MAX_VOLUME_SIZE`) at any block size from 4 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_holds_memory_for_the_blocks_it_keeps_not_for_the_whole_volume() {
    let dir = tempfile::tempdir().unwrap();
    // The daemon's largest volume at the default block size (128 KiB): 2 Gi blocks.
    let mut cfg = VolumeConfig::new("vol-big", dir.path(), 256 << 40);
    cfg.readahead_blocks = 0;
    let v = Volume::open(cfg, mem()).await.unwrap();
    let before = resident_bytes();
    let t0 = Instant::now();
    v.record_warm_set(RecordOptions {
        window: Duration::from_secs(60),
        max_blocks: 16,
    })
    .await
    .unwrap();
    let took = t0.elapsed();
    let grew = resident_bytes().saturating_sub(before);
    v.drop_warm_set().await.unwrap();
    assert!(
        grew < 32 << 20,
        "starting a recording of at most 16 blocks made the process {} MiB larger (in {took:?}); \
         at 4 KiB blocks it would be 32 times that",
        grew >> 20
    );
}

/// Review of the warm sets (5d3c722), the most delicate interleaving: the warm's GET of a
/// block is in flight while the guest rewrites that block, flushes it to the store and the
/// block is evicted (NotPresent and remote again, at its new location). The warm's bytes
/// (the old version) must not be kept: the later read returns the rewrite. (The second pass
/// then fetches the refused blocks where the manifest names them now.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_fetch_held_across_a_rewrite_flush_and_eviction_keeps_nothing_old() {
    let dir = tempfile::tempdir().unwrap();
    let (v, gate) = gated_volume(dir.path(), 0, None).await;
    let old = glidefs_testkit::noise(11, 2 * BSU);
    write_flush_evict(&v, 4, &old).await;
    let store: Arc<dyn object_store::ObjectStore> = gate.clone();
    vstore(&store)
        .put_warm_set(&WarmSet::new(BS, 0, 1, vec![5, 4]))
        .await
        .unwrap();
    gate.close();
    let warming = tokio::spawn({
        let v = v.clone();
        async move { v.warm(u64::MAX, 1).await }
    });
    tokio::time::timeout(Duration::from_secs(60), gate.wait_held(1))
        .await
        .expect("the warm's GET reached the store");
    // Blocks 4-5 are back to back in one pack: one run, held.
    let new = glidefs_testkit::noise(12, BSU);
    write_flush_evict(&v, 4, &new).await;
    gate.open();
    let r = warming.await.unwrap().unwrap();
    // The held run's fills were refused (the eviction moved the fill epoch): both blocks
    // are fetched again in the second pass, block 4 at its new location (2 GETs).
    assert_eq!((r.gets, r.fetched_blocks, r.failed), (3, 2, 0), "{r:?}");
    for b in [4, 5] {
        assert_ne!(
            v.block_info(b).state,
            BlockState::NotPresent,
            "block {b} warmed"
        );
    }
    assert_eq!(read(&v, 4).await, new, "block 4 reads its rewrite");
    assert_eq!(
        read(&v, 5).await,
        old[BSU..].to_vec(),
        "block 5 reads what was written"
    );
}
