//! Guards, claims and the command slot (C14.2, C14.3, C15).
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use smolbox_core::Category;
use smolbox_core::Operation;
use smolbox_core::Reason;
use smolbox_core::managed::claim::{Fence, Guard, Lease, check_guard, claim_exec};
use smolbox_core::managed::record::Assignment;
use smolbox_core::managed::slot::{self, Finish};
use smolbox_core::managed::state::{ExecState, MachineOperation, MachineRecordState};
use smolbox_core::managed::testkit::{
    accepted, exec_in, exec_spec, key, machine_in, managed_exec_spec,
};

const T0: u64 = 1_700_000_000_000;

#[test]
fn guard_checks_version_owner_generation_expiry_and_worker_generation() {
    let rec = accepted(key("s", "r"), exec_spec("x"), T0);
    let g = |owner: &str, generation, version| Guard {
        owner: owner.into(),
        generation,
        version,
    };
    let op = Operation::StoreWrite;
    // never claimed
    let e = check_guard(Fence::of_exec(&rec), &g("a", 0, 1), None, T0, op).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::StaleClaim, Reason::NoClaim)
    );
    let rec = claim_exec(&rec, "a", T0, 1_000).unwrap();
    assert_eq!((rec.generation, rec.version), (1, 2));
    assert!(check_guard(Fence::of_exec(&rec), &g("a", 1, 2), None, T0 + 999, op).is_ok());
    let cat = |gd: Guard, now| {
        check_guard(Fence::of_exec(&rec), &gd, None, now, op)
            .unwrap_err()
            .category()
    };
    assert_eq!(cat(g("a", 1, 1), T0), Category::StaleVersion);
    assert_eq!(cat(g("b", 1, 2), T0), Category::StaleClaim);
    assert_eq!(cat(g("a", 2, 2), T0), Category::StaleClaim);
    assert_eq!(cat(g("a", 1, 2), T0 + 1_000), Category::StaleClaim);
    // record assigned under worker generation 3
    let mut assigned = rec.clone();
    assigned.assignment = Some(Assignment {
        worker_id: "w1".into(),
        worker_generation: 3,
        machine_name: "m1".into(),
    });
    let lease = |generation| Lease {
        owner: "a".into(),
        generation,
        until_ms: T0 + 10,
    };
    let f = Fence::of_exec(&assigned);
    assert!(check_guard(f, &g("a", 1, 2), Some(&lease(3)), T0, op).is_ok());
    assert_eq!(
        check_guard(f, &g("a", 1, 2), Some(&lease(4)), T0, op)
            .unwrap_err()
            .reason(),
        Reason::WorkerGeneration
    );
    assert_eq!(
        check_guard(f, &g("a", 1, 2), None, T0, op)
            .unwrap_err()
            .reason(),
        Reason::WorkerGeneration
    );
}

#[test]
fn a_claim_moves_only_when_expired() {
    let rec = claim_exec(&accepted(key("s", "r"), exec_spec("x"), T0), "a", T0, 1_000).unwrap();
    assert_eq!(
        claim_exec(&rec, "b", T0 + 999, 1_000)
            .unwrap_err()
            .category(),
        Category::StaleClaim
    );
    let taken = claim_exec(&rec, "b", T0 + 1_000, 1_000).unwrap();
    assert_eq!(
        (
            taken.generation,
            taken.claim.as_ref().unwrap().owner.as_str()
        ),
        (2, "b")
    );
    // the old owner's guard is now stale
    let old = Guard {
        owner: "a".into(),
        generation: 1,
        version: taken.version,
    };
    assert!(
        check_guard(
            Fence::of_exec(&taken),
            &old,
            None,
            T0 + 1_000,
            Operation::StoreWrite
        )
        .is_err()
    );
}

#[test]
fn the_command_slot_holds_one_execution() {
    let m = machine_in(MachineRecordState::Running, key("s", "m"), T0).unwrap();
    let e1 = accepted(key("s", "e1"), managed_exec_spec("x", &m.key), T0);
    let e2 = accepted(key("s", "e2"), managed_exec_spec("y", &m.key), T0);
    let held = slot::acquire(&m, &e1, T0 + 10).unwrap();
    assert_eq!(held.active_execution.as_ref(), Some(&e1.key));
    assert_eq!(
        slot::acquire(&held, &e1, T0 + 11).unwrap(),
        held,
        "re-acquire is idempotent"
    );
    let e = slot::acquire(&held, &e2, T0 + 11).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::AdmissionExhausted, Reason::SlotBusy)
    );
    // AC-14.3.1: stop/delete with a command active is refused.
    for action in [MachineOperation::Stop, MachineOperation::Delete] {
        let e = slot::request(&held, action, held.version, T0 + 12).unwrap_err();
        assert_eq!(e.category(), Category::AdmissionExhausted);
    }
    // A disposable spec or a different machine cannot take the slot.
    let other = accepted(key("s", "e3"), exec_spec("z"), T0);
    assert_eq!(
        slot::acquire(&m, &other, T0 + 10).unwrap_err().category(),
        Category::Validation
    );
    // A stopped machine has no slot to give.
    let stopped = machine_in(MachineRecordState::Stopped, key("s", "m"), T0).unwrap();
    assert_eq!(
        slot::acquire(&stopped, &e1, T0 + 10).unwrap_err().reason(),
        Reason::MachineNotIdle
    );
}

#[test]
fn finishing_releases_or_keeps_the_slot() {
    let m = machine_in(MachineRecordState::Running, key("s", "m"), T0).unwrap();
    for (state, expect) in [
        (ExecState::Completed, Finish::Released),
        (ExecState::Launched, Finish::Released),
        (ExecState::Cancelled, Finish::Released),
        (ExecState::Unknown, Finish::Kept),
        (ExecState::CollectionFailed, Finish::Kept),
        (ExecState::Failed, Finish::Kept),
    ] {
        let e = exec_in(state, key("s", "e1"), T0).unwrap();
        let mut held = m.clone();
        held.key = e.spec.machine.clone().unwrap();
        // The slot was taken before dispatch; the record finished since.
        held.active_execution = Some(e.key.clone());
        let (after, got) = slot::finish(&held, &e, T0 + 60).unwrap();
        assert_eq!(got, expect, "{state:?}");
        match expect {
            Finish::Released => assert!(after.active_execution.is_none()),
            Finish::Kept => {
                assert_eq!(after.active_execution.as_ref(), Some(&e.key));
                assert_eq!(after.state, MachineRecordState::Unknown);
            }
        }
    }
    let running = exec_in(ExecState::Running, key("s", "e1"), T0).unwrap();
    let mut held = m.clone();
    held.key = running.spec.machine.clone().unwrap();
    held.active_execution = Some(running.key.clone());
    assert_eq!(
        slot::finish(&held, &running, T0 + 60).unwrap_err().reason(),
        Reason::ExecutionNotFinished
    );
}

#[test]
fn versioned_lifecycle_requests() {
    let m = machine_in(MachineRecordState::Running, key("s", "m"), T0).unwrap();
    let after = slot::request(&m, MachineOperation::Stop, m.version, T0 + 10)
        .unwrap()
        .unwrap();
    assert_eq!(after.operation, MachineOperation::Stop);
    // the same (action, version) again returns the current record
    assert!(
        slot::request(&after, MachineOperation::Stop, m.version, T0 + 11)
            .unwrap()
            .is_none()
    );
    assert_eq!(
        slot::request(&after, MachineOperation::Delete, m.version, T0 + 11)
            .unwrap_err()
            .category(),
        Category::StaleVersion
    );
    assert_eq!(
        slot::request(&after, MachineOperation::Delete, after.version, T0 + 11)
            .unwrap_err()
            .category(),
        Category::AdmissionExhausted
    );
}
