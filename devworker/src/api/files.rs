//! Files: upload (`PUT`) and download (`GET`) under the machine's directory.

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::machines::ensure_running;
use super::{ApiError, ok_json};
use crate::state::AppState;
use crate::util::guest_to_host;

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

/// Reads a regular file of at most `cap` bytes. It is opened without
/// blocking (a FIFO does not hang the read) and checked on the open file
/// itself: a FIFO, socket, device or directory is refused, and so is a
/// file larger than `cap` (also one that grows past it while read), as the
/// real worker refuses a file above its transfer cap: a read failure.
fn read_regular(host: &std::path::Path, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(host)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let too_big = |len: u64| {
        std::io::Error::other(format!(
            "file is {len} bytes, above the transfer limit of {cap} bytes"
        ))
    };
    if meta.len() > cap {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    f.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
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
    let cap = st.config.limits.file_body_max as u64;
    let read = tokio::task::spawn_blocking(move || read_regular(&host, cap)).await;
    let read = read.unwrap_or_else(|_| Err(std::io::Error::other("read task failed")));
    match read {
        Ok(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("failed to read file '{guest}': {e}")).into_response(),
    }
}
