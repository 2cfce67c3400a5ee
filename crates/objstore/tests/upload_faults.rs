//! Uploads and publishes under injected faults (FaultyStore over InMemory).

mod common;

use std::sync::Arc;

use common::*;
use glidefs_objstore::{ErrorKind, ObjStoreError, StoreConfig, VolumeStore};
use glidefs_testkit::{verify_block, Fault, FaultRule, FaultyStore, Op};
use object_store::memory::InMemory;
use object_store::ObjectStore;

fn faulty() -> (Arc<FaultyStore>, VolumeStore) {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let vs = VolumeStore::new(faulty.clone() as Arc<dyn ObjectStore>, "v", fast_cfg()).unwrap();
    (faulty, vs)
}

async fn assert_readable(vs: &VolumeStore, generation: u64) {
    let m = vs
        .fetch_manifest(vs.latest_generation().await.unwrap())
        .await
        .unwrap();
    for (blk, loc) in m.iter() {
        let data = vs.read_block(blk, loc).await.unwrap();
        verify_block(blk, generation, &data).unwrap();
    }
}

#[tokio::test]
async fn transient_put_faults_are_retried_and_succeed() {
    let (faulty, vs) = faulty();
    let packs: Vec<_> = (0..8)
        .map(|i| pattern_pack(&[i * 2, i * 2 + 1], 1, i))
        .collect();
    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::Put]).times(6));
    faulty.inject(
        FaultRule::new(Fault::FailAfterBytes(100))
            .ops(&[Op::Put])
            .times(2),
    );
    vs.upload_packs(&packs)
        .await
        .expect("retries absorb transient faults");
    let refs: Vec<_> = packs.iter().collect();
    vs.publish_manifest(&mut next_manifest(&empty("v"), &refs))
        .await
        .unwrap();
    let counts = faulty.counts();
    assert_eq!(counts.faults_injected, 8);
    assert_eq!(
        counts.calls(Op::Put),
        8 + 8 + 1,
        "8 packs + 8 retries + manifest"
    );
    let stored: u64 = packs.iter().map(|p| p.bytes.len() as u64).sum();
    assert!(counts.put_bytes > stored, "packs and manifest stored");
    assert_readable(&vs, 1).await;
}

#[tokio::test]
async fn permanent_fault_surfaces_without_retries_and_nothing_is_published() {
    let (faulty, vs) = faulty();
    let packs: Vec<_> = (0..3).map(|i| pattern_pack(&[i], 1, i)).collect();
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("packs"),
    );
    let err = vs.upload_packs(&packs).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Permanent, "{err}");
    assert!(
        matches!(err, ObjStoreError::Store { attempts: 1, .. }),
        "{err}"
    );
    // The engine would now skip the publish; if it tried anyway, the invariant check stops it.
    faulty.clear_faults();
    let refs: Vec<_> = packs.iter().collect();
    let err = vs
        .publish_manifest(&mut next_manifest(&empty("v"), &refs))
        .await
        .unwrap_err();
    assert!(matches!(err, ObjStoreError::MissingPack { .. }), "{err}");
    assert_eq!(vs.latest_generation().await.unwrap(), 0);
}

#[tokio::test]
async fn transient_faults_beyond_the_retry_budget_surface_as_transient() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let cfg = StoreConfig {
        max_retries: 2,
        ..fast_cfg()
    };
    let vs = VolumeStore::new(faulty.clone() as Arc<dyn ObjectStore>, "v", cfg).unwrap();
    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::Put]));
    let err = vs
        .upload_packs(&[pattern_pack(&[0], 1, 0)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient);
    assert!(
        matches!(err, ObjStoreError::Store { attempts: 3, .. }),
        "{err}"
    );
    assert_eq!(faulty.counts().calls(Op::Put), 3);
}

#[tokio::test]
async fn lost_acknowledgement_of_a_pack_put_is_harmless() {
    let (faulty, vs) = faulty();
    let pack = pattern_pack(&[3, 4], 1, 0);
    faulty.inject(FaultRule::new(Fault::LostAck).ops(&[Op::Put]).times(1));
    vs.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
    assert_eq!(
        faulty.counts().calls(Op::Put),
        2,
        "re-put after the lost ack"
    );
    vs.publish_manifest(&mut next_manifest(&empty("v"), &[&pack]))
        .await
        .unwrap();
    assert_readable(&vs, 1).await;
}

#[tokio::test]
async fn lost_acknowledgement_of_a_manifest_publish_is_recognised_as_success() {
    let (faulty, vs) = faulty();
    vs.load_manifest().await.unwrap();
    let pack = pattern_pack(&[7], 1, 0);
    vs.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::LostAck)
            .ops(&[Op::Put])
            .path_contains("manifest")
            .times(1),
    );
    let mut m1 = next_manifest(&empty("v"), &[&pack]);
    vs.publish_manifest(&mut m1)
        .await
        .expect("our own landed manifest is success");
    assert_eq!(
        faulty.counts().calls(Op::Put),
        3,
        "pack + lost manifest put + retry"
    );
    assert_eq!(vs.fetch_manifest(1).await.unwrap(), m1);
    // And the writer can continue with generation 2.
    vs.publish_manifest(&mut next_manifest(&m1, &[]))
        .await
        .unwrap();
    assert_eq!(vs.latest_generation().await.unwrap(), 2);
}

#[tokio::test]
async fn publish_refuses_a_manifest_pointing_at_a_missing_pack() {
    let (faulty, vs) = faulty();
    let uploaded = pattern_pack(&[0], 1, 0);
    let never_uploaded = pattern_pack(&[1], 1, 1);
    vs.upload_packs(std::slice::from_ref(&uploaded))
        .await
        .unwrap();
    let mut m = next_manifest(&empty("v"), &[&uploaded, &never_uploaded]);
    let err = vs.publish_manifest(&mut m).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(
        err.to_string().contains(never_uploaded.id.as_str()),
        "names the pack: {err}"
    );
    assert_eq!(
        faulty.counts().calls(Op::Head),
        1,
        "only the unknown pack is checked"
    );

    // A pack uploaded by another process is verified with a HEAD and accepted.
    let other = VolumeStore::new(faulty.clone() as Arc<dyn ObjectStore>, "v", fast_cfg()).unwrap();
    other
        .upload_packs(std::slice::from_ref(&never_uploaded))
        .await
        .unwrap();
    vs.publish_manifest(&mut m).await.unwrap();
    assert_readable(&vs, 1).await;
}

#[tokio::test]
async fn random_transient_faults_on_every_operation_still_converge() {
    let faulty = Arc::new(FaultyStore::with_seed(Arc::new(InMemory::new()), 7));
    let vs = VolumeStore::new(
        faulty.clone() as Arc<dyn ObjectStore>,
        "v",
        StoreConfig {
            max_retries: 10,
            ..fast_cfg()
        },
    )
    .unwrap();
    faulty.inject(FaultRule::new(Fault::Transient).probability(0.2));
    faulty.inject(
        FaultRule::new(Fault::LostAck)
            .ops(&[Op::Put])
            .probability(0.1),
    );
    let mut current = vs
        .load_manifest()
        .await
        .unwrap()
        .unwrap_or_else(|| empty("v"));
    for generation in 1..=5u64 {
        let pack = pattern_pack(&[generation, generation + 10], generation, 0);
        vs.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
        let mut next = next_manifest(&current, &[&pack]);
        vs.publish_manifest(&mut next).await.unwrap();
        current = next;
    }
    faulty.clear_faults();
    assert!(faulty.counts().faults_injected > 0);
    let reader = volume(faulty.inner(), "v");
    let m = reader.load_manifest().await.unwrap().unwrap();
    assert_eq!(m, current);
    for (blk, loc) in m.iter() {
        let g = if blk > 10 { blk - 10 } else { blk };
        verify_block(blk, g, &reader.read_block(blk, loc).await.unwrap()).unwrap();
    }
}

/// Given a manifest put that landed but whose every reply was lost, when the publish fails and
/// is called again with the same manifest, then it succeeds (and a different one is fenced).
#[tokio::test]
async fn publish_is_idempotent_after_an_ambiguous_failure() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let cfg = StoreConfig {
        max_retries: 2,
        ..fast_cfg()
    };
    let vs = VolumeStore::new(faulty.clone() as Arc<dyn ObjectStore>, "v", cfg).unwrap();
    vs.load_manifest().await.unwrap();
    let pack = pattern_pack(&[1], 1, 0);
    vs.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
    let mut m1 = next_manifest(&empty("v"), &[&pack]);

    // Attempt 1 lands but its reply is lost; attempts 2 and 3 fail before reaching the store.
    faulty.inject(
        FaultRule::new(Fault::LostAck)
            .ops(&[Op::Put])
            .path_contains("manifest")
            .times(1),
    );
    faulty.inject(
        FaultRule::new(Fault::Transient)
            .ops(&[Op::Put])
            .path_contains("manifest")
            .times(2),
    );
    let err = vs.publish_manifest(&mut m1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert_eq!(vs.latest_generation().await.unwrap(), 1, "it did land");

    let mut other = m1.clone();
    other.clear();
    let err = vs.publish_manifest(&mut other).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Fenced,
        "a different generation 1 is not ours: {err}"
    );

    vs.publish_manifest(&mut m1)
        .await
        .expect("same manifest again: recognised as ours");
    vs.publish_manifest(&mut next_manifest(&m1, &[]))
        .await
        .unwrap();
    assert_eq!(vs.latest_generation().await.unwrap(), 2);
}
