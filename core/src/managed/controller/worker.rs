//! One configured worker (C12.2): id, capacity, admitted version profile
//! and catalog, with the builder methods that make one.

use super::ControllerConfig;
use crate::managed::catalog::Catalog;
use crate::managed::record::Resources;
use crate::managed::spec::{ArtifactKind, ArtifactRef, ProfileNetwork, ProfileRef};
use crate::worker::{Cidr, Feature, Hostname, MachineSpec, NetworkPolicy, Profile, Source};
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
    /// What the machines the controller creates on an uncatalogued
    /// (development) entry are created from. `None`: imageless machines
    /// ([`Source::Bare`]), on which the worker-side image preflight
    /// refuses terminals, extended or background commands and large or
    /// out-of-root files (C5.4, C6.1, C7.4); an image source
    /// ([`Source::Oci`] from 1.19.0, or [`Source::Image`]) makes them
    /// image machines. With a catalog the spec's image artifact decides
    /// the source (its catalog path, [`Source::Image`]); this is then used
    /// only for a checkpoint artifact, whose approval carries no path.
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

    /// The worker spec of a machine this controller creates here for
    /// `artifact`, `profile` and `network` (C12.4), ports, mounts and
    /// workload none. With a catalog: from the catalog's path of the image
    /// artifact (so the source follows the spec, and thus its
    /// fingerprint), sized by the catalog's revision (CPUs, memory, and
    /// storage and overlay at least the floor's); a checkpoint artifact
    /// from its approval's worker path (C11.1). Without one (a development entry): the worker's default sizes, from
    /// [`Self::machine_source`]. The spec's network policy either way.
    ///
    /// # Errors
    /// `validation` (operation `machine_spec`) for a network policy the
    /// worker spec refuses (C9.1); `unsupported_capability` (operation
    /// `create`) when the catalog no longer holds the image, approval or
    /// revision.
    /// Both not dispatched.
    pub(crate) fn create_spec(
        &self,
        artifact: &ArtifactRef,
        profile: &ProfileRef,
        network: Option<&ProfileNetwork>,
    ) -> Result<MachineSpec, Error> {
        let mut spec = MachineSpec {
            network: network_policy(network)?,
            source: self.machine_source.clone().unwrap_or(Source::Bare),
            ..MachineSpec::default()
        };
        let Some(c) = &self.catalog else {
            return Ok(spec);
        };
        let no = |reason| Error::unsupported_capability(Operation::Create, reason);
        let rev = c
            .revision(profile)
            .ok_or_else(|| no(Reason::ProfileNotInCatalog))?;
        let (storage_gb, overlay_gb) = c.floor.disks(rev);
        spec.cpus = u8::try_from(rev.cpus).unwrap_or(u8::MAX);
        spec.memory_mb = rev.memory_mb;
        spec.storage_gb = storage_gb;
        spec.overlay_gb = overlay_gb;
        spec.source = match artifact.kind {
            ArtifactKind::Image => Source::Image {
                path: c
                    .image(artifact)
                    .ok_or_else(|| no(Reason::ArtifactNotInCatalog))?
                    .path
                    .clone(),
            },
            // C11.1: the approval's worker path (offline, no ports,
            // mounts or workload: the worker spec's own check).
            ArtifactKind::Checkpoint => Source::Checkpoint {
                path: c
                    .checkpoint(artifact)
                    .ok_or_else(|| no(Reason::ArtifactNotInCatalog))?
                    .path
                    .clone(),
            },
        };
        Ok(spec)
    }

    /// What a machine for `profile` reserves here (C12.4): with a catalog,
    /// `{slots 1, cpus, memory + host overhead, storage + overlay}` of its
    /// revision with the floor applied ([`Floor::reservation`]); else
    /// `default` (the C12.3 defaults a development entry creates).
    ///
    /// [`Floor::reservation`]: crate::managed::catalog::Floor::reservation
    pub(crate) fn reservation(&self, profile: &ProfileRef, default: Resources) -> Resources {
        self.catalog
            .as_ref()
            .and_then(|c| Some(c.floor.reservation(c.revision(profile)?)))
            .unwrap_or(default)
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

    /// Whether this worker may create a machine for `artifact`, `profile`
    /// and `network`: it has an admitted version profile that allows the
    /// network policy (an allowlist needs [`Feature::NetworkPolicy`],
    /// C9.1) and, with a catalog, the catalog supports the artifact and
    /// profile (C12.4).
    ///
    /// # Errors
    /// `unsupported_capability`: `disposable_machines` without a version
    /// profile, `network_policy_not_in_version`, else the catalog's
    /// refusal ([`Catalog::supports`]).
    pub fn can_create(
        &self,
        artifact: &ArtifactRef,
        profile: &ProfileRef,
        network: Option<&ProfileNetwork>,
    ) -> Result<(), Error> {
        let no = |reason| Err(Error::unsupported_capability(Operation::Submit, reason));
        let Some(version) = &self.profile else {
            return no(Reason::DisposableMachines);
        };
        if network.is_some() && !version.allows(Feature::NetworkPolicy) {
            return no(Reason::NetworkPolicyNotInVersion);
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

impl ControllerConfig {
    /// The worker a new disposable execution or retained machine of
    /// `artifact`, `profile` and `network` goes to: the first configured
    /// worker that [`WorkerEntry::can_create`] them (C12.4).
    ///
    /// # Errors
    /// `unsupported_capability`: the first candidate's refusal
    /// (`disposable_machines` when no worker has a version profile).
    pub fn creating_worker(
        &self,
        artifact: &ArtifactRef,
        profile: &ProfileRef,
        network: Option<&ProfileNetwork>,
    ) -> Result<&WorkerEntry, Error> {
        let mut first = None;
        for w in &self.workers {
            match w.can_create(artifact, profile, network) {
                Ok(()) => return Ok(w),
                Err(e) if w.profile.is_some() => {
                    first.get_or_insert(e);
                }
                Err(_) => {}
            }
        }
        Err(first.unwrap_or_else(|| {
            Error::unsupported_capability(Operation::Submit, Reason::DisposableMachines)
        }))
    }
}

/// The worker network policy of a spec's (C9.1): absent is offline; each
/// allowed entry with a `/` is a CIDR, any other a hostname.
///
/// # Errors
/// `validation` (operation `machine_spec`): an entry that is neither, an
/// empty list, duplicates or more than 32 of either.
pub(crate) fn network_policy(network: Option<&ProfileNetwork>) -> Result<NetworkPolicy, Error> {
    let Some(n) = network else {
        return Ok(NetworkPolicy::Offline);
    };
    let (mut hosts, mut cidrs) = (Vec::new(), Vec::new());
    for a in &n.allow {
        if a.contains('/') {
            cidrs.push(Cidr::new(a)?);
        } else {
            hosts.push(Hostname::new(a)?);
        }
    }
    NetworkPolicy::allowlist(hosts, cidrs)
}

impl ControllerConfig {
    /// [`Self::creating_worker`] at acceptance (C12.4), which also checks
    /// the spec's network policy against C9.1 before anything is stored.
    ///
    /// # Errors
    /// As [`Self::creating_worker`]; `validation` (operation `submit`)
    /// for a network policy C9.1 refuses.
    pub fn accepting_worker(
        &self,
        artifact: &ArtifactRef,
        profile: &ProfileRef,
        network: Option<&ProfileNetwork>,
    ) -> Result<&WorkerEntry, Error> {
        let w = self.creating_worker(artifact, profile, network)?;
        network_policy(network).map_err(|e| e.with_operation(Operation::Submit))?;
        if artifact.kind == ArtifactKind::Checkpoint && w.catalog.is_some() {
            // Created from the approved checkpoint (C11.1): offline, so
            // the create the worker spec would refuse is refused now.
            w.create_spec(artifact, profile, network)?
                .validate()
                .map_err(|e| e.with_operation(Operation::Submit))?;
        }
        Ok(w)
    }
}

impl super::Controller {
    /// Whether an unassigned disposable record is this controller's to
    /// drive: a configured worker may create it (C12.4); or none may (a
    /// later configuration's catalog or versions no longer hold it) and
    /// it can only end — a cancel was requested, or its queue deadline
    /// passed — so it is driven to `cancelled` or `expired` with
    /// `not_dispatched` (C13.4) and never prepared or dispatched
    /// ([`Exec::step_disposable`](super::exec::Exec)). Before that it is
    /// left due in the store, read once per poll interval.
    pub(super) fn creating_or_lapsed(&self, rec: &crate::managed::ExecutionRecord) -> bool {
        let s = &rec.spec;
        if self
            .cfg
            .creating_worker(&s.artifact, &s.profile, s.network.as_ref())
            .is_ok()
        {
            return true;
        }
        rec.state == crate::managed::state::ExecState::Accepted
            && (rec.cancel_requested_at_ms.is_some()
                || rec.deadlines.queue_ms.is_some_and(|q| self.now_ms >= q))
    }
}
