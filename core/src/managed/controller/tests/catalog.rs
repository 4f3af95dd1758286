//! The worker catalog at acceptance (C12.2, C12.4): a disposable
//! execution or a retained machine is accepted only by a configured,
//! non-draining worker whose catalog holds the exact artifact and profile
//! revision at or above its floor; otherwise `unsupported_capability`,
//! evidence `not_dispatched`, and nothing is stored or sent.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use super::machines::{mkey, mspec};
use super::*;
use crate::managed::catalog::{Architecture, Catalog, Floor, Platform, ProfileRevision};
use crate::{Evidence, Reason};

const ZERO: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// A catalog holding `RunTarget::unverified()`'s artifact and profile.
fn catalog() -> Catalog {
    let floor = Floor {
        storage_gb: 1,
        overlay_gb: 1,
        host_overhead_mb: 128,
    };
    Catalog::new(Platform::Linux, Architecture::host(), floor)
        .with_image("unverified", ZERO, "/images/unverified.smolmachine")
        .with_profile(ProfileRevision::new("default"))
}

fn with_catalog(catalog: Catalog) -> ControllerConfig {
    let mut c = disposable_config();
    let w = c.workers.remove(0);
    c.workers.push(w.with_catalog(catalog));
    c
}

fn refused(s: &mut Sim, spec: ExecutionSpec) -> Error {
    // The start-up scan first; then the submit must add no store op.
    s.settle();
    s.store_log.clear();
    let key = RecordKey::new("s", "refused").unwrap();
    let e = s
        .ctl
        .submit(s.now, s.now_ms, Submit { key, spec })
        .unwrap_err();
    s.settle();
    assert_eq!(e.category(), Category::UnsupportedCapability, "{e:?}");
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert!(
        s.store_log.iter().all(|op| op.name().starts_with("due")),
        "nothing stored: {:?}",
        s.store_log
    );
    assert!(s.store.records.is_empty());
    assert!(s.worker.is_empty(), "nothing sent");
    e
}

fn disposable_spec() -> ExecutionSpec {
    let mut spec = spec_for(&cmd(), &RunTarget::unverified(), WORKER, "x").unwrap();
    spec.worker_machine = None;
    spec
}

#[test]
fn a_catalog_with_the_exact_artifact_and_profile_accepts_and_creates() {
    let mut s = Sim::new(with_catalog(catalog()));
    let key = s.submit_disposable("ok", &cmd());
    s.settle();
    let rec = s.record(&key).clone();
    assert_eq!(rec.assignment.unwrap().worker_id, WORKER);
    assert!(s.worker.iter().any(|(_, op)| op.name() == "create"));
}

#[test]
fn an_artifact_not_in_the_catalog_is_refused_before_anything_is_stored() {
    let mut s = Sim::new(with_catalog(catalog()));
    let mut spec = disposable_spec();
    spec.artifact.sha256 = "1".repeat(64);
    assert_eq!(refused(&mut s, spec).reason(), Reason::ArtifactNotInCatalog);
}

#[test]
fn another_revision_of_the_profile_is_refused() {
    let mut s = Sim::new(with_catalog(catalog()));
    let mut spec = disposable_spec();
    spec.profile.budgets.cleanup_ms += 1;
    assert_eq!(refused(&mut s, spec).reason(), Reason::ProfileNotInCatalog);
}

#[test]
fn a_profile_below_the_floor_is_refused() {
    let mut cat = catalog();
    cat.floor.storage_gb = 2;
    let mut s = Sim::new(with_catalog(cat));
    assert_eq!(
        refused(&mut s, disposable_spec()).reason(),
        Reason::ProfileBelowFloor
    );
}

#[test]
fn a_draining_worker_accepts_nothing_new() {
    let mut s = Sim::new(with_catalog(catalog().draining(true)));
    assert_eq!(
        refused(&mut s, disposable_spec()).reason(),
        Reason::WorkerDraining
    );
}

#[test]
fn the_worker_whose_catalog_holds_the_spec_is_chosen() {
    let mut c = with_catalog(catalog().with_profile(ProfileRevision::new("other")));
    // The first worker lacks the profile revision; the second holds it.
    c.workers[0].catalog.as_mut().unwrap().profiles.pop();
    c.workers[0].catalog.as_mut().unwrap().profiles[0].id = "other".to_owned();
    let second = WorkerEntry::new("w2")
        .with_profile(Profile::admit("1.22.0", &[]).unwrap())
        .with_catalog(catalog());
    c.workers.push(second);
    let mut s = Sim::new(c);
    let key = s.submit_disposable("two", &cmd());
    s.settle();
    assert_eq!(s.record(&key).assignment.clone().unwrap().worker_id, "w2");
    let create = s.worker.iter().find(|(_, op)| op.name() == "create");
    let Some((_, WorkerOp::Create { worker_id, .. })) = create else {
        panic!("{:?}", s.worker)
    };
    assert_eq!(worker_id, "w2");
}

#[test]
fn a_retained_machine_outside_the_catalog_is_refused_before_anything_is_stored() {
    let mut cat = catalog();
    cat.images[0].id = "alpine".to_owned();
    let mut s = Sim::new(with_catalog(cat));
    s.settle();
    s.store_log.clear();
    let e = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::Create {
                key: mkey(),
                spec: mspec(),
            },
        )
        .unwrap_err();
    s.settle();
    assert_eq!(e.category(), Category::UnsupportedCapability);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert_eq!(e.reason(), Reason::ArtifactNotInCatalog);
    assert!(s.store_log.iter().all(|op| op.name().starts_with("due")));
    assert!(s.store.machines.is_empty());
    assert!(s.worker.is_empty());
    // With the artifact in the catalog the same request is accepted.
    let mut s = Sim::new(with_catalog(catalog()));
    s.request(MachineRequest::Create {
        key: mkey(),
        spec: mspec(),
    })
    .unwrap();
    assert!(s.store.machines.contains_key(&mkey()));
}

#[test]
fn an_invalid_catalog_is_refused_by_the_config_check() {
    let mut cat = catalog();
    cat.profiles.clear();
    let e = with_catalog(cat).validate().unwrap_err();
    assert_eq!(e.category(), Category::Validation);
    assert_eq!(e.reason(), Reason::CatalogProfiles);
    // The runtime × platform rule uses the admitted version.
    let mut cat = catalog();
    cat.architecture = Architecture::Aarch64;
    cat.images[0].architecture = Architecture::Aarch64;
    let e = with_catalog(cat.clone()).validate().unwrap_err();
    assert_eq!(e.reason(), Reason::CatalogPlatform);
    let mut c = with_catalog(cat);
    c.workers[0].profile = Some(Box::new(Profile::admit("1.14.1", &[]).unwrap()));
    c.validate().unwrap();
}

#[test]
fn a_stored_record_no_catalog_holds_is_left_alone() {
    // Accepted earlier (another controller's configuration), unassigned.
    let mut s = Sim::new(with_catalog(catalog()));
    let mut spec = disposable_spec();
    spec.profile.budgets.cleanup_ms += 1;
    let key = RecordKey::new("s", "elsewhere").unwrap();
    let fp = s.ctl.fingerprint(&spec);
    let rec = ExecutionRecord::accepted(key.clone(), fp, spec, s.now_ms).unwrap();
    s.store.records.insert(key.clone(), rec.clone());
    s.ctl.reconcile(s.now, s.now_ms);
    s.advance(2_000);
    assert_eq!(s.record(&key), &rec, "not driven, not changed");
    assert!(s.worker.is_empty(), "nothing sent: {:?}", s.worker);
}
