//! One configured worker (C12.2): id, capacity, admitted version profile
//! and catalog, with the builder methods that make one.

use crate::managed::catalog::Catalog;
use crate::managed::record::Resources;
use crate::managed::spec::{ArtifactRef, ProfileRef};
use crate::worker::{MachineSpec, Profile, Source};
use crate::{Error, Operation, Reason};

/// One configured worker (C12.2). Build it with [`WorkerEntry::new`] and
/// the `with_*` methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerEntry {
    /// Worker id (≤64 bytes, `^[A-Za-z0-9][A-Za-z0-9._-]*$`).
    pub id: String,
    /// Total capacity `{slots, cpus, memory_mb, disk_gb}`.
    pub capacity: Resources,
    /// The worker's admitted version profile. Needed for disposable
    /// machines (create, start, stop, inspect); without it the worker only
    /// runs commands on machines the caller names.
    pub profile: Option<Box<Profile>>,
    /// The worker's catalog (C12.2): which artifacts and profile revisions
    /// a disposable execution or retained machine may use on it. `None`
    /// is an uncatalogued (development) entry that checks neither; see
    /// docs/decisions/runtime.md, "Worker catalogs".
    pub catalog: Option<Box<Catalog>>,
    /// What the machines the controller creates on this worker (disposable
    /// and retained) are created from. `None`: imageless machines
    /// ([`Source::Bare`]), on which the worker-side image preflight
    /// refuses terminals, extended or background commands and large or
    /// out-of-root files (C5.4, C6.1, C7.4); an image source
    /// ([`Source::Oci`] from 1.19.0, or [`Source::Image`]) makes them
    /// image machines.
    pub machine_source: Option<Source>,
}

impl WorkerEntry {
    /// A worker with the given id and a capacity of 64 slots, 64 CPUs,
    /// 64 GiB of memory and 1 TiB of disk.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            capacity: Resources {
                slots: 64,
                cpus: 64,
                memory_mb: 65_536,
                disk_gb: 1_024,
            },
            profile: None,
            catalog: None,
            machine_source: None,
        }
    }

    /// The same worker, creating its machines from `source` (see
    /// [`Self::machine_source`]).
    #[must_use]
    pub fn with_machine_source(mut self, source: Source) -> Self {
        self.machine_source = Some(source);
        self
    }

    /// The worker spec of a machine this controller creates here: `base`
    /// with this worker's [`Self::machine_source`].
    pub(crate) fn machine_spec(&self, base: MachineSpec) -> MachineSpec {
        match &self.machine_source {
            Some(source) => MachineSpec {
                source: source.clone(),
                ..base
            },
            None => base,
        }
    }

    /// The same worker with the capacity `{slots, cpus, memory_mb, disk_gb}`
    /// (each 1–1,048,576, checked by
    /// [`ControllerConfig::validate`](super::ControllerConfig::validate)).
    #[must_use]
    pub fn with_capacity(mut self, capacity: Resources) -> Self {
        self.capacity = capacity;
        self
    }

    /// The same worker with a catalog (C12.2): acceptance then needs its
    /// exact artifact and profile revision (C12.4).
    #[must_use]
    pub fn with_catalog(mut self, catalog: Catalog) -> Self {
        self.catalog = Some(Box::new(catalog));
        self
    }

    /// Whether this worker may create a machine for `artifact` and
    /// `profile`: it has an admitted version profile and, with a catalog,
    /// the catalog supports them (C12.4).
    ///
    /// # Errors
    /// `unsupported_capability`: `disposable_machines` without a version
    /// profile, else the catalog's refusal ([`Catalog::supports`]).
    pub fn can_create(&self, artifact: &ArtifactRef, profile: &ProfileRef) -> Result<(), Error> {
        if self.profile.is_none() {
            return Err(Error::unsupported_capability(
                Operation::Submit,
                Reason::DisposableMachines,
            ));
        }
        match &self.catalog {
            Some(c) => c.supports(artifact, profile),
            None => Ok(()),
        }
    }

    /// The same worker, able to create disposable machines with `profile`.
    #[must_use]
    pub fn with_profile(mut self, profile: Profile) -> Self {
        self.profile = Some(Box::new(profile));
        self
    }
}
