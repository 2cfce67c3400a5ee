//! GC running while a compaction pass holds copies it has not published yet, after a flush
//! published a newer manifest. Copies stored before the newest manifest and unreferenced are
//! what GC (store-time rule) deletes, so the pass must never publish a manifest naming a pack
//! GC chose. (Before the pass uploaded its copies under the flusher's lock, it uploaded them
//! first and published later: these tests paused it in between, at what is now the moment
//! its copies are built and not yet uploaded.)

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use glidefs_objstore::{GcOptions, StoreConfig, VolumeStore};
use glidefs_volume::cache::CrashPoint;
use glidefs_volume::{CompactOptions, Volume};
use object_store::ObjectStoreExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_between_a_flush_and_a_compaction_publish_leaves_no_manifest_naming_a_deleted_pack() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    // Parks the pass with its copies built, before it takes the flusher's lock.
    let hook = PauseAt::new(CrashPoint::BeforePackUpload, 0);
    let mut cfg = config(dir.path());
    cfg.crash_hook = hook.clone();
    let v = Volume::open(cfg, store.clone()).await.unwrap();
    let mut oracle = Oracle::new();
    // 16 blocks in 4 packs, then 3 of 4 blocks of each overwritten: every old pack is a
    // quarter live (blocks 0, 4, 8, 12).
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&v, &mut oracle, 1, &all).await;
    v.sync_to_store().await.unwrap();
    let dead: Vec<usize> = all.iter().copied().filter(|b| b % 4 != 0).collect();
    write_blocks(&v, &mut oracle, 2, &dead).await;
    v.sync_to_store().await.unwrap();

    hook.arm();
    let mut pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(CompactOptions::default()).await })
    };
    hook.parked(&mut pass).await;
    // A flush publishes a newer manifest (an unrelated block), then GC runs.
    tokio::time::sleep(Duration::from_millis(5)).await;
    write_blocks(&v, &mut oracle, 3, &[1]).await;
    v.sync_to_store().await.unwrap();
    let gc = gc_hard(&store).await;
    hook.go();
    let r = pass.await.unwrap();
    // Whatever the pass did (publish, skip, error), every block must read back from the store.
    v.evict_to(0).await.unwrap();
    let mut img = vec![0; SIZE as usize];
    let read = v.read(0, &mut img).await;
    assert!(
        read.is_ok(),
        "after the pass ({r:?}; GC deleted {:?}): a block of the latest manifest cannot be \
         read: {read:?}",
        gc.packs_deleted
    );
    oracle.assert_pages(0, &img, "evicted, after the pass");
    v.close().await.unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let v2 = open(fresh.path(), store.clone()).await;
    let mut img = vec![0; SIZE as usize];
    let read = v2.read(0, &mut img).await;
    assert!(read.is_ok(), "fresh host: {read:?}");
    oracle.assert_pages(0, &img, "fresh host");
}

/// A GC pass that listed the store while the pass held its copies, and deletes what it
/// chose only after the pass published (a slow GC: its deletes come from a listing taken
/// earlier). When the copies were uploaded before the lock, such a listing saw them
/// unreferenced and, once re-uploaded under their own ids, the late deletes removed what the
/// published manifest named (the working-set soak saw 404s on cold reads). Uploaded under the
/// lock, they do not exist at the listing, and the late deletes hit only objects the published
/// manifest does not name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gc_deleting_from_a_listing_taken_before_the_publish_deletes_nothing_it_names() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    // Parks the pass with its copies built, before it takes the flusher's lock.
    let hook = PauseAt::new(CrashPoint::BeforePackUpload, 0);
    let mut cfg = config(dir.path());
    cfg.crash_hook = hook.clone();
    let v = Volume::open(cfg, store.clone()).await.unwrap();
    let mut oracle = Oracle::new();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&v, &mut oracle, 1, &all).await;
    v.sync_to_store().await.unwrap();
    let dead: Vec<usize> = all.iter().copied().filter(|b| b % 4 != 0).collect();
    write_blocks(&v, &mut oracle, 2, &dead).await;
    v.sync_to_store().await.unwrap();

    hook.arm();
    let mut pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(CompactOptions::default()).await })
    };
    hook.parked(&mut pass).await;
    write_blocks(&v, &mut oracle, 3, &[1]).await;
    v.sync_to_store().await.unwrap();
    // The slow GC lists now (a dry run: what it would delete)...
    let listing = VolumeStore::new(store.clone(), "vol-test", StoreConfig::default())
        .unwrap()
        .gc(GcOptions {
            grace: Duration::ZERO,
            dry_run: true,
            keep_manifests: 1,
            now: Some(SystemTime::now() + Duration::from_secs(3600)),
        })
        .await
        .unwrap();
    // (Copies' ids carry a sequence number from 0x8000_0000: "-8...".)
    assert!(
        !listing
            .packs_deleted
            .iter()
            .any(|p| p.as_str().contains("-8")),
        "no copy is stored while the pass holds them: {listing:?}"
    );
    hook.go();
    let r = pass.await.unwrap().unwrap();
    assert!(r.generation.is_some(), "{r:?}");
    // ...and deletes only now.
    for key in &listing.deleted_keys {
        let path = object_store::path::Path::from(key.as_str());
        let _ = store.delete(&path).await;
    }
    v.evict_to(0).await.unwrap();
    let mut img = vec![0; SIZE as usize];
    let read = v.read(0, &mut img).await;
    assert!(read.is_ok(), "after the late deletes ({r:?}): {read:?}");
    oracle.assert_pages(0, &img, "evicted, after the late deletes");
    v.close().await.unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let v2 = open(fresh.path(), store.clone()).await;
    let mut img = vec![0; SIZE as usize];
    assert!(v2.read(0, &mut img).await.is_ok(), "fresh host");
    oracle.assert_pages(0, &img, "fresh host");
}
