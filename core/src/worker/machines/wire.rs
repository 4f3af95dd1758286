//! The create request body per source and profile (features C3.2, C8.1,
//! C9, C10.1, C11.1).

use serde::Serialize;

use super::spec::{MachineSpec, Source};
use crate::worker::network::NetworkPolicy;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    registry_ref: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    registry_identity_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'a str>,
    cpus: u8,
    memory_mb: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage_gb: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overlay_gb: Option<u32>,
    network: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    network_backend: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_hosts: Option<Vec<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_cidrs: Option<Vec<&'a str>>,
    gpu: bool,
    cuda: bool,
    docker_socket: bool,
    mounts: Vec<MountBody<'a>>,
    ports: Vec<PortBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entrypoint: Option<Vec<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cmd: Option<Vec<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    env: Option<Vec<EnvBody<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workdir: Option<&'a str>,
    restart: RestartBody,
}

#[derive(Serialize)]
struct MountBody<'a> {
    source: &'a str,
    target: &'a str,
    readonly: bool,
    staged: bool,
}

#[derive(Serialize)]
struct PortBody {
    host: u16,
    guest: u16,
}

#[derive(Serialize)]
struct EnvBody<'a> {
    name: &'a str,
    value: &'a str,
}

#[derive(Serialize)]
struct RestartBody {
    policy: &'static str,
}

/// The JSON create body of a validated spec (C3.2 field order).
pub(crate) fn create_body(name: &str, spec: &MachineSpec) -> Vec<u8> {
    let checkpoint = matches!(spec.source, Source::Checkpoint { .. });
    let (from, registry_ref, registry_identity_token, image) = match &spec.source {
        Source::Bare => (None, None, None, None),
        Source::Image { path } | Source::Checkpoint { path } => {
            (Some(path.as_str()), None, None, None)
        }
        Source::Registry {
            reference,
            identity_token,
        } => (
            None,
            Some(reference.as_str()),
            identity_token.as_ref().map(|t| t.expose()),
            None,
        ),
        Source::Oci { reference } => (None, None, None, Some(reference.as_str())),
    };
    let (network, network_backend, allowed_hosts, allowed_cidrs) = match &spec.network {
        NetworkPolicy::Allowlist { hosts, cidrs } => (
            true,
            Some("virtio-net"),
            Some(hosts.iter().map(|h| h.as_str()).collect()),
            Some(cidrs.iter().map(|c| c.as_str()).collect()),
        ),
        // C9.2: offline with ports still names virtio-net and empty lists.
        NetworkPolicy::Offline if !spec.ports.is_empty() => (
            false,
            Some("virtio-net"),
            Some(Vec::new()),
            Some(Vec::new()),
        ),
        NetworkPolicy::Offline => (false, None, None, None),
    };
    let (entrypoint, cmd, env, workdir) = match (&spec.workload, &spec.source) {
        (_, Source::Bare | Source::Checkpoint { .. }) => (None, None, None, None),
        (None, _) => (Some(vec!["/bin/true"]), Some(Vec::new()), None, None),
        (Some(w), _) => (
            Some(w.entrypoint().iter().map(String::as_str).collect()),
            Some(w.cmd().iter().map(String::as_str).collect()),
            Some(
                w.env()
                    .iter()
                    .map(|(n, v)| EnvBody { name: n, value: v })
                    .collect(),
            ),
            w.workdir(),
        ),
    };
    let body = CreateBody {
        name,
        from,
        registry_ref,
        registry_identity_token,
        image,
        cpus: spec.cpus,
        memory_mb: spec.memory_mb,
        storage_gb: (!checkpoint).then_some(spec.storage_gb),
        overlay_gb: (!checkpoint).then_some(spec.overlay_gb),
        network,
        network_backend,
        allowed_hosts,
        allowed_cidrs,
        gpu: false,
        cuda: false,
        docker_socket: false,
        mounts: spec
            .mounts
            .iter()
            .map(|m| MountBody {
                source: m.source(),
                target: m.target(),
                readonly: m.readonly(),
                staged: false,
            })
            .collect(),
        ports: spec
            .ports
            .iter()
            .map(|p| PortBody {
                host: p.host(),
                guest: p.guest(),
            })
            .collect(),
        entrypoint,
        cmd,
        env,
        workdir,
        restart: RestartBody { policy: "never" },
    };
    // Serializing plain structs of strings, integers and booleans into a
    // Vec cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}
