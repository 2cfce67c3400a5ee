//! API tests of the daemon around the volumes: the hand-off request, health, readiness and
//! metrics, the TCP listener and its bearer token, the unix socket (in use, stale, replaced by
//! another daemon before the shutdown), one daemon per data directory, readiness and shutdown
//! answers, and the owner id after a power cut (the harness is `api_support`).

mod api_support;

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use glidefs::client::{Client, ClientError, Endpoint};
use glidefs::daemon::server::{Server, ServerError};
use glidefs::model::CreateVolume;
use glidefs::ublk::export::NoDevices;
use hyper::Method;
use serde_json::json;

use api_support::daemon::{
    assemble, assert_error, cache_dirs, config, file_store, start, start_with, text, TOKEN,
};
use api_support::http::{http_request, raw_http};

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

/// Two daemons on one data directory would share its owner id, overwrite each other's
/// `state.json` and delete each other's caches: a second `Server::start` on the data directory
/// of a running one (its own socket, or the same one) is refused at once with the lock error,
/// naming the directory and this process's pid, and touches nothing: the first's socket is
/// the same file and answers, its `state.json`, `owner-id` and caches are as they were, no
/// second socket exists. Once the first stops, the same start succeeds and finds the volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_data_dir_is_refused_and_changes_nothing() {
    use glidefs::daemon::data_dir_lock::LockError;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "v1", "size": "4M", "block_size": "4K"}))
        .await;
    d.volume("v1").write(0, &[5u8; 8192]).await.unwrap();
    d.client.flush("v1").await.unwrap();
    let data = d.cfg.data_dir.clone();
    let inode = |p: &std::path::Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.dev(), m.ino())
    };
    let socket = inode(&d.cfg.api.socket);
    let state = std::fs::read(d.cfg.state_path()).unwrap();
    let owner = std::fs::read(data.join("owner-id")).unwrap();
    let caches = cache_dirs(&d.cfg);

    let mut other_socket = config(dir.path(), false);
    other_socket.api.socket = dir.path().join("run/second.sock");
    for (what, cfg) in [
        ("its own socket", other_socket.clone()),
        ("the same socket", config(dir.path(), false)),
    ] {
        let err = match Server::start(&cfg, Arc::new(NoDevices)).await {
            Err(ServerError::Lock(e @ LockError::Held { pid, .. })) => {
                assert_eq!(pid, Some(std::process::id()), "{what}: the holder's pid");
                e.to_string()
            }
            Err(e) => panic!("{what}: not the lock error: {e}"),
            Ok(s) => {
                s.shutdown().await;
                panic!("{what}: a second daemon started on the data directory of a running one");
            }
        };
        for needle in [
            data.display().to_string(),
            format!("pid {}", std::process::id()),
        ] {
            assert!(err.contains(&needle), "{what}: `{needle}` missing: {err}");
        }
        assert!(
            !other_socket.api.socket.exists(),
            "{what}: no second socket"
        );
        assert_eq!(
            inode(&d.cfg.api.socket),
            socket,
            "{what}: the socket is the first's"
        );
        d.assert_alive(what).await;
        assert_eq!(d.names().await, ["v1"], "{what}");
        assert_eq!(std::fs::read(d.cfg.state_path()).unwrap(), state, "{what}");
        assert_eq!(
            std::fs::read(data.join("owner-id")).unwrap(),
            owner,
            "{what}"
        );
        assert_eq!(cache_dirs(&d.cfg), caches, "{what}");
    }
    let mut buf = vec![0u8; 8192];
    d.volume("v1").read(0, &mut buf).await.unwrap();
    assert_eq!(buf, vec![5u8; 8192], "the first daemon's volume is intact");
    d.stop().await;

    // The lock went with the first daemon: the same start now succeeds, on the same volume.
    let mut next = start_with(other_socket, Arc::new(NoDevices)).await;
    assert_eq!(next.names().await, ["v1"]);
    let mut buf = vec![0u8; 8192];
    next.volume("v1").read(0, &mut buf).await.unwrap();
    assert_eq!(buf, vec![5u8; 8192]);
    next.stop().await;
}

/// A daemon removes the socket at shutdown only if it is still the one it bound: another
/// daemon that bound the path once this one stopped listening keeps its socket (before, the
/// old daemon's last step deleted it and the new one ran with no API).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_a_socket_that_another_daemon_bound_at_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let path = d.cfg.api.socket.clone();
    std::fs::remove_file(&path).unwrap();
    let successor = std::os::unix::net::UnixListener::bind(&path).unwrap();
    d.stop().await;
    assert!(path.exists(), "the successor's socket was removed");
    let _client = std::os::unix::net::UnixStream::connect(&path)
        .expect("the successor's socket still answers");
    let (_conn, _) = successor.accept().unwrap();
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
