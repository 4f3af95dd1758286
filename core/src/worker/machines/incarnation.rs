//! Incarnation identity (features C3.5): the identity fields of an
//! observation.

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
