//! API errors: every failure is `{"error":{"code":"...","message":"..."}}` with a stable code
//! (the list and statuses are in `glidefs/API.md`). The response carries the code as an
//! extension ([`ErrorCode`]) so the metrics middleware can count errors by code.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::manager::ManagerError;
use glidefs_model::api::{ErrorBody, ErrorDetail};
use glidefs_model::log::chain;

/// An error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// The error code of a response, for metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrorCode(pub &'static str);

/// The HTTP status of each error code.
pub(crate) fn status_of(code: &str) -> StatusCode {
    match code {
        "invalid_name"
        | "invalid_size"
        | "invalid_block_size"
        | "invalid_durability"
        | "invalid_queues"
        | "invalid_qos"
        | "invalid_prefix"
        | "invalid_warm_set"
        | "invalid_snapshot"
        | "invalid_encryption_key"
        | "bad_request" => StatusCode::BAD_REQUEST,
        "unauthorized" => StatusCode::UNAUTHORIZED,
        "forbidden" => StatusCode::FORBIDDEN,
        "not_found" | "snapshot_not_found" | "volume_not_in_store" => StatusCode::NOT_FOUND,
        "method_not_allowed" => StatusCode::METHOD_NOT_ALLOWED,
        "duplicate"
        | "snapshot_exists"
        | "snapshot_in_use"
        | "snapshot_attached"
        | "device_busy"
        | "read_only"
        | "volume_exists_in_store"
        | "geometry_mismatch"
        | "key_mismatch"
        | "fenced"
        | "owned_elsewhere"
        | "volume_failed"
        | "volume_closing"
        | "warm_set_recording" => StatusCode::CONFLICT,
        "payload_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        "unsupported_media_type" => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_kernel" => StatusCode::NOT_IMPLEMENTED,
        "store_unavailable" | "shutting_down" | "not_ready" | "too_many_open_files" => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    /// An error with `code`'s status.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: status_of(code),
            code,
            message: message.into(),
        }
    }

    /// A body that is not the JSON document the endpoint takes.
    pub fn from_json(rej: JsonRejection) -> Self {
        match rej.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Self::new("payload_too_large", rej.body_text()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                Self::new("unsupported_media_type", rej.body_text())
            }
            _ => Self::new("bad_request", rej.body_text()),
        }
    }

    /// Bad query parameters.
    pub fn from_query(rej: QueryRejection) -> Self {
        Self::new("bad_request", rej.body_text())
    }

    /// A path segment that did not decode. The only path parameter is a volume name, so a
    /// segment that is not UTF-8 (`%FF`) breaks the name rule: `invalid_name`, like any other
    /// bad name in the path.
    pub fn from_path(rej: PathRejection) -> Self {
        use axum::extract::path::ErrorKind;
        match &rej {
            PathRejection::FailedToDeserializePathParams(e)
                if matches!(e.kind(), ErrorKind::InvalidUtf8InPathParam { .. }) =>
            {
                Self::new(
                    "invalid_name",
                    "invalid volume name in the path: not UTF-8; use 1..=128 characters of [A-Za-z0-9._-], not `.` or `..`",
                )
            }
            _ => Self::new("bad_request", rej.body_text()),
        }
    }
}

impl From<ManagerError> for ApiError {
    fn from(e: ManagerError) -> Self {
        if let Some(which) = crate::limits::out_of_fds(&e) {
            tracing::error!(error = %chain(&e), "out of file descriptors");
            let head = crate::limits::out_of_fds_message(which);
            return Self::new("too_many_open_files", format!("{head}: {}", chain(&e)));
        }
        let code = e.code();
        if code == "internal" {
            tracing::error!(error = %chain(&e), "internal error");
        }
        Self::new(code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        let mut resp = (self.status, Json(body)).into_response();
        resp.extensions_mut().insert(ErrorCode(self.code));
        resp
    }
}

#[cfg(test)]
mod tests {
    use glidefs_ublk::export::ExportError;

    use super::*;

    #[test]
    fn a_device_failure_answers_device_failed_with_its_cause() {
        let cause = std::io::Error::from_raw_os_error(libc::ENOMEM);
        let shown = cause.to_string();
        let err = ManagerError::from(ExportError::Failed {
            volume: "v1".into(),
            source: Box::new(cause),
        });
        // The API answers `device_failed` naming the volume, with the cause.
        let api = ApiError::from(err);
        assert_eq!(api.code, "device_failed");
        assert!(api.message.contains("volume `v1`") && api.message.contains(&shown));
    }
}
