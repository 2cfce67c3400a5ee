//! API tests of snapshots and clones: create, list, show, delete; a snapshot attached
//! read-only; a clone; what is refused while something uses a snapshot (delete, purge), and
//! to a read-only export of another daemon's volume (purge, snapshot create and delete); the
//! request errors; and all of it across a daemon restart (the harness is `api_support`; data
//! is checked through the engine handles of the daemon's volumes).

mod api_support;

use glidefs::model::{SnapshotDoc, SnapshotList, VolumeInfo};
use hyper::Method;
use serde_json::json;

use api_support::daemon::{start, start_other_host, store_objects, text, Daemon};

const MIB: usize = 1 << 20;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

async fn read(d: &Daemon, name: &str) -> Vec<u8> {
    let mut buf = vec![0; 4 * MIB];
    d.volume(name).read(0, &mut buf).await.unwrap();
    buf
}

async fn snapshot(d: &Daemon, volume: &str, name: &str) -> SnapshotDoc {
    let r = d
        .req(
            Method::POST,
            &format!("/v1/volumes/{volume}/snapshots"),
            Some(json!({ "name": name })),
        )
        .await;
    assert_eq!(r.status, 201, "{}", text(&r));
    serde_json::from_slice(&r.body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_attach_clone_and_delete_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "vol", "size": "4M", "block_size": "64K"}))
        .await;
    let first = pattern(1, 4 * MIB);
    d.volume("vol").write(0, &first).await.unwrap();
    // Not flushed: the snapshot flushes.
    let s = snapshot(&d, "vol", "s1").await;
    assert_eq!((s.volume.as_str(), s.name.as_str()), ("vol", "s1"));
    assert_eq!((s.size, s.block_size), (4 << 20, 64 << 10));
    assert!(s.generation >= 2 && s.clones.is_empty() && s.attached.is_empty());
    let second = pattern(2, MIB);
    d.volume("vol").write(MIB as u64, &second).await.unwrap();
    let mut now = first.clone();
    now[MIB..2 * MIB].copy_from_slice(&second);

    // Attached read-only: the point in time, whatever the volume does.
    let a = d
        .create(json!({"name": "vol-s1", "from": "vol@s1", "read_only": true}))
        .await;
    assert_eq!(a.snapshot.as_deref(), Some("vol@s1"));
    assert!(a.read_only);
    assert_eq!((a.size, a.block_size), (4 << 20, 64 << 10));
    assert!(
        read(&d, "vol-s1").await == first,
        "attachment reads the snapshot"
    );
    assert!(d.volume("vol-s1").write(0, &[7; 4096]).await.is_err());
    d.expect_error(
        Method::POST,
        "/v1/volumes/vol-s1/compact",
        None,
        409,
        "read_only",
    )
    .await;
    d.expect_error(
        Method::POST,
        "/v1/volumes/vol-s1/snapshots",
        Some(json!({"name": "x"})),
        409,
        "read_only",
    )
    .await;
    d.expect_error(
        Method::DELETE,
        "/v1/volumes/vol-s1?purge=true",
        None,
        409,
        "read_only",
    )
    .await;

    // A clone starts from the snapshot and diverges.
    let c = d.create(json!({"name": "c1", "from": "vol@s1"})).await;
    assert!(!c.read_only && c.snapshot.is_none());
    assert!(read(&d, "c1").await == first, "clone reads the snapshot");
    let third = pattern(3, MIB);
    d.volume("c1").write(0, &third).await.unwrap();
    let mut cloned = first.clone();
    cloned[..MIB].copy_from_slice(&third);
    for name in ["vol", "c1"] {
        let r = d
            .req(Method::POST, &format!("/v1/volumes/{name}/flush"), None)
            .await;
        assert_eq!(r.status, 200, "{}", text(&r));
    }
    assert!(read(&d, "vol").await == now, "origin keeps its own writes");
    assert!(read(&d, "c1").await == cloned, "clone keeps its own writes");
    assert!(read(&d, "vol-s1").await == first);

    // Listed with what uses it.
    let r = d.req(Method::GET, "/v1/volumes/vol/snapshots", None).await;
    let list: SnapshotList = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(list.snapshots.len(), 1, "{}", text(&r));
    assert_eq!(list.snapshots[0].clones, ["c1"]);
    assert_eq!(list.snapshots[0].attached, ["vol-s1"]);
    let r = d
        .req(Method::GET, "/v1/volumes/vol/snapshots/s1", None)
        .await;
    let shown: SnapshotDoc = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(shown.generation, s.generation);

    // Everything survives a restart: the attachment and the clone reopen from state.json.
    d.stop().await;
    let mut d = start(dir.path()).await;
    assert!(read(&d, "vol").await == now);
    assert!(read(&d, "c1").await == cloned);
    assert!(read(&d, "vol-s1").await == first);
    let v: VolumeInfo = d.manager().inspect("vol-s1").await.unwrap();
    assert_eq!(v.snapshot.as_deref(), Some("vol@s1"));

    // In use: not deleted, and the origin not purged.
    let r = d
        .req(Method::DELETE, "/v1/volumes/vol/snapshots/s1", None)
        .await;
    assert_eq!(r.status, 409, "{}", text(&r));
    assert!(text(&r).contains("snapshot_in_use") && text(&r).contains("vol-s1"));
    let r = d.req(Method::DELETE, "/v1/volumes/vol-s1", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = d
        .req(Method::DELETE, "/v1/volumes/vol/snapshots/s1", None)
        .await;
    assert_eq!(r.status, 409, "{}", text(&r));
    assert!(text(&r).contains("c1"), "{}", text(&r));
    let r = d
        .req(Method::DELETE, "/v1/volumes/vol?purge=true", None)
        .await;
    assert_eq!(r.status, 409, "{}", text(&r));
    assert!(text(&r).contains("c1 (from s1)"), "{}", text(&r));
    assert!(
        read(&d, "vol").await == now,
        "a refused purge touches nothing"
    );
    // The clone purged, the snapshot goes, then the origin can be purged too.
    let r = d
        .req(Method::DELETE, "/v1/volumes/c1?purge=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = d
        .req(Method::DELETE, "/v1/volumes/vol/snapshots/s1", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    d.expect_error(
        Method::GET,
        "/v1/volumes/vol/snapshots/s1",
        None,
        404,
        "snapshot_not_found",
    )
    .await;
    let r = d
        .req(Method::DELETE, "/v1/volumes/vol?purge=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_requests_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "vol", "size": "4M", "block_size": "64K"}))
        .await;
    let post = |name: &str| Some(json!({ "name": name }));
    let snaps = "/v1/volumes/vol/snapshots";
    d.expect_error(Method::POST, snaps, post("a b"), 400, "invalid_snapshot")
        .await;
    d.expect_error(Method::POST, snaps, Some(json!({})), 400, "bad_request")
        .await;
    d.expect_error(
        Method::POST,
        "/v1/volumes/nope/snapshots",
        post("s"),
        404,
        "not_found",
    )
    .await;
    snapshot(&d, "vol", "s").await;
    d.expect_error(Method::POST, snaps, post("s"), 409, "snapshot_exists")
        .await;
    d.expect_error(
        Method::DELETE,
        "/v1/volumes/vol/snapshots/none",
        None,
        404,
        "snapshot_not_found",
    )
    .await;
    let create = "/v1/volumes";
    for (body, status, code) in [
        (json!({"name": "c", "from": "vol"}), 400, "invalid_snapshot"),
        (
            json!({"name": "c", "from": "vol@"}),
            400,
            "invalid_snapshot",
        ),
        (
            json!({"name": "c", "from": "vol@none"}),
            404,
            "snapshot_not_found",
        ),
        (
            json!({"name": "c", "from": "none@s"}),
            404,
            "snapshot_not_found",
        ),
        (
            json!({"name": "c", "from": "vol@s", "attach_existing": true}),
            400,
            "invalid_snapshot",
        ),
        (
            json!({"name": "c", "from": "vol@s", "size": "8M"}),
            409,
            "geometry_mismatch",
        ),
        (json!({"name": "vol", "from": "vol@s"}), 409, "duplicate"),
    ] {
        d.expect_error(Method::POST, create, Some(body), status, code)
            .await;
    }
    // A clone's name must be new in the store too.
    d.create(json!({"name": "c", "from": "vol@s"})).await;
    let r = d.req(Method::DELETE, "/v1/volumes/c", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    d.expect_error(
        Method::POST,
        create,
        Some(json!({"name": "c", "from": "vol@s"})),
        409,
        "volume_exists_in_store",
    )
    .await;
    d.stop().await;
}

/// (Review finding.) A snapshot attached read-only on this daemon cannot be deleted
/// (`snapshot_in_use`), but its origin can be purged: `check_purge` looks at the clones of
/// the origin's snapshots only, never at `attachments_of`. The purge deletes every object of
/// the origin, the snapshot's record and packs included, and the attachment, still exported,
/// then fails every read of a block it has not cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_with_an_attached_snapshot_must_not_be_purged() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "vol", "size": "4M", "block_size": "64K"}))
        .await;
    let data: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
    d.volume("vol").write(0, &data).await.unwrap();
    let r = d
        .req(
            Method::POST,
            "/v1/volumes/vol/snapshots",
            Some(json!({ "name": "s1" })),
        )
        .await;
    assert_eq!(r.status, 201, "{}", text(&r));
    d.create(json!({"name": "vol-s1", "from": "vol@s1", "read_only": true}))
        .await;
    // Deleting the snapshot is refused while it is attached ...
    let r = d
        .req(Method::DELETE, "/v1/volumes/vol/snapshots/s1", None)
        .await;
    assert_eq!(r.status, 409, "{}", text(&r));
    // ... and so must be purging its origin.
    let purge = d
        .req(Method::DELETE, "/v1/volumes/vol?purge=true", None)
        .await;
    let mut buf = vec![0; 4 * MIB];
    let read = d.volume("vol-s1").read(0, &mut buf).await;
    assert!(
        purge.status == 409 && read.is_ok() && buf == data,
        "purge of `vol` while `vol-s1` (vol@s1) is attached: {} {}; the attachment's read: {:?}",
        purge.status,
        text(&purge),
        read.err()
    );
    d.stop().await;
}

/// (Issue 45, item 7.) A read-only export of another daemon's volume (`read_only` +
/// `attach_existing`: it claims nothing) is not the owner: it may not purge the volume, nor
/// record or delete its snapshots (`read_only`, nothing in the store touched); it may list
/// them, and be removed without purge. The owner goes on unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_export_may_not_purge_or_snapshot_the_owners_volume() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = start(dir.path()).await;
    let mut b = start_other_host(dir.path(), "b").await;

    a.create(json!({"name": "vol", "size": "4M", "block_size": "64K"}))
        .await;
    let data = pattern(7, 4 * MIB);
    a.volume("vol").write(0, &data).await.unwrap();
    snapshot(&a, "vol", "s1").await;
    let ro = b
        .create(json!({"name": "vol", "read_only": true, "attach_existing": true}))
        .await;
    assert!(ro.read_only, "{ro:?}");
    let before = store_objects(dir.path());
    for (method, path, body) in [
        (Method::DELETE, "/v1/volumes/vol?purge=true", None),
        (
            Method::DELETE,
            "/v1/volumes/vol?purge=true&force=true",
            None,
        ),
        (
            Method::POST,
            "/v1/volumes/vol/snapshots",
            Some(json!({"name": "s2"})),
        ),
        (Method::DELETE, "/v1/volumes/vol/snapshots/s1", None),
    ] {
        b.expect_error(method, path, body, 409, "read_only").await;
    }
    assert_eq!(store_objects(dir.path()), before, "refusals touch nothing");
    let r = b.req(Method::GET, "/v1/volumes/vol/snapshots", None).await;
    let list: SnapshotList = serde_json::from_slice(&r.body).unwrap();
    let names: Vec<&str> = list.snapshots.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["s1"], "{}", text(&r));
    let r = b.req(Method::DELETE, "/v1/volumes/vol", None).await;
    assert_eq!(r.status, 200, "a plain remove of the export: {}", text(&r));
    assert!(b.names().await.is_empty());

    // The owner still serves, flushes and snapshots its volume.
    assert!(read(&a, "vol").await == data);
    a.volume("vol").write(0, &[9; 4096]).await.unwrap();
    a.client.flush("vol").await.unwrap();
    snapshot(&a, "vol", "s2").await;
    b.stop().await;
    a.stop().await;
}
