//! Creates, clones and purges cut short, met by what comes next (issue 45 item 9, found by a
//! fresh-eyes review of the pending records): a create of the name while a failed clone is
//! still undoing itself, a restart finishing a purge of a name another host has created
//! since, a purge of a clone run again after its last step failed. Each test failed before
//! its fix (the names say what must hold now).

mod api_support;

use std::sync::Arc;
use std::time::Duration;

use glidefs::client::{Client, Endpoint};
use glidefs::ublk::export::NoDevices;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use hyper::Method;
use serde_json::json;

use api_support::daemon::{assemble, file_store, start_other_host, store_objects, text};

/// Objects of volume `name` in the store of `dir`.
fn objects_of(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let root = dir.join(format!("store/volumes/{name}"));
    store_objects(dir)
        .into_iter()
        .filter(|p| p.starts_with(&root))
        .collect()
}

/// A clone `c` of `v@s1` fails (its registration PUT is refused) and undoes itself after it
/// dropped the admin lock; its undo's first store call (the manifest listing of `only_ours`)
/// is held. A second request for `c` meanwhile (`retry`: a client's retry, a clone or a plain
/// create) is refused as a duplicate (it would otherwise be acknowledged, and the undo would
/// then find generation 1 claimed by this daemon and purge it); once the undo is done, the
/// same request succeeds, and its flushed write stays in the store.
async fn a_create_during_the_undo_of_a_failed_clone(retry: serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultyStore::new(file_store(dir.path())));
    let mut d = assemble(dir.path(), store.clone(), Arc::new(NoDevices)).await;
    d.create(json!({"name": "v", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("v").write(0, &[5u8; 4096]).await.unwrap();
    d.client.snapshot_create("v", "s1").await.unwrap();

    // The first clone's registration under v@s1 is refused...
    store.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("snapshots/s1/clones/c")
            .times(1),
    );
    // ...and its undo's first look at `c` (the 3rd listing of c's manifests: create_now's
    // load, create_clone's latest_generation, then only_ours) is slow.
    store.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::List])
            .path_contains("volumes/c/manifest")
            .after(2)
            .times(1),
    );
    let client = Client::new(Endpoint::Unix(d.cfg.api.socket.clone()));
    let first = tokio::spawn(async move {
        let body = serde_json::to_vec(&json!({"name": "c", "from": "v@s1"})).unwrap();
        client
            .raw(Method::POST, "/v1/volumes", &[], Some(body))
            .await
            .unwrap()
    });
    tokio::time::timeout(Duration::from_secs(20), store.wait_held(1))
        .await
        .expect("the undo of the failed clone reaches the store");

    // The client's retry while the undo runs: refused, the name is still taken.
    let r = d
        .req(Method::POST, "/v1/volumes", Some(retry.clone()))
        .await;
    assert_eq!(r.status, 409, "a create during the undo: {}", text(&r));
    assert!(text(&r).contains("duplicate"), "{}", text(&r));

    store.release_held();
    let r = first.await.unwrap();
    assert!(r.status >= 400, "the first clone failed: {}", text(&r));

    // The undo is done: the retry is acknowledged, written, flushed, and stays.
    d.create(retry).await;
    d.volume("c").write(0, &[7u8; 4096]).await.unwrap();
    d.client.flush("c").await.unwrap();
    assert_eq!(d.names().await, ["c", "v"], "c is served");
    let left = objects_of(dir.path(), "c");
    assert!(
        left.iter()
            .any(|p| p.to_string_lossy().contains("/manifest/")),
        "volume `c`, created (201) and flushed, has no manifest in the store: {left:?}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_retried_while_the_failed_one_undoes_itself_waits_and_then_stays() {
    a_create_during_the_undo_of_a_failed_clone(json!({"name": "c", "from": "v@s1"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_of_the_name_while_a_failed_clone_undoes_itself_waits_and_then_stays() {
    a_create_during_the_undo_of_a_failed_clone(
        json!({"name": "c", "size": "4M", "block_size": "4K"}),
    )
    .await;
}

/// A purge of clone `c` whose last step (dropping its registration under `v@s1`) failed: the
/// purge again must still know the origin (the origin record goes last), so it drops the
/// registration. Before, the origin record went with the other objects and the registration
/// stayed for good: a later plain volume `c` pinned `v@s1` (its delete refused, so a purge
/// of `v`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_purge_run_again_drops_its_registration_under_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultyStore::new(file_store(dir.path())));
    let mut d = assemble(dir.path(), store.clone(), Arc::new(NoDevices)).await;
    d.create(json!({"name": "v", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("v").write(0, &[5u8; 4096]).await.unwrap();
    d.client.snapshot_create("v", "s1").await.unwrap();
    d.create(json!({"name": "c", "from": "v@s1"})).await;

    store.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Delete])
            .path_contains("snapshots/s1/clones/c")
            .times(1),
    );
    let r = d
        .req(Method::DELETE, "/v1/volumes/c?purge=true", None)
        .await;
    assert!(
        r.status >= 400,
        "the purge's last step failed: {}",
        text(&r)
    );
    let r = d
        .req(Method::DELETE, "/v1/volumes/c?purge=true", None)
        .await;
    assert_eq!(r.status, 200, "purge again: {}", text(&r));
    let registration: Vec<_> = store_objects(dir.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("snapshots/s1/clones/c"))
        .collect();

    // The name used again, by a volume that is no clone.
    d.create(json!({"name": "c", "size": "4M", "block_size": "4K"}))
        .await;
    let r = d
        .req(Method::DELETE, "/v1/volumes/v/snapshots/s1", None)
        .await;
    assert!(
        registration.is_empty() && r.status == 200,
        "the purged clone's registration is left ({registration:?}); a plain volume `c` now \
         pins v@s1: delete answered {} {}",
        r.status,
        text(&r)
    );
    d.stop().await;
}

/// Host A's purge of clone `c` deletes every object of `c` but fails at its last step (the
/// registration under `v@s1`), then A goes down (state.json: `c` listed, `Pending::Purge`).
/// Host B creates a new volume `c`, writes and flushes it. When A starts again it must not
/// finish "its" purge on B's volume (before: every object of B's `c` deleted): B's claim is
/// in the latest manifest, so A drops the name and leaves the objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_leaves_alone_a_name_another_host_created_after_an_interrupted_purge() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultyStore::new(file_store(dir.path())));
    let mut a = assemble(dir.path(), store.clone(), Arc::new(NoDevices)).await;
    a.create(json!({"name": "v", "size": "4M", "block_size": "4K"}))
        .await;
    a.volume("v").write(0, &[5u8; 4096]).await.unwrap();
    a.client.snapshot_create("v", "s1").await.unwrap();
    a.create(json!({"name": "c", "from": "v@s1"})).await;
    store.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Delete])
            .path_contains("snapshots/s1/clones/c")
            .times(1),
    );
    let r = a
        .req(Method::DELETE, "/v1/volumes/c?purge=true", None)
        .await;
    assert!(
        r.status >= 400,
        "the purge's last step failed: {}",
        text(&r)
    );
    let left = objects_of(dir.path(), "c");
    assert!(
        left.iter().all(|p| p.ends_with("origin")),
        "c's objects are gone but its origin record (kept for the purge again): {left:?}"
    );
    // A goes down (a shutdown writes no state.json: what a kill -9 leaves).
    a.stop().await;
    store.clear_faults();

    // Host B: a new volume `c`, acknowledged, written, flushed.
    let mut b = start_other_host(dir.path(), "b").await;
    b.create(json!({"name": "c", "size": "4M", "block_size": "4K"}))
        .await;
    b.volume("c").write(0, &[9u8; 4096]).await.unwrap();
    b.client.flush("c").await.unwrap();
    let before = objects_of(dir.path(), "c");
    assert!(!before.is_empty());

    // A starts again.
    let mut a = assemble(dir.path(), store.clone(), Arc::new(NoDevices)).await;
    let after = objects_of(dir.path(), "c");
    assert!(
        !after.is_empty(),
        "host A's restart finished its interrupted purge of `c` on host B's new volume `c` \
         (created and flushed there): {} objects before, none left",
        before.len()
    );
    a.stop().await;
    b.stop().await;
}
