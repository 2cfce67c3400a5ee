//! `glidefs serve`: the daemon's life from start to exit.
//!
//! Start (numbered; a failure stops the daemon with an error naming the step's value):
//! 1. open the object store (`store.url`), create `data_dir/volumes`;
//! 2. bind the unix socket (parent directory created, mode 0660; a stale socket whose daemon
//!    is gone is replaced, a live one is an error) and, if configured, the TCP listener (its
//!    token read from `api.token_file`);
//! 3. re-attach the volumes of `state.json` (before any request is served, so no create can
//!    race the restore; clients connecting meanwhile wait in the listen backlog);
//! 4. serve; `/readyz` turns 200; systemd is told `READY=1` (by [`run`]).
//!
//! Shutdown ([`Server::shutdown`], on SIGTERM/SIGINT in [`run`]):
//! 1. `/readyz` turns 503, listeners stop accepting; in-flight requests get up to
//!    `DRAIN_TIMEOUT` to finish;
//! 2. every volume's flusher and device are stopped and the volume closed (local FLUSH +
//!    checkpoint); data not yet in the object store stays in the local cache and is picked up
//!    at the next start;
//! 3. the socket file is removed.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glidefs_objstore::{open_store, StoreConfig};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{self, auth::Token, AppState};
use crate::config::Config;
use crate::device::DeviceLayer;
use crate::manager::{ManagerOptions, VolumeManager};

/// How long shutdown waits for in-flight requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the daemon could not start or stop cleanly; each names the path, address or URL.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("object store `{url}`: {message}")]
    Store { url: String, message: String },
    #[error("{what} `{path}`: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("another glidefs is already listening on `{0}`")]
    SocketInUse(String),
    #[error("`{0}` exists and is not a socket")]
    NotASocket(String),
    #[error("api.token_file `{0}` is empty")]
    EmptyToken(String),
    #[error("restoring volumes failed: {0}")]
    Restore(String),
}

fn io_err(
    what: &'static str,
    path: impl std::fmt::Display,
) -> impl FnOnce(std::io::Error) -> ServerError {
    let path = path.to_string();
    move |source| ServerError::Io { what, path, source }
}

/// A running daemon (API listeners + volume manager).
#[derive(Debug)]
pub struct Server {
    manager: Arc<VolumeManager>,
    ready: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    listeners: Vec<JoinHandle<std::io::Result<()>>>,
    socket: PathBuf,
    tcp_addr: Option<SocketAddr>,
}

/// Binds the unix socket (see the module docs).
fn bind_unix(path: &Path) -> Result<UnixListener, ServerError> {
    let shown = path.display().to_string();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(io_err("cannot create socket directory", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServerError::SocketInUse(shown));
            }
            std::fs::remove_file(path).map_err(io_err("cannot remove stale socket", &shown))?;
        }
        Ok(_) => return Err(ServerError::NotASocket(shown)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("cannot inspect socket path", &shown)(e)),
    }
    let listener = UnixListener::bind(path).map_err(io_err("cannot bind unix socket", &shown))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(io_err("cannot chmod unix socket", &shown))?;
    Ok(listener)
}

fn read_token(path: &Path) -> Result<Token, ServerError> {
    let text = std::fs::read_to_string(path)
        .map_err(io_err("cannot read api.token_file", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ServerError::EmptyToken(path.display().to_string()));
    }
    Ok(Token(Arc::new(token.to_string())))
}

impl Server {
    /// Starts the daemon: steps 1-4 of the module docs.
    pub async fn start(cfg: &Config, devices: Arc<dyn DeviceLayer>) -> Result<Self, ServerError> {
        let url = cfg.store_url();
        let store = open_store(&url).map_err(|e| ServerError::Store {
            url: url.clone(),
            message: e.to_string(),
        })?;
        let volumes_dir = cfg.volumes_dir();
        std::fs::create_dir_all(&volumes_dir)
            .map_err(io_err("cannot create", volumes_dir.display()))?;
        let opts = ManagerOptions {
            volumes_dir,
            state_path: cfg.state_path(),
            defaults: cfg.volume_defaults,
            store: StoreConfig {
                upload_concurrency: cfg.store.upload_concurrency,
                max_retries: cfg.store.max_retries,
                ..StoreConfig::default()
            },
        };
        let manager = Arc::new(VolumeManager::new(opts, store, devices));

        let unix = bind_unix(&cfg.api.socket)?;
        let tcp = match cfg.api.tcp {
            Some(addr) => {
                let token_path = cfg
                    .api
                    .token_file
                    .as_deref()
                    .ok_or(ServerError::EmptyToken(
                        "(api.token_file unset)".to_string(),
                    ))?;
                let token = read_token(token_path)?;
                let l = TcpListener::bind(addr)
                    .await
                    .map_err(io_err("cannot bind TCP", addr))?;
                Some((l, token))
            }
            None => None,
        };

        let opened = manager
            .restore()
            .await
            .map_err(|e| ServerError::Restore(e.to_string()))?;
        tracing::info!(volumes = opened, "volumes restored");

        let ready = Arc::new(AtomicBool::new(false));
        let state = AppState {
            manager: manager.clone(),
            ready: ready.clone(),
            counters: Arc::default(),
        };
        let max_body = usize::try_from(cfg.api.max_body_bytes.0).unwrap_or(64 << 10);
        let (stop, stop_rx) = watch::channel(false);
        let shutdown = move |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut listeners = Vec::new();
        let app = api::router(state.clone(), max_body, None);
        listeners.push(tokio::spawn(
            axum::serve(unix, app)
                .with_graceful_shutdown(shutdown(stop_rx.clone()))
                .into_future(),
        ));
        let mut tcp_addr = None;
        if let Some((l, token)) = tcp {
            tcp_addr = l.local_addr().ok();
            let app = api::router(state, max_body, Some(token));
            listeners.push(tokio::spawn(
                axum::serve(l, app)
                    .with_graceful_shutdown(shutdown(stop_rx))
                    .into_future(),
            ));
        }
        ready.store(true, Ordering::Release);
        tracing::info!(socket = %cfg.api.socket.display(), tcp = ?tcp_addr, store = %url, "glidefs API listening");
        Ok(Self {
            manager,
            ready,
            stop,
            listeners,
            socket: cfg.api.socket.clone(),
            tcp_addr,
        })
    }

    /// The volume manager (in-process users: tests, tools).
    pub fn manager(&self) -> &Arc<VolumeManager> {
        &self.manager
    }

    /// The bound TCP address, when a TCP listener is configured (port 0 resolved).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// The unix socket path.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Stops the daemon: the shutdown steps of the module docs.
    pub async fn shutdown(self) {
        self.ready.store(false, Ordering::Release);
        let _ = self.stop.send(true);
        for l in self.listeners {
            match tokio::time::timeout(DRAIN_TIMEOUT, l).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "API listener ended with an error"),
                Ok(Err(e)) => tracing::error!(error = %e, "API listener task failed"),
                Err(_) => tracing::warn!("in-flight API requests did not finish in time"),
            }
        }
        self.manager.shutdown().await;
        let _ = std::fs::remove_file(&self.socket);
        tracing::info!("glidefs stopped");
    }
}

/// Tells systemd (when `$NOTIFY_SOCKET` is set) about a state change; failures are logged.
fn notify(state: sd_notify::NotifyState<'_>) {
    if let Err(e) = sd_notify::notify(false, &[state]) {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

/// Runs the daemon until SIGTERM or SIGINT, then shuts it down cleanly.
pub async fn run(cfg: &Config, devices: Arc<dyn DeviceLayer>) -> Result<(), ServerError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term =
        signal(SignalKind::terminate()).map_err(io_err("cannot install", "SIGTERM handler"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(io_err("cannot install", "SIGINT handler"))?;
    let server = Server::start(cfg, devices).await?;
    notify(sd_notify::NotifyState::Ready);
    let which = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = which, "shutting down");
    notify(sd_notify::NotifyState::Stopping);
    server.shutdown().await;
    Ok(())
}
