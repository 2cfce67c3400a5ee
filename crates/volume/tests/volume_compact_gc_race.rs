//! GC running while a compaction pass holds uploaded copies it has not published yet, after a
//! flush published a newer manifest: the copies are then "stored before the newest manifest"
//! and unreferenced, so GC (store-time rule) may delete them; the pass must not then publish
//! a manifest naming them.

mod common;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use glidefs_objstore::{GcOptions, StoreConfig, VolumeStore};
use glidefs_volume::cache::{CrashHook, CrashPoint};
use glidefs_volume::{CompactOptions, Volume};
use object_store::ObjectStoreExt;

/// Once armed, parks the first task reaching `AfterPackUpload` until told to go on.
struct Pause {
    armed: AtomicBool,
    reached: parking_lot::Mutex<Sender<()>>,
    go: parking_lot::Mutex<Receiver<()>>,
}

impl fmt::Debug for Pause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pause").finish_non_exhaustive()
    }
}

impl CrashHook for Pause {
    fn should_crash(&self, point: CrashPoint) -> bool {
        if point == CrashPoint::AfterPackUpload && self.armed.swap(false, Ordering::SeqCst) {
            self.reached.lock().send(()).unwrap();
            self.go.lock().recv().unwrap();
        }
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_between_a_flush_and_a_compaction_publish_leaves_no_manifest_naming_a_deleted_pack() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let (reached_tx, reached_rx) = channel();
    let (go_tx, go_rx) = channel();
    let hook = Arc::new(Pause {
        armed: AtomicBool::new(false),
        reached: parking_lot::Mutex::new(reached_tx),
        go: parking_lot::Mutex::new(go_rx),
    });
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

    // The pass uploads its copies, then stops before taking the flusher's lock.
    hook.armed.store(true, Ordering::SeqCst);
    let pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(CompactOptions::default()).await })
    };
    loop {
        if reached_rx.try_recv().is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A flush publishes a newer manifest (an unrelated block), then GC runs.
    tokio::time::sleep(Duration::from_millis(5)).await;
    write_blocks(&v, &mut oracle, 3, &[1]).await;
    v.sync_to_store().await.unwrap();
    let gc = gc_hard(&store).await;
    go_tx.send(()).unwrap();
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

/// A GC pass that listed the store while the pass's copies were unreferenced, and deletes
/// what it chose only after the pass published (a slow GC: its deletes come from a listing
/// taken earlier). Re-uploading the copies under their own ids did not protect them (the
/// working-set soak saw 404s on cold reads); under fresh ids the late deletes hit only
/// objects the published manifest does not name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gc_deleting_from_a_listing_taken_before_the_publish_deletes_nothing_it_names() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let (reached_tx, reached_rx) = channel();
    let (go_tx, go_rx) = channel();
    let hook = Arc::new(Pause {
        armed: AtomicBool::new(false),
        reached: parking_lot::Mutex::new(reached_tx),
        go: parking_lot::Mutex::new(go_rx),
    });
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

    hook.armed.store(true, Ordering::SeqCst);
    let pass = {
        let v = v.clone();
        tokio::spawn(async move { v.compact(CompactOptions::default()).await })
    };
    while reached_rx.try_recv().is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    assert!(
        listing
            .packs_deleted
            .iter()
            .any(|p| p.as_str().contains("-8")),
        "the pass's copies are unreferenced at the listing: {listing:?}"
    );
    go_tx.send(()).unwrap();
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
