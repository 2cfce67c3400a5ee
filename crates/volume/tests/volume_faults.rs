//! Flush to a misbehaving store (glidefs-testkit's FaultyStore): transient faults are retried,
//! permanent ones surface as errors without corrupting local state (the data stays dirty and
//! is flushed later), and no published manifest ever points at a missing pack.

mod common;

use std::sync::Arc;

use common::*;
use glidefs_objstore::{StoreConfig, VolumeStore};
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use glidefs_volume::cache::BlockState;
use glidefs_volume::{Volume, VolumeErrorKind};

/// Every pack the latest manifest references exists.
async fn assert_manifest_complete(store: &Arc<dyn object_store::ObjectStore>) -> u64 {
    let vs = VolumeStore::new(store.clone(), "vol-test", StoreConfig::default()).unwrap();
    let Some(m) = vs.load_manifest().await.unwrap() else {
        return 0;
    };
    for id in m.referenced_packs() {
        assert!(
            vs.pack_exists(id).await.unwrap(),
            "manifest {} names missing pack {id}",
            m.generation
        );
    }
    m.generation
}

async fn write_pages(
    v: &Volume,
    oracle: &mut Oracle,
    seed: u64,
    pages: impl Iterator<Item = usize>,
) {
    for p in pages {
        let d = page_data(seed, p);
        v.write((p * PAGE) as u64, &d).await.unwrap();
        oracle.write(p, d);
    }
}

async fn check(v: &Volume, oracle: &Oracle, ctx: &str) {
    oracle.assert_pages(0, &read_all(v).await, ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_faults_and_lost_acks_are_retried() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), faulty.clone()).await;
    let mut oracle = Oracle::new();
    write_pages(&v, &mut oracle, 1, 0..PAGES).await;
    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::Put]).times(3));
    faulty.inject(
        FaultRule::new(Fault::LostAck)
            .ops(&[Op::Put])
            .path_contains("packs/")
            .times(2),
    );
    let r = v.sync_to_store().await.unwrap();
    assert_eq!(r.generation, 1);
    assert_eq!(assert_manifest_complete(&mem).await, 1);
    // cold reads through transient GET faults
    v.evict_to(0).await.unwrap();
    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::Get]).times(2));
    check(&v, &oracle, "after retried flush").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_pack_upload_failure_keeps_data_dirty_until_a_later_flush() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), faulty.clone()).await;
    let mut oracle = Oracle::new();
    write_pages(&v, &mut oracle, 1, 0..8).await;
    v.sync_to_store().await.unwrap();
    write_pages(&v, &mut oracle, 2, 4..20).await;

    // pack uploads fail for good: no manifest may name a pack of this flush
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("packs/"),
    );
    let err = v.sync_to_store().await.unwrap_err();
    assert_ne!(err.kind(), VolumeErrorKind::Unavailable, "{err}");
    assert_eq!(v.manifest_generation(), 1);
    assert_eq!(assert_manifest_complete(&mem).await, 1);
    assert_eq!(
        v.cache().block_info(1).state,
        BlockState::Syncing,
        "still pending, not clean"
    );
    check(&v, &oracle, "after failed flush").await;
    // writes keep working meanwhile (promotion out of the pending flush)
    write_pages(&v, &mut oracle, 3, 6..7).await;
    v.flush().await.unwrap();
    // survives a crash while the flush is pending
    v.kill().await;
    drop(v);
    let v = open(dir.path(), faulty.clone()).await;
    check(&v, &oracle, "after restart with a pending flush").await;

    faulty.clear_faults();
    v.sync_to_store().await.unwrap();
    assert_eq!(
        assert_manifest_complete(&mem).await,
        v.manifest_generation()
    );
    assert_eq!(v.stats().await.cache.dirty, 0);
    let fresh = tempfile::tempdir().unwrap();
    let v2 = open(fresh.path(), mem.clone()).await;
    check(&v2, &oracle, "fresh host").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_manifest_failure_publishes_nothing_and_retries_later() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), faulty.clone()).await;
    let mut oracle = Oracle::new();
    write_pages(&v, &mut oracle, 5, 0..PAGES).await;
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("manifest"),
    );
    assert!(v.sync_to_store().await.is_err());
    assert_eq!(assert_manifest_complete(&mem).await, 0);
    assert_eq!(v.manifest_generation(), 0);
    check(&v, &oracle, "after failed publish").await;
    faulty.clear_faults();
    let r = v.sync_to_store().await.unwrap();
    assert_eq!(r.generation, 1);
    assert_eq!(r.blocks, BLOCKS);
    let fresh = tempfile::tempdir().unwrap();
    let v2 = Volume::open(config(fresh.path()), mem.clone())
        .await
        .unwrap();
    check(&v2, &oracle, "fresh host").await;
}
