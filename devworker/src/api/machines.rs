//! Machines: create, list, get, start, stop, delete, and the implicit start.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{ApiError, active_faults, json_body, ok_json};
use crate::config::Version;
use crate::faults::{Fault, MismatchField};
use crate::state::{
    AppState, Machine, MountInfo, PortSpec, Resolved, Shared, Stored, Vmm, lock, unix_micros,
    unix_secs,
};

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum NetworkBackend {
    Tsi,
    VirtioNet,
}

/// A port in a fork/branch request.
#[derive(Deserialize)]
pub(crate) struct PortSpecIn {
    host: u16,
    guest: u16,
}

impl PortSpecIn {
    pub(crate) fn to_spec(&self) -> PortSpec {
        PortSpec {
            host: self.host,
            guest: self.guest,
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct MountSpec {
    source: String,
    target: String,
    #[serde(default)]
    readonly: bool,
}

#[derive(Deserialize)]
pub(crate) struct EnvVar {
    pub(crate) name: String,
    pub(crate) value: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RestartSpec {
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    max_retries: Option<u32>,
}

/// `POST /api/v1/machines` body; unknown fields are ignored.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct CreateRequest {
    name: Option<String>,
    cpus: Option<u8>,
    memory_mb: Option<u32>,
    storage_gb: Option<u64>,
    overlay_gb: Option<u64>,
    network: bool,
    network_backend: Option<NetworkBackend>,
    allowed_cidrs: Option<Vec<String>>,
    allowed_hosts: Option<Vec<String>>,
    ports: Vec<PortSpec>,
    mounts: Vec<MountSpec>,
    gpu: bool,
    cuda: bool,
    auto_graph: bool,
    docker_socket: bool,
    image: Option<String>,
    from: Option<String>,
    registry_ref: Option<String>,
    registry_identity_token: Option<String>,
    blob_peers: Vec<String>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<EnvVar>,
    workdir: Option<String>,
    restart: Option<RestartSpec>,
    secrets: BTreeMap<String, serde_json::Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Runtime {
    pid: u32,
    start_time: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MountOut<'a> {
    tag: &'a str,
    source: &'a str,
    target: &'a str,
    readonly: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    staged: Option<bool>,
}

/// `MachineInfo` in wire order (§3.4; 1.22.0 fields per the fixtures).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MachineInfo<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime: Option<Runtime>,
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'a str>,
    state: &'static str,
    cpus: u8,
    memory_mb: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    mounts: Vec<MountOut<'a>>,
    ports: Vec<PortSpec>,
    network: bool,
    gpu: bool,
    cuda: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    network_backend: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_cidrs: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_hosts: Option<&'a [String]>,
    storage_gb: u64,
    overlay_gb: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_io: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    branchable: Option<bool>,
    forkable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    branchpoint_held: Option<bool>,
    forkpoint_held: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_millis: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rss_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_used_mb: Option<u64>,
    created_at: u64,
}

pub(crate) fn info(m: &Machine, version: Version) -> MachineInfo<'_> {
    let later = version.is_later();
    let state = m.resolved();
    let running = state == Resolved::Running;
    let vmm = m.vmm.as_ref().filter(|_| running);
    MachineInfo {
        runtime: vmm.filter(|_| later).map(|v| Runtime {
            pid: v.pid,
            start_time: v.start_time_us,
        }),
        name: m.name.clone(),
        image: if later { m.image.as_deref() } else { None },
        state: state.as_str(),
        cpus: m.cpus,
        memory_mb: m.memory_mb,
        pid: vmm.map(|v| v.pid),
        mounts: m
            .mounts
            .iter()
            .map(|x| MountOut {
                tag: &x.tag,
                source: &x.source,
                target: &x.target,
                readonly: x.readonly,
                staged: later.then_some(false),
            })
            .collect(),
        ports: m.ports.clone(),
        network: m.network,
        gpu: m.gpu,
        cuda: m.cuda,
        network_backend: m.network_backend.as_deref(),
        allowed_cidrs: m.allowed_cidrs.as_deref(),
        allowed_hosts: m.allowed_hosts.as_deref(),
        storage_gb: m.storage_gb,
        overlay_gb: m.overlay_gb,
        block_io: later.then_some("sync"),
        branchable: later.then_some(m.forkable),
        forkable: m.forkable,
        branchpoint_held: later.then_some(false),
        forkpoint_held: false,
        cpu_seconds: running.then_some(0),
        cpu_millis: running.then_some(0),
        rss_mb: running.then_some(1),
        disk_used_mb: (!later).then_some(0),
        created_at: m.created_at,
    }
}

pub(crate) fn validate_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() {
        return Err(ApiError::bad_request("machine name cannot be empty"));
    }
    if name.len() > 128 {
        return Err(ApiError::bad_request(
            "machine name too long (max 128 characters)",
        ));
    }
    if name.contains('/') || name.contains('\\') {
        return Err(ApiError::bad_request(
            "machine name cannot contain path separators",
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ApiError::bad_request(
            "machine name can only contain ASCII letters, digits, '-' and '_'",
        ));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(ApiError::bad_request(
            "machine name must start with a letter or digit",
        ));
    }
    if name.ends_with('-') {
        return Err(ApiError::bad_request("machine name cannot end with '-'"));
    }
    if name.contains("--") {
        return Err(ApiError::bad_request("machine name cannot contain '--'"));
    }
    Ok(())
}

fn normalize_cidr(s: &str) -> Option<String> {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p.parse::<u8>().ok()?)),
        None => (s, None),
    };
    if addr.parse::<Ipv4Addr>().is_ok() {
        let p = prefix.unwrap_or(32);
        (p <= 32).then(|| format!("{addr}/{p}"))
    } else if addr.parse::<Ipv6Addr>().is_ok() {
        let p = prefix.unwrap_or(128);
        (p <= 128).then(|| format!("{addr}/{p}"))
    } else {
        None
    }
}

pub(crate) fn valid_env_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

pub(crate) fn validate_env(env: &[EnvVar]) -> Result<(), ApiError> {
    if env.iter().any(|e| !valid_env_name(&e.name)) {
        return Err(ApiError::bad_request(
            "invalid environment variable name: must match [A-Za-z_][A-Za-z0-9_]* and be at most 256 bytes",
        ));
    }
    Ok(())
}

pub(crate) fn validate_secrets(
    secrets: &BTreeMap<String, serde_json::Value>,
) -> Result<(), ApiError> {
    if secrets.len() > 64 {
        return Err(ApiError::bad_request("too many secrets (max 64)"));
    }
    if let Some((name, v)) = secrets.iter().next() {
        let kind = match v
            .as_object()
            .and_then(|o| o.keys().next())
            .map(String::as_str)
        {
            Some("from_file") => "file",
            _ => "env",
        };
        return Err(ApiError::bad_request(format!(
            "secret '{name}': source kind '{kind}' is not allowed in scope Untrusted; secret refs may only be resolved on the trusted local host"
        )));
    }
    Ok(())
}

fn random_suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(unix_micros());
    format!("{:08x}", h.finish() as u32)
}

fn validate_create(req: &CreateRequest, version: Version) -> Result<(), ApiError> {
    if let Some(name) = &req.name {
        validate_name(name)?;
    }
    let sources = [
        req.image.is_some(),
        req.from.is_some(),
        req.registry_ref.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if sources > 1 {
        return Err(ApiError::bad_request(
            "'registryRef', 'from', and 'image' are mutually exclusive",
        ));
    }
    if let Some(from) = &req.from
        && !Path::new(from).is_file()
    {
        return Err(ApiError::bad_request(format!(
            "sidecar file not found: {from}"
        )));
    }
    if sources == 0 && (!req.cmd.is_empty() || !req.entrypoint.is_empty()) {
        return Err(ApiError::bad_request(
            "cmd/entrypoint require an image, from, or registryRef; an imageless machine has no workload to launch them in (use exec instead)",
        ));
    }
    if let Some(image) = &req.image
        && !version.is_later()
        && req.allowed_cidrs.is_none()
        && req.allowed_hosts.is_none()
    {
        return Err(ApiError::bad_request(format!(
            "image '{image}' requires a network policy (allowedCidrs or allowedHosts) to pull"
        )));
    }
    if matches!(req.network_backend, Some(NetworkBackend::Tsi)) && !req.ports.is_empty() {
        return Err(ApiError::bad_request(
            "published ports require networkBackend 'virtio-net' (TSI is outbound-only); omit networkBackend or set it to 'virtio-net'",
        ));
    }
    for (i, p) in req.ports.iter().enumerate() {
        if p.host == 0 || p.guest == 0 {
            return Err(ApiError::bad_request(
                "port 0 is not valid for VM port forwarding",
            ));
        }
        if req.ports[..i].iter().any(|q| q.host == p.host) {
            return Err(ApiError::bad_request(format!(
                "host port {} is specified more than once",
                p.host
            )));
        }
    }
    for c in req.allowed_cidrs.iter().flatten() {
        if normalize_cidr(c).is_none() {
            return Err(ApiError::bad_request(format!(
                "invalid CIDR '{c}': expected format like 10.0.0.0/8 or 1.1.1.1"
            )));
        }
    }
    for (i, m) in req.mounts.iter().enumerate() {
        let remote =
            m.source.starts_with("s3://") || m.source.contains(":/") && !m.source.starts_with('/');
        if !remote {
            if Path::new(&m.source) == Path::new("/") {
                return Err(ApiError::bad_request(format!(
                    "mount source '{}' is a protected system path",
                    m.source
                )));
            }
            if !Path::new(&m.source).exists() {
                return Err(ApiError::bad_request(format!(
                    "mount source does not exist: {}",
                    m.source
                )));
            }
        }
        if !m.target.starts_with('/') {
            return Err(ApiError::bad_request(format!(
                "mount target must be absolute: {}",
                m.target
            )));
        }
        if req.mounts[..i].iter().any(|o| o.target == m.target) {
            return Err(ApiError::bad_request(format!(
                "duplicate mount target: {}",
                m.target
            )));
        }
    }
    let prefix = "config operation failed: validate resources: ";
    if req.cpus == Some(0) {
        return Err(ApiError::bad_request(format!(
            "{prefix}CPU count must be at least 1"
        )));
    }
    if let Some(mem) = req.memory_mb
        && mem < 64
    {
        return Err(ApiError::bad_request(format!(
            "{prefix}memory must be at least 64 MiB (got {mem} MiB)"
        )));
    }
    if req.storage_gb == Some(0) || req.overlay_gb == Some(0) {
        return Err(ApiError::bad_request(format!(
            "{prefix}disk size must be greater than 0"
        )));
    }
    validate_env(&req.env)?;
    validate_secrets(&req.secrets)?;
    if let Some(p) = req.restart.as_ref().and_then(|r| r.policy.as_deref())
        && !matches!(p, "never" | "always" | "on-failure" | "unless-stopped")
    {
        return Err(ApiError::bad_request(format!(
            "invalid restart policy '{p}': expected never, always, on-failure or unless-stopped"
        )));
    }
    Ok(())
}

fn mismatch(info: &mut MachineInfo<'_>, field: MismatchField) {
    match field {
        MismatchField::Name => info.name.push_str("-other"),
        MismatchField::Cpus => info.cpus = info.cpus.wrapping_add(1),
        MismatchField::Memory => info.memory_mb += 64,
        MismatchField::Disks => {
            info.storage_gb += 1;
            info.overlay_gb += 1;
        }
        MismatchField::Ports => info.ports.push(PortSpec { host: 1, guest: 1 }),
    }
}

pub(crate) async fn create(State(st): State<AppState>, req: Request) -> Response {
    let faults = active_faults(&req);
    let body: CreateRequest = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let version = st.config.version;
    if let Err(e) = validate_create(&body, version) {
        return e.into_response();
    }
    let name = body
        .name
        .clone()
        .unwrap_or_else(|| format!("vm-{}", random_suffix()));
    let dir = st.machine_dir(&name);
    let mut ms = lock(&st.machines);
    if ms.iter().any(|m| m.name == name) {
        return ApiError::conflict(format!("machine '{name}' already exists")).into_response();
    }
    if let Err(e) = std::fs::create_dir_all(dir.join("rootfs").join("workspace")) {
        return ApiError::internal(format!("failed to create machine directory: {e}"))
            .into_response();
    }
    let (kill, _) = watch::channel(0);
    let machine = Machine {
        name: name.clone(),
        cpus: body.cpus.unwrap_or(4),
        memory_mb: body.memory_mb.unwrap_or(8192),
        storage_gb: body.storage_gb.unwrap_or(20),
        overlay_gb: body.overlay_gb.unwrap_or(10),
        network: body.network,
        gpu: body.gpu,
        cuda: body.cuda || body.auto_graph,
        network_backend: body.network_backend.as_ref().map(|b| match b {
            NetworkBackend::Tsi => "tsi".to_owned(),
            NetworkBackend::VirtioNet => "virtio-net".to_owned(),
        }),
        allowed_cidrs: body
            .allowed_cidrs
            .as_ref()
            .map(|v| v.iter().filter_map(|c| normalize_cidr(c)).collect()),
        allowed_hosts: body.allowed_hosts.clone(),
        ports: body.ports.clone(),
        mounts: body
            .mounts
            .iter()
            .enumerate()
            .map(|(i, m)| MountInfo {
                tag: format!("smolvm{i}"),
                source: m.source.clone(),
                target: m.target.clone(),
                readonly: m.readonly,
            })
            .collect(),
        image: body.image.clone(),
        forkable: false,
        created_at: unix_secs(),
        stored: Stored::Created,
        vmm: None,
        dir,
        kill,
        persist: st.config.persistent,
        order: ms.iter().map(|m| m.order + 1).max().unwrap_or(0),
        images: Vec::new(),
    };
    let mut out = info(&machine, version);
    for f in &faults.0 {
        if let Fault::CreateMismatch { field } = f {
            mismatch(&mut out, *field);
        }
    }
    let resp = ok_json(&out);
    drop(out);
    crate::persist::save(&machine);
    ms.push(machine);
    resp
}

#[derive(Serialize)]
struct ListReply<'a> {
    machines: Vec<MachineInfo<'a>>,
}

pub(crate) async fn list(State(st): State<AppState>) -> Response {
    let ms = lock(&st.machines);
    ok_json(&ListReply {
        machines: ms.iter().map(|m| info(m, st.config.version)).collect(),
    })
}

pub(crate) fn reply_for(st: &Shared, name: &str) -> Response {
    let ms = lock(&st.machines);
    match ms.iter().find(|m| m.name == name) {
        Some(m) => ok_json(&info(m, st.config.version)),
        None => ApiError::machine_not_found(name).into_response(),
    }
}

pub(crate) async fn get_one(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
) -> Response {
    reply_for(&st, &name)
}

/// Spawns the stand-in VMM process (a `sleep`), whose life is the machine's.
fn spawn_vmm() -> std::io::Result<Vmm> {
    let mut cmd = tokio::process::Command::new("sleep");
    cmd.arg("2147483647")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(false);
    let mut child = cmd.spawn()?;
    let pid = child.id().unwrap_or(0);
    let alive = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&alive);
    tokio::spawn(async move {
        let _ = child.wait().await;
        flag.store(false, Ordering::SeqCst);
    });
    Ok(Vmm {
        pid,
        alive,
        start_time_us: unix_micros(),
    })
}

pub(crate) fn kill_pid(pid: u32) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Boots `name` unless it is running (the implicit start of exec, files and
/// terminals). `Err` is the reply to send.
pub(crate) fn ensure_running(st: &Shared, name: &str) -> Result<(), ApiError> {
    let mut ms = lock(&st.machines);
    let Some(m) = ms.iter_mut().find(|m| m.name == name) else {
        return Err(ApiError::machine_not_found(name));
    };
    if m.resolved() == Resolved::Running {
        return Ok(());
    }
    let vmm =
        spawn_vmm().map_err(|e| ApiError::internal(format!("failed to start machine: {e}")))?;
    std::fs::create_dir_all(m.rootfs().join("workspace"))
        .map_err(|e| ApiError::internal(format!("failed to start machine: {e}")))?;
    let line = format!(
        "boot: devworker machine '{}' started (host process {})\n",
        m.name, vmm.pid
    );
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(m.console_log())
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    m.vmm = Some(vmm);
    m.stored = Stored::Running;
    crate::persist::save(m);
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartQuery {
    #[serde(default)]
    forkable: Option<bool>,
    #[serde(default)]
    branchable: Option<bool>,
    #[serde(default)]
    #[allow(dead_code)]
    fork_pool_size: Option<u32>,
    #[serde(default)]
    #[allow(dead_code)]
    cuda_vram_limit_mib: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartBody {
    #[serde(default)]
    #[allow(dead_code)]
    registry_auth: Option<serde_json::Value>,
}

pub(crate) async fn start(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<StartQuery>,
    req: Request,
) -> Response {
    let base = if st.config.version.is_later() {
        q.branchable
    } else {
        q.forkable
    };
    let has_ct = req.headers().contains_key(header::CONTENT_TYPE);
    if has_ct {
        let later = st.config.version.is_later();
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, st.config.limits.json_body_max).await else {
            return (
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "Failed to buffer the request body: length limit exceeded",
            )
                .into_response();
        };
        if !(later && bytes.is_empty()) {
            let req = Request::from_parts(parts, axum::body::Body::from(bytes));
            if let Err(r) = json_body::<StartBody>(req).await {
                return r;
            }
        }
    }
    let was_running = st.with_machine(&name, |m| m.resolved() == Resolved::Running);
    if let Err(e) = ensure_running(&st, &name) {
        return e.into_response();
    }
    if was_running == Some(false) {
        st.with_machine(&name, |m| {
            m.forkable = base.unwrap_or(false);
            crate::persist::save(m);
        });
    }
    reply_for(&st, &name)
}

/// Stops the machine's processes (commands and VMM) and marks it stopped.
pub(crate) fn stop_machine(m: &mut Machine) {
    m.kill_commands();
    if let Some(v) = m.vmm.take() {
        kill_pid(v.pid);
    }
    if m.stored == Stored::Running {
        m.stored = Stored::Stopped;
    }
    crate::persist::save(m);
}

pub(crate) async fn stop(State(st): State<AppState>, UrlPath(name): UrlPath<String>) -> Response {
    if st.with_machine(&name, stop_machine).is_none() {
        return ApiError::machine_not_found(&name).into_response();
    }
    reply_for(&st, &name)
}

#[derive(Deserialize)]
pub(crate) struct DeleteQuery {
    #[serde(default)]
    #[allow(dead_code)]
    force: Option<bool>,
    #[serde(default)]
    #[allow(dead_code)]
    cascade: Option<bool>,
}

#[derive(Serialize)]
struct Deleted<'a> {
    deleted: &'a str,
}

pub(crate) async fn delete_one(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    Query(_q): Query<DeleteQuery>,
) -> Response {
    let removed = {
        let mut ms = lock(&st.machines);
        ms.iter().position(|m| m.name == name).map(|i| ms.remove(i))
    };
    let Some(mut m) = removed else {
        return ApiError::machine_not_found(&name).into_response();
    };
    stop_machine(&mut m);
    let _ = std::fs::remove_dir_all(&m.dir);
    ok_json(&Deleted { deleted: &name })
}

/// Supervisor tick: never-started machines read `stopped` after it.
pub(crate) fn supervisor_tick_all(st: &Shared) {
    let mut ms = lock(&st.machines);
    for m in ms.iter_mut() {
        if m.stored == Stored::Created {
            m.stored = Stored::Stopped;
            crate::persist::save(m);
        }
    }
}
