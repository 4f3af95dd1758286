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

/// `POST /api/v1/machines` body; unknown fields are ignored. The request
/// types carry the real worker's names: serde's 422 texts show them
/// (`expected struct CreateMachineRequest`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct CreateMachineRequest {
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

/// smolvm 1.9.2's `validate_vm_name(name, "machine name")`: its checks,
/// order and texts.
pub(crate) fn validate_name(name: &str) -> Result<(), ApiError> {
    let label = "machine name";
    let Some(first) = name.chars().next() else {
        return Err(ApiError::bad_request(format!("{label} cannot be empty")));
    };
    if name.len() > 128 {
        return Err(ApiError::bad_request(format!(
            "{label} too long: {} characters (max 128)",
            name.len()
        )));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(ApiError::bad_request(format!(
            "{label} must start with a letter or digit (got: {name:?})"
        )));
    }
    if name.ends_with('-') {
        return Err(ApiError::bad_request(format!(
            "{label} cannot end with a hyphen (got: {name:?})"
        )));
    }
    let mut prev_hyphen = false;
    for c in name.chars() {
        if c == '-' {
            if prev_hyphen {
                return Err(ApiError::bad_request(format!(
                    "{label} cannot contain consecutive hyphens"
                )));
            }
            prev_hyphen = true;
        } else {
            prev_hyphen = false;
        }
        if !c.is_ascii_alphanumeric() && c != '-' && c != '_' {
            if c == '/' || c == '\\' {
                return Err(ApiError::bad_request(format!(
                    "{label} cannot contain path separators"
                )));
            }
            return Err(ApiError::bad_request(format!(
                "{label} contains invalid character: '{c}'"
            )));
        }
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

/// smolvm 1.9.2's `check_env_key_shape`: `None` when `key` is a valid
/// environment name, else the rule it breaks.
fn env_key_rule(key: &str) -> Option<String> {
    let first = key.chars().next()?;
    if key.len() > 256 {
        return Some("env key exceeds 256-byte limit".to_owned());
    }
    if !first.is_ascii_alphabetic() && first != '_' {
        return Some("env key must start with an ASCII letter or underscore".to_owned());
    }
    if !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Some("env key must contain only ASCII alphanumeric and underscore".to_owned());
    }
    None
}

fn env_key_shape(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("env key must not be empty".to_owned());
    }
    env_key_rule(key).map_or(Ok(()), Err)
}

pub(crate) fn validate_env(env: &[EnvVar]) -> Result<(), ApiError> {
    for e in env {
        if let Err(rule) = env_key_shape(&e.name) {
            return Err(ApiError::bad_request(format!(
                "env entry with {}-byte name rejected: {rule}",
                e.name.len()
            )));
        }
    }
    Ok(())
}

/// smolvm 1.9.2's `validate_request_secrets` in the untrusted scope of the
/// HTTP API: every source kind is refused.
pub(crate) fn validate_secrets(
    secrets: &BTreeMap<String, serde_json::Value>,
) -> Result<(), ApiError> {
    if secrets.len() > 64 {
        return Err(ApiError::bad_request(format!(
            "request `secrets` map has {} entries; maximum is 64",
            secrets.len()
        )));
    }
    // The first entry (in key order) decides: every source kind is refused.
    if let Some((name, v)) = secrets.iter().next() {
        if let Err(rule) = env_key_shape(name) {
            return Err(ApiError::bad_request(format!(
                "secrets entry with {}-byte key rejected: {rule}",
                name.len()
            )));
        }
        let has = |k: &str| v.get(k).is_some_and(|x| !x.is_null());
        let reason = match (has("from_env"), has("from_file")) {
            (false, false) => {
                "no source set: exactly one of from_env, from_file must be specified".to_owned()
            }
            (true, true) => {
                "multiple sources set: exactly one of from_env, from_file must be specified"
                    .to_owned()
            }
            (env, _) => format!(
                "source kind '{}' is not allowed in scope Untrusted; secret refs may only be resolved on the trusted local host",
                if env { "env" } else { "file" }
            ),
        };
        return Err(ApiError::bad_request(format!("secret '{name}': {reason}")));
    }
    Ok(())
}

fn random_suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(unix_micros());
    format!("{:08x}", h.finish() as u32)
}

/// True for an image reference the real worker would pull from a registry
/// (not a local path, archive or already-resolved local source).
fn is_registry_image(image: &str) -> bool {
    !(image.starts_with('/')
        || image.starts_with('.')
        || image.starts_with("local:")
        || image.starts_with("local-dir:")
        || image == "-"
        || [".tar", ".tar.gz", ".tgz"]
            .iter()
            .any(|s| image.ends_with(s)))
}

/// The checks smolvm 1.9.2's create makes before it reserves the name (a
/// duplicate is 409 only after these), in its order and with its texts.
fn validate_create(
    req: &CreateMachineRequest,
    name: &str,
    _version: Version,
) -> Result<(), ApiError> {
    let sources = [
        req.registry_ref.is_some(),
        req.from.is_some(),
        req.image.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if sources > 1 {
        return Err(ApiError::bad_request(
            "'registryRef', 'from', and 'image' are mutually exclusive",
        ));
    }
    if !req.ports.is_empty() && matches!(req.network_backend, Some(NetworkBackend::Tsi)) {
        return Err(ApiError::bad_request(
            "published ports require networkBackend 'virtio-net' (TSI is outbound-only); omit networkBackend or set it to 'virtio-net'",
        ));
    }
    if sources == 0 && (!req.cmd.is_empty() || !req.entrypoint.is_empty()) {
        return Err(ApiError::bad_request(
            "cmd/entrypoint require an image, from, or registryRef; an imageless machine has no workload to launch them in (use exec instead)",
        ));
    }
    validate_name(name)?;
    let mount = |op: &str, reason: String| {
        ApiError::bad_request(format!("mount operation failed: {op}: {reason}"))
    };
    let mut targets: Vec<&str> = Vec::new();
    for m in &req.mounts {
        if !(m.source.starts_with("s3://") || m.source.starts_with(':')) {
            let source = Path::new(&m.source);
            if !source.is_absolute() {
                return Err(mount(
                    "validate source",
                    format!("path must be absolute: {}", m.source),
                ));
            }
            if !source.exists() {
                return Err(ApiError::bad_request(format!(
                    "mount source not found: {}",
                    m.source
                )));
            }
            if !source.is_dir() {
                return Err(mount(
                    "validate host path",
                    format!(
                        "source path on host must be a directory (virtiofs limitation): {}",
                        m.source
                    ),
                ));
            }
            let canonical = source
                .canonicalize()
                .map_err(|e| mount("canonicalize host path", format!("'{}': {e}", m.source)))?;
            if PROTECTED_MOUNT_SOURCES.iter().any(|(p, subtree)| {
                canonical == Path::new(p) || *subtree && canonical.starts_with(p)
            }) {
                return Err(mount(
                    "validate host path",
                    format!(
                        "source path on host is a protected system path and cannot be mounted: {}",
                        canonical.display()
                    ),
                ));
            }
            if !m.target.starts_with('/') {
                return Err(mount(
                    "validate guest path",
                    format!(
                        "target path on guest should be an absolute directory: {}",
                        m.target
                    ),
                ));
            }
        }
    }
    for m in &req.mounts {
        if targets.contains(&m.target.as_str()) {
            return Err(mount(
                "validate mounts",
                format!(
                    "duplicate mount target: {} is specified more than once",
                    m.target
                ),
            ));
        }
        targets.push(&m.target);
    }
    for p in &req.ports {
        if p.host == 0 || p.guest == 0 {
            return Err(ApiError::bad_request(
                "port 0 is not valid for VM port forwarding",
            ));
        }
    }
    for (i, p) in req.ports.iter().enumerate() {
        if req.ports[..i].iter().any(|q| q.host == p.host) {
            return Err(ApiError::bad_request(format!(
                "duplicate host port {}: each host port can only be mapped once",
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
    if let Some(from) = &req.from
        && !Path::new(from).exists()
    {
        return Err(ApiError::bad_request(format!(
            "sidecar file not found: {from}"
        )));
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
    if req.storage_gb == Some(0) {
        return Err(ApiError::bad_request(format!(
            "{prefix}storage disk size must be greater than 0 GiB"
        )));
    }
    if req.overlay_gb == Some(0) {
        return Err(ApiError::bad_request(format!(
            "{prefix}overlay disk size must be greater than 0 GiB"
        )));
    }
    Ok(())
}

/// Linux's protected mount sources of smolvm 1.9.2 (`true`: the subtree too).
const PROTECTED_MOUNT_SOURCES: [(&str, bool); 14] = [
    ("/", false),
    ("/var", false),
    ("/var/run", true),
    ("/var/log", true),
    ("/etc", true),
    ("/boot", true),
    ("/usr", true),
    ("/bin", true),
    ("/sbin", true),
    ("/lib", true),
    ("/proc", true),
    ("/sys", true),
    ("/dev", true),
    ("/run", true),
];

/// The checks smolvm 1.9.2's create makes after the name is reserved (so
/// after the duplicate check): secrets, env names, restart policy, and
/// whether a registry image can be pulled at all.
fn validate_create_late(req: &CreateMachineRequest, version: Version) -> Result<(), ApiError> {
    validate_secrets(&req.secrets)?;
    validate_env(&req.env)?;
    if let Some(p) = req.restart.as_ref().and_then(|r| r.policy.as_deref())
        && !matches!(
            p.to_lowercase().as_str(),
            "never" | "always" | "on-failure" | "onfailure" | "unless-stopped" | "unlessstopped"
        )
    {
        return Err(ApiError::bad_request(format!(
            "invalid restart policy: {p}"
        )));
    }
    if let Some(image) = &req.image
        && !version.is_later()
        && is_registry_image(image)
    {
        let wants_network = req.network
            || !req.ports.is_empty()
            || req.allowed_cidrs.as_ref().is_some_and(|c| !c.is_empty())
            || req.allowed_hosts.as_ref().is_some_and(|h| !h.is_empty());
        if !wants_network {
            return Err(ApiError::bad_request(format!(
                "config operation failed: create machine: image '{image}' must be pulled from a registry, but this machine has no network, so the pull can never succeed. Add --net (or publish a port with -p, or set an egress policy with --allow-cidr/--allow-host). To keep the machine network-isolated, supply the image locally instead: `docker save {image} | smolvm machine create --image - ...`"
            )));
        }
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
    let body: CreateMachineRequest = match json_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let version = st.config.version;
    let name = body
        .name
        .clone()
        .unwrap_or_else(|| format!("vm-{}", random_suffix()));
    if let Err(e) = validate_create(&body, &name, version) {
        return e.into_response();
    }
    let dir = st.machine_dir(&name);
    let mut ms = lock(&st.machines);
    if ms.iter().any(|m| m.name == name) {
        return ApiError::conflict(format!("machine '{name}' already exists")).into_response();
    }
    if let Err(e) = validate_create_late(&body, version) {
        return e.into_response();
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
    fork_pool_size: Option<u32>,
    #[serde(default)]
    cuda_vram_limit_mib: Option<u64>,
}

/// The real worker's checks of `forkPoolSize` and `cudaVramLimitMib`, in its
/// order: after the lookup and only for a machine that is not running (a
/// running one is answered as it is), before the boot.
fn check_fork_pool(q: &StartQuery, cuda: bool) -> Result<(), ApiError> {
    if let Some(pool) = q.fork_pool_size {
        if pool == 0 {
            return Err(ApiError::bad_request(
                "forkPoolSize must be greater than zero",
            ));
        }
        if !cuda {
            return Err(ApiError::bad_request(
                "forkPoolSize requires a CUDA-enabled machine",
            ));
        }
    }
    if let Some(limit) = q.cuda_vram_limit_mib {
        if limit == 0 {
            return Err(ApiError::bad_request(
                "cudaVramLimitMib must be greater than zero",
            ));
        }
        if q.fork_pool_size.is_none() {
            return Err(ApiError::bad_request(
                "cudaVramLimitMib requires forkPoolSize",
            ));
        }
    }
    Ok(())
}

/// The start body. Named like the real worker's type: serde's 422 texts
/// carry the type name (`expected struct StartMachineRequest`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartMachineRequest {
    #[serde(default)]
    #[allow(dead_code)]
    registry_auth: Option<RegistryAuthSpec>,
}

/// Registry credentials of a start (checked for shape, never used or
/// shown: no `Debug`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RegistryAuthSpec {
    #[allow(dead_code)]
    username: String,
    #[allow(dead_code)]
    password: String,
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
            if let Err(r) = json_body::<StartMachineRequest>(req).await {
                return r;
            }
        }
    }
    let was_running = st.with_machine(&name, |m| m.resolved() == Resolved::Running);
    if was_running == Some(false) {
        let cuda = st.with_machine(&name, |m| m.cuda).unwrap_or(false);
        if let Err(e) = check_fork_pool(&q, cuda) {
            return e.into_response();
        }
    }
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
