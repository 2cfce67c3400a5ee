//! One retry layer: an S3 store from `open_store` makes one HTTP request per attempt of the
//! crate's own retry loop (`with_retry`: `1 + max_retries` attempts for a transient error), so
//! a persistent 503 fails after exactly that many requests, and the error reports that count.
//! object_store's client retries (10 more per attempt, in a 3-minute budget) would multiply
//! both the requests and the time. Alone in its binary because it sets process environment
//! variables.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_objstore::{open_store, ErrorKind, ObjStoreError, S3Options, StoreConfig, VolumeStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Answers every HTTP request with `503 Service Unavailable` (reading its body first) and
/// counts them.
async fn always_503() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let _ = serve(socket, &counted).await;
            });
        }
    });
    (format!("http://{addr}"), count)
}

async fn serve(mut socket: TcpStream, count: &AtomicUsize) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        // Headers.
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            let n = socket.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let body_len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < end + body_len {
            let mut chunk = [0u8; 65536];
            let n = socket.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        buf.drain(..end + body_len);
        count.fetch_add(1, Ordering::SeqCst);
        let body = "<Error><Code>ServiceUnavailable</Code><Message>test outage</Message></Error>";
        socket
            .write_all(
                format!(
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_503_fails_after_exactly_the_configured_attempts() {
    let (endpoint, requests) = always_503().await;
    let s3 = |endpoint: String| S3Options {
        endpoint: Some(endpoint),
        settings: [
            ("AWS_ACCESS_KEY_ID", "key"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_REGION", "us-east-1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..S3Options::default()
    };
    let store = open_store("s3://bucket", &s3(endpoint)).unwrap();
    let cfg = StoreConfig {
        max_retries: 3,
        ..fast_cfg()
    };
    let vs = VolumeStore::new(store, "vol", cfg.clone()).unwrap();

    let list = expect_attempts(
        "load_manifest (LIST)",
        Some(&requests),
        4,
        vs.load_manifest(),
    )
    .await;
    assert!(list.to_string().contains("list manifests"), "{list}");
    let pack = pattern_pack(&[1, 2], 1, 0);
    let put = expect_attempts(
        "upload_packs (PUT)",
        Some(&requests),
        4,
        vs.upload_packs(std::slice::from_ref(&pack)),
    )
    .await;
    assert!(put.to_string().contains("put pack"), "{put}");

    // Nothing listening (the store's host is down): transient, the same attempts, no hang.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let down = open_store("s3://bucket", &s3(format!("http://{addr}"))).unwrap();
    let vs = VolumeStore::new(down, "vol", cfg).unwrap();
    let err = expect_attempts("load_manifest (refused)", None, 4, vs.load_manifest()).await;
    assert!(err.to_string().contains("list manifests"), "{err}");
}

/// Runs `call`, which must fail transiently after `attempts` attempts, each one request
/// counted in `requests` (when given).
async fn expect_attempts<T: std::fmt::Debug>(
    what: &str,
    requests: Option<&AtomicUsize>,
    attempts: u32,
    call: impl std::future::Future<Output = Result<T, ObjStoreError>>,
) -> ObjStoreError {
    // A hang guard only: with one retry layer each call takes milliseconds.
    let guard = Duration::from_secs(30);
    let count = || requests.map_or(0, |r| r.load(Ordering::SeqCst));
    let before = count();
    let result = tokio::time::timeout(guard, call).await;
    let sent = count() - before;
    let err = match result {
        Ok(r) => r.expect_err(what),
        Err(_) => panic!(
            "{what}: still retrying after {guard:?}; the server answered {sent} requests so far for {attempts} attempts"
        ),
    };
    assert_eq!(err.kind(), ErrorKind::Transient, "{what}: {err}");
    assert!(
        matches!(err, ObjStoreError::Store { attempts: a, .. } if a == attempts),
        "{what}: {err}"
    );
    if requests.is_some() {
        assert_eq!(
            sent, attempts as usize,
            "{what}: one request per attempt: {err}"
        );
    }
    err
}
