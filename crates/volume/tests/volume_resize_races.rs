//! `Volume::resize` racing the flush pipeline loses nothing, hot or cold: a grow while a
//! flush is paused between its rotation and its manifest; a lost publish reply, then a
//! resize and a crash before the re-send; a compaction publish held in the store while the
//! volume grows; a compaction's lost publish reply, then a resize and a crash. In each the
//! next flush publishes the blocks past the old end with the new size.

mod common;

use std::sync::Arc;

use common::put_block as put;
use common::*;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use glidefs_volume::cache::CrashPoint;
use glidefs_volume::{CompactOptions, Volume, VolumeError};

/// A flush parked after its rotation (packs uploaded, manifest not yet built) while the volume
/// grows and takes writes past the old end publishes a valid manifest (the size it reads is at
/// least the old one, and its blocks all lie below it); the next flush publishes the new blocks
/// with the new size; nothing is lost hot or cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resize_while_a_flush_is_parked_between_rotation_and_manifest() {
    for point in [CrashPoint::BeforePackUpload, CrashPoint::AfterPackUpload] {
        let store = mem();
        let dir = tempfile::tempdir().unwrap();
        let pause = PauseAt::new(point, 0);
        let mut cfg = config_at(dir.path(), SIZE);
        cfg.crash_hook = pause.clone();
        let v = Volume::open(cfg, store.clone()).await.unwrap();
        let low = put(&v, LOW, 1).await;
        let edge = put(&v, SIZE - BS as u64, 4).await;
        pause.arm();
        let mut sync = {
            let v = v.clone();
            tokio::spawn(async move { v.sync_to_store().await })
        };
        pause.parked(&mut sync).await;
        v.resize(NEW).await.unwrap();
        let across = put(&v, ACROSS, 2).await;
        let high = put(&v, HIGH, 3).await;
        v.flush().await.unwrap();
        pause.go();
        sync.await.unwrap().unwrap();
        let mut edge_now = edge.clone();
        edge_now[BS as usize / 2..].copy_from_slice(&across[..BS as usize / 2]);
        let w = vec![
            (LOW, low),
            (SIZE - BS as u64, edge_now),
            (ACROSS, across),
            (HIGH, high),
        ];
        check_grown(&v, &w, &format!("{point:?}: hot")).await;
        v.sync_to_store().await.unwrap();
        let m = vstore(&store).load_manifest().await.unwrap().unwrap();
        assert_eq!(m.volume_size, NEW, "{point:?}");
        v.kill().await;
        drop(v);
        cold_check_grown(&store, &w, &format!("{point:?}: cold")).await;
    }
}

/// A publish whose reply was lost (it landed, old size), then a resize, writes past the old end
/// made durable locally only, and a crash before the re-send: the reopen at the new size adopts the
/// landed generation, grows it, and the next flush publishes the new blocks with the new size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_then_resize_then_crash_before_the_resend() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open_at(dir.path(), &store, SIZE).await.unwrap();
    let low = put(&v, LOW, 1).await;
    lose_next_manifest_reply(&faulty);
    assert!(v.sync_to_store().await.is_err());
    faulty.clear_faults();
    v.resize(NEW).await.unwrap();
    let across = put(&v, ACROSS, 2).await;
    let high = put(&v, HIGH, 3).await;
    v.flush().await.unwrap();
    v.kill().await;
    drop(v);
    let landed = vstore(&mem).load_manifest().await.unwrap().unwrap();
    assert_eq!(
        landed.volume_size, SIZE,
        "the lost publish carried the old size"
    );
    assert!(
        matches!(
            open_at(dir.path(), &store, SIZE).await,
            Err(VolumeError::Cache(_))
        ),
        "the cache recorded the new size"
    );
    let v = open_at(dir.path(), &store, NEW).await.unwrap();
    let w = vec![(LOW, low), (ACROSS, across), (HIGH, high)];
    check_grown(&v, &w, "reopened").await;
    v.sync_to_store().await.unwrap();
    let m = vstore(&mem).load_manifest().await.unwrap().unwrap();
    assert_eq!(m.volume_size, NEW);
    v.close().await.unwrap();
    cold_check_grown(&mem, &w, "cold").await;
}

/// A compaction whose publish is held in the store while the volume grows and takes (and flushes
/// locally) writes past the old end: the compaction's manifest keeps the old blocks' data, the next
/// flush publishes the new blocks and the size, and a fresh host reads everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compaction_publish_held_while_the_volume_grows() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open_at(dir.path(), &store, SIZE).await.unwrap();
    let mut w: Vec<(u64, Vec<u8>)> = Vec::new();
    for b in 0..BLOCKS {
        w.push((b * BS as u64, put(&v, b * BS as u64, 10 + b).await));
    }
    v.sync_to_store().await.unwrap();
    for b in (0..BLOCKS).step_by(2) {
        let d = put(&v, b * BS as u64, 100 + b).await;
        w.retain(|(o, _)| *o != b * BS as u64);
        w.push((b * BS as u64, d));
    }
    v.sync_to_store().await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("manifest/")
            .times(1),
    );
    let compact = {
        let v = v.clone();
        tokio::spawn(async move {
            v.compact(CompactOptions {
                threshold: 0.9,
                max_bytes: 256 << 20,
            })
            .await
        })
    };
    faulty.wait_held(1).await;
    tokio::time::timeout(std::time::Duration::from_secs(10), v.resize(NEW))
        .await
        .expect("resize waited for the held compaction publish")
        .unwrap();
    // Overwrite a block the compaction is moving, and write past the old end.
    let moved = put(&v, BS as u64, 200).await;
    w.retain(|(o, _)| *o != BS as u64);
    w.push((BS as u64, moved));
    let across = put(&v, ACROSS, 201).await;
    let high = put(&v, HIGH, 202).await;
    v.flush().await.unwrap();
    faulty.release_held();
    let report = compact.await.unwrap().unwrap();
    assert!(report.blocks_moved > 0, "{report:?}");
    // The block straddled by `across`: its first half stays, its second half is new.
    let last = (BLOCKS - 1) * BS as u64;
    if let Some((_, d)) = w.iter_mut().find(|(o, _)| *o == last) {
        d[BS as usize / 2..].copy_from_slice(&across[..BS as usize / 2]);
    }
    w.push((SIZE, across[BS as usize / 2..].to_vec()));
    w.push((HIGH, high));
    check_grown(&v, &w, "hot").await;
    v.sync_to_store().await.unwrap();
    let m = vstore(&mem).load_manifest().await.unwrap().unwrap();
    assert_eq!(m.volume_size, NEW);
    v.close().await.unwrap();
    gc_hard(&mem).await;
    cold_check_grown(&mem, &w, "cold after GC").await;
}

/// A compaction publish whose reply is lost (it landed, old size), then a resize, writes past the
/// old end made durable locally only, and a crash: the reopen at the new size adopts the
/// compaction's generation (its own publish intent), keeps the local writes, and publishes them
/// with the new size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_lost_reply_then_resize_then_crash() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open_at(dir.path(), &store, SIZE).await.unwrap();
    let mut w: Vec<(u64, Vec<u8>)> = Vec::new();
    for b in 0..BLOCKS {
        w.push((b * BS as u64, put(&v, b * BS as u64, 10 + b).await));
    }
    v.sync_to_store().await.unwrap();
    for b in (0..BLOCKS).step_by(2) {
        let d = put(&v, b * BS as u64, 100 + b).await;
        w.retain(|(o, _)| *o != b * BS as u64);
        w.push((b * BS as u64, d));
    }
    v.sync_to_store().await.unwrap();
    let before = v.manifest_generation();
    lose_next_manifest_reply(&faulty);
    assert!(v
        .compact(CompactOptions {
            threshold: 0.9,
            max_bytes: 256 << 20,
        })
        .await
        .is_err());
    faulty.clear_faults();
    let landed = vstore(&mem).load_manifest().await.unwrap().unwrap();
    assert!(
        landed.generation > before,
        "the compaction's publish landed"
    );
    v.resize(NEW).await.unwrap();
    let moved = put(&v, BS as u64, 300).await;
    w.retain(|(o, _)| *o != BS as u64);
    w.push((BS as u64, moved));
    let high = put(&v, HIGH, 301).await;
    w.push((HIGH, high));
    v.flush().await.unwrap();
    v.kill().await;
    drop(v);
    let v = open_at(dir.path(), &store, NEW).await.unwrap();
    check_grown(&v, &w, "reopened").await;
    v.sync_to_store().await.unwrap();
    assert_eq!(
        vstore(&mem)
            .load_manifest()
            .await
            .unwrap()
            .unwrap()
            .volume_size,
        NEW
    );
    v.close().await.unwrap();
    gc_hard(&mem).await;
    cold_check_grown(&mem, &w, "cold after GC").await;
}
