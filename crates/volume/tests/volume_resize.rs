//! Online resize of a volume (`Volume::resize`, grow only): given a volume with data in the
//! cache and the store, when it grows (crashing at each step, or losing a publish reply
//! around it), then data past the old end is written, flushed and read back hot, after a
//! crash, and cold from the store on a fresh host; the store's manifest records the new size
//! at the next publish; shrinking and sizes off the block grid are refused.

mod common;

use std::sync::Arc;

use common::*;
use common::{put_block as put, read_range as read};
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use glidefs_volume::cache::{CrashAt, CrashPoint};
use glidefs_volume::{Volume, VolumeError, VolumeErrorKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grown_volume_keeps_data_past_the_old_end_hot_after_a_crash_and_cold() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open_at(dir.path(), &store, SIZE).await.unwrap();
    let low = put(&v, LOW, 1).await;
    v.sync_to_store().await.unwrap();
    assert!(v.write(SIZE, &[1; 4096]).await.is_err(), "past the end");
    assert_eq!(v.resize(NEW).await.unwrap(), SIZE);
    assert_eq!((v.size(), v.geometry().volume_size()), (NEW, NEW));
    assert_eq!(read(&v, SIZE, 4096).await, vec![0; 4096]);
    let across = put(&v, ACROSS, 2).await;
    let high = put(&v, HIGH, 3).await;
    let w = vec![(LOW, low), (ACROSS, across), (HIGH, high)];
    v.flush().await.unwrap();
    check_grown(&v, &w, "hot").await;
    // A crash right after: the local cache reopens at the new size.
    v.kill().await;
    drop(v);
    assert!(
        matches!(
            open_at(dir.path(), &store, SIZE).await,
            Err(VolumeError::Cache(_))
        ),
        "the cache records the new size: reopening smaller is refused"
    );
    let v = open_at(dir.path(), &store, NEW).await.unwrap();
    check_grown(&v, &w, "after the crash").await;
    // The next publish carries the size.
    v.sync_to_store().await.unwrap();
    let m = vstore(&store).load_manifest().await.unwrap().unwrap();
    assert_eq!(m.volume_size, NEW);
    v.close().await.unwrap();
    // A fresh host reads everything from the store; the old size is refused there.
    let fresh = tempfile::tempdir().unwrap();
    assert!(matches!(
        open_at(fresh.path(), &store, SIZE).await,
        Err(VolumeError::GeometryMismatch { .. })
    ));
    cold_check_grown(&store, &w, "cold").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_and_off_grid_sizes_are_refused_and_change_nothing() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open_at(dir.path(), &store, SIZE).await.unwrap();
    let low = put(&v, LOW, 1).await;
    let smaller = SIZE - u64::from(BS);
    let e = v.resize(smaller).await.unwrap_err();
    assert_eq!(e.kind(), VolumeErrorKind::InvalidInput, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&SIZE.to_string()) && msg.contains(&smaller.to_string()),
        "{msg}"
    );
    let e = v.resize(SIZE + 4096).await.unwrap_err();
    assert_eq!(e.kind(), VolumeErrorKind::InvalidInput, "{e}");
    assert_eq!(v.resize(SIZE).await.unwrap(), SIZE, "same size: no-op");
    assert_eq!(v.size(), SIZE);
    assert_eq!(read(&v, LOW, low.len()).await, low);
    v.sync_to_store().await.unwrap();
    assert_eq!(
        vstore(&store)
            .load_manifest()
            .await
            .unwrap()
            .unwrap()
            .volume_size,
        SIZE
    );
}

/// A crash inside the resize (before / after the cache's new checkpoint is durable): the
/// directory reopens at the old size only before; at the new size always (what the daemon
/// does once its state file has the new size), with the flushed data intact and the new
/// blocks usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_the_resize_reopens_at_one_of_the_two_sizes_without_loss() {
    for (point, durable) in [
        (CrashPoint::BeforeCheckpoint, false),
        (CrashPoint::AfterCheckpoint, true),
    ] {
        let store = mem();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config_at(dir.path(), SIZE);
        let hook = Arc::new(CrashAt::new(point, 0));
        cfg.crash_hook = hook.clone();
        let v = Volume::open(cfg, store.clone()).await.unwrap();
        // Only local durability before the resize: a sync_to_store would checkpoint first.
        let low = put(&v, LOW, 1).await;
        v.flush().await.unwrap();
        assert!(v.resize(NEW).await.is_err(), "{point:?}");
        assert!(hook.fired(), "{point:?}");
        assert_eq!(v.size(), SIZE, "{point:?}: the size moved in memory");
        v.kill().await;
        drop(v);
        match open_at(dir.path(), &store, SIZE).await {
            Ok(v) => {
                assert!(!durable, "{point:?}: reopened at the old size");
                assert_eq!(read(&v, LOW, low.len()).await, low, "{point:?}");
                v.close().await.unwrap();
            }
            Err(e) => assert!(durable, "{point:?}: {e}"),
        }
        let v = open_at(dir.path(), &store, NEW).await.unwrap();
        assert_eq!(v.size(), NEW);
        let across = put(&v, ACROSS, 2).await;
        let high = put(&v, HIGH, 3).await;
        let w = vec![(LOW, low), (ACROSS, across), (HIGH, high)];
        v.sync_to_store().await.unwrap();
        check_grown(&v, &w, &format!("{point:?}: hot")).await;
        v.close().await.unwrap();
        cold_check_grown(&store, &w, &format!("{point:?}: cold")).await;
    }
}

/// A publish whose reply was lost before the resize is re-sent unchanged (old size) by the
/// next flush; the publish after it carries the new size, and nothing written is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_left_unfinished_before_the_resize_does_not_undo_it() {
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
    let w = vec![(LOW, low), (ACROSS, across), (HIGH, high)];
    v.sync_to_store().await.unwrap();
    let m = vstore(&mem).load_manifest().await.unwrap().unwrap();
    assert_eq!(m.volume_size, NEW, "generation {}", m.generation);
    v.close().await.unwrap();
    cold_check_grown(&mem, &w, "cold").await;
}

/// Reads and writes on other tasks go on while the volume grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_runs_alongside_io() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open_at(dir.path(), &store, SIZE).await.unwrap();
    let io = {
        let v = v.clone();
        tokio::spawn(async move {
            let data = glidefs_testkit::noise(9, 4096);
            for i in 0..100u64 {
                let off = (i * 4096) % SIZE;
                v.write(off, &data).await.unwrap();
                assert_eq!(read(&v, off, 4096).await, data);
                if i % 25 == 0 {
                    v.sync_to_store().await.unwrap();
                }
            }
        })
    };
    v.resize(NEW).await.unwrap();
    io.await.unwrap();
    let high = put(&v, HIGH, 3).await;
    v.sync_to_store().await.unwrap();
    assert_eq!(read(&v, HIGH, high.len()).await, high);
}

/// A resize does not wait for a flush stuck in the store: with a manifest PUT held, the
/// volume grows and takes writes past the old end; once the store answers, the held publish
/// (old size) lands and the next one records the new size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_does_not_wait_for_a_flush_held_in_the_store() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open_at(dir.path(), &store, SIZE).await.unwrap();
    let low = put(&v, LOW, 1).await;
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("manifest/")
            .times(1),
    );
    let sync = {
        let v = v.clone();
        tokio::spawn(async move { v.sync_to_store().await })
    };
    faulty.wait_held(1).await;
    tokio::time::timeout(std::time::Duration::from_secs(10), v.resize(NEW))
        .await
        .expect("resize waited for the held publish")
        .unwrap();
    let across = put(&v, ACROSS, 2).await;
    let high = put(&v, HIGH, 3).await;
    v.flush().await.unwrap();
    faulty.release_held();
    sync.await.unwrap().unwrap();
    v.sync_to_store().await.unwrap();
    let m = vstore(&mem).load_manifest().await.unwrap().unwrap();
    assert_eq!(m.volume_size, NEW);
    v.close().await.unwrap();
    let w = vec![(LOW, low), (ACROSS, across), (HIGH, high)];
    cold_check_grown(&mem, &w, "cold").await;
}
