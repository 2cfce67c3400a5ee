//! API tests, in-process and without a kernel: the daemon (`glidefs::daemon::server::Server`) runs on a
//! temporary unix socket (and a TCP port for the auth tests) with a local-directory object
//! store and `NoDevices` (or a fake exporter). Where a test needs a part the server does not
//! let it choose (an object store that goes down, the readiness flag, a manager already shut
//! down) the daemon is assembled from the library's own parts ([`assemble`]).
//!
//! Every endpoint and every error code of `glidefs/API.md` is checked, mostly by tables (one
//! test per endpoint group): each case asserts the HTTP status, that the body is the JSON error
//! document with the stable code and a message, and that the daemon still answers afterwards.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use glidefs::cli::client::{Client, ClientError, Endpoint, RawResponse};
use glidefs::daemon::api::AppState;
use glidefs::daemon::config::Config;
use glidefs::daemon::export::{Export, ExportError, ExportSpec, Exporter, NoDevices, Unavailable};
use glidefs::daemon::manager::{ManagerOptions, ReopenBackoff, VolumeManager};
use glidefs::daemon::server::{Server, ServerError};
use glidefs::model::{CreateVolume, VolumeInfo, VolumeList, VolumeState};
use glidefs::ublk::io_stats::{IoRecorder, IoStats};
use glidefs_objstore::StoreConfig;
use glidefs_volume::Volume;
use hyper::Method;
use object_store::path::Path as StorePath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use ublk_core::IoOp;

const TOKEN: &str = "s3cret-token";

/// `api.max_body_bytes` of the test daemons (the default).
const MAX_BODY: usize = 64 << 10;

/// A running daemon: a [`Server`], or one assembled by hand ([`assemble`]).
struct Daemon {
    server: Option<Server>,
    parts: Option<Parts>,
    cfg: Config,
    client: Client,
}

/// The pieces of an assembled daemon.
struct Parts {
    manager: Arc<VolumeManager>,
    /// What `/readyz` reports.
    ready: Arc<AtomicBool>,
    serve: tokio::task::JoinHandle<()>,
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
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        cfg.api.tcp = Some("127.0.0.1:0".parse().unwrap());
        cfg.api.token_file = Some(token);
    }
    cfg
}

async fn start_with(cfg: Config, devices: Arc<dyn Exporter>) -> Daemon {
    let server = Server::start(&cfg, devices).await.expect("server starts");
    let client = Client::new(Endpoint::Unix(cfg.api.socket.clone()));
    Daemon {
        server: Some(server),
        parts: None,
        cfg,
        client,
    }
}

async fn start(dir: &Path) -> Daemon {
    start_with(config(dir, false), Arc::new(NoDevices)).await
}

/// A daemon built the way `Server::start` builds one (manager, restore, router on the unix
/// socket), but on `store` and with the readiness flag in the test's hands. Store retries are
/// one, quickly, so an outage is reported at once; a recovering volume is retried every 20 to
/// 200 ms.
async fn assemble(dir: &Path, store: Arc<dyn ObjectStore>, devices: Arc<dyn Exporter>) -> Daemon {
    let cfg = config(dir, false);
    std::fs::create_dir_all(cfg.volumes_dir()).unwrap();
    std::fs::create_dir_all(cfg.api.socket.parent().unwrap()).unwrap();
    let opts = ManagerOptions {
        volumes_dir: cfg.volumes_dir(),
        state_path: cfg.state_path(),
        defaults: cfg.volume_defaults,
        store: StoreConfig {
            max_retries: 1,
            retry_base_delay: Duration::from_millis(1),
            retry_max_delay: Duration::from_millis(5),
            ..StoreConfig::default()
        },
        owner: Some(glidefs::daemon::server::owner_id(&cfg.data_dir).expect("owner id")),
        reopen: ReopenBackoff {
            first: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
    };
    let manager = Arc::new(VolumeManager::new(opts, store, devices));
    manager.restore().await.expect("restore");
    let ready = Arc::new(AtomicBool::new(true));
    let state = AppState {
        manager: manager.clone(),
        ready: ready.clone(),
        counters: Arc::default(),
        handoff: Arc::default(),
    };
    let app = glidefs::daemon::api::router(state, MAX_BODY, None);
    let listener = tokio::net::UnixListener::bind(&cfg.api.socket).unwrap();
    let serve = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    let client = Client::new(Endpoint::Unix(cfg.api.socket.clone()));
    Daemon {
        server: None,
        parts: Some(Parts {
            manager,
            ready,
            serve,
        }),
        cfg,
        client,
    }
}

/// The object store of `dir` (`dir/store`, as [`config`] sets it).
fn file_store(dir: &Path) -> Arc<dyn ObjectStore> {
    let path = dir.join("store");
    std::fs::create_dir_all(&path).unwrap();
    glidefs_objstore::open_store(&format!("file://{}", path.display()), &Default::default())
        .unwrap()
}

impl Daemon {
    fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    fn parts(&self) -> &Parts {
        self.parts.as_ref().expect("an assembled daemon")
    }

    fn manager(&self) -> &Arc<VolumeManager> {
        match (&self.server, &self.parts) {
            (Some(s), _) => s.manager(),
            (None, Some(p)) => &p.manager,
            (None, None) => panic!("daemon stopped"),
        }
    }

    async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
        if let Some(p) = self.parts.take() {
            p.ready.store(false, Ordering::Release);
            p.serve.abort();
            let _ = p.serve.await;
            p.manager.shutdown().await;
            let _ = std::fs::remove_file(&self.cfg.api.socket);
        }
    }

    async fn req(&self, method: Method, path: &str, body: Option<Value>) -> RawResponse {
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.client.raw(method, path, &[], body).await.unwrap()
    }

    fn volume(&self, name: &str) -> Arc<Volume> {
        self.manager().volume(name).expect("volume open")
    }

    async fn create(&self, body: Value) -> VolumeInfo {
        let r = self
            .req(Method::POST, "/v1/volumes", Some(body.clone()))
            .await;
        assert_eq!(r.status, 201, "{body}: {}", text(&r));
        serde_json::from_slice(&r.body).unwrap()
    }

    /// Names of the listed volumes.
    async fn names(&self) -> Vec<String> {
        let list = self.client.list().await.unwrap().volumes;
        list.into_iter().map(|v| v.name).collect()
    }

    /// Sends `method path` (with a JSON body) and asserts the error, then that the daemon still
    /// answers.
    async fn expect_error(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        status: u16,
        code: &str,
    ) {
        let what = match &body {
            Some(b) => format!("{method} {path} {b}"),
            None => format!("{method} {path}"),
        };
        let r = self.req(method, path, body).await;
        assert_error(&r, status, code, &what);
        self.assert_alive(&what).await;
    }

    /// `/healthz` answers 200 `{"status":"ok"}`.
    async fn assert_alive(&self, after: &str) {
        let r = self.req(Method::GET, "/healthz", None).await;
        assert_eq!(
            (r.status, text(&r)),
            (200, r#"{"status":"ok"}"#.to_string()),
            "the daemon does not answer after {after}"
        );
    }

    /// `/metrics` as text.
    async fn metrics(&self) -> String {
        let r = self.req(Method::GET, "/metrics", None).await;
        assert_eq!(r.status, 200, "{}", text(&r));
        text(&r)
    }
}

fn text(r: &RawResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// Asserts status and error code of a response: a JSON error document with a message.
#[track_caller]
fn assert_error(r: &RawResponse, status: u16, code: &str, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", text(r));
    assert_eq!(
        r.content_type.as_deref(),
        Some("application/json"),
        "{what}: {}",
        text(r)
    );
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

/// Entries of the daemon's volume cache directory.
fn cache_dirs(cfg: &Config) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(cfg.volumes_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A response read off the wire by [`raw_http`].
struct Wire {
    status: u16,
    /// Status line and headers.
    head: String,
    body: Vec<u8>,
}

impl Wire {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn response(&self) -> RawResponse {
        RawResponse {
            status: self.status,
            content_type: self.header("content-type").map(str::to_string),
            body: self.body.clone().into(),
        }
    }
}

/// An HTTP/1.1 request as bytes, exactly as given (no content type unless in `headers`);
/// `content-length` is added for a body or a POST.
fn http_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Writes `request` as is and reads the answer until the server closes the connection.
async fn raw_http<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &[u8]) -> Wire {
    let exchange = async {
        // The server may answer (413, 401) before it read everything; the answer still comes.
        let _ = stream.write_all(request).await;
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        out
    };
    let out = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .expect("no answer within 30 s");
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {:?}", String::from_utf8_lossy(&out)));
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Wire {
        status,
        head,
        body: out[split + 4..].to_vec(),
    }
}

async fn unix_http(socket: &Path, request: &[u8]) -> Wire {
    raw_http(
        tokio::net::UnixStream::connect(socket).await.unwrap(),
        request,
    )
    .await
}

/// An object store that fails every call with a transient error (what a store that does not
/// answer looks like after the client's retries) while `down` is set.
#[derive(Debug)]
struct Flaky {
    inner: Arc<dyn ObjectStore>,
    down: Arc<AtomicBool>,
    /// The next this many listings find nothing: each is a listing that ran just before
    /// another writer's first publish landed.
    stale_lists: Arc<AtomicUsize>,
}

type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = object_store::Result<T>> + Send + 'a>>;

impl Flaky {
    fn check(&self) -> object_store::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            Err(object_store::Error::Generic {
                store: "flaky",
                source: "the store is down (test outage)".into(),
            })
        } else {
            Ok(())
        }
    }
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flaky({})", self.inner)
    }
}

// `ObjectStore` is an `#[async_trait]` trait; its async methods are written out as they
// desugar (this test target has no async-trait dependency).
impl ObjectStore for Flaky {
    fn put_opts<'a, 'b, 'c>(
        &'a self,
        location: &'b StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> StoreFuture<'c, PutResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            self.check()?;
            self.inner.put_opts(location, payload, opts).await
        })
    }

    fn put_multipart_opts<'a, 'b, 'c>(
        &'a self,
        location: &'b StorePath,
        opts: PutMultipartOptions,
    ) -> StoreFuture<'c, Box<dyn MultipartUpload>>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            self.check()?;
            self.inner.put_multipart_opts(location, opts).await
        })
    }

    fn get_opts<'a, 'b, 'c>(
        &'a self,
        location: &'b StorePath,
        options: GetOptions,
    ) -> StoreFuture<'c, GetResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            self.check()?;
            self.inner.get_opts(location, options).await
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<StorePath>>,
    ) -> BoxStream<'static, object_store::Result<StorePath>> {
        match self.check() {
            Ok(()) => self.inner.delete_stream(locations),
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        }
    }

    fn list(
        &self,
        prefix: Option<&StorePath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let stale = self
            .stale_lists
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        match self.check() {
            Ok(()) if stale => futures::stream::empty().boxed(),
            Ok(()) => self.inner.list(prefix),
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        }
    }

    fn list_with_delimiter<'a, 'b, 'c>(
        &'a self,
        prefix: Option<&'b StorePath>,
    ) -> StoreFuture<'c, ListResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            self.check()?;
            self.inner.list_with_delimiter(prefix).await
        })
    }

    fn copy_opts<'a, 'b, 'c, 'd>(
        &'a self,
        from: &'b StorePath,
        to: &'c StorePath,
        options: CopyOptions,
    ) -> StoreFuture<'d, ()>
    where
        'a: 'd,
        'b: 'd,
        'c: 'd,
        Self: 'd,
    {
        Box::pin(async move {
            self.check()?;
            self.inner.copy_opts(from, to, options).await
        })
    }
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
    assert_eq!(
        v.manifest_generation, 1,
        "a new volume is claimed at create"
    );
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
async fn create_rejects_every_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "taken", "size": "1G"})).await;

    let long_name = "x".repeat(129);
    let long_prefix = "p".repeat(257);
    // (status, code, bodies). Fields are checked in the order name, prefix, block_size, size,
    // queues, queue_depth; the bodies with several bad fields pin that order.
    let groups: Vec<(u16, &str, Vec<Value>)> = vec![
        (
            400,
            "invalid_name",
            vec![
                json!({"name": "", "size": "1G"}),
                json!({"name": "a/b", "size": "1G"}),
                json!({"name": "..", "size": "1G"}),
                json!({"name": ".", "size": "1G"}),
                json!({"name": "sp ace", "size": "1G"}),
                json!({"name": "tab\t", "size": "1G"}),
                json!({"name": "a:b", "size": "1G"}),
                json!({"name": "star*", "size": "1G"}),
                json!({"name": "caf\u{e9}", "size": "1G"}),
                json!({"name": "nul\u{0}", "size": "1G"}),
                json!({"name": long_name, "size": "1G"}),
                json!({"name": "", "size": 0, "prefix": "..", "block_size": 3}),
            ],
        ),
        (
            400,
            "invalid_prefix",
            vec![
                json!({"name": "a", "size": "1G", "prefix": "../x"}),
                json!({"name": "a", "size": "1G", "prefix": "a//b"}),
                json!({"name": "a", "size": "1G", "prefix": "a/./b"}),
                json!({"name": "a", "size": "1G", "prefix": "a/../b"}),
                json!({"name": "a", "size": "1G", "prefix": ""}),
                json!({"name": "a", "size": "1G", "prefix": "/"}),
                json!({"name": "a", "size": "1G", "prefix": "sp ace"}),
                json!({"name": "a", "size": "1G", "prefix": "a\\b"}),
                json!({"name": "a", "size": "1G", "prefix": "t\u{e9}nant"}),
                json!({"name": "a", "size": "1G", "prefix": long_prefix}),
                json!({"name": "a", "size": 0, "prefix": "..", "block_size": 3}),
            ],
        ),
        (
            400,
            "invalid_block_size",
            vec![
                json!({"name": "a", "size": "1G", "block_size": 1000}),
                json!({"name": "a", "size": "1G", "block_size": 2048}),
                json!({"name": "a", "size": "1G", "block_size": "2K"}),
                json!({"name": "a", "size": "1G", "block_size": "32M"}),
                json!({"name": "a", "size": "1G", "block_size": 1 << 25}),
                json!({"name": "a", "size": "1G", "block_size": "12K"}),
                json!({"name": "a", "size": "1G", "block_size": 0}),
                json!({"name": "a", "size": "1G", "block_size": -4096}),
                json!({"name": "a", "size": "1G", "block_size": 4096.5}),
                json!({"name": "a", "size": "1G", "block_size": "4097"}),
                json!({"name": "a", "size": "1G", "block_size": "big"}),
                json!({"name": "a", "size": "1G", "block_size": true}),
                json!({"name": "a", "size": "1G", "block_size": [4096]}),
                json!({"name": "a", "size": "1G", "block_size": {"k": 4}}),
                json!({"name": "a", "size": 0, "block_size": 3, "queues": 0}),
            ],
        ),
        (
            400,
            "invalid_size",
            vec![
                json!({"name": "a"}),
                json!({"name": "a", "size": null}),
                json!({"name": "a", "size": 0}),
                json!({"name": "a", "size": "0"}),
                json!({"name": "a", "size": "0G"}),
                json!({"name": "a", "size": -4096}),
                json!({"name": "a", "size": "-1G"}),
                json!({"name": "a", "size": 1.5}),
                json!({"name": "a", "size": 4096.0}),
                json!({"name": "a", "size": "1.5G"}),
                json!({"name": "a", "size": "ten gigs"}),
                json!({"name": "a", "size": "10X"}),
                json!({"name": "a", "size": ""}),
                json!({"name": "a", "size": "1000"}),
                json!({"name": "a", "size": 4096}),
                json!({"name": "a", "size": "64K", "block_size": "128K"}),
                json!({"name": "a", "size": "257T"}),
                json!({"name": "a", "size": "999T"}),
                json!({"name": "a", "size": u64::MAX}),
                json!({"name": "a", "size": "18446744073709551615K"}),
                json!({"name": "a", "size": true}),
                json!({"name": "a", "size": [1]}),
                json!({"name": "a", "size": {"G": 1}}),
                json!({"name": "a", "size": 0, "queues": 0}),
                json!({"name": "a", "size": 0, "attach_existing": true}),
            ],
        ),
        (
            400,
            "invalid_queues",
            vec![
                json!({"name": "a", "size": "1G", "queues": 0}),
                json!({"name": "a", "size": "1G", "queues": 65}),
                json!({"name": "a", "size": "1G", "queues": 1000}),
                json!({"name": "a", "size": "1G", "queues": -1}),
                json!({"name": "a", "size": "1G", "queues": 1.5}),
                json!({"name": "a", "size": "1G", "queues": 2.0}),
                json!({"name": "a", "size": "1G", "queues": "2"}),
                json!({"name": "a", "size": "1G", "queues": true}),
                json!({"name": "a", "size": "1G", "queue_depth": 0}),
                json!({"name": "a", "size": "1G", "queue_depth": 4097}),
                json!({"name": "a", "size": "1G", "queue_depth": 65536}),
                json!({"name": "a", "size": "1G", "queue_depth": -1}),
                json!({"name": "a", "size": "1G", "queue_depth": "x"}),
                json!({"name": "a", "size": "1G", "queue_depth": [64]}),
                json!({"name": "a", "size": "1G", "queues": 0, "queue_depth": 0}),
            ],
        ),
        (
            409,
            "duplicate",
            vec![
                json!({"name": "taken", "size": "1G"}),
                json!({"name": "taken", "size": "2G", "block_size": "4K", "queues": 4}),
                json!({"name": "taken", "attach_existing": true}),
                json!({"name": "taken", "size": "1G", "prefix": "elsewhere"}),
            ],
        ),
        (
            400,
            "bad_request",
            vec![
                json!({"name": "a", "size": "1G", "colour": "blue"}),
                json!({"Name": "a", "size": "1G"}),
                json!({"name": "a", "size": "1G", "device": {"id": 3}}),
                json!({"size": "1G"}),
                json!({}),
                json!({"name": 7, "size": "1G"}),
                json!({"name": null, "size": "1G"}),
                json!({"name": ["a"], "size": "1G"}),
                json!({"name": "a", "size": "1G", "read_only": "yes"}),
                json!({"name": "a", "size": "1G", "read_only": 1}),
                json!({"name": "a", "size": "1G", "attach_existing": "true"}),
                json!({"name": "a", "size": "1G", "prefix": 5}),
                json!({"name": "a", "size": "1G", "prefix": ["t"]}),
                json!([1, 2]),
                json!(null),
                json!("vol"),
                json!(42),
            ],
        ),
    ];
    let mut errors = 0;
    for (status, code, bodies) in groups {
        for body in bodies {
            d.expect_error(Method::POST, "/v1/volumes", Some(body), status, code)
                .await;
            errors += 1;
        }
    }
    // Messages name the field at fault: two bad queue fields report `queues` first.
    let r = d
        .req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "a", "size": "1G", "queues": 0, "queue_depth": 0})),
        )
        .await;
    assert!(text(&r).contains("queues 0"), "{}", text(&r));
    // Nothing half-created by any of them.
    assert_eq!(d.names().await, ["taken"]);
    assert_eq!(cache_dirs(&d.cfg), ["taken"]);
    let v = d.client.show("taken").await.unwrap();
    assert_eq!((v.state, v.size), (VolumeState::Running, 1 << 30));
    let m = d.metrics().await;
    assert!(
        m.contains("glidefs_api_errors_total{code=\"invalid_name\"} 12"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_api_errors_total{code=\"duplicate\"} 4"),
        "{m}"
    );
    assert!(errors > 90, "{errors} cases");

    // The edges of every rule are accepted.
    let long_ok = "n".repeat(128);
    let prefix_ok = format!("{}/b", "p".repeat(254));
    let accepted: Vec<(Value, Value)> = vec![
        (json!({"name": long_ok, "size": "1M"}), json!({})),
        (json!({"name": "a.b-c_D9", "size": "1M"}), json!({})),
        (json!({"name": "...", "size": "1M"}), json!({})),
        (
            json!({"name": "s1", "size": " 1GiB "}),
            json!({"size": 1 << 30}),
        ),
        (
            json!({"name": "s2", "size": "1gb"}),
            json!({"size": 1 << 30}),
        ),
        (
            json!({"name": "s3", "size": "256K", "block_size": 131072}),
            json!({"size": 256 << 10, "block_size": 128 << 10}),
        ),
        (
            json!({"name": "b4k", "size": 4096, "block_size": "4k"}),
            json!({"size": 4096, "block_size": 4096}),
        ),
        (
            json!({"name": "b16m", "size": "32M", "block_size": "16M"}),
            json!({"block_size": 16 << 20}),
        ),
        (
            json!({"name": "q-max", "size": "1M", "queues": 64, "queue_depth": 4096}),
            json!({"queues": 64, "queue_depth": 4096}),
        ),
        (
            json!({"name": "q-min", "size": "1M", "queues": 1, "queue_depth": 1}),
            json!({"queues": 1, "queue_depth": 1}),
        ),
        (
            json!({"name": "nulls", "size": "1M", "queues": null, "block_size": null, "prefix": null}),
            json!({"queues": 1, "block_size": 128 << 10, "prefix": null}),
        ),
        (
            json!({"name": "pre1", "size": "1M", "prefix": "/t/x/"}),
            json!({"prefix": "t/x"}),
        ),
        (
            json!({"name": "pre2", "size": "1M", "prefix": prefix_ok.clone()}),
            json!({"prefix": prefix_ok}),
        ),
        (
            json!({"name": "ro", "size": "1M", "read_only": true, "attach_existing": false}),
            json!({"read_only": true}),
        ),
    ];
    for (body, expect) in accepted {
        let v = serde_json::to_value(d.create(body.clone()).await).unwrap();
        for (k, want) in expect.as_object().unwrap() {
            assert_eq!(&v[k], want, "{body}: {k} in {v}");
        }
        let name = v["name"].as_str().unwrap();
        let r = d.client.remove(name, false, true).await.unwrap();
        assert_eq!(r.name, name);
    }
    assert_eq!(d.names().await, ["taken"]);
    d.stop().await;
}

/// A raw create request and the error it gets: what, headers, body, status, code.
type BodyCase<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<u8>, u16, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_rejects_bad_bodies_content_types_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let sock = d.cfg.api.socket.clone();
    let json_ct = ("content-type", "application/json");
    let good = br#"{"name": "a", "size": "1G"}"#.to_vec();
    let padded = |len: usize| {
        let mut b = br#"{"name": "big", "size": "1M"}"#.to_vec();
        b.resize(len, b' ');
        b
    };
    // (what, headers, body, status, code)
    let cases: Vec<BodyCase<'_>> = vec![
        (
            "no content type",
            vec![],
            good.clone(),
            415,
            "unsupported_media_type",
        ),
        (
            "no content type, no body",
            vec![],
            vec![],
            415,
            "unsupported_media_type",
        ),
        (
            "text/plain",
            vec![("content-type", "text/plain")],
            good.clone(),
            415,
            "unsupported_media_type",
        ),
        (
            "form",
            vec![("content-type", "application/x-www-form-urlencoded")],
            b"name=a&size=1G".to_vec(),
            415,
            "unsupported_media_type",
        ),
        (
            "multipart",
            vec![("content-type", "multipart/form-data; boundary=x")],
            good.clone(),
            415,
            "unsupported_media_type",
        ),
        (
            "jsonx",
            vec![("content-type", "application/jsonx")],
            good.clone(),
            415,
            "unsupported_media_type",
        ),
        ("empty JSON body", vec![json_ct], vec![], 400, "bad_request"),
        (
            "truncated",
            vec![json_ct],
            b"{\"name\": ".to_vec(),
            400,
            "bad_request",
        ),
        (
            "not UTF-8",
            vec![json_ct],
            b"\xff\xfe".to_vec(),
            400,
            "bad_request",
        ),
        (
            "trailing garbage",
            vec![json_ct],
            br#"{"name": "a", "size": "1G"} x"#.to_vec(),
            400,
            "bad_request",
        ),
        (
            "duplicate key",
            vec![json_ct],
            br#"{"name": "a", "name": "b", "size": "1G"}"#.to_vec(),
            400,
            "bad_request",
        ),
        (
            "single quotes",
            vec![json_ct],
            b"{'name': 'a', 'size': '1G'}".to_vec(),
            400,
            "bad_request",
        ),
        (
            "huge number",
            vec![json_ct],
            b"1e400".to_vec(),
            400,
            "bad_request",
        ),
        (
            "huge number in a field",
            vec![json_ct],
            br#"{"name": "a", "size": "1G", "queues": 1e400}"#.to_vec(),
            400,
            "bad_request",
        ),
        (
            "deep nesting",
            vec![json_ct],
            vec![b'['; 10_000],
            400,
            "bad_request",
        ),
        (
            "u64 overflow",
            vec![json_ct],
            br#"{"name": "a", "size": 18446744073709551616}"#.to_vec(),
            400,
            "invalid_size",
        ),
        (
            "one byte over the limit",
            vec![json_ct],
            padded(MAX_BODY + 1),
            413,
            "payload_too_large",
        ),
        (
            "1 MiB",
            vec![json_ct],
            padded(1 << 20),
            413,
            "payload_too_large",
        ),
    ];
    for (what, headers, body, status, code) in cases {
        let w = unix_http(&sock, &http_request("POST", "/v1/volumes", &headers, &body)).await;
        assert_error(&w.response(), status, code, what);
        d.assert_alive(what).await;
    }
    // Over the limit without a content-length (chunked): still 413.
    let mut chunked = http_request(
        "POST",
        "/v1/volumes",
        &[json_ct, ("transfer-encoding", "chunked")],
        b"",
    );
    // http_request adds content-length: 0 for a POST; drop it, the body is chunked.
    let head = String::from_utf8(chunked)
        .unwrap()
        .replace("content-length: 0\r\n", "");
    chunked = head.into_bytes();
    for _ in 0..20 {
        chunked.extend_from_slice(b"1000\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 4096));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let w = unix_http(&sock, &chunked).await;
    assert_error(&w.response(), 413, "payload_too_large", "80K chunked");
    d.assert_alive("chunked").await;

    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty());
    let m = d.metrics().await;
    assert!(
        m.contains("glidefs_api_errors_total{code=\"payload_too_large\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_api_errors_total{code=\"unsupported_media_type\"} 6"),
        "{m}"
    );

    // Accepted: exactly the limit, a charset parameter, a +json media type.
    for (name, ct, body) in [
        ("big", "application/json", padded(MAX_BODY)),
        (
            "cs",
            "application/json; charset=utf-8",
            br#"{"name": "cs", "size": "1M"}"#.to_vec(),
        ),
        (
            "plus",
            "application/vnd.glidefs+json",
            br#"{"name": "plus", "size": "1M"}"#.to_vec(),
        ),
    ] {
        let w = unix_http(
            &sock,
            &http_request("POST", "/v1/volumes", &[("content-type", ct)], &body),
        )
        .await;
        assert_eq!(w.status, 201, "{ct}: {}", String::from_utf8_lossy(&w.body));
        let v: VolumeInfo = serde_json::from_slice(&w.body).unwrap();
        assert_eq!(v.name, name);
    }
    assert_eq!(d.names().await, ["big", "cs", "plus"]);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_paths_reject_unknown_volumes_bad_names_and_bad_queries() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "taken", "size": "1G"})).await;
    let long = format!("/v1/volumes/{}", "x".repeat(129));
    let long_flush = format!("{long}/flush");
    let mut cases: Vec<(Method, String, u16, &str)> = Vec::new();
    // Every endpoint that takes a name, with every kind of bad or unknown name.
    for (name, status, code) in [
        ("nope", 404, "not_found"),
        ("Taken", 404, "not_found"),
        ("taken.", 404, "not_found"),
        ("bad%20name", 400, "invalid_name"),
        ("%2E%2E", 400, "invalid_name"),
        ("%2E", 400, "invalid_name"),
        (".", 400, "invalid_name"),
        ("a%2Fb", 400, "invalid_name"),
        ("a%3Ab", 400, "invalid_name"),
        ("caf%C3%A9", 400, "invalid_name"),
        ("%FF", 400, "invalid_name"),
        ("%00", 400, "invalid_name"),
    ] {
        cases.push((Method::GET, format!("/v1/volumes/{name}"), status, code));
        cases.push((
            Method::POST,
            format!("/v1/volumes/{name}/flush"),
            status,
            code,
        ));
        cases.push((Method::DELETE, format!("/v1/volumes/{name}"), status, code));
        cases.push((
            Method::DELETE,
            format!("/v1/volumes/{name}?purge=true&force=true"),
            status,
            code,
        ));
    }
    for (m, p) in [
        (Method::GET, long.clone()),
        (Method::POST, long_flush),
        (Method::DELETE, long),
        (Method::POST, "/v1/volumes//flush".to_string()),
    ] {
        cases.push((m, p, 400, "invalid_name"));
    }
    // Bad query parameters of DELETE, on a volume that exists and on one that does not.
    for name in ["taken", "nope"] {
        for q in [
            "purge=maybe",
            "purge=1",
            "purge=",
            "force=yes",
            "force=TRUE",
            "purgee=true",
            "dry_run=true",
            "purge=true&purge=false",
        ] {
            cases.push((
                Method::DELETE,
                format!("/v1/volumes/{name}?{q}"),
                400,
                "bad_request",
            ));
        }
    }
    for (m, p, status, code) in cases {
        d.expect_error(m, &p, None, status, code).await;
    }
    // The volume survived every bad remove; unknown query parameters of GET are ignored.
    assert_eq!(d.names().await, ["taken"]);
    let r = d.req(Method::GET, "/v1/volumes/taken?x=1", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = d
        .req(Method::POST, "/v1/volumes/taken/flush?x=1", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "taken", "size": "1G"})).await;
    let mut cases: Vec<(Method, &str, u16, &str)> = Vec::new();
    for p in [
        "/",
        "/v1",
        "/v2/volumes",
        "/V1/volumes",
        "/v1/volumes/",
        "/v1/volumes/taken/",
        "/v1/volumes/taken/flush/",
        "/v1/volumes/taken/flush/now",
        "/v1/volumes/taken/snapshots",
        "/v1/volumes/a/b/c",
        "/healthz/",
        "/health",
        "/metrics/x",
        "/v1/metrics",
        "/%FF",
    ] {
        cases.push((Method::GET, p, 404, "not_found"));
        cases.push((Method::POST, p, 404, "not_found"));
    }
    for (m, p) in [
        (Method::PUT, "/v1/volumes"),
        (Method::PATCH, "/v1/volumes"),
        (Method::DELETE, "/v1/volumes"),
        (Method::OPTIONS, "/v1/volumes"),
        (Method::POST, "/v1/volumes/taken"),
        (Method::PUT, "/v1/volumes/taken"),
        (Method::PATCH, "/v1/volumes/taken"),
        (Method::PATCH, "/v1/volumes/bad%20name"),
        (Method::GET, "/v1/volumes/taken/flush"),
        (Method::PUT, "/v1/volumes/taken/flush"),
        (Method::DELETE, "/v1/volumes/taken/flush"),
        (Method::POST, "/healthz"),
        (Method::DELETE, "/healthz"),
        (Method::POST, "/readyz"),
        (Method::PUT, "/readyz"),
        (Method::POST, "/metrics"),
        (Method::DELETE, "/metrics"),
    ] {
        cases.push((m, p, 405, "method_not_allowed"));
    }
    for (m, p, status, code) in cases {
        d.expect_error(m, p, None, status, code).await;
    }
    // Wrong methods with a body are refused before the body is read.
    let r = d
        .req(
            Method::PUT,
            "/v1/volumes",
            Some(json!({"name": "x", "size": "1G"})),
        )
        .await;
    assert_error(&r, 405, "method_not_allowed", "PUT with a body");
    // HEAD is GET without the body.
    let r = d.req(Method::HEAD, "/v1/volumes", None).await;
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(d.names().await, ["taken"]);
    let m = d.metrics().await;
    assert!(
        m.contains("glidefs_api_errors_total{code=\"method_not_allowed\"} 18"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_api_errors_total{code=\"not_found\"} 30"),
        "{m}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_answers_with_the_pid_then_keeps_the_volumes_for_the_successor() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), false);
    let server = Server::start(&cfg, Arc::new(NoDevices))
        .await
        .expect("server starts");
    let client = Client::new(Endpoint::Unix(cfg.api.socket.clone()));
    client
        .create(
            &serde_json::from_value(json!({"name": "h1", "size": "16M", "block_size": "4K"}))
                .unwrap(),
        )
        .await
        .expect("create");
    let r = client
        .raw(Method::GET, "/v1/handoff", &[], None)
        .await
        .unwrap();
    assert_error(&r, 405, "method_not_allowed", "GET /v1/handoff");
    let pid = client.handoff().await.expect("POST /v1/handoff");
    assert_eq!(pid, std::process::id());
    tokio::time::timeout(Duration::from_secs(5), server.handoff_requested())
        .await
        .expect("the server sees the hand-off request");
    assert_eq!(server.handoff().await, 0, "NoDevices keeps no device");
    // The successor (a new server on the same data directory) has the volume back.
    let server = Server::start(&cfg, Arc::new(NoDevices))
        .await
        .expect("successor starts");
    let list = client.list().await.expect("list");
    assert_eq!(list.volumes.len(), 1);
    assert_eq!(list.volumes[0].name, "h1");
    server.shutdown().await;
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
        m.contains("glidefs_volume_manifest_generation{volume=\"m1\"} 2"),
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
    assert_error(&r, 400, "invalid_size", "attach of nothing without a size");
    let v = d
        .create(json!({"name": "fresh", "size": "4M", "attach_existing": true}))
        .await;
    assert_eq!(v.manifest_generation, 1);
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
    // A volume for the unauthorized flush and remove attempts to hit.
    d.create(json!({"name": "kept", "size": "1M", "block_size": "4K"}))
        .await;
    d.volume("kept").write(0, &[9u8; 4096]).await.unwrap();

    let create = br#"{"name": "t", "size": "1G"}"#.as_slice();
    let endpoints: [(&str, &str, &[u8]); 11] = [
        ("GET", "/v1/volumes", b""),
        ("POST", "/v1/volumes", create),
        ("GET", "/v1/volumes/kept", b""),
        ("POST", "/v1/volumes/kept/flush", b""),
        ("DELETE", "/v1/volumes/kept?purge=true", b""),
        ("DELETE", "/v1/volumes/kept?force=true", b""),
        ("GET", "/healthz", b""),
        ("GET", "/readyz", b""),
        ("GET", "/metrics", b""),
        ("GET", "/no/such/route", b""),
        ("PUT", "/v1/volumes", b""),
    ];
    let wrong_tokens: [Option<&str>; 13] = [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cret-tokenX"),
        Some("Bearer s3cret-toke"),
        Some("Bearer S3CRET-TOKEN"),
        Some("Bearer "),
        Some("Bearer"),
        Some("Bearers3cret-token"),
        Some("Basic s3cret-token"),
        Some("Token s3cret-token"),
        Some(TOKEN),
        Some("Bearer s3cret-token extra"),
        Some("Bearer\ts3cret-token"),
    ];
    let mut refused = 0;
    for (method, path, body) in endpoints {
        for auth in wrong_tokens {
            let mut headers = vec![("content-type", "application/json")];
            if let Some(a) = auth {
                headers.push(("authorization", a));
            }
            let what = format!("{method} {path} with {auth:?}");
            let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let w = raw_http(stream, &http_request(method, path, &headers, body)).await;
            assert_error(&w.response(), 401, "unauthorized", &what);
            assert_eq!(w.header("www-authenticate"), Some("Bearer"), "{what}");
            refused += 1;
            d.assert_alive(&what).await;
        }
    }
    // None of them did anything.
    assert_eq!(d.names().await, ["kept"]);
    let v = d.client.show("kept").await.unwrap();
    assert_eq!((v.manifest_generation, v.dirty_bytes), (1, 4096));

    // The scheme is case-insensitive and may be followed by more than one space.
    for auth in [
        format!("Bearer {TOKEN}"),
        format!("bearer {TOKEN}"),
        format!("BEARER  {TOKEN}"),
    ] {
        let anon = Client::new(Endpoint::Tcp {
            addr: addr.clone(),
            token: None,
        });
        let r = anon
            .raw(
                Method::GET,
                "/v1/volumes",
                &[("authorization", auth.as_str())],
                None,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{auth}: {}", text(&r));
    }

    // With the token every endpoint works, and errors past auth keep their codes.
    let authed = Client::new(Endpoint::Tcp {
        addr,
        token: Some(TOKEN.to_string()),
    });
    for path in ["/healthz", "/readyz", "/v1/volumes", "/v1/volumes/kept"] {
        let r = authed.raw(Method::GET, path, &[], None).await.unwrap();
        assert_eq!(r.status, 200, "{path}: {}", text(&r));
    }
    let v = authed
        .create(&CreateVolume {
            name: "t".into(),
            size: Some(json!("1G")),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(v.name, "t");
    assert_eq!(authed.list().await.unwrap().volumes.len(), 2);
    let f = authed.flush("kept").await.unwrap();
    assert_eq!(f.generation, 2, "1 is the claim at create");
    let r = authed.remove("t", true, false).await.unwrap();
    assert_eq!(r.name, "t");
    for (m, p, status, code) in [
        (Method::GET, "/v1/volumes/nope", 404, "not_found"),
        (Method::GET, "/v1/volumes/bad%20name", 400, "invalid_name"),
        (Method::PUT, "/v1/volumes", 405, "method_not_allowed"),
        (Method::GET, "/no/such/route", 404, "not_found"),
    ] {
        let r = authed.raw(m.clone(), p, &[], None).await.unwrap();
        assert_error(&r, status, code, &format!("authed {m} {p}"));
    }
    match authed.show("nope").await {
        Err(ClientError::Api {
            status: 404, code, ..
        }) => assert_eq!(code, "not_found"),
        other => panic!("{other:?}"),
    }
    // Refusals are counted like any error (the listeners share the counters).
    let r = authed
        .raw(Method::GET, "/metrics", &[], None)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let m = text(&r);
    assert!(
        m.contains(&format!(
            "glidefs_api_errors_total{{code=\"unauthorized\"}} {refused}"
        )),
        "{m}"
    );
    // The unix socket needs no token.
    assert_eq!(d.names().await, ["kept"]);
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

/// An exporter that pretends: `/dev/ublkbN`, `user-copy`, counts attaches and stops.
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

impl Exporter for FakeDevices {
    fn attach(
        &self,
        _name: &str,
        _volume: Arc<Volume>,
        spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        assert!(spec.queues >= 1 && spec.max_io_bytes >= 4096);
        let id = u32::try_from(self.attached.fetch_add(1, Ordering::SeqCst)).map_err(|e| {
            ExportError::Failed {
                volume: "fake".into(),
                source: Box::new(e),
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

impl Export for FakeDevice {
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
    fn stop(self: Box<Self>) -> Result<(), ExportError> {
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
    let first: Vec<u8> = (0..64 * 1024).map(|i| (i % 241) as u8).collect();
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
            400,
            "invalid_size",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_is_503_store_unavailable_and_leaves_volumes_alone() {
    let dir = tempfile::tempdir().unwrap();
    let down = Arc::new(AtomicBool::new(false));
    let store = Arc::new(Flaky {
        inner: file_store(dir.path()),
        down: down.clone(),
        stale_lists: Arc::default(),
    });
    let mut d = assemble(dir.path(), store, Arc::new(NoDevices)).await;
    d.create(json!({"name": "s", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("s").write(0, &[5u8; 8192]).await.unwrap();
    d.create(json!({"name": "p", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("p").write(0, &[6u8; 4096]).await.unwrap();
    assert_eq!(d.client.flush("p").await.unwrap().generation, 2);

    down.store(true, Ordering::SeqCst);
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
    // Its device and cache are gone: the volume says so instead of looking `running`.
    let v = d.client.show("p").await.unwrap();
    assert_eq!(v.state, VolumeState::Failed, "{v:?}");
    assert!(
        v.error
            .as_deref()
            .unwrap_or("")
            .contains("purge=true again"),
        "{v:?}"
    );

    // Back up: the purge can be finished, and everything works again.
    down.store(false, Ordering::SeqCst);
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
async fn fenced_volume_refuses_flush_and_plain_remove() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = start(dir.path()).await;
    // A second daemon on the same object store (its own data_dir and socket).
    let mut cfg_b = config(dir.path(), false);
    cfg_b.data_dir = dir.path().join("data-b");
    cfg_b.api.socket = dir.path().join("run/b.sock");
    let mut b = start_with(cfg_b, Arc::new(NoDevices)).await;

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

/// An exporter whose attach fails for names starting with `noattach` and whose devices
/// cannot be stopped.
struct BrokenDevices;

struct StuckDevice;

impl Exporter for BrokenDevices {
    fn attach(
        &self,
        name: &str,
        _volume: Arc<Volume>,
        _spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        if name.starts_with("noattach") {
            return Err(ExportError::Failed {
                volume: name.to_string(),
                source: "ADD_DEV: Device or resource busy (test)".into(),
            });
        }
        Ok(Box::new(StuckDevice))
    }
}

impl Export for StuckDevice {
    fn id(&self) -> Option<u32> {
        Some(7)
    }
    fn path(&self) -> Option<String> {
        Some("/dev/ublkb7".into())
    }
    fn transport(&self) -> Option<String> {
        Some("zero-copy".into())
    }
    fn io_stats(&self) -> IoStats {
        IoStats::default()
    }
    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        Err(ExportError::Failed {
            volume: "stuck".into(),
            source: "STOP_DEV timed out (test)".into(),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_failures_are_500_device_failed() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start_with(config(dir.path(), false), Arc::new(BrokenDevices)).await;
    for body in [
        json!({"name": "noattach", "size": "4M"}),
        json!({"name": "noattach-2", "size": "4M", "attach_existing": true}),
    ] {
        d.expect_error(
            Method::POST,
            "/v1/volumes",
            Some(body),
            500,
            "device_failed",
        )
        .await;
    }
    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty(), "{:?}", cache_dirs(&d.cfg));

    let v = d.create(json!({"name": "stuck", "size": "4M"})).await;
    assert_eq!(v.device.path.as_deref(), Some("/dev/ublkb7"));
    d.expect_error(
        Method::DELETE,
        "/v1/volumes/stuck",
        None,
        500,
        "device_failed",
    )
    .await;
    // The device is gone as far as the daemon knows; the volume is failed and says why.
    let v = d.client.show("stuck").await.unwrap();
    assert_eq!(v.state, VolumeState::Failed);
    assert!(
        v.error.as_deref().unwrap_or("").contains("STOP_DEV"),
        "{v:?}"
    );
    for (m, p) in [
        (Method::POST, "/v1/volumes/stuck/flush"),
        (Method::DELETE, "/v1/volumes/stuck"),
    ] {
        d.expect_error(m, p, None, 409, "volume_failed").await;
    }
    assert!(
        d.metrics()
            .await
            .contains("glidefs_volume_up{volume=\"stuck\"} 0"),
        "up gauge"
    );
    let r = d
        .req(Method::DELETE, "/v1/volumes/stuck?force=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(d.names().await.is_empty());
    d.stop().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_and_shutting_down_are_503() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = assemble(dir.path(), file_store(dir.path()), Arc::new(NoDevices)).await;
    d.create(json!({"name": "v", "size": "4M"})).await;
    let r = d.req(Method::GET, "/readyz", None).await;
    assert_eq!(
        (r.status, text(&r)),
        (200, r#"{"status":"ready"}"#.to_string())
    );

    // Starting or stopping: not ready, but alive and answering.
    d.parts().ready.store(false, Ordering::Release);
    d.expect_error(Method::GET, "/readyz", None, 503, "not_ready")
        .await;
    assert_eq!(d.names().await, ["v"]);
    d.parts().ready.store(true, Ordering::Release);
    assert_eq!(d.req(Method::GET, "/readyz", None).await.status, 200);

    // Once the manager is shutting down, creates and removes are refused.
    d.manager().shutdown().await;
    for (m, p, body) in [
        (
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "w", "size": "4M"})),
        ),
        (
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "v", "size": "4M"})),
        ),
        (Method::DELETE, "/v1/volumes/v", None),
        (Method::DELETE, "/v1/volumes/v?force=true", None),
        (Method::DELETE, "/v1/volumes/v?purge=true", None),
        (Method::DELETE, "/v1/volumes/nope", None),
    ] {
        d.expect_error(m, p, body, 503, "shutting_down").await;
    }
    assert!(!d.cfg.volumes_dir().join("w").exists());
    d.stop().await;
}

/// An exporter standing in for devices a crashed daemon left QUIESCED: `attach` makes
/// device 0, `reattach` takes device `id` over and records it.
#[derive(Default)]
struct Reattaching {
    reattached: parking_lot::Mutex<Vec<u32>>,
    stopped: Arc<AtomicUsize>,
}

impl Exporter for Reattaching {
    fn attach(
        &self,
        _name: &str,
        _volume: Arc<Volume>,
        _spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        Ok(Box::new(FakeDevice {
            id: 0,
            io: IoRecorder::default(),
            stopped: self.stopped.clone(),
        }))
    }

    fn reattach(
        &self,
        _name: &str,
        _volume: Arc<Volume>,
        _spec: &ExportSpec,
        id: u32,
    ) -> Result<Box<dyn Export>, ExportError> {
        self.reattached.lock().push(id);
        Ok(Box::new(FakeDevice {
            id,
            io: IoRecorder::default(),
            stopped: self.stopped.clone(),
        }))
    }
}

/// Polls `show name` until its state is `want` (hang guard: 120 s); returns the document.
async fn await_state(d: &Daemon, name: &str, want: VolumeState) -> VolumeInfo {
    let start = std::time::Instant::now();
    loop {
        let v = d.client.show(name).await.unwrap();
        if v.state == want {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "volume `{name}` is still {:?}, not {want:?}, after 120 s: {v:?}",
            v.state
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A store outage while the daemon starts: the volume is not given up. It reports
/// `recovering` with the last error while the store is down (its QUIESCED device untouched,
/// I/O held), and once the store answers again it opens, its device is taken over, and every
/// write reads back: the flushed ones and the ones only in the local cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_at_start_recovers_when_the_store_returns() {
    let dir = tempfile::tempdir().unwrap();
    let down = Arc::new(AtomicBool::new(false));
    let store = || -> Arc<dyn ObjectStore> {
        Arc::new(Flaky {
            inner: file_store(dir.path()),
            down: down.clone(),
            stale_lists: Arc::default(),
        })
    };
    let mut d = assemble(dir.path(), store(), Arc::new(Reattaching::default())).await;
    let v = d
        .create(json!({"name": "r", "size": "4M", "block_size": "4K"}))
        .await;
    assert_eq!(v.device.id, Some(0));
    d.volume("r").write(0, &[7u8; 8192]).await.unwrap();
    assert_eq!(d.client.flush("r").await.unwrap().generation, 2);
    // Only in the local cache (the daemon "crashes" without flushing it to the store).
    d.volume("r").write(8192, &[8u8; 4096]).await.unwrap();
    d.stop().await;

    down.store(true, Ordering::SeqCst);
    let layer = Arc::new(Reattaching::default());
    let mut d = assemble(dir.path(), store(), layer.clone()).await;
    let v = d.client.show("r").await.unwrap();
    assert_eq!(v.state, VolumeState::Recovering, "{v:?}");
    let error = v.error.clone().unwrap_or_default();
    assert!(
        error.contains("recovering") && error.contains("test outage"),
        "the last error is shown: {v:?}"
    );
    assert!(layer.reattached.lock().is_empty(), "{v:?}");
    // Let a few background attempts fail.
    let start = std::time::Instant::now();
    loop {
        let v = d.client.show("r").await.unwrap();
        let error = v.error.unwrap_or_default();
        if !error.contains("recovering: 1 attempt") {
            assert!(error.contains("test outage"), "{error}");
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

    down.store(false, Ordering::SeqCst);
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

/// A recovering volume can be removed with `force` (its local cache is dropped); its re-open
/// task ends, and a new volume of the same name is not touched by it. Shutdown ends the
/// retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovering_volume_can_be_force_removed_and_shutdown_ends_the_retries() {
    let dir = tempfile::tempdir().unwrap();
    let down = Arc::new(AtomicBool::new(false));
    let store = || -> Arc<dyn ObjectStore> {
        Arc::new(Flaky {
            inner: file_store(dir.path()),
            down: down.clone(),
            stale_lists: Arc::default(),
        })
    };
    let mut d = assemble(dir.path(), store(), Arc::new(NoDevices)).await;
    for name in ["a", "b"] {
        d.create(json!({"name": name, "size": "4M", "block_size": "4K"}))
            .await;
        d.volume(name).write(0, &[1u8; 4096]).await.unwrap();
    }
    d.stop().await;

    down.store(true, Ordering::SeqCst);
    let mut d = assemble(dir.path(), store(), Arc::new(NoDevices)).await;
    for name in ["a", "b"] {
        assert_eq!(
            d.client.show(name).await.unwrap().state,
            VolumeState::Recovering
        );
    }
    let r = d
        .req(Method::DELETE, "/v1/volumes/a?force=true", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(d.names().await, ["b"]);
    assert_eq!(cache_dirs(&d.cfg), ["b"]);
    down.store(false, Ordering::SeqCst);
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
    down.store(true, Ordering::SeqCst);
    let mut d = assemble(dir.path(), store(), Arc::new(NoDevices)).await;
    assert_eq!(
        d.client.show("b").await.unwrap().state,
        VolumeState::Recovering
    );
    d.stop().await;
    down.store(false, Ordering::SeqCst);
    let mut d = assemble(dir.path(), store(), Arc::new(NoDevices)).await;
    assert_eq!(
        d.client.show("b").await.unwrap().state,
        VolumeState::Running
    );
    d.volume("b").read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&b| b == 1));
    d.stop().await;
}

/// `data_dir/owner-id` after a power cut. Missing (with or without a `.tmp` a cut left beside
/// it): a new id, written durably. Empty or garbled while `state.json` lists no volume: nothing
/// was claimed under the lost id, so a new one replaces it (with a warning). Empty or garbled
/// while volumes are listed: a new identity would leave them `owned_elsewhere`, so the daemon
/// refuses to start with an error naming the file and the fix.
#[test]
fn a_damaged_owner_id_is_replaced_only_when_no_volume_depends_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let path = data.join("owner-id");
    let tmp = data.join("owner-id.tmp");
    let id_of = |owner: &str| owner.split_once('/').unwrap().1.to_string();

    // Missing, with a torn .tmp beside it: a new id; the .tmp is gone.
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(&tmp, "").unwrap();
    let first = glidefs::daemon::server::owner_id(&data).expect("a new id");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap().trim(),
        id_of(&first)
    );
    assert!(!tmp.exists(), "the leftover .tmp is removed");
    assert_eq!(
        glidefs::daemon::server::owner_id(&data).unwrap(),
        first,
        "stable"
    );

    // Empty (the rename reached the disk, the data did not), no volumes: a new id.
    for damaged in ["", "\n", "\0\0\0\0", "two words\n"] {
        std::fs::write(&path, damaged).unwrap();
        std::fs::write(&tmp, "half").unwrap();
        let again = glidefs::daemon::server::owner_id(&data)
            .unwrap_or_else(|e| panic!("{damaged:?} with no volumes: {e}"));
        assert_ne!(again, first, "{damaged:?}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            id_of(&again)
        );
        assert!(!tmp.exists());
    }

    // Volumes listed: refused, naming the file, state.json and the ways out.
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        data.join("state.json"),
        r#"{"version": 1, "volumes": [{"name": "v", "size": 4194304, "block_size": 4096, "queues": 1, "queue_depth": 64}]}"#,
    )
    .unwrap();
    std::fs::write(&path, "").unwrap();
    let err = glidefs::daemon::server::owner_id(&data)
        .expect_err("an empty owner-id with volumes")
        .to_string();
    for needle in [path.to_str().unwrap(), "state.json", "takeover", "empty"] {
        assert!(err.contains(needle), "`{needle}` missing: {err}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"", "left for the operator");
    std::fs::write(&path, &good).unwrap();
    assert_eq!(
        id_of(&glidefs::daemon::server::owner_id(&data).unwrap()),
        good.trim()
    );
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

    let stale = Arc::new(AtomicUsize::new(1));
    let store_b = Arc::new(Flaky {
        inner: file_store(dir_a.path()),
        down: Arc::default(),
        stale_lists: stale.clone(),
    });
    let mut b = assemble(dir_b.path(), store_b, Arc::new(NoDevices)).await;
    b.expect_error(
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "x", "size": "4M", "block_size": "4K"})),
        409,
        "owned_elsewhere",
    )
    .await;
    assert_eq!(stale.load(Ordering::SeqCst), 0, "B listed the store");
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
