//! The HTTP API (axum): routes, error bodies, auth, metrics. Endpoint reference:
//! `glidefs/API.md`.
//!
//! Contract: every response that is not a success is an [`ApiError`] JSON body with a stable
//! code, including unknown routes (404 `not_found`), wrong methods (405
//! `method_not_allowed`), malformed bodies (400 `bad_request`), bodies over the limit (413
//! `payload_too_large`) and, on the TCP listener, a missing or wrong token (401
//! `unauthorized`) and a hand-off (403 `forbidden`: actions that stop the daemon are for the
//! unix socket only). Handlers never unwrap request data. Request bodies are capped at
//! `api.max_body_bytes`. Listeners, TLS, timeouts and connection limits: [`listener`].
//!
//! The routes are listed once, in the `api_routes!` invocation below, which generates both the
//! router's `.route(...)` calls and the public table [`ROUTES`] of `(method, path)`: a route
//! cannot be served without being in the table, nor be in the table without being served.
//! `glidefs/openapi.yaml` (the machine-readable reference) is checked against [`ROUTES`] in
//! both directions by `tests/api_openapi.rs`, which also validates real answers against it;
//! the unit test `routes_tests` here sends each [`ROUTES`] entry through the router and
//! asserts a handler answered (not the 404/405 fallbacks).

pub(crate) mod auth;
pub(crate) mod error;
pub(crate) mod extract;
pub(crate) mod listener;
pub(crate) mod metrics;
#[cfg(test)]
mod metrics_tests;
pub(crate) mod snapshots;
mod state;
pub(crate) mod tls;
pub(crate) mod volumes;
pub(crate) mod warmset;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter};
use axum::{Json, Router};
use serde_json::json;

pub use error::ApiError;
use error::ErrorCode;
use metrics::ApiCounters;
pub use state::AppState;

/// Declares the API's routes once. Both [`ROUTES`] and the function that adds the routes to a
/// router are generated from the one list given, so the table cannot name a route the router
/// lacks nor miss one it serves. `$local` names the `bool` parameter the handlers may use
/// (the unix socket's router: hand-off accepted).
macro_rules! api_routes {
    (
        fn $add:ident($local:ident: bool);
        $($method:ident $path:literal => $handler:expr,)+
    ) => {
        /// Every route the API serves, as `(method, path template)` in axum's syntax
        /// (`{name}`). Generated with the router itself (see `api_routes!`); `HEAD` is also
        /// answered wherever `GET` is, and is not listed.
        /// `glidefs/openapi.yaml` must describe exactly these (`tests/api_openapi.rs`).
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path),)+];

        fn $add(router: Router<AppState>, $local: bool) -> Router<AppState> {
            router$(.route($path, on(MethodFilter::$method, $handler)))+
        }
    };
}

api_routes! {
    fn add_routes(local: bool);
    POST "/v1/volumes" => volumes::create,
    GET "/v1/volumes" => volumes::list,
    GET "/v1/volumes/{name}" => volumes::show,
    DELETE "/v1/volumes/{name}" => volumes::remove,
    POST "/v1/volumes/{name}/flush" => volumes::flush,
    POST "/v1/volumes/{name}/compact" => volumes::compact,
    POST "/v1/volumes/{name}/resize" => volumes::resize,
    GET "/v1/volumes/{name}/qos" => volumes::qos,
    PUT "/v1/volumes/{name}/qos" => volumes::set_qos,
    GET "/v1/volumes/{name}/warmset" => warmset::show,
    DELETE "/v1/volumes/{name}/warmset" => warmset::remove,
    POST "/v1/volumes/{name}/warmset/record" => warmset::record,
    POST "/v1/volumes/{name}/snapshots" => snapshots::create,
    GET "/v1/volumes/{name}/snapshots" => snapshots::list,
    GET "/v1/volumes/{name}/snapshots/{snapshot}" => snapshots::show,
    DELETE "/v1/volumes/{name}/snapshots/{snapshot}" => snapshots::remove,
    POST "/v1/handoff" => move |st: State<AppState>, req: Request| {
        handoff_or_forbidden(local, st, req)
    },
    GET "/healthz" => healthz,
    GET "/readyz" => readyz,
    GET "/metrics" => prometheus,
}

/// The routes without listener-specific layers; `local`: the unix socket, where the actions
/// that stop the daemon (hand-off) are accepted.
fn routes(state: AppState, max_body: usize, local: bool) -> Router {
    add_routes(Router::new(), local)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// The router of the unix socket (no auth, every endpoint) or, with `token`, of the TCP
/// listener (bearer token; hand-off refused with 403 `forbidden`).
pub fn router(state: AppState, max_body: usize, token: Option<auth::Token>) -> Router {
    let counters = state.counters.clone();
    let mut r = routes(state, max_body, token.is_none());
    if let Some(t) = token {
        r = r.layer(middleware::from_fn_with_state(t, auth::require_token));
    }
    r.layer(middleware::from_fn_with_state(counters, count))
}

/// Counts requests and error responses by code.
async fn count(State(c): State<Arc<ApiCounters>>, req: Request, next: Next) -> Response {
    c.requests.fetch_add(1, Ordering::Relaxed);
    let resp = next.run(req).await;
    if let Some(ErrorCode(code)) = resp.extensions().get::<ErrorCode>() {
        c.error(code);
    }
    resp
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        "not_found",
        format!("no such endpoint: {}", req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `POST /v1/handoff`: [`handoff`] on the unix socket (`local`), [`local_only`] elsewhere.
async fn handoff_or_forbidden(local: bool, st: State<AppState>, req: Request) -> Response {
    if local {
        handoff(st).await
    } else {
        local_only(req).await.into_response()
    }
}

/// `POST /v1/handoff`: starts the hand-off and answers at once with this process's pid (the
/// successor waits for it to exit before taking the devices over).
async fn handoff(State(st): State<AppState>) -> Response {
    if !st.ready.load(Ordering::Acquire) {
        return ApiError::new("not_ready", "the daemon is starting or shutting down")
            .into_response();
    }
    st.handoff.notify_one();
    (
        StatusCode::ACCEPTED,
        Json(json!({"status": "handing off", "pid": std::process::id()})),
    )
        .into_response()
}

/// An action that stops the daemon, asked over TCP: 403 `forbidden`. A token holder manages
/// volumes; only a local user of the unix socket may stop the service.
async fn local_only(req: Request) -> ApiError {
    ApiError::new(
        "forbidden",
        format!(
            "{} {} stops the daemon: it is accepted on the unix socket only",
            req.method(),
            req.uri().path()
        ),
    )
}

/// `GET /readyz`: 200 once the volumes are restored and open; 503 `not_ready` while starting,
/// shutting down, or while restored volumes are still `recovering` (the error document then
/// also lists them under `recovering`).
async fn readyz(State(st): State<AppState>) -> Response {
    if !st.ready.load(Ordering::Acquire) {
        return ApiError::new("not_ready", "the daemon is starting or shutting down")
            .into_response();
    }
    let recovering = st.manager.recovering();
    if recovering.is_empty() {
        return Json(json!({"status": "ready"})).into_response();
    }
    let message = format!(
        "{} restored volume(s) not open yet, recovering until the object store answers: {}",
        recovering.len(),
        recovering.join(", ")
    );
    let body = json!({
        "error": {"code": "not_ready", "message": message},
        "recovering": recovering,
    });
    let mut resp = (error::status_of("not_ready"), Json(body)).into_response();
    resp.extensions_mut().insert(ErrorCode("not_ready"));
    resp
}

async fn prometheus(State(st): State<AppState>) -> Response {
    let vols = st.manager.metrics().await;
    let text = metrics::render(&vols, &st.counters);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod routes_tests {
    //! [`ROUTES`] against the router: every entry reaches a handler, every other method on
    //! its paths is 405 `method_not_allowed`, and a path not in it is 404 from the fallback.

    use std::collections::BTreeSet;

    use axum::body::Body;
    use axum::http::Request;
    use tower_service::Service;

    use super::*;
    use crate::manager::{ManagerOptions, VolumeManager};
    use glidefs_ublk::export::NoDevices;

    /// The unix socket's router on an empty manager (in-memory store), not ready, so the
    /// hand-off and `/readyz` answer 503 and nothing is started.
    fn app(dir: &std::path::Path) -> Router {
        let opts = ManagerOptions {
            volumes_dir: dir.join("volumes"),
            state_path: dir.join("state.json"),
            defaults: Default::default(),
            store: Default::default(),
            owner: None,
            reopen: Default::default(),
            space: Default::default(),
            encryption_keys: Default::default(),
        };
        let store = Arc::new(object_store::memory::InMemory::new());
        let state = AppState {
            manager: Arc::new(VolumeManager::new(opts, store, Arc::new(NoDevices))),
            ready: Arc::default(),
            counters: Arc::default(),
            handoff: Arc::default(),
        };
        router(state, 64 << 10, None)
    }

    /// `template` with each `{param}` replaced by `bad!name`: an invalid volume name, so the
    /// handlers answer 400 `invalid_name` without touching the manager.
    fn concrete(template: &str) -> String {
        template
            .split('/')
            .map(|seg| {
                if seg.starts_with('{') {
                    "bad!name"
                } else {
                    seg
                }
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    /// Status and error code (empty for a body that is not an error document).
    async fn send(app: &mut Router, method: &str, path: &str) -> (u16, String, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .expect("request");
        let resp = app.call(req).await.expect("infallible");
        let status = resp.status().as_u16();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let code = doc["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let message = doc["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (status, code, message)
    }

    #[tokio::test]
    async fn every_route_reaches_a_handler_and_no_other_method_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut app = app(dir.path());
        let listed: BTreeSet<(&str, &str)> = ROUTES.iter().copied().collect();
        assert_eq!(listed.len(), ROUTES.len(), "duplicates in ROUTES");
        for &(method, template) in ROUTES {
            let path = concrete(template);
            let (status, code, message) = send(&mut app, method, &path).await;
            assert_ne!(status, 405, "{method} {path}: {code}: {message}");
            assert!(
                !message.starts_with("no such endpoint"),
                "{method} {path}: the fallback answered: {status} {code}: {message}"
            );
        }
        let paths: BTreeSet<&str> = ROUTES.iter().map(|r| r.1).collect();
        for template in paths {
            let path = concrete(template);
            for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
                if listed.contains(&(method, template)) {
                    continue;
                }
                let (status, code, _) = send(&mut app, method, &path).await;
                assert_eq!(
                    (status, code.as_str()),
                    (405, "method_not_allowed"),
                    "{method} {path} is not in ROUTES"
                );
            }
        }
        let (status, code, message) = send(&mut app, "GET", "/v1/nothing").await;
        assert_eq!((status, code.as_str()), (404, "not_found"), "{message}");
        assert!(message.starts_with("no such endpoint"), "{message}");
    }
}
