//! The simulated workers' catalog (split from `controller.rs`) and the
//! specs the simulation submits, all for one architecture: the host's
//! ([`Architecture::host`]) in every run, so a host of either architecture
//! runs the same workload (before session 9 the retained machine's spec
//! said `x86_64` whatever the host, and an aarch64 host's catalog left it
//! out).

use smolbox_core::managed::RetainedMachineSpec;
use smolbox_core::managed::catalog::{Architecture, Catalog, Platform, ProfileRevision};
use smolbox_core::managed::controller::RunTarget;
use smolbox_core::managed::testkit;

/// The architecture of every simulated worker: the host's.
pub(super) const SIM_ARCH: Architecture = Architecture::host();

/// The target of the simulation's commands on `arch`
/// (`RunTarget::unverified` with that architecture).
pub(super) fn command_target(arch: Architecture) -> RunTarget {
    let mut t = RunTarget::unverified();
    arch.as_str().clone_into(&mut t.artifact.architecture);
    t
}

/// The simulation's retained machine on `arch` (`testkit::machine_spec`
/// with that architecture).
pub(super) fn machine_spec(arch: Architecture) -> RetainedMachineSpec {
    let mut m = testkit::machine_spec();
    arch.as_str().clone_into(&mut m.artifact.architecture);
    m
}

/// A simulated worker's catalog on `arch` (C12.2): exactly the artifacts
/// and profile revisions of [`command_target`] and [`machine_spec`] on it,
/// so every submission passes the acceptance check of C12.4. 1.9.2 runs on
/// Linux x86_64 or macOS aarch64 only.
pub(super) fn catalog(arch: Architecture) -> Catalog {
    let t = command_target(arch);
    let platform = match arch {
        Architecture::Aarch64 => Platform::Macos,
        Architecture::X86_64 => Platform::Linux,
    };
    let c = Catalog::holding(platform, &t.artifact, &t.profile, "/images/sim.smolmachine");
    let m = machine_spec(arch);
    let mut r = ProfileRevision::new(&m.profile.id);
    r.budgets = m.profile.budgets;
    r.per_file_max = m.profile.per_file_max;
    c.with_image(&m.artifact.id, &m.artifact.sha256, "/images/m.smolmachine")
        .with_profile(r)
}

/// The catalog every simulated worker gets: the host's architecture.
pub(super) fn sim_catalog() -> Catalog {
    catalog(SIM_ARCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On either architecture the catalog is valid and accepts both the
    /// command target and the retained machine of that architecture, and
    /// refuses those of the other (so a spec whose architecture is fixed
    /// while the catalog follows the host is found on every host).
    #[test]
    fn the_catalog_accepts_the_sims_specs_on_either_architecture() {
        for arch in [Architecture::Aarch64, Architecture::X86_64] {
            let c = catalog(arch);
            let version = smolbox_core::managed::catalog::ANY_PLATFORM_VERSION;
            assert!(c.validate(Some(version)).is_ok(), "{arch:?}");
            let t = command_target(arch);
            let m = machine_spec(arch);
            assert!(c.supports(&t.artifact, &t.profile).is_ok(), "{arch:?}");
            assert!(
                c.supports(&m.artifact, &m.profile).is_ok(),
                "{arch:?}: the retained machine is left out of the catalog"
            );
            let other = match arch {
                Architecture::X86_64 => Architecture::Aarch64,
                Architecture::Aarch64 => Architecture::X86_64,
            };
            let m = machine_spec(other);
            assert!(c.supports(&m.artifact, &m.profile).is_err(), "{arch:?}");
        }
    }

    /// The run's own catalog and specs are the host's.
    #[test]
    fn the_run_uses_the_hosts_architecture() {
        let c = sim_catalog();
        let (t, m) = (command_target(SIM_ARCH), machine_spec(SIM_ARCH));
        assert_eq!(t.artifact.architecture, Architecture::host().as_str());
        assert_eq!(m.artifact.architecture, Architecture::host().as_str());
        assert!(c.supports(&t.artifact, &t.profile).is_ok());
        assert!(c.supports(&m.artifact, &m.profile).is_ok());
    }
}
