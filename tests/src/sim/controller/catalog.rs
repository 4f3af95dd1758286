//! The simulated workers' catalog (split from `controller.rs`).

use smolbox_core::managed::controller::RunTarget;
use smolbox_core::managed::testkit;

/// Each simulated worker's catalog (C12.2): exactly the artifacts and
/// profile revisions of the sim's specs (`RunTarget::unverified` for
/// commands, `testkit::machine_spec` for retained machines), so every
/// submission passes the acceptance check of C12.4. 1.9.2 runs on Linux
/// x86_64 or macOS aarch64 only.
pub(super) fn sim_catalog() -> smolbox_core::managed::catalog::Catalog {
    use smolbox_core::managed::catalog::{Catalog, Platform, ProfileRevision};
    let t = RunTarget::unverified();
    let platform = if t.artifact.architecture == "aarch64" {
        Platform::Macos
    } else {
        Platform::Linux
    };
    let mut c = Catalog::holding(platform, &t.artifact, &t.profile, "/images/sim.smolmachine");
    let m = testkit::machine_spec();
    if m.artifact.architecture == t.artifact.architecture {
        let mut r = ProfileRevision::new(&m.profile.id);
        r.budgets = m.profile.budgets;
        r.per_file_max = m.profile.per_file_max;
        c = c
            .with_image(&m.artifact.id, &m.artifact.sha256, "/images/m.smolmachine")
            .with_profile(r);
    }
    c
}
