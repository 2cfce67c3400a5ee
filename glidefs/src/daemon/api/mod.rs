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

pub(crate) mod auth;
pub(crate) mod error;
pub(crate) mod extract;
pub(crate) mod listener;
pub(crate) mod metrics;
#[cfg(test)]
mod metrics_tests;
pub(crate) mod secret;
pub(crate) mod snapshots;
pub(crate) mod tls;
pub(crate) mod volumes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::daemon::manager::VolumeManager;
pub use error::ApiError;
use error::ErrorCode;
use metrics::ApiCounters;

/// Shared state of every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    pub manager: Arc<VolumeManager>,
    /// `/readyz` answers 200 only while this is set (volumes restored, not shutting down).
    pub ready: Arc<AtomicBool>,
    pub counters: Arc<ApiCounters>,
    /// Notified by `POST /v1/handoff`: the daemon detaches its devices for a successor and
    /// exits (see `server::run`).
    pub handoff: Arc<tokio::sync::Notify>,
}

/// The routes without listener-specific layers; `local`: the unix socket, where the actions
/// that stop the daemon (hand-off) are accepted.
fn routes(state: AppState, max_body: usize, local: bool) -> Router {
    Router::new()
        .route("/v1/volumes", post(volumes::create).get(volumes::list))
        .route(
            "/v1/volumes/{name}",
            get(volumes::show).delete(volumes::remove),
        )
        .route("/v1/volumes/{name}/flush", post(volumes::flush))
        .route("/v1/volumes/{name}/compact", post(volumes::compact))
        .route("/v1/volumes/{name}/resize", post(volumes::resize))
        .route(
            "/v1/volumes/{name}/snapshots",
            post(snapshots::create).get(snapshots::list),
        )
        .route(
            "/v1/volumes/{name}/snapshots/{snapshot}",
            get(snapshots::show).delete(snapshots::remove),
        )
        .route(
            "/v1/handoff",
            if local {
                post(handoff)
            } else {
                post(local_only)
            },
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(prometheus))
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
