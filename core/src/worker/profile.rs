//! Version profiles (DESIGN.md §6, features C0.3, worker-api.md §12).
//!
//! A worker is admitted only when the `version` its `/health` reports
//! *equals* a known profile's (or one the caller supplies): no range
//! comparison, no fallback. A profile says which features are allowed and
//! which spellings the worker uses. A gated operation against a version
//! without the feature fails `unsupported_capability` / `not_dispatched`
//! before anything is sent.
//!
//! 1.9.2 (the contract measured live) is read through its own spellings:
//! `forkable` and `/fork` for `branchable` and `/branches`, no bearer check,
//! no `staged` on mounts, no `image`/`branchable` in machine replies. Only
//! the features whose routes and fields exist there are allowed: not
//! checkpoint creation or capture (absent), not extended exec (the 300 s
//! timeout answers 408, and the image-machine proof needs fields 1.9.2 does
//! not return), not large or out-of-root files (same proof).

use super::HealthReply;
use crate::Reason;
use crate::error::{Error, Evidence, Operation};

/// A worker version this library has a profile for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Version {
    /// 1.9.2, measured live (worker-api.md).
    V1_9_2,
    /// 1.14.1
    V1_14_1,
    /// 1.14.6
    V1_14_6,
    /// 1.16.0
    V1_16_0,
    /// 1.16.1
    V1_16_1,
    /// 1.17.0
    V1_17_0,
    /// 1.19.0
    V1_19_0,
    /// 1.20.2
    V1_20_2,
    /// 1.22.0 (the default target of this release).
    V1_22_0,
}

impl Version {
    /// Every known version, oldest first.
    pub const ALL: [Self; 9] = [
        Self::V1_9_2,
        Self::V1_14_1,
        Self::V1_14_6,
        Self::V1_16_0,
        Self::V1_16_1,
        Self::V1_17_0,
        Self::V1_19_0,
        Self::V1_20_2,
        Self::V1_22_0,
    ];

    /// The default configured version of this library release (C0.3).
    pub const DEFAULT: Self = Self::V1_22_0;

    /// The version text `/health` reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::V1_9_2 => "1.9.2",
            Self::V1_14_1 => "1.14.1",
            Self::V1_14_6 => "1.14.6",
            Self::V1_16_0 => "1.16.0",
            Self::V1_16_1 => "1.16.1",
            Self::V1_17_0 => "1.17.0",
            Self::V1_19_0 => "1.19.0",
            Self::V1_20_2 => "1.20.2",
            Self::V1_22_0 => "1.22.0",
        }
    }

    /// The known version whose text equals `text` exactly.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == text)
    }
}

/// A gated capability (the feature table of C0.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// Outbound network allowlists (C9.1). From 1.16.0.
    NetworkPolicy,
    /// Create from an approved checkpoint (C11.1). From 1.16.1.
    CheckpointCreate,
    /// Port mappings (C9.2). From 1.17.0.
    PortMappings,
    /// Startup workload (C8.1). From 1.17.0.
    StartupWorkload,
    /// Extended exec: > 300 s, background, non-default workdir (C5.4). From 1.17.0.
    ExtendedExec,
    /// Files > 1 MiB or outside the default root (C6.1). From 1.17.0.
    LargeFiles,
    /// Console logs (C8.2). From 1.17.0.
    ConsoleLogs,
    /// Interactive terminals (C7). From 1.17.0.
    Terminals,
    /// Registry and OCI machine sources (C3.2). From 1.19.0.
    RegistrySources,
    /// Image pull and list. From 1.19.0.
    Images,
    /// Export. From 1.19.0.
    Export,
    /// Checkpoint capture. From 1.19.0.
    CheckpointCapture,
    /// Branches (`/fork` in 1.9.2). From 1.19.0.
    Branches,
    /// Disk growth (resize). From 1.20.2.
    DiskGrowth,
    /// Host mounts (C10.1). From 1.20.2.
    HostMounts,
    /// Node-local volumes (C10.2). From 1.20.2.
    Volumes,
}

impl Feature {
    /// Every feature.
    pub const ALL: [Self; 16] = [
        Self::NetworkPolicy,
        Self::CheckpointCreate,
        Self::PortMappings,
        Self::StartupWorkload,
        Self::ExtendedExec,
        Self::LargeFiles,
        Self::ConsoleLogs,
        Self::Terminals,
        Self::RegistrySources,
        Self::Images,
        Self::Export,
        Self::CheckpointCapture,
        Self::Branches,
        Self::DiskGrowth,
        Self::HostMounts,
        Self::Volumes,
    ];

    /// The oldest of the later (1.14.1+) versions that has the feature.
    pub const fn minimum(self) -> Version {
        match self {
            Self::NetworkPolicy => Version::V1_16_0,
            Self::CheckpointCreate => Version::V1_16_1,
            Self::PortMappings
            | Self::StartupWorkload
            | Self::ExtendedExec
            | Self::LargeFiles
            | Self::ConsoleLogs
            | Self::Terminals => Version::V1_17_0,
            Self::RegistrySources
            | Self::Images
            | Self::Export
            | Self::CheckpointCapture
            | Self::Branches => Version::V1_19_0,
            Self::DiskGrowth | Self::HostMounts | Self::Volumes => Version::V1_20_2,
        }
    }

    /// Whether the measured 1.9.2 contract has the routes and fields.
    const fn in_1_9_2(self) -> bool {
        !matches!(
            self,
            Self::CheckpointCreate
                | Self::CheckpointCapture
                | Self::ExtendedExec
                | Self::LargeFiles
        )
    }

    const fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// What one worker version offers: its exact version text, its allowed
/// features and its spellings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    version_text: Box<str>,
    base: Version,
    features: u32,
}

impl Profile {
    /// The profile of a known version.
    pub fn known(version: Version) -> Self {
        let features = Feature::ALL
            .into_iter()
            .filter(|f| {
                if version == Version::V1_9_2 {
                    f.in_1_9_2()
                } else {
                    version >= f.minimum()
                }
            })
            .fold(0, |acc, f| acc | f.bit());
        Self {
            version_text: version.as_str().into(),
            base: version,
            features,
        }
    }

    /// A caller-supplied profile: a worker reporting exactly `version_text`
    /// is treated as `base` (same routes, fields, spellings and features).
    ///
    /// # Errors
    /// `validation` (operation `config`) when `version_text` is not
    /// semver-shaped text of at most 64 bytes.
    pub fn custom(version_text: &str, base: Version) -> Result<Self, Error> {
        if !super::node::is_semver(version_text) {
            return Err(Error::validation(
                Operation::Config,
                Reason::InvalidProfileVersion,
            ));
        }
        Ok(Self {
            version_text: version_text.into(),
            ..Self::known(base)
        })
    }

    /// A copy allowing only the features also in `allowed` (a caller may
    /// narrow a profile, never widen it).
    #[must_use]
    pub fn restricted_to(&self, allowed: &[Feature]) -> Self {
        let mask = allowed.iter().fold(0, |acc, f| acc | f.bit());
        Self {
            features: self.features & mask,
            ..self.clone()
        }
    }

    /// Admits a worker by the version its `/health` reported: exact equality
    /// with a known version, or with one of `supplied`.
    ///
    /// # Errors
    /// `unsupported_capability`, evidence `not_dispatched` (nothing beyond
    /// the health read was sent), reason `unknown_worker_version`.
    pub fn admit(reported: &str, supplied: &[Self]) -> Result<Self, Error> {
        if let Some(p) = supplied.iter().find(|p| &*p.version_text == reported) {
            return Ok(p.clone());
        }
        Version::parse(reported).map(Self::known).ok_or_else(|| {
            Error::unsupported_capability(Operation::Health, Reason::UnknownWorkerVersion)
        })
    }

    /// The verdict of the health preflight that precedes a gated call
    /// (C0.3): the reply's version admitted as by [`Profile::admit`] with
    /// no supplied profiles. The gated request is sent only after this
    /// returns `Ok`, so every refusal carries evidence `not_dispatched`,
    /// also when the health read itself failed in a way that leaves the
    /// read uncertain (a dropped connection, a 5xx): the read mutates
    /// nothing and the gated request never left this process.
    ///
    /// # Errors
    /// The health read's own error (category, reason and operation kept)
    /// with evidence `not_dispatched`; else as [`Profile::admit`].
    pub fn preflight(health: Result<HealthReply, Error>) -> Result<Self, Error> {
        let health = health.map_err(|e| e.with_evidence(Evidence::NotDispatched))?;
        Self::admit(&health.version, &[])
    }

    /// The exact version text this profile admits.
    pub fn version_text(&self) -> &str {
        &self.version_text
    }

    /// The known version whose contract this profile follows.
    pub const fn base(&self) -> Version {
        self.base
    }

    /// True when the feature is allowed.
    pub const fn allows(&self, feature: Feature) -> bool {
        self.features & feature.bit() != 0
    }

    /// Fails when the feature is not allowed on this version.
    ///
    /// # Errors
    /// `unsupported_capability`, evidence `not_dispatched`, on `operation`.
    pub const fn require(&self, feature: Feature, operation: Operation) -> Result<(), Error> {
        if self.allows(feature) {
            Ok(())
        } else {
            Err(Error::unsupported_capability(
                operation,
                Reason::FeatureNotInVersion,
            ))
        }
    }

    /// True for the 1.9.2 spellings: `forkable` / `/fork` instead of
    /// `branchable` / `/branches`.
    pub const fn uses_fork_spelling(&self) -> bool {
        matches!(self.base, Version::V1_9_2)
    }

    /// The start query key that launches a capture source
    /// (`branchable`, or `forkable` on 1.9.2).
    pub const fn branchable_key(&self) -> &'static str {
        if self.uses_fork_spelling() {
            "forkable"
        } else {
            "branchable"
        }
    }

    /// False when the worker itself never checks a bearer token (1.9.2: the
    /// header is ignored; only mTLS or local binding protect it).
    pub const fn checks_bearer(&self) -> bool {
        !self.uses_fork_spelling()
    }

    /// True when machine replies carry `staged` on every mount (1.20.2+).
    pub const fn mounts_carry_staged(&self) -> bool {
        matches!(self.base, Version::V1_20_2 | Version::V1_22_0)
    }

    /// True when machine replies carry `image` and `branchable` (later
    /// versions; 1.9.2 has neither).
    pub const fn replies_carry_image(&self) -> bool {
        !self.uses_fork_spelling()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Category;

    #[test]
    fn a_failed_health_preflight_is_not_dispatched_for_the_gated_call() {
        // A read left uncertain (the connection dropped mid-reply): the
        // gated request never left, so the verdict says not_dispatched,
        // keeping the read's category and operation.
        let uncertain = Error::transport(
            Operation::Health,
            Evidence::DispatchUncertain,
            crate::Reason::Closed,
        );
        let e = Profile::preflight(Err(uncertain)).unwrap_err();
        assert_eq!(e.evidence(), Evidence::NotDispatched);
        assert_eq!(e.category(), Category::Transport);
        assert_eq!(e.operation(), Operation::Health);
        // A known version is admitted; an unknown one refused unsent.
        let reply = |v: &str| HealthReply {
            version: v.into(),
            total: None,
            running: None,
            uptime_seconds: None,
        };
        assert_eq!(
            Profile::preflight(Ok(reply("1.22.0"))).unwrap().base(),
            Version::V1_22_0
        );
        let e = Profile::preflight(Ok(reply("1.21.1"))).unwrap_err();
        assert_eq!(e.category(), Category::UnsupportedCapability);
        assert_eq!(e.evidence(), Evidence::NotDispatched);
    }

    #[test]
    fn minimum_versions_follow_the_table() {
        let p = Profile::known(Version::V1_16_0);
        assert!(p.allows(Feature::NetworkPolicy));
        assert!(!p.allows(Feature::CheckpointCreate));
        assert!(Profile::known(Version::V1_16_1).allows(Feature::CheckpointCreate));
        assert!(!Profile::known(Version::V1_14_6).allows(Feature::NetworkPolicy));
        assert!(Profile::known(Version::V1_22_0).allows(Feature::Volumes));
        assert!(!Profile::known(Version::V1_19_0).allows(Feature::Volumes));
    }

    #[test]
    fn one_nine_two_has_its_own_set() {
        let p = Profile::known(Version::V1_9_2);
        assert!(p.uses_fork_spelling() && !p.checks_bearer());
        assert_eq!(p.branchable_key(), "forkable");
        assert!(p.allows(Feature::Branches) && p.allows(Feature::Volumes));
        assert!(!p.allows(Feature::CheckpointCreate) && !p.allows(Feature::ExtendedExec));
    }
}
