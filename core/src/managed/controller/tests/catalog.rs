//! The worker catalog at acceptance (C12.2, C12.4): a disposable
//! execution or a retained machine is accepted only by a configured,
//! non-draining worker whose catalog holds the exact artifact and profile
//! revision at or above its floor; otherwise `unsupported_capability`,
//! evidence `not_dispatched`, and nothing is stored or sent.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use super::machines::{mkey, mspec};
use super::*;
use crate::managed::catalog::{Architecture, Catalog, Floor, Platform, ProfileRevision};
use crate::managed::record::Resources;
use crate::managed::spec::ProfileNetwork;
use crate::worker::Source;
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
    // The start-up scan first; then the submit must store nothing.
    s.settle();
    s.store_log.clear();
    let key = RecordKey::new("s", "refused").unwrap();
    let e = refusal(s, key, spec);
    assert_eq!(e.category(), Category::UnsupportedCapability, "{e:?}");
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert!(
        s.store_log
            .iter()
            .all(|op| op.name().starts_with("due") || op.name() == "fetch"),
        "nothing stored: {:?}",
        s.store_log
    );
    assert!(s.store.records.is_empty());
    assert!(s.worker.is_empty(), "nothing sent");
    e
}

/// The refusal of a submission: returned at once, or (a refusal of the
/// configuration, AC-12.5.2) as the `Refused` notice after the store read.
pub(super) fn refusal(s: &mut Sim, key: RecordKey, spec: ExecutionSpec) -> Error {
    let submit = Submit {
        key: key.clone(),
        spec,
    };
    if let Err(e) = s.ctl.submit(s.now, s.now_ms, submit) {
        return e;
    }
    s.settle();
    s.events
        .iter()
        .find_map(|e| match e {
            ControllerEvent::Refused { key: k, error } if *k == key => Some(*error),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no refusal: {:?}", s.events))
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
    // Answered after one read of the key (AC-12.5.2), nothing stored.
    let e = s
        .request(MachineRequest::Create {
            key: mkey(),
            spec: mspec(),
        })
        .unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert_eq!(e.reason(), Reason::ArtifactNotInCatalog);
    assert!(
        s.store_log
            .iter()
            .all(|op| op.name().starts_with("due") || op.name() == "fetch_machine"),
        "{:?}",
        s.store_log
    );
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

/// A record accepted earlier (another configuration) whose spec no
/// configured catalog holds, unassigned.
fn stored_elsewhere(s: &mut Sim, queue_budget_ms: u64) -> (RecordKey, ExecutionRecord) {
    let mut spec = disposable_spec();
    spec.profile.budgets.cleanup_ms += 1;
    spec.queue_budget_ms = queue_budget_ms;
    let key = RecordKey::new("s", "elsewhere").unwrap();
    let fp = s.ctl.fingerprint(&spec);
    let rec = ExecutionRecord::accepted(key.clone(), fp, spec, s.now_ms).unwrap();
    s.store.records.insert(key.clone(), rec.clone());
    (key, rec)
}

#[test]
fn a_stored_record_no_catalog_holds_is_left_alone_until_its_queue_deadline() {
    let mut s = Sim::new(with_catalog(catalog()));
    let (key, rec) = stored_elsewhere(&mut s, 5_000);
    s.ctl.reconcile(s.now, s.now_ms);
    s.settle();
    s.advance(4_900);
    assert_eq!(s.record(&key), &rec, "not driven, not changed");
    assert!(s.worker.is_empty(), "nothing sent: {:?}", s.worker);
    // Read by the scan once per poll interval (100 ms), never in a loop.
    let scans = due_scans(&s);
    assert!((4_900 / 100..=4_900 / 100 + 2).contains(&scans), "{scans}");
}

#[test]
fn a_stored_record_no_catalog_holds_expires_at_its_queue_deadline_unsent() {
    let mut s = Sim::new(with_catalog(catalog()));
    let (key, _) = stored_elsewhere(&mut s, 5_000);
    s.ctl.reconcile(s.now, s.now_ms);
    s.settle();
    s.advance(4_900);
    assert_eq!(s.record(&key).state, ExecState::Accepted);
    s.advance(300);
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Expired);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(rec.assignment, None, "no reservation taken");
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.next_due_at_ms, None, "no longer due");
    assert_eq!(
        rec.last_error.as_ref().map(|e| e.reason.as_str()),
        Some("queue_deadline")
    );
    assert!(s.worker.is_empty(), "nothing sent: {:?}", s.worker);
    let f = s.finished(&key).expect("its execution ended here");
    assert!(!f.dispatched);
    assert_eq!(
        f.error.as_ref().map(Error::category),
        Some(Category::Expired)
    );
    assert!(
        !s.store_log.iter().any(|op| op.name() == "reserve"),
        "{:?}",
        s.store_log
    );
    // Later scans do not pick it up again.
    let version = rec.version;
    s.advance(2_000);
    assert_eq!(s.record(&key).version, version);
}

#[test]
fn a_cancelled_record_no_catalog_holds_ends_cancelled_without_waiting() {
    let mut s = Sim::new(with_catalog(catalog()));
    let (key, _) = stored_elsewhere(&mut s, 60_000);
    s.settle();
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.advance(500);
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Cancelled);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(rec.next_due_at_ms, None);
    assert!(s.worker.is_empty(), "nothing sent: {:?}", s.worker);
    assert!(s.finished(&key).is_some_and(|f| !f.dispatched));
}

fn allowlist() -> Option<ProfileNetwork> {
    Some(ProfileNetwork {
        allow: vec!["198.51.100.0/24".to_owned(), "api.example.com".to_owned()],
    })
}

fn on_version(version: &str) -> ControllerConfig {
    let mut c = with_catalog(catalog());
    c.workers[0].profile = Some(Box::new(Profile::admit(version, &[]).unwrap()));
    c
}

#[test]
fn an_allowlist_on_a_version_without_network_policies_is_refused_before_anything_is_stored() {
    // 1.14.6 is the newest version without network policies (C0.3).
    let mut s = Sim::new(on_version("1.14.6"));
    let mut spec = disposable_spec();
    spec.network = allowlist();
    assert_eq!(
        refused(&mut s, spec).reason(),
        Reason::NetworkPolicyNotInVersion
    );
    // Offline on 1.14.6, and the allowlist on 1.16.0 (the first version
    // with the feature), are accepted.
    let mut s = Sim::new(on_version("1.14.6"));
    s.submit_disposable("offline", &cmd());
    s.settle();
    assert!(
        s.store
            .records
            .contains_key(&RecordKey::new("s", "offline").unwrap())
    );
    let mut s = Sim::new(on_version("1.16.0"));
    let mut spec = disposable_spec();
    spec.network = allowlist();
    let key = RecordKey::new("s", "net").unwrap();
    s.submit_keyed(&key, spec);
    s.settle();
    assert!(s.store.records.contains_key(&key));
}

#[test]
fn a_retained_machine_with_an_allowlist_on_a_version_without_it_is_refused() {
    let mut s = Sim::new(on_version("1.14.6"));
    s.settle();
    s.store_log.clear();
    let mut spec = mspec();
    spec.network = allowlist();
    let e = s
        .request(MachineRequest::Create { key: mkey(), spec })
        .unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert_eq!(e.reason(), Reason::NetworkPolicyNotInVersion);
    assert!(s.store.machines.is_empty());
    assert!(s.worker.is_empty());
}

#[test]
fn the_worker_whose_version_allows_the_allowlist_is_chosen_and_its_create_carries_it() {
    let mut c = on_version("1.14.6");
    c.workers.push(
        WorkerEntry::new("w2")
            .with_profile(Profile::admit("1.22.0", &[]).unwrap())
            .with_catalog(catalog()),
    );
    let mut s = Sim::new(c);
    let mut spec = disposable_spec();
    spec.network = allowlist();
    let key = RecordKey::new("s", "net").unwrap();
    s.submit_keyed(&key, spec);
    s.settle();
    assert_eq!(s.record(&key).assignment.clone().unwrap().worker_id, "w2");
    let Some((
        _,
        WorkerOp::Create {
            worker_id, spec, ..
        },
    )) = s.worker.iter().find(|(_, op)| op.name() == "create")
    else {
        panic!("{:?}", s.worker)
    };
    assert_eq!(worker_id, "w2");
    let hosts = vec![crate::worker::Hostname::new("api.example.com").unwrap()];
    let cidrs = vec![crate::worker::Cidr::new("198.51.100.0/24").unwrap()];
    assert_eq!(
        spec.network,
        NetworkPolicy::allowlist(hosts, cidrs).unwrap()
    );
}

#[test]
fn an_allowlist_c9_1_refuses_is_refused_at_acceptance() {
    let mut s = Sim::new(on_version("1.22.0"));
    s.settle();
    s.store_log.clear();
    for bad in [
        vec![],
        vec!["203.0.113.7".to_owned()],
        vec!["a.com".to_owned(), "a.com".to_owned()],
    ] {
        let mut spec = disposable_spec();
        spec.network = Some(ProfileNetwork { allow: bad.clone() });
        let key = RecordKey::new("s", "bad-net").unwrap();
        let e = s
            .ctl
            .submit(s.now, s.now_ms, Submit { key, spec })
            .unwrap_err();
        assert_eq!(e.category(), Category::Validation, "{bad:?}: {e:?}");
        assert_eq!(e.operation(), Operation::Submit);
        assert_eq!(e.evidence(), Evidence::NotDispatched);
    }
    s.settle();
    assert!(s.store.records.is_empty());
}

/// A catalog whose one revision differs from the defaults in every sized
/// field (C12.3), over a floor below it.
fn sized_catalog() -> Catalog {
    let mut rev = ProfileRevision::new("default");
    rev.cpus = 2;
    rev.memory_mb = 512;
    rev.host_overhead_mb = 384;
    rev.storage_gb = 3;
    rev.overlay_gb = 2;
    let mut cat = catalog();
    cat.profiles = vec![rev];
    cat
}

#[test]
fn the_reservation_is_the_revisions_memory_plus_overhead_and_storage_plus_overlay() {
    let mut s = Sim::new(with_catalog(sized_catalog()));
    let key = s.submit_disposable("sized", &cmd());
    s.settle();
    let reserve = s.store_log.iter().find_map(|op| match op {
        StoreOp::Reserve { reservation, .. } => Some(reservation.clone()),
        _ => None,
    });
    let r = reserve.unwrap();
    let want = Resources {
        slots: 1,
        cpus: 2,
        memory_mb: 512 + 384,
        disk_gb: 3 + 2,
    };
    assert_eq!(r.capacity, want);
    assert_eq!(r.limit, s.ctl.cfg.workers[0].capacity);
    assert_eq!(s.record(&key).reservation, Some(want));
    // The machine is created at the revision's size.
    let Some((_, WorkerOp::Create { spec, .. })) =
        s.worker.iter().find(|(_, op)| op.name() == "create")
    else {
        panic!("{:?}", s.worker)
    };
    assert_eq!(
        (spec.cpus, spec.memory_mb, spec.storage_gb, spec.overlay_gb),
        (2, 512, 3, 2)
    );
}

#[test]
fn a_retained_machine_reserves_and_is_created_at_its_revision() {
    let mut s = Sim::new(with_catalog(sized_catalog()));
    s.request(MachineRequest::Create {
        key: mkey(),
        spec: mspec(),
    })
    .unwrap();
    s.settle();
    let m = s.store.machines[&mkey()].clone();
    assert_eq!(
        m.reservation,
        Some(Resources {
            slots: 1,
            cpus: 2,
            memory_mb: 896,
            disk_gb: 5
        })
    );
    let Some((_, WorkerOp::Create { spec, .. })) =
        s.worker.iter().find(|(_, op)| op.name() == "create")
    else {
        panic!("{:?}", s.worker)
    };
    assert_eq!((spec.cpus, spec.memory_mb, spec.storage_gb), (2, 512, 3));
    assert_eq!(
        spec.source,
        Source::Image {
            path: "/images/unverified.smolmachine".to_owned()
        }
    );
}

#[test]
fn a_catalogued_machine_is_created_from_the_catalogs_image_path() {
    // The entry's development source is ignored with a catalog: the spec's
    // artifact decides (C12.2, C12.4).
    let mut c = with_catalog(catalog());
    c.workers[0].machine_source = Some(Source::Oci {
        reference: "alpine:3.19".to_owned(),
    });
    let mut s = Sim::new(c);
    s.submit_disposable("img", &cmd());
    s.settle();
    let Some((_, WorkerOp::Create { spec, .. })) =
        s.worker.iter().find(|(_, op)| op.name() == "create")
    else {
        panic!("{:?}", s.worker)
    };
    assert_eq!(
        spec.source,
        Source::Image {
            path: "/images/unverified.smolmachine".to_owned()
        }
    );
    // C12.3: nothing a profile cannot request is requested.
    assert!(spec.mounts.is_empty() && spec.ports.is_empty() && spec.workload.is_none());
    assert_eq!(spec.network, NetworkPolicy::Offline);
}

#[test]
fn an_uncatalogued_entry_creates_from_its_development_source() {
    let mut c = disposable_config();
    let oci = Source::Oci {
        reference: "alpine:3.19".to_owned(),
    };
    c.workers[0].machine_source = Some(oci.clone());
    let mut s = Sim::new(c);
    s.submit_disposable("dev", &cmd());
    s.settle();
    let Some((_, WorkerOp::Create { spec, .. })) =
        s.worker.iter().find(|(_, op)| op.name() == "create")
    else {
        panic!("{:?}", s.worker)
    };
    assert_eq!(spec.source, oci);
    assert_eq!((spec.cpus, spec.memory_mb), (1, 256));
}

#[test]
fn a_background_command_on_a_catalogued_worker_is_unsupported() {
    // C12.3: the one profile-level request a spec can express today.
    let mut s = Sim::new(with_catalog(catalog()));
    let mut spec = disposable_spec();
    let Action::Command(c) = &mut spec.action else {
        panic!()
    };
    c.background = true;
    c.timeout_s = None;
    assert_eq!(refused(&mut s, spec).reason(), Reason::Background);
}

#[test]
fn a_create_spec_needs_the_image_and_revision_still_in_the_catalog() {
    // Reached only if a catalog lost the spec between reservation and
    // create: refused (not dispatched), never created from another source.
    let t = RunTarget::unverified();
    let entry = |cat: Catalog| WorkerEntry::new("w").with_catalog(cat);
    let ok = entry(catalog()).create_spec(&t.artifact, &t.profile, None);
    assert!(ok.is_ok(), "{ok:?}");
    let mut lacking = catalog();
    lacking.images[0].sha256 = "1".repeat(64);
    let e = entry(lacking)
        .create_spec(&t.artifact, &t.profile, None)
        .unwrap_err();
    assert_eq!(e.reason(), Reason::ArtifactNotInCatalog);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    let mut lacking = catalog();
    lacking.profiles[0].per_file_max += 1;
    let e = entry(lacking)
        .create_spec(&t.artifact, &t.profile, None)
        .unwrap_err();
    assert_eq!(e.reason(), Reason::ProfileNotInCatalog);
    // A development entry creates from its source at the default size.
    let dev = WorkerEntry::new("w").create_spec(&t.artifact, &t.profile, None);
    assert_eq!(dev.unwrap(), crate::worker::MachineSpec::default());
}

/// AC-12.5.2: the accepted event of `key`, if any.
fn accepted_event(s: &Sim, key: &RecordKey) -> Option<(bool, ExecutionRecord)> {
    s.events.iter().find_map(|e| match e {
        ControllerEvent::Accepted {
            key: k,
            existing,
            record,
        } if k == key => Some((*existing, (**record).clone())),
        _ => None,
    })
}

#[test]
fn a_duplicate_resolves_after_the_catalog_no_longer_holds_its_spec() {
    let mut s = Sim::new(with_catalog(catalog()));
    let (key, rec) = stored_elsewhere(&mut s, 60_000);
    s.settle();
    s.store_log.clear();
    let spec = rec.spec.clone();
    s.submit_keyed(&key, spec);
    s.settle();
    let (existing, got) = accepted_event(&s, &key).expect("resolved as a duplicate");
    assert!(existing);
    assert_eq!(got, rec);
    assert_eq!(s.record(&key), &rec, "nothing written");
    assert!(
        s.store_log
            .iter()
            .all(|op| op.name().starts_with("due") || op.name() == "fetch"),
        "{:?}",
        s.store_log
    );
    assert!(s.worker.is_empty());
    // A changed spec under the same key conflicts.
    let mut other = rec.spec.clone();
    other.queue_budget_ms += 1;
    let e = refusal(&mut s, key, other);
    assert_eq!(e.category(), Category::IdentityConflict);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
}

#[test]
fn a_duplicate_resolves_on_a_draining_worker_and_a_new_key_is_refused() {
    // Accepted while the worker took new work; it now drains.
    let mut s = Sim::new(with_catalog(catalog()));
    let key = s.submit_disposable("before", &cmd());
    s.settle();
    let rec = s.record(&key).clone();
    let mut d = Sim::new(with_catalog(catalog().draining(true)));
    d.store.records.insert(key.clone(), rec.clone());
    d.settle();
    d.submit_keyed(&key, rec.spec.clone());
    d.settle();
    assert!(accepted_event(&d, &key).is_some_and(|(existing, _)| existing));
    let e = refusal(
        &mut d,
        RecordKey::new("s", "new").unwrap(),
        rec.spec.clone(),
    );
    assert_eq!(e.reason(), Reason::WorkerDraining);
    assert!(
        !d.store
            .records
            .contains_key(&RecordKey::new("s", "new").unwrap())
    );
}

#[test]
fn a_store_failure_while_resolving_a_refusal_is_not_read_as_absence() {
    let mut s = Sim::new(with_catalog(catalog().draining(true)));
    s.settle();
    s.store.fail_next = 1;
    let e = refusal(&mut s, RecordKey::new("s", "x").unwrap(), disposable_spec());
    assert_eq!(e.category(), Category::Store, "{e:?}");
    assert!(s.store.records.is_empty());
}

#[test]
fn a_retained_machine_duplicate_resolves_after_the_catalog_no_longer_holds_it() {
    // Created under a catalog holding its artifact; the next configuration
    // lacks it.
    let mut s = Sim::new(with_catalog(catalog()));
    s.request(MachineRequest::Create {
        key: mkey(),
        spec: mspec(),
    })
    .unwrap();
    let stored = s.store.machines[&mkey()].clone();
    let mut lacking = catalog();
    lacking.images[0].id = "alpine".to_owned();
    let mut d = Sim::new(with_catalog(lacking));
    d.store.machines.insert(mkey(), stored.clone());
    d.settle();
    let answer = d
        .request(MachineRequest::Create {
            key: mkey(),
            spec: mspec(),
        })
        .unwrap();
    let MachineAnswer::Machine { record, existing } = answer else {
        panic!("{answer:?}")
    };
    assert!(existing);
    assert_eq!(record.key, mkey());
    assert_eq!(record.fingerprint, stored.fingerprint);
    assert!(d.worker.is_empty(), "{:?}", d.worker);
    // Another spec under the key conflicts.
    let mut other = mspec();
    other.checkpointable = true;
    let e = d
        .request(MachineRequest::Create {
            key: mkey(),
            spec: other,
        })
        .unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict);
    assert_eq!(e.evidence(), Evidence::NotDispatched);
}
