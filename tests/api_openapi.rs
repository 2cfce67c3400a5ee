//! `glidefs/openapi.yaml` against the server (the harness is `api_support`):
//!
//! - the (method, path) pairs of the description are exactly the router's table
//!   `glidefs::daemon::api::ROUTES` (generated with the router, so it is what is served), both
//!   ways, and every `{param}` of a path is declared as a path parameter;
//! - every error code the description places under a status has that status in the server
//!   (`ApiError::new`), and every code of `ErrorCode` is placed under some status;
//! - a real daemon is driven through a short sequence (volumes, flush, compact, resize, QoS,
//!   warm sets, snapshots, a snapshot attachment, health, readiness, metrics, the TCP
//!   listener's 401 and 403, and request errors): each status it answers must be documented
//!   for that operation, the content type must be the documented one, and each JSON body must
//!   validate against the documented schema (JSON Schema 2020-12, `jsonschema`). The valid
//!   request bodies sent are validated against the request schemas too.
//!
//! Schemas are validated strictly: every object schema of `components.schemas` gets
//! `unevaluatedProperties: false` here, so a field the server sends and the description does
//! not list fails the test (the description itself stays open: documents only gain fields).

mod api_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use glidefs::client::RawResponse;
use glidefs::daemon::api::{ApiError, ROUTES};
use glidefs::ublk::export::NoDevices;
use hyper::Method;
use serde_json::{json, Value};

use api_support::daemon::{assemble, config, file_store, start_with, text, TOKEN};
use api_support::http::{http_request, raw_http, unix_http};

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The description, as JSON.
fn spec() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        v["openapi"].as_str().is_some_and(|s| s.starts_with("3.1")),
        "{path}: not OpenAPI 3.1"
    );
    v
}

/// Follows a local `$ref` (`#/components/...`) of a non-schema object.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("non-local $ref {r}"));
            let target = doc
                .pointer(pointer)
                .unwrap_or_else(|| panic!("dangling $ref {r}"));
            resolve(doc, target)
        }
        None => v,
    }
}

/// Every operation: (METHOD, path template) -> operation object.
fn operations(doc: &Value) -> BTreeMap<(String, String), &Value> {
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (key, op) in item.as_object().expect("path item") {
            if METHODS.contains(&key.as_str()) {
                out.insert((key.to_uppercase(), path.clone()), op);
            }
        }
    }
    out
}

/// The parameters of an operation, path-level ones included, resolved.
fn parameters<'a>(doc: &'a Value, path: &str, op: &'a Value) -> Vec<&'a Value> {
    let item = &doc["paths"][path];
    [&item["parameters"], &op["parameters"]]
        .into_iter()
        .filter_map(Value::as_array)
        .flatten()
        .map(|p| resolve(doc, p))
        .collect()
}

#[test]
fn paths_and_methods_are_the_routers() {
    let doc = spec();
    let described: BTreeSet<(String, String)> = operations(&doc).into_keys().collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let undocumented: Vec<_> = served.difference(&described).collect();
    let not_served: Vec<_> = described.difference(&served).collect();
    assert!(
        undocumented.is_empty() && not_served.is_empty(),
        "served but not in openapi.yaml: {undocumented:?}; in openapi.yaml but not served: {not_served:?}"
    );
    // Every `{param}` of a path is a declared path parameter, and nothing else is.
    for ((method, path), op) in operations(&doc) {
        let in_path: BTreeSet<&str> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        let declared: BTreeSet<&str> = parameters(&doc, &path, op)
            .into_iter()
            .filter(|p| p["in"] == "path")
            .map(|p| {
                assert_eq!(p["required"], true, "{method} {path}: {p}");
                p["name"].as_str().expect("parameter name")
            })
            .collect();
        assert_eq!(in_path, declared, "{method} {path}: path parameters");
        assert!(
            op["responses"].as_object().is_some_and(|r| !r.is_empty()),
            "{method} {path}: no responses"
        );
    }
}

/// The error codes a response (resolved) allows: the `enum` it puts on `error.code`.
fn codes_of(response: &Value) -> Option<Vec<String>> {
    let schema = &response["content"]["application/json"]["schema"];
    let codes = schema["properties"]["error"]["properties"]["code"]["enum"].as_array()?;
    Some(
        codes
            .iter()
            .map(|c| c.as_str().expect("a code").to_string())
            .collect(),
    )
}

/// The server's status of `code` (unknown codes are 500 there).
fn status_of(code: &str) -> u16 {
    let code: &'static str = Box::leak(code.to_string().into_boxed_str());
    ApiError::new(code, "").status.as_u16()
}

#[test]
fn error_codes_have_the_servers_statuses() {
    let doc = spec();
    let all: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode enum")
        .iter()
        .map(|c| c.as_str().expect("a code").to_string())
        .collect();
    let mut placed = BTreeSet::new();
    // The reusable error responses, and every one an operation uses under its status.
    for (name, response) in doc["components"]["responses"]
        .as_object()
        .expect("responses")
    {
        let codes = codes_of(response).unwrap_or_else(|| panic!("{name}: no code enum"));
        let statuses: BTreeSet<u16> = codes.iter().map(|c| status_of(c)).collect();
        assert_eq!(
            statuses.len(),
            1,
            "{name}: codes of several statuses: {codes:?}"
        );
        for c in codes {
            assert!(all.contains(&c), "{name}: `{c}` is not in ErrorCode");
            placed.insert(c);
        }
    }
    for ((method, path), op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().expect("responses") {
            let status: u16 = status.parse().expect("a numeric status");
            let response = resolve(&doc, response);
            if status < 400 {
                continue;
            }
            let codes = match codes_of(response) {
                Some(codes) => codes,
                // `/readyz`'s 503 document: `not_ready` only.
                None => vec![response["content"]["application/json"]["schema"]["$ref"]
                    .as_str()
                    .filter(|r| r.ends_with("/NotReady"))
                    .map(|_| "not_ready".to_string())
                    .unwrap_or_else(|| panic!("{method} {path} {status}: no error codes"))],
            };
            for c in codes {
                assert_eq!(
                    status_of(&c),
                    status,
                    "{method} {path}: `{c}` is documented under {status}"
                );
            }
        }
    }
    let unplaced: Vec<_> = all.difference(&placed).collect();
    assert!(unplaced.is_empty(), "codes under no status: {unplaced:?}");
    for c in &all {
        assert!(
            status_of(c) != 500 || c == "internal" || c == "device_failed",
            "`{c}` is not a code of the server (it would be 500)"
        );
    }
}

/// Adds `unevaluatedProperties: false` to every object schema with `properties` that does not
/// say what else it allows.
fn make_strict(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.contains_key("properties")
                && !m.contains_key("additionalProperties")
                && !m.contains_key("unevaluatedProperties")
            {
                m.insert("unevaluatedProperties".into(), Value::Bool(false));
            }
            m.values_mut().for_each(make_strict);
        }
        Value::Array(a) => a.iter_mut().for_each(make_strict),
        _ => {}
    }
}

/// `#/components/schemas/X` -> `#/$defs/X` in every `$ref`.
fn to_defs(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                if let Some(name) = r.strip_prefix("#/components/schemas/") {
                    *r = format!("#/$defs/{name}");
                }
            }
            m.values_mut().for_each(to_defs);
        }
        Value::Array(a) => a.iter_mut().for_each(to_defs),
        _ => {}
    }
}

/// The description, with the schema validators it needs.
struct Checker {
    doc: Value,
    /// `components.schemas`, strict, as `$defs`.
    defs: Value,
    /// Answers checked, by (METHOD, path template, status).
    seen: BTreeMap<(String, String, u16), usize>,
}

impl Checker {
    fn new() -> Self {
        let doc = spec();
        let mut defs = doc["components"]["schemas"].clone();
        make_strict(&mut defs);
        to_defs(&mut defs);
        Self {
            doc,
            defs,
            seen: BTreeMap::new(),
        }
    }

    /// What is wrong with `instance` under `schema` (a schema object of the description).
    fn errors(&self, schema: &Value, instance: &Value) -> Vec<String> {
        let mut schema = schema.clone();
        to_defs(&mut schema);
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$defs": self.defs,
            "allOf": [schema],
        });
        let validator = jsonschema::draft202012::new(&root)
            .unwrap_or_else(|e| panic!("the schema does not compile: {e}: {root}"));
        validator
            .iter_errors(instance)
            .map(|e| format!("{} at `{}`", e, e.instance_path()))
            .collect()
    }

    /// Validates `instance` against `schema` (a schema object of the description).
    #[track_caller]
    fn validate(&self, schema: &Value, instance: &Value, what: &str) {
        let errors = self.errors(schema, instance);
        assert!(
            errors.is_empty(),
            "{what}: the body does not match openapi.yaml:\n  {}\nbody: {instance}",
            errors.join("\n  ")
        );
    }

    /// The path template that `path` (without its query) matches.
    fn template(&self, path: &str) -> Option<String> {
        let segs: Vec<&str> = path.split('/').collect();
        self.doc["paths"]
            .as_object()?
            .keys()
            .find(|t| {
                let ts: Vec<&str> = t.split('/').collect();
                ts.len() == segs.len()
                    && ts
                        .iter()
                        .zip(&segs)
                        .all(|(t, s)| t == s || (t.starts_with('{') && t.ends_with('}')))
            })
            .cloned()
    }

    /// Validates a request body the test is about to send as valid.
    fn check_request(&self, method: &str, path: &str, body: &Value) {
        let template = self.template(path).expect("a described path");
        let op = &self.doc["paths"][&template][method.to_lowercase()];
        let schema =
            &resolve(&self.doc, &op["requestBody"])["content"]["application/json"]["schema"];
        assert!(
            schema.is_object(),
            "{method} {template}: no request body schema"
        );
        self.validate(schema, body, &format!("request {method} {path} {body}"));
    }

    /// Checks one answer of `method target` against the description.
    #[track_caller]
    fn check(&mut self, method: &str, target: &str, r: &RawResponse) {
        let what = format!("{method} {target} -> {}: {}", r.status, text(r));
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let doc = &self.doc;
        let ctype = r
            .content_type
            .as_deref()
            .map(|c| c.split(';').next().unwrap_or_default().trim().to_string());
        let (key, response) = match self.template(path) {
            None => {
                // No such endpoint: 404 `not_found`, the plain error document.
                assert_eq!(r.status, 404, "{what}");
                let schema = json!({"$ref": "#/components/schemas/ErrorBody"});
                let body = json_body(r, &what);
                assert_eq!(body["error"]["code"], "not_found", "{what}");
                self.validate(&schema, &body, &what);
                *self
                    .seen
                    .entry((method.into(), "(no path)".into(), r.status))
                    .or_default() += 1;
                return;
            }
            Some(template) => {
                let op = &doc["paths"][&template][method.to_lowercase()];
                if op.is_null() {
                    // A described path without this method: 405 `method_not_allowed`.
                    assert_eq!(r.status, 405, "{what}");
                    let response = &doc["components"]["responses"]["MethodNotAllowed"];
                    ((method.to_string(), template, 405), response.clone())
                } else {
                    let declared: BTreeSet<String> = parameters(doc, &template, op)
                        .into_iter()
                        .filter(|p| p["in"] == "query")
                        .filter_map(|p| p["name"].as_str().map(str::to_string))
                        .collect();
                    for pair in query.split('&').filter(|p| !p.is_empty()) {
                        let name = pair.split('=').next().unwrap_or_default();
                        assert!(
                            declared.contains(name) || r.status == 400,
                            "{what}: query parameter `{name}` is not described"
                        );
                    }
                    let status = r.status.to_string();
                    let response = op["responses"].get(&status).unwrap_or_else(|| {
                        panic!("{what}: status {status} is not documented for {method} {template}")
                    });
                    (
                        (method.to_string(), template, r.status),
                        resolve(doc, response).clone(),
                    )
                }
            }
        };
        let content = response["content"].as_object().expect("documented content");
        let ctype = ctype.unwrap_or_else(|| panic!("{what}: no content type"));
        let media = content.get(&ctype).unwrap_or_else(|| {
            panic!(
                "{what}: content type {ctype} is not documented (only {:?})",
                content.keys().collect::<Vec<_>>()
            )
        });
        if ctype == "application/json" {
            let body = json_body(r, &what);
            self.validate(&media["schema"], &body, &what);
        } else {
            let body = std::str::from_utf8(&r.body).unwrap_or_else(|_| panic!("{what}: not UTF-8"));
            assert_eq!(media["schema"]["type"], "string", "{what}");
            assert!(!body.is_empty(), "{what}");
        }
        *self.seen.entry(key).or_default() += 1;
    }
}

/// The validation itself: the strict schemas refuse what the description does not allow.
#[test]
fn the_checker_refuses_what_the_description_does_not_allow() {
    let c = Checker::new();
    let schema = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
    let bad_request =
        &c.doc["components"]["responses"]["BadRequest"]["content"]["application/json"]["schema"];
    let error = |code: &str| json!({"error": {"code": code, "message": "m"}});
    assert!(c.errors(bad_request, &error("invalid_name")).is_empty());
    let refused = [
        (schema("Health"), json!({"status": "ok", "extra": 1})),
        (schema("Health"), json!({"status": "ko"})),
        (bad_request.clone(), error("duplicate")),
        (schema("ErrorBody"), error("no_such_code")),
        (
            schema("ErrorBody"),
            json!({"error": {"code": "internal", "message": "m", "extra": 1}}),
        ),
        (schema("RemoveReport"), json!({"name": "v"})),
        (
            schema("RemoveReport"),
            json!({"name": "v", "purged_objects": -1}),
        ),
        (
            schema("DeviceInfo"),
            json!({"id": null, "path": null, "transport": "other"}),
        ),
        (schema("CreateVolume"), json!({"name": "..", "size": "1G"})),
        (schema("CreateVolume"), json!({"name": "v", "size": "1X"})),
        (
            schema("CreateVolume"),
            json!({"name": "v", "durability": "disk"}),
        ),
        (schema("ResizeVolume"), json!({"size": 1, "more": 2})),
    ];
    for (schema, instance) in refused {
        assert!(
            !c.errors(&schema, &instance).is_empty(),
            "{schema} accepts {instance}"
        );
    }
    let accepted = [
        (
            schema("CreateVolume"),
            json!({"name": "v-1.a_b", "size": "10GiB", "prefix": null}),
        ),
        (
            schema("CreateVolume"),
            json!({"name": "v", "size": 4096, "durability": "store"}),
        ),
        (schema("ResizeVolume"), json!({"size": "20g"})),
        (schema("RecordWarmSet"), json!({"seconds": 30})),
        (schema("RecordWarmSet"), json!({})),
    ];
    for (schema, instance) in accepted {
        let errors = c.errors(&schema, &instance);
        assert!(errors.is_empty(), "{schema} refuses {instance}: {errors:?}");
    }
}

fn json_body(r: &RawResponse, what: &str) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_daemon_answers_as_described() {
    let mut c = Checker::new();
    let dir = tempfile::tempdir().unwrap();
    let mut d = start_with(config(dir.path(), true), Arc::new(NoDevices)).await;

    // Requests on the unix socket through the client (a JSON body gets its content type).
    let mut steps: Vec<(Method, String, Option<Value>, u16)> = vec![
        (Method::GET, "/healthz".into(), None, 200),
        (Method::GET, "/readyz".into(), None, 200),
        (
            Method::POST,
            "/v1/volumes".into(),
            Some(
                json!({"name": "vol-1", "size": "64M", "block_size": "64K", "queues": 2, "durability": "store"}),
            ),
            201,
        ),
        (Method::GET, "/v1/volumes".into(), None, 200),
        (Method::GET, "/v1/volumes/vol-1".into(), None, 200),
        (Method::POST, "/v1/volumes/vol-1/flush".into(), None, 200),
        (Method::POST, "/v1/volumes/vol-1/compact".into(), None, 200),
        (
            Method::POST,
            "/v1/volumes/vol-1/compact?gc=false".into(),
            None,
            200,
        ),
        (
            Method::POST,
            "/v1/volumes/vol-1/resize".into(),
            Some(json!({"size": 128 << 20})),
            200,
        ),
        (
            Method::PUT,
            "/v1/volumes/vol-1/qos".into(),
            Some(json!({"write_bytes": {"rate": 50 << 20}, "iops": {"rate": 1000, "burst": 10}})),
            200,
        ),
        (Method::GET, "/v1/volumes/vol-1/qos".into(), None, 200),
        (Method::GET, "/v1/volumes/vol-1".into(), None, 200),
        (
            Method::PUT,
            "/v1/volumes/vol-1/qos".into(),
            Some(json!({"iops": {"rate": 0}})),
            400,
        ),
        (
            Method::POST,
            "/v1/volumes/vol-1/warmset/record".into(),
            Some(json!({"seconds": 30, "max_blocks": 8})),
            200,
        ),
        (
            Method::POST,
            "/v1/volumes/vol-1/warmset/record".into(),
            Some(json!({})),
            409,
        ),
        (Method::GET, "/v1/volumes/vol-1/warmset".into(), None, 200),
        (
            Method::POST,
            "/v1/volumes/vol-1/warmset/record".into(),
            Some(json!({"seconds": 0})),
            400,
        ),
        (
            Method::DELETE,
            "/v1/volumes/vol-1/warmset".into(),
            None,
            200,
        ),
        (
            Method::POST,
            "/v1/volumes/vol-1/snapshots".into(),
            Some(json!({"name": "s1"})),
            201,
        ),
        (Method::GET, "/v1/volumes/vol-1/snapshots".into(), None, 200),
        (
            Method::GET,
            "/v1/volumes/vol-1/snapshots/s1".into(),
            None,
            200,
        ),
        // A read-only attachment of the snapshot: its volume document has `snapshot`.
        (
            Method::POST,
            "/v1/volumes".into(),
            Some(json!({"name": "vol-1-s1", "from": "vol-1@s1", "read_only": true})),
            201,
        ),
        (Method::GET, "/v1/volumes".into(), None, 200),
        (Method::GET, "/metrics".into(), None, 200),
        // Errors.
        (
            Method::POST,
            "/v1/volumes".into(),
            Some(json!({"name": "bad name!", "size": "1M"})),
            400,
        ),
        (Method::GET, "/v1/volumes/bad!name".into(), None, 400),
        (
            Method::POST,
            "/v1/volumes".into(),
            Some(json!({"name": "x", "size": "1M", "bogus": 1})),
            400,
        ),
        (
            Method::DELETE,
            "/v1/volumes/vol-1?purge=maybe".into(),
            None,
            400,
        ),
        (Method::GET, "/v1/volumes/nope".into(), None, 404),
        (Method::POST, "/v1/volumes/nope/flush".into(), None, 404),
        (
            Method::GET,
            "/v1/volumes/vol-1/snapshots/nope".into(),
            None,
            404,
        ),
        (
            Method::POST,
            "/v1/volumes".into(),
            Some(json!({"name": "vol-1", "size": "64M", "block_size": "64K"})),
            409,
        ),
        (
            Method::POST,
            "/v1/volumes/vol-1/snapshots".into(),
            Some(json!({"name": "s1"})),
            409,
        ),
        (
            Method::DELETE,
            "/v1/volumes/vol-1/snapshots/s1".into(),
            None,
            409,
        ),
        (
            Method::POST,
            "/v1/volumes/vol-1-s1/snapshots".into(),
            Some(json!({"name": "s2"})),
            409,
        ),
        (Method::PUT, "/v1/volumes".into(), None, 405),
        (Method::GET, "/v1/nothing".into(), None, 404),
        // Teardown.
        (Method::DELETE, "/v1/volumes/vol-1-s1".into(), None, 200),
        (
            Method::DELETE,
            "/v1/volumes/vol-1/snapshots/s1".into(),
            None,
            200,
        ),
        (Method::GET, "/v1/volumes/vol-1/snapshots".into(), None, 200),
        (Method::DELETE, "/v1/volumes/vol-1".into(), None, 200),
        (Method::GET, "/v1/volumes/vol-1".into(), None, 404),
    ];
    for (method, path, body, want) in steps.drain(..) {
        if let (Some(b), 200..=299) = (&body, want) {
            c.check_request(method.as_str(), &path, b);
        }
        let r = d.req(method.clone(), &path, body.clone()).await;
        let what = format!("{method} {path} {}", body.unwrap_or(Value::Null));
        assert_eq!(r.status, want, "{what}: {}", text(&r));
        c.check(method.as_str(), &path, &r);
    }

    // Bodies the client cannot send: no content type, over the size limit.
    let socket = d.cfg.api.socket.clone();
    let plain = http_request("POST", "/v1/volumes", &[], br#"{"name":"v"}"#);
    let r = unix_http(&socket, &plain).await.response();
    assert_eq!(r.status, 415, "{}", text(&r));
    c.check("POST", "/v1/volumes", &r);
    let big = vec![b' '; 70 << 10];
    let json_ct = [("content-type", "application/json")];
    let r = unix_http(
        &socket,
        &http_request("POST", "/v1/volumes", &json_ct, &big),
    )
    .await
    .response();
    assert_eq!(r.status, 413, "{}", text(&r));
    c.check("POST", "/v1/volumes", &r);

    // The TCP listener: 401 without the token, 403 for the hand-off with it.
    let addr = d.server().tcp_addr().expect("tcp bound").to_string();
    let bearer = format!("Bearer {TOKEN}");
    type Header<'a> = (&'a str, &'a str);
    let tcp: [(&str, &str, Vec<Header<'_>>, u16); 4] = [
        ("GET", "/v1/volumes", vec![], 401),
        ("POST", "/v1/handoff", vec![], 401),
        (
            "POST",
            "/v1/handoff",
            vec![("authorization", bearer.as_str())],
            403,
        ),
        (
            "GET",
            "/healthz",
            vec![("authorization", bearer.as_str())],
            200,
        ),
    ];
    for (method, path, headers, want) in tcp {
        let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let w = raw_http(stream, &http_request(method, path, &headers, b"")).await;
        let r = w.response();
        assert_eq!(r.status, want, "TCP {method} {path}: {}", text(&r));
        if want == 401 {
            assert_eq!(w.header("www-authenticate"), Some("Bearer"));
        }
        c.check(method, path, &r);
    }

    // The hand-off, on the unix socket: 202 with the pid; the server then hands off.
    let r = d.req(Method::POST, "/v1/handoff", None).await;
    assert_eq!(r.status, 202, "{}", text(&r));
    c.check("POST", "/v1/handoff", &r);
    let server = d.server.take().expect("a server");
    assert_eq!(server.handoff().await, 0, "NoDevices keeps no device");

    // `/readyz` of a daemon that is not ready.
    let dir = tempfile::tempdir().unwrap();
    let mut d = assemble(dir.path(), file_store(dir.path()), Arc::new(NoDevices)).await;
    d.parts().ready.store(false, Ordering::Release);
    let r = d.req(Method::GET, "/readyz", None).await;
    assert_eq!(r.status, 503, "{}", text(&r));
    c.check("GET", "/readyz", &r);
    d.stop().await;

    // Every operation was answered at least once with a success.
    let ok: BTreeSet<(String, String)> = c
        .seen
        .keys()
        .filter(|(_, _, s)| (200..300).contains(s))
        .map(|(m, p, _)| (m.clone(), p.clone()))
        .collect();
    let missed: Vec<_> = operations(&c.doc)
        .into_keys()
        .filter(|k| !ok.contains(k))
        .collect();
    assert!(missed.is_empty(), "no success checked for {missed:?}");
    let total: usize = c.seen.values().sum();
    let summary: Vec<String> = c
        .seen
        .iter()
        .map(|((m, p, s), n)| format!("{m} {p} {s} x{n}"))
        .collect();
    println!(
        "{total} answers match openapi.yaml:\n  {}",
        summary.join("\n  ")
    );
}
