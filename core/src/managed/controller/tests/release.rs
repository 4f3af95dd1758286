//! Claims released at shutdown (C15): a successor takes over at once
//! instead of waiting out the claim TTL; a crash releases nothing.

use super::machines::{mkey, successor};
use super::*;
use crate::managed::state::MachineRecordState as MS;

fn releases(s: &Sim) -> Vec<Claimed> {
    s.store_log
        .iter()
        .filter_map(|op| match op {
            StoreOp::ReleaseClaim { claimed, .. } => Some(claimed.clone()),
            _ => None,
        })
        .collect()
}

fn stopped(s: &Sim) -> bool {
    s.events
        .iter()
        .any(|e| matches!(e, ControllerEvent::Stopped))
}

/// A running retained machine whose slot ran `c1` to completion.
fn machine_after_one_command() -> Sim {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.submit_to_slot("c1", &cmd()).unwrap();
    s.answer("exec", exited(0, "one"));
    let c1 = RecordKey::new("s", "c1").unwrap();
    assert_eq!(s.record(&c1).state, ExecState::Completed);
    assert!(s.machine().active_execution.is_none());
    s
}

#[test]
fn shutdown_releases_its_claims_and_a_successor_takes_over_at_once() {
    let mut s = machine_after_one_command();
    let before = s.machine().clone();
    assert_eq!(before.claim.as_ref().unwrap().owner, OWNER);
    assert!(before.claim.as_ref().unwrap().until_ms > s.now_ms);
    let c1 = RecordKey::new("s", "c1").unwrap();
    let c1_before = s.record(&c1).clone();
    s.ctl.shutdown(s.now, s.now_ms);
    s.settle();
    assert!(stopped(&s), "stopped once the releases are answered");
    let got = releases(&s);
    assert!(got.contains(&Claimed::Machine(mkey())), "{got:?}");
    assert!(got.contains(&Claimed::Worker(WORKER.into())), "{got:?}");
    assert!(
        !got.contains(&Claimed::Execution(c1.clone())),
        "a settled record needs nobody: no write for it"
    );
    assert_eq!(s.record(&c1), &c1_before);
    assert_eq!(s.ctl.held_claims(), 0);
    // The release changed the claim only.
    let m = s.machine().clone();
    assert_eq!(m.claim.as_ref().unwrap().until_ms, s.now_ms);
    assert_eq!(
        (m.state, m.version, m.active_execution.as_ref()),
        (MS::Running, before.version, None)
    );
    assert_eq!(s.store.leases[WORKER].until_ms, s.now_ms);
    // Another owner at the same instant: no TTL to wait out.
    let mut t = successor(&mut s);
    t.submit_to_slot("c2", &cmd()).unwrap();
    t.answer("exec", exited(0, "two"));
    let c2 = RecordKey::new("s", "c2").unwrap();
    // No time passed: the slot is finished under the successor's claim.
    assert_eq!(t.record(&c2).state, ExecState::Completed);
    assert_eq!(t.record(&c2).result.as_ref().unwrap().exit_code(), Some(0));
    assert!(t.machine().active_execution.is_none());
    assert_eq!(t.machine().claim.as_ref().unwrap().owner, "ctl-test-2");
}

#[test]
fn a_crash_releases_nothing_and_the_successor_waits_out_the_ttl() {
    let mut s = machine_after_one_command();
    // The controller dies: no shutdown.
    let mut t = successor(&mut s);
    t.submit_to_slot("c2", &cmd()).unwrap();
    t.answer("exec", exited(0, "two"));
    let c2 = RecordKey::new("s", "c2").unwrap();
    // The exit is kept, but the slot cannot be finished under the old,
    // live machine claim.
    assert_eq!(t.record(&c2).result.as_ref().unwrap().exit_code(), Some(0));
    assert_eq!(t.machine().active_execution.as_ref(), Some(&c2));
    assert_eq!(t.machine().claim.as_ref().unwrap().owner, OWNER);
    // Once the TTL (1 s) has passed, the successor finishes it.
    t.advance(1_500);
    assert_eq!(t.record(&c2).state, ExecState::Completed);
    assert!(t.machine().active_execution.is_none());
    assert_eq!(t.machine().claim.as_ref().unwrap().owner, "ctl-test-2");
}

#[test]
fn a_record_left_due_is_released_at_once_and_a_driven_one_when_it_ends() {
    let mut cfg = config();
    cfg.max_active = 1;
    let mut s = Sim::new(cfg);
    let z1 = s.submit("z1", &cmd());
    s.settle();
    let z2 = s.submit("z2", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1, "z1 runs; z2 waits in the store");
    assert_eq!(s.record(&z2).state, ExecState::Accepted);
    assert_eq!(s.record(&z2).claim.as_ref().unwrap().owner, OWNER);
    s.ctl.shutdown(s.now, s.now_ms);
    s.settle();
    assert_eq!(
        releases(&s),
        [Claimed::Execution(z2.clone())],
        "z2 at once; z1 is still driven"
    );
    let z2_rec = s.record(&z2).clone();
    assert_eq!(z2_rec.state, ExecState::Accepted, "the state stays");
    assert_eq!(z2_rec.claim.as_ref().unwrap().until_ms, s.now_ms);
    assert!(!stopped(&s));
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(&z1).state, ExecState::Completed);
    assert!(stopped(&s));
    // A successor at the same instant picks z2 up and runs it once.
    let store = std::mem::take(&mut s.store);
    let mut cfg = config();
    cfg.owner = "ctl-test-2".into();
    let mut t = Sim::new(cfg);
    t.store = store;
    t.now_ms = s.now_ms;
    t.settle();
    assert_eq!(t.worker.len(), 1, "z2 is dispatched: {:?}", t.store_log);
    t.answer_exec(exited(0, ""));
    assert_eq!(t.record(&z2).state, ExecState::Completed);
}

#[test]
fn live_terminal_runs_keep_the_machine_claims_at_shutdown() {
    let mut s = machine_after_one_command();
    // While running, with nothing driven, the worker lease was released.
    assert_eq!(releases(&s), [Claimed::Worker(WORKER.into())]);
    s.store_log.clear();
    s.ctl.set_terminals_live(s.now, true);
    s.ctl.shutdown(s.now, s.now_ms);
    s.settle();
    assert!(releases(&s).is_empty(), "{:?}", releases(&s));
    assert!(stopped(&s), "a shutdown never waits for terminal runs");
    assert_eq!(s.machine().claim.as_ref().unwrap().owner, OWNER);
    assert!(s.machine().claim.as_ref().unwrap().until_ms > s.now_ms);
    // Nothing is released after the stop.
    s.ctl.set_terminals_live(s.now, false);
    s.settle();
    assert!(releases(&s).is_empty());
}

#[test]
fn a_refused_release_is_not_retried_and_changes_nothing() {
    let mut s = machine_after_one_command();
    // Another controller took the machine over meanwhile (our claim lapsed).
    let later = s.now_ms + 2_000;
    let taken = claim::claim_machine(s.machine(), "ctl-other", later, 60_000).unwrap();
    s.store.machines.insert(mkey(), taken.clone());
    s.ctl.shutdown(s.now, s.now_ms);
    s.settle();
    assert_eq!(s.machine(), &taken, "the other controller's claim stays");
    assert!(stopped(&s));
    let n = releases(&s).len();
    assert!(n >= 1, "the machine's release was tried");
    s.ctl.handle_timeout(s.now, s.now_ms);
    s.settle();
    assert_eq!(releases(&s).len(), n, "never retried");
}

/// Sim finding 14 (disposable seed 966): a worker lease nothing of this
/// process uses any more is released at once while the controller runs,
/// not left to lapse (an idle lease kept other controllers' records on
/// that worker waiting a TTL each); the next need takes it again.
#[test]
fn an_unused_worker_lease_is_released_while_running_and_taken_again() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("l1", &cmd());
    s.settle();
    let name = s.started(&key);
    let obs = |st| Ok(WorkerReply::Machine(observation(&name, st, 1_700_000_000)));
    s.answer("exec", exited(0, ""));
    assert!(releases(&s).is_empty(), "in use while the run is driven");
    s.answer("inspect", obs(MachineState::Running));
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    assert_eq!(s.record(&key).reservation, None);
    assert_eq!(releases(&s), [Claimed::Worker(WORKER.into())]);
    assert_eq!(s.store.leases[WORKER].until_ms, s.now_ms, "ended in place");
    assert!(!stopped(&s));
    // Another controller can take the worker at once; this one needs it
    // again later and takes it (a new generation), then runs once more.
    let taken = claim::take(Some(&s.store.leases[WORKER]), "ctl-other", s.now_ms, 1_000).unwrap();
    s.store.leases.insert(WORKER.into(), taken);
    s.advance(1_500);
    let key = s.submit_disposable("l2", &cmd());
    s.settle();
    let a = s.record(&key).assignment.clone().unwrap();
    assert_eq!(a.worker_generation, 3);
    assert_eq!(
        s.worker.iter().map(|(_, op)| op.name()).collect::<Vec<_>>(),
        ["create"]
    );
}

/// A live terminal run of this process (it uses the worker lease under
/// the same owner) keeps the lease: nothing is released while running.
#[test]
fn a_live_terminal_run_keeps_the_worker_lease_while_running() {
    let mut s = Sim::new(disposable_config());
    s.ctl.set_terminals_live(s.now, true);
    s.running_machine();
    s.submit_to_slot("c1", &cmd()).unwrap();
    s.answer("exec", exited(0, "one"));
    s.advance(200);
    assert!(releases(&s).is_empty(), "{:?}", releases(&s));
}
