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

/// Opens a read-only export of the test volume (the daemon's `read_only` attachment).
async fn export(
    dir: &std::path::Path,
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
) -> std::sync::Arc<Volume> {
    let mut cfg = config(dir);
    cfg.read_only = true;
    Volume::open(cfg, store.clone()).await.unwrap()
}

/// Writer A (`half_live`) and a read-only export B of its volume, each on its own cache
/// directory (A's, B's).
async fn writer_and_export() -> (
    std::sync::Arc<dyn object_store::ObjectStore>,
    [tempfile::TempDir; 2],
    std::sync::Arc<Volume>,
    std::sync::Arc<Volume>,
    Oracle,
) {
    let store = mem();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let a = open_as(dirs[0].path(), &store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    half_live(&a, &mut oracle).await;
    let b = export(dirs[1].path(), &store).await;
    (store, dirs, a, b, oracle)
}

/// Item 6: host B exports A's volume read-only and reads part of it; A overwrites some
/// blocks, flushes, compacts and a hard GC deletes every pack the export's manifest names.
/// Every read of B, of blocks it evicted or never cached, succeeds and returns A's newest
/// published bytes: a fetch whose pack is gone reloads the latest manifest and reads there.
/// On the unfixed code the export's map was the one it loaded at open: the cold reads failed
/// with "pack ... not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_export_follows_the_writer_past_compaction_and_gc() {
    let (store, dirs, a, b, mut oracle) = writer_and_export().await;
    let db = &dirs[1];
    let opened_at = b.manifest_generation();
    for block in [0, 1, 2, 3] {
        let got = read_block(&b, block).await;
        oracle.assert_pages(
            block as usize * PPB,
            &got,
            "the export before the writer moves",
        );
    }
    write_blocks(&a, &mut oracle, 3, &[0, 6, 9]).await;
    a.sync_to_store().await.unwrap();
    a.compact(HALF).await.unwrap();
    let gc = gc_hard(&store).await;
    assert!(
        !gc.packs_deleted.is_empty(),
        "the GC deletes the export's packs"
    );

    b.evict_to(0).await.unwrap();
    for block in 0..BLOCKS {
        let got = read_block(&b, block).await;
        oracle.assert_pages(
            block as usize * PPB,
            &got,
            &format!("the export's cold read of block {block}"),
        );
    }
    assert!(
        b.manifest_generation() > opened_at,
        "the export adopted a newer generation"
    );
    oracle.assert_pages(0, &read_all(&b).await, "the export, whole, hot");
    // Its cache directory records what it serves: a reopen keeps nothing stale.
    b.close().await.unwrap();
    drop(b);
    let b = export(db.path(), &store).await;
    oracle.assert_pages(0, &read_all(&b).await, "the export reopened");
}

/// Item 6, cached copies: B caches every block, A overwrites some of them and flushes (its
/// old packs stay, so nothing fails). Once B follows (`Volume::follow`, or the reload a
/// cold read whose pack is gone triggers), a block B had cached and A changed reads A's new
/// bytes, never the copy B kept. On the unfixed code B had no way to follow and served its
/// cached copies of A's old bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_export_drops_its_copies_of_blocks_the_writer_changed() {
    let (store, _dirs, a, b, mut oracle) = writer_and_export().await;
    oracle.assert_pages(0, &read_all(&b).await, "the export caches every block");
    let before = oracle.clone();
    write_blocks(&a, &mut oracle, 3, &[0, 5]).await;
    a.sync_to_store().await.unwrap();
    before.assert_pages(
        0,
        &read_all(&b).await,
        "before it follows: the state it loaded",
    );

    let g = b.follow().await.unwrap();
    assert_eq!(
        g,
        a.manifest_generation(),
        "the export follows to the latest generation"
    );
    oracle.assert_pages(0, &read_all(&b).await, "after it follows: A's newest bytes");

    // Through a cold read whose pack GC deleted: B keeps block 1 cached, A rewrites it and
    // compacts, GC deletes; B's cold reads of other blocks reach a deleted pack and reload,
    // and block 1 reads A's new bytes.
    b.evict_to(0).await.unwrap();
    oracle.assert_pages(PPB, &read_block(&b, 1).await, "block 1 cached");
    let cached = before_change(&oracle);
    write_blocks(&a, &mut oracle, 4, &[1, 12]).await;
    a.sync_to_store().await.unwrap();
    a.compact(HALF).await.unwrap();
    gc_hard(&store).await;
    let at = b.manifest_generation();
    for block in (2..BLOCKS).filter(|&b| b != 12) {
        let got = read_block(&b, block).await;
        oracle.assert_pages(block as usize * PPB, &got, &format!("cold block {block}"));
    }
    assert!(
        b.manifest_generation() > at,
        "a cold read whose pack is gone reloaded"
    );
    let got = read_block(&b, 1).await;
    assert!(
        got != cached,
        "block 1: the export served its copy of A's old bytes"
    );
    oracle.assert_pages(0, &read_all(&b).await, "every block after the reload");
}

/// Block 1's bytes in `oracle`.
fn before_change(oracle: &Oracle) -> Vec<u8> {
    oracle.cur[PPB..2 * PPB].concat()
}
