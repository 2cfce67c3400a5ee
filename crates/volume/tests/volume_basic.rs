//! Volume behaviour against the in-memory store: flush to store, cold reads (coalesced, with
//! readahead), eviction, backfill of partial writes, recovery from the store alone.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_testkit::{FaultyStore, Op};
use glidefs_volume::cache::BlockState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synced_data_survives_losing_the_local_disk() {
    let store = mem();
    let d1 = tempfile::tempdir().unwrap();
    let v = open(d1.path(), store.clone()).await;
    let mut want = vec![0u8; SIZE as usize];
    for p in (0..PAGES).step_by(3) {
        let d = page_data(1, p);
        v.write((p * PAGE) as u64, &d).await.unwrap();
        want[p * PAGE..(p + 1) * PAGE].copy_from_slice(&d);
    }
    let r = v.sync_to_store().await.unwrap();
    assert_eq!(r.generation, 1);
    assert_eq!(r.blocks, BLOCKS);
    assert!(
        r.packs >= 4,
        "pack_bytes splits the flush into packs: {r:?}"
    );
    assert_eq!(read_all(&v).await, want);
    v.close().await.unwrap();
    drop(v);
    // a new host: empty cache dir, same store
    let d2 = tempfile::tempdir().unwrap();
    let v = open(d2.path(), store).await;
    assert_eq!(v.manifest_generation(), 1);
    assert_eq!(read_all(&v).await, want);
    assert!(v.stats().await.blocks_fetched >= BLOCKS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_blocks_read_back_and_partial_writes_backfill() {
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), mem()).await;
    let full: Vec<u8> = (0..BS as usize * 2).map(|i| (i % 251) as u8).collect();
    v.write(0, &full).await.unwrap();
    v.sync_to_store().await.unwrap();
    assert_eq!(v.evict_to(0).await.unwrap(), 2);
    assert_eq!(v.cache().block_info(0).state, BlockState::NotPresent);
    // partial write into an evicted block: old bytes are fetched and merged
    v.write(100, &[7; 50]).await.unwrap();
    let mut want = full.clone();
    want[100..150].fill(7);
    let mut got = vec![0; full.len()];
    v.read(0, &mut got).await.unwrap();
    assert_eq!(got, want);
    assert_eq!(v.cache().block_info(0).state, BlockState::Dirty);
    assert_eq!(
        v.cache().block_info(1).state,
        BlockState::Clean,
        "cold read kept the block"
    );
    // a full-block overwrite of an evicted block needs no fetch
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    let before = v.stats().await.blocks_fetched;
    v.write(BS as u64, &vec![9; BS as usize]).await.unwrap();
    assert_eq!(v.stats().await.blocks_fetched, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_on_one_block_share_a_fetch() {
    let faulty = Arc::new(FaultyStore::new(mem()));
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.readahead_blocks = 0;
    let v = glidefs_volume::Volume::open(cfg, faulty.clone())
        .await
        .unwrap();
    let data: Vec<u8> = (0..BS as usize).map(|i| (i * 7) as u8).collect();
    v.write(0, &data).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    faulty.set_latency(Duration::from_millis(100));
    let gets_before = faulty.counts().calls(Op::Get);
    let reads = (0..8).map(|i| {
        let v = v.clone();
        async move {
            let mut buf = vec![0; PAGE];
            v.read(((i % 4) * PAGE) as u64, &mut buf).await.unwrap();
            buf
        }
    });
    let got = futures::future::join_all(reads).await;
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g[..], data[(i % 4) * PAGE..(i % 4 + 1) * PAGE]);
    }
    let s = v.stats().await;
    assert_eq!(
        faulty.counts().calls(Op::Get) - gets_before,
        1,
        "one ranged GET for 8 readers"
    );
    assert_eq!(s.blocks_fetched, 1);
    assert_eq!(s.fetches_coalesced, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_cold_reads_trigger_readahead() {
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), mem()).await;
    let data: Vec<u8> = (0..SIZE as usize)
        .map(|i| (i / 4096) as u8 ^ (i as u8))
        .collect();
    v.write(0, &data).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    let mut buf = vec![0; BS as usize];
    for b in 0..BLOCKS {
        v.read(b * BS as u64, &mut buf).await.unwrap();
        assert_eq!(
            buf[..],
            data[(b * BS as u64) as usize..((b + 1) * BS as u64) as usize]
        );
    }
    let s = v.stats().await;
    assert!(s.readahead_started > 0, "{s:?}");
    assert!(s.blocks_fetched + s.fills_refused <= BLOCKS + s.readahead_started);
}

/// A ublk queue's loop thread reports its reads through `note_read` from outside the
/// runtime: a sequential stream of them fetches the blocks ahead, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn note_read_from_a_plain_thread_fetches_the_blocks_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), mem()).await; // readahead_blocks = 2
    v.write(0, &vec![7u8; SIZE as usize]).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    let state = |b: u64| v.cache().block_info(b).state;
    assert!((0..BLOCKS).all(|b| state(b) == BlockState::NotPresent));
    let reader = Arc::clone(&v);
    // Four 4 KiB reads in blocks 0, 0, 0 and 1: a stream from the third read on, which
    // fetches blocks 1-2, the fourth then block 3.
    std::thread::spawn(move || {
        for off in [0, 4096, 8192, u64::from(BS)] {
            reader.note_read(off, 4096);
        }
    })
    .join()
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(1..=3).all(|b| state(b) == BlockState::Clean) {
        assert!(
            std::time::Instant::now() < deadline,
            "blocks 1-3 never fetched"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Block 0 (its reader fetches it, not readahead) and blocks 4.. stay cold.
    assert_eq!(state(0), BlockState::NotPresent);
    assert!((4..BLOCKS).all(|b| state(b) == BlockState::NotPresent));
    // A random jump starts no stream: nothing more is fetched.
    v.note_read(10 * u64::from(BS), 4096);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(state(11), BlockState::NotPresent);
    assert_eq!(v.stats().await.readahead_started, 3);
}

/// A volume of `data.len()` bytes (readahead 8 blocks) on a counting store, `data` written,
/// flushed into one pack (every frame follows the previous one) and evicted.
async fn flushed_in_one_pack(
    dir: &std::path::Path,
    data: &[u8],
) -> (Arc<glidefs_volume::Volume>, Arc<FaultyStore>) {
    let faulty = Arc::new(FaultyStore::new(mem()));
    let mut cfg = config(dir);
    cfg.size = data.len() as u64;
    cfg.pack_bytes = cfg.size;
    cfg.readahead_blocks = 8;
    let v = glidefs_volume::Volume::open(cfg, faulty.clone())
        .await
        .unwrap();
    v.write(0, data).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    (v, faulty)
}

/// Readahead of blocks written in sequence (back to back in one pack) costs one GET per
/// window step, not one per block: 16 blocks read in order take 6 GETs (the first three
/// reads fetch their own block; the stream then asks for blocks 3-10, 11-14 and 15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_fetches_back_to_back_blocks_with_one_get() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..SIZE as usize)
        .map(|i| (i / 4096) as u8 ^ (i as u8))
        .collect();
    let (v, faulty) = flushed_in_one_pack(dir.path(), &data).await;
    let gets = faulty.counts().calls(Op::Get);
    let mut buf = vec![0; BS as usize];
    for b in 0..BLOCKS {
        let at = b * u64::from(BS);
        v.read(at, &mut buf).await.unwrap();
        assert_eq!(
            buf[..],
            data[at as usize..(at + u64::from(BS)) as usize],
            "block {b}"
        );
    }
    let s = v.stats().await;
    assert_eq!(faulty.counts().calls(Op::Get) - gets, 6, "{s:?}");
    assert_eq!(s.readahead_started, BLOCKS - 3, "{s:?}");
}

/// Four sequential readers of cold data that take turns (fio with four jobs, a guest reading
/// four files) each keep their own stream: 4 x 32 blocks written in sequence, read one block
/// per reader in turn, take 4 x 10 GETs (each reader's first three reads fetch their own
/// block; its stream then asks for blocks 3-10, 11-14, 15-18, ... in steps of 4), not one
/// GET per block (128) as when every reader's read ended the previous reader's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_taking_turns_each_keep_their_stream() {
    const EACH: u64 = 32;
    let dir = tempfile::tempdir().unwrap();
    let data = glidefs_testkit::noise(9, (4 * EACH * u64::from(BS)) as usize);
    let (v, faulty) = flushed_in_one_pack(dir.path(), &data).await;
    let gets = faulty.counts().calls(Op::Get);
    let mut buf = vec![0; BS as usize];
    for step in 0..EACH {
        for reader in 0..4 {
            let b = reader * EACH + step;
            let at = (b * u64::from(BS)) as usize;
            v.read(at as u64, &mut buf).await.unwrap();
            assert_eq!(buf[..], data[at..at + BS as usize], "block {b}");
        }
    }
    let s = v.stats().await;
    // Per reader: its first 3 blocks, then the windows 3..11, 11..15, 15..19, 19..23, 23..27,
    // 27..31 and 31..35 (the blocks past its region are the next reader's, cached by then).
    let gets = faulty.counts().calls(Op::Get) - gets;
    assert_eq!(gets, 4 * 10, "GETs for 4 x {EACH} blocks: {s:?}");
    assert_eq!(s.readahead_started, 4 * (EACH - 3), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_budget_evicts_clean_blocks_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.disk_budget = 4 * BS as u64;
    let v = glidefs_volume::Volume::open(cfg, mem()).await.unwrap();
    let data = vec![5u8; SIZE as usize];
    v.write(0, &data).await.unwrap();
    let r = v.sync_to_store().await.unwrap();
    assert_eq!(r.evicted, BLOCKS - 4);
    v.write(0, &vec![6u8; 8 * BS as usize]).await.unwrap(); // 8 dirty blocks > budget
    v.evict_to(4 * BS as u64).await.unwrap();
    let s = v.stats().await.cache;
    assert_eq!(s.dirty, 8, "dirty blocks are never evicted");
    assert_eq!(s.clean, 0);
    let mut want = data.clone();
    want[..8 * BS as usize].fill(6);
    assert_eq!(read_all(&v).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_answer_while_a_sync_is_uploading() {
    let faulty = Arc::new(FaultyStore::new(mem()));
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), faulty.clone()).await;
    v.write(0, &vec![3u8; SIZE as usize]).await.unwrap();
    // Every store call of the sync now takes 3 s.
    faulty.set_latency(Duration::from_secs(3));
    let sync = tokio::spawn({
        let v = v.clone();
        async move { v.sync_to_store().await }
    });
    // Once the rotation happened the sync holds its lock and waits on its uploads.
    while v.cache().block_info(0).state != BlockState::Syncing {
        tokio::task::yield_now().await;
    }
    let during = tokio::time::timeout(Duration::from_secs(1), v.stats())
        .await
        .expect("stats waited for the sync in progress");
    assert_eq!(during.packs_uploaded, 0, "{during:?}");
    assert!(!sync.is_finished(), "the sync was still uploading");
    // Cancel it (the rotation stays pending) and let the next sync upload it at full speed.
    sync.abort();
    let _ = sync.await;
    faulty.set_latency(Duration::ZERO);
    let report = v.sync_to_store().await.unwrap();
    let after = v.stats().await;
    assert!(report.packs > 0);
    assert_eq!(after.packs_uploaded, report.packs);
    assert_eq!(after.bytes_uploaded, report.bytes);
}
