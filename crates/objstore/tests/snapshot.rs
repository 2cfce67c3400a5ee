//! Snapshots pin their generation against GC; clones read their origin's packs, never delete
//! them, and keep the snapshot they come from from being deleted.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::snapshots::*;
use common::*;
use futures::TryStreamExt;
use glidefs_objstore::{ErrorKind, ObjStoreError, SnapshotProblem, VolumeStore};
use glidefs_testkit::verify_block;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use object_store::path::Path;
use object_store::ObjectStore;
use object_store::ObjectStoreExt;

#[tokio::test]
async fn a_snapshot_pins_its_packs_until_it_is_deleted() {
    for backend in [memory(), local(), s3().await] {
        let vs = volume(&backend.store, "v");
        let (a, b) = two_generations(&vs).await;
        let report = vs.gc(collect_all()).await.unwrap();
        assert_eq!(report.manifests_retained, vec![1, 2], "{}", backend.name);
        assert!(report.packs_deleted.is_empty(), "{}", backend.name);
        assert_eq!(packs_of(&vs, "v").await, [a.clone(), b.clone()].into());
        // The snapshot reads back its generation's data.
        let snap = vs.snapshot("s1").await.unwrap().unwrap();
        assert_eq!(snap.record.generation, 1);
        assert!(!snap.deleting && snap.clones.is_empty());
        let m1 = vs.fetch_manifest(1).await.unwrap();
        for (blk, loc) in m1.iter() {
            verify_block(blk, 1, &vs.read_block(blk, loc).await.unwrap()).unwrap();
        }
        // Deleted, the next pass releases generation 1 and pack A.
        vs.delete_snapshot("s1").await.unwrap();
        assert!(vs.list_snapshots().await.unwrap().is_empty());
        let report = vs.gc(collect_all()).await.unwrap();
        assert_eq!(report.manifests_deleted, vec![1], "{}", backend.name);
        assert_eq!(packs_of(&vs, "v").await, [b].into(), "{}", backend.name);
    }
}

#[tokio::test]
async fn snapshot_names_are_taken_once_and_only_the_newest_generation_is_pinned() {
    let backend = memory();
    let vs = volume(&backend.store, "v");
    two_generations(&vs).await;
    // The same name and generation again: the retry of a create whose reply was lost.
    assert_eq!(vs.create_snapshot("s2", 2).await.unwrap().generation, 2);
    let e = vs.create_snapshot("s2", 2).await.unwrap_err();
    assert_eq!(problem(&e), Some(&SnapshotProblem::Exists), "{e}");
    // Only the newest generation: an older one may already be pruned by a GC.
    let e = vs.create_snapshot("old", 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert!(vs.snapshot("old").await.unwrap().is_none());
    let e = vs.create_snapshot("s1", 2).await.unwrap_err();
    assert_eq!(problem(&e), Some(&SnapshotProblem::Exists), "{e}");
    let e = vs.create_snapshot("../x", 2).await.unwrap_err();
    assert_eq!(problem(&e), Some(&SnapshotProblem::InvalidName), "{e}");
    let e = vs.delete_snapshot("nope").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("v@nope"), "{e}");
    // A generation that is not published cannot be snapshotted.
    assert!(vs.create_snapshot("s9", 9).await.is_err());
}

#[tokio::test]
async fn a_clone_reads_its_origin_and_keeps_the_snapshot_alive() {
    for backend in [memory(), local(), s3().await] {
        let origin = volume(&backend.store, "v");
        let (a, b) = two_generations(&origin).await;
        let clone = volume(&backend.store, "c");
        let m = clone
            .create_clone(&origin, "s1", Some("host/1".into()))
            .await
            .unwrap();
        assert_eq!((m.generation, m.len()), (1, 4));
        // The clone's manifest as stored names the origin's pack; reads come from there.
        let reader = volume(&backend.store, "c");
        let m = reader.load_manifest().await.unwrap().unwrap();
        for (blk, loc) in m.iter() {
            assert_eq!(loc.pack.foreign_volume(), Some("v"));
            verify_block(blk, 1, &reader.read_block(blk, loc).await.unwrap()).unwrap();
        }
        let origin_record = reader.origin().await.unwrap().unwrap();
        assert_eq!(
            (
                origin_record.volume.as_str(),
                origin_record.snapshot.as_str()
            ),
            ("v", "s1")
        );
        // The clone diverges: its own pack for block 0, published as generation 2.
        let own = pattern_pack(&[0], 7, 0);
        reader
            .upload_packs(std::slice::from_ref(&own))
            .await
            .unwrap();
        let mut m2 = next_manifest(&m, &[&own]);
        reader.publish_manifest(&mut m2).await.unwrap();
        // The clone's GC never touches the origin's packs.
        reader.gc(collect_all()).await.unwrap();
        assert_eq!(packs_of(&origin, "v").await, [a.clone(), b.clone()].into());
        // The snapshot cannot go while the clone exists, and says which clone holds it.
        let e = origin.delete_snapshot("s1").await.unwrap_err();
        assert_eq!(
            problem(&e),
            Some(&SnapshotProblem::HasClones {
                clones: vec!["c".into()]
            }),
            "{}: {e}",
            backend.name
        );
        assert!(e.to_string().contains('c'));
        let info = origin.snapshot("s1").await.unwrap().unwrap();
        assert!(!info.deleting, "the refused delete left no marker");
        origin.gc(collect_all()).await.unwrap();
        assert!(
            packs_of(&origin, "v").await.contains(&a),
            "{}",
            backend.name
        );
        for (blk, loc) in m2.iter() {
            let g = if blk == 0 { 7 } else { 1 };
            verify_block(blk, g, &reader.read_block(blk, loc).await.unwrap()).unwrap();
        }
        // Purge the clone (its objects, then its registration): the snapshot can go.
        assert!(reader.purge().await.unwrap() > 0);
        assert!(origin
            .snapshot("s1")
            .await
            .unwrap()
            .unwrap()
            .clones
            .is_empty());
        origin.delete_snapshot("s1").await.unwrap();
        origin.gc(collect_all()).await.unwrap();
        assert_eq!(packs_of(&origin, "v").await, [b].into(), "{}", backend.name);
    }
}

#[tokio::test]
async fn a_clone_of_a_clone_names_the_volume_that_stored_each_pack() {
    let backend = memory();
    let origin = volume(&backend.store, "v");
    two_generations(&origin).await;
    let c1 = volume(&backend.store, "c1");
    let m = c1.create_clone(&origin, "s1", None).await.unwrap();
    let own = pattern_pack(&[1], 5, 0);
    c1.upload_packs(std::slice::from_ref(&own)).await.unwrap();
    let mut m2 = next_manifest(&m, &[&own]);
    c1.publish_manifest(&mut m2).await.unwrap();
    c1.create_snapshot("t", 2).await.unwrap();
    let c2 = volume(&backend.store, "c2");
    let m = c2.create_clone(&c1, "t", None).await.unwrap();
    for (blk, loc) in m.iter() {
        let (volume, g) = if blk == 1 { ("c1", 5) } else { ("v", 1) };
        assert_eq!(loc.pack.foreign_volume(), Some(volume));
        verify_block(blk, g, &c2.read_block(blk, loc).await.unwrap()).unwrap();
    }
    assert_eq!(
        origin.clones().await.unwrap(),
        vec![("s1".into(), "c1".into())]
    );
    assert_eq!(c1.clones().await.unwrap(), vec![("t".into(), "c2".into())]);
}

#[tokio::test]
async fn a_clone_racing_a_snapshot_delete_either_wins_or_leaves_nothing() {
    let backend = memory();
    let origin = volume(&backend.store, "v");
    two_generations(&origin).await;
    // A delete is in progress (its marker is written): creating a clone fails and undoes.
    backend
        .store
        .put(
            &Path::from("volumes/v/snapshots/s1/deleting"),
            bytes::Bytes::from_static(b"x").into(),
        )
        .await
        .unwrap();
    let clone = volume(&backend.store, "c");
    let e = clone.create_clone(&origin, "s1", None).await.unwrap_err();
    assert_eq!(problem(&e), Some(&SnapshotProblem::Deleting), "{e}");
    assert_eq!(clone.latest_generation().await.unwrap(), 0);
    // The delete completes (the retry of the interrupted delete).
    origin.delete_snapshot("s1").await.unwrap();
    // A registration without a manifest younger than the clone deadline is a creation that
    // may still publish: the delete is refused and changes nothing.
    origin.create_snapshot("s2", 2).await.unwrap();
    backend
        .store
        .put(
            &Path::from("volumes/v/snapshots/s2/clones/ghost"),
            bytes::Bytes::from_static(b"ghost").into(),
        )
        .await
        .unwrap();
    let e = origin.delete_snapshot("s2").await.unwrap_err();
    assert_eq!(
        problem(&e),
        Some(&SnapshotProblem::ClonesInCreation {
            clones: vec!["ghost".into()]
        }),
        "{e}"
    );
    let info = origin.snapshot("s2").await.unwrap().expect("s2 stays");
    assert!(!info.deleting);
    // Older than the deadline (by the store's clock), it is a creation that died: it does not
    // block a delete.
    let aged = with_deadline(&backend.store, "v", Duration::ZERO);
    aged.delete_snapshot("s2").await.unwrap();
    assert_nothing_under(&backend.store, "volumes/v/snapshots").await;
}

#[tokio::test]
async fn gc_refuses_when_a_snapshot_lost_its_manifest() {
    let backend = memory();
    let vs = volume(&backend.store, "v");
    two_generations(&vs).await;
    backend
        .store
        .delete(&Path::from("volumes/v/manifest/00000000000000000001"))
        .await
        .unwrap();
    let e = vs.gc(collect_all()).await.unwrap_err();
    assert!(e.to_string().contains("generation 1"), "{e}");
}

#[tokio::test]
async fn a_lost_reply_to_a_snapshot_record_is_retried_into_success() {
    use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
    let faulty = std::sync::Arc::new(FaultyStore::new(memory().store));
    let store: std::sync::Arc<dyn object_store::ObjectStore> = faulty.clone();
    let vs = volume(&store, "v");
    two_generations(&vs).await;
    faulty.inject(
        FaultRule::new(Fault::LostAck)
            .ops(&[Op::Put])
            .path_contains("snapshots/s2/record")
            .times(1),
    );
    assert_eq!(vs.create_snapshot("s2", 2).await.unwrap().generation, 2);
    assert_eq!(faulty.plan().faults_fired(), 1);
    let e = vs.create_snapshot("s2", 2).await.unwrap_err();
    assert_eq!(problem(&e), Some(&SnapshotProblem::Exists), "{e}");
}

/// Reads every block of clone `name`'s newest manifest; the first failure, if any.
async fn read_clone(store: &Arc<dyn ObjectStore>, name: &str) -> Result<(), String> {
    let vs = volume(store, name);
    let m = vs
        .load_manifest()
        .await
        .map_err(|e| format!("load manifest: {e}"))?
        .ok_or("no manifest")?;
    for (blk, loc) in m.iter() {
        let data = vs
            .read_block(blk, loc)
            .await
            .map_err(|e| format!("block {blk} ({}): {e}", loc.pack))?;
        verify_block(blk, 1, &data).map_err(|e| format!("block {blk}: {e}"))?;
    }
    Ok(())
}

/// (Review finding 1.) A snapshot delete that is *refused* (another clone is live) still clears the
/// registration of a clone whose creation has registered but not yet published ("a creation
/// that died or has yet to check"), and then removes its `deleting` marker. The creation then
/// publishes and runs its check, which finds the record and no marker: it succeeds, but the
/// clone is no longer registered. Nothing pins the snapshot for it any more: once the other
/// clone is purged, the snapshot delete succeeds, GC collects the origin's packs, and the
/// clone's reads 404. (The daemon's purge check of the origin, `VolumeStore::clones`, misses
/// the clone the same way.)
#[tokio::test]
async fn a_refused_snapshot_delete_must_not_unregister_a_clone_being_created() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    // Clone `b` exists: it will make the delete below refuse.
    volume(&store, "b")
        .create_clone(&origin, "s1", None)
        .await
        .unwrap();

    // Clone `c` is being created: registered and origin record written, its generation 1
    // PUT is in flight (held).
    let creating = clone_held_before_its_publish(&faulty, &store).await;

    // The delete is refused because of `b` (correct) ...
    let e = origin.delete_snapshot("s1").await.unwrap_err();
    assert!(
        matches!(problem(&e), Some(SnapshotProblem::HasClones { .. })),
        "{e}"
    );
    // ... and the creation of `c` completes.
    faulty.release_held();
    tokio::time::timeout(Duration::from_secs(10), creating)
        .await
        .expect("clone creation finishes")
        .unwrap()
        .expect("clone `c` is created: the snapshot was never deleted");
    let registered = origin.snapshot("s1").await.unwrap().unwrap().clones;

    // Later: `b` is purged (properly); the snapshot delete must still be refused for `c`.
    volume(&store, "b").purge().await.unwrap();
    let deleted = origin.delete_snapshot("s1").await;
    origin.gc(collect_all()).await.unwrap();
    let read = read_clone(&store, "c").await;
    assert!(
        registered.contains(&"c".to_string()) && deleted.is_err() && read.is_ok(),
        "clone `c` was created successfully but is registered under v@s1 as {registered:?}; \
         deleting v@s1 after purging `b`: {deleted:?}; reading clone `c` after GC of `v`: {read:?}"
    );
}

/// (Review finding 2.) `delete_snapshot` decides that a registered clone "never published" from a
/// LIST of the clone's manifests (`latest_generation() > 0`). A stale listing (one that ran
/// before the clone's generation 1 became visible) makes it clear the registration of a live
/// clone and delete the snapshot; GC then collects the packs the clone reads. The check of a
/// known key (HEAD/GET of `manifest/1`, read-after-write consistent) would not be fooled.
#[tokio::test]
async fn a_stale_listing_of_a_clones_manifests_must_not_delete_its_snapshot() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    volume(&store, "c")
        .create_clone(&origin, "s1", None)
        .await
        .unwrap();
    read_clone(&store, "c").await.unwrap();

    faulty.inject(
        FaultRule::new(Fault::EmptyList)
            .ops(&[Op::List])
            .path_contains("volumes/c/manifest")
            .times(1),
    );
    let deleted = origin.delete_snapshot("s1").await;
    // (The delete reads generation 1 by key and never lists: the stale listing is left.)
    faulty.clear_faults();
    origin.gc(collect_all()).await.unwrap();
    let read = read_clone(&store, "c").await;
    assert!(
        deleted.is_err() && read.is_ok(),
        "deleting v@s1 while clone `c` lives: {deleted:?}; reading `c` after GC of `v`: {read:?}"
    );
}

/// (Review finding 3, availability, not loss.) GC lists the manifests, then the snapshots. A flush
/// that publishes generation N and a snapshot of N recorded between those two listings (the
/// order the module docs rely on) make GC refuse the whole pass: "a snapshot of generation N,
/// whose manifest is not in the store". A pinned generation newer than the newest listed
/// manifest is not missing, it is just newer than the listing. (`glidefs gc` then reports the
/// volume as failed and exits non-zero on a healthy volume.)
#[tokio::test]
async fn gc_racing_a_flush_and_a_snapshot_must_not_fail() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let vs = volume(&store, "v");
    two_generations(&vs).await;

    // GC's second LIST (after the manifests) is the snapshot listing: hold it.
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::List])
            .path_contains("volumes/v/snapshots")
            .times(1),
    );
    let gc = {
        let store = store.clone();
        tokio::spawn(async move { volume(&store, "v").gc(collect_all()).await })
    };
    faulty.wait_held(1).await;
    // The writer flushes generation 3 and snapshots it (newest: allowed).
    let m2 = vs.fetch_manifest(2).await.unwrap();
    let c = pattern_pack(&[4], 3, 0);
    vs.upload_packs(std::slice::from_ref(&c)).await.unwrap();
    let mut m3 = next_manifest(&m2, &[&c]);
    vs.publish_manifest(&mut m3).await.unwrap();
    vs.create_snapshot("s3", 3).await.unwrap();
    faulty.release_held();
    let report = tokio::time::timeout(Duration::from_secs(10), gc)
        .await
        .expect("gc finishes")
        .unwrap();
    assert!(
        report.is_ok(),
        "a GC pass racing a legitimate flush + snapshot failed: {:?}",
        report.err()
    );
}

/// (Review finding 5.) `create_snapshot` writes the record, then checks that its generation is still
/// the newest; if another writer published meanwhile (a takeover), it *withdraws* the record
/// by deleting it outright: no `deleting` marker, no look at the clones. For the time between
/// the PUT and the check the record is a normal, visible snapshot, and a clone created from
/// it then (on another host: it only needs the record) registers, publishes and passes its
/// own check. The withdrawal deletes the record under the clone; the new owner's GC then
/// collects the packs the clone reads.
#[tokio::test]
async fn a_withdrawn_snapshot_record_must_not_strand_a_clone_made_from_it() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let vs = volume(&store, "v");
    vs.load_manifest().await.unwrap();
    let a = pattern_pack(&[0, 1, 2, 3], 1, 0);
    vs.upload_packs(std::slice::from_ref(&a)).await.unwrap();
    let mut m1 = next_manifest(&empty("v"), &[&a]);
    vs.publish_manifest(&mut m1).await.unwrap();

    // The old owner's create_snapshot: its first manifest listing (the check before the
    // record) goes through, the second one (the check after it) is held.
    faulty.inject(
        FaultRule::new(Fault::Stall(Duration::ZERO))
            .ops(&[Op::List])
            .path_contains("volumes/v/manifest")
            .times(1),
    );
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::List])
            .path_contains("volumes/v/manifest")
            .times(1),
    );
    let creating = {
        let store = store.clone();
        tokio::spawn(async move { volume(&store, "v").create_snapshot("s1", 1).await })
    };
    faulty.wait_held(1).await;
    // Meanwhile: the record is visible, a clone is made from it ...
    let clone = volume(&store, "c");
    clone.create_clone(&vs, "s1", None).await.unwrap();
    // ... and the new owner publishes generation 2, rewriting every block into pack B.
    let b = pattern_pack(&[0, 1, 2, 3], 2, 0);
    vs.upload_packs(std::slice::from_ref(&b)).await.unwrap();
    let mut m2 = next_manifest(&m1, &[&b]);
    vs.publish_manifest(&mut m2).await.unwrap();
    faulty.release_held();
    let created = tokio::time::timeout(Duration::from_secs(10), creating)
        .await
        .expect("snapshot creation finishes")
        .unwrap();
    let still = vs.snapshot("s1").await.unwrap();
    vs.gc(collect_all()).await.unwrap();
    let read = read_clone(&store, "c").await;
    assert!(
        still.is_some() && read.is_ok(),
        "create_snapshot returned {created:?}; v@s1 after it: {still:?} (clone `c` was \
         created from it); reading `c` after GC of `v`: {read:?}"
    );
}

/// (Review finding 6.) The daemon's purge of an origin volume is
/// `check_purge` (`VolumeStore::clones()` is empty), then a LIST-and-delete of everything
/// under `volumes/<v>/` (manifest/, origin, packs/, then snapshots/: the records go last).
/// It takes no step of the snapshot delete protocol, so a clone creation that overlaps it
/// (another daemon on the same store: the admin lock is per daemon) registers, publishes and
/// passes its check (the record is still there) while the packs it maps are being deleted.
/// Modelled here with the daemon's exact store calls and the clone created between the check
/// and the deletion.
#[tokio::test]
async fn purging_an_origin_must_not_race_a_clone_creation() {
    let backend = memory();
    let store = backend.store.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    // manager::check_purge: no clone.
    assert!(origin.clones().await.unwrap().is_empty());
    // Another daemon clones v@s1: it succeeds (the snapshot is there, not deleting).
    volume(&store, "c")
        .create_clone(&origin, "s1", None)
        .await
        .unwrap();
    // The purge takes the snapshots through the delete protocol first: it is refused.
    let purged = origin.purge().await;
    assert!(
        matches!(
            problem(purged.as_ref().unwrap_err()),
            Some(SnapshotProblem::HasClones { .. })
        ),
        "{purged:?}"
    );
    let read = read_clone(&store, "c").await;
    assert!(read.is_ok(), "clone `c` of v@s1 after v's purge: {read:?}");
}

/// (Review finding 7, liveness, not loss.) A snapshot delete that dies after deleting the record and
/// before deleting its `deleting` marker leaves the marker behind (invisible: `snapshot()`
/// answers `None` without a record, so no retry of the delete is possible, it is NotFound).
/// A new snapshot of the same name is then born "deleting": clones of it are refused
/// forever, and it is listed as a delete in progress.
#[tokio::test]
async fn a_new_snapshot_must_not_inherit_a_dead_deletes_marker() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let vs = volume(&store, "v");
    two_generations(&vs).await;
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Delete])
            .path_contains("snapshots/s1/deleting")
            .times(1),
    );
    let first = vs.delete_snapshot("s1").await;
    assert!(
        first.is_err(),
        "the delete dies at its last step: {first:?}"
    );
    assert!(vs.snapshot("s1").await.unwrap().is_none());
    // The name is free again: a new snapshot of the newest generation.
    vs.create_snapshot("s1", 2).await.unwrap();
    let info = vs.snapshot("s1").await.unwrap().unwrap();
    let clone = volume(&store, "c").create_clone(&vs, "s1", None).await;
    assert!(
        !info.deleting && clone.is_ok(),
        "new snapshot v@s1: deleting={}; cloning it: {:?}",
        info.deleting,
        clone.err()
    );
}

/// A store of volume `name` on `store` whose clone deadline is `deadline` (`ZERO`: another
/// host for which every registration is old).
fn with_deadline(store: &Arc<dyn ObjectStore>, name: &str, deadline: Duration) -> VolumeStore {
    VolumeStore::new(
        store.clone(),
        name,
        glidefs_objstore::StoreConfig {
            clone_deadline: deadline,
            ..fast_cfg()
        },
    )
    .unwrap()
}

/// Asserts that `store` holds no object under `prefix`.
async fn assert_nothing_under(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let left: Vec<_> = store
        .list(Some(&Path::from(prefix)))
        .try_collect()
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// `r` without a `Manifest`'s Debug.
fn brief<T>(r: &Result<T, ObjStoreError>) -> String {
    match r {
        Ok(_) => "Ok".into(),
        Err(e) => format!("Err({e})"),
    }
}

/// Releases the held calls of clone `c`'s creation (`creating`) and lets its generation 1
/// land; the creator then dies in its final check (the GET of the snapshot record, held).
async fn clone_lands_then_its_creator_dies(
    faulty: &Arc<FaultyStore>,
    store: &Arc<dyn ObjectStore>,
    creating: tokio::task::JoinHandle<Result<glidefs_objstore::Manifest, ObjStoreError>>,
) {
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Get])
            .path_contains("volumes/v/snapshots/s1/record")
            .times(1),
    );
    faulty.release_held();
    let clone = volume(store, "c");
    tokio::time::timeout(Duration::from_secs(10), async {
        while clone.latest_generation().await.unwrap() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        faulty.wait_held(1).await;
    })
    .await
    .expect("the clone's generation 1 lands and its check is held");
    creating.abort();
    faulty.release_held();
}

/// Clone `c` of v@s1 started on its own task, its generation-1 PUT held in flight.
async fn clone_held_before_its_publish(
    faulty: &Arc<FaultyStore>,
    store: &Arc<dyn ObjectStore>,
) -> tokio::task::JoinHandle<Result<glidefs_objstore::Manifest, ObjStoreError>> {
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("volumes/c/manifest/")
            .times(1),
    );
    let creating = {
        let store = store.clone();
        tokio::spawn(async move {
            let origin = volume(&store, "v");
            volume(&store, "c").create_clone(&origin, "s1", None).await
        })
    };
    faulty.wait_held(1).await;
    creating
}

/// Issue 45, item 2: a clone's final check must ask for *its* snapshot, not for any record of
/// that name. Clone `c` of v@s1 (generation 1) has registered and its generation-1 PUT is in
/// flight; another host, which takes `c`'s registration for a creation that died (its
/// deadline passed), deletes s1 and takes s1 again at generation 2. Before the fix the check
/// found "a record named s1" and reported `c` created, pinned by nothing: GC of `v` then
/// deleted the pack `c` reads (seen failing on aa5c605's protocol: `created Ok`, the read
/// 404).
#[tokio::test]
async fn a_clones_check_must_not_pass_against_a_recreated_snapshot_of_the_same_name() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    let creating = clone_held_before_its_publish(&faulty, &store).await;

    let aged = with_deadline(&store, "v", Duration::ZERO);
    aged.delete_snapshot("s1").await.unwrap();
    aged.create_snapshot("s1", 2).await.unwrap();
    faulty.release_held();
    let created = tokio::time::timeout(Duration::from_secs(10), creating)
        .await
        .expect("clone creation finishes")
        .unwrap();
    origin.gc(collect_all()).await.unwrap();
    let read = read_clone(&store, "c").await;
    assert!(
        created.is_err() || read.is_ok(),
        "clone `c` of v@s1 (generation 1) reported {created:?} though s1 is now generation 2; \
         reading `c` after GC of `v`: {read:?}"
    );
    let e = created.unwrap_err();
    assert_eq!(problem(&e), Some(&SnapshotProblem::Deleting), "{e}");
    assert_eq!(volume(&store, "c").latest_generation().await.unwrap(), 0);
    assert!(origin
        .snapshot("s1")
        .await
        .unwrap()
        .unwrap()
        .clones
        .is_empty());
}

/// Issue 45, item 3: a snapshot delete racing a clone creation whose creator then dies between
/// its publish and its final check. Before the fix the delete cleared the registration (the
/// clone had not published: "a creation that died"), deleted the snapshot, and the clone's
/// generation 1 landed after it: a published clone with no registration and no snapshot, whose
/// packs the origin's GC deleted (seen failing on aa5c605's protocol: the delete `Ok`, the
/// clone's read 404). Now a registration younger than the clone deadline is a creation that
/// may still publish: the delete is refused, and once the clone published, it pins s1.
#[tokio::test]
async fn a_clone_whose_creator_dies_after_publishing_keeps_its_snapshot() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    let creating = clone_held_before_its_publish(&faulty, &store).await;

    let deleted = origin.delete_snapshot("s1").await;
    // The creator's PUT lands; it dies in its final check.
    clone_lands_then_its_creator_dies(&faulty, &store, creating).await;

    let deleted_later = origin.delete_snapshot("s1").await;
    origin.gc(collect_all()).await.unwrap();
    let read = read_clone(&store, "c").await;
    assert!(
        deleted.is_err() && deleted_later.is_err() && read.is_ok(),
        "deleting v@s1 while `c` was created: {deleted:?}; after its creator died: \
         {deleted_later:?}; reading `c` after GC of `v`: {read:?}"
    );
    assert!(
        matches!(
            problem(deleted.as_ref().unwrap_err()),
            Some(SnapshotProblem::ClonesInCreation { .. })
        ),
        "{deleted:?}"
    );
    assert!(
        matches!(
            problem(deleted_later.as_ref().unwrap_err()),
            Some(SnapshotProblem::HasClones { .. })
        ),
        "{deleted_later:?}"
    );
}

/// A reviewer's finding A on 38b18cd: `has_published` reads generation 1 by key and falls
/// back to a listing. Once the clone's own GC pruned generation 1 (any clone older than the
/// GC grace that published twice more), a stale (empty) listing of its manifests made the
/// delete of its snapshot take the registration for a creation that died, clear it and delete
/// the snapshot; GC of the origin then deleted the packs the live clone maps (the read 404).
/// Now a clone's GC keeps its generation 1 for good.
#[tokio::test]
async fn a_stale_listing_of_a_live_clones_manifests_keeps_its_snapshot() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    let clone = volume(&store, "c");
    let m1 = clone.create_clone(&origin, "s1", None).await.unwrap();
    // The clone lives on: it writes a block of its own (its segment is stored again in
    // generation 2's object), publishes once more, and its GC runs (keeping generation 1).
    let own = pattern_pack(&[5], 1, 7);
    clone
        .upload_packs(std::slice::from_ref(&own))
        .await
        .unwrap();
    let mut m2 = next_manifest(&m1, &[&own]);
    clone.publish_manifest(&mut m2).await.unwrap();
    let mut m3 = m2.successor();
    clone.publish_manifest(&mut m3).await.unwrap();
    let report = clone.gc(collect_all()).await.unwrap();
    assert!(report.manifests_retained.contains(&1), "{report:?}");
    // Long after (the registration is older than the clone deadline), another host deletes s1;
    // its listing of the clone's manifests is stale (empty).
    faulty.inject(
        FaultRule::new(Fault::EmptyList)
            .ops(&[Op::List])
            .path_contains("volumes/c/manifest")
            .times(1),
    );
    let later = with_deadline(&store, "v", Duration::ZERO);
    let deleted = later.delete_snapshot("s1").await;
    faulty.clear_faults();
    origin.gc(collect_all()).await.unwrap();
    let read = read_clone(&store, "c").await;
    assert!(
        deleted.is_err() && read.is_ok(),
        "deleting v@s1 under the live clone `c` (generation 3): {}; reading `c` after GC of `v`: {read:?}",
        brief(&deleted)
    );
}

/// A reviewer's finding B on 38b18cd: the creator checked "half the deadline spent" once,
/// *before* `publish_manifest`, whose listing, owner fetch and HEAD of every foreign pack (each
/// retried with backoff) come before the PUT. A slow HEAD let the registration pass the
/// deadline: another host's delete cleared it as a dead creation and deleted s1; the PUT then
/// landed, and the creator died in its final check: a published clone pinned by nothing (its
/// read 404 after GC of `v`). Now the deadline is checked right before the PUT: the creation
/// gives up, sends nothing and undoes.
#[tokio::test]
async fn a_slow_pack_check_past_the_clone_deadline_sends_no_generation_1() {
    let deadline = Duration::from_millis(600);
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = with_deadline(&store, "v", deadline);
    two_generations(&origin).await;
    // The creation's HEAD of pack A (step 3 of its publish) is slow.
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Head])
            .path_contains("volumes/v/packs/")
            .times(1),
    );
    let creating = {
        let store = store.clone();
        tokio::spawn(async move {
            let origin = with_deadline(&store, "v", deadline);
            with_deadline(&store, "c", deadline)
                .create_clone(&origin, "s1", None)
                .await
        })
    };
    faulty.wait_held(1).await;
    // The HEAD takes longer than the deadline; meanwhile another host deletes s1.
    tokio::time::sleep(deadline + Duration::from_millis(200)).await;
    let deleted = origin.delete_snapshot("s1").await;
    faulty.release_held();
    let created = tokio::time::timeout(Duration::from_secs(10), creating)
        .await
        .expect("clone creation finishes")
        .unwrap();
    origin.gc(collect_all()).await.unwrap();
    let clone_generation = volume(&store, "c").latest_generation().await.unwrap();
    let read = read_clone(&store, "c").await;
    assert!(
        deleted.is_err() || clone_generation == 0,
        "deleting v@s1 while `c` was created (its pack HEAD slow, no PUT in flight): {};          the creation: {}; `c` at generation {clone_generation}; reading `c` after GC of `v`:          {read:?}",
        brief(&deleted),
        brief(&created)
    );
    assert!(deleted.is_ok(), "{}", brief(&deleted));
    let e = created.unwrap_err();
    assert!(
        matches!(problem(&e), Some(SnapshotProblem::CloneDeadline { .. })),
        "{e}"
    );
    assert_nothing_under(&store, "volumes/c").await;
}

/// A reviewer's finding C on 38b18cd: two owner-less creations of the same clone name from the
/// same snapshot publish byte-identical generation-1 manifests, so both publishes succeed;
/// they share one registration key. The second one's final check saw a delete in progress and
/// undid: it deleted generation 1 (whose object holds the frames X's later generations point
/// at) and the registration the first (reported created) clone relies on; `c` no longer
/// loaded. Now a creation undoes only a generation 1 its own PUT created, or one no
/// registration pins.
#[tokio::test]
async fn a_twin_creations_undo_keeps_the_clone_that_was_created() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    // Creation Y (another host, same name) starts: it found `c` without manifests and is
    // slow reading the snapshot's manifest.
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Get])
            .path_contains("volumes/v/manifest/")
            .times(1),
    );
    let y = {
        let store = store.clone();
        tokio::spawn(async move {
            let origin = volume(&store, "v");
            volume(&store, "c").create_clone(&origin, "s1", None).await
        })
    };
    faulty.wait_held(1).await;
    // Creation X completes: `c` is created and registered.
    let x = volume(&store, "c");
    let m = x.create_clone(&origin, "s1", None).await.unwrap();
    // Y goes on: registers (the same key), writes the origin, its publish finds X's
    // byte-identical generation 1 (Ok); the GET comparing them is held.
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Get])
            .path_contains("volumes/c/manifest/")
            .times(1),
    );
    faulty.release_held();
    tokio::time::timeout(Duration::from_secs(10), faulty.wait_held(1))
        .await
        .expect("Y's publish compares the stored generation 1");
    // A delete of s1 writes its marker, sees `c` published and is refused (correctly); its
    // removal of the marker is slow, and Y's final check reads the marker meanwhile.
    faulty.inject(
        FaultRule::new(Fault::Stall(Duration::from_secs(2)))
            .ops(&[Op::Delete])
            .path_contains("volumes/v/snapshots/s1/deleting")
            .times(1),
    );
    let deleting = {
        let store = store.clone();
        tokio::spawn(async move { volume(&store, "v").delete_snapshot("s1").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    faulty.release_held();
    let y = tokio::time::timeout(Duration::from_secs(10), y)
        .await
        .expect("y ends")
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), deleting)
        .await
        .expect("delete ends")
        .unwrap();
    faulty.clear_faults();
    // X's clone goes on (its handle publishes generation 2, the same map).
    let mut m2 = m.successor();
    let published = x.publish_manifest(&mut m2).await;
    let deleted = origin.delete_snapshot("s1").await;
    origin.gc(collect_all()).await.unwrap();
    let read = read_clone(&store, "c").await;
    assert!(
        deleted.is_err() || read.is_ok(),
        "X created `c`; twin Y: {}; first delete: {}; X's next publish: {}; second delete: {}; \
         reading `c` after GC of `v`: {read:?}",
        brief(&y),
        brief(&first),
        brief(&published),
        brief(&deleted)
    );
}

/// A store of volume `name` on `store` whose view lease is `lease`.
fn with_lease(store: &Arc<dyn ObjectStore>, name: &str, lease: Duration) -> VolumeStore {
    VolumeStore::new(
        store.clone(),
        name,
        glidefs_objstore::StoreConfig {
            view_lease: lease,
            ..fast_cfg()
        },
    )
    .unwrap()
}

/// Item 5 (issue 45): a view registered under its snapshot blocks its delete, naming its
/// holder; once it unregisters (closes), the delete proceeds and clears nothing else.
#[tokio::test]
async fn a_registered_view_blocks_the_delete_until_it_unregisters() {
    let store = memory().store;
    let vs = volume(&store, "v");
    two_generations(&vs).await;
    let b = volume(&store, "v");
    let id = b
        .register_view("s1", 1, "host-b/1", "/var/lib/glidefs/b")
        .await
        .unwrap();
    let views = vs.views("s1").await.unwrap();
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].registration.holder, "host-b/1");
    let err = vs.delete_snapshot("s1").await.unwrap_err();
    assert_eq!(
        problem(&err),
        Some(&SnapshotProblem::Attached {
            holders: vec!["host-b/1".into()]
        }),
        "{err}"
    );
    assert!(err.to_string().contains("host-b/1"), "{err}");
    let info = vs.snapshot("s1").await.unwrap().unwrap();
    assert!(!info.deleting, "a refused delete leaves no marker");
    // Registering again from the same instance is the same registration (a crash, reopen).
    let again = b
        .register_view("s1", 1, "host-b/1", "/var/lib/glidefs/b")
        .await
        .unwrap();
    assert_eq!(again, id);
    assert_eq!(vs.views("s1").await.unwrap().len(), 1);

    b.unregister_view("s1", &id).await.unwrap();
    vs.delete_snapshot("s1").await.unwrap();
    assert_nothing_under(&store, "volumes/v/snapshots/s1").await;
}

/// A registration not renewed for its lease (by the store's clock) is a holder that died: it
/// blocks no delete and is cleared by it.
#[tokio::test]
async fn an_expired_view_registration_does_not_block_a_delete() {
    let store = memory().store;
    let vs = volume(&store, "v");
    two_generations(&vs).await;
    with_lease(&store, "v", Duration::from_millis(50))
        .register_view("s1", 1, "host-dead/1", "/d")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    vs.delete_snapshot("s1").await.unwrap();
    assert_nothing_under(&store, "volumes/v/snapshots/s1").await;
}

/// An operator clears a dead holder's registrations at once; another holder's stay and still
/// block the delete.
#[tokio::test]
async fn an_operator_clears_a_dead_holders_view_registrations() {
    let store = memory().store;
    let vs = volume(&store, "v");
    two_generations(&vs).await;
    for (holder, dir) in [("dead/1", "/a"), ("dead/1", "/b"), ("alive/2", "/c")] {
        vs.register_view("s1", 1, holder, dir).await.unwrap();
    }
    let err = vs.delete_snapshot("s1").await.unwrap_err();
    assert_eq!(
        problem(&err),
        Some(&SnapshotProblem::Attached {
            holders: vec!["alive/2".into(), "dead/1".into()]
        }),
        "{err}"
    );
    assert_eq!(vs.clear_views("s1", Some("dead/1")).await.unwrap().len(), 2);
    let err = vs.delete_snapshot("s1").await.unwrap_err();
    assert_eq!(
        problem(&err),
        Some(&SnapshotProblem::Attached {
            holders: vec!["alive/2".into()]
        })
    );
    assert_eq!(vs.clear_views("s1", None).await.unwrap().len(), 1);
    vs.delete_snapshot("s1").await.unwrap();
}

/// The race: a delete wrote its `deleting` marker and listed no view, then a view registers
/// (its PUT lands after the delete's listing). The view's check after registering sees the
/// marker and backs out, leaving no registration: it never reads a snapshot whose delete
/// goes on to completion. Likewise a view registering after the record went, or against a
/// snapshot of the same name at another generation.
#[tokio::test]
async fn a_view_registering_after_a_deletes_listing_backs_out() {
    let store = memory().store;
    let vs = volume(&store, "v");
    two_generations(&vs).await;
    // The delete's first step, then it is suspended after its listing.
    store
        .put(
            &Path::from("volumes/v/snapshots/s1/deleting"),
            "deleting\n".into(),
        )
        .await
        .unwrap();
    let err = vs.register_view("s1", 1, "b", "/b").await.unwrap_err();
    assert_eq!(problem(&err), Some(&SnapshotProblem::Deleting), "{err}");
    assert!(vs.views("s1").await.unwrap().is_empty(), "backed out");
    // The delete resumes and completes.
    vs.delete_snapshot("s1").await.unwrap();
    let err = vs.register_view("s1", 1, "b", "/b").await.unwrap_err();
    assert_eq!(problem(&err), Some(&SnapshotProblem::NotFound), "{err}");
    assert!(vs.views("s1").await.unwrap().is_empty(), "backed out");
    // Taken again at generation 2: a view of generation 1 does not register against it.
    vs.create_snapshot("s1", 2).await.unwrap();
    let err = vs.register_view("s1", 1, "b", "/b").await.unwrap_err();
    assert_eq!(problem(&err), Some(&SnapshotProblem::Deleting), "{err}");
    assert!(vs.views("s1").await.unwrap().is_empty(), "backed out");
}
