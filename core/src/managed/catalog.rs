//! A worker's catalog (C12.2): its platform, the image artifacts and
//! checkpoints it may boot, the profile revisions it runs (C12.3) and its
//! allocation floor; and the acceptance check of C12.4 against it.
//!
//! Sans-IO data with [`Catalog::validate`] (every range of C12.2 and
//! C12.3, `validation`) and [`Catalog::supports`] (the exact artifact and
//! the exact profile revision, the floor fits, not draining;
//! `unsupported_capability`). The controller attaches a catalog to a
//! [`WorkerEntry`](super::controller::WorkerEntry); see
//! docs/decisions/runtime.md, "Worker catalogs", for what an entry without
//! one means.

use std::collections::BTreeSet;

use super::record::Resources;
use super::spec::{ArtifactKind, ArtifactRef, ProfileBudgets, ProfileRef};
use super::{check_digest, check_identifier};
use crate::{Error, Operation, Reason};

/// Most image artifacts in one catalog (C12.2).
pub const MAX_IMAGES: usize = 32;
/// Most checkpoint approvals in one catalog (C12.2).
pub const MAX_CHECKPOINTS: usize = 32;
/// Most profile revisions in one catalog (C12.2).
pub const MAX_PROFILES: usize = 32;
/// The runtime version allowed on every platform × architecture (C12.2).
pub const ANY_PLATFORM_VERSION: &str = "1.14.1";

/// The worker's host platform (C12.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// Linux.
    Linux,
    /// macOS (aarch64 only).
    Macos,
}

/// A machine architecture (C12.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `x86_64`.
    X86_64,
    /// `aarch64`.
    Aarch64,
}

impl Architecture {
    /// The text an [`ArtifactRef`] carries.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::X86_64 => "x86_64",
            Self::Aarch64 => "aarch64",
        }
    }

    /// The architecture this library was built for (`aarch64`, else
    /// `x86_64`).
    pub const fn host() -> Self {
        if cfg!(target_arch = "aarch64") {
            Self::Aarch64
        } else {
            Self::X86_64
        }
    }
}

/// An image artifact the worker may boot: exactly `{id, sha256,
/// architecture, path}` (C12.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageArtifact {
    /// Catalog identifier (unique in the catalog).
    pub id: String,
    /// SHA-256, 64 lowercase hex characters.
    pub sha256: String,
    /// Must be the worker's architecture.
    pub architecture: Architecture,
    /// Absolute path on the worker host ending `.smolmachine`.
    pub path: String,
}

/// An approved checkpoint (C12.2, C11.1): referenced with `kind:
/// checkpoint`; the machines created for it boot from `path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointApproval {
    /// Catalog identifier (unique among approvals).
    pub id: String,
    /// SHA-256, 64 lowercase hex characters.
    pub sha256: String,
    /// Absolute path on the worker host ending `.smolcheckpoint` or
    /// `.checkpoint` (C11.1's worker path).
    pub path: String,
}

/// A profile as an immutable revision (C12.3). [`ProfileRevision::new`]
/// gives the defaults; [`ProfileRevision::validate`] checks the ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileRevision {
    /// Revision identifier (unique in the catalog).
    pub id: String,
    /// Guest CPUs (1–64).
    pub cpus: u32,
    /// Guest memory MiB (128–16,384).
    pub memory_mb: u32,
    /// Storage GiB (1–64).
    pub storage_gb: u32,
    /// Overlay GiB (1–64).
    pub overlay_gb: u32,
    /// Host overhead MiB (128–16,384).
    pub host_overhead_mb: u32,
    /// Output allowance bytes (1–8,388,608).
    pub output_allowance: u64,
    /// Per-file bytes (1–16,777,216).
    pub per_file_max: u64,
    /// Per-direction aggregate bytes (1–67,108,864, ≥ per-file).
    pub per_direction_max: u64,
    /// Preparation, execution, collection and cleanup budgets (ms).
    pub budgets: ProfileBudgets,
}

impl ProfileRevision {
    /// The defaults of C12.3 under `id`.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            cpus: 1,
            memory_mb: 256,
            storage_gb: 1,
            overlay_gb: 1,
            host_overhead_mb: 256,
            output_allowance: 1_048_576,
            per_file_max: 1_048_576,
            per_direction_max: 4_194_304,
            budgets: ProfileBudgets::DEFAULT,
        }
    }

    /// The reference a spec carries for this revision (C12.4): a spec
    /// names it exactly when its [`ProfileRef`] equals this.
    pub fn reference(&self) -> ProfileRef {
        ProfileRef {
            id: self.id.clone(),
            budgets: self.budgets,
            per_file_max: self.per_file_max,
        }
    }

    /// Checks every range of C12.3.
    ///
    /// # Errors
    /// `validation` (operation `config`), reason `profile_id` or
    /// `profile_range` with the offending value and its bound.
    pub fn validate(&self) -> Result<(), Error> {
        if check_identifier(&self.id).is_err() {
            return Err(Error::validation(Operation::Config, Reason::ProfileId));
        }
        let b = &self.budgets;
        let checks: [(u64, u64, u64); 13] = [
            (self.cpus.into(), 1, 64),
            (self.memory_mb.into(), 128, 16_384),
            (self.storage_gb.into(), 1, 64),
            (self.overlay_gb.into(), 1, 64),
            (self.host_overhead_mb.into(), 128, 16_384),
            (self.output_allowance, 1, 8_388_608),
            (self.per_file_max, 1, 16_777_216),
            (self.per_direction_max, 1, 67_108_864),
            (self.per_direction_max, self.per_file_max, u64::MAX),
            (b.preparation_ms, 1_000, 300_000),
            (b.execution_ms, 1_000, 86_460_000),
            (b.collection_ms, 1_000, 300_000),
            (b.cleanup_ms, 1_000, 300_000),
        ];
        for (value, min, max) in checks {
            if !(min..=max).contains(&value) {
                let bound = if value < min { min } else { max };
                return Err(Error::validation(Operation::Config, Reason::ProfileRange)
                    .with_limit(value, bound));
            }
        }
        Ok(())
    }
}

/// The allocation floor (C12.2; required, no default): profiles below it
/// are unsupported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floor {
    /// Storage GiB (1–64).
    pub storage_gb: u32,
    /// Overlay GiB (1–64).
    pub overlay_gb: u32,
    /// Host overhead MiB (128–16,384).
    pub host_overhead_mb: u32,
}

impl Floor {
    fn validate(self) -> Result<(), Error> {
        let checks: [(u32, u32, u32); 3] = [
            (self.storage_gb, 1, 64),
            (self.overlay_gb, 1, 64),
            (self.host_overhead_mb, 128, 16_384),
        ];
        for (value, min, max) in checks {
            if !(min..=max).contains(&value) {
                let bound = if value < min { min } else { max };
                return Err(Error::validation(Operation::Config, Reason::CatalogFloor)
                    .with_limit(value.into(), bound.into()));
            }
        }
        Ok(())
    }

    /// True when `p` is at or above the floor in every dimension.
    pub fn fits(self, p: &ProfileRevision) -> bool {
        p.storage_gb >= self.storage_gb
            && p.overlay_gb >= self.overlay_gb
            && p.host_overhead_mb >= self.host_overhead_mb
    }

    /// What a machine of `p` reserves on its worker (C12.4): `{slots 1,
    /// cpus, memory + host overhead, storage + overlay}`, each of storage,
    /// overlay and host overhead at least the floor's. (A revision below
    /// the floor is refused at acceptance; the floor is applied here too
    /// so that no reservation is ever smaller than it.)
    pub fn reservation(self, p: &ProfileRevision) -> Resources {
        let (storage, overlay) = self.disks(p);
        Resources {
            slots: 1,
            cpus: p.cpus.into(),
            memory_mb: u64::from(p.memory_mb)
                + u64::from(p.host_overhead_mb.max(self.host_overhead_mb)),
            disk_gb: u64::from(storage) + u64::from(overlay),
        }
    }

    /// The storage and overlay GiB a machine of `p` is created with: the
    /// revision's, at least the floor's.
    pub fn disks(self, p: &ProfileRevision) -> (u32, u32) {
        (
            p.storage_gb.max(self.storage_gb),
            p.overlay_gb.max(self.overlay_gb),
        )
    }
}

/// One worker's catalog (C12.2). Build it with [`Catalog::new`] and the
/// `with_*` methods; [`Catalog::validate`] checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Catalog {
    /// Host platform.
    pub platform: Platform,
    /// Host (and machine) architecture.
    pub architecture: Architecture,
    /// Image artifacts (0–32, unique ids).
    pub images: Vec<ImageArtifact>,
    /// Checkpoint approvals (≤32, unique ids).
    pub checkpoints: Vec<CheckpointApproval>,
    /// Profile revisions (1–32, unique ids).
    pub profiles: Vec<ProfileRevision>,
    /// Allocation floor.
    pub floor: Floor,
    /// Static draining flag (default false): a draining worker accepts
    /// nothing new.
    pub draining: bool,
}

impl Catalog {
    /// An empty catalog (no artifacts, no profiles: not yet valid).
    pub fn new(platform: Platform, architecture: Architecture, floor: Floor) -> Self {
        Self {
            platform,
            architecture,
            images: Vec::new(),
            checkpoints: Vec::new(),
            profiles: Vec::new(),
            floor,
            draining: false,
        }
    }

    /// The smallest valid catalog holding exactly `artifact` (an image or
    /// a checkpoint approval at `path`) and one revision of `profile` (its
    /// budgets and per-file size; the other fields C12.3's defaults), on
    /// `platform` and the artifact's architecture, with the lowest floor.
    /// For a worker that runs one known target (tests, examples).
    pub fn holding(
        platform: Platform,
        artifact: &ArtifactRef,
        profile: &ProfileRef,
        path: &str,
    ) -> Self {
        let architecture = if artifact.architecture == "aarch64" {
            Architecture::Aarch64
        } else {
            Architecture::X86_64
        };
        let floor = Floor {
            storage_gb: 1,
            overlay_gb: 1,
            host_overhead_mb: 128,
        };
        let mut revision = ProfileRevision::new(&profile.id);
        revision.budgets = profile.budgets;
        revision.per_file_max = profile.per_file_max;
        revision.per_direction_max = revision.per_direction_max.max(profile.per_file_max);
        let c = Self::new(platform, architecture, floor).with_profile(revision);
        match artifact.kind {
            ArtifactKind::Image => c.with_image(&artifact.id, &artifact.sha256, path),
            ArtifactKind::Checkpoint => c.with_checkpoint(&artifact.id, &artifact.sha256, path),
        }
    }

    /// Adds an image artifact of the catalog's architecture.
    #[must_use]
    pub fn with_image(mut self, id: &str, sha256: &str, path: &str) -> Self {
        self.images.push(ImageArtifact {
            id: id.to_owned(),
            sha256: sha256.to_owned(),
            architecture: self.architecture,
            path: path.to_owned(),
        });
        self
    }

    /// Adds a checkpoint approval whose worker path is `path`.
    #[must_use]
    pub fn with_checkpoint(mut self, id: &str, sha256: &str, path: &str) -> Self {
        self.checkpoints.push(CheckpointApproval {
            id: id.to_owned(),
            sha256: sha256.to_owned(),
            path: path.to_owned(),
        });
        self
    }

    /// Adds a profile revision.
    #[must_use]
    pub fn with_profile(mut self, profile: ProfileRevision) -> Self {
        self.profiles.push(profile);
        self
    }

    /// Sets the static draining flag.
    #[must_use]
    pub fn draining(mut self, draining: bool) -> Self {
        self.draining = draining;
        self
    }

    /// Checks every rule of C12.2 (and C12.3 for each profile);
    /// `runtime_version` is the worker's admitted version text, when known
    /// (runtime × platform rule).
    ///
    /// # Errors
    /// `validation` (operation `config`) naming the first broken rule.
    pub fn validate(&self, runtime_version: Option<&str>) -> Result<(), Error> {
        let bad = |reason| Err(Error::validation(Operation::Config, reason));
        let (p, a) = (self.platform, self.architecture);
        if p == Platform::Macos && a != Architecture::Aarch64 {
            return bad(Reason::CatalogPlatform);
        }
        if let Some(v) = runtime_version
            && v != ANY_PLATFORM_VERSION
            && !matches!(
                (p, a),
                (Platform::Linux, Architecture::X86_64) | (Platform::Macos, Architecture::Aarch64)
            )
        {
            return bad(Reason::CatalogPlatform);
        }
        if self.images.len() > MAX_IMAGES {
            return Err(Error::validation(Operation::Config, Reason::CatalogImages)
                .with_limit(self.images.len() as u64, MAX_IMAGES as u64));
        }
        if self.checkpoints.len() > MAX_CHECKPOINTS {
            return Err(
                Error::validation(Operation::Config, Reason::CatalogCheckpoints)
                    .with_limit(self.checkpoints.len() as u64, MAX_CHECKPOINTS as u64),
            );
        }
        if self.images.is_empty() && self.checkpoints.is_empty() {
            return bad(Reason::CatalogNoArtifact);
        }
        let mut ids = BTreeSet::new();
        for i in &self.images {
            if check_identifier(&i.id).is_err() || check_digest(&i.sha256).is_err() {
                return bad(Reason::CatalogImage);
            }
            if !worker_file(&i.path, &[".smolmachine"]) {
                return bad(Reason::CatalogImagePath);
            }
            if i.architecture != a {
                return bad(Reason::CatalogImageArchitecture);
            }
            if !ids.insert(i.id.as_str()) {
                return bad(Reason::CatalogDuplicate);
            }
        }
        let mut ids = BTreeSet::new();
        for c in &self.checkpoints {
            if check_identifier(&c.id).is_err() || check_digest(&c.sha256).is_err() {
                return bad(Reason::CatalogImage);
            }
            if !worker_file(&c.path, &[".smolcheckpoint", ".checkpoint"]) {
                return bad(Reason::CatalogCheckpointPath);
            }
            if !ids.insert(c.id.as_str()) {
                return bad(Reason::CatalogDuplicate);
            }
        }
        if !(1..=MAX_PROFILES).contains(&self.profiles.len()) {
            return Err(
                Error::validation(Operation::Config, Reason::CatalogProfiles)
                    .with_limit(self.profiles.len() as u64, MAX_PROFILES as u64),
            );
        }
        let mut ids = BTreeSet::new();
        for p in &self.profiles {
            p.validate()?;
            if !ids.insert(p.id.as_str()) {
                return bad(Reason::CatalogDuplicate);
            }
        }
        self.floor.validate()
    }

    /// The acceptance check of C12.4: not draining, the exact artifact
    /// (id, digest and architecture; a checkpoint by its approval) and the
    /// exact profile revision, at or above the floor.
    ///
    /// # Errors
    /// `unsupported_capability` (operation `submit`): `worker_draining`,
    /// `artifact_not_in_catalog`, `profile_not_in_catalog` or
    /// `profile_below_floor`.
    pub fn supports(&self, artifact: &ArtifactRef, profile: &ProfileRef) -> Result<(), Error> {
        let no = |reason| Err(Error::unsupported_capability(Operation::Submit, reason));
        if self.draining {
            return no(Reason::WorkerDraining);
        }
        let arch = artifact.architecture == self.architecture.as_str();
        let found = match artifact.kind {
            ArtifactKind::Image => self
                .images
                .iter()
                .any(|i| i.id == artifact.id && i.sha256 == artifact.sha256),
            ArtifactKind::Checkpoint => self
                .checkpoints
                .iter()
                .any(|c| c.id == artifact.id && c.sha256 == artifact.sha256),
        };
        if !(arch && found) {
            return no(Reason::ArtifactNotInCatalog);
        }
        let Some(rev) = self.revision(profile) else {
            return no(Reason::ProfileNotInCatalog);
        };
        if !self.floor.fits(rev) {
            return no(Reason::ProfileBelowFloor);
        }
        Ok(())
    }

    /// The revision `profile` names exactly (same id, budgets and per-file
    /// size), if the catalog holds it.
    pub fn revision(&self, profile: &ProfileRef) -> Option<&ProfileRevision> {
        self.profiles.iter().find(|p| p.reference() == *profile)
    }

    /// The image artifact `artifact` names exactly (an image reference of
    /// the catalog's architecture with the same id and digest): its path
    /// is the source of the machines created for it (C12.2).
    pub fn image(&self, artifact: &ArtifactRef) -> Option<&ImageArtifact> {
        if artifact.kind != ArtifactKind::Image
            || artifact.architecture != self.architecture.as_str()
        {
            return None;
        }
        self.images
            .iter()
            .find(|i| i.id == artifact.id && i.sha256 == artifact.sha256)
    }

    /// The checkpoint approval `artifact` names exactly (a checkpoint
    /// reference of the catalog's architecture with the same id and
    /// digest): its path is the source of the machines created for it.
    pub fn checkpoint(&self, artifact: &ArtifactRef) -> Option<&CheckpointApproval> {
        if artifact.kind != ArtifactKind::Checkpoint
            || artifact.architecture != self.architecture.as_str()
        {
            return None;
        }
        self.checkpoints
            .iter()
            .find(|c| c.id == artifact.id && c.sha256 == artifact.sha256)
    }
}

/// An absolute worker-host path with a file name before one of
/// `suffixes`, no `..` component and no control character.
fn worker_file(path: &str, suffixes: &[&str]) -> bool {
    path.starts_with('/')
        && suffixes
            .iter()
            .any(|x| path.ends_with(x) && path.len() > x.len() + 1)
        && !path.split('/').any(|c| c == "..")
        && !path.bytes().any(|c| c.is_ascii_control())
}

#[cfg(test)]
mod tests;
