//! Machine observation decoding (features C3.3) and the measurements it
//! carries (C2.4).

use crate::Evidence;
use crate::Reason;
use serde::Deserialize;

use super::incarnation::{Incarnation, NetworkBackend};
use super::name::is_upstream_name;
use super::spec::{CPUS, DISK_GB, MEMORY_MB};
use crate::error::{Error, Operation};
use crate::worker::mounts::Mount;
use crate::worker::network::{Cidr, Hostname, NetworkPolicy, PortMapping};
use crate::worker::node::Measurements;
use crate::worker::profile::Profile;

/// Largest `createdAt` (9999-12-31T23:59:59Z in seconds).
pub const MAX_CREATED_AT: u64 = 253_402_300_799;

/// The lifecycle state of a machine (only these three are accepted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MachineState {
    /// Record exists, never started (may turn `stopped` without a start).
    Created,
    /// Running.
    Running,
    /// Stopped.
    Stopped,
}

/// One validated machine observation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Every identity field: two observations are the same incarnation iff
    /// these are equal (C3.5).
    pub incarnation: Incarnation,
    /// The state (not part of the incarnation).
    pub state: MachineState,
    /// VMM host PID while not stopped (not part of the incarnation).
    pub pid: Option<i64>,
    /// `branchable` (or 1.9.2's `forkable`), when reported.
    pub branchable: Option<bool>,
    /// Measurements carried by the reply (C2.4).
    pub measurements: Measurements,
}

impl Observation {
    /// True for a plain image machine: a non-empty `image` and
    /// `branchable == false` (fields 1.9.2 never returns). Extended exec,
    /// terminals and large or out-of-root files need one (C5.4, C6.1, C7).
    pub fn is_plain_image_machine(&self) -> bool {
        self.incarnation
            .image
            .as_deref()
            .is_some_and(|i| !i.is_empty())
            && self.branchable == Some(false)
    }

    /// Fails unless [`Self::is_plain_image_machine`]: the preflight of an
    /// operation that needs one, before anything of it is sent.
    ///
    /// # Errors
    /// `unsupported_capability`, evidence `not_dispatched`, on `operation`.
    pub fn require_plain_image_machine(&self, operation: Operation) -> Result<(), Error> {
        if self.is_plain_image_machine() {
            Ok(())
        } else {
            Err(Error::unsupported_capability(
                operation,
                Reason::NeedsPlainImageMachine,
            ))
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MachineWire {
    name: String,
    state: String,
    cpus: u64,
    memory_mb: u64,
    storage_gb: u64,
    overlay_gb: u64,
    created_at: u64,
    pid: Option<i64>,
    mounts: Vec<MountWire>,
    ports: Vec<PortWire>,
    network: bool,
    gpu: bool,
    cuda: bool,
    network_backend: Option<String>,
    allowed_cidrs: Option<Vec<String>>,
    allowed_hosts: Option<Vec<String>>,
    image: Option<String>,
    branchable: Option<bool>,
    forkable: Option<bool>,
    egress_bytes: Option<u64>,
    cpu_seconds: Option<u64>,
    cpu_millis: Option<u64>,
    rss_mb: Option<u64>,
    pss_mb: Option<u64>,
    private_memory_mb: Option<u64>,
    shared_memory_mapped_mb: Option<u64>,
    disk_used_mb: Option<u64>,
}

#[derive(Deserialize)]
struct MountWire {
    source: String,
    target: String,
    readonly: bool,
    staged: Option<bool>,
}

#[derive(Deserialize)]
struct PortWire {
    host: u64,
    guest: u64,
}

/// Decodes and validates one machine JSON document.
///
/// # Errors
/// `protocol` (or `unsupported_network_policy` for a network-enabled
/// machine without allowlists), evidence `dispatch_uncertain`, on `operation`.
pub fn decode_observation(
    profile: &Profile,
    operation: Operation,
    json: &[u8],
) -> Result<Observation, Error> {
    let wire: MachineWire = serde_json::from_slice(json)
        .map_err(|_| Error::protocol(operation, Reason::InvalidMachineJson))?;
    validate(profile, operation, wire)
}

pub(crate) fn validate(
    profile: &Profile,
    op: Operation,
    w: MachineWire,
) -> Result<Observation, Error> {
    let bad = |reason| Error::protocol(op, reason);
    if !is_upstream_name(&w.name) {
        return Err(bad(Reason::MachineNameInvalid));
    }
    let state = match w.state.as_str() {
        "created" => MachineState::Created,
        "running" => MachineState::Running,
        "stopped" => MachineState::Stopped,
        _ => return Err(bad(Reason::MachineStateUnsupported)),
    };
    if w.created_at > MAX_CREATED_AT {
        return Err(bad(Reason::CreatedAtOutOfRange));
    }
    let in_range = |v: u64, (lo, hi): (u64, u64)| (lo..=hi).contains(&v);
    if !in_range(w.cpus, (CPUS.0.into(), CPUS.1.into()))
        || !in_range(w.memory_mb, (MEMORY_MB.0.into(), MEMORY_MB.1.into()))
        || !in_range(w.storage_gb, (DISK_GB.0.into(), DISK_GB.1.into()))
        || !in_range(w.overlay_gb, (DISK_GB.0.into(), DISK_GB.1.into()))
    {
        return Err(bad(Reason::MachineResourcesOutOfRange));
    }
    if w.gpu || w.cuda {
        return Err(bad(Reason::MachineGpuUnsupported));
    }
    let mut ports = Vec::with_capacity(w.ports.len());
    for p in &w.ports {
        let host = u16::try_from(p.host).map_err(|_| bad(Reason::MachinePortInvalid))?;
        let guest = u16::try_from(p.guest).map_err(|_| bad(Reason::MachinePortInvalid))?;
        ports.push(PortMapping::new(host, guest).map_err(|_| bad(Reason::MachinePortInvalid))?);
    }
    ports.sort();
    let mut mounts = Vec::with_capacity(w.mounts.len());
    for m in &w.mounts {
        match m.staged {
            Some(true) => return Err(bad(Reason::MachineMountStaged)),
            None if profile.mounts_carry_staged() => {
                return Err(bad(Reason::MachineMountStagedMissing));
            }
            _ => {}
        }
        mounts.push(Mount::observed(&m.source, &m.target, m.readonly));
    }
    mounts.sort();
    let backend = match w.network_backend.as_deref() {
        None => None,
        Some("virtio-net") => Some(NetworkBackend::VirtioNet),
        Some("tsi") => Some(NetworkBackend::Tsi),
        Some(_) => return Err(bad(Reason::MachineNetworkBackendUnknown)),
    };
    let network = if w.network {
        let (Some(hosts), Some(cidrs)) = (&w.allowed_hosts, &w.allowed_cidrs) else {
            return Err(Error::unsupported_network_policy(
                op,
                Evidence::DispatchUncertain,
                Reason::NetworkWithoutAllowlist,
            ));
        };
        if backend != Some(NetworkBackend::VirtioNet) {
            return Err(bad(Reason::MachineNetworkIncoherent));
        }
        let hosts = hosts
            .iter()
            .map(|h| Hostname::new(h))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad(Reason::MachineNetworkInvalid))?;
        let cidrs = cidrs
            .iter()
            .map(|c| Cidr::new(c))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad(Reason::MachineNetworkInvalid))?;
        NetworkPolicy::allowlist(hosts, cidrs).map_err(|_| bad(Reason::MachineNetworkInvalid))?
    } else {
        let empty = |l: &Option<Vec<String>>| l.as_ref().is_none_or(Vec::is_empty);
        if !empty(&w.allowed_hosts) || !empty(&w.allowed_cidrs) {
            return Err(bad(Reason::MachineNetworkIncoherent));
        }
        NetworkPolicy::Offline
    };
    if !ports.is_empty() && backend != Some(NetworkBackend::VirtioNet) {
        return Err(bad(Reason::MachinePortsNeedVirtioNet));
    }
    let allowlists_sent = w.allowed_hosts.is_some() && w.allowed_cidrs.is_some();
    let branchable = if profile.uses_fork_spelling() {
        w.forkable
    } else {
        w.branchable.or(w.forkable)
    };
    Ok(Observation {
        incarnation: Incarnation {
            name: w.name,
            created_at: w.created_at,
            cpus: w.cpus as u8,
            memory_mb: w.memory_mb as u32,
            storage_gb: w.storage_gb as u32,
            overlay_gb: w.overlay_gb as u32,
            network,
            network_backend: backend,
            allowlists_present: allowlists_sent,
            ports,
            mounts,
            image: w.image,
        },
        state,
        pid: if state == MachineState::Stopped {
            None
        } else {
            w.pid
        },
        branchable,
        measurements: Measurements {
            cpu_seconds: w.cpu_seconds,
            cpu_millis: w.cpu_millis,
            rss_mb: w.rss_mb,
            pss_mb: w.pss_mb,
            private_memory_mb: w.private_memory_mb,
            shared_memory_mapped_mb: w.shared_memory_mapped_mb,
            disk_used_mb: w.disk_used_mb,
            egress_bytes: w.egress_bytes,
        },
    })
}
