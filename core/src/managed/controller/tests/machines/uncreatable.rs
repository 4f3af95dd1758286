//! An unassigned retained machine no configured worker may create
//! (`machines/uncreatable.rs`): it waits with the configuration's refusal
//! recorded, never fills the machine scan, and its owner's delete ends it
//! with no worker call.

use super::*;
use crate::managed::catalog::{Architecture, Catalog, Floor, Platform, ProfileRevision};

const ZERO: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// A catalogued worker whose catalog holds `image` (and the default
/// profile revision).
fn catalogued(image: &str) -> ControllerConfig {
    let floor = Floor {
        storage_gb: 1,
        overlay_gb: 1,
        host_overhead_mb: 128,
    };
    let cat = Catalog::new(Platform::Linux, Architecture::host(), floor)
        .with_image(image, ZERO, "/images/x.smolmachine")
        .with_profile(ProfileRevision::new("default"));
    let mut c = disposable_config();
    let w = c.workers.remove(0);
    c.workers.push(w.with_catalog(cat));
    c
}

/// `mspec()` (artifact `unverified`) accepted under another configuration:
/// stored, unassigned, due.
fn stored_elsewhere(s: &mut Sim, key: &RecordKey) -> MachineRecord {
    let fp = fingerprint::machine_fingerprint(&fingerprint_key(), &mspec());
    let rec = MachineRecord::accepted(key.clone(), fp, mspec(), s.now_ms).unwrap();
    s.store.machines.insert(key.clone(), rec.clone());
    rec
}

fn machine_scans(s: &Sim) -> usize {
    s.store_log
        .iter()
        .filter(|op| op.name() == "due_machines")
        .count()
}

#[test]
fn a_machine_no_worker_may_create_records_why_and_waits_one_claim_ttl() {
    let mut s = Sim::new(catalogued("alpine"));
    let before = stored_elsewhere(&mut s, &mkey());
    s.settle();
    s.advance(10);
    let m = s.machine().clone();
    assert_eq!((m.state, m.operation), (MS::Accepted, Op::None));
    let e = m.last_error.as_ref().expect("the refusal is recorded");
    assert_eq!(
        (e.category.as_str(), e.reason.as_str(), e.operation.as_str()),
        (
            "unsupported_capability",
            "artifact_not_in_catalog",
            "create"
        ),
        "{e:?}"
    );
    let due = m
        .next_due_at_ms
        .expect("still due: a later configuration may create it");
    assert!(
        due >= before.accepted_at_ms + 1_000,
        "one claim TTL later: {m:#?}"
    );
    assert!(m.assignment.is_none() && m.reservation.is_none());
    assert!(s.worker.is_empty(), "no worker request: {:?}", s.worker);
    // Not written again before it is due: the scans read it, nothing more.
    let (version, from) = (m.version, s.store_log.len());
    s.advance(900);
    assert_eq!(s.machine().version, version);
    assert!(
        s.store_log[from..]
            .iter()
            .all(|op| op.name().starts_with("due") || op.name().starts_with("claim_worker")),
        "{:?}",
        &s.store_log[from..]
    );
    // Due again: the same wait, recorded again; never created.
    s.advance(500);
    assert!(s.machine().version > version);
    assert_eq!(s.machine().state, MS::Accepted);
    assert!(s.worker.is_empty());
}

#[test]
fn its_owners_delete_ends_it_with_no_worker_call() {
    let mut s = Sim::new(catalogued("alpine"));
    stored_elsewhere(&mut s, &mkey());
    s.settle();
    s.advance(10);
    let d = s.lifecycle(Op::Delete).unwrap();
    assert_eq!(d.into_machine().unwrap().0.operation, Op::Delete);
    s.advance(1_000);
    let m = s.machine();
    assert_eq!((m.state, m.operation), (MS::Deleted, Op::None), "{m:#?}");
    assert_eq!(m.next_due_at_ms, None, "no longer due");
    assert!(m.reservation.is_none() && m.absence_at_ms.is_none());
    assert!(machine_settled(m));
    assert!(s.worker.is_empty(), "deleted with no worker call");
}

#[test]
fn machines_no_worker_may_create_do_not_starve_the_machine_scan() {
    let mut s = Sim::new(catalogued("unverified"));
    // `max_active` (4) of them, due before the one this worker creates.
    let mut other = mspec();
    other.artifact.id = "alpine".to_owned();
    let fp = fingerprint::machine_fingerprint(&fingerprint_key(), &other);
    for i in 0..4 {
        let key = RecordKey::new("a", &format!("stuck-{i}")).unwrap();
        let rec =
            MachineRecord::accepted(key.clone(), fp.clone(), other.clone(), s.now_ms).unwrap();
        s.store.machines.insert(key, rec);
    }
    s.now_ms += 1;
    stored_elsewhere(&mut s, &mkey());
    s.settle();
    s.advance(1_000);
    let scans = machine_scans(&s);
    assert!(scans > 1, "{scans}");
    assert!(
        s.worker.iter().any(|(_, op)| op.name() == "create"),
        "the creatable machine was reached: {:#?}",
        s.machine()
    );
    assert_eq!(s.machine().state, MS::Creating);
}
