//! Low-level host mounts (features C10.1).

use crate::Reason;
use crate::error::{Error, Operation};

/// Most mounts per machine.
pub const MAX_MOUNTS: usize = 8;
/// Shortest mount path in bytes.
pub const MIN_MOUNT_PATH_LEN: usize = 2;
/// Longest mount path in bytes.
pub const MAX_MOUNT_PATH_LEN: usize = 4_096;
/// Every mount target lives under this directory.
pub const MOUNT_TARGET_ROOT: &str = "/mnt/volumes/";

/// A host directory mounted into the guest: `{source, target, readonly}`.
/// Paths are absolute, 2–4,096 bytes, without NUL, `\`, `//`, a trailing
/// `/`, or `.`/`..` segments; the target is under `/mnt/volumes/`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mount {
    target: Box<str>,
    source: Box<str>,
    readonly: bool,
}

impl Mount {
    /// Validates a mount.
    ///
    /// # Errors
    /// `validation`, operation `machine_spec`, reason `invalid_mount_source`
    /// or `invalid_mount_target`.
    pub fn new(source: &str, target: &str, readonly: bool) -> Result<Self, Error> {
        if !is_mount_path(source) {
            return Err(Error::validation(
                Operation::MachineSpec,
                Reason::InvalidMountSource,
            ));
        }
        if !is_mount_path(target) || !target.starts_with(MOUNT_TARGET_ROOT) {
            return Err(Error::validation(
                Operation::MachineSpec,
                Reason::InvalidMountTarget,
            ));
        }
        Ok(Self {
            target: target.into(),
            source: source.into(),
            readonly,
        })
    }

    /// A mount as a worker reply reports it (not held to the request rules).
    pub(crate) fn observed(source: &str, target: &str, readonly: bool) -> Self {
        Self {
            target: target.into(),
            source: source.into(),
            readonly,
        }
    }

    /// The host path.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The guest path.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// True when read-only.
    pub const fn readonly(&self) -> bool {
        self.readonly
    }
}

fn is_mount_path(p: &str) -> bool {
    (MIN_MOUNT_PATH_LEN..=MAX_MOUNT_PATH_LEN).contains(&p.len())
        && p.starts_with('/')
        && !p.ends_with('/')
        && !p.contains(['\0', '\\'])
        && p[1..]
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

/// Sorts mounts by target, checks ≤8 and that no target contains another.
///
/// # Errors
/// `validation`, operation `machine_spec`.
pub fn canonical_mounts(mut mounts: Vec<Mount>) -> Result<Vec<Mount>, Error> {
    if mounts.len() > MAX_MOUNTS {
        return Err(
            Error::validation(Operation::MachineSpec, Reason::TooManyMounts)
                .with_limit(mounts.len() as u64, MAX_MOUNTS as u64),
        );
    }
    mounts.sort();
    let overlaps = mounts.windows(2).any(|w| {
        let (a, b) = (&*w[0].target, &*w[1].target);
        a == b || b.strip_prefix(a).is_some_and(|rest| rest.starts_with('/'))
    });
    if overlaps {
        return Err(Error::validation(
            Operation::MachineSpec,
            Reason::OverlappingMountTargets,
        ));
    }
    Ok(mounts)
}
