//! The machine specification and its bounds (features C3.2, C8.1, C9,
//! C10.1, C11.1).

use crate::Reason;
use crate::error::{Error, Operation};
use crate::secret::Secret;
use crate::worker::mounts::{Mount, canonical_mounts};
use crate::worker::network::{NetworkPolicy, PortMapping, canonical_ports};
use crate::worker::profile::{Feature, Profile};
use crate::worker::workload::Workload;

/// Smallest and largest CPU count.
pub const CPUS: (u8, u8) = (1, 64);
/// Smallest and largest memory, MiB.
pub const MEMORY_MB: (u32, u32) = (128, 16_384);
/// Smallest and largest storage or overlay disk, GiB.
pub const DISK_GB: (u32, u32) = (1, 64);
/// Longest source path or reference in bytes.
pub const MAX_SOURCE_LEN: usize = 4_096;

/// Where a machine's root file system comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// No source: an imageless machine (the 1.9.2 default create). It can
    /// carry no workload.
    Bare,
    /// An approved `.smolmachine` image path on the worker host (`from`).
    Image {
        /// Absolute worker path ending in `.smolmachine`.
        path: String,
    },
    /// An approved checkpoint on the worker host (`from`, C11.1): offline,
    /// no ports, mounts or workload; the reply must be `created` + branchable.
    Checkpoint {
        /// Absolute worker path ending in `.smolcheckpoint` or `.checkpoint`.
        path: String,
    },
    /// A registry `.smolmachine` reference (`registryRef`), 1.19.0+.
    Registry {
        /// The reference.
        reference: String,
        /// Bearer for the pull, when needed.
        identity_token: Option<Secret>,
    },
    /// An OCI image reference (`image`), 1.19.0+.
    Oci {
        /// The reference.
        reference: String,
    },
}

impl Source {
    /// True for image sources (image path, registry, OCI): the only ones
    /// that may carry a workload or ports.
    pub const fn is_image(&self) -> bool {
        matches!(
            self,
            Self::Image { .. } | Self::Registry { .. } | Self::Oci { .. }
        )
    }
}

/// A machine specification. Defaults: 1 CPU, 256 MiB, 1 GiB storage and
/// overlay, offline, no ports, mounts or workload, [`Source::Bare`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineSpec {
    /// CPUs, 1–64.
    pub cpus: u8,
    /// Memory, 128–16,384 MiB.
    pub memory_mb: u32,
    /// Storage disk, 1–64 GiB.
    pub storage_gb: u32,
    /// Overlay disk, 1–64 GiB.
    pub overlay_gb: u32,
    /// Outbound network policy (1.16.0+ when an allowlist).
    pub network: NetworkPolicy,
    /// Port mappings, ≤32, unique host ports (1.17.0+).
    pub ports: Vec<PortMapping>,
    /// Host mounts, ≤8 (1.20.2+).
    pub mounts: Vec<Mount>,
    /// Startup workload, image sources only (1.17.0+).
    pub workload: Option<Workload>,
    /// The source.
    pub source: Source,
}

impl Default for MachineSpec {
    fn default() -> Self {
        Self {
            cpus: 1,
            memory_mb: 256,
            storage_gb: 1,
            overlay_gb: 1,
            network: NetworkPolicy::Offline,
            ports: Vec::new(),
            mounts: Vec::new(),
            workload: None,
            source: Source::Bare,
        }
    }
}

impl MachineSpec {
    /// Checks every bound and rule, and returns the canonical form (ports
    /// sorted by host port, mounts by target).
    ///
    /// # Errors
    /// `validation`, operation `machine_spec`, evidence `not_dispatched`.
    pub fn validate(&self) -> Result<Self, Error> {
        let e = |r| Error::validation(Operation::MachineSpec, r);
        range(
            u64::from(self.cpus),
            CPUS.0.into(),
            CPUS.1.into(),
            Reason::CpusOutOfRange,
        )?;
        range(
            self.memory_mb.into(),
            MEMORY_MB.0.into(),
            MEMORY_MB.1.into(),
            Reason::MemoryOutOfRange,
        )?;
        range(
            self.storage_gb.into(),
            DISK_GB.0.into(),
            DISK_GB.1.into(),
            Reason::StorageOutOfRange,
        )?;
        range(
            self.overlay_gb.into(),
            DISK_GB.0.into(),
            DISK_GB.1.into(),
            Reason::OverlayOutOfRange,
        )?;
        let ports = canonical_ports(self.ports.clone())?;
        let mounts = canonical_mounts(self.mounts.clone())?;
        match &self.source {
            Source::Bare => {}
            Source::Image { path } => {
                if !is_worker_path(path) || !path.ends_with(".smolmachine") {
                    return Err(e(Reason::InvalidImagePath));
                }
            }
            Source::Checkpoint { path } => {
                if !is_worker_path(path)
                    || !(path.ends_with(".smolcheckpoint") || path.ends_with(".checkpoint"))
                {
                    return Err(e(Reason::InvalidCheckpointPath));
                }
                if self.network.is_enabled()
                    || !ports.is_empty()
                    || !mounts.is_empty()
                    || self.workload.is_some()
                {
                    return Err(e(Reason::CheckpointSourceRestrictions));
                }
            }
            Source::Registry {
                reference,
                identity_token,
            } => {
                if !is_reference(reference) {
                    return Err(e(Reason::InvalidRegistryReference));
                }
                if identity_token.as_ref().is_some_and(|t| {
                    t.is_empty()
                        || t.len() > 4_096
                        || !t.expose().bytes().all(|b| (0x21..=0x7e).contains(&b))
                }) {
                    return Err(e(Reason::InvalidRegistryToken));
                }
            }
            Source::Oci { reference } => {
                if !is_reference(reference) {
                    return Err(e(Reason::InvalidOciReference));
                }
            }
        }
        if self.workload.is_some() && !self.source.is_image() {
            return Err(e(Reason::WorkloadRequiresImageSource));
        }
        Ok(Self {
            ports,
            mounts,
            ..self.clone()
        })
    }

    /// The features this spec needs from the worker version.
    pub fn required_features(&self) -> Vec<Feature> {
        let mut f = Vec::new();
        if self.network.is_enabled() {
            f.push(Feature::NetworkPolicy);
        }
        if !self.ports.is_empty() {
            f.push(Feature::PortMappings);
        }
        if self.workload.is_some() {
            f.push(Feature::StartupWorkload);
        }
        if !self.mounts.is_empty() {
            f.push(Feature::HostMounts);
        }
        match self.source {
            Source::Checkpoint { .. } => f.push(Feature::CheckpointCreate),
            Source::Registry { .. } | Source::Oci { .. } => f.push(Feature::RegistrySources),
            Source::Bare | Source::Image { .. } => {}
        }
        f
    }

    /// Validates the spec and checks every feature it needs against `profile`.
    ///
    /// # Errors
    /// `validation` or `unsupported_capability` (operation `create`),
    /// evidence `not_dispatched`.
    pub fn check(&self, profile: &Profile) -> Result<Self, Error> {
        let canonical = self.validate()?;
        for feature in self.required_features() {
            profile.require(feature, Operation::Create)?;
        }
        Ok(canonical)
    }
}

fn range(v: u64, min: u64, max: u64, reason: Reason) -> Result<(), Error> {
    if (min..=max).contains(&v) {
        Ok(())
    } else {
        Err(Error::validation(Operation::MachineSpec, reason).with_limit(v, max))
    }
}

fn is_worker_path(p: &str) -> bool {
    p.starts_with('/')
        && p.len() <= MAX_SOURCE_LEN
        && !p.contains(['\0', '\\'])
        && p[1..]
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

fn is_reference(r: &str) -> bool {
    !r.is_empty() && r.len() <= MAX_SOURCE_LEN && r.bytes().all(|b| (0x21..=0x7e).contains(&b))
}
