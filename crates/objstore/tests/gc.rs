//! Garbage collection: referenced packs survive, old unreferenced ones go, young ones wait.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use common::*;
use futures::TryStreamExt;
use glidefs_objstore::{GcOptions, PackId, VolumeStore};
use glidefs_testkit::verify_block;
use object_store::path::Path;
use object_store::ObjectMeta;

/// The listing of the volume's pack directory (what GC sees).
async fn pack_listing(vs: &VolumeStore) -> Vec<ObjectMeta> {
    vs.object_store()
        .list(Some(&Path::from("volumes/v/packs")))
        .try_collect()
        .await
        .unwrap()
}

async fn stored_packs(vs: &VolumeStore) -> BTreeSet<String> {
    pack_listing(vs)
        .await
        .iter()
        .map(|m| m.location.filename().unwrap_or_default().to_string())
        .collect()
}

fn file(id: &PackId) -> String {
    format!("{id}.pack")
}

/// Last-modified time of a pack as the listing (which GC uses) reports it.
async fn modified(vs: &VolumeStore, id: &PackId) -> SystemTime {
    let meta = pack_listing(vs)
        .await
        .into_iter()
        .find(|m| m.location.filename() == Some(file(id).as_str()))
        .expect("pack listed");
    SystemTime::from(meta.last_modified)
}

/// Given: generation 1 references packs A and B; generation 2 rewrites A's blocks into C, so A
/// is only referenced by the old manifest; D is an orphan uploaded long ago; E is an orphan
/// uploaded just now (an in-flight flush).
async fn scenario(backend: &Backend) -> (VolumeStore, [PackId; 5]) {
    let vs = volume(&backend.store, "v");
    vs.load_manifest().await.unwrap();
    let a = pattern_pack(&[0, 1], 1, 0);
    let b = pattern_pack(&[2], 1, 1);
    let d = pattern_pack(&[9], 1, 2);
    vs.upload_packs(&[a.clone(), b.clone(), d.clone()])
        .await
        .unwrap();
    let mut m1 = next_manifest(&empty("v"), &[&a, &b]);
    vs.publish_manifest(&mut m1).await.unwrap();
    let c = pattern_pack(&[0, 1], 2, 0);
    vs.upload_packs(std::slice::from_ref(&c)).await.unwrap();
    let mut m2 = next_manifest(&m1, &[&c]);
    vs.publish_manifest(&mut m2).await.unwrap();
    // Leave a clear gap in store time before the young orphan.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let e = pattern_pack(&[5], 3, 0);
    vs.upload_packs(std::slice::from_ref(&e)).await.unwrap();
    (vs, [a.id, b.id, c.id, d.id, e.id])
}

#[tokio::test]
async fn gc_keeps_referenced_and_young_packs_and_deletes_old_orphans() {
    for backend in [memory(), local(), s3().await] {
        let (vs, [a, b, c, d, e]) = scenario(&backend).await;
        // "Now" is 10 s after E was written and grace is 10.5 s: E is young, while manifest 1
        // and pack D, written more than a second before E, are old.
        let now = modified(&vs, &e).await + Duration::from_secs(10);
        let grace = Duration::from_millis(10_500);
        let opts = GcOptions {
            grace,
            dry_run: true,
            keep_manifests: 1,
            now: Some(now),
        };
        let before = stored_packs(&vs).await;
        let dry = vs.gc(opts.clone()).await.unwrap();
        assert_eq!(
            stored_packs(&vs).await,
            before,
            "{}: dry run deletes nothing",
            backend.name
        );
        assert_eq!(vs.latest_generation().await.unwrap(), 2);
        assert!(dry.dry_run);
        assert_eq!(dry.manifests_deleted, vec![1]);
        assert_eq!(dry.manifests_retained, vec![2]);
        assert_eq!(dry.packs_deleted, {
            let mut v = vec![a.clone(), d.clone()];
            v.sort();
            v
        });
        assert_eq!(dry.packs_in_grace, 1, "E");
        assert_eq!(dry.packs_referenced, 2, "B and C");
        assert_eq!(dry.deleted_keys.len(), 3);
        assert!(dry.deleted_keys[0].ends_with("manifest/00000000000000000001"));
        assert!(dry.bytes_deleted > 0);

        let real = vs
            .gc(GcOptions {
                dry_run: false,
                ..opts
            })
            .await
            .unwrap();
        assert_eq!(
            (real.manifests_deleted.clone(), real.packs_deleted.clone()),
            (dry.manifests_deleted.clone(), dry.packs_deleted.clone()),
            "{}: the real pass does what the dry run said",
            backend.name
        );
        let left = stored_packs(&vs).await;
        let expected: BTreeSet<String> = [&b, &c, &e].into_iter().map(file).collect();
        assert_eq!(left, expected, "{}", backend.name);

        // The volume still reads back completely from generation 2.
        let reader = volume(&backend.store, "v");
        let m = reader.load_manifest().await.unwrap().unwrap();
        assert_eq!(m.generation, 2);
        assert!(
            reader.fetch_manifest(1).await.is_err(),
            "generation 1 pruned"
        );
        for (blk, loc) in m.iter() {
            let g = if blk == 2 { 1 } else { 2 };
            verify_block(blk, g, &reader.read_block(blk, loc).await.unwrap()).unwrap();
        }
    }
}

#[tokio::test]
async fn keeping_manifests_keeps_their_packs_and_grace_protects_everything_young() {
    let backend = memory();
    let (vs, [a, _b, _c, d, e]) = scenario(&backend).await;
    // Default grace (1 h): everything was written seconds ago, nothing goes.
    let report = vs
        .gc(GcOptions {
            keep_manifests: 1,
            ..GcOptions::default()
        })
        .await
        .unwrap();
    assert!(report.packs_deleted.is_empty() && report.manifests_deleted.is_empty());
    assert_eq!(
        report.manifests_retained,
        vec![1, 2],
        "young manifests are kept"
    );
    assert_eq!(stored_packs(&vs).await.len(), 5);

    // Zero grace, keep 2 manifests: A is still referenced by generation 1 and survives.
    let report = vs
        .gc(GcOptions {
            grace: Duration::ZERO,
            keep_manifests: 2,
            ..GcOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(
        report.packs_deleted,
        vec![d],
        "D is old enough now; E, stored after the newest manifest, may still be published"
    );
    assert!(stored_packs(&vs).await.contains(&file(&a)));
    assert!(stored_packs(&vs).await.contains(&file(&e)));
    assert_eq!(report.packs_in_grace, 1, "E");
}

/// A flush uploaded pack P after the newest manifest and has not published yet (a long
/// catch-up flush, an outage between upload and publish). GC with zero grace and a clock a
/// day ahead of the store keeps P; the manifest published afterwards reads back completely,
/// and only then does the pack it replaced go.
#[tokio::test]
async fn packs_stored_after_the_newest_manifest_survive_any_grace_and_gc_clock() {
    for backend in [memory(), local(), s3().await] {
        let vs = volume(&backend.store, "v");
        vs.load_manifest().await.unwrap();
        let a = pattern_pack(&[0, 1], 1, 0);
        vs.upload_packs(std::slice::from_ref(&a)).await.unwrap();
        let mut m1 = next_manifest(&empty("v"), &[&a]);
        vs.publish_manifest(&mut m1).await.unwrap();
        let p = pattern_pack(&[0, 1], 2, 0);
        vs.upload_packs(std::slice::from_ref(&p)).await.unwrap();
        let opts = GcOptions {
            grace: Duration::ZERO,
            dry_run: false,
            keep_manifests: 1,
            now: Some(SystemTime::now() + Duration::from_secs(86_400)),
        };
        let report = vs.gc(opts.clone()).await.unwrap();
        assert!(
            report.packs_deleted.is_empty(),
            "{}: GC deleted {:?}, a pack not yet published",
            backend.name,
            report.packs_deleted
        );
        assert_eq!(report.packs_in_grace, 1, "{}", backend.name);
        // Store time moves on (second-granularity backends) before the next publish.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let mut m2 = next_manifest(&m1, &[&p]);
        vs.publish_manifest(&mut m2).await.unwrap();
        let reader = volume(&backend.store, "v");
        let m = reader.load_manifest().await.unwrap().unwrap();
        assert_eq!(m.generation, 2);
        for (blk, loc) in m.iter() {
            verify_block(blk, 2, &reader.read_block(blk, loc).await.unwrap()).unwrap();
        }
        let report = vs.gc(opts).await.unwrap();
        assert_eq!(report.packs_deleted, vec![a.id], "{}", backend.name);
        assert_eq!(stored_packs(&vs).await, BTreeSet::from([file(&p.id)]));
    }
}
