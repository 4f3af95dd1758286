//! Disposable records left by a controller that crashed or was paused
//! (recovery simulation, tests/src/sim/README.md): a recovering controller
//! that holds the worker lease re-fences the record with `claim_version`
//! (C15) and moves it forward from what is stored, never re-sending a
//! mutation whose outcome is uncertain.

use super::*;
use crate::Category;
use crate::managed::Guard;

fn second_owner() -> ControllerConfig {
    let mut c = disposable_config();
    c.owner = "ctl-test-2".into();
    c
}

/// A second controller on the first one's store, `ms` of both clocks later
/// (past the claim and the worker lease of the first).
fn take_over(s: &mut Sim, ms: u64) -> Sim {
    let mut t = Sim::new(second_owner());
    t.store = std::mem::take(&mut s.store);
    t.now_ms = s.now_ms;
    t.advance(ms);
    t
}

fn kinds(ops: &[(OpId, WorkerOp)]) -> Vec<&'static str> {
    ops.iter().map(|(_, op)| op.name()).collect()
}

fn refenced(t: &Sim, key: &RecordKey) -> bool {
    t.store_log
        .iter()
        .any(|op| matches!(op, StoreOp::ClaimVersion { key: k, .. } if k == key))
}

/// Left `accepted` with its reservation (the crash came before the create
/// intent): no create can have been sent, so the new controller writes the
/// intent itself and runs the command once, then cleans up.
#[test]
fn a_record_left_reserved_is_refenced_and_runs_once() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("r1", &cmd());
    // Perform store ops only until the reservation is committed.
    while s
        .store
        .records
        .get(&key)
        .is_none_or(|r| r.assignment.is_none())
    {
        let (id, op) = s.ctl.poll_store_op().unwrap();
        let r = s.store.apply(&op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    assert_eq!(s.record(&key).state, ExecState::Accepted);
    let mut t = take_over(&mut s, 2_000);
    assert!(refenced(&t, &key), "{:#?}", t.store_log);
    let rec = t.record(&key).clone();
    assert_eq!(rec.state, ExecState::Preparing);
    assert_eq!(rec.assignment.as_ref().unwrap().worker_generation, 2);
    assert_eq!(kinds(&t.worker), ["create"]);
    let name = rec.assignment.unwrap().machine_name;
    let obs = |st| Ok(WorkerReply::Machine(observation(&name, st, 1_700_000_000)));
    t.answer("create", obs(MachineState::Created));
    t.answer("start", obs(MachineState::Running));
    t.answer("exec", exited(4, ""));
    t.answer("inspect", obs(MachineState::Running));
    t.answer("delete", Ok(WorkerReply::Deleted));
    t.answer("inspect", Err(not_found()));
    let rec = t.record(&key);
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.reservation, None);
    assert_eq!(t.finished(&key).unwrap().exit_code(), Some(4));
    t.advance(5_000);
    assert!(t.worker.is_empty(), "nothing sent twice");
}

/// Left `dispatching` (the command may be running): `unknown`, the command
/// never sent again, the machine stopped and kept within retention.
#[test]
fn a_record_left_dispatching_is_refenced_and_never_resent() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("r2", &cmd());
    s.settle();
    let name = s.started(&key);
    let obs = |st| Ok(WorkerReply::Machine(observation(&name, st, 1_700_000_000)));
    assert_eq!(kinds(&s.worker), ["exec"]);
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    let mut t = take_over(&mut s, 2_000);
    assert!(refenced(&t, &key));
    assert_eq!(t.record(&key).state, ExecState::Unknown);
    assert_eq!(kinds(&t.worker), ["stop"], "no exec resent");
    t.answer("stop", obs(MachineState::Stopped));
    let rec = t.record(&key);
    assert!(rec.reservation.is_some() && rec.absence_at_ms.is_none());
    t.advance(5_000);
    assert!(t.worker.is_empty());
}

/// Sim finding (disposable seeds 574, 618, 721): a controller paused past
/// its claim comes back with the exit of a `dispatching` record that
/// another controller has meanwhile marked `unknown` under a newer
/// worker-lease generation. Once that lease lapses, the exit is stored
/// (re-fenced with `claim_version`), never dropped.
#[test]
fn a_paused_controllers_late_exit_is_stored_under_a_later_worker_lease() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("r3", &cmd());
    s.settle();
    let name = s.started(&key);
    let obs = |st| Ok(WorkerReply::Machine(observation(&name, st, 1_700_000_000)));
    assert_eq!(kinds(&s.worker), ["exec"]);
    // Paused: another controller takes the worker and the record.
    let mut t = take_over(&mut s, 2_000);
    assert_eq!(t.record(&key).state, ExecState::Unknown);
    t.answer("stop", obs(MachineState::Stopped));
    // It no longer needs the worker: its lease lapses.
    t.advance(2_000);
    // The first controller comes back, on the same store and clock.
    let gap = t.now_ms - s.now_ms;
    s.store = std::mem::take(&mut t.store);
    s.now += Duration::from_millis(gap);
    s.now_ms = t.now_ms;
    s.answer_exec(exited(5, ""));
    s.advance(3_000);
    let rec = s.record(&key).clone();
    assert!(
        matches!(rec.result, Some(ExecResult::Exited { exit_code: 5, .. })),
        "the exit was dropped: {rec:#?}"
    );
    assert_eq!(rec.state, ExecState::Completed);
    // Then the machine is deleted as after any finished run.
    assert_eq!(kinds(&s.worker), ["inspect"]);
    s.answer("inspect", obs(MachineState::Stopped));
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    assert_eq!(s.record(&key).reservation, None);
    assert_eq!(s.finished(&key).unwrap().exit_code(), Some(5));
    assert_eq!(rec.assignment.unwrap().worker_generation, 3);
    assert!(
        s.store_log
            .iter()
            .any(|op| matches!(op, StoreOp::ClaimVersion { .. }))
    );
}

/// `claim_version` re-fences only for the holder of the live worker lease
/// and only at the version read; the fenced writer is then refused.
#[test]
fn claim_version_refences_only_for_the_live_lease_holder_at_that_version() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("r4", &cmd());
    s.settle();
    let rec = s.record(&key).clone();
    assert_eq!(rec.assignment.as_ref().unwrap().worker_generation, 1);
    let later = rec.claim.as_ref().unwrap().until_ms + 1;
    let old = Lease {
        owner: OWNER.into(),
        generation: 1,
        until_ms: later - 1,
    };
    let new = claim::take(Some(&old), "b", later, 1_000).unwrap();
    assert_eq!(new.generation, 2);
    let v = rec.version;
    // Not the lease holder, or no lease: refused.
    for lease in [None, Some(&old), Some(&new)] {
        let e = claim::claim_exec_version(&rec, "c", v, lease, later, 1_000).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::StaleClaim, Reason::WorkerLease)
        );
    }
    // Another version: refused.
    let e = claim::claim_exec_version(&rec, "b", v + 1, Some(&new), later, 1_000).unwrap_err();
    assert_eq!(e.category(), Category::StaleVersion);
    let next = claim::claim_exec_version(&rec, "b", v, Some(&new), later, 1_000).unwrap();
    assert_eq!(next.assignment.as_ref().unwrap().worker_generation, 2);
    assert_eq!(next.claim.as_ref().unwrap().owner, "b");
    assert_eq!(next.version, v + 1);
    // The writer of generation 1 is fenced now even with a live new claim.
    let g = Guard::for_exec(&next, OWNER);
    let e = claim::check_guard(
        Fence::of_exec(&next),
        &g,
        Some(&old),
        later,
        Operation::StoreWrite,
    )
    .unwrap_err();
    assert_eq!(e.category(), Category::StaleClaim);
    let g = Guard::for_exec(&next, "b");
    claim::check_guard(
        Fence::of_exec(&next),
        &g,
        Some(&new),
        later,
        Operation::StoreWrite,
    )
    .unwrap();
}

/// Sim finding (disposable seeds 587, 681, 967): the write of the creation
/// evidence fails; the create's answer is kept, so the retry writes it and
/// the run goes on (it used to wait forever for an answer already taken).
#[test]
fn a_failed_write_of_the_creation_evidence_is_retried_from_the_same_answer() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("r5", &cmd());
    s.settle();
    let name = s.record(&key).assignment.clone().unwrap().machine_name;
    let obs = |st| Ok(WorkerReply::Machine(observation(&name, st, 1_700_000_000)));
    s.store.fail_next = 1;
    s.answer("create", obs(MachineState::Created));
    assert!(s.record(&key).creation.is_none(), "the write failed");
    s.advance(500);
    assert!(s.record(&key).creation.is_some(), "written on retry");
    s.answer("start", obs(MachineState::Running));
    s.answer("exec", exited(0, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
}

/// Sim finding (disposable seed 75 after the merge): a controller paused
/// right after its reservation comes back after another controller
/// re-fenced the record, wrote the create intent and sent the create; the
/// first one never sends a create for an intent it did not write.
#[test]
fn a_paused_reserver_never_creates_under_another_controllers_intent() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("r6", &cmd());
    while s
        .store
        .records
        .get(&key)
        .is_none_or(|r| r.assignment.is_none())
    {
        let (id, op) = s.ctl.poll_store_op().unwrap();
        let r = s.store.apply(&op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    // Paused: the other controller takes over and sends the create.
    let mut t = take_over(&mut s, 2_000);
    assert_eq!(t.record(&key).state, ExecState::Preparing);
    assert_eq!(kinds(&t.worker), ["create"]);
    // It lets its lease lapse (the create is still out), then the first
    // controller comes back on the same store.
    t.now_ms += 2_000;
    let gap = t.now_ms - s.now_ms;
    s.store = std::mem::take(&mut t.store);
    s.now += Duration::from_millis(gap);
    s.now_ms = t.now_ms;
    s.settle();
    s.advance(3_000);
    assert!(
        !s.worker
            .iter()
            .any(|(_, op)| matches!(op, WorkerOp::Create { .. })),
        "a second create"
    );
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Failed);
    assert!(rec.reservation.is_some());
}

/// Sim finding 11 (disposable seed 4572): a controller inspects its
/// finished run's machine (the verification before the delete) and is
/// paused; another controller takes the record over, verifies, sends the
/// delete and crashes (its outcome uncertain). The first one comes back
/// with its old inspection's answer: it must not delete on it. The delete
/// goes out only under a fresh claim, and a claim (or any answer) that
/// finds the record moved by another writer drops the verification, so
/// the machine is inspected again (here: gone, so absence is recorded).
#[test]
fn a_paused_controller_never_deletes_on_a_verification_from_before_its_pause() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("r7", &cmd());
    s.settle();
    let name = s.started(&key);
    let obs = |st| Ok(WorkerReply::Machine(observation(&name, st, 1_700_000_000)));
    s.answer("exec", exited(0, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    // The verification is out when the first controller is paused.
    assert_eq!(kinds(&s.worker), ["inspect"]);
    let mut t = take_over(&mut s, 2_000);
    assert!(refenced(&t, &key));
    t.answer("inspect", obs(MachineState::Running));
    assert_eq!(kinds(&t.worker), ["delete"], "the other one deletes");
    // It crashes with its delete uncertain; its claim and lease lapse.
    t.now_ms += 2_000;
    let gap = t.now_ms - s.now_ms;
    s.store = std::mem::take(&mut t.store);
    s.now += Duration::from_millis(gap);
    s.now_ms = t.now_ms;
    // The first one's old inspection answers now: still running.
    s.answer("inspect", obs(MachineState::Running));
    s.advance(3_000);
    assert!(
        !s.worker
            .iter()
            .any(|(_, op)| matches!(op, WorkerOp::Delete { .. })),
        "a delete on a verification from before the pause: {:?}",
        kinds(&s.worker)
    );
    // It verifies again; the other's delete landed: absence, release.
    s.answer("inspect", Err(not_found()));
    let rec = s.record(&key);
    assert!(rec.absence_at_ms.is_some());
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.reservation, None);
    s.advance(3_000);
    assert!(s.worker.is_empty(), "{:?}", kinds(&s.worker));
}
