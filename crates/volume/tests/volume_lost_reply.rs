//! A manifest publish whose PUT lands but whose reply is lost, and whose retries then fail
//! (a short outage): the flush fails, yet generation G already holds this writer's manifest.
//! The next flush must re-send that identical manifest (and succeed), not rebuild the rotation
//! with new pack ids and fence itself on its own generation; a restart in between must
//! recognise G as this writer's publish. Every acknowledged write reads back throughout.
//! Also (a reviewer's coverage): GC with the most aggressive options while the publish is
//! still unconfirmed loses nothing, and a crash and reopen with an owner id (the open
//! publishes a claim) recognises G as this owner's own publish.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use glidefs_objstore::{GcOptions, StoreConfig, VolumeStore};
use glidefs_testkit::{Fault, FaultRule, FaultyStore};
use glidefs_volume::{Volume, VolumeConfig};

const A: &str = "host-a/0a0a0a0a-0000-4000-8000-00000000000a";

async fn write_pages(v: &Volume, oracle: &mut Oracle, seed: u64, pages: std::ops::Range<usize>) {
    for p in pages {
        let d = page_data(seed, p);
        v.write((p * PAGE) as u64, &d).await.unwrap();
        oracle.write(p, d);
    }
}

/// The manifest PUT lands with its reply lost, then every retry fails: the flush errors.
async fn flush_with_lost_publish_reply(faulty: &FaultyStore, v: &Volume) {
    lose_next_manifest_reply(faulty);
    let err = v.sync_to_store().await.unwrap_err();
    assert!(
        err.to_string().contains("publish manifest"),
        "unexpected error: {err}"
    );
    faulty.clear_faults();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_flush_after_a_lost_publish_reply_publishes_and_is_not_fenced() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), faulty.clone()).await;
    let mut oracle = Oracle::new();
    write_pages(&v, &mut oracle, 1, 0..PAGES).await;
    v.sync_to_store().await.unwrap();
    write_pages(&v, &mut oracle, 2, 0..PAGES / 2).await;
    flush_with_lost_publish_reply(&faulty, &v).await;
    // The store is back; writes arrived meanwhile.
    write_pages(&v, &mut oracle, 3, PAGES / 4..PAGES).await;
    let r = v
        .sync_to_store()
        .await
        .expect("flush after a lost publish reply");
    assert!(v.fenced().is_none(), "volume fenced itself");
    assert_eq!(r.generation, 3, "generation 2 re-sent, then generation 3");
    oracle.assert_pages(0, &read_all(&v).await, "after the flushes");
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "cold, from the store");
    v.close().await.unwrap();
    // A fresh cache sees the same data in the store.
    let other = tempfile::tempdir().unwrap();
    let v2 = open(other.path(), mem.clone()).await;
    oracle.assert_pages(0, &read_all(&v2).await, "from the store alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_a_lost_publish_reply_and_a_failed_retry_is_not_diverged() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), faulty.clone()).await;
    let mut oracle = Oracle::new();
    write_pages(&v, &mut oracle, 1, 0..PAGES).await;
    v.sync_to_store().await.unwrap();
    write_pages(&v, &mut oracle, 2, 0..PAGES / 2).await;
    flush_with_lost_publish_reply(&faulty, &v).await;
    // A second attempt fails too (the manifest side of the store is still out), then the
    // process restarts.
    faulty.inject(FaultRule::new(Fault::Transient).path_contains("manifest"));
    assert!(v.sync_to_store().await.is_err());
    faulty.clear_faults();
    v.close().await.unwrap();
    drop(v);
    let v = open(dir.path(), faulty.clone()).await;
    assert!(
        v.fenced().is_none(),
        "reopened volume fenced: {:?}",
        v.fenced()
    );
    oracle.assert_pages(0, &read_all(&v).await, "after reopening");
    write_pages(&v, &mut oracle, 3, 0..2).await;
    v.sync_to_store().await.expect("flush after reopening");
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "cold, after reopening");
}

/// The contract across a crash: the PUT of generation 2 landed, its reply was lost, and the
/// process died before learning it. The reopened cache recognises generation 2 as its own
/// publish (the base file names its first pack), keeps every acknowledged write, and its
/// pending rotation is published again at generation 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_a_landed_publish_whose_reply_was_lost_keeps_every_write() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), faulty.clone()).await;
    let mut oracle = Oracle::new();
    write_pages(&v, &mut oracle, 1, 0..PAGES).await;
    v.sync_to_store().await.unwrap();
    write_pages(&v, &mut oracle, 2, 0..PAGES / 2).await;
    v.flush().await.unwrap();
    flush_with_lost_publish_reply(&faulty, &v).await;
    v.kill().await;
    drop(v);
    let v = open(dir.path(), faulty.clone()).await;
    assert!(
        v.fenced().is_none(),
        "reopened volume fenced: {:?}",
        v.fenced()
    );
    assert_eq!(v.manifest_generation(), 2, "generation 2 adopted as ours");
    oracle.assert_pages(0, &read_all(&v).await, "after the crash");
    let r = v.sync_to_store().await.expect("flush after the crash");
    assert_eq!(r.generation, 3);
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "cold, after the crash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_while_a_landed_publish_is_unconfirmed_loses_nothing() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), faulty.clone()).await;
    let mut oracle = Oracle::new();
    write_pages(&v, &mut oracle, 1, 0..PAGES).await;
    v.sync_to_store().await.unwrap();
    // Generation 2 overwrites half the pages: the packs of generation 1 holding them are
    // referenced by generation 1 only.
    write_pages(&v, &mut oracle, 2, 0..PAGES / 2).await;
    flush_with_lost_publish_reply(&faulty, &v).await;
    assert_eq!(v.manifest_generation(), 1);
    let gc = VolumeStore::new(mem.clone(), "vol-test", StoreConfig::default()).unwrap();
    let report = gc
        .gc(GcOptions {
            grace: Duration::ZERO,
            dry_run: false,
            keep_manifests: 1,
            now: Some(SystemTime::now() + Duration::from_secs(86_400)),
        })
        .await
        .unwrap();
    assert!(
        report.manifests_deleted.contains(&1) || !report.packs_deleted.is_empty(),
        "the GC pass did nothing, the test shows nothing: {report:?}"
    );
    // Reads meanwhile (the writer's map is still generation 1).
    oracle.assert_pages(0, &read_all(&v).await, "after GC, publish unconfirmed");
    write_pages(&v, &mut oracle, 3, PAGES / 4..PAGES).await;
    let r = v.sync_to_store().await.expect("flush after GC");
    assert_eq!(r.generation, 3);
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "cold, after GC");
    let other = tempfile::tempdir().unwrap();
    let v2 = open(other.path(), mem.clone()).await;
    oracle.assert_pages(0, &read_all(&v2).await, "from the store alone");
}

fn owned(dir: &std::path::Path) -> VolumeConfig {
    let mut c = config(dir);
    c.owner = Some(A.to_string());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_crashing_after_a_landed_unconfirmed_publish_reopens_and_keeps_every_write() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let v = Volume::open(owned(dir.path()), faulty.clone())
        .await
        .unwrap();
    let mut oracle = Oracle::new();
    write_pages(&v, &mut oracle, 1, 0..PAGES).await;
    v.sync_to_store().await.unwrap();
    let g = v.manifest_generation();
    write_pages(&v, &mut oracle, 2, 0..PAGES / 2).await;
    v.flush().await.unwrap();
    flush_with_lost_publish_reply(&faulty, &v).await;
    v.kill().await;
    drop(v);
    let v = Volume::open(owned(dir.path()), faulty.clone())
        .await
        .expect("reopen");
    assert!(v.fenced().is_none(), "reopened fenced: {:?}", v.fenced());
    assert_eq!(v.manifest_generation(), g + 2, "G adopted, then the claim");
    oracle.assert_pages(0, &read_all(&v).await, "after the crash");
    v.sync_to_store().await.expect("flush after the crash");
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "cold, after the crash");
    v.release().await.expect("release");
}
