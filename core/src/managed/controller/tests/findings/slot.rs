//! A command submitted to a retained machine's slot, against the class of
//! fuzz findings 4, 7, 9 and 10 (a reply or row the controller took for its
//! own dispatching intent, or dropped while its own submission was out):
//! the session-9 audit of `machines/driving.rs`. The `controller` fuzz
//! target submits no retained-machine request, so these are read, not
//! fuzzed.

use super::super::machines::mkey;
use super::*;

/// Starts a submission of `cmd()` to the machine's slot, unanswered.
fn submit_to_slot_async(s: &mut Sim, id: &str) -> RecordKey {
    let key = RecordKey::new("s", id).unwrap();
    let request = MachineRequest::Submit {
        machine: mkey(),
        key: key.clone(),
        command: cmd(),
        files: crate::managed::CommandFiles::default(),
    };
    s.ctl.machine(s.now, s.now_ms, request).unwrap();
    key
}

fn nothing_sent(s: &Sim) {
    let sent = s
        .worker
        .iter()
        .any(|(_, op)| matches!(op, WorkerOp::Exec { .. } | WorkerOp::ExecStream { .. }));
    assert!(!sent, "sent: {:?}", s.worker);
}

/// Finding 4's sibling: a submission without the intent (a detached
/// submitter) whose reply shows the new command `dispatching` was taken
/// for an intent this controller wrote and the command sent. Only a
/// submission that asked for the intent can have written it.
#[test]
fn a_plain_slot_submission_shown_dispatching_is_never_sent() {
    let mut cfg = disposable_config();
    cfg.claim_at_accept = false;
    let mut s = Sim::new(cfg);
    s.running_machine();
    let key = submit_to_slot_async(&mut s, "plain");
    let (id, mut r) = perform_until(&mut s, |op| matches!(op, StoreOp::SubmitCommand { .. }));
    let Ok(StoreReply::Submitted {
        execution,
        existing,
        machine: Some(machine),
    }) = &mut r
    else {
        panic!("not a submission: {r:?}");
    };
    assert!(!*existing && machine.active_execution.as_ref() == Some(&key));
    // The store holds it `accepted`; the reply says `dispatching`.
    execution.state = ExecState::Dispatching;
    execution.evidence = RecordEvidence::DispatchUncertain;
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    nothing_sent(&s);
    assert!(s.record(&key).state.is_before_dispatch());
}

/// A submission with the intent answered with another command's record
/// (holding the slot) was driven as this controller's own intent: that
/// other command was sent. The reply of a submission is about its own key.
#[test]
fn a_slot_submission_answered_with_another_record_is_never_sent() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let key = submit_to_slot_async(&mut s, "mine");
    let (id, mut r) = perform_until(&mut s, |op| matches!(op, StoreOp::SubmitDispatching { .. }));
    let Ok(StoreReply::Submitted {
        execution,
        machine: Some(machine),
        ..
    }) = &mut r
    else {
        panic!("not a submission: {r:?}");
    };
    assert_eq!(execution.state, ExecState::Dispatching);
    let other = RecordKey::new("s", "other").unwrap();
    execution.key = other.clone();
    machine.active_execution = Some(other);
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    nothing_sent(&s);
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
}

/// Finding 7's and 10's sibling: while a submission with the intent is
/// out, the due scan shows the command's key as another controller's
/// intent (a row the store then lost: the submission inserts afresh). The
/// row was kept for an exec acceptance that never came, and the slot's
/// command was sent as this controller's own intent. It now goes to the
/// command's execution: nothing sent, the record `unknown`.
#[test]
fn a_row_shown_while_a_slot_submission_is_out_is_never_followed_by_a_send() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let key = submit_to_slot_async(&mut s, "raced");
    let (sub, op) = run_until(&mut s, |op| matches!(op, StoreOp::SubmitDispatching { .. }));
    let StoreOp::SubmitDispatching { record, .. } = &op else {
        unreachable!()
    };
    let row = dispatched_by_other(record, s.now_ms + 2_000);
    s.ctl.reconcile(s.now, s.now_ms);
    let (scan, _) = run_until(&mut s, |op| matches!(op, StoreOp::Due { .. }));
    let due = StoreReply::Due {
        records: vec![row],
        next: None,
    };
    s.ctl.handle_stored(s.now, s.now_ms, scan, Ok(due));
    let r = s.store.apply(&op);
    s.store_log.push(op);
    s.ctl.handle_stored(s.now, s.now_ms, sub, r);
    s.settle();
    nothing_sent(&s);
    assert_eq!(s.record(&key).state, ExecState::Unknown);
}
