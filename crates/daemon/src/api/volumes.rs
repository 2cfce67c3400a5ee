//! Handlers of `/v1/volumes`: thin translations between HTTP and the [`VolumeManager`].

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use crate::api::error::ApiError;
use crate::api::extract::{ApiJson, ApiPath, ApiQuery};
use crate::api::state::AppState;
use crate::manager::spec::valid_name;
use glidefs_model::api::{
    CompactResult, CreateVolume, FlushReport, QosLimits, RemoveReport, ResizeReport, ResizeVolume,
    VolumeInfo, VolumeList,
};

/// A `{name}` path segment that is not a valid volume name is `invalid_name`.
pub(crate) fn check_name(name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::new(
            "invalid_name",
            format!(
                "invalid volume name `{}`: use 1..=128 characters of [A-Za-z0-9._-], not `.` or `..`",
                name.escape_debug()
            ),
        ))
    }
}

/// `POST /v1/volumes` -> 201 with the new volume.
pub(crate) async fn create(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<CreateVolume>,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    let info = st.manager.create(&req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// `GET /v1/volumes`.
pub(crate) async fn list(State(st): State<AppState>) -> Json<VolumeList> {
    Json(VolumeList {
        volumes: st.manager.list().await,
    })
}

/// `GET /v1/volumes/{name}`.
pub(crate) async fn show(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<VolumeInfo>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.inspect(&name).await?))
}

/// `POST /v1/volumes/{name}/flush`: returns once the store has everything written before.
pub(crate) async fn flush(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<FlushReport>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.flush(&name).await?))
}

/// Query of `POST /v1/volumes/{name}/compact`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompactQuery {
    /// Run a GC pass after the compaction pass (default true).
    #[serde(default = "yes")]
    pub gc: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/volumes/{name}/compact?gc=true|false`: one compaction pass (and a GC pass).
pub(crate) async fn compact(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<CompactQuery>,
) -> Result<Json<CompactResult>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.compact(&name, q.gc).await?))
}

/// Query of `DELETE /v1/volumes/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemoveQuery {
    /// Also delete the volume's objects in the store.
    #[serde(default)]
    pub purge: bool,
    /// Drop local data that is not in the store instead of flushing it first.
    #[serde(default)]
    pub force: bool,
}

/// `DELETE /v1/volumes/{name}?purge=true|false&force=true|false`.
pub(crate) async fn remove(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<RemoveQuery>,
) -> Result<Json<RemoveReport>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.remove(&name, q.purge, q.force).await?))
}

/// `POST /v1/volumes/{name}/resize` with `{"size": ...}`: grows the volume, its `state.json`
/// entry and its block device (see `manager::grow`).
pub(crate) async fn resize(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<ResizeVolume>,
) -> Result<Json<ResizeReport>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.resize(&name, &req.size).await?))
}

/// `GET /v1/volumes/{name}/qos`: the volume's QoS limits (`{}`: none).
pub(crate) async fn qos(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<QosLimits>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.qos(&name)?))
}

/// `PUT /v1/volumes/{name}/qos` with the limits: replaces them all, live (see
/// `manager::qos`); answers the limits in force, bursts filled in.
pub(crate) async fn set_qos(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<QosLimits>,
) -> Result<Json<QosLimits>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.set_qos(&name, &req).await?))
}
