//! Security of the daemon's files and API listeners (issue 21).
//!
//! - Files: the real binary started under umask 000 leaves nothing that group or others can
//!   read, write or enter in its data directory or its local (`file://`) store.
//!
//! No test here needs a kernel with ublk (`--no-devices` / `NoDevices`).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use glidefs::client::{Client, Endpoint};
use glidefs::device::NoDevices;
use glidefs::model::CreateVolume;
use serde_json::json;

const GLIDEFS: &str = env!("CARGO_BIN_EXE_glidefs");

/// How long a daemon may take to listen (a hang guard on a loaded machine).
const START_GUARD: Duration = Duration::from_secs(120);

/// A `glidefs serve --no-devices` child started by `sh` under a given umask.
struct Serve {
    child: Child,
    socket: PathBuf,
}

impl Serve {
    /// Starts the binary on `config` under `umask` and waits until its socket answers.
    fn start(config: &Path, socket: &Path, umask: &str) -> Self {
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask} && exec \"$0\" serve --no-devices --config \"$1\""
            ))
            .arg(GLIDEFS)
            .arg(config)
            .env("GLIDEFS_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn glidefs serve");
        let mut serve = Serve {
            child,
            socket: socket.to_path_buf(),
        };
        let start = std::time::Instant::now();
        while start.elapsed() < START_GUARD {
            if let Some(status) = serve.child.try_wait().unwrap() {
                panic!("glidefs serve exited at start: {status:?}");
            }
            if std::os::unix::net::UnixStream::connect(&serve.socket).is_ok() {
                return serve;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("glidefs serve did not listen on {}", serve.socket.display());
    }

    fn client(&self) -> Client {
        Client::new(Endpoint::Unix(self.socket.clone()))
    }

    /// SIGTERM; the daemon must exit 0.
    fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(st.success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "exit status after SIGTERM: {status:?}");
        std::mem::forget(self);
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every entry under `root` (itself included) with its mode bits.
fn walk(root: &Path) -> Vec<(PathBuf, u32)> {
    fn go(p: &Path, out: &mut Vec<(PathBuf, u32)>) {
        let meta = std::fs::symlink_metadata(p).unwrap();
        out.push((p.to_path_buf(), meta.mode() & 0o7777));
        if meta.is_dir() {
            for e in std::fs::read_dir(p).unwrap() {
                go(&e.unwrap().path(), out);
            }
        }
    }
    let mut out = Vec::new();
    go(root, &mut out);
    out
}

/// A daemon started under umask 000 (the README's `glidefs serve &` from a shell that has
/// one) creates its data directory, owner id, volume caches and WAL, `state.json` and its
/// `file://` store: nothing of it may be open to group or others. The API socket keeps its
/// documented 0660.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_private_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = dir.path().join("store");
    let socket = dir.path().join("run/api.sock");
    let config = dir.path().join("glidefs.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[store]\nurl = \"file://{}\"\n[api]\nsocket = \"{}\"\n\
             [volume_defaults]\nflush_interval_secs = 3600\n",
            data.display(),
            store.display(),
            socket.display()
        ),
    )
    .unwrap();

    let serve = Serve::start(&config, &socket, "000");
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.mode() & 0o777, 0o660, "the API socket keeps 0660");
    let run = std::fs::metadata(socket.parent().unwrap()).unwrap();
    assert_eq!(run.mode() & 0o777, 0o750, "the socket's group may reach it");
    let client = serve.client();
    for name in ["v1", "v2"] {
        client
            .create(&CreateVolume {
                name: name.into(),
                size: Some(json!("1M")),
                block_size: Some(json!("4K")),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let report = client.flush("v1").await.unwrap();
    assert_eq!(report.name, "v1");
    // A clean stop closes every volume (WAL durable, checkpoint written).
    serve.terminate();

    let mut entries = walk(&data);
    entries.extend(walk(&store));
    for must in [
        data.join("owner-id"),
        data.join("state.json"),
        data.join("volumes/v1"),
        data.join("volumes/v2"),
        store.join("volumes/v1"),
    ] {
        assert!(
            entries.iter().any(|(p, _)| p == &must),
            "{} missing: {entries:?}",
            must.display()
        );
    }
    let cache_files = entries
        .iter()
        .filter(|(p, _)| p.starts_with(data.join("volumes/v1")) && p.is_file())
        .count();
    assert!(cache_files > 0, "no cache files: {entries:?}");
    let store_files = entries
        .iter()
        .filter(|(p, _)| p.starts_with(&store) && p.is_file())
        .count();
    assert!(store_files > 0, "no objects in the store: {entries:?}");
    let open: Vec<String> = entries
        .iter()
        .filter(|(_, mode)| mode & 0o077 != 0)
        .map(|(p, mode)| format!("{} {mode:04o}", p.display()))
        .collect();
    assert!(
        open.is_empty(),
        "open to group or others under umask 000:\n{}",
        open.join("\n")
    );
}

/// An existing data directory and local store open to others (left by an earlier release, or
/// made by hand) are tightened to 0700 at start; the daemon serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_data_dir_and_store_are_tightened_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = glidefs::config::Config {
        data_dir: dir.path().join("data"),
        ..Default::default()
    };
    let store = dir.path().join("store");
    cfg.store.url = Some(format!("file://{}", store.display()));
    cfg.api.socket = dir.path().join("api.sock");
    for d in [&cfg.data_dir, &store] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o757)).unwrap();
    }
    let server = glidefs::server::Server::start(&cfg, std::sync::Arc::new(NoDevices))
        .await
        .expect("starts");
    for d in [&cfg.data_dir, &store] {
        let mode = std::fs::metadata(d).unwrap().mode() & 0o7777;
        assert_eq!(format!("{mode:04o}"), "0700", "{}", d.display());
    }
    server.shutdown().await;

    // Not a directory: refused, naming the key and the path.
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::write(&store, b"").unwrap();
    let err = glidefs::server::Server::start(&cfg, std::sync::Arc::new(NoDevices))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("store.url") && err.contains(&store.display().to_string()),
        "{err}"
    );
}
