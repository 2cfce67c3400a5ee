//! GC running while a flush has uploaded its packs and not yet published the manifest naming
//! them (a long catch-up flush, an outage between upload and publish): the flush's packs must
//! survive GC whatever its grace and clock, and a pack gone anyway is uploaded again before
//! the publish, so every acknowledged write reads back from the store.

mod common;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use futures::TryStreamExt;
use glidefs_objstore::{GcOptions, StoreConfig, VolumeStore};
use glidefs_volume::cache::{CrashHook, CrashPoint};
use glidefs_volume::Volume;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

/// Runs `action` once, the first time a flush has uploaded its packs (never crashes).
struct AfterUpload {
    done: AtomicBool,
    action: Box<dyn Fn() + Send + Sync>,
}

impl fmt::Debug for AfterUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AfterUpload").finish_non_exhaustive()
    }
}

impl CrashHook for AfterUpload {
    fn should_crash(&self, point: CrashPoint) -> bool {
        if point == CrashPoint::AfterPackUpload && !self.done.swap(true, Ordering::SeqCst) {
            (self.action)();
        }
        false
    }
}

fn gc_store(store: &Arc<dyn ObjectStore>) -> VolumeStore {
    VolumeStore::new(store.clone(), "vol-test", StoreConfig::default()).unwrap()
}

/// Writes every page, flushes through `hook`, drops the local copies, reads back.
async fn flush_with(hook: AfterUpload, store: Arc<dyn ObjectStore>, recheck: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.crash_hook = Arc::new(hook);
    cfg.store.pack_recheck_after = recheck;
    let v = Volume::open(cfg, store.clone()).await.unwrap();
    let mut oracle = Oracle::new();
    for p in 0..PAGES {
        let d = page_data(7, p);
        v.write((p * PAGE) as u64, &d).await.unwrap();
        oracle.write(p, d);
    }
    v.sync_to_store().await.expect("flush");
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "cold, after the flush");
    // And from the store alone.
    let other = tempfile::tempdir().unwrap();
    let v2 = open(other.path(), store).await;
    oracle.assert_pages(0, &read_all(&v2).await, "from the store alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_with_zero_grace_and_a_clock_a_day_ahead_keeps_packs_not_yet_published() {
    let store = mem();
    // A first flush, so that the volume has a published manifest older than the new packs.
    {
        let dir = tempfile::tempdir().unwrap();
        let v = open(dir.path(), store.clone()).await;
        v.write(0, &page_data(1, 0)).await.unwrap();
        v.sync_to_store().await.unwrap();
        v.close().await.unwrap();
    }
    let gc_on = store.clone();
    let hook = AfterUpload {
        done: AtomicBool::new(false),
        action: Box::new(move || {
            let report = futures::executor::block_on(gc_store(&gc_on).gc(GcOptions {
                grace: Duration::ZERO,
                dry_run: false,
                keep_manifests: 1,
                now: Some(SystemTime::now() + Duration::from_secs(86_400)),
            }))
            .unwrap();
            assert!(
                report.packs_deleted.is_empty(),
                "GC deleted packs of a flush not yet published: {:?}",
                report.packs_deleted
            );
        }),
    };
    // The packs are trusted by the publish (a long recheck period): only GC's own rule
    // protects them here.
    flush_with(hook, store, Duration::from_secs(3600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_deleted_between_upload_and_publish_is_uploaded_again() {
    let store = mem();
    let gone = store.clone();
    let hook = AfterUpload {
        done: AtomicBool::new(false),
        // Whatever deletes them (an older GC, an operator), every pack of the flush is gone.
        action: Box::new(move || {
            futures::executor::block_on(async {
                let packs: Vec<_> = gone
                    .list(Some(&Path::from("volumes/vol-test/packs")))
                    .try_collect()
                    .await
                    .unwrap();
                assert!(!packs.is_empty());
                for meta in packs {
                    gone.delete(&meta.location).await.unwrap();
                }
            });
        }),
    };
    // Every upload older than zero is checked again before the publish.
    flush_with(hook, store, Duration::ZERO).await;
}
