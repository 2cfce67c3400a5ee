//! `glidefs serve`: the daemon's life from start to exit.
//!
//! Start (numbered; a failure stops the daemon with an error naming the step's value):
//! 0. make `data_dir` private ([`private_dir`]: created 0700, an existing one open to group or
//!    others tightened to 0700 with a warning) and take its lock (`data_dir/lock`, see
//!    [`crate::data_dir_lock`]): a second daemon on the same data directory stops here,
//!    before it touches the socket, the owner id, `state.json` or any volume, with an error
//!    naming the directory and the holder's pid. The server holds the lock until its last
//!    step; [`run`] hands it to the caller, which holds it until the process exits or
//!    re-executes itself;
//! 1. make a local (`file://`) store directory private (`glidefs serve` runs under umask 077,
//!    so everything created inside is 0600/0700), open the object store (`store.url`), create
//!    `data_dir/volumes`, read (or make) this daemon's owner id (`data_dir/owner-id`, see
//!    [`owner_id`]);
//! 2. bind the unix socket (missing parent directories created 0750, the socket 0660; a stale
//!    socket whose daemon is gone is replaced, a live one is an error) and, if configured, the
//!    TCP listener (its token read from `api.token_file`, its TLS files from `api.tls_cert` /
//!    `api.tls_key`, all before anything is bound; the token and the key must be private);
//! 3. re-attach the volumes of `state.json` (before any request is served, so no create can
//!    race the restore; clients connecting meanwhile wait in the listen backlog);
//! 4. serve; `/readyz` turns 200 (503 while a restored volume is still `recovering`); systemd
//!    is told `READY=1` (by [`run`]).
//!
//! Hand-off ([`Server::handoff`], on SIGHUP or `POST /v1/handoff` in [`run`]): as shutdown,
//! but the devices are detached, not deleted: the kernel holds their I/O (filesystems stay
//! mounted) until the next daemon on this data directory reattaches them at its start. After
//! SIGHUP the binary re-executes itself (same pid; an in-place upgrade): the `exec` releases
//! the data directory's lock (its descriptor is close-on-exec) and the new image takes it at
//! step 0. `glidefs handoff` ([`take_over`]) is a new process that asks the running one, waits
//! for it to exit, takes the lock (a bounded wait, [`TAKEOVER_WAIT`] in all), then serves.
//!
//! Shutdown ([`Server::shutdown`], on SIGTERM/SIGINT in [`run`]):
//! 1. `/readyz` turns 503, listeners stop accepting; in-flight requests get up to
//!    `DRAIN_TIMEOUT` to finish;
//! 2. every volume's flusher and device are stopped and the volume closed (local FLUSH +
//!    checkpoint); data not yet in the object store stays in the local cache and is picked up
//!    at the next start;
//! 3. the socket file is removed if it is still the one this daemon bound (same device and
//!    inode as right after the bind): a socket another daemon bound at the path meanwhile
//!    (after this one stopped listening) is left in place;
//! 4. the data directory's lock is released ([`Server::shutdown`], [`Server::handoff`]) or
//!    handed to the caller ([`run`]).

use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glidefs_objstore::{open_store, StoreConfig};
use glidefs_volume::durable::{tmp_path, write_atomic, AtomicWriteError};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::listener::{self, Limits, Listener};
use crate::api::{self, auth::Token, AppState};
use crate::config::Config;
use crate::data_dir_lock::{DataDirLock, LockError};
use crate::manager::{ManagerOptions, VolumeManager};
use glidefs_model::log::chain;
use glidefs_ublk::export::Exporter;

/// How long shutdown waits for in-flight requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the daemon could not start or stop cleanly; each names the path, address or URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("object store `{url}`: {source}")]
    Store {
        url: String,
        #[source]
        source: Box<glidefs_objstore::ObjStoreError>,
    },
    #[error("{what} `{path}`: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] AtomicWriteError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("another glidefs is already listening on `{0}`")]
    SocketInUse(String),
    #[error("`{0}` exists and is not a socket")]
    NotASocket(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Tls(#[from] api::tls::TlsError),
    #[error(transparent)]
    Secret(#[from] crate::secret::SecretError),
    #[error("{key} `{path}` is not a directory")]
    NotADirectory { key: &'static str, path: String },
    #[error("api.token_file `{0}` is empty")]
    EmptyToken(String),
    #[error("restoring volumes failed: {0}")]
    Restore(#[source] crate::manager::ManagerError),
    #[error("taking over from the running daemon failed: {0}")]
    Takeover(#[source] glidefs_client::ClientError),
    #[error("taking over from the running daemon failed: daemon {pid} still running {waited:?} after the hand-off request")]
    TakeoverTimeout { pid: u32, waited: Duration },
}

fn io_err(
    what: &'static str,
    path: impl std::fmt::Display,
) -> impl FnOnce(std::io::Error) -> ServerError {
    let path = path.to_string();
    move |source| ServerError::Io { what, path, source }
}

/// This daemon's identity in the object store's ownership records: `<hostname>/<id>`, where
/// the id is made once per data directory (`data_dir/owner-id`), so a restart, a crash
/// recovery or a hand-off on the same data directory is the same owner, and another host
/// (or another data directory) is not.
///
/// Durability: a new id is written with `write_atomic` (`owner-id.tmp`, fsynced, renamed over
/// `owner-id`, the directory fsynced), so after a power cut the file is missing (a new id:
/// nothing used the lost one) or whole. An `owner-id.tmp` left beside it is never used (its id
/// was never handed out) and is removed. An `owner-id` found empty or garbled (an older
/// glidefs wrote it without fsync, or the disk damaged it): when `state.json` lists no volume,
/// nothing depends on the lost id and a new one replaces it (logged); otherwise the start
/// fails with an error naming the file and the fix, because a new identity would leave every
/// listed volume `owned_elsewhere`.
pub fn owner_id(data_dir: &Path) -> Result<String, ServerError> {
    let path = data_dir.join("owner-id");
    let tmp = tmp_path(&path);
    let id = match std::fs::read(&path) {
        Ok(bytes) => match parse_owner_id(&bytes) {
            Ok(id) => id,
            Err(problem) => damaged_owner_id(data_dir, &path, problem)?,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => new_owner_id(data_dir, &path)?,
        Err(e) => return Err(io_err("cannot read", path.display())(e)),
    };
    match std::fs::remove_file(&tmp) {
        Ok(()) => {
            tracing::info!(path = %tmp.display(), "removed a leftover owner id temporary file")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %tmp.display(), error = %chain(&e), "cannot remove a leftover owner id temporary file")
        }
    }
    let host: String = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(64)
        .collect();
    let host = if host.is_empty() {
        "localhost".to_string()
    } else {
        host
    };
    Ok(format!("{host}/{id}"))
}

/// Mode of the daemon's private directories (`data_dir`, a local store).
const PRIVATE_DIR_MODE: u32 = 0o700;

/// Mode of the socket directories the daemon creates: the socket's group may reach it.
const SOCKET_DIR_MODE: u32 = 0o750;

/// Makes `dir` (the value of config key `key`) private to the daemon's user: created 0700 when
/// missing; an existing directory open to group or others is tightened (`chmod go-rwx`) with a
/// warning rather than refused, so a data directory left 0755 by an earlier release (or 0750 by
/// systemd's `StateDirectoryMode`) keeps starting. What is already inside keeps its mode;
/// nobody else can reach it through the closed directory.
pub fn private_dir(key: &'static str, dir: &Path) -> Result<(), ServerError> {
    use std::os::unix::fs::DirBuilderExt;
    let shown = dir.display().to_string();
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(PRIVATE_DIR_MODE)
                .create(dir)
                .map_err(io_err("cannot create", &shown))?;
            std::fs::metadata(dir).map_err(io_err("cannot inspect", &shown))?
        }
        Err(e) => return Err(io_err("cannot inspect", &shown)(e)),
    };
    if !meta.is_dir() {
        return Err(ServerError::NotADirectory { key, path: shown });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        let tight = mode & !0o077;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(tight))
            .map_err(io_err("cannot make private (chmod go-rwx)", &shown))?;
        tracing::warn!(
            key,
            path = %shown,
            mode = format!("{mode:04o}"),
            now = format!("{tight:04o}"),
            "directory was open to group or others: tightened"
        );
    }
    Ok(())
}

/// The directory of a local object store (`file:///dir` or `/dir`), as `open_store` reads it.
fn local_store_dir(url: &str) -> Option<&Path> {
    let path = if url.starts_with('/') {
        url
    } else {
        url.strip_prefix("file://")?
    };
    path.starts_with('/').then(|| Path::new(path))
}

/// Creates the missing directories of `dir` with [`SOCKET_DIR_MODE`] (the daemon's umask
/// alone would make them 0700 and lock the socket's group out).
fn create_socket_dir(dir: &Path) -> Result<(), ServerError> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|a| !a.exists()).collect();
    for d in missing.into_iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(SOCKET_DIR_MODE))
                .map_err(io_err("cannot chmod socket directory", d.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("cannot create socket directory", d.display())(e)),
        }
    }
    Ok(())
}

/// The id an `owner-id` file holds, or what is wrong with it.
fn parse_owner_id(bytes: &[u8]) -> Result<String, &'static str> {
    let id = std::str::from_utf8(bytes).map_err(|_| "not UTF-8")?.trim();
    if id.is_empty() {
        return Err("empty");
    }
    if id.len() > 128 || !id.chars().all(|c| c.is_ascii_graphic()) {
        return Err("not one printable word of at most 128 characters");
    }
    Ok(id.to_string())
}

/// An `owner-id` that is `problem`: replaced when no volume depends on it, else an error that
/// says how to put the lost id back (see [`owner_id`]).
fn damaged_owner_id(data_dir: &Path, path: &Path, problem: &str) -> Result<String, ServerError> {
    let state = data_dir.join("state.json");
    let listed = crate::manager::state::load(&state);
    if let Ok(volumes) = &listed {
        if volumes.is_empty() {
            tracing::warn!(path = %path.display(), problem, "the owner id file is damaged and no volume depends on it: making a new id");
            return new_owner_id(data_dir, path);
        }
    }
    let listed = match listed {
        Ok(v) => format!("`{}` lists {} volume(s)", state.display(), v.len()),
        Err(e) => format!("`{}` cannot be read ({e})", state.display()),
    };
    Err(ServerError::Io {
        what: "damaged owner id file",
        path: path.display().to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "it is {problem} (a power cut while an older glidefs wrote it?), and {listed} \
                 claimed in the object store under the id it held, so a new id would leave them \
                 owned_elsewhere. Put the lost id back: delete the file, start once (each volume \
                 is then `failed` with owned_elsewhere naming its owner `<host>/<id>`), stop, \
                 write that <id> into the file and start again. Starting as a new owner instead \
                 means removing each volume with force and attaching it with takeover, which \
                 loses its data not yet in the store"
            ),
        ),
    })
}

/// Makes a new id and writes it durably (`write_atomic`: tmp, fsync, rename, directory fsync).
fn new_owner_id(data_dir: &Path, path: &Path) -> Result<String, ServerError> {
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map_err(io_err("cannot read", "/proc/sys/kernel/random/uuid"))?;
    let id = uuid.trim().to_string();
    std::fs::create_dir_all(data_dir).map_err(io_err("cannot create", data_dir.display()))?;
    write_atomic(path, format!("{id}\n").as_bytes())?;
    tracing::info!(path = %path.display(), "made a new owner id");
    Ok(id)
}

/// A running daemon (API listeners + volume manager).
#[derive(Debug)]
pub struct Server {
    manager: Arc<VolumeManager>,
    /// Notified by `POST /v1/handoff`.
    handoff: Arc<tokio::sync::Notify>,
    ready: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    listeners: Vec<JoinHandle<std::io::Result<()>>>,
    socket: PathBuf,
    /// The socket file this daemon bound: (device, inode) right after the bind.
    socket_id: FileId,
    tcp_addr: Option<SocketAddr>,
    /// Held until the last step of [`Server::close`].
    lock: DataDirLock,
}

/// A file's identity: (device, inode).
type FileId = (u64, u64);

fn file_id(meta: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Binds the unix socket (see the module docs); returns it with the socket file's identity.
fn bind_unix(path: &Path) -> Result<(UnixListener, FileId), ServerError> {
    let shown = path.display().to_string();
    if let Some(dir) = path.parent() {
        create_socket_dir(dir)?;
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
    let id = std::fs::symlink_metadata(path)
        .map(|meta| file_id(&meta))
        .map_err(io_err("cannot inspect the bound socket", &shown))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(io_err("cannot chmod unix socket", &shown))?;
    Ok((listener, id))
}

/// Shutdown step 3: removes the socket at `path` only if it is still the file this daemon
/// bound (`ours`); another daemon's socket there is left (logged).
fn remove_own_socket(path: &Path, ours: FileId) {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if file_id(&meta) == ours => {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(socket = %path.display(), error = %chain(&e), "cannot remove the API socket");
            }
        }
        Ok(_) => tracing::warn!(
            socket = %path.display(),
            "the socket path holds another file than the socket this daemon bound (another daemon's?): left in place"
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(socket = %path.display(), error = %chain(&e), "cannot inspect the API socket: left in place")
        }
    }
}

fn read_token(path: &Path) -> Result<Token, ServerError> {
    let bytes =
        crate::secret::read_secret("api.token_file", path, crate::secret::MAX_SECRET_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|e| ServerError::Io {
        what: "api.token_file is not UTF-8",
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ServerError::EmptyToken(path.display().to_string()));
    }
    Ok(Token(Arc::new(token.to_string())))
}

impl Server {
    /// Starts the daemon: steps 0-4 of the module docs. A data directory another daemon
    /// holds is [`ServerError::Lock`] ([`LockError::Held`]), with nothing changed.
    pub async fn start(cfg: &Config, devices: Arc<dyn Exporter>) -> Result<Self, ServerError> {
        Self::start_locked(cfg, devices, None).await
    }

    /// [`Server::start`] with the data directory's lock already taken (`glidefs handoff`:
    /// [`take_over`]), or taken here without waiting when `lock` is `None`.
    async fn start_locked(
        cfg: &Config,
        devices: Arc<dyn Exporter>,
        lock: Option<DataDirLock>,
    ) -> Result<Self, ServerError> {
        cfg.api.validate_tcp().map_err(ServerError::Config)?;
        private_dir("data_dir", &cfg.data_dir)?;
        let lock = match lock {
            Some(lock) if lock.data_dir() == cfg.data_dir => lock,
            _ => DataDirLock::acquire(&cfg.data_dir)?,
        };
        let url = cfg.store_url();
        if let Some(dir) = local_store_dir(&url) {
            private_dir("store.url", dir)?;
        }
        let store = open_store(&url, &cfg.s3_options()).map_err(|e| ServerError::Store {
            url: url.clone(),
            source: Box::new(e),
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
                pack_recheck_after: StoreConfig::default()
                    .pack_recheck_after
                    .min(std::time::Duration::from_secs(cfg.gc.grace_secs) / 2),
                ..StoreConfig::default()
            },
            owner: Some(owner_id(&cfg.data_dir)?),
            reopen: Default::default(),
            space: space_policy(cfg),
            encryption_keys: cfg.store.encryption_keys.clone(),
        };
        let manager = Arc::new(VolumeManager::new(opts, store, devices));

        // The TCP listener's secrets are read before anything is bound: a bad file leaves no
        // socket behind.
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
                let tls = match (&cfg.api.tls_cert, &cfg.api.tls_key) {
                    (Some(cert), Some(key)) => Some(api::tls::acceptor(cert, key)?),
                    _ => None,
                };
                Some((addr, token, tls))
            }
            None => None,
        };
        let (unix, socket_id) = bind_unix(&cfg.api.socket)?;
        let tcp = match tcp {
            Some((addr, token, tls)) => {
                let l = TcpListener::bind(addr)
                    .await
                    .map_err(io_err("cannot bind TCP", addr))?;
                Some((l, token, tls))
            }
            None => None,
        };

        let opened = manager.restore().await.map_err(ServerError::Restore)?;
        tracing::info!(volumes = opened, "volumes restored");

        let ready = Arc::new(AtomicBool::new(false));
        let handoff = Arc::new(tokio::sync::Notify::new());
        let state = AppState {
            manager: manager.clone(),
            ready: ready.clone(),
            counters: Arc::default(),
            handoff: handoff.clone(),
        };
        let max_body = usize::try_from(cfg.api.max_body_bytes.0).unwrap_or(64 << 10);
        let (stop, stop_rx) = watch::channel(false);
        let limits = Limits {
            header_read_timeout: Duration::from_secs(cfg.api.header_read_timeout_secs),
            idle_timeout: Duration::from_secs(cfg.api.idle_timeout_secs),
            max_connections: cfg.api.max_connections,
        };
        let counters = state.counters.clone();
        let mut listeners = Vec::new();
        let app = api::router(state.clone(), max_body, None);
        listeners.push(tokio::spawn(listener::serve(
            Listener::Unix(unix),
            app,
            limits,
            counters.unix.clone(),
            stop_rx.clone(),
        )));
        let mut tcp_addr = None;
        let mut tcp_tls = false;
        if let Some((l, token, tls)) = tcp {
            tcp_addr = l.local_addr().ok();
            tcp_tls = tls.is_some();
            let app = api::router(state, max_body, Some(token));
            listeners.push(tokio::spawn(listener::serve(
                Listener::Tcp { listener: l, tls },
                app,
                limits,
                counters.tcp.clone(),
                stop_rx,
            )));
        }
        ready.store(true, Ordering::Release);
        tracing::info!(socket = %cfg.api.socket.display(), tcp = ?tcp_addr, tls = tcp_tls, store = %url, "glidefs API listening");
        Ok(Self {
            manager,
            handoff,
            ready,
            stop,
            listeners,
            socket: cfg.api.socket.clone(),
            socket_id,
            tcp_addr,
            lock,
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

    /// Stops the daemon: the shutdown steps of the module docs; the data directory's lock is
    /// released last.
    pub async fn shutdown(self) {
        self.close(false).await;
    }

    /// Stops the daemon for a successor: like [`Server::shutdown`], but the devices stay
    /// (QUIESCED, I/O held) for the next daemon on this data directory. Returns how many.
    pub async fn handoff(self) -> usize {
        self.close(true).await.0
    }

    /// Resolves when a client asked for a hand-off (`POST /v1/handoff`).
    pub async fn handoff_requested(&self) {
        self.handoff.notified().await;
    }

    /// Shutdown steps 1-3; returns the devices kept and the data directory's lock, still held.
    async fn close(self, keep_devices: bool) -> (usize, DataDirLock) {
        self.ready.store(false, Ordering::Release);
        let _ = self.stop.send(true);
        for l in self.listeners {
            match tokio::time::timeout(DRAIN_TIMEOUT, l).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => {
                    tracing::warn!(error = %chain(&e), "API listener ended with an error")
                }
                Ok(Err(e)) => tracing::error!(error = %chain(&e), "API listener task failed"),
                Err(_) => tracing::warn!("in-flight API requests did not finish in time"),
            }
        }
        let kept = if keep_devices {
            self.manager.handoff().await
        } else {
            self.manager.shutdown().await;
            0
        };
        remove_own_socket(&self.socket, self.socket_id);
        tracing::info!(devices_kept = kept, "glidefs stopped");
        (kept, self.lock)
    }
}

/// Tells systemd (when `$NOTIFY_SOCKET` is set) about a state change; failures are logged.
fn notify(state: sd_notify::NotifyState<'_>) {
    if let Err(e) = sd_notify::notify(false, &[state]) {
        tracing::warn!(error = %chain(&e), "sd_notify failed");
    }
}

/// Tells systemd that a reload began: `RELOADING=1` with `MONOTONIC_USEC` (CLOCK_MONOTONIC
/// now, in µs) in one message, as systemd 253+ requires (without it the reload fails). The
/// re-executed daemon sends `READY=1` once it serves again.
fn notify_reloading() {
    match sd_notify::NotifyState::monotonic_usec_now() {
        Ok(now) => {
            if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Reloading, now]) {
                tracing::warn!(error = %chain(&e), "sd_notify failed");
            }
        }
        Err(e) => {
            tracing::warn!(error = %chain(&e), "cannot read CLOCK_MONOTONIC for MONOTONIC_USEC");
            notify(sd_notify::NotifyState::Reloading);
        }
    }
}

/// How [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// SIGTERM/SIGINT: devices deleted, volumes closed.
    Stopped,
    /// `POST /v1/handoff`: `devices` kept for the successor that asked.
    HandedOff { devices: usize },
    /// SIGHUP: `devices` kept; the caller re-executes the binary, which takes them over.
    Reexec { devices: usize },
}

/// Runs the daemon until SIGTERM or SIGINT (clean stop), SIGHUP (hand-off to a re-executed
/// self: the way to upgrade the binary in place) or `POST /v1/handoff` (hand-off to the
/// process that asked). `lock` is the data directory's lock when the caller took it
/// ([`take_over`]); else it is taken at start, without waiting.
///
/// Returns how it ended and the data directory's lock, still held: the caller keeps it until
/// the process exits or re-executes itself, so that no other daemon starts on the data
/// directory while this process still runs anything (a device step the runtime's shutdown
/// waits for).
pub async fn run(
    cfg: &Config,
    devices: Arc<dyn Exporter>,
    lock: Option<DataDirLock>,
) -> Result<(Ending, DataDirLock), ServerError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term =
        signal(SignalKind::terminate()).map_err(io_err("cannot install", "SIGTERM handler"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(io_err("cannot install", "SIGINT handler"))?;
    let mut hup =
        signal(SignalKind::hangup()).map_err(io_err("cannot install", "SIGHUP handler"))?;
    let server = Server::start_locked(cfg, devices, lock).await?;
    notify(sd_notify::NotifyState::Ready);
    let why = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = hup.recv() => "SIGHUP",
        () = server.handoff_requested() => "handoff",
    };
    match why {
        "SIGHUP" => {
            tracing::info!("SIGHUP: handing the devices off to a re-executed glidefs");
            notify_reloading();
            let (devices, lock) = server.close(true).await;
            Ok((Ending::Reexec { devices }, lock))
        }
        "handoff" => {
            tracing::info!("hand-off requested: detaching the devices for the successor");
            notify(sd_notify::NotifyState::Stopping);
            let (devices, lock) = server.close(true).await;
            Ok((Ending::HandedOff { devices }, lock))
        }
        signal => {
            tracing::info!(signal, "shutting down");
            notify(sd_notify::NotifyState::Stopping);
            let (_, lock) = server.close(false).await;
            Ok((Ending::Stopped, lock))
        }
    }
}

/// Whether process `pid` still runs (a zombie, exited but not yet reaped, does not).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may contain any
        // character: take the first field after the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// How long [`take_over`] waits for the previous daemon to exit and let go of the data
/// directory's lock.
pub const TAKEOVER_WAIT: Duration = Duration::from_secs(180);

/// The least [`take_over`] waits for the lock once the previous daemon has exited (the
/// kernel drops its lock as the process ends, before its pid goes).
const TAKEOVER_LOCK_WAIT_MIN: Duration = Duration::from_secs(5);

/// `glidefs handoff`: asks the daemon on `cfg`'s socket to hand off, waits until that process
/// has exited (its devices detached, its volumes closed), then takes the data directory's lock
/// that it held, so that [`run`] can take the devices over. Returns the previous daemon's pid
/// and the lock.
pub async fn take_over(cfg: &Config) -> Result<(u32, DataDirLock), ServerError> {
    let client =
        glidefs_client::Client::new(glidefs_client::Endpoint::Unix(cfg.api.socket.clone()));
    let pid = client.handoff().await.map_err(ServerError::Takeover)?;
    tracing::info!(
        pid,
        "the running daemon is handing off; waiting for it to exit"
    );
    let start = std::time::Instant::now();
    while running(pid) {
        if start.elapsed() > TAKEOVER_WAIT {
            return Err(ServerError::TakeoverTimeout {
                pid,
                waited: TAKEOVER_WAIT,
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::info!(
        pid,
        waited_ms = start.elapsed().as_millis() as u64,
        "previous daemon exited"
    );
    let wait = TAKEOVER_WAIT
        .saturating_sub(start.elapsed())
        .max(TAKEOVER_LOCK_WAIT_MIN);
    let lock = DataDirLock::acquire_within(&cfg.data_dir, wait).await?;
    Ok((pid, lock))
}

/// The `[space]` and `[gc]` sections as the manager's per-volume policy.
fn space_policy(cfg: &Config) -> crate::manager::space::SpacePolicy {
    let s = &cfg.space;
    let every = |secs: u64| (secs > 0).then(|| std::time::Duration::from_secs(secs));
    crate::manager::space::SpacePolicy {
        compact: glidefs_volume::CompactOptions {
            threshold: f64::from(s.compact_threshold_pct) / 100.0,
            max_bytes: s.compact_max_bytes.0,
        },
        compact_every: every(s.compact_interval_secs),
        gc: glidefs_volume::GcOptions {
            grace: std::time::Duration::from_secs(cfg.gc.grace_secs),
            keep_manifests: cfg.gc.keep_manifests,
            ..Default::default()
        },
        gc_every: every(s.gc_interval_secs),
    }
}
