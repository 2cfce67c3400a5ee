//! API tests of request validation: every bad field, body, content type, size, path,
//! method and query of `glidefs/API.md` gets its status and stable error code, nothing is
//! half-created, and the daemon answers afterwards (tables of cases, one test per endpoint
//! group; the harness is `api_support`).

mod api_support;

use glidefs::model::{VolumeInfo, VolumeState};
use hyper::Method;
use serde_json::{json, Value};

use api_support::daemon::{assert_error, cache_dirs, start, text, MAX_BODY};
use api_support::http::{http_request, unix_http};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_rejects_every_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "taken", "size": "1G"})).await;

    let long_name = "x".repeat(129);
    let long_prefix = "p".repeat(257);
    // (status, code, bodies). Fields are checked in the order name, prefix, block_size, size,
    // queues, queue_depth; the bodies with several bad fields pin that order.
    let groups: Vec<(u16, &str, Vec<Value>)> = vec![
        (
            400,
            "invalid_name",
            vec![
                json!({"name": "", "size": "1G"}),
                json!({"name": "a/b", "size": "1G"}),
                json!({"name": "..", "size": "1G"}),
                json!({"name": ".", "size": "1G"}),
                json!({"name": "sp ace", "size": "1G"}),
                json!({"name": "tab\t", "size": "1G"}),
                json!({"name": "a:b", "size": "1G"}),
                json!({"name": "star*", "size": "1G"}),
                json!({"name": "caf\u{e9}", "size": "1G"}),
                json!({"name": "nul\u{0}", "size": "1G"}),
                json!({"name": long_name, "size": "1G"}),
                json!({"name": "", "size": 0, "prefix": "..", "block_size": 3}),
            ],
        ),
        (
            400,
            "invalid_prefix",
            vec![
                json!({"name": "a", "size": "1G", "prefix": "../x"}),
                json!({"name": "a", "size": "1G", "prefix": "a//b"}),
                json!({"name": "a", "size": "1G", "prefix": "a/./b"}),
                json!({"name": "a", "size": "1G", "prefix": "a/../b"}),
                json!({"name": "a", "size": "1G", "prefix": ""}),
                json!({"name": "a", "size": "1G", "prefix": "/"}),
                json!({"name": "a", "size": "1G", "prefix": "sp ace"}),
                json!({"name": "a", "size": "1G", "prefix": "a\\b"}),
                json!({"name": "a", "size": "1G", "prefix": "t\u{e9}nant"}),
                json!({"name": "a", "size": "1G", "prefix": long_prefix}),
                json!({"name": "a", "size": 0, "prefix": "..", "block_size": 3}),
            ],
        ),
        (
            400,
            "invalid_block_size",
            vec![
                json!({"name": "a", "size": "1G", "block_size": 1000}),
                json!({"name": "a", "size": "1G", "block_size": 2048}),
                json!({"name": "a", "size": "1G", "block_size": "2K"}),
                json!({"name": "a", "size": "1G", "block_size": "32M"}),
                json!({"name": "a", "size": "1G", "block_size": 1 << 25}),
                json!({"name": "a", "size": "1G", "block_size": "12K"}),
                json!({"name": "a", "size": "1G", "block_size": 0}),
                json!({"name": "a", "size": "1G", "block_size": -4096}),
                json!({"name": "a", "size": "1G", "block_size": 4096.5}),
                json!({"name": "a", "size": "1G", "block_size": "4097"}),
                json!({"name": "a", "size": "1G", "block_size": "big"}),
                json!({"name": "a", "size": "1G", "block_size": true}),
                json!({"name": "a", "size": "1G", "block_size": [4096]}),
                json!({"name": "a", "size": "1G", "block_size": {"k": 4}}),
                json!({"name": "a", "size": 0, "block_size": 3, "queues": 0}),
            ],
        ),
        (
            400,
            "invalid_size",
            vec![
                json!({"name": "a"}),
                json!({"name": "a", "size": null}),
                json!({"name": "a", "size": 0}),
                json!({"name": "a", "size": "0"}),
                json!({"name": "a", "size": "0G"}),
                json!({"name": "a", "size": -4096}),
                json!({"name": "a", "size": "-1G"}),
                json!({"name": "a", "size": 1.5}),
                json!({"name": "a", "size": 4096.0}),
                json!({"name": "a", "size": "1.5G"}),
                json!({"name": "a", "size": "ten gigs"}),
                json!({"name": "a", "size": "10X"}),
                json!({"name": "a", "size": ""}),
                json!({"name": "a", "size": "1000"}),
                json!({"name": "a", "size": 4096}),
                json!({"name": "a", "size": "64K", "block_size": "128K"}),
                json!({"name": "a", "size": "257T"}),
                json!({"name": "a", "size": "999T"}),
                json!({"name": "a", "size": u64::MAX}),
                json!({"name": "a", "size": "18446744073709551615K"}),
                json!({"name": "a", "size": true}),
                json!({"name": "a", "size": [1]}),
                json!({"name": "a", "size": {"G": 1}}),
                json!({"name": "a", "size": 0, "queues": 0}),
                json!({"name": "a", "size": 0, "attach_existing": true}),
            ],
        ),
        (
            400,
            "invalid_queues",
            vec![
                json!({"name": "a", "size": "1G", "queues": 0}),
                json!({"name": "a", "size": "1G", "queues": 65}),
                json!({"name": "a", "size": "1G", "queues": 1000}),
                json!({"name": "a", "size": "1G", "queues": -1}),
                json!({"name": "a", "size": "1G", "queues": 1.5}),
                json!({"name": "a", "size": "1G", "queues": 2.0}),
                json!({"name": "a", "size": "1G", "queues": "2"}),
                json!({"name": "a", "size": "1G", "queues": true}),
                json!({"name": "a", "size": "1G", "queue_depth": 0}),
                json!({"name": "a", "size": "1G", "queue_depth": 4097}),
                json!({"name": "a", "size": "1G", "queue_depth": 65536}),
                json!({"name": "a", "size": "1G", "queue_depth": -1}),
                json!({"name": "a", "size": "1G", "queue_depth": "x"}),
                json!({"name": "a", "size": "1G", "queue_depth": [64]}),
                json!({"name": "a", "size": "1G", "queues": 0, "queue_depth": 0}),
            ],
        ),
        (
            409,
            "duplicate",
            vec![
                json!({"name": "taken", "size": "1G"}),
                json!({"name": "taken", "size": "2G", "block_size": "4K", "queues": 4}),
                json!({"name": "taken", "attach_existing": true}),
                json!({"name": "taken", "size": "1G", "prefix": "elsewhere"}),
            ],
        ),
        (
            400,
            "bad_request",
            vec![
                json!({"name": "a", "size": "1G", "colour": "blue"}),
                json!({"Name": "a", "size": "1G"}),
                json!({"name": "a", "size": "1G", "device": {"id": 3}}),
                json!({"size": "1G"}),
                json!({}),
                json!({"name": 7, "size": "1G"}),
                json!({"name": null, "size": "1G"}),
                json!({"name": ["a"], "size": "1G"}),
                json!({"name": "a", "size": "1G", "read_only": "yes"}),
                json!({"name": "a", "size": "1G", "read_only": 1}),
                json!({"name": "a", "size": "1G", "attach_existing": "true"}),
                json!({"name": "a", "size": "1G", "prefix": 5}),
                json!({"name": "a", "size": "1G", "prefix": ["t"]}),
                json!([1, 2]),
                json!(null),
                json!("vol"),
                json!(42),
            ],
        ),
    ];
    let mut errors = 0;
    for (status, code, bodies) in groups {
        for body in bodies {
            d.expect_error(Method::POST, "/v1/volumes", Some(body), status, code)
                .await;
            errors += 1;
        }
    }
    // Messages name the field at fault: two bad queue fields report `queues` first.
    let r = d
        .req(
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "a", "size": "1G", "queues": 0, "queue_depth": 0})),
        )
        .await;
    assert!(text(&r).contains("queues 0"), "{}", text(&r));
    // Nothing half-created by any of them.
    assert_eq!(d.names().await, ["taken"]);
    assert_eq!(cache_dirs(&d.cfg), ["taken"]);
    let v = d.client.show("taken").await.unwrap();
    assert_eq!((v.state, v.size), (VolumeState::Running, 1 << 30));
    let m = d.metrics().await;
    assert!(
        m.contains("glidefs_api_errors_total{code=\"invalid_name\"} 12"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_api_errors_total{code=\"duplicate\"} 4"),
        "{m}"
    );
    assert!(errors > 90, "{errors} cases");

    // The edges of every rule are accepted.
    let long_ok = "n".repeat(128);
    let prefix_ok = format!("{}/b", "p".repeat(254));
    let accepted: Vec<(Value, Value)> = vec![
        (json!({"name": long_ok, "size": "1M"}), json!({})),
        (json!({"name": "a.b-c_D9", "size": "1M"}), json!({})),
        (json!({"name": "...", "size": "1M"}), json!({})),
        (
            json!({"name": "s1", "size": " 1GiB "}),
            json!({"size": 1 << 30}),
        ),
        (
            json!({"name": "s2", "size": "1gb"}),
            json!({"size": 1 << 30}),
        ),
        (
            json!({"name": "s3", "size": "256K", "block_size": 131072}),
            json!({"size": 256 << 10, "block_size": 128 << 10}),
        ),
        (
            json!({"name": "b4k", "size": 4096, "block_size": "4k"}),
            json!({"size": 4096, "block_size": 4096}),
        ),
        (
            json!({"name": "b16m", "size": "32M", "block_size": "16M"}),
            json!({"block_size": 16 << 20}),
        ),
        (
            json!({"name": "q-max", "size": "1M", "queues": 64, "queue_depth": 4096}),
            json!({"queues": 64, "queue_depth": 4096}),
        ),
        (
            json!({"name": "q-min", "size": "1M", "queues": 1, "queue_depth": 1}),
            json!({"queues": 1, "queue_depth": 1}),
        ),
        (
            json!({"name": "nulls", "size": "1M", "queues": null, "block_size": null, "prefix": null}),
            json!({"queues": 1, "block_size": 128 << 10, "prefix": null}),
        ),
        (
            json!({"name": "pre1", "size": "1M", "prefix": "/t/x/"}),
            json!({"prefix": "t/x"}),
        ),
        (
            json!({"name": "pre2", "size": "1M", "prefix": prefix_ok.clone()}),
            json!({"prefix": prefix_ok}),
        ),
    ];
    for (body, expect) in accepted {
        let v = serde_json::to_value(d.create(body.clone()).await).unwrap();
        for (k, want) in expect.as_object().unwrap() {
            assert_eq!(&v[k], want, "{body}: {k} in {v}");
        }
        let name = v["name"].as_str().unwrap();
        let r = d.client.remove(name, false, true).await.unwrap();
        assert_eq!(r.name, name);
    }
    assert_eq!(d.names().await, ["taken"]);
    d.stop().await;
}

/// A raw create request and the error it gets: what, headers, body, status, code.
type BodyCase<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<u8>, u16, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_rejects_bad_bodies_content_types_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let sock = d.cfg.api.socket.clone();
    let json_ct = ("content-type", "application/json");
    let good = br#"{"name": "a", "size": "1G"}"#.to_vec();
    let padded = |len: usize| {
        let mut b = br#"{"name": "big", "size": "1M"}"#.to_vec();
        b.resize(len, b' ');
        b
    };
    // (what, headers, body, status, code)
    let cases: Vec<BodyCase<'_>> = vec![
        (
            "no content type",
            vec![],
            good.clone(),
            415,
            "unsupported_media_type",
        ),
        (
            "no content type, no body",
            vec![],
            vec![],
            415,
            "unsupported_media_type",
        ),
        (
            "text/plain",
            vec![("content-type", "text/plain")],
            good.clone(),
            415,
            "unsupported_media_type",
        ),
        (
            "form",
            vec![("content-type", "application/x-www-form-urlencoded")],
            b"name=a&size=1G".to_vec(),
            415,
            "unsupported_media_type",
        ),
        (
            "multipart",
            vec![("content-type", "multipart/form-data; boundary=x")],
            good.clone(),
            415,
            "unsupported_media_type",
        ),
        (
            "jsonx",
            vec![("content-type", "application/jsonx")],
            good.clone(),
            415,
            "unsupported_media_type",
        ),
        ("empty JSON body", vec![json_ct], vec![], 400, "bad_request"),
        (
            "truncated",
            vec![json_ct],
            b"{\"name\": ".to_vec(),
            400,
            "bad_request",
        ),
        (
            "not UTF-8",
            vec![json_ct],
            b"\xff\xfe".to_vec(),
            400,
            "bad_request",
        ),
        (
            "trailing garbage",
            vec![json_ct],
            br#"{"name": "a", "size": "1G"} x"#.to_vec(),
            400,
            "bad_request",
        ),
        (
            "duplicate key",
            vec![json_ct],
            br#"{"name": "a", "name": "b", "size": "1G"}"#.to_vec(),
            400,
            "bad_request",
        ),
        (
            "single quotes",
            vec![json_ct],
            b"{'name': 'a', 'size': '1G'}".to_vec(),
            400,
            "bad_request",
        ),
        (
            "huge number",
            vec![json_ct],
            b"1e400".to_vec(),
            400,
            "bad_request",
        ),
        (
            "huge number in a field",
            vec![json_ct],
            br#"{"name": "a", "size": "1G", "queues": 1e400}"#.to_vec(),
            400,
            "bad_request",
        ),
        (
            "deep nesting",
            vec![json_ct],
            vec![b'['; 10_000],
            400,
            "bad_request",
        ),
        (
            "u64 overflow",
            vec![json_ct],
            br#"{"name": "a", "size": 18446744073709551616}"#.to_vec(),
            400,
            "invalid_size",
        ),
        (
            "one byte over the limit",
            vec![json_ct],
            padded(MAX_BODY + 1),
            413,
            "payload_too_large",
        ),
        (
            "1 MiB",
            vec![json_ct],
            padded(1 << 20),
            413,
            "payload_too_large",
        ),
    ];
    for (what, headers, body, status, code) in cases {
        let w = unix_http(&sock, &http_request("POST", "/v1/volumes", &headers, &body)).await;
        assert_error(&w.response(), status, code, what);
        d.assert_alive(what).await;
    }
    // Over the limit without a content-length (chunked): still 413.
    let mut chunked = http_request(
        "POST",
        "/v1/volumes",
        &[json_ct, ("transfer-encoding", "chunked")],
        b"",
    );
    // http_request adds content-length: 0 for a POST; drop it, the body is chunked.
    let head = String::from_utf8(chunked)
        .unwrap()
        .replace("content-length: 0\r\n", "");
    chunked = head.into_bytes();
    for _ in 0..20 {
        chunked.extend_from_slice(b"1000\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 4096));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let w = unix_http(&sock, &chunked).await;
    assert_error(&w.response(), 413, "payload_too_large", "80K chunked");
    d.assert_alive("chunked").await;

    assert!(d.names().await.is_empty());
    assert!(cache_dirs(&d.cfg).is_empty());
    let m = d.metrics().await;
    assert!(
        m.contains("glidefs_api_errors_total{code=\"payload_too_large\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_api_errors_total{code=\"unsupported_media_type\"} 6"),
        "{m}"
    );

    // Accepted: exactly the limit, a charset parameter, a +json media type.
    for (name, ct, body) in [
        ("big", "application/json", padded(MAX_BODY)),
        (
            "cs",
            "application/json; charset=utf-8",
            br#"{"name": "cs", "size": "1M"}"#.to_vec(),
        ),
        (
            "plus",
            "application/vnd.glidefs+json",
            br#"{"name": "plus", "size": "1M"}"#.to_vec(),
        ),
    ] {
        let w = unix_http(
            &sock,
            &http_request("POST", "/v1/volumes", &[("content-type", ct)], &body),
        )
        .await;
        assert_eq!(w.status, 201, "{ct}: {}", String::from_utf8_lossy(&w.body));
        let v: VolumeInfo = serde_json::from_slice(&w.body).unwrap();
        assert_eq!(v.name, name);
    }
    assert_eq!(d.names().await, ["big", "cs", "plus"]);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_paths_reject_unknown_volumes_bad_names_and_bad_queries() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "taken", "size": "1G"})).await;
    let long = format!("/v1/volumes/{}", "x".repeat(129));
    let long_flush = format!("{long}/flush");
    let mut cases: Vec<(Method, String, u16, &str)> = Vec::new();
    // Every endpoint that takes a name, with every kind of bad or unknown name.
    for (name, status, code) in [
        ("nope", 404, "not_found"),
        ("Taken", 404, "not_found"),
        ("taken.", 404, "not_found"),
        ("bad%20name", 400, "invalid_name"),
        ("%2E%2E", 400, "invalid_name"),
        ("%2E", 400, "invalid_name"),
        (".", 400, "invalid_name"),
        ("a%2Fb", 400, "invalid_name"),
        ("a%3Ab", 400, "invalid_name"),
        ("caf%C3%A9", 400, "invalid_name"),
        ("%FF", 400, "invalid_name"),
        ("%00", 400, "invalid_name"),
    ] {
        cases.push((Method::GET, format!("/v1/volumes/{name}"), status, code));
        cases.push((
            Method::POST,
            format!("/v1/volumes/{name}/flush"),
            status,
            code,
        ));
        cases.push((Method::DELETE, format!("/v1/volumes/{name}"), status, code));
        cases.push((
            Method::DELETE,
            format!("/v1/volumes/{name}?purge=true&force=true"),
            status,
            code,
        ));
    }
    for (m, p) in [
        (Method::GET, long.clone()),
        (Method::POST, long_flush),
        (Method::DELETE, long),
        (Method::POST, "/v1/volumes//flush".to_string()),
    ] {
        cases.push((m, p, 400, "invalid_name"));
    }
    // Bad query parameters of DELETE, on a volume that exists and on one that does not.
    for name in ["taken", "nope"] {
        for q in [
            "purge=maybe",
            "purge=1",
            "purge=",
            "force=yes",
            "force=TRUE",
            "purgee=true",
            "dry_run=true",
            "purge=true&purge=false",
        ] {
            cases.push((
                Method::DELETE,
                format!("/v1/volumes/{name}?{q}"),
                400,
                "bad_request",
            ));
        }
    }
    for (m, p, status, code) in cases {
        d.expect_error(m, &p, None, status, code).await;
    }
    // The volume survived every bad remove; unknown query parameters of GET are ignored.
    assert_eq!(d.names().await, ["taken"]);
    let r = d.req(Method::GET, "/v1/volumes/taken?x=1", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = d
        .req(Method::POST, "/v1/volumes/taken/flush?x=1", None)
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    d.create(json!({"name": "taken", "size": "1G"})).await;
    let mut cases: Vec<(Method, &str, u16, &str)> = Vec::new();
    for p in [
        "/",
        "/v1",
        "/v2/volumes",
        "/V1/volumes",
        "/v1/volumes/",
        "/v1/volumes/taken/",
        "/v1/volumes/taken/flush/",
        "/v1/volumes/taken/flush/now",
        "/v1/volumes/taken/snapshots/s/x",
        "/v1/volumes/a/b/c",
        "/healthz/",
        "/health",
        "/metrics/x",
        "/v1/metrics",
        "/%FF",
    ] {
        cases.push((Method::GET, p, 404, "not_found"));
        cases.push((Method::POST, p, 404, "not_found"));
    }
    for (m, p) in [
        (Method::PUT, "/v1/volumes"),
        (Method::PATCH, "/v1/volumes"),
        (Method::DELETE, "/v1/volumes"),
        (Method::OPTIONS, "/v1/volumes"),
        (Method::POST, "/v1/volumes/taken"),
        (Method::PUT, "/v1/volumes/taken"),
        (Method::PATCH, "/v1/volumes/taken"),
        (Method::PATCH, "/v1/volumes/bad%20name"),
        (Method::GET, "/v1/volumes/taken/flush"),
        (Method::PUT, "/v1/volumes/taken/flush"),
        (Method::DELETE, "/v1/volumes/taken/flush"),
        (Method::POST, "/healthz"),
        (Method::DELETE, "/healthz"),
        (Method::POST, "/readyz"),
        (Method::PUT, "/readyz"),
        (Method::POST, "/metrics"),
        (Method::DELETE, "/metrics"),
    ] {
        cases.push((m, p, 405, "method_not_allowed"));
    }
    for (m, p, status, code) in cases {
        d.expect_error(m, p, None, status, code).await;
    }
    // Wrong methods with a body are refused before the body is read.
    let r = d
        .req(
            Method::PUT,
            "/v1/volumes",
            Some(json!({"name": "x", "size": "1G"})),
        )
        .await;
    assert_error(&r, 405, "method_not_allowed", "PUT with a body");
    // HEAD is GET without the body.
    let r = d.req(Method::HEAD, "/v1/volumes", None).await;
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(d.names().await, ["taken"]);
    let m = d.metrics().await;
    assert!(
        m.contains("glidefs_api_errors_total{code=\"method_not_allowed\"} 18"),
        "{m}"
    );
    assert!(
        m.contains("glidefs_api_errors_total{code=\"not_found\"} 30"),
        "{m}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bodies_never_take_the_server_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path()).await;
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{}".to_vec(),
        b"{\"name\":\"a\",\"size\":18446744073709551616}".to_vec(),
        b"{\"name\":\"a\",\"size\":\"18446744073709551615K\"}".to_vec(),
        b"{\"name\":\"a\",\"size\":\"1G\",\"queues\":1e400}".to_vec(),
        b"{\"name\":\"\\u0000\",\"size\":\"1G\"}".to_vec(),
        vec![b'['; 10_000],
        (0..=255u8).collect(),
    ];
    for b in bodies {
        let r = d
            .client
            .raw(Method::POST, "/v1/volumes", &[], Some(b.clone()))
            .await
            .unwrap();
        assert!(
            (400..500).contains(&r.status),
            "{:?} -> {} {}",
            String::from_utf8_lossy(&b),
            r.status,
            text(&r)
        );
        let v: Value = serde_json::from_slice(&r.body).expect("JSON error body");
        assert!(v["error"]["code"].is_string());
    }
    assert_eq!(d.req(Method::GET, "/healthz", None).await.status, 200);
    d.stop().await;
}
