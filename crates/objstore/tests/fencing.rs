//! Fenced manifest publishing on every backend: InMemory, LocalFileSystem and real S3 (s3s).

mod common;

use common::*;
use glidefs_objstore::ErrorKind;
use glidefs_testkit::verify_block;

/// Given two writers on one volume, when both start from the same view, then only the first
/// publish of a generation succeeds and the stale writer is fenced until it reloads.
#[tokio::test]
async fn second_writer_with_stale_generation_is_fenced_on_every_backend() {
    for backend in all_backends().await {
        let name = backend.name;
        let a = volume(&backend.store, "vol");
        let b = volume(&backend.store, "vol");
        assert!(
            a.load_manifest().await.unwrap().is_none(),
            "{name}: new volume"
        );
        assert!(b.load_manifest().await.unwrap().is_none());

        let pack_a = pattern_pack(&[0, 1, 2], 1, 0);
        a.upload_packs(std::slice::from_ref(&pack_a)).await.unwrap();
        let mut m1 = next_manifest(&empty("vol"), &[&pack_a]);
        a.publish_manifest(&mut m1)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));

        // B still believes the volume is empty: its generation 1 loses.
        let pack_b = pattern_pack(&[5], 1, 1);
        b.upload_packs(std::slice::from_ref(&pack_b)).await.unwrap();
        let mut stale = next_manifest(&empty("vol"), &[&pack_b]);
        let err = b.publish_manifest(&mut stale).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{name}: {err}");
        // B may not jump ahead either while its view is stale.
        let mut jump = stale.successor();
        jump.clear();
        let err = b.publish_manifest(&mut jump).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{name}: {err}");

        // After reloading, B takes over; now A is the stale one.
        let loaded = b.load_manifest().await.unwrap().expect("manifest 1");
        assert_eq!(loaded, m1, "{name}: loaded what A published");
        let mut m2 = next_manifest(&loaded, &[&pack_b]);
        b.publish_manifest(&mut m2).await.unwrap();
        let mut m2_from_a = next_manifest(&m1, &[]);
        let err = a.publish_manifest(&mut m2_from_a).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{name}: {err}");
        assert!(
            err.to_string().contains("volume=`vol` generation=2"),
            "{err}"
        );

        // A fresh reader sees generation 2 and every block reads back with its pattern.
        let reader = volume(&backend.store, "vol");
        let latest = reader.load_manifest().await.unwrap().unwrap();
        assert_eq!(latest.generation, 2);
        for (blk, loc) in latest.iter() {
            let data = reader.read_block(blk, loc).await.unwrap();
            verify_block(blk, 1, &data).unwrap_or_else(|m| panic!("{name}: {m}"));
        }
        assert_eq!(latest.len() as usize, 4);
    }
}

/// Given many writers racing to publish the same generation, exactly one wins.
#[tokio::test]
async fn racing_publishes_have_exactly_one_winner_on_every_backend() {
    for backend in all_backends().await {
        let writers: Vec<_> = (0..4).map(|_| volume(&backend.store, "race")).collect();
        for w in &writers {
            w.load_manifest().await.unwrap();
        }
        let results =
            futures::future::join_all(writers.iter().enumerate().map(|(i, w)| async move {
                let pack = pattern_pack(&[i as u64], 1, i as u64);
                w.upload_packs(std::slice::from_ref(&pack)).await?;
                w.publish_manifest(&mut next_manifest(&empty("race"), &[&pack]))
                    .await
            }))
            .await;
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "{}: {results:?}", backend.name);
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert_eq!(r.kind(), ErrorKind::Fenced, "{}: {r}", backend.name);
        }
    }
}

#[tokio::test]
async fn generation_gaps_and_foreign_manifests_are_invalid_input() {
    let backend = memory();
    let w = volume(&backend.store, "v");
    w.load_manifest().await.unwrap();
    let mut gap = empty("v");
    gap.generation = 2;
    assert_eq!(
        w.publish_manifest(&mut gap).await.unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    let mut other = empty("other").successor();
    assert_eq!(
        w.publish_manifest(&mut other).await.unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        w.latest_generation().await.unwrap(),
        0,
        "nothing was published"
    );
}

/// A writer that never called load_manifest still cannot publish an old generation.
#[tokio::test]
async fn writer_without_a_view_must_publish_latest_plus_one() {
    let backend = local();
    let a = volume(&backend.store, "v");
    let pack = pattern_pack(&[3], 1, 0);
    a.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
    let mut m1 = next_manifest(&empty("v"), &[&pack]);
    a.publish_manifest(&mut m1).await.unwrap();

    let b = volume(&backend.store, "v");
    let err = b
        .publish_manifest(&mut empty("v").successor())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced);
    // Publishing is idempotent by content: byte-identical generation 1 is accepted (both
    // writers then agree on the volume's state; the next publish fences one of them).
    b.publish_manifest(&mut m1).await.unwrap();
    b.publish_manifest(&mut next_manifest(&m1, &[]))
        .await
        .unwrap();
    let mut a2 = next_manifest(&m1, &[]);
    a2.clear();
    let err = a.publish_manifest(&mut a2).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced);
    assert_eq!(a.latest_generation().await.unwrap(), 2);
}
