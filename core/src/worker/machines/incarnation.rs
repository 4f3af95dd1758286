//! Incarnation identity (features C3.5) and creation reply matching (C3.4).

use super::observation::{MachineState, Observation};
use super::spec::{MachineSpec, Source};
use crate::error::{Category, Error, Evidence, Operation};
use crate::worker::mounts::Mount;
use crate::worker::network::{NetworkPolicy, PortMapping};

/// The network backend a machine reply names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NetworkBackend {
    /// `virtio-net` (required for allowlists and ports).
    VirtioNet,
    /// `tsi` (outbound only).
    Tsi,
}

/// The identity fields of an observation: everything decoded except the
/// state (and the volatile pid, branchable flag and measurements).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Incarnation {
    /// Machine name.
    pub name: String,
    /// Creation time, seconds since the epoch (second precision; not an
    /// immutable token on its own).
    pub created_at: u64,
    /// CPUs.
    pub cpus: u8,
    /// Memory, MiB.
    pub memory_mb: u32,
    /// Storage disk, GiB.
    pub storage_gb: u32,
    /// Overlay disk, GiB.
    pub overlay_gb: u32,
    /// Outbound policy (lists sorted).
    pub network: NetworkPolicy,
    /// Network backend, when the reply named one.
    pub network_backend: Option<NetworkBackend>,
    /// True when the reply carried both allowlist fields (possibly empty).
    pub allowlists_present: bool,
    /// Port mappings, sorted by host port.
    pub ports: Vec<PortMapping>,
    /// Mounts, sorted by target.
    pub mounts: Vec<Mount>,
    /// Image reference, when the version reports it.
    pub image: Option<String>,
}

/// True when both observations are the same incarnation: every identity
/// field equal (the state may differ).
pub fn same_incarnation(a: &Observation, b: &Observation) -> bool {
    a.incarnation == b.incarnation
}

/// Checks a create reply against the request (C3.4).
///
/// # Errors
/// Name mismatch → `identity_conflict`; any other difference →
/// `protocol`; both `dispatch_uncertain`.
pub(crate) fn match_create(name: &str, spec: &MachineSpec, obs: &Observation) -> Result<(), Error> {
    let op = Operation::Create;
    let inc = &obs.incarnation;
    if inc.name != name {
        return Err(
            Error::new(Category::IdentityConflict, op, Evidence::DispatchUncertain)
                .with_reason("reply_name_mismatch"),
        );
    }
    let checkpoint = matches!(spec.source, Source::Checkpoint { .. });
    let sizes_match = inc.cpus == spec.cpus
        && inc.memory_mb == spec.memory_mb
        && (checkpoint || (inc.storage_gb == spec.storage_gb && inc.overlay_gb == spec.overlay_gb));
    if !sizes_match {
        return Err(Error::protocol(op, "reply_resources_mismatch"));
    }
    if inc.network != spec.network {
        return Err(Error::protocol(op, "reply_network_mismatch"));
    }
    let needs_virtio = spec.network.is_enabled() || !spec.ports.is_empty();
    if needs_virtio
        && (inc.network_backend != Some(NetworkBackend::VirtioNet) || !inc.allowlists_present)
    {
        return Err(Error::protocol(op, "reply_network_mismatch"));
    }
    if inc.ports != spec.ports {
        return Err(Error::protocol(op, "reply_ports_mismatch"));
    }
    if inc.mounts != spec.mounts {
        return Err(Error::protocol(op, "reply_mounts_mismatch"));
    }
    if checkpoint && (obs.state != MachineState::Created || obs.branchable != Some(true)) {
        return Err(Error::protocol(op, "reply_checkpoint_not_branchable"));
    }
    Ok(())
}

/// Requires a lifecycle reply to name the machine asked for.
pub(crate) fn match_name(operation: Operation, name: &str, obs: &Observation) -> Result<(), Error> {
    if obs.incarnation.name == name {
        Ok(())
    } else {
        Err(Error::new(
            Category::IdentityConflict,
            operation,
            Evidence::DispatchUncertain,
        )
        .with_reason("reply_name_mismatch"))
    }
}
