//! The remove path's `Stopped` state (a remove whose device stopped, then whose tail flush or
//! ownership release failed), at the API: a plain remove again (or after a restart) finishes
//! once the store is back; every other call answers `volume_failed` and `force` drops the
//! cache; `purge` waits for the store, then deletes everything; a hand-off closes the volume
//! and the next daemon serves it. Calls racing a remove answer 404 or 409, never an internal
//! error (the harness is `api_support`).

mod api_support;

use std::sync::Arc;

use glidefs::model::VolumeState;
use glidefs_testkit::FaultyStore;
use hyper::Method;
use serde_json::json;

use api_support::daemon::{cache_dirs, store_objects, text, Daemon};
use api_support::exporters::{
    blocks_from_store, flushed_daemon, last_writes_daemon, removed_with_the_store_back,
    restart_with_the_store_back,
};

/// A daemon on a `FaultyStore` whose devices make a last write of 4 KiB of `2` at 4096 as
/// they stop, then take the store down ([`LastWrites`]), with a 4 MiB volume `v` holding
/// 4 KiB of `1` at 0 (not flushed yet: the remove's first flush uploads it).
async fn stopped_daemon(dir: &std::path::Path) -> (Daemon, Arc<FaultyStore>) {
    let (d, store) = last_writes_daemon(dir, 4096, 2).await;
    d.volume("v").write(0, &[1u8; 4096]).await.unwrap();
    // Block 0 goes up, the device stops (block 1 lands), the tail flush finds the store down.
    d.remove_needs_the_store("v").await;
    let v = d.client.show("v").await.unwrap();
    assert_eq!(v.state, VolumeState::Failed, "{v:?}");
    assert_eq!(cache_dirs(&d.cfg), ["v"]);
    (d, store)
}

/// A daemon with a volume `v` whose 4 KiB of `7` at 0 were flushed, then a remove with the
/// store down: nothing is left to upload, so every flush of the remove succeeds without the
/// store, and the release record's PUT finds it down (503).
async fn release_failed(dir: &std::path::Path) -> (Daemon, Arc<FaultyStore>) {
    let (d, store) = flushed_daemon(dir).await;
    store.set_outage(true);
    d.remove_needs_the_store("v").await;
    (d, store)
}

/// The release after a successful tail flush fails with the store down: the volume is left
/// `Stopped` with "remove again" as the advice. Once the store is back, a plain remove again
/// finishes (everything is in the store): the engine refuses syncs once a release record may
/// have been sent (`Volume::release`: `Released` until it is confirmed), so the retry's
/// `teardown` skips its flush and goes to `release`, which flushes first anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_whose_release_failed_is_finished_by_a_plain_remove_again() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, store) = release_failed(dir.path()).await;
    let v = d.client.show("v").await.unwrap();
    assert_eq!(v.state, VolumeState::Failed, "{v:?}");
    let why = v.error.unwrap_or_default();
    assert!(why.contains("releasing ownership failed"), "{why}");
    assert!(why.contains("remove again"), "{why}");

    removed_with_the_store_back(&d, &store, 7, 0).await;
    d.stop().await;
}

/// The same release failure, then a restart instead of a remove again: the shutdown closes
/// the volume (nothing of it only local: the flush before the release succeeded), the next
/// daemon claims it again, and a plain remove there finishes with everything in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_whose_release_failed_is_removed_by_a_plain_remove_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (d, store) = release_failed(dir.path()).await;
    let mut d = restart_with_the_store_back(d, dir.path(), &store, 0).await;
    let r = d.req(Method::DELETE, "/v1/volumes/v", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(cache_dirs(&d.cfg).is_empty());
    let (b0, _) = blocks_from_store(&d).await;
    assert!(b0.iter().all(|&b| b == 7), "block 0");
    d.stop().await;
}

/// Every other call on a `Stopped` volume answers `volume_failed` (no panic, nothing
/// changed), a create of its name is a `duplicate`; then `force` drops it: the cache goes,
/// the store keeps what the first flush uploaded and never gets the last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_volume_refuses_other_calls_and_a_forced_remove_drops_its_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, store) = stopped_daemon(dir.path()).await;
    for (method, path, body) in [
        (Method::POST, "/v1/volumes/v/flush", None),
        (Method::POST, "/v1/volumes/v/compact", None),
        (
            Method::POST,
            "/v1/volumes/v/resize",
            Some(json!({"size": "8M"})),
        ),
        (
            Method::POST,
            "/v1/volumes/v/snapshots",
            Some(json!({"name": "s1"})),
        ),
    ] {
        d.expect_error(method, path, body, 409, "volume_failed")
            .await;
    }
    d.expect_error(
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "v", "attach_existing": true})),
        409,
        "duplicate",
    )
    .await;
    assert!(d.metrics().await.contains("glidefs_volume"));
    let v = d.client.show("v").await.unwrap();
    assert_eq!(v.state, VolumeState::Failed, "{v:?}");
    assert_eq!(v.size, 4 << 20, "the resize changed nothing");
    assert_eq!(cache_dirs(&d.cfg), ["v"]);

    // Forced, with the store still down: dropped, cache and all.
    let r = d
        .req(Method::DELETE, "/v1/volumes/v?force=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty());
    store.set_outage(false);
    let (b0, b1) = blocks_from_store(&d).await;
    assert!(
        b0.iter().all(|&b| b == 1),
        "block 0, flushed before the stop"
    );
    assert!(
        b1.iter().all(|&b| b == 0),
        "block 1 was only in the dropped cache"
    );
    d.stop().await;
}

/// `purge` of a `Stopped` volume asks the store first: refused while it is down (cache and
/// volume kept), and once it is back it deletes the cache and every object of the volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_a_stopped_volume_waits_for_the_store_then_deletes_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, store) = stopped_daemon(dir.path()).await;
    assert!(!store_objects(dir.path()).is_empty());
    d.expect_error(
        Method::DELETE,
        "/v1/volumes/v?purge=true",
        None,
        503,
        "store_unavailable",
    )
    .await;
    let v = d.client.show("v").await.unwrap();
    assert_eq!(v.state, VolumeState::Failed, "{v:?}");
    assert_eq!(cache_dirs(&d.cfg), ["v"], "the last write is still local");

    store.set_outage(false);
    let r = d
        .req(Method::DELETE, "/v1/volumes/v?purge=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty());
    assert!(
        store_objects(dir.path()).is_empty(),
        "{:?}",
        store_objects(dir.path())
    );
    d.expect_error(
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "v", "attach_existing": true})),
        404,
        "volume_not_in_store",
    )
    .await;
    d.stop().await;
}

/// A hand-off (SIGHUP) closes a `Stopped` volume, keeping no device for it, and the next
/// daemon on the same data directory serves it with the last write, then removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_volume_is_closed_by_a_hand_off_and_served_by_the_next_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let (d, store) = stopped_daemon(dir.path()).await;
    assert_eq!(d.manager().handoff().await, 0, "it has no device to keep");
    d.expect_error(Method::DELETE, "/v1/volumes/v", None, 503, "shutting_down")
        .await;
    let mut d = restart_with_the_store_back(d, dir.path(), &store, 4096).await;
    let r = d.req(Method::DELETE, "/v1/volumes/v", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(cache_dirs(&d.cfg).is_empty());
    let (b0, b1) = blocks_from_store(&d).await;
    assert!(b0.iter().all(|&b| b == 1), "block 0");
    assert!(
        b1.iter().all(|&b| b == 2),
        "block 1, written as the device stopped"
    );
    d.stop().await;
}

/// (Issue 45, smaller item.) Calls racing a remove: flush, compact and snapshot on a volume
/// while a remove (plain or with purge) takes it away answer what they did, 404 once it is
/// gone or 409 `volume_closing` while it goes, never 500 `internal` (as they did when the
/// engine said the volume was closed, released, or its objects purged). Each call repeats
/// until the volume is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_racing_a_remove_answer_404_or_409_never_internal() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = api_support::daemon::start(dir.path()).await;
    let mut seen = std::collections::BTreeMap::<(&str, u16, String), u32>::new();
    for round in 0..10u8 {
        // A plain remove leaves the volume in the store: a new name each round.
        let name = format!("v{round}");
        d.create(json!({"name": name, "size": "4M", "block_size": "64K"}))
            .await;
        d.volume(&name).write(0, &[round; 65536]).await.unwrap();
        let calls =
            [("flush", false), ("compact", false), ("snapshots", true)].map(|(call, snapshot)| {
                let client = d.client.clone();
                let path = format!("/v1/volumes/{name}/{call}");
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    for i in 0.. {
                        let body = snapshot.then(|| format!(r#"{{"name":"s{round}-{i}"}}"#).into());
                        let r = client.raw(Method::POST, &path, &[], body).await.unwrap();
                        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                        let code = v["error"]["code"].as_str().unwrap_or("-").to_string();
                        answers.push((call, r.status, code));
                        if r.status == 404 {
                            break;
                        }
                    }
                    answers
                })
            });
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let purge = if round % 2 == 0 { "false" } else { "true" };
        let r = d
            .req(
                Method::DELETE,
                &format!("/v1/volumes/{name}?purge={purge}"),
                None,
            )
            .await;
        assert_eq!(r.status, 200, "{}", text(&r));
        for c in calls {
            for answer in c.await.unwrap() {
                *seen.entry(answer).or_default() += 1;
            }
        }
    }
    let odd: Vec<_> = seen
        .iter()
        .filter(|((_, status, code), _)| match status {
            200 | 201 => false,
            404 => code != "not_found",
            409 => code != "volume_closing",
            _ => true,
        })
        .collect();
    assert!(odd.is_empty(), "{odd:?} among {seen:?}");
    d.stop().await;
}
