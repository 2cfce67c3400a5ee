//! Volume ownership across hosts: the owner recorded in the manifest, `OwnedElsewhere` for an
//! open without takeover, the claim at open that fences the previous owner, a same-owner
//! reopen after a crash (its own claim is never taken for a foreign publish), release, and
//! writers without an owner id (unchanged behaviour).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_testkit::{FaultyStore, S3Server};
use glidefs_volume::cache::LockMode;
use glidefs_volume::{ManifestOwner, Volume, VolumeError, VolumeErrorKind};

/// A owns and writes; B is refused without takeover, claims with it; A's next sync is fenced
/// (and latched: flush and write fail too); B writes, syncs and releases; C attaches without
/// takeover and reads B's data over A's flushed data, none of A's unflushed data.
async fn takeover_scenario(store: Arc<dyn object_store::ObjectStore>) {
    let (da, db, dc) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let bs = BS as usize;
    let (x, y, z) = (vec![0xA1; bs], vec![0xB2; bs], vec![0xC3; bs]);

    let a = open_as(da.path(), &store, A, false).await.unwrap();
    assert_eq!(
        a.manifest_generation(),
        1,
        "a new volume is claimed: generation 1"
    );
    assert_eq!(a.owner(), held(A, 1));
    a.write(0, &x).await.unwrap();
    a.write(BS as u64, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    assert_eq!(a.owner(), held(A, 1), "a flush carries the claim");
    a.write(2 * BS as u64, &x).await.unwrap(); // never reaches the store

    // B without takeover: refused, naming the owner; B's cache directory is not touched.
    let err = open_as(db.path(), &store, B, false).await.unwrap_err();
    assert_eq!(err.kind(), VolumeErrorKind::Fenced, "{err}");
    assert!(
        matches!(&err, VolumeError::OwnedElsewhere { owner, generation: 2, .. } if owner == A),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(A) && msg.contains("vol-test") && msg.contains("takeover"),
        "{msg}"
    );
    assert_eq!(std::fs::read_dir(db.path()).unwrap().count(), 0);

    // B with takeover claims generation 3.
    let b = open_as(db.path(), &store, B, true).await.unwrap();
    assert_eq!(b.manifest_generation(), 3);
    assert_eq!(b.owner(), held(B, 3));
    assert!(b.fenced().is_none());

    // A is fenced at its next publish, and stays fenced.
    let err = a.sync_to_store().await.unwrap_err();
    assert_eq!(err.kind(), VolumeErrorKind::Fenced, "{err}");
    let fence = a.fenced().expect("latched");
    assert_eq!((fence.generation, fence.newer), (2, Some(3)));
    assert_eq!(a.flush().await.unwrap_err().to_string(), err.to_string());
    assert_eq!(
        a.write(0, &z).await.unwrap_err().to_string(),
        err.to_string()
    );
    let gate = a.cache().enter();
    assert!(a
        .cache()
        .prepare_write(&gate, 0, 4096, LockMode::Wait)
        .is_err());
    drop(gate);

    // B writes over A's block 1, syncs, releases.
    b.write(BS as u64, &y).await.unwrap();
    b.write(3 * BS as u64, &y).await.unwrap();
    assert_eq!(b.sync_to_store().await.unwrap().generation, 4);
    assert_eq!(b.release().await.unwrap(), 5);
    assert_eq!(
        b.owner(),
        Some(ManifestOwner {
            id: B.into(),
            claimed_at: 3,
            released: true
        })
    );
    b.close().await.unwrap();

    // C attaches without takeover (B released) and reads what B left.
    let c = open_as(dc.path(), &store, C, false).await.unwrap();
    assert_eq!(c.manifest_generation(), 6);
    assert_eq!(c.owner(), held(C, 6));
    let img = read_all(&c).await;
    assert_eq!(&img[..bs], &x[..], "A's flushed block 0");
    assert_eq!(&img[bs..2 * bs], &y[..], "B's write over A's block 1");
    assert!(
        img[2 * bs..3 * bs].iter().all(|&v| v == 0),
        "A's unflushed write is lost"
    );
    assert_eq!(&img[3 * bs..4 * bs], &y[..]);
    assert!(img[4 * bs..].iter().all(|&v| v == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_fences_the_previous_owner_in_memory() {
    takeover_scenario(mem()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_fences_the_previous_owner_on_s3() {
    let server = S3Server::start().await.unwrap();
    takeover_scenario(server.object_store().unwrap()).await;
}

/// A same-owner restart after a crash: no takeover needed, the claim publishes a new
/// generation, and the unpublished (locally flushed) blocks are published afterwards: the
/// reopened cache judges itself against the generation before its own claim, and records the
/// claim as its base.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_owner_reopen_after_a_crash_publishes_its_unpublished_blocks() {
    let store = mem();
    let (da, dc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bs = BS as usize;
    let (x, y) = (vec![0xA1; bs], vec![0xB2; bs]);

    let a = open_as(da.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.write(BS as u64, &y).await.unwrap();
    a.flush().await.unwrap(); // durable locally, not in the store
    a.kill().await;
    drop(a);

    for round in 0..2u64 {
        let a = open_as(da.path(), &store, A, false).await.unwrap();
        assert!(a.fenced().is_none(), "round {round}: {:?}", a.fenced());
        assert_eq!(a.manifest_generation(), 3 + round, "a new claim");
        assert_eq!(a.owner(), held(A, 3 + round));
        let st = a.stats().await;
        if round == 0 {
            assert_eq!(
                st.cache.dirty, 1,
                "the unpublished block survived the crash"
            );
        }
        a.kill().await; // crash again before publishing: the next open claims on top
    }
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    assert_eq!(a.manifest_generation(), 5);
    let report = a.sync_to_store().await.unwrap();
    assert_eq!((report.generation, report.blocks), (6, 1));
    a.release().await.unwrap();

    let c = open_as(dc.path(), &store, C, false).await.unwrap();
    let img = read_all(&c).await;
    assert_eq!(&img[..bs], &x[..]);
    assert_eq!(
        &img[bs..2 * bs],
        &y[..],
        "the block written before the crash"
    );
}

/// A clean close by the owner spares the next open on that cache its claim (a hand-off: no
/// publish on the critical path, the generation stays), and that open takes the marker: a
/// crash after it makes the following open claim again. After `close` the handle publishes
/// nothing (`Closed`). The same owner on another cache, a released volume and a foreign
/// publish since the close all claim (or fence) as before, and the data is intact throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_close_spares_the_next_open_its_claim() {
    let store = mem();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bs = BS as usize;
    let (x, y) = (vec![0xA1; bs], vec![0xB2; bs]);

    let a = open_as(da.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.write(BS as u64, &y).await.unwrap(); // unpublished, survives in the cache
    a.close().await.unwrap();
    let closed = a.sync_to_store().await.unwrap_err();
    assert!(matches!(closed, VolumeError::Closed { .. }), "{closed}");
    assert!(matches!(
        a.release().await.unwrap_err(),
        VolumeError::Closed { .. }
    ));
    drop(a);

    // The hand-off: same owner, same cache, nothing published since.
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    assert_eq!(a.manifest_generation(), 2, "no claim after a clean close");
    assert_eq!(a.owner(), held(A, 1));
    assert!(
        !da.path().join("store.closed").exists(),
        "the open took the marker"
    );
    let report = a.sync_to_store().await.unwrap();
    assert_eq!(
        (report.generation, report.blocks),
        (3, 1),
        "publishes on top"
    );
    a.kill().await; // a crash: no marker, so the next open claims
    drop(a);
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    assert_eq!(
        a.manifest_generation(),
        4,
        "a crash leaves no marker: claimed"
    );
    assert_eq!(a.owner(), held(A, 4));
    a.close().await.unwrap();
    drop(a);

    // A foreign publish after the clean close: the marker names an older generation.
    let b = open_as(db.path(), &store, B, true).await.unwrap();
    assert_eq!(b.manifest_generation(), 5);
    b.release().await.unwrap();
    b.close().await.unwrap();
    drop(b);
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    assert_eq!(a.manifest_generation(), 7, "claimed over B's release");
    assert_eq!(a.owner(), held(A, 7));
    let img = read_all(&a).await;
    assert_eq!(&img[..bs], &x[..]);
    assert_eq!(&img[bs..2 * bs], &y[..]);
    // Released by this owner, then closed: the next open claims.
    a.release().await.unwrap();
    a.close().await.unwrap();
    drop(a);
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    assert_eq!(
        a.manifest_generation(),
        9,
        "a released volume is claimed again"
    );
    assert_eq!(a.owner(), held(A, 9));
}

/// Writes the base file as a crash right after the claim of `claimed` landed (before its
/// `base` record) would have left it.
fn crash_after_claim(dir: &Path, claimed: u64) {
    std::fs::write(
        dir.join("store.base"),
        format!("base {}\npublishing {claimed} =owner\n", claimed - 1),
    )
    .unwrap();
}

/// A crash between the claim's publish and the base file's `base` record: the next open
/// recognises the claim as this owner's own (not fenced) and the unpublished block reaches
/// the store. Without the `publishing` record the same store state reads as a foreign
/// publish and fences the cache (the control run), so the recognition is what saves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_our_own_claim_is_not_a_foreign_publish() {
    for recognised in [true, false] {
        let store = mem();
        let (da, dc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let bs = BS as usize;
        let y = vec![0xB2; bs];
        let a = open_as(da.path(), &store, A, false).await.unwrap();
        a.write(0, &y).await.unwrap();
        assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
        a.write(BS as u64, &y).await.unwrap();
        a.flush().await.unwrap(); // durable locally, then a crash (a clean close spares the claim)
        a.kill().await;
        drop(a);
        // The restart claims generation 3, then "crashes" before recording it.
        let a = open_as(da.path(), &store, A, false).await.unwrap();
        assert_eq!(a.manifest_generation(), 3);
        a.kill().await;
        drop(a);
        if recognised {
            crash_after_claim(da.path(), 3);
        } else {
            std::fs::write(da.path().join("store.base"), "base 2\n").unwrap();
        }
        let a = open_as(da.path(), &store, A, false).await.unwrap();
        if !recognised {
            let fence = a
                .fenced()
                .expect("a generation after the base, not ours: fenced");
            assert_eq!((fence.generation, fence.newer), (2, Some(3)));
            continue;
        }
        assert!(a.fenced().is_none(), "{:?}", a.fenced());
        assert_eq!(a.manifest_generation(), 4);
        assert_eq!(a.sync_to_store().await.unwrap().generation, 5);
        a.release().await.unwrap();
        let c = open_as(dc.path(), &store, C, false).await.unwrap();
        let img = read_all(&c).await;
        assert_eq!(&img[bs..2 * bs], &y[..]);
    }
}

/// Our base file says a claim of generation 3 was in flight, but generation 3 in the store is
/// another owner's claim (ours lost the race, or never landed): foreign. A cache with
/// unpublished blocks opened with takeover is fenced, claims nothing, and publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_owners_claim_at_our_recorded_generation_is_foreign() {
    let store = mem();
    let (da, db, dc) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let bs = BS as usize;
    let (x, y) = (vec![0xA1; bs], vec![0xB2; bs]);
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    a.write(0, &y).await.unwrap(); // unpublished
    a.close().await.unwrap();
    drop(a);
    let b = open_as(db.path(), &store, B, true).await.unwrap();
    assert_eq!(b.manifest_generation(), 3);
    crash_after_claim(da.path(), 3);

    let err = open_as(da.path(), &store, A, false).await.unwrap_err();
    assert!(matches!(err, VolumeError::OwnedElsewhere { .. }), "{err}");
    let a = open_as(da.path(), &store, A, true).await.unwrap();
    let fence = a
        .fenced()
        .expect("foreign claim + unpublished blocks: fenced");
    assert_eq!((fence.generation, fence.newer), (2, Some(3)));
    assert_eq!(a.manifest_generation(), 3, "no claim from a fenced cache");
    assert_eq!(a.owner(), held(B, 3));
    assert!(a.sync_to_store().await.is_err());
    assert!(a.release().await.is_err());
    drop(a);
    // B still owns the volume and publishes; A's stale block never reached the store.
    b.write(BS as u64, &y).await.unwrap();
    assert_eq!(b.sync_to_store().await.unwrap().generation, 4);
    b.release().await.unwrap();
    let c = open_as(dc.path(), &store, C, false).await.unwrap();
    let img = read_all(&c).await;
    assert_eq!(&img[..bs], &x[..]);
    assert_eq!(&img[bs..2 * bs], &y[..]);
}

/// Release: writes and syncs are refused afterwards (`Released`, the zero-copy path too),
/// `close` works, a second release is a no-op; another owner attaches without takeover and
/// the releasing owner itself may attach again (a claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_lets_another_owner_attach_without_takeover() {
    let store = mem();
    let (da, db, da2) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let bs = BS as usize;
    let x = vec![0xA1; bs];
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    // release flushes what was written: generation 2 holds the block, 3 is the release.
    assert_eq!(a.release().await.unwrap(), 3);
    assert!(a.is_released());
    assert_eq!(a.release().await.unwrap(), 3, "idempotent");
    let err = a.write(0, &x).await.unwrap_err();
    assert!(matches!(err, VolumeError::Released { .. }), "{err}");
    assert_eq!(err.kind(), VolumeErrorKind::Fenced);
    assert!(matches!(
        a.sync_to_store().await.unwrap_err(),
        VolumeError::Released { .. }
    ));
    let gate = a.cache().enter();
    assert!(a
        .cache()
        .prepare_write(&gate, 0, 4096, LockMode::Wait)
        .is_err());
    drop(gate);
    a.flush().await.unwrap();
    a.close().await.unwrap();
    drop(a);

    let b = open_as(db.path(), &store, B, false).await.unwrap();
    assert_eq!(b.manifest_generation(), 4);
    assert_eq!(b.owner(), held(B, 4));
    let mut got = vec![0; bs];
    b.read(0, &mut got).await.unwrap();
    assert_eq!(got, x);
    b.release().await.unwrap();
    drop(b);
    // A back, from a fresh cache directory, no takeover needed.
    let a = open_as(da2.path(), &store, A, false).await.unwrap();
    assert_eq!(a.owner(), held(A, 6));
}

/// A writer without an owner id behaves as before owners: it opens a volume someone owns
/// without a check or a claim, its flush fences the owner, and its manifest records no owner
/// (so the next owner attaches without takeover).
/// A writer without an owner id neither checks nor claims, and may not publish over an
/// owner's unreleased claim (the publisher's owner invariant: it would fence the owner); once
/// the owner released the volume, it writes and publishes with no owner record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_without_owner_id_neither_check_nor_claim() {
    let store = mem();
    let (da, dn, dc) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let bs = BS as usize;
    let (x, y) = (vec![0xA1; bs], vec![0xB2; bs]);
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);

    let n = open(dn.path(), store.clone()).await;
    assert_eq!(n.manifest_generation(), 2, "no claim");
    assert_eq!(n.owner(), held(A, 1), "it sees the record");
    let err = n.release().await.unwrap_err();
    assert!(matches!(err, VolumeError::InvalidConfig { .. }), "{err}");
    n.write(BS as u64, &y).await.unwrap();
    assert_eq!(
        n.sync_to_store().await.unwrap_err().kind(),
        VolumeErrorKind::Fenced,
        "an owner-less publish over A's claim"
    );
    a.write(2 * BS as u64, &y).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 3, "A goes on");
    a.release().await.unwrap();
    // n's cache holds a write it could never publish: a fresh directory takes over.
    drop(n);
    let dn2 = tempfile::tempdir().unwrap();
    let n = open(dn2.path(), store.clone()).await;
    n.write(BS as u64, &y).await.unwrap();
    assert_eq!(n.sync_to_store().await.unwrap().generation, 5);
    assert_eq!(n.owner(), None, "an owner-less publish records no owner");

    let c = open_as(dc.path(), &store, C, false).await.unwrap();
    assert_eq!(c.owner(), held(C, 6));
    let img = read_all(&c).await;
    assert_eq!(&img[..bs], &x[..]);
    assert_eq!(&img[bs..2 * bs], &y[..]);
    assert_eq!(&img[2 * bs..3 * bs], &y[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_owner_ids_are_refused() {
    let d = tempfile::tempdir().unwrap();
    for bad in ["", "host a", "tab\there", &"x".repeat(256)] {
        let err = Volume::open(owned(d.path(), bad, false), mem())
            .await
            .unwrap_err();
        assert!(matches!(err, VolumeError::InvalidConfig { .. }), "{bad:?}");
        assert_eq!(err.kind(), VolumeErrorKind::InvalidInput);
    }
}

/// Two hosts take the volume over at the same moment (both see A's generation, both publish
/// the next): exactly one claim wins per generation, a loser's open fails with `Fenced`,
/// and the volume ends up owned by a winner. Store latency makes the claims overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_one_wins_the_loser_is_fenced() {
    let faulty = Arc::new(FaultyStore::new(mem()));
    faulty.set_latency(Duration::from_millis(20));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let da = tempfile::tempdir().unwrap();
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    drop(a);
    let mut losses = 0;
    for round in 0..4 {
        let (db, dc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (rb, rc) = tokio::join!(
            open_as(db.path(), &store, B, true),
            open_as(dc.path(), &store, C, true)
        );
        let winners: Vec<_> = [&rb, &rc]
            .into_iter()
            .filter_map(|r| r.as_ref().ok())
            .collect();
        assert!(!winners.is_empty(), "round {round}: someone wins");
        for r in [&rb, &rc] {
            if let Err(e) = r {
                assert_eq!(e.kind(), VolumeErrorKind::Fenced, "{e}");
                assert!(e.to_string().contains("owner record"), "{e}");
                losses += 1;
            }
        }
        let latest = winners
            .iter()
            .map(|v| v.manifest_generation())
            .max()
            .unwrap();
        let owner = winners
            .iter()
            .find(|v| v.manifest_generation() == latest)
            .unwrap()
            .owner();
        let dr = tempfile::tempdir().unwrap();
        let reader = open(dr.path(), faulty.inner().clone()).await;
        assert_eq!(reader.manifest_generation(), latest, "round {round}");
        assert_eq!(reader.owner(), owner, "round {round}");
    }
    assert!(
        losses > 0,
        "the claims never overlapped: the test did not race"
    );
}

/// A release whose publish fails leaves the volume owned and writable; retried, it releases
/// everything written in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_can_be_retried() {
    use glidefs_testkit::{Fault, FaultRule, Op};
    let faulty = Arc::new(FaultyStore::new(mem()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bs = BS as usize;
    let (x, y) = (vec![0xA1; bs], vec![0xB2; bs]);
    let a = open_as(da.path(), &store, A, false).await.unwrap();
    a.write(0, &x).await.unwrap();
    assert_eq!(a.sync_to_store().await.unwrap().generation, 2);
    // A failure before the release record is sent (the final sync's pack upload): the
    // volume stays writable.
    a.write(BS as u64, &y).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("packs")
            .times(1),
    );
    let err = a.release().await.unwrap_err();
    assert!(matches!(err, VolumeError::Store { .. }), "{err}");
    assert!(!a.is_released() && a.fenced().is_none());
    assert_eq!(a.owner(), held(A, 1));
    a.write(BS as u64, &y).await.unwrap();
    // (two publishes: the rotation the failed release left pending, then the new write)
    let synced = a.sync_to_store().await.unwrap().generation;
    // A failure of the release record's own PUT: it may have landed, so writes stay
    // refused; a retry re-sends the same record.
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("manifest")
            .times(1),
    );
    let err = a.release().await.unwrap_err();
    assert!(matches!(err, VolumeError::Store { .. }), "{err}");
    assert!(a.fenced().is_none());
    let refused = a.write(0, &y).await.unwrap_err();
    assert!(matches!(refused, VolumeError::Released { .. }), "{refused}");
    assert_eq!(
        a.release().await.unwrap(),
        synced + 1,
        "the release follows the last sync"
    );
    drop(a);
    let b = open_as(db.path(), &store, B, false).await.unwrap();
    let img = read_all(&b).await;
    assert_eq!(&img[..bs], &x[..]);
    assert_eq!(&img[bs..2 * bs], &y[..]);
}
