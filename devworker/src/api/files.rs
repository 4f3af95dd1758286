//! Files: upload (`PUT`) and download (`GET`) under the machine's directory.

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::machines::ensure_running;
use super::{ApiError, ok_json};
use crate::state::{AppState, guest_to_host};

#[derive(Serialize)]
struct Uploaded {
    path: String,
    size: usize,
}

#[derive(Serialize)]
struct Entry {
    name: String,
    kind: &'static str,
    size: u64,
}

#[derive(Serialize)]
struct Listing {
    entries: Vec<Entry>,
}

fn guest_path(raw: &str) -> String {
    format!("/{}", raw.trim_start_matches('/'))
}

fn root_of(st: &AppState, name: &str) -> Result<std::path::PathBuf, ApiError> {
    ensure_running(st, name)?;
    st.with_machine(name, |m| m.rootfs())
        .ok_or_else(|| ApiError::machine_not_found(name))
}

pub(crate) async fn upload(
    State(st): State<AppState>,
    UrlPath((name, raw)): UrlPath<(String, String)>,
    body: Bytes,
) -> Response {
    let root = match root_of(&st, &name) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let guest = guest_path(&raw);
    let host = guest_to_host(&root, &guest);
    let res = async {
        if let Some(parent) = host.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        tokio::fs::write(&host, &body).await
    }
    .await;
    match res {
        Ok(()) => ok_json(&Uploaded {
            path: guest,
            size: body.len(),
        }),
        Err(e) => {
            ApiError::internal(format!("failed to write file '{guest}': {e}")).into_response()
        }
    }
}

pub(crate) async fn download(
    State(st): State<AppState>,
    UrlPath((name, raw)): UrlPath<(String, String)>,
) -> Response {
    let root = match root_of(&st, &name) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let guest = guest_path(&raw);
    let host = guest_to_host(&root, &guest);
    if st.config.version.is_later() && host.is_dir() {
        let mut entries = Vec::new();
        if let Ok(mut rd) = tokio::fs::read_dir(&host).await {
            while let Ok(Some(e)) = rd.next_entry().await {
                let Ok(meta) = tokio::fs::symlink_metadata(e.path()).await else {
                    continue;
                };
                let kind = if meta.is_dir() {
                    "dir"
                } else if meta.file_type().is_symlink() {
                    "symlink"
                } else {
                    "file"
                };
                entries.push(Entry {
                    name: e.file_name().to_string_lossy().into_owned(),
                    kind,
                    size: meta.len(),
                });
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        return ok_json(&Listing { entries });
    }
    match tokio::fs::read(&host).await {
        Ok(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("failed to read file '{guest}': {e}")).into_response(),
    }
}
