//! API tests of per-volume QoS limits (`qos` at create, `GET`/`PUT /v1/volumes/{name}/qos`)
//! on a fake exporter that records what its devices are given: the limits are checked (bursts
//! filled in), handed to the device at attach and live, kept in `state.json` across a
//! restart, and bad limits are clear errors that change nothing. (That the limits hold on a
//! real device: `tests/ublk_qos.rs`; the buckets themselves: `glidefs_ublk::qos`.)

mod api_support;

use std::sync::Arc;

use glidefs::model::{QosLimit, QosLimits};
use hyper::Method;
use serde_json::{json, Value};

use api_support::daemon::{assert_error, config, start, start_with, state_entry, text, Daemon};
use api_support::exporters::QosRecording;

fn limit(rate: u64, burst: u64) -> Option<QosLimit> {
    Some(QosLimit {
        rate,
        burst: Some(burst),
    })
}

async fn put_qos(d: &Daemon, name: &str, body: Value) -> glidefs::client::RawResponse {
    d.req(Method::PUT, &format!("/v1/volumes/{name}/qos"), Some(body))
        .await
}

/// The `qos` of `name`'s entry in `state.json` (`null` when left out).
fn state_qos(d: &Daemon, name: &str) -> Value {
    state_entry(d, name)["qos"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_go_to_the_device_at_create_live_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(QosRecording::default());
    let mut d = start_with(config(dir.path(), false), rec.clone()).await;
    let v = d
        .create(json!({
            "name": "q", "size": "4M",
            "qos": {"write_bytes": {"rate": 50 << 20}, "read_iops": {"rate": 1000, "burst": 4000}},
        }))
        .await;
    let want = QosLimits {
        write_bytes: limit(50 << 20, 5 << 20),
        read_iops: limit(1000, 4000),
        ..QosLimits::default()
    };
    assert_eq!(v.qos, Some(want), "bursts filled in");
    assert_eq!(*rec.at_attach.lock(), [want]);
    assert_eq!(d.client.qos("q").await.unwrap(), want);
    assert_eq!(state_qos(&d, "q")["write_bytes"]["burst"], json!(5 << 20));
    let t = v.throttled.expect("a device reports what waited");
    assert_eq!((t.requests, t.seconds), (0, 0.0));

    // Live: the device gets the new limits, all of them replaced.
    let iops_only = QosLimits {
        iops: limit(500, 50),
        ..QosLimits::default()
    };
    assert_eq!(d.client.set_qos("q", &iops_only).await.unwrap(), iops_only);
    assert_eq!(*rec.changed.lock(), [(0, iops_only)]);
    assert_eq!(d.client.show("q").await.unwrap().qos, Some(iops_only));
    assert_eq!(state_qos(&d, "q")["write_bytes"], Value::Null);

    // A restart hands the recorded limits to the device it takes over.
    d.stop().await;
    let rec2 = Arc::new(QosRecording::default());
    let mut d = start_with(config(dir.path(), false), rec2.clone()).await;
    assert_eq!(*rec2.at_attach.lock(), [iops_only]);
    assert_eq!(d.client.qos("q").await.unwrap(), iops_only);

    // `{}` removes every limit; the volume shows none and state.json leaves the field out.
    let r = put_qos(&d, "q", json!({})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(*rec2.changed.lock(), [(0, QosLimits::default())]);
    assert_eq!(d.client.show("q").await.unwrap().qos, None);
    assert_eq!(state_qos(&d, "q"), Value::Null);
    let metrics = text(&d.req(Method::GET, "/metrics", None).await);
    assert!(
        metrics.contains("glidefs_volume_throttled_total{volume=\"q\"} 0")
            && metrics.contains("glidefs_volume_throttled_seconds_total{volume=\"q\"} 0"),
        "{metrics}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_limits_are_clear_errors_that_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    for (body, code, says) in [
        (json!({"iops": {"rate": 0}}), "invalid_qos", "iops: rate 0"),
        (
            json!({"write_bytes": {"rate": 1000, "burst": 0}}),
            "invalid_qos",
            "write_bytes: burst 0",
        ),
        (
            json!({"read_iops": {"rate": 10, "burst": 36001}}),
            "invalid_qos",
            "1..=36000",
        ),
        (json!({"iops": {"rate": -1}}), "bad_request", "rate"),
        (json!({"iops": 100}), "bad_request", "iops"),
        (json!({"reads": {"rate": 1}}), "bad_request", "reads"),
        (
            json!({"iops": {"rate": 1, "size": 2}}),
            "bad_request",
            "size",
        ),
    ] {
        let r = d
            .req(
                Method::POST,
                "/v1/volumes",
                Some(json!({"name": "bad", "size": "4M", "qos": body.clone()})),
            )
            .await;
        assert_error(&r, 400, code, &format!("create with {body}"));
        assert!(text(&r).contains(says), "{body}: {}", text(&r));
    }
    assert!(d.names().await.is_empty(), "no volume was created");

    let v = d
        .create(json!({"name": "q", "size": "4M", "qos": {"bytes": {"rate": 1 << 20}}}))
        .await;
    assert_eq!(v.qos.unwrap().bytes, limit(1 << 20, (1 << 20) / 10));
    let r = put_qos(&d, "q", json!({"bytes": {"rate": 0}})).await;
    assert_error(&r, 400, "invalid_qos", "a zero rate");
    assert_eq!(
        d.client.qos("q").await.unwrap().bytes,
        v.qos.unwrap().bytes,
        "unchanged"
    );
    let r = put_qos(&d, "nope", json!({})).await;
    assert_error(&r, 404, "not_found", "an unknown volume");
    let r = put_qos(&d, "..", json!({})).await;
    assert_error(&r, 400, "invalid_name", "a bad name");
    let r = d.req(Method::GET, "/v1/volumes/nope/qos", None).await;
    assert_error(&r, 404, "not_found", "GET of an unknown volume");
    d.stop().await;
}
