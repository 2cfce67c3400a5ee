//! The multi-host protocols under faults a fresh-eyes review found (issue 45 items 5 and 6;
//! each test failed before its fix): a view's renewal that met a delete's marker backed out
//! of its own registration (a delete then passed while the view read on, and GC took its
//! packs), a refused delete left the view unregistered the same way, and a read-only export
//! whose cache disk failed while it adopted a newer generation kept serving an older copy of
//! a changed block (the drop of its Clean copies returned before marking any).
//! And one the long simulation found: a rotation recovered after a crash that had lost the
//! blocks a write promoted from it published an image the volume never had.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use glidefs_volume::cache::{FaultEffect, FaultOn, IoOp};
use glidefs_volume::{SnapshotProblem, Volume, VolumeError};

/// Writer A (owner) on `store` with snapshot s1 of seed-1 blocks, then seed 2 flushed on
/// top; and view B of v@s1 (owner B) whose lease is `lease`.
async fn writer_and_view(
    store: &Arc<dyn object_store::ObjectStore>,
    lease: Duration,
) -> ([tempfile::TempDir; 2], Arc<Volume>, Arc<Volume>, Oracle) {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let a = open_as(dirs[0].path(), store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&a, &mut oracle, 1, &all).await;
    a.create_snapshot("s1").await.unwrap();
    let at_s1 = oracle.clone();
    write_blocks(&a, &mut oracle, 2, &all).await;
    a.sync_to_store().await.unwrap();
    let mut cfg = config(dirs[1].path());
    cfg.snapshot = Some("s1".into());
    cfg.owner = Some(B.into());
    cfg.store.view_lease = lease;
    let b = Volume::open(cfg, store.clone()).await.unwrap();
    (dirs, a, b, at_s1)
}

fn attached(r: &Result<glidefs_volume::SnapshotRecord, VolumeError>) -> bool {
    matches!(
        r,
        Err(VolumeError::Snapshot {
            problem: SnapshotProblem::Attached { .. },
            ..
        })
    )
}

/// What B's cold read of block 0 gives after a hard GC.
async fn cold_read_after_gc(
    store: &Arc<dyn object_store::ObjectStore>,
    b: &Volume,
) -> Result<(), VolumeError> {
    gc_hard(store).await;
    let mut buf = vec![0; BSU];
    b.read(0, &mut buf).await
}

/// View B is open and renewing (lease 300 ms: every 100 ms). A deletes s1:
/// 1. A's `unpin` PUTs the `deleting` marker (then its HEAD of the marker is slow: held).
/// 2. B's renewal PUTs its registration, GETs the marker: there, so it "backs out": deletes
///    its registration and stops renewing for good.
/// 3. A lists the views: none. A deletes the record and the marker: Ok.
///
/// The delete had to be refused (`Attached`): B never lost the store or its lease. GC then
/// collects s1's packs and B's cold reads fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_views_renewal_during_a_delete_keeps_the_delete_refused() {
    let faulty = Arc::new(FaultyStore::new(mem()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let (_dirs, a, b, _at_s1) = writer_and_view(&store, Duration::from_millis(300)).await;

    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Head])
            .path_contains("snapshots/s1/deleting")
            .times(1),
    );
    let deleting = {
        let a = a.clone();
        tokio::spawn(async move { a.delete_snapshot("s1").await })
    };
    faulty.plan().wait_held(1).await;
    // Long enough for at least one renewal of B.
    tokio::time::sleep(Duration::from_millis(400)).await;
    faulty.release_held();
    let deleted = deleting.await.unwrap();
    let read = if deleted.is_ok() {
        cold_read_after_gc(&store, &b).await
    } else {
        Ok(())
    };
    assert!(
        attached(&deleted),
        "A's delete of s1 while B's view is open and renewing: {:?}; B's cold read after GC: {:?}",
        deleted.as_ref().map(|r| r.generation),
        read.err().map(|e| e.to_string())
    );
}

/// The same renewal meeting a delete that is *refused* (correctly, because of B): the
/// refused delete's marker is there from its PUT to its DELETE (held here), B's renewal sees
/// it, deletes its registration and stops renewing. The delete answers `Attached`; the
/// operator's next delete, with B still open, succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_delete_leaves_the_view_registered() {
    let faulty = Arc::new(FaultyStore::new(mem()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let (_dirs, a, b, _at_s1) = writer_and_view(&store, Duration::from_millis(300)).await;

    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Delete])
            .path_contains("snapshots/s1/deleting")
            .times(1),
    );
    let deleting = {
        let a = a.clone();
        tokio::spawn(async move { a.delete_snapshot("s1").await })
    };
    faulty.plan().wait_held(1).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    faulty.release_held();
    let first = deleting.await.unwrap();
    assert!(attached(&first), "first delete: {first:?}");
    // Well within B's lease, with B open all along.
    let second = a.delete_snapshot("s1").await;
    let read = if second.is_ok() {
        cold_read_after_gc(&store, &b).await
    } else {
        Ok(())
    };
    assert!(
        attached(&second),
        "A's second delete of s1 while B's view is open: {:?}; B's cold read after GC: {:?}",
        second.as_ref().map(|r| r.generation),
        read.err().map(|e| e.to_string())
    );
}

/// Export B of A's volume, its cache on a disk whose WAL syncs fail while `disk` is armed.
///
/// 1. B caches block 1; the disk fails; B's eviction of block 1 fails at its WAL sync (its
///    hole punch is deferred: `deferred.punch` is not empty).
/// 2. B caches block 0 (A's seed-1 bytes; a fill needs no sync).
/// 3. A rewrites block 0 (seed 3) and flushes: generation G.
/// 4. B follows: `adopt` swaps its map to G, then `drop_clean([0])` fails at its first
///    `sync_log` (the deferred punch) *before* it marks any block NotPresent. `follow`
///    answers the error; the map stays at G, the base file is not written.
/// 5. The disk recovers. B follows again: G is the latest and is what B serves, so nothing
///    is adopted again, and block 0 stays Clean with A's seed-1 bytes.
///
/// Every later read of block 0 returns bytes older than the generation B serves (after A
/// writes block 5 and B adopts that generation too, the base file records it, and a reopen
/// keeps the stale copy as well).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_whose_cache_fails_while_it_adopts_serves_no_older_copy() {
    let store = mem();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let a = open_as(dirs[0].path(), &store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&a, &mut oracle, 1, &all).await;
    a.sync_to_store().await.unwrap();

    let disk = Arc::new(FaultOn::new(IoOp::WalSync, FaultEffect::NoSpace));
    let mut cfg = config(dirs[1].path());
    cfg.read_only = true;
    cfg.follow_interval = Duration::from_secs(3600);
    cfg.crash_hook = disk.clone();
    let b = Volume::open(cfg.clone(), store.clone()).await.unwrap();

    oracle.assert_pages(PPB, &read_block(&b, 1).await, "block 1 cached");
    disk.arm();
    assert!(
        b.evict_to(0).await.is_err(),
        "the eviction's WAL sync fails"
    );
    oracle.assert_pages(0, &read_block(&b, 0).await, "block 0 cached");

    write_blocks(&a, &mut oracle, 3, &[0]).await;
    a.sync_to_store().await.unwrap();
    let first = b.follow().await;
    disk.disarm();
    let second = b.follow().await;
    let got = read_block(&b, 0).await;
    let stale_now = got != oracle.cur[0..PPB].concat();

    // A moves on; B follows fine this time and records that generation.
    write_blocks(&a, &mut oracle, 4, &[5]).await;
    a.sync_to_store().await.unwrap();
    let third = b.follow().await;
    b.close().await.unwrap();
    drop(b);
    cfg.crash_hook = Arc::new(glidefs_volume::cache::NoCrash);
    let b = Volume::open(cfg, store.clone()).await.unwrap();
    let reopened = read_block(&b, 0).await;
    let stale_reopened = reopened != oracle.cur[0..PPB].concat();
    assert!(
        !stale_now && !stale_reopened,
        "A's generation {}: block 0 is seed 3. B's follow with the disk failing: {:?}; \
         again: {:?} (B serves generation {:?}); B's block 0 then is A's newest: {}; \
         after B followed to {:?} and reopened at {}: {}",
        a.manifest_generation() - 1,
        first.as_ref().map_err(|e| e.to_string()),
        second.as_ref().map_err(|e| e.to_string()),
        second.as_ref().ok(),
        !stale_now,
        third.as_ref().map_err(|e| e.to_string()),
        b.manifest_generation(),
        !stale_reopened
    );
}

/// A flush whose publish failed leaves its rotation pending; a later write promotes one of
/// its blocks; the host crashes and reopens; the next flush publishes the recovered rotation
/// as one generation, then the newer writes as the next. Another host that takes the volume
/// over while only the first is in the store (the second's pack upload fails here) must read
/// the image of the rotation's moment. Before the fix the recovered rotation had lost the
/// promoted block, so that generation paired the rotation's blocks with the promoted block's
/// older store version: an image the volume never had (issue 45, sim seed 1044027).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_rotation_publishes_the_image_of_its_moment() {
    let faulty = Arc::new(FaultyStore::new(mem()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let a = open_as(dirs[0].path(), &store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    write_blocks(&a, &mut oracle, 1, &[1, 2, 3]).await;
    let at_rotation = oracle.clone();
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("manifest/"),
    );
    assert!(a.sync_to_store().await.is_err(), "the publish fails");
    faulty.clear_faults();
    write_blocks(&a, &mut oracle, 2, &[2]).await;
    a.flush().await.unwrap();
    a.kill().await;
    drop(a);

    let a = open_as(dirs[0].path(), &store, A, false).await.unwrap();
    oracle.assert_pages(0, &read_all(&a).await, "A after its crash");
    let before = a.manifest_generation();
    // The recovered rotation publishes; the next one's pack upload fails.
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains(&format!("packs/{:016x}-", before + 2)),
    );
    assert!(a.sync_to_store().await.is_err(), "the second round fails");
    faulty.clear_faults();
    assert_eq!(
        vstore(&store).latest_generation().await.unwrap(),
        before + 1,
        "only the recovered rotation is in the store"
    );

    let b = open_as(dirs[1].path(), &store, B, true).await.unwrap();
    at_rotation.assert_pages(0, &read_all(&b).await, "B after its takeover");
    b.close().await.unwrap();
    a.kill().await;
}
