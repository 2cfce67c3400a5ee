//! Handlers of `/v1/volumes/{name}/snapshots`: thin translations to the manager's snapshot
//! calls (`manager/snapshots.rs`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use crate::api::error::ApiError;
use crate::api::extract::{ApiJson, ApiPath, ApiQuery};
use crate::api::state::AppState;
use crate::api::volumes::check_name;
use glidefs_model::api::{CreateSnapshot, SnapshotDoc, SnapshotList};

/// `POST /v1/volumes/{name}/snapshots` -> 201 with the snapshot (after a flush).
pub(crate) async fn create(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<CreateSnapshot>,
) -> Result<(StatusCode, Json<SnapshotDoc>), ApiError> {
    check_name(&name)?;
    let doc = st.manager.snapshot_create(&name, &req.name).await?;
    Ok((StatusCode::CREATED, Json(doc)))
}

/// `GET /v1/volumes/{name}/snapshots`.
pub(crate) async fn list(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<SnapshotList>, ApiError> {
    check_name(&name)?;
    Ok(Json(SnapshotList {
        snapshots: st.manager.snapshot_list(&name).await?,
    }))
}

/// `GET /v1/volumes/{name}/snapshots/{snapshot}`.
pub(crate) async fn show(
    State(st): State<AppState>,
    ApiPath((name, snapshot)): ApiPath<(String, String)>,
) -> Result<Json<SnapshotDoc>, ApiError> {
    check_name(&name)?;
    Ok(Json(st.manager.snapshot_show(&name, &snapshot).await?))
}

/// Query of `DELETE /v1/volumes/{name}/snapshots/{snapshot}`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemoveQuery {
    /// An operator's remedy for a dead host: drop the view registrations this holder (an
    /// owner id, `<host>/<uuid>`) left under the snapshot before deleting it.
    #[serde(default)]
    pub clear_views: Option<String>,
}

/// `DELETE /v1/volumes/{name}/snapshots/{snapshot}[?clear_views=HOLDER]`: 200 with the
/// deleted snapshot.
pub(crate) async fn remove(
    State(st): State<AppState>,
    ApiPath((name, snapshot)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<RemoveQuery>,
) -> Result<Json<SnapshotDoc>, ApiError> {
    check_name(&name)?;
    Ok(Json(
        st.manager
            .snapshot_delete(&name, &snapshot, q.clear_views.as_deref())
            .await?,
    ))
}
