//! API tests of the volume lifecycle: create, list, show, flush, remove (flush, force,
//! purge), attach of a stored volume and its geometry, state across a restart, the background
//! flusher and garbage collection (the harness is `api_support`).

mod api_support;

use std::path::Path;
use std::sync::Arc;

use glidefs::model::{VolumeInfo, VolumeList, VolumeState};
use glidefs::ublk::export::NoDevices;
use glidefs_objstore::StoreConfig;
use hyper::Method;
use serde_json::{json, Value};

use api_support::daemon::{
    assert_error, cache_dirs, config, file_store, start, start_with, store_objects, text,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_list_show_flush_remove() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;

    let v = d
        .create(json!({"name": "vol-1", "size": "64M", "block_size": "64K", "queues": 2, "queue_depth": 32}))
        .await;
    assert_eq!(v.name, "vol-1");
    assert_eq!(
        (v.size, v.block_size, v.queues, v.queue_depth),
        (64 << 20, 64 << 10, 2, 32)
    );
    assert_eq!(v.state, VolumeState::Running);
    assert_eq!(v.device.path, None, "NoDevices has no device");
    assert_eq!(v.device.transport, None);
    assert_eq!(
        v.manifest_generation, 1,
        "a new volume is claimed at create"
    );
    assert!(!v.fenced);
    assert!(Path::new(&v.cache_dir).is_dir());
    // Defaults fill what the request leaves out.
    let w = d.create(json!({"name": "vol-2", "size": 1 << 30})).await;
    assert_eq!(
        (w.block_size, w.queues, w.queue_depth, w.read_only),
        (128 << 10, 1, 64, false)
    );

    let r = d.req(Method::GET, "/v1/volumes", None).await;
    assert_eq!(r.status, 200);
    let list: VolumeList = serde_json::from_slice(&r.body).unwrap();
    let names: Vec<_> = list.volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["vol-1", "vol-2"]);

    let r = d.req(Method::GET, "/v1/volumes/vol-1", None).await;
    assert_eq!(r.status, 200);
    let shown: VolumeInfo = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(shown.name, "vol-1");

    let r = d.req(Method::POST, "/v1/volumes/vol-1/flush", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let f: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(f["name"], "vol-1");
    assert_eq!(f["blocks"], 0, "nothing written, nothing flushed");

    let cache_dir = shown.cache_dir.clone();
    let r = d.req(Method::DELETE, "/v1/volumes/vol-1", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(!Path::new(&cache_dir).exists(), "local cache deleted");
    let r = d.req(Method::GET, "/v1/volumes/vol-1", None).await;
    assert_error(&r, 404, "not_found", "removed volume");
    let list = d.client.list().await.unwrap();
    assert_eq!(list.volumes.len(), 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_puts_data_in_the_store_attach_existing_and_purge() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "data", "size": "8M", "block_size": "64K", "prefix": "tenant-a/prod"}))
        .await;
    let pattern = glidefs_testkit::pattern(4096, 1, 256 * 1024);
    d.volume("data").write(4096, &pattern).await.unwrap();
    let v = d.client.show("data").await.unwrap();
    assert!(v.dirty_bytes >= pattern.len() as u64, "{v:?}");
    assert!(v.flush.lag_secs >= 0.0);

    let f = d.client.flush("data").await.unwrap();
    assert_eq!(f.generation, 2, "1 is the claim at create");
    assert!(f.blocks >= 4 && f.bytes > 0, "{f:?}");
    let v = d.client.show("data").await.unwrap();
    assert_eq!(
        (v.dirty_bytes, v.syncing_bytes, v.manifest_generation),
        (0, 0, 2)
    );
    assert_eq!(v.flush.count, 1);
    assert!(v.flush.last_success_unix.is_some());
    let objects = store_objects(dir.path());
    assert!(
        objects.iter().any(|p| p
            .to_string_lossy()
            .contains("tenant-a/prod/volumes/data/manifest/")),
        "{objects:?}"
    );

    // Remove keeps the store data: re-creating the name is refused, attaching it works.
    d.client.remove("data", false, false).await.unwrap();
    assert!(!store_objects(dir.path()).is_empty());
    let body =
        json!({"name": "data", "size": "8M", "block_size": "64K", "prefix": "tenant-a/prod"});
    let r = d.req(Method::POST, "/v1/volumes", Some(body)).await;
    assert_error(
        &r,
        409,
        "volume_exists_in_store",
        "re-create over a stored volume",
    );
    // The stored geometry is checked.
    let r = d
        .req(Method::POST, "/v1/volumes", Some(json!({"name": "data", "size": "16M", "block_size": "64K", "prefix": "tenant-a/prod", "attach_existing": true})))
        .await;
    assert_error(&r, 409, "geometry_mismatch", "attach with another size");
    for body in [
        json!({"name": "data", "block_size": "4K", "prefix": "tenant-a/prod", "attach_existing": true}),
        json!({"name": "data", "size": "8M", "block_size": "128K", "prefix": "tenant-a/prod", "attach_existing": true}),
        // 8M is not a multiple of 16M: still a geometry mismatch, not `invalid_size`.
        json!({"name": "data", "block_size": "16M", "prefix": "tenant-a/prod", "attach_existing": true}),
    ] {
        d.expect_error(
            Method::POST,
            "/v1/volumes",
            Some(body),
            409,
            "geometry_mismatch",
        )
        .await;
    }
    assert!(d.client.list().await.unwrap().volumes.is_empty());
    // Size and block size come from the manifest when left out.
    let v = d
        .create(json!({"name": "data", "prefix": "tenant-a/prod", "attach_existing": true}))
        .await;
    // Generation 1 was the claim at create, 2 the flush, 3 the release at remove, 4 this
    // daemon's claim.
    assert_eq!(
        (v.size, v.block_size, v.manifest_generation),
        (8 << 20, 64 << 10, 4)
    );
    assert_eq!(v.cache_bytes, 0, "cold cache");
    let mut back = vec![0u8; pattern.len()];
    d.volume("data").read(4096, &mut back).await.unwrap();
    assert!(back == pattern, "data read back cold from the store");
    assert!(d.client.show("data").await.unwrap().cold_reads > 0);

    // Without the prefix it is another volume (nothing stored there).
    let r = d
        .req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "data", "size": "8M"})),
        )
        .await;
    assert_error(&r, 409, "duplicate", "same name, other prefix, same daemon");

    // Purge deletes every object of the volume; the name is then free in the store.
    let r = d.client.remove("data", true, false).await.unwrap();
    assert!(r.purged_objects >= 2, "{r:?}");
    assert!(
        store_objects(dir.path()).is_empty(),
        "{:?}",
        store_objects(dir.path())
    );
    let v = d
        .create(json!({"name": "data", "size": "8M", "prefix": "tenant-a/prod"}))
        .await;
    assert_eq!(v.manifest_generation, 1, "a new volume, claimed at create");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_existing_without_a_manifest_creates_and_needs_a_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let r = d
        .req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "fresh", "attach_existing": true})),
        )
        .await;
    assert_error(
        &r,
        404,
        "volume_not_in_store",
        "attach of nothing without a size",
    );
    let v = d
        .create(json!({"name": "fresh", "size": "4M", "attach_existing": true}))
        .await;
    assert_eq!(v.manifest_generation, 1);
    d.stop().await;
}

/// A read-only export of a volume that is in no store is refused (issue 45, "smaller"): there
/// is nothing to export, and an empty `running` volume would pass for one. Nothing is left
/// behind (no entry, no cache directory, no object); once the volume exists, the same export
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_export_of_a_volume_in_no_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    for body in [
        json!({"name": "ghost", "read_only": true, "attach_existing": true}),
        json!({"name": "ghost", "size": "4M", "read_only": true, "attach_existing": true}),
        json!({"name": "ghost", "size": "4M", "read_only": true}),
        json!({"name": "ghost", "size": "4M", "read_only": true, "prefix": "elsewhere"}),
    ] {
        let r = d.req(Method::POST, "/v1/volumes", Some(body.clone())).await;
        assert_error(&r, 404, "volume_not_in_store", &body.to_string());
        assert!(text(&r).contains("`ghost`"), "{}", text(&r));
    }
    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty());
    assert!(store_objects(dir.path()).is_empty());

    d.create(json!({"name": "ghost", "size": "4M"})).await;
    d.client.remove("ghost", false, false).await.unwrap();
    let v = d
        .create(json!({"name": "ghost", "read_only": true, "attach_existing": true}))
        .await;
    assert_eq!(
        (v.read_only, v.size, v.state),
        (true, 4 << 20, VolumeState::Running)
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "keep", "size": "4M", "block_size": "4K", "queues": 3}))
        .await;
    d.create(json!({"name": "pre", "size": "8M", "prefix": "x"}))
        .await;
    d.create(json!({"name": "gone", "size": "4M"})).await;
    d.client.remove("gone", false, false).await.unwrap();
    // Written, not flushed to the store: survives in the local cache (close at shutdown).
    d.volume("keep")
        .write(0, b"still here after restart")
        .await
        .unwrap();
    d.stop().await;

    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(d.cfg.state_path()).unwrap()).unwrap();
    let names: Vec<_> = state["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].clone())
        .collect();
    assert_eq!(names, [json!("keep"), json!("pre")]);

    let mut d = start(dir.path()).await;
    let list = d.client.list().await.unwrap().volumes;
    let names: Vec<_> = list.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["keep", "pre"]);
    assert!(list.iter().all(|v| v.state == VolumeState::Running));
    assert_eq!((list[0].queues, list[0].block_size), (3, 4096));
    assert_eq!(list[1].prefix.as_deref(), Some("x"));
    let mut buf = vec![0u8; 24];
    d.volume("keep").read(0, &mut buf).await.unwrap();
    assert_eq!(&buf, b"still here after restart");
    assert!(list[0].dirty_bytes > 0);

    // A restart where a volume cannot be opened lists it as failed; it can be removed with force.
    d.stop().await;
    let keep_dir = d.cfg.volumes_dir().join("keep");
    std::fs::remove_dir_all(&keep_dir).unwrap();
    std::fs::write(&keep_dir, b"not a directory").unwrap();
    let mut d = start(dir.path()).await;
    let v = d.client.show("keep").await.unwrap();
    assert_eq!(v.state, VolumeState::Failed);
    assert!(
        v.error.as_deref().unwrap_or("").contains("re-attach"),
        "{v:?}"
    );
    let r = d.req(Method::POST, "/v1/volumes/keep/flush", None).await;
    assert_error(&r, 409, "volume_failed", "flush of a failed volume");
    let r = d.req(Method::DELETE, "/v1/volumes/keep", None).await;
    assert_error(
        &r,
        409,
        "volume_failed",
        "remove of a failed volume without force",
    );
    let r = d
        .req(Method::DELETE, "/v1/volumes/keep?force=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(d.client.list().await.unwrap().volumes.len(), 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_flusher_uploads_by_threshold_and_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), false);
    cfg.volume_defaults.flush_threshold_bytes = glidefs::size::ByteSize(64 << 10);
    cfg.volume_defaults.flush_interval_secs = 2;
    let mut d = start_with(cfg, Arc::new(NoDevices)).await;
    d.create(json!({"name": "big", "size": "4M", "block_size": "4K"}))
        .await;
    d.create(json!({"name": "small", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("big").write(0, &[1u8; 256 << 10]).await.unwrap();
    d.volume("small").write(0, &[2u8; 4096]).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let list = d.client.list().await.unwrap().volumes;
        // A volume whose dirty bytes were just rotated shows them as syncing until its
        // upload ends: only then is its flush counted.
        assert!(list.iter().all(|v| v.flush.errors == 0), "{list:?}");
        if list.iter().all(|v| {
            v.flush.count >= 1
                && v.manifest_generation >= 1
                && v.dirty_bytes == 0
                && v.syncing_bytes == 0
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "flusher did not run: {list:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_prunes_old_manifests_of_the_configured_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), false);
    cfg.gc.grace_secs = 0;
    cfg.gc.keep_manifests = 1;
    let mut d = start_with(cfg.clone(), Arc::new(NoDevices)).await;
    d.create(json!({"name": "g", "size": "1M", "block_size": "4K"}))
        .await;
    d.create(json!({"name": "h", "size": "1M", "block_size": "4K", "prefix": "p"}))
        .await;
    for i in 0..3u8 {
        d.volume("g").write(0, &[i; 4096]).await.unwrap();
        d.client.flush("g").await.unwrap();
    }
    d.volume("h").write(0, &[9; 4096]).await.unwrap();
    d.client.flush("h").await.unwrap();

    let dry = glidefs::daemon::gc::run(&cfg, true, None).await.unwrap();
    let g = dry.iter().find(|r| r.volume == "g").expect("g collected");
    assert_eq!(
        (g.manifests_deleted.clone(), g.manifests_retained.clone()),
        (vec![1, 2, 3], vec![4])
    );
    assert!(g.dry_run && g.packs_deleted == 2, "{g:?}");
    let h = dry
        .iter()
        .find(|r| r.volume == "h")
        .expect("prefixed volume found via state.json");
    assert_eq!(h.prefix.as_deref(), Some("p"));
    let before = store_objects(dir.path()).len();
    let real = glidefs::daemon::gc::run(&cfg, false, Some("g"))
        .await
        .unwrap();
    assert_eq!(real.len(), 1);
    let gone = real[0].manifests_deleted.len() + real[0].packs_deleted;
    assert_eq!(store_objects(dir.path()).len(), before - gone);
    // The volume still reads back its latest data.
    d.client.remove("g", false, false).await.unwrap();
    d.create(json!({"name": "g", "attach_existing": true}))
        .await;
    let mut buf = vec![0u8; 4096];
    d.volume("g").read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&b| b == 2));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_flushes_by_default_force_drops_and_purge_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let first = glidefs_testkit::pattern(0, 1, 64 * 1024);
    let second = vec![0xabu8; 64 * 1024];

    // Default: data written and never flushed reaches the store before the cache goes.
    let v = d
        .create(json!({"name": "r", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("r").write(0, &first).await.unwrap();
    let r = d.req(Method::DELETE, "/v1/volumes/r", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let report: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(report, json!({"name": "r", "purged_objects": 0}));
    assert!(!Path::new(&v.cache_dir).exists(), "local cache deleted");
    d.expect_error(Method::GET, "/v1/volumes/r", None, 404, "not_found")
        .await;
    d.expect_error(Method::DELETE, "/v1/volumes/r", None, 404, "not_found")
        .await;
    let v = d
        .create(json!({"name": "r", "attach_existing": true}))
        .await;
    // Generation 1 was the claim at create, 2 the flush, 3 the release, 4 this claim.
    assert_eq!(
        (v.size, v.block_size, v.manifest_generation),
        (4 << 20, 4096, 4)
    );
    let mut back = vec![0u8; first.len()];
    d.volume("r").read(0, &mut back).await.unwrap();
    assert!(back == first, "flushed by the remove");

    // force=true: no flush; what was not in the store is gone.
    d.volume("r").write(0, &second).await.unwrap();
    let r = d
        .req(Method::DELETE, "/v1/volumes/r?force=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let v = d
        .create(json!({"name": "r", "attach_existing": true}))
        .await;
    assert_eq!(
        v.manifest_generation, 5,
        "nothing published by a forced remove: 4 was the last claim, 5 this one"
    );
    d.volume("r").read(0, &mut back).await.unwrap();
    assert!(back == first, "the unflushed write was dropped");

    // purge=true (with or without force): every object goes, nothing is left to attach.
    for (i, query) in [
        "purge=true",
        "purge=true&force=true",
        "force=true&purge=true",
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            d.create(json!({"name": "r", "size": "4M", "block_size": "4K"}))
                .await;
            d.volume("r").write(0, &second).await.unwrap();
            d.client.flush("r").await.unwrap();
        }
        d.volume("r").write(8192, &second).await.unwrap();
        let r = d
            .req(Method::DELETE, &format!("/v1/volumes/r?{query}"), None)
            .await;
        assert_eq!(r.status, 200, "{query}: {}", text(&r));
        let report: Value = serde_json::from_slice(&r.body).unwrap();
        assert!(report["purged_objects"].as_u64().unwrap() >= 2, "{report}");
        assert!(store_objects(dir.path()).is_empty(), "{query}");
        d.expect_error(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "r", "attach_existing": true})),
            404,
            "volume_not_in_store",
        )
        .await;
    }
    // Explicit false is the default.
    d.create(json!({"name": "r", "size": "4M"})).await;
    let r = d
        .req(
            Method::DELETE,
            "/v1/volumes/r?purge=false&force=false",
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty());
    d.stop().await;
}

/// `attach_existing` takes the geometry from the stored manifest; it is held to the limits of
/// a create request (at most 256T, a block size the cache takes), not trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_existing_refuses_a_stored_geometry_beyond_the_limits() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let store = file_store(dir.path());
    for (name, block_size, size, code) in [
        (
            "huge",
            128 << 10,
            (256u64 << 40) + (128 << 10),
            "invalid_size",
        ),
        ("huger", 1 << 20, 1u64 << 60, "invalid_size"),
        ("odd", 3000, 3000 * 1024, "invalid_block_size"),
    ] {
        let vs = glidefs_objstore::VolumeStore::new(store.clone(), name, StoreConfig::default())
            .unwrap();
        let mut m = glidefs_objstore::Manifest::new(name, block_size, size).successor();
        vs.publish_manifest(&mut m).await.unwrap();
        let body = json!({"name": name, "attach_existing": true});
        let r = d.req(Method::POST, "/v1/volumes", Some(body.clone())).await;
        assert_error(&r, 400, code, &body.to_string());
        let message = text(&r);
        assert!(
            message.contains(&size.to_string()) || message.contains(&block_size.to_string()),
            "the stored value is named: {message}"
        );
        assert!(message.contains("store"), "{message}");
        d.assert_alive(name).await;
    }
    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty());
    d.stop().await;
}

/// `durability`: `store` is kept in `state.json` (the default `local` is left out), reported,
/// and survives a restart; the volume's engine then flushes to the store on every FLUSH; a
/// value that is neither is `invalid_durability` and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durability_is_checked_kept_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    for bad in [json!("disk"), json!("")] {
        let r = d
            .req(
                Method::POST,
                "/v1/volumes",
                Some(json!({"name": "d", "size": "4M", "durability": bad})),
            )
            .await;
        assert_error(
            &r,
            400,
            "invalid_durability",
            "a durability that is not one",
        );
    }
    assert!(d.client.list().await.unwrap().volumes.is_empty());
    let v = d
        .create(json!({"name": "d", "size": "4M", "durability": "store"}))
        .await;
    assert_eq!(v.durability, glidefs::model::Durability::Store);
    let plain = d.create(json!({"name": "p", "size": "4M"})).await;
    assert_eq!(plain.durability, glidefs::model::Durability::Local);
    // The device's FLUSH goes to the store: one FLUSH, one flush to the store.
    let before = d.client.show("d").await.unwrap().manifest_generation;
    d.volume("d").write(0, &[7; 4096]).await.unwrap();
    d.volume("d").flush_durable().await.unwrap();
    let after = d.client.show("d").await.unwrap();
    assert!(after.manifest_generation > before, "{after:?}");
    assert_eq!((after.flush.store_flushes, after.flush.store_syncs), (1, 1));
    d.stop().await;
    let state = std::fs::read_to_string(d.cfg.state_path()).unwrap();
    assert_eq!(state.matches("\"durability\"").count(), 1, "{state}");
    let mut d = start(dir.path()).await;
    assert_eq!(
        d.client.show("d").await.unwrap().durability,
        glidefs::model::Durability::Store
    );
    d.stop().await;
}
