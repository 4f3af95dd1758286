//! Disposable machines the controller owns (C12.4, C17.2).

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use super::*;
use crate::Evidence;

#[test]
fn a_disposable_run_reserves_creates_runs_deletes_observes_absence_then_releases() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("p1", &cmd());
    s.settle();
    // Reserved (lease, capacity, name) and the create intent is durable
    // before the create goes out.
    let rec = s.record(&key).clone();
    let a = rec
        .assignment
        .clone()
        .unwrap_or_else(|| panic!("{:#?} {:#?}", s.store_log, s.events));
    assert_eq!(a.worker_id, WORKER);
    assert!(rec.reservation.is_some());
    assert_eq!(rec.state, ExecState::Preparing);
    assert!(rec.creation.is_none());
    let name = a.machine_name.clone();
    let op = s.answer(
        "create",
        Ok(WorkerReply::Machine(observation(
            &name,
            MachineState::Created,
            1_700_000_000,
        ))),
    );
    let WorkerOp::Create { name: n, .. } = op else {
        unreachable!()
    };
    assert_eq!(n.as_str(), name);
    assert!(s.record(&key).creation.is_some(), "creation evidence first");
    s.answer(
        "start",
        Ok(WorkerReply::Machine(observation(
            &name,
            MachineState::Running,
            1_700_000_000,
        ))),
    );
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    let op = s.answer("exec", exited(0, "hi"));
    let WorkerOp::Exec { machine, .. } = op else {
        unreachable!()
    };
    assert_eq!(machine, name);
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(
        rec.cleanup,
        Cleanup::InProgress,
        "not complete before cleanup"
    );
    // Verify the incarnation, delete, observe the 404.
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(observation(
            &name,
            MachineState::Running,
            1_700_000_000,
        ))),
    );
    assert!(s.record(&key).reservation.is_some());
    s.answer("delete", Ok(WorkerReply::Deleted));
    assert!(
        s.record(&key).absence_at_ms.is_none(),
        "no absence before the 404"
    );
    assert!(s.record(&key).reservation.is_some());
    s.answer("inspect", Err(not_found()));
    let rec = s.record(&key).clone();
    assert!(rec.absence_at_ms.is_some());
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.reservation, None, "released in its own step");
    assert_eq!(rec.next_due_at_ms, None);
    assert!(s.worker.is_empty());
    let f = s.finished(&key).unwrap();
    assert_eq!(f.exit_code(), Some(0));
    // The release is a store op of its own, after the absence write.
    let absence = s
        .store_log
        .iter()
        .position(|op| matches!(op, StoreOp::Write { patch, .. } if patch.absence_at_ms.is_some()))
        .unwrap();
    let release = s
        .store_log
        .iter()
        .position(|op| matches!(op, StoreOp::Release { .. }))
        .unwrap();
    assert!(absence < release);
}

/// C13.4: cleanup is bounded by its deadline as well as by its attempts,
/// on the monotonic bound too (a wall clock that stood still does not
/// extend it): past it no new mutation is sent, cleanup is `failed` with
/// `cleanup_deadline`, and the reservation stays (absence never recorded).
#[test]
fn the_cleanup_deadline_ends_cleanup_without_a_delete() {
    let mut cfg = disposable_config();
    cfg.cleanup_attempts = 20;
    let mut s = Sim::new(cfg);
    let key = s.submit_disposable("cd1", &cmd());
    s.settle();
    s.started(&key);
    s.answer("exec", exited(0, "hi"));
    let rec = s.record(&key).clone();
    assert_eq!(rec.cleanup, Cleanup::InProgress);
    let deadline = rec.deadlines.cleanup_ms.unwrap();
    let flaky = || {
        Err(Error::transport(
            Operation::Get,
            Evidence::DispatchUncertain,
            Reason::Unspecified,
        ))
    };
    // Within the budget a failed check is retried.
    s.answer("inspect", flaky());
    assert_eq!(s.record(&key).cleanup, Cleanup::InProgress);
    assert_eq!(s.record(&key).cleanup_attempts, 1);
    // Past the monotonic bound with the wall clock still before the
    // stored deadline: the next failure ends cleanup.
    s.now += Duration::from_millis(deadline - s.now_ms + 1);
    assert!(s.now_ms < deadline);
    s.answer("inspect", flaky());
    let rec = s.record(&key).clone();
    assert_eq!(rec.cleanup, Cleanup::Failed);
    assert_eq!(rec.last_error.as_ref().unwrap().reason, "cleanup_deadline");
    assert!(rec.reservation.is_some(), "kept: absence never recorded");
    assert_eq!(rec.next_due_at_ms, None);
    assert!(s.worker.is_empty(), "no delete after the deadline");
    assert!(
        !s.store_log
            .iter()
            .any(|op| matches!(op, StoreOp::Release { .. }))
    );
}

#[test]
fn an_uncertain_create_is_never_resent_and_keeps_the_reservation() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("p2", &cmd());
    s.settle();
    s.answer(
        "create",
        Err(Error::transport(
            Operation::Create,
            Evidence::DispatchUncertain,
            Reason::Unspecified,
        )),
    );
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(rec.cleanup, Cleanup::Failed);
    assert!(
        rec.reservation.is_some(),
        "kept until an operator resolves it"
    );
    s.advance(2_000);
    assert!(s.worker.is_empty(), "no second create, no start, no delete");
}

#[test]
fn a_create_reply_that_does_not_match_is_not_started_or_adopted() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("p3", &cmd());
    s.settle();
    s.answer(
        "create",
        Err(Error::protocol(
            Operation::Create,
            Reason::CreateReplyMismatch,
        )),
    );
    assert_eq!(s.record(&key).state, ExecState::Failed);
    assert!(s.record(&key).creation.is_none());
    s.advance(1_000);
    assert!(s.worker.is_empty());
}

#[test]
fn a_create_refused_before_sending_records_absence_and_releases() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("p4", &cmd());
    s.settle();
    s.answer(
        "create",
        Err(Error::transport(
            Operation::Create,
            Evidence::NotDispatched,
            Reason::Unspecified,
        )),
    );
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.reservation, None);
    assert!(s.worker.is_empty());
}

#[test]
fn a_crash_after_the_create_intent_never_replays_the_create() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("p5", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1, "create out");
    // The controller dies; a new one (same store, after the claim and the
    // worker lease expire) finds the intent without creation evidence.
    let store = std::mem::take(&mut s.store);
    let mut t = Sim::new({
        let mut c = disposable_config();
        c.owner = "ctl-test-2".into();
        c
    });
    t.store = store;
    t.now_ms = s.now_ms;
    t.advance(2_000);
    assert!(t.worker.is_empty(), "no create replayed");
    // The worker lease changed hands (generation 2): the new controller
    // re-fences the record of generation 1 (`claim_version`, C15) and, as
    // the create may have been sent, fails it with the reservation kept
    // (cleanup `failed`) for an operator — never a second create.
    assert!(
        t.store_log
            .iter()
            .any(|op| matches!(op, StoreOp::ClaimVersion { key: k, .. } if *k == key))
    );
    let rec = t.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(rec.cleanup, Cleanup::Failed);
    assert_eq!(rec.assignment.as_ref().unwrap().worker_generation, 2);
    assert_eq!(
        rec.last_error.as_ref().unwrap().reason,
        "creation_uncertain"
    );
    assert!(rec.creation.is_none());
    assert!(rec.reservation.is_some(), "never released because of a 404");
    assert!(!t.finished(&key).unwrap().held_elsewhere);
}

#[test]
fn an_unknown_disposable_run_is_stopped_and_kept_within_retention() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("p6", &cmd());
    s.settle();
    let name = s.started(&key);
    let obs = |st| Ok(WorkerReply::Machine(observation(&name, st, 1_700_000_000)));
    s.answer(
        "exec",
        Err(Error::transport(
            Operation::Exec,
            Evidence::DispatchUncertain,
            Reason::Unspecified,
        )),
    );
    assert_eq!(s.record(&key).state, ExecState::Unknown);
    s.answer("stop", obs(MachineState::Stopped));
    let rec = s.record(&key).clone();
    assert!(rec.absence_at_ms.is_none(), "disks kept");
    assert!(rec.reservation.is_some());
    let retention_until = rec.deadlines.execution_ms.unwrap() + rec.spec.retention_ms;
    assert_eq!(rec.next_due_at_ms, Some(retention_until));
    assert!(s.worker.is_empty(), "no delete within retention");
}

#[test]
fn a_create_past_the_preparation_deadline_fails_and_deletes_the_machine() {
    let mut s = Sim::new(disposable_config());
    let key = RecordKey::new("s", "p7").unwrap();
    let mut target = RunTarget::unverified();
    target.profile.budgets.preparation_ms = 1_000;
    let mut spec = spec_for(&cmd(), &target, WORKER, "x").unwrap();
    spec.worker_machine = None;
    s.ctl
        .submit(
            s.now,
            s.now_ms,
            Submit {
                key: key.clone(),
                spec,
            },
        )
        .unwrap();
    s.settle();
    let name = s.record(&key).assignment.clone().unwrap().machine_name;
    // The create answers after the 1 s preparation budget (monotonic).
    s.advance(1_500);
    s.answer(
        "create",
        Ok(WorkerReply::Machine(observation(
            &name,
            MachineState::Created,
            1_700_000_000,
        ))),
    );
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(
        rec.last_error.as_ref().unwrap().reason,
        "preparation_deadline"
    );
    assert!(rec.creation.is_some());
    // No start: the verified machine is deleted instead.
    let obs = Ok(WorkerReply::Machine(observation(
        &name,
        MachineState::Created,
        1_700_000_000,
    )));
    s.answer("inspect", obs);
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    assert_eq!(s.record(&key).reservation, None);
}

/// Issue 12: the worker lease is bounded by the monotonic clock as well as
/// the wall clock. With the wall clock stepped back, the controller's wall
/// time stands still, so a lease whose renewal is not answered looked live
/// (by `until_ms`) long past its TTL, and writes on its record went on
/// under it. Past the TTL counted from its request, the lease is not live:
/// nothing is written on the record until the renewal answers.
#[test]
fn a_wall_clock_step_backwards_does_not_extend_the_worker_lease() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("wall", &cmd());
    s.settle();
    assert_eq!(s.record(&key).state, ExecState::Preparing);
    assert_eq!(s.worker.len(), 1, "the create is out");
    let ttl = disposable_config().lease_ttl_ms;
    // Two TTLs pass; the wall clock was stepped back by a minute.
    s.now += Duration::from_millis(2 * ttl);
    s.now_ms -= 60_000;
    s.ctl.handle_timeout(s.now, s.now_ms);
    let mut held = Vec::new();
    while let Some((id, op)) = s.ctl.poll_store_op() {
        held.push((id, op));
    }
    let on_record = |op: &StoreOp| {
        matches!(op, StoreOp::Claim { key: k, .. } | StoreOp::ClaimVersion { key: k, .. }
            | StoreOp::Write { key: k, .. } | StoreOp::WriteSteps { key: k, .. } if *k == key)
    };
    assert!(
        !held.iter().any(|(_, op)| on_record(op)),
        "written under a lapsed lease: {held:?}"
    );
    let renewal = held
        .iter()
        .position(|(_, op)| matches!(op, StoreOp::ClaimWorker { .. }))
        .expect("the lease renewal is out");
    let (renewal, others) = (held.remove(renewal), held);
    // Waiting for the renewal, with the create out: no timer in the past
    // (`handle_timeout` would do nothing there; a driver would spin).
    assert!(
        s.ctl.poll_timeout().is_none_or(|t| t > s.now),
        "a timer in the past while the lease has lapsed"
    );
    // The create's answer arrives: still nothing is written before the
    // renewal answers.
    let (id, _) = s.worker.remove(0);
    let name = s.record(&key).assignment.clone().unwrap().machine_name;
    let created = observation(&name, MachineState::Created, 1_700_000_000);
    s.ctl
        .handle_worker(s.now, s.now_ms, id, Ok(WorkerReply::Machine(created)));
    while let Some((_, op)) = s.ctl.poll_store_op() {
        assert!(!on_record(&op), "written under a lapsed lease: {op:?}");
    }
    assert!(s.ctl.poll_timeout().is_none_or(|t| t > s.now), "no spin");
    // The renewal answers: the creation evidence follows under the lease.
    for (id, op) in others.into_iter().chain([renewal]) {
        let r = s.store.apply(&op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    s.settle();
    assert!(s.record(&key).creation.is_some());
}

mod refused_create;
