//! Space that follows live data: zeroed blocks are unmapped, compaction rewrites mostly-dead
//! packs, and GC after it deletes only what no retained manifest needs. Every test checks the
//! data (an oracle per page) on the volume and on a fresh host opened from the store alone.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_testkit::{FaultyStore, GatedStore};
use glidefs_volume::cache::{BlockState, CrashAt, CrashPoint};
use glidefs_volume::{CompactOptions, Volume};

async fn stored_bytes(store: &Arc<dyn object_store::ObjectStore>) -> u64 {
    vstore(store)
        .list_packs()
        .await
        .unwrap()
        .iter()
        .map(|p| p.size)
        .sum()
}

/// 16 blocks in 4 packs; then 3 of the 4 blocks of every pack overwritten and flushed: every
/// old pack is a quarter live.
async fn quarter_live(v: &Volume, oracle: &mut Oracle) {
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(v, oracle, 1, &all).await;
    v.sync_to_store().await.unwrap();
    let dead: Vec<usize> = all.iter().copied().filter(|b| b % 4 != 0).collect();
    write_blocks(v, oracle, 2, &dead).await;
    v.sync_to_store().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroed_whole_blocks_are_unmapped_and_read_as_zeros_without_io() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&v, &mut oracle, 1, &all).await;
    v.sync_to_store().await.unwrap();
    let mapped = v.stats().await.mapped_blocks;
    assert_eq!(mapped, BLOCKS);
    // Blocks 2..6 whole, plus one page in the middle of block 8.
    let bs = u64::from(BS);
    v.write_zeroes(2 * bs, 4 * bs).await.unwrap();
    v.write_zeroes(8 * bs + PAGE as u64, PAGE as u64)
        .await
        .unwrap();
    for p in 2 * PPB..6 * PPB {
        oracle.write(p, vec![0; PAGE]);
    }
    oracle.write(8 * PPB + 1, vec![0; PAGE]);
    oracle.assert_pages(0, &read_all(&v).await, "before the flush");
    let r = v.sync_to_store().await.unwrap();
    assert_eq!(r.blocks, 5, "{r:?}");
    // Block 2 is the flush's first block: stored (a zero frame of a few bytes) so that the
    // publish names a pack of its own; 3, 4 and 5 are unmapped.
    let s = v.stats().await;
    assert_eq!(
        s.mapped_blocks,
        BLOCKS - 3,
        "whole zero blocks are unmapped"
    );
    for b in 2..6 {
        let info = v.cache().block_info(b);
        assert_eq!(info.state, BlockState::NotPresent, "block {b}");
        assert!(!info.remote, "block {b}: no remote copy to fetch");
    }
    let fetched = v.stats().await.blocks_fetched;
    oracle.assert_pages(0, &read_all(&v).await, "after the flush");
    assert_eq!(
        v.stats().await.blocks_fetched,
        fetched,
        "zero blocks cost no fetch"
    );
    let m = vstore(&store).load_manifest().await.unwrap().unwrap();
    assert!((3..6).all(|b| m.get(b).is_none()));
    assert!(m.get(2).unwrap().len < 100, "a zero block's frame is tiny");
    assert!(m.get(8).is_some());
    // The cache's state survives a crash (the Unmapped records replay).
    v.kill().await;
    drop(v);
    let v = open(dir.path(), store.clone()).await;
    assert!(!v.cache().block_info(3).remote);
    oracle.assert_pages(0, &read_all(&v).await, "after a crash");
    v.close().await.unwrap();
    check_fresh_host(&store, &oracle, "fresh host").await;
    // After GC the old pack space of the zeroed blocks goes with their packs' other blocks
    // only once those die too; the live bytes already exclude them.
    assert!(stored_bytes(&store).await > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_rewrites_mostly_dead_packs_and_gc_then_frees_them() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    quarter_live(&v, &mut oracle).await;
    let before = v.stats().await;
    let r = v.compact(CompactOptions::default()).await.unwrap();
    assert_eq!(r.packs_below_threshold, 4, "{r:?}");
    assert_eq!(r.packs_rewritten, 4, "{r:?}");
    assert_eq!(r.blocks_moved, 4, "{r:?}");
    assert_eq!(r.blocks_skipped, 0, "{r:?}");
    assert_eq!(r.packs_written, 1, "four live blocks fit one pack: {r:?}");
    assert_eq!(r.generation, Some(before.manifest_generation + 1));
    let after = v.stats().await;
    assert_eq!(after.live_bytes, before.live_bytes, "frames copied as is");
    assert_eq!(after.mapped_blocks, BLOCKS);
    assert_eq!(after.compactions, 1);
    oracle.assert_pages(0, &read_all(&v).await, "after compaction");
    // Nothing left below the threshold: a second pass does nothing.
    let again = v.compact(CompactOptions::default()).await.unwrap();
    assert_eq!(again.packs_rewritten, 0, "{again:?}");
    assert_eq!(again.generation, None);
    let gc = gc_hard(&store).await;
    assert_eq!(gc.packs_deleted.len(), 4, "{gc:?}");
    let live = v.stats().await.live_bytes;
    let stored = stored_bytes(&store).await;
    assert!(
        stored as f64 <= live as f64 * 1.1,
        "stored {stored} bytes for {live} live"
    );
    // Evicted, the blocks come back from the new packs.
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "evicted, after GC");
    v.close().await.unwrap();
    check_fresh_host(&store, &oracle, "fresh host after compaction and GC").await;
}

/// Blocks overwritten and flushed while a pass copies their frames keep their newer
/// location: the pass publishes only the remaps that still apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_written_during_a_pass_keep_their_newer_data() {
    let mem = mem();
    let gated = Arc::new(GatedStore::new(mem.clone(), "packs/"));
    let store: Arc<dyn object_store::ObjectStore> = gated.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    quarter_live(&v, &mut oracle).await;
    gated.close();
    let pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(CompactOptions::default()).await })
    };
    while gated.held() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The pass is reading the old frames: overwrite two of the live blocks and flush.
    write_blocks(&v, &mut oracle, 3, &[0, 8]).await;
    v.sync_to_store().await.unwrap();
    gated.open();
    let r = pass.await.unwrap().unwrap();
    assert_eq!(r.blocks_moved + r.blocks_skipped, 4, "{r:?}");
    assert!(
        r.blocks_skipped >= 1,
        "the pass raced with the flush: {r:?}"
    );
    oracle.assert_pages(0, &read_all(&v).await, "after the racing pass");
    gc_hard(&store).await;
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "evicted, after GC");
    v.close().await.unwrap();
    check_fresh_host(&store, &oracle, "fresh host").await;
}

/// A crash at every step of a pass (before the upload, after it, after the publish) loses
/// nothing; the reopened volume compacts again, and GC then leaves a store that a fresh host
/// reads completely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_any_compaction_step_loses_nothing() {
    for point in [
        CrashPoint::BeforePackUpload,
        CrashPoint::AfterPackUpload,
        CrashPoint::AfterManifestPublish,
    ] {
        let ctx = format!("{point:?}");
        let store = mem();
        let dir = tempfile::tempdir().unwrap();
        let mut oracle = Oracle::new();
        {
            let v = open(dir.path(), store.clone()).await;
            quarter_live(&v, &mut oracle).await;
            v.close().await.unwrap();
        }
        let hook = Arc::new(CrashAt::new(point, 0));
        let mut cfg = config(dir.path());
        cfg.crash_hook = hook.clone();
        let v = Volume::open(cfg, store.clone()).await.unwrap();
        let r = v.compact(CompactOptions::default()).await;
        assert!(
            hook.fired() && r.is_err(),
            "{ctx}: the crash did not fire: {r:?}"
        );
        v.kill().await;
        drop(v);
        let v = open(dir.path(), store.clone()).await;
        oracle.assert_pages(0, &read_all(&v).await, &format!("{ctx}: reopened"));
        // GC now (the pass's packs may be orphans), then compact and GC again.
        gc_hard(&store).await;
        v.evict_to(0).await.unwrap();
        oracle.assert_pages(0, &read_all(&v).await, &format!("{ctx}: after GC"));
        v.compact(CompactOptions::default()).await.unwrap();
        write_blocks(&v, &mut oracle, 4, &[1]).await;
        v.sync_to_store().await.unwrap();
        gc_hard(&store).await;
        v.close().await.unwrap();
        check_fresh_host(&store, &oracle, &format!("{ctx}: fresh host")).await;
    }
}

/// The publish of a pass lands with its reply lost and its retries fail: the pass errors,
/// the next flush re-sends that exact manifest first (no fence on our own generation), and
/// GC in between loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_a_compaction_publish_is_resent_not_fenced() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    quarter_live(&v, &mut oracle).await;
    let g = v.manifest_generation();
    lose_next_manifest_reply(&faulty);
    let err = v.compact(CompactOptions::default()).await.unwrap_err();
    assert!(err.to_string().contains("compaction"), "{err}");
    faulty.clear_faults();
    assert_eq!(v.manifest_generation(), g, "not adopted while unconfirmed");
    gc_hard(&mem).await;
    write_blocks(&v, &mut oracle, 5, &[5]).await;
    let r = v.sync_to_store().await.unwrap();
    assert_eq!(
        r.generation,
        g + 2,
        "the pass's generation, then the flush's"
    );
    assert!(v.fenced().is_none());
    gc_hard(&mem).await;
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "after the re-sent publish");
    v.close().await.unwrap();
    check_fresh_host(&mem, &oracle, "fresh host").await;
}

/// A pass with more live data than one pack publishes one generation per new pack; a flush
/// and GC between two of them lose nothing: the block the flush wrote keeps its newer data,
/// the first publish's copies survive the GC, and a fresh host reads everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_publishes_pack_by_pack_and_a_flush_between_loses_nothing() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    // Parks the pass before its second pack.
    let hook = PauseAt::new(CrashPoint::BeforePackUpload, 1);
    let mut oracle = Oracle::new();
    // 16 blocks in 4 packs of 4; then 2 of every 4 overwritten: the old packs are half live.
    // The pass copies their 8 live blocks (0, 1, 4, 5, 8, 9, 12, 13, in that order) into two
    // new packs of 4 (`pack_bytes` is 4 blocks).
    let mut cfg = config(dir.path());
    cfg.crash_hook = hook.clone();
    let v = Volume::open(cfg, store.clone()).await.unwrap();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&v, &mut oracle, 1, &all).await;
    v.sync_to_store().await.unwrap();
    let dead: Vec<usize> = all.iter().copied().filter(|b| b % 4 >= 2).collect();
    write_blocks(&v, &mut oracle, 2, &dead).await;
    v.sync_to_store().await.unwrap();
    let g = v.manifest_generation();
    // The hook counts from here: the pass's first pack is its first BeforePackUpload.
    hook.arm();
    let opts = CompactOptions {
        threshold: 0.6,
        ..CompactOptions::default()
    };
    let mut pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(opts).await })
    };
    hook.parked(&mut pass).await;
    assert_eq!(
        v.manifest_generation(),
        g + 1,
        "the first pack is published"
    );
    // Block 13 is live in the last old pack: its copy is in the second new pack.
    write_blocks(&v, &mut oracle, 3, &[13]).await;
    v.sync_to_store().await.unwrap();
    gc_hard(&store).await;
    hook.go();
    let r = pass.await.unwrap().unwrap();
    assert_eq!(r.publishes, 2, "{r:?}");
    assert_eq!(r.packs_written, 2, "{r:?}");
    assert_eq!((r.blocks_moved, r.blocks_skipped), (7, 1), "{r:?}");
    assert_eq!(r.generation, Some(g + 3), "pass, flush, pass: {r:?}");
    oracle.assert_pages(0, &read_all(&v).await, "after the pass");
    gc_hard(&store).await;
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "evicted, after GC");
    v.close().await.unwrap();
    check_fresh_host(&store, &oracle, "fresh host").await;
}

/// Another host published while this one compacted: the pass's publish is fenced (the
/// volume latches it), and the winner's manifest is intact: a third host, before and after
/// GC, reads exactly the winner's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_publish_after_another_host_published_is_fenced() {
    let store = mem();
    let (d1, d2, d3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let mut oracle = Oracle::new();
    let loser = open(d1.path(), store.clone()).await;
    quarter_live(&loser, &mut oracle).await;
    let winner = open(d2.path(), store.clone()).await;
    write_blocks(&winner, &mut oracle, 7, &[1]).await;
    let g = winner.sync_to_store().await.unwrap().generation;
    assert_eq!(g, loser.manifest_generation() + 1);
    let err = loser.compact(CompactOptions::default()).await.unwrap_err();
    assert_eq!(err.kind(), glidefs_volume::VolumeErrorKind::Fenced, "{err}");
    assert!(err.to_string().contains("compaction"), "{err}");
    assert!(loser.fenced().is_some());
    assert!(loser.compact(CompactOptions::default()).await.is_err());
    check_fresh_host(&store, &oracle, "third host").await;
    gc_hard(&store).await;
    let third = open(d3.path(), store.clone()).await;
    assert_eq!(third.manifest_generation(), g);
    oracle.assert_pages(0, &read_all(&third).await, "third host, after GC");
    third.close().await.unwrap();
    winner.close().await.unwrap();
}

/// A hand-off (flush to the store, then close) while a pass is parked before its publish:
/// parked before it takes the flusher's lock, the hand-off goes first and the pass then fails
/// on the closed volume; parked under the lock (its copies uploaded), the hand-off waits for
/// its publish. Either way the next host, before and after GC, reads every block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_during_a_pass_loses_nothing() {
    for point in [CrashPoint::BeforePackUpload, CrashPoint::AfterPackUpload] {
        let store = mem();
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let hook = PauseAt::new(point, 0);
        let mut cfg = config(d1.path());
        cfg.crash_hook = hook.clone();
        let v = Volume::open(cfg, store.clone()).await.unwrap();
        let mut oracle = Oracle::new();
        quarter_live(&v, &mut oracle).await;
        write_blocks(&v, &mut oracle, 8, &[2]).await;
        hook.arm();
        let mut pass = {
            let v = v.clone();
            tokio::spawn(async move { v.compact(CompactOptions::default()).await })
        };
        hook.parked(&mut pass).await;
        let hand_off = {
            let v = v.clone();
            tokio::spawn(async move {
                v.sync_to_store().await?;
                v.close().await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        match point {
            CrashPoint::BeforePackUpload => {
                hand_off.await.unwrap().unwrap();
                hook.go();
                let r = pass.await.unwrap();
                assert!(r.is_err(), "{point:?}: the pass on a closed volume: {r:?}");
            }
            _ => {
                assert!(!hand_off.is_finished(), "{point:?}: the hand-off waits");
                hook.go();
                let r = pass.await.unwrap().unwrap();
                assert!(r.generation.is_some(), "{point:?}: {r:?}");
                hand_off.await.unwrap().unwrap();
            }
        }
        let next = open(d2.path(), store.clone()).await;
        oracle.assert_pages(0, &read_all(&next).await, &format!("{point:?}: next host"));
        gc_hard(&store).await;
        next.evict_to(0).await.unwrap();
        oracle.assert_pages(
            0,
            &read_all(&next).await,
            &format!("{point:?}: next host, after GC"),
        );
        next.close().await.unwrap();
    }
}

/// A flush that unmaps zeroed blocks loses its publish reply: the same manifest is re-sent
/// (not fenced), the blocks stay unmapped, and a reopen of the same cache and a fresh host
/// both read zeros there and the data elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_a_flush_that_unmaps_blocks_is_resent() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&v, &mut oracle, 1, &all).await;
    let g = v.sync_to_store().await.unwrap().generation;
    let bs = u64::from(BS);
    v.write_zeroes(3 * bs, 5 * bs).await.unwrap();
    for p in 3 * PPB..8 * PPB {
        oracle.write(p, vec![0; PAGE]);
    }
    lose_next_manifest_reply(&faulty);
    assert!(v.sync_to_store().await.is_err());
    faulty.clear_faults();
    let r = v.sync_to_store().await.unwrap();
    assert_eq!(r.generation, g + 1, "the lost publish re-sent: {r:?}");
    assert!(v.fenced().is_none());
    assert_eq!(v.stats().await.mapped_blocks, BLOCKS - 4, "4 of 5 unmapped");
    let m = vstore(&mem).load_manifest().await.unwrap().unwrap();
    assert!((4..8).all(|b| m.get(b).is_none()), "unmapped in the store");
    oracle.assert_pages(0, &read_all(&v).await, "after the re-sent publish");
    v.close().await.unwrap();
    let v = open(dir.path(), store.clone()).await;
    oracle.assert_pages(0, &read_all(&v).await, "reopened");
    v.close().await.unwrap();
    check_fresh_host(&mem, &oracle, "fresh host").await;
}

/// A pass's new packs are no bigger than `max_bytes` (when under `pack_bytes`): a pass that
/// copies 3 blocks with `max_bytes` of 2 blocks writes two packs, and every block reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_writes_packs_no_bigger_than_its_byte_budget() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&v, &mut oracle, 1, &all).await;
    v.sync_to_store().await.unwrap();
    // One block of every pack of 4 overwritten: each old pack is 3/4 live.
    let dead: Vec<usize> = all.iter().copied().filter(|b| b % 4 == 3).collect();
    write_blocks(&v, &mut oracle, 2, &dead).await;
    v.sync_to_store().await.unwrap();
    let r = v
        .compact(CompactOptions {
            threshold: 0.9,
            max_bytes: 2 * u64::from(BS),
        })
        .await
        .unwrap();
    // The first pack is always taken (3 live blocks, over the budget); the next one is not.
    assert_eq!(r.packs_rewritten, 1, "{r:?}");
    assert_eq!(r.blocks_moved, 3, "{r:?}");
    assert_eq!((r.packs_written, r.publishes), (2, 2), "{r:?}");
    oracle.assert_pages(0, &read_all(&v).await, "after the pass");
    gc_hard(&store).await;
    v.close().await.unwrap();
    check_fresh_host(&store, &oracle, "fresh host").await;
}
