//! The daemon of the API tests: a [`Server`] on a temporary directory (unix socket, a TCP
//! port for the auth tests, a local-directory object store), or one assembled from the
//! library's parts ([`assemble`]) where a test needs what the server does not let it choose
//! (an object store that goes down, the readiness flag, a manager already shut down); and the
//! assertions every test uses (an error document, the daemon still alive, what is on disk).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glidefs::client::{Client, Endpoint, RawResponse};
use glidefs::daemon::api::AppState;
use glidefs::daemon::config::Config;
use glidefs::daemon::manager::{ManagerOptions, ReopenBackoff, VolumeManager};
use glidefs::daemon::server::Server;
use glidefs::model::{VolumeInfo, VolumeState};
use glidefs::ublk::export::{Exporter, NoDevices};
use glidefs_objstore::StoreConfig;
use glidefs_volume::Volume;
use hyper::Method;
use object_store::ObjectStore;
use serde_json::Value;

pub const TOKEN: &str = "s3cret-token";

/// `api.max_body_bytes` of the test daemons (the default).
pub const MAX_BODY: usize = 64 << 10;

/// A running daemon: a [`Server`], or one assembled by hand ([`assemble`]).
pub struct Daemon {
    pub server: Option<Server>,
    pub parts: Option<Parts>,
    pub cfg: Config,
    pub client: Client,
}

/// The pieces of an assembled daemon.
pub struct Parts {
    pub manager: Arc<VolumeManager>,
    /// What `/readyz` reports.
    pub ready: Arc<AtomicBool>,
    pub serve: tokio::task::JoinHandle<()>,
}

pub fn config(dir: &Path, tcp: bool) -> Config {
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

pub async fn start_with(cfg: Config, devices: Arc<dyn Exporter>) -> Daemon {
    let server = Server::start(&cfg, devices).await.expect("server starts");
    let client = Client::new(Endpoint::Unix(cfg.api.socket.clone()));
    Daemon {
        server: Some(server),
        parts: None,
        cfg,
        client,
    }
}

pub async fn start(dir: &Path) -> Daemon {
    start_with(config(dir, false), Arc::new(NoDevices)).await
}

/// A second daemon ("host B") on the object store of `dir` (the one [`start`] uses), with its
/// own data_dir (so its own owner id) and socket, both named after `host`.
pub async fn start_other_host(dir: &Path, host: &str) -> Daemon {
    let mut cfg = config(dir, false);
    cfg.data_dir = dir.join(format!("data-{host}"));
    cfg.api.socket = dir.join(format!("run/{host}.sock"));
    start_with(cfg, Arc::new(NoDevices)).await
}

/// A daemon built the way `Server::start` builds one (manager, restore, router on the unix
/// socket), but on `store` and with the readiness flag in the test's hands. Store retries are
/// one, quickly, so an outage is reported at once; a recovering volume is retried every 20 to
/// 200 ms.
pub async fn assemble(
    dir: &Path,
    store: Arc<dyn ObjectStore>,
    devices: Arc<dyn Exporter>,
) -> Daemon {
    assemble_as(dir, store, devices, None).await
}

/// [`assemble`], with `host` in place of this machine's host name in the owner id (its data
/// directory's id is kept): the same daemon after a rename of its host.
pub async fn assemble_as(
    dir: &Path,
    store: Arc<dyn ObjectStore>,
    devices: Arc<dyn Exporter>,
    host: Option<&str>,
) -> Daemon {
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
        owner: Some({
            let id = glidefs::daemon::server::owner_id(&cfg.data_dir).expect("owner id");
            match (host, id.split_once('/')) {
                (Some(host), Some((_, dir_id))) => format!("{host}/{dir_id}"),
                _ => id,
            }
        }),
        reopen: ReopenBackoff {
            first: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        space: Default::default(),
        encryption_keys: cfg.store.encryption_keys.clone(),
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
pub fn file_store(dir: &Path) -> Arc<dyn ObjectStore> {
    let path = dir.join("store");
    std::fs::create_dir_all(&path).unwrap();
    glidefs_objstore::open_store(&format!("file://{}", path.display()), &Default::default())
        .unwrap()
}

impl Daemon {
    pub fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    pub fn parts(&self) -> &Parts {
        self.parts.as_ref().expect("an assembled daemon")
    }

    pub fn manager(&self) -> &Arc<VolumeManager> {
        match (&self.server, &self.parts) {
            (Some(s), _) => s.manager(),
            (None, Some(p)) => &p.manager,
            (None, None) => panic!("daemon stopped"),
        }
    }

    pub async fn stop(&mut self) {
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

    /// A `kill -9` of an assembled daemon: the API task ends, nothing is closed or flushed
    /// and `state.json` stays as it was; the manager and its volumes are leaked (their files
    /// stay open, nothing of theirs runs again). Only for daemons whose volumes have no
    /// flusher or device left running (e.g. `Stopped` ones), else those would keep going.
    pub async fn kill(mut self) {
        let p = self.parts.take().expect("an assembled daemon");
        p.serve.abort();
        let _ = p.serve.await;
        let _ = std::fs::remove_file(&self.cfg.api.socket);
        std::mem::forget(p.manager);
    }

    pub async fn req(&self, method: Method, path: &str, body: Option<Value>) -> RawResponse {
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.client.raw(method, path, &[], body).await.unwrap()
    }

    pub fn volume(&self, name: &str) -> Arc<Volume> {
        self.manager().volume(name).expect("volume open")
    }

    pub async fn create(&self, body: Value) -> VolumeInfo {
        let r = self
            .req(Method::POST, "/v1/volumes", Some(body.clone()))
            .await;
        assert_eq!(r.status, 201, "{body}: {}", text(&r));
        serde_json::from_slice(&r.body).unwrap()
    }

    /// Names of the listed volumes.
    pub async fn names(&self) -> Vec<String> {
        let list = self.client.list().await.unwrap().volumes;
        list.into_iter().map(|v| v.name).collect()
    }

    /// A plain remove of `name` answered 503 `store_unavailable` (the store is down).
    pub async fn remove_needs_the_store(&self, name: &str) {
        let path = format!("/v1/volumes/{name}");
        self.expect_error(Method::DELETE, &path, None, 503, "store_unavailable")
            .await;
    }

    /// Sends `method path` (with a JSON body) and asserts the error, then that the daemon still
    /// answers.
    pub async fn expect_error(
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
    pub async fn assert_alive(&self, after: &str) {
        let r = self.req(Method::GET, "/healthz", None).await;
        assert_eq!(
            (r.status, text(&r)),
            (200, r#"{"status":"ok"}"#.to_string()),
            "the daemon does not answer after {after}"
        );
    }

    /// `/metrics` as text.
    pub async fn metrics(&self) -> String {
        let r = self.req(Method::GET, "/metrics", None).await;
        assert_eq!(r.status, 200, "{}", text(&r));
        text(&r)
    }
}

/// The entry of volume `name` in `d`'s `state.json`.
pub fn state_entry(d: &Daemon, name: &str) -> Value {
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(d.cfg.state_path()).unwrap()).unwrap();
    state["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no volume `{name}` in state.json: {state}"))
}

pub fn text(r: &RawResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// Asserts status and error code of a response: a JSON error document with a message.
#[track_caller]
pub fn assert_error(r: &RawResponse, status: u16, code: &str, what: &str) {
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

pub fn store_objects(dir: &Path) -> Vec<PathBuf> {
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
pub fn cache_dirs(cfg: &Config) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(cfg.volumes_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Polls `show name` until its state is `want` (hang guard: 120 s); returns the document.
pub async fn await_state(d: &Daemon, name: &str, want: VolumeState) -> VolumeInfo {
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
