//! Bearer-token check of the TCP listener: every request must carry
//! `Authorization: Bearer <token>`; anything else is 401 `unauthorized`. The comparison is
//! constant-time in the token's bytes (only its length can leak).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::api::error::ApiError;

/// The expected token.
#[derive(Clone)]
pub struct Token(pub Arc<String>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

fn authorized(token: &Token, req: &Request) -> bool {
    let Some(value) = req.headers().get(AUTHORIZATION) else {
        return false;
    };
    let Some(given) = value.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    bool::from(given.ct_eq(token.0.as_bytes()))
}

/// Middleware: passes authorized requests on, answers 401 otherwise.
pub async fn require_token(State(token): State<Token>, req: Request, next: Next) -> Response {
    if authorized(&token, &req) {
        next.run(req).await
    } else {
        let mut resp = ApiError::new(
            "unauthorized",
            "missing or wrong bearer token (send `Authorization: Bearer <token>`)",
        )
        .into_response();
        resp.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
        resp
    }
}
