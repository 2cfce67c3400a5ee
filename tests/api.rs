//! API tests, in-process and without a kernel: the daemon (`glidefs::server::Server`) runs on a
//! temporary unix socket (and a TCP port for the auth tests) with a local-directory object
//! store and `NoDevices` (or a fake device layer). Every endpoint and every bad-input case is
//! checked for its HTTP status and error code.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use glidefs::client::{Client, ClientError, Endpoint, RawResponse};
use glidefs::config::Config;
use glidefs::device::{
    AttachedDevice, DeviceLayer, DeviceLayerError, DeviceSpec, NoDevices, Unavailable,
};
use glidefs::io_stats::{IoRecorder, IoStats};
use glidefs::model::{CreateVolume, VolumeInfo, VolumeList, VolumeState};
use glidefs::server::{Server, ServerError};
use glidefs_volume::Volume;
use hyper::Method;
use serde_json::{json, Value};
use ublk_core::IoOp;

const TOKEN: &str = "s3cret-token";

struct Daemon {
    server: Option<Server>,
    cfg: Config,
    client: Client,
}

fn config(dir: &Path, tcp: bool) -> Config {
    let mut cfg = Config {
        data_dir: dir.join("data"),
        ..Config::default()
    };
    cfg.store.url = Some(format!("file://{}", dir.join("store").display()));
    cfg.api.socket = dir.join("run/api.sock");
    cfg.volume_defaults.flush_interval_secs = 3600;
    if tcp {
        let token = dir.join("token");
        std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
        cfg.api.tcp = Some("127.0.0.1:0".parse().unwrap());
        cfg.api.token_file = Some(token);
    }
    cfg
}

async fn start_with(cfg: Config, devices: Arc<dyn DeviceLayer>) -> Daemon {
    let server = Server::start(&cfg, devices).await.expect("server starts");
    let client = Client::new(Endpoint::Unix(cfg.api.socket.clone()));
    Daemon {
        server: Some(server),
        cfg,
        client,
    }
}

async fn start(dir: &Path) -> Daemon {
    start_with(config(dir, false), Arc::new(NoDevices)).await
}

impl Daemon {
    fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }

    async fn req(&self, method: Method, path: &str, body: Option<Value>) -> RawResponse {
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.client.raw(method, path, &[], body).await.unwrap()
    }

    fn volume(&self, name: &str) -> Arc<Volume> {
        self.server().manager().volume(name).expect("volume open")
    }

    async fn create(&self, body: Value) -> VolumeInfo {
        let r = self
            .req(Method::POST, "/v1/volumes", Some(body.clone()))
            .await;
        assert_eq!(r.status, 201, "{body}: {}", text(&r));
        serde_json::from_slice(&r.body).unwrap()
    }
}

fn text(r: &RawResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// Asserts status and error code of a response.
#[track_caller]
fn assert_error(r: &RawResponse, status: u16, code: &str, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", text(r));
    let v: Value =
        serde_json::from_slice(&r.body).unwrap_or_else(|_| panic!("{what}: not JSON: {}", text(r)));
    assert_eq!(v["error"]["code"], code, "{what}: {v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: message missing: {v}"
    );
}

fn store_objects(dir: &Path) -> Vec<PathBuf> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push(path);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&dir.join("store"), &mut out);
    out
}

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
    assert_eq!(v.manifest_generation, 0);
    assert!(!v.fenced);
    assert!(Path::new(&v.cache_dir).is_dir());
    // Defaults fill what the request leaves out.
    let w = d
        .create(json!({"name": "vol-2", "size": 1 << 30, "read_only": true}))
        .await;
    assert_eq!(
        (w.block_size, w.queues, w.queue_depth, w.read_only),
        (128 << 10, 1, 64, true)
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
async fn every_bad_input_gets_its_status_and_code() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "taken", "size": "1G"})).await;

    let long = "x".repeat(129);
    let groups: Vec<(u16, &str, Vec<Value>)> = vec![
        (
            400,
            "invalid_name",
            vec![
                json!({"name": "", "size": "1G"}),
                json!({"name": "a/b", "size": "1G"}),
                json!({"name": "..", "size": "1G"}),
                json!({"name": "sp ace", "size": "1G"}),
                json!({"name": long, "size": "1G"}),
            ],
        ),
        (
            400,
            "invalid_size",
            vec![
                json!({"name": "a"}),
                json!({"name": "a", "size": 0}),
                json!({"name": "a", "size": -4096}),
                json!({"name": "a", "size": 1.5}),
                json!({"name": "a", "size": "ten gigs"}),
                json!({"name": "a", "size": "1000"}),
                json!({"name": "a", "size": "999T"}),
                json!({"name": "a", "size": true}),
            ],
        ),
        (
            400,
            "invalid_block_size",
            vec![
                json!({"name": "a", "size": "1G", "block_size": 1000}),
                json!({"name": "a", "size": "1G", "block_size": "2K"}),
                json!({"name": "a", "size": "1G", "block_size": "32M"}),
            ],
        ),
        (
            400,
            "invalid_queues",
            vec![
                json!({"name": "a", "size": "1G", "queues": 0}),
                json!({"name": "a", "size": "1G", "queues": 1000}),
                json!({"name": "a", "size": "1G", "queues": -1}),
                json!({"name": "a", "size": "1G", "queue_depth": 0}),
                json!({"name": "a", "size": "1G", "queue_depth": 4097}),
            ],
        ),
        (
            400,
            "invalid_prefix",
            vec![
                json!({"name": "a", "size": "1G", "prefix": "../x"}),
                json!({"name": "a", "size": "1G", "prefix": "a//b"}),
            ],
        ),
        (
            409,
            "duplicate",
            vec![json!({"name": "taken", "size": "1G"})],
        ),
        (
            400,
            "bad_request",
            vec![
                json!({"name": "a", "size": "1G", "colour": "blue"}),
                json!({"size": "1G"}),
                json!({"name": 7, "size": "1G"}),
                json!({"name": "a", "size": "1G", "read_only": "yes"}),
                json!([1, 2]),
                json!(null),
            ],
        ),
    ];
    for (status, code, bodies) in groups {
        for body in bodies {
            let r = d.req(Method::POST, "/v1/volumes", Some(body.clone())).await;
            assert_error(&r, status, code, &body.to_string());
        }
    }
    // Nothing half-created by any of them.
    assert_eq!(d.client.list().await.unwrap().volumes.len(), 1);
    assert!(!d.cfg.volumes_dir().join("a").exists());

    let c = &d.client;
    let raw = |m: Method,
               p: &'static str,
               h: Vec<(&'static str, &'static str)>,
               b: Option<Vec<u8>>| async move { c.raw(m, p, &h, b).await.unwrap() };
    let json_ct = vec![("content-type", "application/json")];
    // Malformed JSON, empty body, wrong content type.
    let r = raw(
        Method::POST,
        "/v1/volumes",
        json_ct.clone(),
        Some(b"{\"name\": ".to_vec()),
    )
    .await;
    assert_error(&r, 400, "bad_request", "truncated JSON");
    let r = raw(
        Method::POST,
        "/v1/volumes",
        json_ct.clone(),
        Some(b"\xff\xfe".to_vec()),
    )
    .await;
    assert_error(&r, 400, "bad_request", "not UTF-8");
    let r = raw(Method::POST, "/v1/volumes", vec![], None).await;
    assert_error(
        &r,
        415,
        "unsupported_media_type",
        "no body, no content type",
    );
    let r = raw(
        Method::POST,
        "/v1/volumes",
        vec![("content-type", "text/plain")],
        Some(b"{}".to_vec()),
    )
    .await;
    // The client adds application/json for bodies; an explicit second value makes it ambiguous.
    assert!(r.status == 415 || r.status == 400, "{}", text(&r));
    // Oversized body: 413 before parsing.
    let big = format!(
        "{{\"name\": \"big\", \"size\": \"1G\", \"prefix\": \"{}\"}}",
        "p".repeat(70 << 10)
    );
    let r = raw(
        Method::POST,
        "/v1/volumes",
        json_ct.clone(),
        Some(big.into_bytes()),
    )
    .await;
    assert_error(&r, 413, "payload_too_large", "70K body");

    // Path and query errors.
    for (m, p, status, code) in [
        (Method::GET, "/v1/volumes/nope", 404, "not_found"),
        (Method::POST, "/v1/volumes/nope/flush", 404, "not_found"),
        (Method::DELETE, "/v1/volumes/nope", 404, "not_found"),
        (Method::GET, "/v1/volumes/bad%20name", 400, "invalid_name"),
        (
            Method::POST,
            "/v1/volumes/%2E%2E/flush",
            400,
            "invalid_name",
        ),
        (Method::DELETE, "/v1/volumes/a%2Fb", 400, "invalid_name"),
        (
            Method::DELETE,
            "/v1/volumes/taken?purge=maybe",
            400,
            "bad_request",
        ),
        (
            Method::DELETE,
            "/v1/volumes/taken?purgee=true",
            400,
            "bad_request",
        ),
        (Method::GET, "/v2/volumes", 404, "not_found"),
        (Method::GET, "/", 404, "not_found"),
        (Method::PUT, "/v1/volumes", 405, "method_not_allowed"),
        (
            Method::PATCH,
            "/v1/volumes/taken",
            405,
            "method_not_allowed",
        ),
        (
            Method::GET,
            "/v1/volumes/taken/flush",
            405,
            "method_not_allowed",
        ),
    ] {
        let what = format!("{m} {p}");
        let r = raw(m, p, vec![], None).await;
        assert_error(&r, status, code, &what);
    }
    // The volume survived the bad removes, and the server is healthy after all that.
    assert_eq!(
        d.client.show("taken").await.unwrap().state,
        VolumeState::Running
    );
    assert_eq!(d.req(Method::GET, "/healthz", None).await.status, 200);

    // Errors are counted by code in /metrics.
    let m = text(&d.req(Method::GET, "/metrics", None).await);
    assert!(
        m.contains("glidefs_api_errors_total{code=\"invalid_name\"}"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_api_errors_total{code=\"payload_too_large\"} 1"),
        "{m}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let r = d.req(Method::GET, "/healthz", None).await;
    assert_eq!(
        (r.status, text(&r)),
        (200, r#"{"status":"ok"}"#.to_string())
    );
    let r = d.req(Method::GET, "/readyz", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    d.create(json!({"name": "m1", "size": "16M", "block_size": "4K"}))
        .await;
    d.volume("m1").write(0, &[7u8; 8192]).await.unwrap();
    let r = d.req(Method::GET, "/metrics", None).await;
    assert_eq!(r.status, 200);
    assert!(r
        .content_type
        .as_deref()
        .unwrap_or("")
        .starts_with("text/plain"));
    let m = text(&r);
    for needle in [
        "# TYPE glidefs_volume_io_latency_seconds histogram",
        "glidefs_volume_io_requests_total{volume=\"m1\",op=\"read\"} 0",
        "glidefs_volume_io_latency_seconds_bucket{volume=\"m1\",op=\"write\",le=\"+Inf\"} 0",
        "glidefs_volume_dirty_bytes{volume=\"m1\"} 8192",
        "glidefs_volume_up{volume=\"m1\"} 1",
        "glidefs_volume_flushes_total{volume=\"m1\"} 0",
        "glidefs_volume_blocks_fetched_total{volume=\"m1\"} 0",
        "glidefs_volume_flush_lag_seconds{volume=\"m1\"}",
        "glidefs_volumes 1",
        "glidefs_api_requests_total",
    ] {
        assert!(m.contains(needle), "missing {needle}:\n{m}");
    }
    d.client.flush("m1").await.unwrap();
    let m = text(&d.req(Method::GET, "/metrics", None).await);
    assert!(
        m.contains("glidefs_volume_flushes_total{volume=\"m1\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_volume_dirty_bytes{volume=\"m1\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_volume_manifest_generation{volume=\"m1\"} 1"),
        "{m}"
    );

    // The socket is group-accessible, nothing more.
    let mode = std::fs::metadata(&d.cfg.api.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660);
    let socket = d.cfg.api.socket.clone();
    d.stop().await;
    assert!(!socket.exists(), "socket removed at shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_puts_data_in_the_store_attach_existing_and_purge() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "data", "size": "8M", "block_size": "64K", "prefix": "tenant-a/prod"}))
        .await;
    let pattern: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    d.volume("data").write(4096, &pattern).await.unwrap();
    let v = d.client.show("data").await.unwrap();
    assert!(v.dirty_bytes >= pattern.len() as u64, "{v:?}");
    assert!(v.flush.lag_secs >= 0.0);

    let f = d.client.flush("data").await.unwrap();
    assert_eq!(f.generation, 1);
    assert!(f.blocks >= 4 && f.bytes > 0, "{f:?}");
    let v = d.client.show("data").await.unwrap();
    assert_eq!(
        (v.dirty_bytes, v.syncing_bytes, v.manifest_generation),
        (0, 0, 1)
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
    assert!(d.client.list().await.unwrap().volumes.is_empty());
    // Size and block size come from the manifest when left out.
    let v = d
        .create(json!({"name": "data", "prefix": "tenant-a/prod", "attach_existing": true}))
        .await;
    assert_eq!(
        (v.size, v.block_size, v.manifest_generation),
        (8 << 20, 64 << 10, 1)
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
    assert_eq!(v.manifest_generation, 0);
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
    assert_error(&r, 400, "invalid_size", "attach of nothing without a size");
    let v = d
        .create(json!({"name": "fresh", "size": "4M", "attach_existing": true}))
        .await;
    assert_eq!(v.manifest_generation, 0);
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
async fn tcp_listener_requires_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start_with(config(dir.path(), true), Arc::new(NoDevices)).await;
    let addr = d.server().tcp_addr().expect("tcp bound").to_string();
    let anon = Client::new(Endpoint::Tcp {
        addr: addr.clone(),
        token: None,
    });
    for path in ["/v1/volumes", "/healthz", "/metrics", "/no/such/route"] {
        let r = anon.raw(Method::GET, path, &[], None).await.unwrap();
        assert_error(&r, 401, "unauthorized", &format!("no token {path}"));
    }
    for header in [
        "Bearer wrong",
        "Bearer s3cret-tokenX",
        "Bearer ",
        "Basic s3cret-token",
        TOKEN,
    ] {
        let r = anon
            .raw(
                Method::GET,
                "/v1/volumes",
                &[("authorization", header)],
                None,
            )
            .await
            .unwrap();
        assert_error(&r, 401, "unauthorized", header);
    }
    // A create without the token does nothing.
    let body = serde_json::to_vec(&json!({"name": "t", "size": "1G"})).unwrap();
    let r = anon
        .raw(Method::POST, "/v1/volumes", &[], Some(body))
        .await
        .unwrap();
    assert_error(&r, 401, "unauthorized", "create without token");

    let authed = Client::new(Endpoint::Tcp {
        addr,
        token: Some(TOKEN.to_string()),
    });
    assert_eq!(
        authed
            .raw(Method::GET, "/healthz", &[], None)
            .await
            .unwrap()
            .status,
        200
    );
    let v = authed
        .create(&CreateVolume {
            name: "t".into(),
            size: Some(json!("1G")),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(v.name, "t");
    assert_eq!(authed.list().await.unwrap().volumes.len(), 1);
    // Errors past auth keep their codes.
    match authed.show("nope").await {
        Err(ClientError::Api {
            status: 404, code, ..
        }) => assert_eq!(code, "not_found"),
        other => panic!("{other:?}"),
    }
    // The unix socket needs no token.
    assert_eq!(d.client.list().await.unwrap().volumes.len(), 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_without_token_file_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), true);
    cfg.api.token_file = None;
    let err = cfg.validate().unwrap_err().to_string();
    assert!(
        err.contains("api.tcp") && err.contains("token_file"),
        "{err}"
    );
    // An empty token file is refused at start.
    let mut cfg = config(dir.path(), true);
    std::fs::write(cfg.api.token_file.as_ref().unwrap(), "  \n").unwrap();
    cfg.api.socket = dir.path().join("other.sock");
    match Server::start(&cfg, Arc::new(NoDevices)).await {
        Err(ServerError::EmptyToken(p)) => assert!(p.contains("token")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_without_ublk_is_501_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let layer = Arc::new(Unavailable("no /dev/ublk-control".into()));
    let mut d = start_with(config(dir.path(), false), layer).await;
    let r = d
        .req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "u", "size": "1G"})),
        )
        .await;
    assert_error(&r, 501, "unsupported_kernel", "create without ublk");
    assert!(text(&r).contains("no /dev/ublk-control"));
    assert!(d.client.list().await.unwrap().volumes.is_empty());
    assert!(!d.cfg.volumes_dir().join("u").exists());
    d.stop().await;
}

/// A device layer that pretends: `/dev/ublkbN`, `user-copy`, counts attaches and stops.
#[derive(Default)]
struct FakeDevices {
    attached: AtomicUsize,
    stopped: Arc<AtomicUsize>,
}

struct FakeDevice {
    id: u32,
    io: IoRecorder,
    stopped: Arc<AtomicUsize>,
}

impl DeviceLayer for FakeDevices {
    fn attach(
        &self,
        _name: &str,
        _volume: Arc<Volume>,
        spec: &DeviceSpec,
    ) -> Result<Box<dyn AttachedDevice>, DeviceLayerError> {
        assert!(spec.queues >= 1 && spec.max_io_bytes >= 4096);
        let id = u32::try_from(self.attached.fetch_add(1, Ordering::SeqCst)).map_err(|e| {
            DeviceLayerError::Failed {
                volume: "fake".into(),
                message: e.to_string(),
            }
        })?;
        let io = IoRecorder::default();
        io.record(
            IoOp::Read,
            4096,
            4096,
            std::time::Duration::from_micros(120),
        );
        Ok(Box::new(FakeDevice {
            id,
            io,
            stopped: self.stopped.clone(),
        }))
    }
}

impl AttachedDevice for FakeDevice {
    fn id(&self) -> Option<u32> {
        Some(self.id)
    }
    fn path(&self) -> Option<String> {
        Some(format!("/dev/ublkb{}", self.id))
    }
    fn transport(&self) -> Option<String> {
        Some("user-copy".into())
    }
    fn io_stats(&self) -> IoStats {
        self.io.snapshot()
    }
    fn stop(self: Box<Self>) -> Result<(), DeviceLayerError> {
        self.stopped.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_are_reported_and_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let layer = Arc::new(FakeDevices::default());
    let stopped = layer.stopped.clone();
    let mut d = start_with(config(dir.path(), false), layer).await;
    let v = d.create(json!({"name": "dev0", "size": "1G"})).await;
    assert_eq!(v.device.path.as_deref(), Some("/dev/ublkb0"));
    assert_eq!(
        (v.device.id, v.device.transport.as_deref()),
        (Some(0), Some("user-copy"))
    );
    d.create(json!({"name": "dev1", "size": "1G"})).await;
    let m = text(&d.req(Method::GET, "/metrics", None).await);
    assert!(
        m.contains("glidefs_volume_io_requests_total{volume=\"dev0\",op=\"read\"} 1"),
        "{m}"
    );
    assert!(m.contains("glidefs_volume_io_latency_seconds_bucket{volume=\"dev0\",op=\"read\",le=\"0.000128\"} 1"), "{m}");
    d.client.remove("dev0", false, false).await.unwrap();
    assert_eq!(stopped.load(Ordering::SeqCst), 1);
    d.stop().await;
    assert_eq!(stopped.load(Ordering::SeqCst), 2, "shutdown stops the rest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_in_use_is_refused_and_a_stale_one_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let mut second = config(dir.path(), false);
    second.data_dir = dir.path().join("data2");
    match Server::start(&second, Arc::new(NoDevices)).await {
        Err(ServerError::SocketInUse(p)) => assert!(p.contains("api.sock")),
        other => panic!("{other:?}"),
    }
    d.stop().await;
    // A socket file nobody listens on (a crashed daemon's) is replaced.
    let stale = std::os::unix::net::UnixListener::bind(&second.api.socket).unwrap();
    drop(stale);
    assert!(second.api.socket.exists());
    let mut d = start_with(second, Arc::new(NoDevices)).await;
    assert_eq!(d.req(Method::GET, "/healthz", None).await.status, 200);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bodies_never_take_the_server_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{}".to_vec(),
        b"{\"name\":\"a\",\"size\":18446744073709551616}".to_vec(),
        b"{\"name\":\"a\",\"size\":\"18446744073709551615K\"}".to_vec(),
        b"{\"name\":\"a\",\"size\":\"1G\",\"queues\":1e400}".to_vec(),
        b"{\"name\":\"\\u0000\",\"size\":\"1G\"}".to_vec(),
        vec![b'['; 10_000],
        (0..=255u8).collect(),
    ];
    for b in bodies {
        let r = d
            .client
            .raw(Method::POST, "/v1/volumes", &[], Some(b.clone()))
            .await
            .unwrap();
        assert!(
            (400..500).contains(&r.status),
            "{:?} -> {} {}",
            String::from_utf8_lossy(&b),
            r.status,
            text(&r)
        );
        let v: Value = serde_json::from_slice(&r.body).expect("JSON error body");
        assert!(v["error"]["code"].is_string());
    }
    assert_eq!(d.req(Method::GET, "/healthz", None).await.status, 200);
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
        if list
            .iter()
            .all(|v| v.manifest_generation >= 1 && v.dirty_bytes == 0)
        {
            assert!(
                list.iter()
                    .all(|v| v.flush.count >= 1 && v.flush.errors == 0),
                "{list:?}"
            );
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

    let dry = glidefs::gc::run(&cfg, true, None).await.unwrap();
    let g = dry.iter().find(|r| r.volume == "g").expect("g collected");
    assert_eq!(
        (g.manifests_deleted.clone(), g.manifests_retained.clone()),
        (vec![1, 2], vec![3])
    );
    assert!(g.dry_run && g.packs_deleted == 2, "{g:?}");
    let h = dry
        .iter()
        .find(|r| r.volume == "h")
        .expect("prefixed volume found via state.json");
    assert_eq!(h.prefix.as_deref(), Some("p"));
    let before = store_objects(dir.path()).len();
    let real = glidefs::gc::run(&cfg, false, Some("g")).await.unwrap();
    assert_eq!(real.len(), 1);
    assert_eq!(store_objects(dir.path()).len(), before - 4);
    // The volume still reads back its latest data.
    d.client.remove("g", false, false).await.unwrap();
    d.create(json!({"name": "g", "attach_existing": true}))
        .await;
    let mut buf = vec![0u8; 4096];
    d.volume("g").read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&b| b == 2));
    d.stop().await;
}
