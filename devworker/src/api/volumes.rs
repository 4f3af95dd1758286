//! Node-local volumes: provision (200 `{node_path}`) and delete (204).

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{ApiError, json_body, ok_json};
use crate::state::AppState;

#[derive(Deserialize)]
pub(crate) struct ProvisionVolumeRequest {
    id: String,
    #[serde(default)]
    #[allow(dead_code)]
    size_gb: Option<u64>,
    #[serde(default)]
    backend: Option<String>,
}

#[derive(Serialize)]
struct VolumeReply {
    node_path: String,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub(crate) async fn create(State(st): State<AppState>, req: Request) -> Response {
    let body: ProvisionVolumeRequest = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !valid_id(&body.id) {
        return ApiError::bad_request(format!("invalid volume id: {:?}", body.id)).into_response();
    }
    if let Some(b) = body.backend.as_deref()
        && b != "local"
    {
        return ApiError::bad_request(format!(
            "unsupported node volume backend: {b:?} (pd volumes are driven from the control plane)"
        ))
        .into_response();
    }
    let path = st.volumes_dir().join(&body.id);
    if let Err(e) = std::fs::create_dir_all(&path) {
        return ApiError::internal(format!("failed to create volume: {e}")).into_response();
    }
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777));
    }
    ok_json(&VolumeReply {
        node_path: path.to_string_lossy().into_owned(),
    })
}

pub(crate) async fn delete_one(
    State(st): State<AppState>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    if !valid_id(&id) {
        return ApiError::bad_request(format!("invalid volume id: {id:?}")).into_response();
    }
    let _ = std::fs::remove_dir_all(st.volumes_dir().join(&id));
    StatusCode::NO_CONTENT.into_response()
}
