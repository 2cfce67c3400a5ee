//! Manifest format 2 on every backend: a publish writes only the segments that changed, a
//! load assembles segments from older objects, format 1 still loads (and the next publish
//! migrates it), and GC keeps the older objects a retained manifest points into.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_objstore::{GcOptions, Manifest, ManifestOwner, VolumeStore, SEGMENT_BLOCKS};
use glidefs_testkit::verify_block;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

const BLOCKS: u64 = 4 * SEGMENT_BLOCKS;

fn manifest_path(generation: u64) -> Path {
    Path::from(format!("volumes/v2/manifest/{generation:020}"))
}

async fn object_size(store: &Arc<dyn ObjectStore>, generation: u64) -> u64 {
    store.head(&manifest_path(generation)).await.unwrap().size
}

fn empty_v2() -> Manifest {
    Manifest::new("v2", BS, BLOCKS * u64::from(BS))
}

/// Every block of `m` reads back with the pattern of the generation `gen_of` names.
async fn assert_blocks(vs: &VolumeStore, m: &Manifest, gen_of: impl Fn(u64) -> u64) {
    for (blk, loc) in m.iter() {
        let data = vs.read_block(blk, loc).await.unwrap();
        verify_block(blk, gen_of(blk), &data).unwrap();
    }
}

#[tokio::test]
async fn only_changed_segments_are_written_and_loads_assemble_them() {
    for backend in [memory(), local(), s3().await] {
        let name = backend.name;
        let vs = VolumeStore::new(backend.store.clone(), "v2", fast_cfg()).unwrap();
        vs.load_manifest().await.unwrap();
        // Generation 1: two blocks in each of the four segments.
        let spread: Vec<u64> = (0..4)
            .flat_map(|s| [s * SEGMENT_BLOCKS, s * SEGMENT_BLOCKS + 7])
            .collect();
        let p1 = pattern_pack(&spread, 1, 0);
        vs.upload_packs(std::slice::from_ref(&p1)).await.unwrap();
        let mut m1 = next_manifest(&empty_v2(), &[&p1]);
        vs.publish_manifest(&mut m1).await.unwrap();
        // Generation 2: one block of segment 2 changes.
        let p2 = pattern_pack(&[2 * SEGMENT_BLOCKS + 7], 2, 0);
        vs.upload_packs(std::slice::from_ref(&p2)).await.unwrap();
        let mut m2 = next_manifest(&m1, &[&p2]);
        vs.publish_manifest(&mut m2).await.unwrap();
        // Generation 3: nothing changes (a root only).
        let mut m3 = next_manifest(&m2, &[]);
        vs.publish_manifest(&mut m3).await.unwrap();
        let (s1, s2, s3) = (
            object_size(&backend.store, 1).await,
            object_size(&backend.store, 2).await,
            object_size(&backend.store, 3).await,
        );
        assert!(s2 < s1 && s3 < s2, "{name}: sizes {s1} {s2} {s3}");
        let one_frame = s2 - s3;
        assert!(
            s1 - s3 >= 3 * one_frame,
            "{name}: generation 1 holds four frames ({s1} bytes), 2 one ({s2}), 3 none ({s3})"
        );

        let reader = VolumeStore::new(backend.store.clone(), "v2", fast_cfg()).unwrap();
        let loaded = reader.load_manifest().await.unwrap().unwrap();
        assert_eq!(loaded, m3, "{name}");
        assert_eq!(loaded.len(), 8);
        assert_blocks(&reader, &loaded, |b| {
            if b == 2 * SEGMENT_BLOCKS + 7 {
                2
            } else {
                1
            }
        })
        .await;
        // A reader's successor points at the same frames: publishing it writes a root only.
        let mut m4 = loaded.successor();
        reader.publish_manifest(&mut m4).await.unwrap();
        assert_eq!(object_size(&backend.store, 4).await, s3, "{name}");
        assert_eq!(reader.fetch_manifest(2).await.unwrap(), m2, "{name}");
    }
}

/// A format-1 manifest (written by an older build) loads; the next publish writes every
/// segment again in format 2, after which the old object is no longer needed.
#[tokio::test]
async fn format_1_loads_and_the_next_publish_migrates_it() {
    let backend = memory();
    let vs = VolumeStore::new(backend.store.clone(), "v2", fast_cfg()).unwrap();
    vs.load_manifest().await.unwrap();
    let p1 = pattern_pack(&[1, SEGMENT_BLOCKS + 1, 3 * SEGMENT_BLOCKS], 1, 0);
    vs.upload_packs(std::slice::from_ref(&p1)).await.unwrap();
    let m1 = next_manifest(&empty_v2(), &[&p1]);
    backend
        .store
        .put_opts(
            &manifest_path(1),
            PutPayload::from(m1.encode_v1().unwrap()),
            PutOptions::from(PutMode::Create),
        )
        .await
        .unwrap();
    let loaded = vs.load_manifest().await.unwrap().unwrap();
    assert_eq!(loaded, m1);
    assert_blocks(&vs, &loaded, |_| 1).await;
    let mut m2 = loaded.successor();
    vs.publish_manifest(&mut m2).await.unwrap();
    assert!(object_size(&backend.store, 2).await > object_size(&backend.store, 1).await / 2);
    let report = vs
        .gc(GcOptions {
            grace: Duration::ZERO,
            keep_manifests: 1,
            ..GcOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(
        report.manifests_deleted,
        vec![1],
        "generation 2 is self-contained"
    );
    let reader = VolumeStore::new(backend.store.clone(), "v2", fast_cfg()).unwrap();
    let m = reader.load_manifest().await.unwrap().unwrap();
    assert_eq!(m, m2);
    assert_blocks(&reader, &m, |_| 1).await;
}

/// GC keeps an old manifest object while the latest points into it, and its packs.
#[tokio::test]
async fn gc_keeps_objects_holding_live_segments() {
    let backend = memory();
    let vs = VolumeStore::new(backend.store.clone(), "v2", fast_cfg()).unwrap();
    vs.load_manifest().await.unwrap();
    let p1 = pattern_pack(&[1, SEGMENT_BLOCKS + 1], 1, 0);
    vs.upload_packs(std::slice::from_ref(&p1)).await.unwrap();
    let mut m1 = next_manifest(&empty_v2(), &[&p1]);
    vs.publish_manifest(&mut m1).await.unwrap();
    let p2 = pattern_pack(&[1], 2, 0);
    vs.upload_packs(std::slice::from_ref(&p2)).await.unwrap();
    let mut m2 = next_manifest(&m1, &[&p2]);
    vs.publish_manifest(&mut m2).await.unwrap();
    let mut m3 = next_manifest(&m2, &[]);
    vs.publish_manifest(&mut m3).await.unwrap();
    let report = vs
        .gc(GcOptions {
            grace: Duration::ZERO,
            keep_manifests: 1,
            ..GcOptions::default()
        })
        .await
        .unwrap();
    // 3 points at segment 0 in 2 and segment 1 in 1.
    assert_eq!(report.manifests_retained, vec![1, 2, 3]);
    assert!(report.manifests_deleted.is_empty());
    assert!(
        report.packs_deleted.is_empty(),
        "p1 still holds block SEGMENT_BLOCKS + 1"
    );
    let reader = VolumeStore::new(backend.store.clone(), "v2", fast_cfg()).unwrap();
    let m = reader.load_manifest().await.unwrap().unwrap();
    assert_eq!(m, m3);
    assert_blocks(&reader, &m, |b| if b == 1 { 2 } else { 1 }).await;
}

/// The owner record of the root survives a load whose segments lie in older objects, a
/// release is recorded, and a publish without an owner clears it (the bytes of an owner-less
/// object are what builds before owners wrote).
#[tokio::test]
async fn owner_record_round_trips_on_every_backend() {
    for backend in all_backends().await {
        let name = backend.name;
        let vs = VolumeStore::new(backend.store.clone(), "v2", fast_cfg()).unwrap();
        vs.load_manifest().await.unwrap();
        let owner = |claimed_at, released| {
            Some(ManifestOwner {
                id: "host-a/0001".into(),
                claimed_at,
                released,
            })
        };
        let p1 = pattern_pack(&[1, SEGMENT_BLOCKS + 1], 1, 0);
        vs.upload_packs(std::slice::from_ref(&p1)).await.unwrap();
        let mut m1 = next_manifest(&empty_v2(), &[&p1]);
        m1.owner = owner(1, false);
        vs.publish_manifest(&mut m1).await.unwrap();
        // Generation 2 writes a root only; the owner is carried by `successor`.
        let mut m2 = m1.successor();
        assert_eq!(m2.owner, owner(1, false));
        vs.publish_manifest(&mut m2).await.unwrap();
        let reader = VolumeStore::new(backend.store.clone(), "v2", fast_cfg()).unwrap();
        let loaded = reader.load_manifest().await.unwrap().unwrap();
        assert_eq!(loaded.owner, owner(1, false), "{name}");
        assert_eq!(loaded, m2, "{name}");
        // A release.
        let mut m3 = loaded.successor();
        m3.owner.as_mut().unwrap().released = true;
        reader.publish_manifest(&mut m3).await.unwrap();
        assert_eq!(
            vs.fetch_manifest(3).await.unwrap().owner,
            owner(1, true),
            "{name}"
        );
        // A writer without an owner id publishes no record.
        let mut m4 = m3.successor();
        m4.owner = None;
        reader.publish_manifest(&mut m4).await.unwrap();
        let last = VolumeStore::new(backend.store.clone(), "v2", fast_cfg())
            .unwrap()
            .load_manifest()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(last.owner, None, "{name}");
        assert_eq!(last, m4, "{name}");
        assert_blocks(&reader, &last, |_| 1).await;
    }
}
