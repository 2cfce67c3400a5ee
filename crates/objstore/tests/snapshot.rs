//! Snapshots pin their generation against GC; clones read their origin's packs, never delete
//! them, and keep the snapshot they come from from being deleted.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use futures::TryStreamExt;
use glidefs_objstore::{ErrorKind, GcOptions, ObjStoreError, SnapshotProblem, VolumeStore};
use glidefs_testkit::verify_block;
use object_store::path::Path;
use object_store::ObjectStoreExt;

fn collect_all() -> GcOptions {
    GcOptions {
        grace: Duration::ZERO,
        dry_run: false,
        keep_manifests: 1,
        now: Some(std::time::SystemTime::now() + Duration::from_secs(3600)),
    }
}

async fn packs_of(vs: &VolumeStore, volume: &str) -> BTreeSet<String> {
    vs.object_store()
        .list(Some(&Path::from(format!("volumes/{volume}/packs"))))
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .iter()
        .map(|m| m.location.filename().unwrap_or_default().to_string())
        .collect()
}

fn problem(e: &ObjStoreError) -> Option<&SnapshotProblem> {
    match e {
        ObjStoreError::Snapshot { problem, .. } => Some(problem),
        _ => None,
    }
}

/// Generation 1 maps blocks 0..4 to pack A (pattern generation 1); generation 2 rewrites all
/// of them into pack B (pattern generation 2).
async fn two_generations(vs: &VolumeStore) -> (String, String) {
    vs.load_manifest().await.unwrap();
    let a = pattern_pack(&[0, 1, 2, 3], 1, 0);
    vs.upload_packs(std::slice::from_ref(&a)).await.unwrap();
    let mut m1 = next_manifest(&empty("v"), &[&a]);
    vs.publish_manifest(&mut m1).await.unwrap();
    vs.create_snapshot("s1", 1).await.unwrap();
    // Snapshots name the newest generation only.
    let b = pattern_pack(&[0, 1, 2, 3], 2, 0);
    vs.upload_packs(std::slice::from_ref(&b)).await.unwrap();
    let mut m2 = next_manifest(&m1, &[&b]);
    vs.publish_manifest(&mut m2).await.unwrap();
    (format!("{}.pack", a.id), format!("{}.pack", b.id))
}

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
        let objects: Vec<_> = backend
            .store
            .list(Some(&Path::from("volumes/c")))
            .try_collect()
            .await
            .unwrap();
        let from = reader.origin().await.unwrap().unwrap();
        for o in objects {
            backend.store.delete(&o.location).await.unwrap();
        }
        reader.unregister_clone(&from).await.unwrap();
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
    // A registration left by a creation that died before publishing does not block a delete.
    origin.create_snapshot("s2", 2).await.unwrap();
    backend
        .store
        .put(
            &Path::from("volumes/v/snapshots/s2/clones/ghost"),
            bytes::Bytes::from_static(b"ghost").into(),
        )
        .await
        .unwrap();
    origin.delete_snapshot("s2").await.unwrap();
    let left: Vec<_> = backend
        .store
        .list(Some(&Path::from("volumes/v/snapshots")))
        .try_collect()
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
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
