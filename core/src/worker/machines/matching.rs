//! Matching replies to requests: same incarnation (C3.5), create reply
//! against the request (C3.4), lifecycle reply against the name.

use super::incarnation::NetworkBackend;
use super::observation::{MachineState, Observation};
use super::spec::{MachineSpec, Source};
use crate::Reason;
use crate::error::{Error, Evidence, Operation};

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
        return Err(Error::identity_conflict(
            op,
            Evidence::DispatchUncertain,
            Reason::ReplyNameMismatch,
        ));
    }
    let checkpoint = matches!(spec.source, Source::Checkpoint { .. });
    let sizes_match = inc.cpus == spec.cpus
        && inc.memory_mb == spec.memory_mb
        && (checkpoint || (inc.storage_gb == spec.storage_gb && inc.overlay_gb == spec.overlay_gb));
    if !sizes_match {
        return Err(Error::protocol(op, Reason::ReplyResourcesMismatch));
    }
    if inc.network != spec.network {
        return Err(Error::protocol(op, Reason::ReplyNetworkMismatch));
    }
    let needs_virtio = spec.network.is_enabled() || !spec.ports.is_empty();
    if needs_virtio
        && (inc.network_backend != Some(NetworkBackend::VirtioNet) || !inc.allowlists_present)
    {
        return Err(Error::protocol(op, Reason::ReplyNetworkMismatch));
    }
    if inc.ports != spec.ports {
        return Err(Error::protocol(op, Reason::ReplyPortsMismatch));
    }
    if inc.mounts != spec.mounts {
        return Err(Error::protocol(op, Reason::ReplyMountsMismatch));
    }
    if checkpoint && (obs.state != MachineState::Created || obs.branchable != Some(true)) {
        return Err(Error::protocol(op, Reason::ReplyCheckpointNotBranchable));
    }
    Ok(())
}

/// Requires a lifecycle reply to name the machine asked for.
pub(crate) fn match_name(operation: Operation, name: &str, obs: &Observation) -> Result<(), Error> {
    if obs.incarnation.name == name {
        Ok(())
    } else {
        Err(Error::identity_conflict(
            operation,
            Evidence::DispatchUncertain,
            Reason::ReplyNameMismatch,
        ))
    }
}
