//! Handlers of `/v1/volumes/{name}/warmset`: record, show and drop a volume's warm set (see
//! `manager::warm`).

use axum::extract::State;
use axum::Json;

use crate::api::error::ApiError;
use crate::api::extract::{ApiJson, ApiPath};
use crate::api::state::AppState;
use crate::api::volumes::check_name;
use glidefs_model::api::{RecordWarmSet, WarmSetInfo};

/// `GET /v1/volumes/{name}/warmset`: the stored set, the recording in progress, and the last
/// recording's and warm's outcome.
pub(crate) async fn show(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<WarmSetInfo>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.warm_set(&name).await?))
}

/// `POST /v1/volumes/{name}/warmset/record` with [`RecordWarmSet`] (`{}`: the defaults):
/// starts recording; answers the state with the recording in it.
pub(crate) async fn record(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<RecordWarmSet>,
) -> Result<Json<WarmSetInfo>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.record_warm_set(&name, &req).await?))
}

/// `DELETE /v1/volumes/{name}/warmset`: ends a recording storing nothing and deletes the
/// stored set; answers the state afterwards.
pub(crate) async fn remove(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<WarmSetInfo>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.drop_warm_set(&name).await?))
}
