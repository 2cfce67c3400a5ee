//! A release whose manifest PUT lands with its reply lost, and whose retries then fail: the
//! release fails, yet generation G already holds this writer's release record. The volume
//! must not fence itself on its own generation G (a write then a flush used to publish a data
//! manifest at G), a retry of the release must confirm it, a reopen must recover, and every
//! write acknowledged before the release must read back from the store.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use glidefs_testkit::FaultyStore;
use glidefs_volume::{Volume, VolumeConfig, VolumeError};

const A: &str = "host-a/0a0a0a0a-0000-4000-8000-00000000000a";
const C: &str = "host-c/0c0c0c0c-0000-4000-8000-00000000000c";

fn owned(dir: &Path, owner: &str) -> VolumeConfig {
    let mut c = config(dir);
    c.owner = Some(owner.to_string());
    c
}

async fn write_pages(v: &Volume, oracle: &mut Oracle, seed: u64, pages: std::ops::Range<usize>) {
    for p in pages {
        let d = page_data(seed, p);
        v.write((p * PAGE) as u64, &d).await.unwrap();
        oracle.write(p, d);
    }
}

/// Opens as A, writes and syncs everything, then releases with the manifest PUT landing and
/// its reply lost, every retry failing: the release fails.
async fn failed_release(
    dir: &Path,
    faulty: &Arc<FaultyStore>,
    oracle: &mut Oracle,
) -> (Arc<Volume>, u64) {
    let v = Volume::open(owned(dir, A), faulty.clone()).await.unwrap();
    write_pages(&v, oracle, 1, 0..PAGES).await;
    v.sync_to_store().await.unwrap();
    let before = v.manifest_generation();
    lose_next_manifest_reply(faulty);
    let err = v.release().await.unwrap_err();
    faulty.clear_faults();
    assert!(
        !v.is_released(),
        "release failed ({err}) but reports released"
    );
    assert_eq!(v.manifest_generation(), before, "release not adopted");
    (v, before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_was_lost_never_fences_the_volume_and_can_be_retried() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let mut oracle = Oracle::new();
    let (v, before) = failed_release(dir.path(), &faulty, &mut oracle).await;

    // A write after the failed release: accepted, it must be flushed without the volume
    // fencing itself; or refused (the release's outcome is unknown) until the release is
    // retried.
    let d = page_data(2, 0);
    match v.write(0, &d).await {
        Ok(()) => {
            oracle.write(0, d);
            let r = v.sync_to_store().await;
            assert!(
                v.fenced().is_none(),
                "the volume fenced itself on its own release record: {:?} (sync: {r:?})",
                v.fenced()
            );
            r.expect("flush after a failed release");
        }
        Err(e) => assert!(
            matches!(e, VolumeError::Released { .. }),
            "write after a failed release: {e}"
        ),
    }
    assert_eq!(v.release().await.expect("release retried"), before + 1);
    assert!(v.is_released());
    assert!(v.fenced().is_none());
    v.close().await.unwrap();
    // Another owner attaches without a takeover and reads every acknowledged write.
    let other = tempfile::tempdir().unwrap();
    let c = Volume::open(owned(other.path(), C), mem.clone())
        .await
        .expect("another owner attaches after the release");
    oracle.assert_pages(0, &read_all(&c).await, "from the store, as another owner");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_after_a_release_whose_reply_was_lost_writes_and_flushes_again() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let dir = tempfile::tempdir().unwrap();
    let mut oracle = Oracle::new();
    let (v, before) = failed_release(dir.path(), &faulty, &mut oracle).await;
    v.close().await.unwrap();
    drop(v);
    let v = Volume::open(owned(dir.path(), A), faulty.clone())
        .await
        .expect("reopen after a failed release");
    assert!(v.fenced().is_none(), "reopened fenced: {:?}", v.fenced());
    assert_eq!(
        v.manifest_generation(),
        before + 2,
        "release landed, then a claim"
    );
    write_pages(&v, &mut oracle, 3, 0..PAGES / 2).await;
    v.sync_to_store().await.expect("flush after reopening");
    v.evict_to(0).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "cold, after reopening");
}
