//! API tests of encryption at rest: a volume created with `encryption_key_file` stores no
//! plaintext, keeps only the key's path in `state.json`, survives a restart, reads back cold
//! on attach with the right key, and refuses to attach with a wrong key or none
//! (`key_mismatch`, naming both key ids); a malformed key file is `invalid_encryption_key`, and
//! so, at once and without its length or content in the error, is a key path that is not a
//! small regular file of mode 0600 (a device, a FIFO, a directory, a large or shared file).

mod api_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use hyper::Method;
use serde_json::json;

use std::sync::Arc;

use glidefs::ublk::export::NoDevices;

use api_support::daemon::{assert_error, config, start, start_with, store_objects, text, Daemon};

const KEY_A: &str = "a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0";
const KEY_B: &str = "0f0e0d0c0b0a09080706050403020100ffeeddccbbaa99887766554433221100";

/// A key file of mode 0600 (a key open to others is refused).
fn key_file(dir: &Path, name: &str, text: &str) -> String {
    key_file_mode(dir, name, text, 0o600)
}

fn key_file_mode(dir: &Path, name: &str, text: &str, mode: u32) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p.display().to_string()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_volume_round_trips_and_a_wrong_key_refuses_to_attach() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        key_file(dir.path(), "a.key", KEY_A),
        key_file(dir.path(), "b.key", KEY_B),
    );
    let bad = key_file(dir.path(), "bad.key", "not a key");
    let mut d = start(dir.path()).await;

    // A malformed key, a relative path, or both sources: refused before anything is made.
    for (body, what) in [
        (
            json!({"name": "sec", "size": "8M", "encryption_key_file": bad}),
            "malformed",
        ),
        (
            json!({"name": "sec", "size": "8M", "encryption_key_file": "a.key"}),
            "relative",
        ),
        (
            json!({"name": "sec", "size": "8M", "encryption_key_file": a, "encryption_key_env": "X"}),
            "both",
        ),
        (
            json!({"name": "sec", "size": "8M", "encryption_key_env": "GLIDEFS_KEY_UNSET"}),
            "unset variable",
        ),
        (
            json!({"name": "sec", "size": "8M", "encryption_key_env": "HOME"}),
            "not a GLIDEFS_KEY_* variable",
        ),
    ] {
        let r = d.req(Method::POST, "/v1/volumes", Some(body)).await;
        assert_error(&r, 400, "invalid_encryption_key", what);
        assert!(!text(&r).contains(KEY_A), "{what}: the key never appears");
    }
    let r = d
        .req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "sec", "size": "8M", "encryption_key_file": bad})),
        )
        .await;
    assert!(
        text(&r).contains("bad.key"),
        "the error names the file: {}",
        text(&r)
    );
    assert!(d.client.list().await.unwrap().volumes.is_empty());

    let v = d
        .create(json!({"name": "sec", "size": "8M", "block_size": "64K", "encryption_key_file": a}))
        .await;
    let key_id = v.encryption_key_id.clone().expect("key id shown");
    assert_eq!(key_id.len(), 16);
    let pattern: Vec<u8> = b"glidefs-api-secret-pattern!"
        .iter()
        .copied()
        .cycle()
        .take(256 * 1024)
        .collect();
    let noise = glidefs_testkit::noise(5, 64 * 1024);
    d.volume("sec").write(4096, &pattern).await.unwrap();
    d.volume("sec").write(1 << 20, &noise).await.unwrap();
    let f = d.client.flush("sec").await.unwrap();
    assert!(f.blocks >= 4, "{f:?}");

    // No object holds the data in clear; state.json holds the key's path, not the key.
    let objects = store_objects(dir.path());
    assert!(objects.len() >= 3, "{objects:?}");
    for p in &objects {
        let bytes = std::fs::read(p).unwrap();
        assert!(!contains(&bytes, b"glidefs-api-secret"), "{}", p.display());
        assert!(!contains(&bytes, &noise[1000..1064]), "{}", p.display());
    }
    let state = std::fs::read_to_string(d.cfg.state_path()).unwrap();
    assert!(state.contains("a.key"), "{state}");
    assert!(
        !state.contains(KEY_A) && !state.contains(&KEY_A[..16]),
        "{state}"
    );

    // A restart re-reads the key from the file.
    d.stop().await;
    let mut d = start(dir.path()).await;
    let v = d.client.show("sec").await.unwrap();
    assert_eq!(
        v.encryption_key_id.as_deref(),
        Some(key_id.as_str()),
        "{v:?}"
    );
    d.client.remove("sec", false, false).await.unwrap();

    // Attaching with another key, or with none, is refused with both ids.
    for (body, given) in [
        (
            json!({"name": "sec", "attach_existing": true, "encryption_key_file": b}),
            "the key given has id",
        ),
        (
            json!({"name": "sec", "attach_existing": true}),
            "no key was given",
        ),
    ] {
        let r = d.req(Method::POST, "/v1/volumes", Some(body.clone())).await;
        assert_error(&r, 409, "key_mismatch", &body.to_string());
        let msg = text(&r);
        assert!(msg.contains(&key_id) && msg.contains(given), "{msg}");
        assert!(d.client.list().await.unwrap().volumes.is_empty());
    }

    // The right key attaches it and the data reads back cold from the store.
    let v = d
        .create(json!({"name": "sec", "attach_existing": true, "encryption_key_file": a}))
        .await;
    assert_eq!(v.cache_bytes, 0, "cold cache");
    let mut back = vec![0u8; pattern.len()];
    d.volume("sec").read(4096, &mut back).await.unwrap();
    assert!(back == pattern, "pattern read back cold");
    let mut back = vec![0u8; noise.len()];
    d.volume("sec").read(1 << 20, &mut back).await.unwrap();
    assert!(back == noise, "noise read back cold");

    // An unencrypted volume refuses a key.
    d.create(json!({"name": "plain", "size": "4M"})).await;
    d.client.flush("plain").await.unwrap();
    d.client.remove("plain", false, false).await.unwrap();
    let r = d
        .req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "plain", "attach_existing": true, "encryption_key_file": a})),
        )
        .await;
    assert_error(&r, 409, "key_mismatch", "key for a plain volume");
    assert!(text(&r).contains("is not encrypted"), "{}", text(&r));
    d.stop().await;
}

/// `encryption_key_env` reads a `GLIDEFS_KEY_*` variable the daemon started with (here set in
/// its configuration, as `Config::locate` does from the environment); only the name is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_from_the_daemon_environment() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), false);
    cfg.store.encryption_keys.insert("GLIDEFS_KEY_SEC", KEY_A);
    cfg.store.encryption_keys.insert("GLIDEFS_KEY_BAD", "zz");
    let mut d = start_with(cfg.clone(), Arc::new(NoDevices)).await;
    let r = d
        .req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "e", "size": "4M", "encryption_key_env": "GLIDEFS_KEY_BAD"})),
        )
        .await;
    assert_error(&r, 400, "invalid_encryption_key", "malformed variable");
    assert!(text(&r).contains("GLIDEFS_KEY_BAD"), "{}", text(&r));
    let v = d
        .create(json!({"name": "e", "size": "4M", "encryption_key_env": "GLIDEFS_KEY_SEC"}))
        .await;
    assert!(v.encryption_key_id.is_some());
    d.volume("e").write(0, &[0x5a; 8192]).await.unwrap();
    d.client.flush("e").await.unwrap();
    let state = std::fs::read_to_string(d.cfg.state_path()).unwrap();
    assert!(
        state.contains("GLIDEFS_KEY_SEC") && !state.contains(KEY_A),
        "{state}"
    );
    d.stop().await;
    // Restarted without the variable: listed as failed, naming it; with it: running.
    let mut d = start(dir.path()).await;
    let v = d.client.show("e").await.unwrap();
    assert_eq!(v.state, glidefs::model::VolumeState::Failed, "{v:?}");
    assert!(
        v.error.as_deref().unwrap_or("").contains("GLIDEFS_KEY_SEC"),
        "{v:?}"
    );
    d.stop().await;
    let mut d = start_with(cfg, Arc::new(NoDevices)).await;
    assert_eq!(
        d.client.show("e").await.unwrap().state,
        glidefs::model::VolumeState::Running
    );
    let mut back = vec![0u8; 8192];
    d.volume("e").read(0, &mut back).await.unwrap();
    assert_eq!(back, vec![0x5a; 8192]);
    d.stop().await;
}

/// Creates volume `name` with `encryption_key_file` = `path`, bounded by 10 s (a key read that
/// blocks, e.g. on a FIFO, fails the test instead of hanging it); the response.
async fn create_with_key_file(d: &Daemon, name: &str, path: &str) -> glidefs::client::RawResponse {
    let body = json!({"name": name, "size": "4M", "encryption_key_file": path});
    tokio::time::timeout(
        Duration::from_secs(10),
        d.req(Method::POST, "/v1/volumes", Some(body)),
    )
    .await
    .unwrap_or_else(|_| panic!("create with key file `{path}` still waiting after 10 s"))
}

/// Asserts `invalid_encryption_key` naming `path` with `want` in the message.
async fn refused(d: &Daemon, path: &str, want: &str) {
    let r = create_with_key_file(d, "sec", path).await;
    assert_error(&r, 400, "invalid_encryption_key", path);
    assert!(
        text(&r).contains(path) && text(&r).contains(want),
        "{path}: want `{want}`: {}",
        text(&r)
    );
    d.assert_alive(path).await;
}

/// (Issue 45, item 11.) A key path that is not a regular file is refused at once, unread:
/// `/dev/zero` (read whole, it grew to the OOM killer), a FIFO (its open waited for a writer
/// on an async worker), a directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_path_that_is_no_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("key.fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let mut d = start(dir.path()).await;
    let fifo = fifo.display().to_string();
    let keys = dir.path().display().to_string();
    for path in [fifo.as_str(), "/dev/zero", keys.as_str()] {
        refused(&d, path, "is not a regular file").await;
    }
    assert!(d.names().await.is_empty());
    d.stop().await;
}

/// (Issue 45, item 11.) A key file is read only when it is private (mode 0600 or stricter,
/// like the API token and TLS key) and small; what is wrong is said without the file's
/// length or content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_file_must_be_private_and_small() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let shared = key_file_mode(dir.path(), "shared.key", KEY_A, 0o644);
    refused(&d, &shared, "mode 0644").await;
    let big = key_file(dir.path(), "big.key", &"x".repeat(9000));
    refused(&d, &big, "larger than 4096 bytes").await;
    let odd = key_file(dir.path(), "odd.key", &"y".repeat(1234));
    refused(&d, &odd, "does not hold a key").await;
    let r = create_with_key_file(&d, "sec", &odd).await;
    assert!(
        !text(&r).contains("1234"),
        "the error tells no length: {}",
        text(&r)
    );
    let private = key_file(dir.path(), "private.key", KEY_A);
    let r = create_with_key_file(&d, "sec", &private).await;
    assert_eq!(r.status, 201, "{}", text(&r));
    d.stop().await;
}
