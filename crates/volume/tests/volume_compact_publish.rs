//! The pack-by-pack compaction publish (a pass publishes one generation per new pack) under
//! the interleavings and faults around it: a cold read whose old pack GC deleted while the
//! pass moved its block reads the block's copy; blocks zeroed during a pass stay zero; a
//! pending flush publish stops the pass; a lost or landed second publish followed by a crash
//! keeps the FLUSHed local writes; a close with a pass's publish unconfirmed reopens as the
//! owner; GC and cold reads between a pass's two publishes read the right packs. Every test
//! checks the data (an oracle per page) on the volume and on a fresh host opened from the
//! store alone.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use glidefs_objstore::GcOptions;
use glidefs_testkit::{FaultyStore, GatedStore};
use glidefs_volume::cache::{CrashAt, CrashPoint};
use glidefs_volume::Volume;

/// GC as the daemon configures it by default (2 manifests kept, 1 h of grace), run when the
/// manifest the pass started from is older than the grace (the volume saw no publish for
/// two hours before the pass: e.g. reopened after a clean close, which skips the claim).
async fn gc_default_two_hours_on(
    store: &Arc<dyn object_store::ObjectStore>,
) -> glidefs_objstore::GcReport {
    vstore(store)
        .gc(GcOptions {
            grace: Duration::from_secs(3600),
            dry_run: false,
            keep_manifests: 2,
            now: Some(SystemTime::now() + Duration::from_secs(2 * 3600)),
        })
        .await
        .unwrap()
}

/// A cold read that looked up its block's location just before a pass moved the block, and
/// whose GET reaches the store only after GC (default rules: 2 manifests kept, 1 h grace)
/// collected the old pack. One multi-pack pass publishes two generations, which by itself
/// pushes the manifest it started from out of `keep_manifests = 2`; if that manifest is
/// older than the grace (no publish for an hour before the pass), the old pack goes at the
/// next GC. The block was only moved (its bytes are in the copy), so the read, finding its
/// pack gone, reads the block where the manifest names it now: the block's bytes, not a 404
/// (EIO to the guest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_read_racing_a_pass_and_gc_reads_the_moved_block() {
    let mem = mem();
    let dir = tempfile::tempdir().unwrap();
    let mut oracle = Oracle::new();
    {
        let v = open(dir.path(), mem.clone()).await;
        half_live(&v, &mut oracle).await;
        v.close().await.unwrap();
    }
    // Block 0's pack: the reader's GET of it is held at the gate.
    let old = vstore(&mem).load_manifest().await.unwrap().unwrap();
    let p0 = old.get(0).unwrap().pack.clone();
    let gated = Arc::new(GatedStore::new(mem.clone(), p0.as_str()));
    let store: Arc<dyn object_store::ObjectStore> = gated.clone();
    let hook = PauseAt::new(CrashPoint::BeforePackUpload, 0);
    let mut cfg = config(dir.path());
    cfg.crash_hook = hook.clone();
    let v = Volume::open(cfg, store).await.unwrap();
    v.evict_to(0).await.unwrap();
    // The pass reads the first pack's frames (p0's included) and parks before publishing.
    hook.arm();
    let mut pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(HALF).await })
    };
    hook.parked(&mut pass).await;
    // A cold read of block 0 looks up its location (in p0) and its GET is slow.
    gated.close();
    let reader = {
        let v = v.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; BS as usize];
            v.read(0, &mut buf).await.map(|()| buf)
        })
    };
    gated.wait_held(1).await;
    hook.go();
    let r = pass.await.unwrap().unwrap();
    assert_eq!(r.publishes, 2, "{r:?}");
    let gc = gc_default_two_hours_on(&mem).await;
    assert!(gc.packs_deleted.contains(&p0), "{gc:?}");
    gated.open();
    let got = reader.await.unwrap();
    let buf = got.unwrap_or_else(|e| panic!("cold read of a block the pass moved: {e}"));
    oracle.assert_pages(0, &buf, "the moved block");
    oracle.assert_pages(0, &read_all(&v).await, "after the pass and GC");
    v.close().await.unwrap();
    check_fresh_host(&mem, &oracle, "fresh host").await;
}

/// Blocks zeroed (DISCARD) and flushed while the pass reads their frames are not remapped
/// back to their copies: they stay unmapped (or point at the flush's zero frame).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_zeroed_during_a_pass_stay_zero() {
    let mem = mem();
    let gated = Arc::new(GatedStore::new(mem.clone(), "packs/"));
    let store: Arc<dyn object_store::ObjectStore> = gated.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    half_live(&v, &mut oracle).await;
    gated.close();
    let pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(HALF).await })
    };
    gated.wait_held(1).await;
    // Blocks 4, 5 and 12 (live in old packs) zeroed and flushed: 4 is the flush's first block
    // (a zero frame), 5 and 12 are unmapped.
    let bs = u64::from(BS);
    v.write_zeroes(4 * bs, 2 * bs).await.unwrap();
    v.write_zeroes(12 * bs, bs).await.unwrap();
    for p in (4 * PPB..6 * PPB).chain(12 * PPB..13 * PPB) {
        oracle.write(p, vec![0; PAGE]);
    }
    v.sync_to_store().await.unwrap();
    gated.open();
    let r = pass.await.unwrap().unwrap();
    assert_eq!(r.blocks_skipped, 3, "{r:?}");
    let m = vstore(&mem).load_manifest().await.unwrap().unwrap();
    assert!(m.get(5).is_none() && m.get(12).is_none(), "unmapped");
    gc_hard(&mem).await;
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "evicted, after GC");
    v.close().await.unwrap();
    let v = open(dir.path(), mem.clone()).await;
    oracle.assert_pages(0, &read_all(&v).await, "reopened");
    v.close().await.unwrap();
    check_fresh_host(&mem, &oracle, "fresh host").await;
}

/// A flush's publish with an unknown outcome is pending when the pass wants to publish: the
/// pass stops (nothing published, its pack not uploaded), the flush's manifest is re-sent
/// next, and a later pass compacts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_flush_publish_stops_the_pass() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    half_live(&v, &mut oracle).await;
    let g = v.manifest_generation();
    // Block 0 (live in an old pack) rewritten; its flush's reply is lost.
    write_blocks(&v, &mut oracle, 3, &[0]).await;
    lose_next_manifest_reply(&faulty);
    assert!(v.sync_to_store().await.is_err());
    faulty.clear_faults();
    let r = v.compact(HALF).await.unwrap();
    assert_eq!((r.publishes, r.packs_written), (0, 0), "{r:?}");
    assert_eq!(v.manifest_generation(), g);
    gc_hard(&mem).await;
    let s = v.sync_to_store().await.unwrap();
    assert_eq!(s.generation, g + 1, "the flush's lost publish re-sent");
    let r = v.compact(HALF).await.unwrap();
    assert!(r.generation.is_some(), "{r:?}");
    gc_hard(&mem).await;
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "evicted, after GC");
    v.close().await.unwrap();
    check_fresh_host(&mem, &oracle, "fresh host").await;
}

/// The second publish of a pass loses its reply (it landed, or not), then the process dies
/// with an acknowledged (FLUSHed) write not yet in the store. The reopened cache judges the
/// store's latest generation as its own (not fenced), keeps the write, and publishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_second_publish_then_a_crash_keeps_local_writes() {
    for landed in [true, false] {
        let ctx = format!("landed={landed}");
        let mem = mem();
        let faulty = Arc::new(FaultyStore::new(mem.clone()));
        let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
        let dir = tempfile::tempdir().unwrap();
        let hook = PauseAt::new(CrashPoint::BeforePackUpload, 1);
        let mut cfg = config(dir.path());
        cfg.crash_hook = hook.clone();
        let v = Volume::open(cfg, store.clone()).await.unwrap();
        let mut oracle = Oracle::new();
        half_live(&v, &mut oracle).await;
        let g = v.manifest_generation();
        hook.arm();
        let mut pass = {
            let v = v.clone();
            tokio::spawn(async move { v.compact(HALF).await })
        };
        hook.parked(&mut pass).await;
        assert_eq!(
            v.manifest_generation(),
            g + 1,
            "{ctx}: first pack published"
        );
        if landed {
            lose_next_manifest_reply(&faulty);
        } else {
            use glidefs_testkit::{Fault, FaultRule, Op};
            faulty.inject(
                FaultRule::new(Fault::Transient)
                    .ops(&[Op::Put, Op::Get])
                    .path_contains("manifest"),
            );
        }
        hook.go();
        assert!(pass.await.unwrap().is_err(), "{ctx}");
        faulty.clear_faults();
        // An acknowledged write (local FLUSH), block 9 (copied by the lost publish).
        write_blocks(&v, &mut oracle, 4, &[9, 3]).await;
        v.flush().await.unwrap();
        v.kill().await;
        drop(v);
        let v = open(dir.path(), store.clone()).await;
        assert!(v.fenced().is_none(), "{ctx}: {:?}", v.fenced());
        let want = if landed { g + 2 } else { g + 1 };
        assert_eq!(v.manifest_generation(), want, "{ctx}");
        oracle.assert_pages(0, &read_all(&v).await, &format!("{ctx}: reopened"));
        gc_hard(&mem).await;
        v.sync_to_store().await.unwrap();
        gc_hard(&mem).await;
        v.evict_to(0).await.unwrap();
        oracle.assert_pages(0, &read_all(&v).await, &format!("{ctx}: evicted"));
        v.close().await.unwrap();
        check_fresh_host(&mem, &oracle, &format!("{ctx}: fresh host")).await;
    }
}

/// A crash right after the second publish of a pass landed (before `base G`), with FLUSHed
/// writes pending: the reopen recognises the pass's pack as its own intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_second_publish_keeps_local_writes() {
    let mem = mem();
    let dir = tempfile::tempdir().unwrap();
    let mut oracle = Oracle::new();
    {
        let v = open(dir.path(), mem.clone()).await;
        half_live(&v, &mut oracle).await;
        v.close().await.unwrap();
    }
    let hook = Arc::new(CrashAt::new(CrashPoint::AfterManifestPublish, 1));
    let mut cfg = config(dir.path());
    cfg.crash_hook = hook.clone();
    let v = Volume::open(cfg, mem.clone()).await.unwrap();
    let g = v.manifest_generation();
    write_blocks(&v, &mut oracle, 5, &[8, 2]).await;
    v.flush().await.unwrap();
    assert!(v.compact(HALF).await.is_err());
    assert!(hook.fired());
    v.kill().await;
    drop(v);
    let v = open(dir.path(), mem.clone()).await;
    assert!(v.fenced().is_none(), "{:?}", v.fenced());
    assert_eq!(v.manifest_generation(), g + 2);
    oracle.assert_pages(0, &read_all(&v).await, "reopened");
    v.sync_to_store().await.unwrap();
    gc_hard(&mem).await;
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "evicted, after GC");
    v.close().await.unwrap();
    check_fresh_host(&mem, &oracle, "fresh host").await;
}

/// An owner's volume closed with a pass's publish unconfirmed (landed): the clean-close
/// marker must not spare the claim, the reopen is not fenced, and data is intact; a second
/// host then takes the volume over after a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_with_an_unconfirmed_pass_publish_then_reopening_as_owner() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open_as(dir.path(), &store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    half_live(&v, &mut oracle).await;
    let g = v.manifest_generation();
    lose_next_manifest_reply(&faulty);
    assert!(v.compact(HALF).await.is_err());
    faulty.clear_faults();
    write_blocks(&v, &mut oracle, 6, &[1]).await;
    v.close().await.unwrap();
    drop(v);
    let v = open_as(dir.path(), &store, A, false).await.unwrap();
    assert!(v.fenced().is_none(), "{:?}", v.fenced());
    assert_eq!(
        v.manifest_generation(),
        g + 2,
        "the pass's publish, then the claim"
    );
    oracle.assert_pages(0, &read_all(&v).await, "reopened");
    v.sync_to_store().await.unwrap();
    gc_hard(&mem).await;
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "evicted, after GC");
    v.release().await.unwrap();
    v.close().await.unwrap();
    let d2 = tempfile::tempdir().unwrap();
    let w = open_as(d2.path(), &store, B, false).await.unwrap();
    oracle.assert_pages(0, &read_all(&w).await, "second host");
    w.close().await.unwrap();
}

/// GC, a full eviction and cold reads between the two publishes of a pass: the blocks come
/// from the first copy pack and the old packs still named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_and_cold_reads_between_two_publishes_of_a_pass() {
    let mem = mem();
    let dir = tempfile::tempdir().unwrap();
    let hook = PauseAt::new(CrashPoint::BeforePackUpload, 1);
    let mut cfg = config(dir.path());
    cfg.crash_hook = hook.clone();
    let v = Volume::open(cfg, mem.clone()).await.unwrap();
    let mut oracle = Oracle::new();
    half_live(&v, &mut oracle).await;
    hook.arm();
    let mut pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(HALF).await })
    };
    hook.parked(&mut pass).await;
    gc_hard(&mem).await;
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "between the publishes");
    v.evict_to(0).await.unwrap();
    hook.go();
    let r = pass.await.unwrap().unwrap();
    assert_eq!(r.publishes, 2, "{r:?}");
    gc_hard(&mem).await;
    oracle.assert_pages(0, &read_all(&v).await, "after the pass and GC");
    v.close().await.unwrap();
    check_fresh_host(&mem, &oracle, "fresh host").await;
}
