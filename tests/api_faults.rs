//! API tests of failures below the API: the object store down (a `FaultyStore` outage) while
//! running and while starting (volumes `recovering`, then back), and between a remove's
//! device stop and its tail flush (a plain remove again finishes it, nothing lost), a fenced
//! volume, the loser of a create race (a stale listing), and a local disk that refuses the
//! state file (the harness is `api_support`).

mod api_support;

use std::sync::Arc;
use std::time::Duration;

use glidefs::model::VolumeState;
use glidefs::ublk::export::NoDevices;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use hyper::Method;
use serde_json::{json, Value};

use api_support::daemon::{
    assemble, assemble_as, await_state, cache_dirs, file_store, start, start_other_host,
    store_objects, text, Daemon,
};
use api_support::exporters::{
    blocks_from_store, last_writes_daemon, restart_with_the_store_back, Reattaching,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_is_503_store_unavailable_and_leaves_volumes_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultyStore::new(file_store(dir.path())));
    let mut d = assemble(dir.path(), store.clone(), Arc::new(NoDevices)).await;
    d.create(json!({"name": "s", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("s").write(0, &[5u8; 8192]).await.unwrap();
    d.create(json!({"name": "p", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("p").write(0, &[6u8; 4096]).await.unwrap();
    assert_eq!(d.client.flush("p").await.unwrap().generation, 2);

    store.set_outage(true);
    for (method, path, body) in [
        (
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "t", "size": "4M"})),
        ),
        (
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "t", "attach_existing": true})),
        ),
        (Method::POST, "/v1/volumes/s/flush", None),
        (Method::DELETE, "/v1/volumes/s", None),
        (Method::DELETE, "/v1/volumes/s?purge=false", None),
    ] {
        d.expect_error(method, path, body, 503, "store_unavailable")
            .await;
    }
    // Nothing created; the volume is untouched, its data still local, the failures recorded.
    assert_eq!(d.names().await, ["p", "s"]);
    assert_eq!(cache_dirs(&d.cfg), ["p", "s"]);
    let v = d.client.show("s").await.unwrap();
    assert_eq!(v.state, VolumeState::Running);
    assert_eq!(
        (v.dirty_bytes + v.syncing_bytes, v.manifest_generation),
        (8192, 1)
    );
    assert!(v.flush.errors >= 3, "{:?}", v.flush);
    assert!(v.flush.last_error.is_some(), "{:?}", v.flush);
    let mut buf = vec![0u8; 8192];
    d.volume("s").read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&b| b == 5));
    // A forced remove needs no store.
    let r = d
        .req(Method::DELETE, "/v1/volumes/s?force=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    // A purge does, and says so.
    d.expect_error(
        Method::DELETE,
        "/v1/volumes/p?purge=true",
        None,
        503,
        "store_unavailable",
    )
    .await;
    // A purge asks the store first (no clone of its snapshots may exist): refused before
    // anything is torn down, the volume still running with its cache.
    let v = d.client.show("p").await.unwrap();
    assert_eq!(v.state, VolumeState::Running, "{v:?}");
    assert_eq!(cache_dirs(&d.cfg), ["p"]);

    // Back up: the purge can be finished, and everything works again.
    store.set_outage(false);
    let r = d
        .req(Method::DELETE, "/v1/volumes/p?purge=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let report: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(report["purged_objects"].as_u64().unwrap() >= 2, "{report}");
    let v = d
        .create(json!({"name": "t", "size": "4M", "block_size": "4K"}))
        .await;
    assert_eq!(v.manifest_generation, 1, "claimed at create");
    d.volume("t").write(0, &[1u8; 4096]).await.unwrap();
    assert_eq!(d.client.flush("t").await.unwrap().generation, 2);
    assert_eq!(d.names().await, ["t"]);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_whose_tail_flush_failed_is_finished_by_a_plain_remove_again() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, store) = last_writes_daemon(dir.path(), 4096, 2).await;
    d.volume("v").write(0, &[1u8; 4096]).await.unwrap();
    // The remove flushes block 0, stops the device (whose last write lands in block 1 as it
    // stops), and the tail flush finds the store down. Asked again while it is still down:
    // the same answer, nothing dropped.
    for _ in 0..2 {
        d.remove_needs_the_store("v").await;
        let v = d.client.show("v").await.unwrap();
        assert_eq!(v.state, VolumeState::Failed, "{v:?}");
        let why = v.error.unwrap_or_default();
        assert!(why.contains("remove again to retry"), "{why}");
        assert_eq!(cache_dirs(&d.cfg), ["v"], "the cache keeps block 1");
    }
    // Back up: a plain remove flushes the tail and finishes.
    store.set_outage(false);
    let r = d.req(Method::DELETE, "/v1/volumes/v", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty());
    // Attached again from the store alone: both writes are there.
    let (b0, b1) = blocks_from_store(&d).await;
    assert!(b0.iter().all(|&b| b == 1), "block 0");
    assert!(
        b1.iter().all(|&b| b == 2),
        "block 1, written as the device stopped"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_left_by_a_failed_tail_flush_is_closed_at_shutdown_and_served_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (d, store) = last_writes_daemon(dir.path(), 8192, 3).await;
    d.remove_needs_the_store("v").await;
    // The shutdown closes it (the store still down): it stays registered with its cache.
    let mut d = restart_with_the_store_back(d, dir.path(), &store, 4096).await;
    let mut buf = vec![0u8; 4096];
    d.volume("v").read(8192, &mut buf).await.unwrap();
    assert!(
        buf.iter().all(|&b| b == 3),
        "the write made as the device stopped"
    );
    let r = d.req(Method::DELETE, "/v1/volumes/v", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_volume_refuses_flush_and_plain_remove() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = start(dir.path()).await;
    // A second daemon on the same object store (its own data_dir and socket).
    let mut b = start_other_host(dir.path(), "b").await;

    a.create(json!({"name": "f", "size": "4M", "block_size": "4K"}))
        .await;
    a.volume("f").write(0, &[1u8; 4096]).await.unwrap();
    let g1 = a.client.flush("f").await.unwrap().generation;
    // A owns it: B cannot simply attach it...
    b.expect_error(
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "f", "attach_existing": true})),
        409,
        "owned_elsewhere",
    )
    .await;
    // ...it has to take it over, which publishes B's claim.
    let v = b
        .create(json!({"name": "f", "attach_existing": true, "takeover": true}))
        .await;
    assert!(v.manifest_generation > g1, "{v:?}");
    b.volume("f").write(0, &[2u8; 4096]).await.unwrap();
    let g2 = b.client.flush("f").await.unwrap().generation;
    assert!(g2 > v.manifest_generation);

    // A learns it at its next flush.
    a.volume("f").write(4096, &[3u8; 4096]).await.unwrap();
    a.expect_error(Method::POST, "/v1/volumes/f/flush", None, 409, "fenced")
        .await;
    let v = a.client.show("f").await.unwrap();
    assert_eq!((v.state, v.fenced), (VolumeState::Fenced, true));
    assert!(v.error.is_some(), "{v:?}");
    assert!(
        a.metrics()
            .await
            .contains("glidefs_volume_fenced{volume=\"f\"} 1"),
        "fenced gauge"
    );
    for (m, p) in [
        (Method::POST, "/v1/volumes/f/flush"),
        (Method::DELETE, "/v1/volumes/f"),
        (Method::DELETE, "/v1/volumes/f?force=false&purge=false"),
    ] {
        a.expect_error(m, p, None, 409, "fenced").await;
    }
    // Reads go on; a forced remove lets go of it without touching the store.
    let mut buf = vec![0u8; 4096];
    a.volume("f").read(0, &mut buf).await.unwrap();
    let r = a
        .req(Method::DELETE, "/v1/volumes/f?force=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(a.names().await.is_empty());
    // B, the writer now, is unaffected.
    b.volume("f").write(0, &[4u8; 4096]).await.unwrap();
    assert_eq!(b.client.flush("f").await.unwrap().generation, g2 + 1);
    // A plain remove releases the volume: A may attach it again without a takeover and
    // reads what B wrote last.
    b.client.remove("f", false, false).await.unwrap();
    a.create(json!({"name": "f", "attach_existing": true}))
        .await;
    let mut buf = vec![0u8; 4096];
    a.volume("f").read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&x| x == 4), "A reads B's last write");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_disk_failure_is_500_internal_and_undone() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    // state.json cannot be replaced while a directory sits at its path.
    let blocker = d.cfg.state_path().join("blocker");
    std::fs::create_dir_all(&blocker).unwrap();
    d.expect_error(
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "x", "size": "4M"})),
        500,
        "internal",
    )
    .await;
    assert!(
        d.names().await.is_empty(),
        "a create that was not recorded is undone"
    );
    std::fs::remove_dir_all(d.cfg.state_path()).unwrap();
    d.create(json!({"name": "x", "size": "4M"})).await;
    assert_eq!(d.names().await, ["x"]);
    d.stop().await;
}

/// A store outage while the daemon starts: the volume is not given up. It reports
/// `recovering` with the last error while the store is down (its QUIESCED device untouched,
/// I/O held), and once the store answers again it opens, its device is taken over, and every
/// write reads back: the flushed ones and the ones only in the local cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_at_start_recovers_when_the_store_returns() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultyStore::new(file_store(dir.path())));
    let mut d = assemble(dir.path(), store.clone(), Arc::new(Reattaching::default())).await;
    let v = d
        .create(json!({"name": "r", "size": "4M", "block_size": "4K"}))
        .await;
    assert_eq!(v.device.id, Some(0));
    d.volume("r").write(0, &[7u8; 8192]).await.unwrap();
    assert_eq!(d.client.flush("r").await.unwrap().generation, 2);
    // Only in the local cache (the daemon "crashes" without flushing it to the store).
    d.volume("r").write(8192, &[8u8; 4096]).await.unwrap();
    d.stop().await;

    store.set_outage(true);
    let layer = Arc::new(Reattaching::default());
    let mut d = assemble(dir.path(), store.clone(), layer.clone()).await;
    let v = d.client.show("r").await.unwrap();
    assert_eq!(v.state, VolumeState::Recovering, "{v:?}");
    let error = v.error.clone().unwrap_or_default();
    assert!(
        error.contains("recovering") && error.contains("injected Outage fault"),
        "the last error is shown: {v:?}"
    );
    assert!(layer.reattached.lock().is_empty(), "{v:?}");
    // Let a few background attempts fail.
    let start = std::time::Instant::now();
    loop {
        let v = d.client.show("r").await.unwrap();
        let error = v.error.unwrap_or_default();
        if !error.contains("recovering: 1 attempt") {
            assert!(error.contains("injected Outage fault"), "{error}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no retry: {error}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(v.state, VolumeState::Recovering);
    let m = d.metrics().await;
    assert!(
        m.contains("glidefs_volume_recovering{volume=\"r\"} 1"),
        "{m}"
    );
    assert!(m.contains("glidefs_volume_up{volume=\"r\"} 0"), "{m}");
    let listed = d.client.list().await.unwrap().volumes;
    assert_eq!(listed[0].state, VolumeState::Recovering);
    // Not open: flush and a plain remove are 503 store_unavailable, and change nothing.
    d.expect_error(
        Method::POST,
        "/v1/volumes/r/flush",
        None,
        503,
        "store_unavailable",
    )
    .await;
    d.expect_error(
        Method::DELETE,
        "/v1/volumes/r",
        None,
        503,
        "store_unavailable",
    )
    .await;
    assert!(layer.reattached.lock().is_empty());

    store.set_outage(false);
    let v = await_state(&d, "r", VolumeState::Running).await;
    assert_eq!(v.device.id, Some(0), "{v:?}");
    assert_eq!(*layer.reattached.lock(), [0], "the device is taken over");
    let mut buf = vec![0u8; 12288];
    d.volume("r").read(0, &mut buf).await.unwrap();
    assert!(buf[..8192].iter().all(|&b| b == 7), "flushed data");
    assert!(buf[8192..].iter().all(|&b| b == 8), "locally cached data");
    // It flushes again.
    d.volume("r").write(0, &[9u8; 4096]).await.unwrap();
    assert!(d.client.flush("r").await.unwrap().generation > 2);
    let m = d.metrics().await;
    assert!(
        m.contains("glidefs_volume_recovering{volume=\"r\"} 0"),
        "{m}"
    );
    assert!(m.contains("glidefs_volume_up{volume=\"r\"} 1"), "{m}");
    d.stop().await;
}

/// Volumes `a` and `b` (block 0 written with 1s) restored while the store is down: a daemon
/// (the store left down) with both `recovering`; `/readyz` was 200 before.
async fn two_recovering_volumes(dir: &std::path::Path, store: &Arc<FaultyStore>) -> Daemon {
    let mut d = assemble(dir, store.clone(), Arc::new(NoDevices)).await;
    for name in ["a", "b"] {
        d.create(json!({"name": name, "size": "4M", "block_size": "4K"}))
            .await;
        d.volume(name).write(0, &[1u8; 4096]).await.unwrap();
    }
    assert_eq!(d.req(Method::GET, "/readyz", None).await.status, 200);
    d.stop().await;

    store.set_outage(true);
    let d = assemble(dir, store.clone(), Arc::new(NoDevices)).await;
    for name in ["a", "b"] {
        assert_eq!(
            d.client.show(name).await.unwrap().state,
            VolumeState::Recovering
        );
    }
    d
}

/// A recovering volume can be removed with `force` (its local cache is dropped); its re-open
/// task ends, and a new volume of the same name is not touched by it. Shutdown ends the
/// retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovering_volume_can_be_force_removed_and_shutdown_ends_the_retries() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultyStore::new(file_store(dir.path())));
    let mut d = two_recovering_volumes(dir.path(), &store).await;
    let r = d
        .req(Method::DELETE, "/v1/volumes/a?force=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(d.names().await, ["b"]);
    assert_eq!(cache_dirs(&d.cfg), ["b"]);
    store.set_outage(false);
    // `a` again, new and empty: the old entry's task must not open the new volume's cache.
    let v = d
        .create(json!({"name": "a", "attach_existing": true}))
        .await;
    assert_eq!(v.size, 4 << 20, "the store's volume: {v:?}");
    await_state(&d, "b", VolumeState::Running).await;
    let mut buf = vec![0u8; 4096];
    d.volume("b").read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&b| b == 1));
    assert_eq!(
        d.client.show("a").await.unwrap().state,
        VolumeState::Running
    );
    d.stop().await;

    // Shutdown while recovering ends the retries; the next start opens the volume.
    store.set_outage(true);
    let mut d = assemble(dir.path(), store.clone(), Arc::new(NoDevices)).await;
    assert_eq!(
        d.client.show("b").await.unwrap().state,
        VolumeState::Recovering
    );
    d.stop().await;
    store.set_outage(false);
    let mut d = assemble(dir.path(), store.clone(), Arc::new(NoDevices)).await;
    assert_eq!(
        d.client.show("b").await.unwrap().state,
        VolumeState::Running
    );
    d.volume("b").read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&b| b == 1));
    d.stop().await;
}

/// Two daemons create the same new volume at once: B lists the store just before A's claim
/// lands (no manifest), then finds A's claim when it opens the volume, and its create fails
/// with `owned_elsewhere`. B undoes only what it wrote itself (nothing): A's volume, its
/// manifests and packs, stays whole, A flushes on, and its data reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loser_of_a_create_race_leaves_the_winners_volume_alone() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let mut a = start(dir_a.path()).await;
    a.create(json!({"name": "x", "size": "4M", "block_size": "4K"}))
        .await;
    a.volume("x").write(0, &[3u8; 8192]).await.unwrap();
    assert_eq!(a.client.flush("x").await.unwrap().generation, 2);
    let before = store_objects(dir_a.path());

    // B's first listing finds nothing: it ran just before A's claim landed.
    let store_b = Arc::new(FaultyStore::new(file_store(dir_a.path())));
    store_b.inject(FaultRule::new(Fault::EmptyList).ops(&[Op::List]).times(1));
    let mut b = assemble(dir_b.path(), store_b.clone(), Arc::new(NoDevices)).await;
    b.expect_error(
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "x", "size": "4M", "block_size": "4K"})),
        409,
        "owned_elsewhere",
    )
    .await;
    assert_eq!(store_b.counts().faults_injected, 1, "B listed the store");
    assert_eq!(
        store_objects(dir_a.path()),
        before,
        "the loser changed the winner's volume in the store"
    );

    a.volume("x").write(8192, &[4u8; 4096]).await.unwrap();
    assert_eq!(a.client.flush("x").await.unwrap().generation, 3);
    a.client.remove("x", false, false).await.unwrap();
    let v = b
        .create(json!({"name": "x", "attach_existing": true}))
        .await;
    assert_eq!(v.size, 4 << 20);
    let mut buf = vec![0u8; 12288];
    b.volume("x").read(0, &mut buf).await.unwrap();
    assert!(buf[..8192].iter().all(|&x| x == 3), "A's first flush");
    assert!(buf[8192..].iter().all(|&x| x == 4), "A's second flush");
    a.stop().await;
    b.stop().await;
}

/// A remove's upload does not hold up other volumes' creates and removes: with the removed
/// volume's pack uploads held in the store, another volume is created and removed; once the
/// uploads go through, the remove finishes and its data is in the store (attached back, it
/// reads what was written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_uploading_does_not_hold_up_other_creates_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultyStore::new(file_store(dir.path())));
    let mut d = assemble(dir.path(), store.clone(), Arc::new(NoDevices)).await;
    d.create(json!({"name": "big", "size": "4M", "block_size": "4K"}))
        .await;
    d.create(json!({"name": "other", "size": "4M"})).await;
    let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    d.volume("big").write(0, &data).await.unwrap();
    store.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("volumes/big/packs/"),
    );
    let client = d.client.clone();
    let removing = tokio::spawn(async move { client.remove("big", false, false).await });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.plan().held() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the remove never uploaded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let beside = async {
        d.create(json!({"name": "new", "size": "4M"})).await;
        d.client.remove("other", false, false).await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(30), beside)
        .await
        .expect("a create and a remove waited behind another volume's upload");
    assert!(
        !removing.is_finished(),
        "the remove finished with its upload held"
    );
    store.clear_faults();
    store.release_held();
    removing.await.unwrap().unwrap();
    assert_eq!(d.names().await, ["new"]);
    d.create(json!({"name": "big", "attach_existing": true}))
        .await;
    let mut back = vec![0u8; data.len()];
    d.volume("big").read(0, &mut back).await.unwrap();
    assert!(
        back == data,
        "the removed volume's data did not reach the store"
    );
    d.stop().await;
}

/// Issue 45, item 10: a daemon whose host was renamed. Its owner id is `<hostname>/<id of its
/// data directory>`, so every volume's record named "another daemon" and each came back
/// `failed` (owned_elsewhere) after the rename (seen on 6530751: `failed`), with a discard of
/// the cache as the only way out. The data directory is the identity: the volume comes back
/// `running` under the new name, with the write its cache held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_host_keeps_its_volumes() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(dir.path());
    let mut d = assemble_as(
        dir.path(),
        store.clone(),
        Arc::new(NoDevices),
        Some("old-name"),
    )
    .await;
    d.create(json!({"name": "r", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("r").write(0, &[7u8; 8192]).await.unwrap();
    d.client.flush("r").await.unwrap();
    d.volume("r").write(8192, &[8u8; 4096]).await.unwrap();
    d.volume("r").flush().await.unwrap();
    d.stop().await;

    let d = assemble_as(
        dir.path(),
        store.clone(),
        Arc::new(NoDevices),
        Some("new-name"),
    )
    .await;
    let info = d.client.show("r").await.unwrap();
    assert_eq!(info.state, VolumeState::Running, "{info:?}");
    let v = d.volume("r");
    assert!(
        v.owner().is_some_and(|o| o.id.starts_with("new-name/")),
        "{:?}",
        v.owner()
    );
    let mut buf = vec![0u8; 12288];
    v.read(0, &mut buf).await.unwrap();
    assert!(buf[..8192].iter().all(|b| *b == 7) && buf[8192..].iter().all(|b| *b == 8));
}

/// A store that does not answer while a recovering volume's re-open attempt waits on it
/// (issue 45 item 12): the attempt holds no lock a remove or a create needs, so a forced remove
/// of that volume is answered while the store still hangs (the attempt is cancelled, the
/// cache directory deleted once it has stopped), and another volume is created meanwhile.
/// `/readyz` is 503 `not_ready` naming the volumes not open yet while any is recovering, and
/// 200 once every one is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_reopen_holds_up_no_remove_and_readyz_waits_for_the_recovering_volumes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultyStore::new(file_store(dir.path())));
    let mut d = two_recovering_volumes(dir.path(), &store).await;
    let not_ready = |r: &glidefs::client::RawResponse, names: &[&str]| {
        assert_eq!(r.status, 503, "{}", text(r));
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "not_ready", "{v}");
        assert_eq!(v["recovering"], json!(names), "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(names.iter().all(|n| message.contains(n)), "{v}");
    };
    not_ready(&d.req(Method::GET, "/readyz", None).await, &["a", "b"]);
    // The store hangs on `a`'s calls (a request that never answers), `b`'s fail at once.
    store.inject(FaultRule::new(Fault::Hold).path_contains("volumes/a/"));
    store.inject(FaultRule::new(Fault::Transient).path_contains("volumes/b/"));
    store.set_outage(false);
    tokio::time::timeout(Duration::from_secs(60), store.plan().wait_held(1))
        .await
        .expect("a re-open attempt of `a` waits on the store");

    // Answered while `a`'s attempt still waits on the store.
    let limit = Duration::from_secs(30);
    let r = tokio::time::timeout(
        limit,
        d.req(Method::DELETE, "/v1/volumes/a?force=true", None),
    )
    .await
    .unwrap_or_else(|_| panic!("a forced remove of a recovering volume took over {limit:?}"));
    assert_eq!(r.status, 200, "{}", text(&r));
    let c = tokio::time::timeout(
        limit,
        d.req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "c", "size": "4M", "block_size": "4K"})),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("a create beside a hung re-open took over {limit:?}"));
    assert_eq!(c.status, 201, "{}", text(&c));
    assert_eq!(d.names().await, ["b", "c"]);
    assert_eq!(cache_dirs(&d.cfg), ["b", "c"]);
    not_ready(&d.req(Method::GET, "/readyz", None).await, &["b"]);

    store.clear_faults();
    store.release_held();
    await_state(&d, "b", VolumeState::Running).await;
    assert_eq!(d.req(Method::GET, "/readyz", None).await.status, 200);
    let mut buf = vec![0u8; 4096];
    d.volume("b").read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&b| b == 1));
    d.stop().await;
}
