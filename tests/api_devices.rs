//! API tests of the device layer seen through the API, on fake exporters: a kernel without
//! ublk, devices reported and stopped, and devices that fail to attach or to stop (the
//! harness is `api_support`).

mod api_support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use glidefs::daemon::export::Unavailable;
use glidefs::model::VolumeState;
use hyper::Method;
use serde_json::json;

use api_support::daemon::{assert_error, cache_dirs, config, start_with, text};
use api_support::exporters::{BrokenDevices, FakeDevices};

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
