//! Extension routes with simple stand-in semantics (worker-api.md §4.5,
//! §5.9): disk resize, artifact warm-up, image list/pull, and fork (1.9.2
//! `/fork`, 1.22.0 `/branches`) as a copy of the source's directory started
//! as a new machine.

use std::path::Path;

use axum::extract::{Path as UrlPath, Request, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::machines::{PortSpecIn, ensure_running, info, reply_for, validate_name};
use super::{ApiError, json_body, ok_json};
use crate::state::{AppState, Machine, Resolved, Stored, lock, unix_secs};

fn hex_sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResizeMachineRequest {
    #[serde(default)]
    storage_gb: Option<u64>,
    #[serde(default)]
    overlay_gb: Option<u64>,
}

/// The real worker's default disk sizes (GiB): its disk files are created
/// at least this large.
const DEFAULT_STORAGE_GB: u64 = 20;
const DEFAULT_OVERLAY_GB: u64 = 10;

pub(crate) async fn resize(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    req: Request,
) -> Response {
    let body: ResizeMachineRequest = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let res = st.with_machine(&name, |m| {
        // The real worker's order and texts (smolvm 1.9.2 resize_machine).
        if m.resolved() == Resolved::Running {
            return Err(ApiError::conflict(format!(
                "machine '{name}' must be stopped before resizing. Current state: Running"
            )));
        }
        if body.storage_gb.unwrap_or(m.storage_gb) < m.storage_gb {
            return Err(ApiError::bad_request(format!(
                "storageGb cannot be smaller than current size ({} GiB)",
                m.storage_gb
            )));
        }
        if body.overlay_gb.unwrap_or(m.overlay_gb) < m.overlay_gb {
            return Err(ApiError::bad_request(format!(
                "overlayGb cannot be smaller than current size ({} GiB)",
                m.overlay_gb
            )));
        }
        if body.storage_gb.is_none() && body.overlay_gb.is_none() {
            return Err(ApiError::bad_request(
                "at least one of storageGb or overlayGb must be specified",
            ));
        }
        // The real disk files start at least at the default size (20 GiB
        // storage, 10 GiB overlay) whatever the record says, and only the
        // file refuses to shrink: growing a `storageGb: 1` machine to 2 is a
        // 500 (worker-api.md §5.9's quirk).
        for (what, new, cur, default) in [
            ("storage", body.storage_gb, m.storage_gb, DEFAULT_STORAGE_GB),
            ("overlay", body.overlay_gb, m.overlay_gb, DEFAULT_OVERLAY_GB),
        ] {
            let file = cur.max(default);
            if let Some(n) = new
                && n > cur
                && n < file
            {
                return Err(ApiError::internal(format!(
                    "failed to expand {what}: storage operation failed: expand disk: new size ({n} GiB) must be larger than current size ({file} GiB). Shrinking is not supported."
                )));
            }
        }
        m.storage_gb = body.storage_gb.unwrap_or(m.storage_gb);
        m.overlay_gb = body.overlay_gb.unwrap_or(m.overlay_gb);
        crate::persist::save(m);
        Ok(())
    });
    match res {
        None => ApiError::machine_not_found(&name).into_response(),
        Some(Err(e)) => e.into_response(),
        Some(Ok(())) => reply_for(&st, &name),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WarmArtifactRequest {
    reference: String,
    #[serde(default)]
    #[allow(dead_code)]
    identity_token: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    blob_peers: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WarmReply {
    digest: String,
    size_bytes: u64,
    already_cached: bool,
}

pub(crate) async fn warm(State(st): State<AppState>, req: Request) -> Response {
    let body: WarmArtifactRequest = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if body.reference.is_empty() {
        return ApiError::bad_request("reference cannot be empty").into_response();
    }
    let digest = hex_sha256(body.reference.as_bytes());
    let marker = st.config.state_dir.join("artifacts").join(&digest);
    let already_cached = marker.exists();
    let _ = std::fs::create_dir_all(st.config.state_dir.join("artifacts"));
    let _ = std::fs::write(&marker, body.reference.as_bytes());
    ok_json(&WarmReply {
        digest: format!("sha256:{digest}"),
        size_bytes: 0,
        already_cached,
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ImageInfo {
    reference: String,
    digest: String,
    size: u64,
    architecture: &'static str,
    os: &'static str,
    layer_count: u32,
}

fn image_info(reference: &str) -> ImageInfo {
    ImageInfo {
        reference: reference.to_owned(),
        digest: format!("sha256:{}", hex_sha256(reference.as_bytes())),
        size: 0,
        architecture: if cfg!(target_arch = "aarch64") {
            "arm64"
        } else {
            "amd64"
        },
        os: "linux",
        layer_count: 1,
    }
}

#[derive(Serialize)]
struct ImageList {
    images: Vec<ImageInfo>,
}

pub(crate) async fn images(State(st): State<AppState>, UrlPath(name): UrlPath<String>) -> Response {
    let Some(list) = st.with_machine(&name, |m| {
        if m.resolved() == Resolved::Running {
            m.images.clone()
        } else {
            Vec::new()
        }
    }) else {
        return ApiError::machine_not_found(&name).into_response();
    };
    ok_json(&ImageList {
        images: list.iter().map(|r| image_info(r)).collect(),
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PullImageRequest {
    image: String,
    #[serde(default)]
    #[allow(dead_code)]
    oci_platform: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    proxy: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    no_proxy: Option<String>,
}

#[derive(Serialize)]
struct PullReply {
    image: ImageInfo,
}

pub(crate) async fn pull(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    req: Request,
) -> Response {
    let body: PullImageRequest = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if st.with_machine(&name, |_| ()).is_none() {
        return ApiError::machine_not_found(&name).into_response();
    }
    if body.image.is_empty() {
        return ApiError::bad_request("image cannot be empty").into_response();
    }
    if let Err(e) = ensure_running(&st, &name) {
        return e.into_response();
    }
    st.with_machine(&name, |m| {
        if !m.images.contains(&body.image) {
            m.images.push(body.image.clone());
        }
    });
    ok_json(&PullReply {
        image: image_info(&body.image),
    })
}

/// Fork (1.9.2) and branch (1.22.0) body: the fields both share; others are
/// accepted and ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ForkRequest {
    name: String,
    #[serde(default)]
    ports: Vec<PortSpecIn>,
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let ft = entry.file_type()?;
        if ft.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// `POST /{src}/fork` (1.9.2: the source must be running and forkable) or
/// `POST /{src}/branches` (1.22.0): the child gets a copy of the source's
/// directory and is started; the reply is its MachineInfo.
pub(crate) async fn fork(
    State(st): State<AppState>,
    UrlPath(src): UrlPath<String>,
    req: Request,
) -> Response {
    let body: ForkRequest = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Err(e) = validate_name(&body.name) {
        return e.into_response();
    }
    let later = st.config.version.is_later();
    let dir = st.machine_dir(&body.name);
    {
        let mut ms = lock(&st.machines);
        let Some(source) = ms.iter().find(|m| m.name == src) else {
            return ApiError::machine_not_found(&src).into_response();
        };
        let forkable = source.resolved() == Resolved::Running && source.forkable;
        if !later && !forkable {
            return ApiError::conflict(format!(
                "machine '{src}' must be running and forkable (start it with ?forkable=true) to fork"
            ))
            .into_response();
        }
        if ms.iter().any(|m| m.name == body.name) {
            return ApiError::conflict(format!("machine '{}' already exists", body.name))
                .into_response();
        }
        if let Err(e) = copy_dir(&source.rootfs(), &dir.join("rootfs")) {
            return ApiError::internal(format!("failed to fork machine: {e}")).into_response();
        }
        let (kill, _) = watch::channel(0);
        let child = Machine {
            name: body.name.clone(),
            cpus: source.cpus,
            memory_mb: source.memory_mb,
            storage_gb: source.storage_gb,
            overlay_gb: source.overlay_gb,
            network: source.network,
            gpu: source.gpu,
            cuda: source.cuda,
            network_backend: source.network_backend.clone(),
            allowed_cidrs: source.allowed_cidrs.clone(),
            allowed_hosts: source.allowed_hosts.clone(),
            ports: body.ports.iter().map(|p| p.to_spec()).collect(),
            mounts: Vec::new(),
            image: source.image.clone(),
            forkable: false,
            created_at: unix_secs(),
            stored: Stored::Created,
            vmm: None,
            dir,
            kill,
            persist: st.config.persistent,
            order: ms.iter().map(|m| m.order + 1).max().unwrap_or(0),
            images: source.images.clone(),
        };
        crate::persist::save(&child);
        ms.push(child);
    }
    if let Err(e) = ensure_running(&st, &body.name) {
        return e.into_response();
    }
    let ms = lock(&st.machines);
    match ms.iter().find(|m| m.name == body.name) {
        Some(m) => ok_json(&info(m, st.config.version)),
        None => ApiError::machine_not_found(&body.name).into_response(),
    }
}
