//! API tests of online resize (`POST /v1/volumes/{name}/resize`) on fake exporters: the
//! volume, its `state.json` entry and its device grow and keep the size across a restart;
//! bad sizes, shrinking, a kernel without UPDATE_SIZE and a failing UPDATE_SIZE are clear
//! errors that say what changed (the harness is `api_support`).

mod api_support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use glidefs::model::{ResizeReport, VolumeState};
use hyper::Method;
use serde_json::{json, Value};

use api_support::daemon::{assert_error, config, start, start_with, state_entry, text, Daemon};
use api_support::exporters::Resizing;

const M: u64 = 1 << 20;

/// The size `state.json` records for `name`.
fn state_size(d: &Daemon, name: &str) -> u64 {
    state_entry(d, name)["size"].as_u64().unwrap()
}

async fn resize(d: &Daemon, name: &str, size: Value) -> glidefs::client::RawResponse {
    d.req(
        Method::POST,
        &format!("/v1/volumes/{name}/resize"),
        Some(json!({ "size": size })),
    )
    .await
}

async fn read(d: &Daemon, name: &str, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAA; len];
    d.volume(name).read(off, &mut buf).await.unwrap();
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_grows_the_volume_its_state_and_its_device_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let layer = Arc::new(Resizing::default());
    let mut d = start_with(config(dir.path(), false), layer.clone()).await;
    d.create(json!({"name": "r", "size": "4M", "block_size": "64K"}))
        .await;
    let v = d.volume("r");
    v.write(4 * M - 4096, b"at the old end").await.unwrap();
    assert!(v.write(4 * M, b"past it").await.is_err());

    let r = resize(&d, "r", json!("8M")).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let report: ResizeReport = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        report,
        ResizeReport {
            name: "r".into(),
            previous_size: 4 * M,
            size: 8 * M,
            device: Some("/dev/ublkb0".into()),
        }
    );
    assert_eq!(*layer.resized.lock(), [(0, 8 * M)]);
    assert_eq!(v.size(), 8 * M);
    assert_eq!(state_size(&d, "r"), 8 * M);
    assert_eq!(d.client.show("r").await.unwrap().size, 8 * M);
    v.write(8 * M - 4096, b"at the new end").await.unwrap();
    v.write(4 * M, b"past the old end").await.unwrap();

    // The same size again retries only the device (a no-op here); the client speaks it too.
    let again = d.client.resize("r", 8 * M).await.unwrap();
    assert_eq!((again.previous_size, again.size), (8 * M, 8 * M));

    // A restart re-opens the volume at the new size with everything written.
    d.stop().await;
    let mut d = start_with(config(dir.path(), false), Arc::new(Resizing::default())).await;
    let info = d.client.show("r").await.unwrap();
    assert_eq!((info.state, info.size), (VolumeState::Running, 8 * M));
    assert_eq!(d.volume("r").size(), 8 * M);
    assert_eq!(read(&d, "r", 4 * M - 4096, 14).await, b"at the old end");
    assert_eq!(read(&d, "r", 4 * M, 16).await, b"past the old end");
    assert_eq!(read(&d, "r", 8 * M - 4096, 14).await, b"at the new end");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sizes_and_shrinking_are_refused_with_nothing_changed() {
    let dir = tempfile::tempdir().unwrap();
    let layer = Arc::new(Resizing::default());
    let mut d = start_with(config(dir.path(), false), layer.clone()).await;
    d.create(json!({"name": "r", "size": "4M", "block_size": "64K"}))
        .await;
    d.create(json!({"name": "ro", "size": "4M"})).await;
    d.client.remove("ro", false, false).await.unwrap();
    d.create(json!({"name": "ro", "read_only": true, "attach_existing": true}))
        .await;
    let r = resize(&d, "r", json!("2M")).await;
    assert_error(&r, 400, "invalid_size", "shrink");
    let msg = text(&r);
    assert!(
        msg.contains(&(4 * M).to_string()) && msg.contains(&(2 * M).to_string()),
        "both sizes named: {msg}"
    );
    let r = resize(&d, "r", json!(4 * M + 4096)).await;
    assert_error(&r, 400, "invalid_size", "off the block grid");
    assert!(text(&r).contains("65536"), "{}", text(&r));
    for (path, body, status, code) in [
        (
            "/v1/volumes/r/resize",
            Some(json!({"size": "12Q"})),
            400,
            "invalid_size",
        ),
        (
            "/v1/volumes/r/resize",
            Some(json!({"size": -1})),
            400,
            "invalid_size",
        ),
        (
            "/v1/volumes/r/resize",
            Some(json!({"size": 0})),
            400,
            "invalid_size",
        ),
        (
            "/v1/volumes/r/resize",
            Some(json!({"size": "1P"})),
            400,
            "invalid_size",
        ),
        ("/v1/volumes/r/resize", Some(json!({})), 400, "bad_request"),
        (
            "/v1/volumes/r/resize",
            Some(json!({"size": "8M", "x": 1})),
            400,
            "bad_request",
        ),
        ("/v1/volumes/r/resize", None, 415, "unsupported_media_type"),
        (
            "/v1/volumes/ro/resize",
            Some(json!({"size": "8M"})),
            409,
            "read_only",
        ),
        (
            "/v1/volumes/nope/resize",
            Some(json!({"size": "8M"})),
            404,
            "not_found",
        ),
        (
            "/v1/volumes/a%2Fb/resize",
            Some(json!({"size": "8M"})),
            400,
            "invalid_name",
        ),
    ] {
        d.expect_error(Method::POST, path, body, status, code).await;
    }
    assert!(layer.resized.lock().is_empty());
    assert_eq!(d.volume("r").size(), 4 * M);
    assert_eq!(state_size(&d, "r"), 4 * M);
    let r = d.req(Method::GET, "/v1/volumes/r/resize", None).await;
    assert_error(&r, 405, "method_not_allowed", "GET resize");
    d.stop().await;
}

/// Where the kernel cannot resize the device, nothing changes; where UPDATE_SIZE fails, the
/// error says the volume grew and the device did not, and the same call again finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_without_update_size_changes_nothing_and_a_failed_device_step_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let layer = Arc::new(Resizing::default());
    let mut d = start_with(config(dir.path(), false), layer.clone()).await;
    d.create(json!({"name": "r", "size": "4M", "block_size": "64K"}))
        .await;
    layer.no_update_size.store(true, Ordering::SeqCst);
    let r = resize(&d, "r", json!("8M")).await;
    assert_error(&r, 501, "unsupported_kernel", "no UPDATE_SIZE");
    assert!(text(&r).contains("UPDATE_SIZE"), "{}", text(&r));
    assert_eq!(d.volume("r").size(), 4 * M, "the engine did not move");
    assert_eq!(state_size(&d, "r"), 4 * M);
    assert_eq!(d.client.show("r").await.unwrap().size, 4 * M);

    layer.no_update_size.store(false, Ordering::SeqCst);
    layer.fail_resize.store(true, Ordering::SeqCst);
    let r = resize(&d, "r", json!("8M")).await;
    assert_error(&r, 500, "device_failed", "UPDATE_SIZE fails");
    let msg = text(&r);
    assert!(
        msg.contains("grew from 4194304 to 8388608") && msg.contains("Input/output error"),
        "{msg}"
    );
    assert_eq!(d.volume("r").size(), 8 * M);
    assert_eq!(state_size(&d, "r"), 8 * M);
    assert!(layer.resized.lock().is_empty());

    layer.fail_resize.store(false, Ordering::SeqCst);
    let again = d.client.resize("r", 8 * M).await.unwrap();
    assert_eq!((again.previous_size, again.size), (8 * M, 8 * M));
    assert_eq!(*layer.resized.lock(), [(0, 8 * M)]);
    d.stop().await;
}

/// A crash after `state.json` took the new size but before the engine grew: the next start
/// opens the volume at the new size (the engine grows at open), with the data intact. And a
/// volume without a device resizes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_recorded_before_a_crash_is_completed_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "r", "size": "4M", "block_size": "64K"}))
        .await;
    d.volume("r").write(0, b"before").await.unwrap();
    d.client.flush("r").await.unwrap();
    d.stop().await;
    // What a resize leaves when it dies right after recording the size.
    let path = d.cfg.state_path();
    let mut state: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    state["volumes"][0]["size"] = json!(6 * M);
    std::fs::write(&path, serde_json::to_vec(&state).unwrap()).unwrap();

    let mut d = start(dir.path()).await;
    let info = d.client.show("r").await.unwrap();
    assert_eq!((info.state, info.size), (VolumeState::Running, 6 * M));
    assert_eq!(d.volume("r").size(), 6 * M);
    assert_eq!(read(&d, "r", 0, 6).await, b"before");
    d.volume("r").write(6 * M - 4096, b"new end").await.unwrap();
    // No device: the report names none.
    let r = d.client.resize("r", 8 * M).await.unwrap();
    assert_eq!((r.previous_size, r.size, r.device), (6 * M, 8 * M, None));
    d.client.flush("r").await.unwrap();
    d.stop().await;
    let mut d = start(dir.path()).await;
    assert_eq!(d.volume("r").size(), 8 * M);
    assert_eq!(read(&d, "r", 6 * M - 4096, 7).await, b"new end");
    d.stop().await;
}
