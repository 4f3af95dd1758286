//! Recovery of records another (expired or live) controller left: what
//! may have been dispatched becomes `unknown` and is never resent, a
//! collection is finished, a `ready` record is dispatched once, and a live
//! controller's record is left alone.

use super::*;

#[test]
fn recovery_marks_possibly_dispatched_records_unknown_and_never_resends() {
    let mut s = Sim::new(config());
    let key = foreign(
        &mut s,
        "x1",
        &[
            ExecState::Preparing,
            ExecState::Ready,
            ExecState::Dispatching,
        ],
        T0 - 5_000,
    );
    s.settle();
    assert!(s.worker.is_empty());
    assert_eq!(s.record(&key).state, ExecState::Unknown);
    assert_eq!(s.record(&key).evidence, RecordEvidence::DispatchUncertain);
    assert_eq!(s.record(&key).next_due_at_ms, None);
}

#[test]
fn recovery_finishes_collection() {
    let mut s = Sim::new(config());
    let key = foreign(
        &mut s,
        "x2",
        &[
            ExecState::Preparing,
            ExecState::Ready,
            ExecState::Dispatching,
            ExecState::Collecting,
        ],
        T0 - 5_000,
    );
    s.settle();
    assert_eq!(s.record(&key).state, ExecState::Completed);
    assert!(matches!(
        s.record(&key).result,
        Some(ExecResult::Exited { exit_code: 3, .. })
    ));
}

#[test]
fn a_resumed_ready_record_dispatches_its_stored_spec_once() {
    let mut s = Sim::new(config());
    let key = foreign(
        &mut s,
        "x3",
        &[ExecState::Preparing, ExecState::Ready],
        T0 - 5_000,
    );
    s.settle();
    assert_eq!(s.worker.len(), 1);
    let WorkerOp::Exec { command, .. } = &s.worker[0].1 else {
        panic!("exec expected");
    };
    assert_eq!(command.argv(), cmd().argv());
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    // Another scan finds nothing to do.
    s.advance(500);
    assert!(s.worker.is_empty());
}

#[test]
fn a_record_held_by_a_live_controller_is_left_alone() {
    let mut s = Sim::new(config());
    let key = foreign(
        &mut s,
        "x4",
        &[
            ExecState::Preparing,
            ExecState::Ready,
            ExecState::Dispatching,
        ],
        T0 + 60_000,
    );
    let before = s.record(&key).clone();
    s.settle();
    s.advance(300);
    assert_eq!(s.record(&key), &before, "never marked unknown");
    assert!(s.worker.is_empty());
    let f = s.finished(&key).unwrap();
    assert!(f.held_elsewhere);
    // Retried only after one claim TTL: a single attempt so far.
    let claims = s
        .store_log
        .iter()
        .filter(|op| matches!(op, StoreOp::Claim { key: k, .. } if *k == key))
        .count();
    assert_eq!(claims, 1);
}

#[test]
fn a_submit_of_a_key_another_live_controller_runs_waits_for_it() {
    let mut s = Sim::new(config());
    let key = foreign(&mut s, "d2", &[ExecState::Preparing], T0 + 60_000);
    s.submit("d2", &cmd());
    s.settle();
    assert!(
        s.events
            .iter()
            .any(|e| matches!(e, ControllerEvent::Accepted { existing: true, .. }))
    );
    assert!(s.worker.is_empty());
    assert_eq!(s.record(&key).state, ExecState::Preparing);
    assert!(s.finished(&key).unwrap().held_elsewhere);
}
