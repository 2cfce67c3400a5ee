//! Several hosts over one store: what a handle that holds no claim may do to the owner's
//! volume (issue 45, "Many hosts, one store"). Each test failed on aa5c605 and says how.

mod common;

use common::*;

use glidefs_volume::{Volume, VolumeError, VolumeErrorKind};

/// Item 1: host B exports the owner's volume read-only (the daemon's `read_only` attachment)
/// and its space keeper (or `POST /compact`) compacts. On aa5c605 the export was opened with
/// no owner id and its compaction published the next generation with no owner record: the
/// owner's next flush was `Fenced` and every write it acknowledged since was lost. Now the
/// export is `read_only`: every publish through it is refused, and the owner goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_export_never_fences_the_owner() {
    let store = mem();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    half_live(&a, &mut oracle).await;

    let mut cfg = config(db.path());
    cfg.read_only = true;
    let b = Volume::open(cfg, store.clone()).await.unwrap();
    assert_eq!(b.manifest_generation(), a.manifest_generation(), "no claim");
    oracle.assert_pages(0, &read_all(&b).await, "the export reads the owner's state");
    for (op, err) in [
        ("compaction", b.compact(HALF).await.map(|_| ()).unwrap_err()),
        (
            "gc",
            b.collect_garbage(Default::default())
                .await
                .map(|_| ())
                .unwrap_err(),
        ),
        (
            "snapshot",
            b.create_snapshot("s").await.map(|_| ()).unwrap_err(),
        ),
        ("write", b.write(0, &[1; PAGE]).await.unwrap_err()),
    ] {
        assert!(
            matches!(err, VolumeError::ReadOnly { snapshot: None, .. }),
            "{op}: {err}"
        );
    }
    assert_eq!(
        b.sync_to_store().await.unwrap().blocks,
        0,
        "nothing to upload"
    );

    write_blocks(&a, &mut oracle, 3, &[0, 5]).await;
    a.sync_to_store()
        .await
        .expect("the owner's flush after the export's attempts");
    a.compact(HALF).await.unwrap();
    check_fresh_host(&store, &oracle, "after the export tried to publish").await;
}

/// Item 1 at the store's depth: a handle that claims nothing and is not marked read-only (an
/// owner-less writer, which is how the daemon opened read-only exports on aa5c605) compacts
/// the owner's volume. The publisher's owner invariant refuses it (`Fenced`: it does not
/// continue the owner's claim); on aa5c605 it published and fenced the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_without_the_owners_claim_is_refused_by_the_store() {
    let store = mem();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    half_live(&a, &mut oracle).await;

    let b = open(db.path(), store.clone()).await;
    let err = b.compact(HALF).await.unwrap_err();
    assert_eq!(err.kind(), VolumeErrorKind::Fenced, "{err}");
    assert!(err.to_string().contains("another owner"), "{err}");

    write_blocks(&a, &mut oracle, 3, &[0, 5]).await;
    a.sync_to_store()
        .await
        .expect("the owner's flush after the unclaimed compaction");
    assert_eq!(a.owner(), held(A, 1));
    check_fresh_host(&store, &oracle, "after the unclaimed compaction").await;
}

/// Item 4: a cache directory that served `v@s2` is opened as a view of `v@s1`. On aa5c605
/// `base::judge` said `Diverged` (the directory's base is newer than s1's generation), the
/// open kept Clean copies (it drops them only on `Stale`), and every cached block read s2's
/// bytes. Now a view's cache is keyed to the generation it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_views_cache_reopened_at_an_older_snapshot_serves_that_snapshot() {
    let store = mem();
    let (da, dv) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    let mut oracle = Oracle::new();
    write_blocks(&a, &mut oracle, 1, &all).await;
    a.create_snapshot("s1").await.unwrap();
    let at_s1 = oracle.clone();
    write_blocks(&a, &mut oracle, 2, &all).await;
    a.create_snapshot("s2").await.unwrap();

    let view_of = |snapshot: &str| {
        let mut cfg = config(dv.path());
        cfg.snapshot = Some(snapshot.to_string());
        cfg
    };
    let v2 = Volume::open(view_of("s2"), store.clone()).await.unwrap();
    oracle.assert_pages(0, &read_all(&v2).await, "the view of s2");
    v2.close().await.unwrap();
    drop(v2);

    let v1 = Volume::open(view_of("s1"), store.clone()).await.unwrap();
    at_s1.assert_pages(0, &read_all(&v1).await, "the same directory, a view of s1");
    v1.close().await.unwrap();
    drop(v1);
    // And back: the directory now serves s1; a view of s2 drops those copies again.
    let v2 = Volume::open(view_of("s2"), store.clone()).await.unwrap();
    oracle.assert_pages(0, &read_all(&v2).await, "the view of s2 again");
}

/// A view never serves, nor drops, a writer's unpublished blocks: a cache directory holding
/// some is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_refuses_a_cache_with_unpublished_writes() {
    let store = mem();
    let da = tempfile::tempdir().unwrap();
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    write_blocks(&a, &mut oracle, 1, &[0, 1]).await;
    a.create_snapshot("s1").await.unwrap();
    write_blocks(&a, &mut oracle, 2, &[0]).await;
    a.flush().await.unwrap();
    drop(a);

    let mut cfg = config(da.path());
    cfg.snapshot = Some("s1".into());
    let Err(err) = Volume::open(cfg, store.clone()).await else {
        panic!("a view opened a cache directory holding a writer's unpublished blocks");
    };
    assert!(
        matches!(err, VolumeError::InvalidConfig { .. }) && err.to_string().contains("unpublished"),
        "{err}"
    );
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    oracle.assert_pages(0, &read_all(&a).await, "the writer's cache is intact");
}
