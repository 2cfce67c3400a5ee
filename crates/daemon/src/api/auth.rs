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

/// `Authorization: Bearer <token>`; the scheme name is case-insensitive (RFC 9110 11.1) and
/// separated from the token by one or more spaces (RFC 6750 2.1).
fn authorized(token: &Token, req: &Request) -> bool {
    let Some(value) = req.headers().get(AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some((scheme, rest)) = value.split_at_checked(6) else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case(b"Bearer") || !rest.starts_with(b" ") {
        return false;
    }
    let given = rest.trim_ascii_start();
    bool::from(given.ct_eq(token.0.as_bytes()))
}

/// Middleware: passes authorized requests on, answers 401 otherwise.
pub(crate) async fn require_token(
    State(token): State<Token>,
    req: Request,
    next: Next,
) -> Response {
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
