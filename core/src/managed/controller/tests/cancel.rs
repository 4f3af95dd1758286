//! Cancels of commands (C5): before dispatch nothing is sent, one landing
//! just before the intent makes the intent fail, one after dispatch ends
//! observation (a late exit still wins), and a settled record is unchanged.

use super::*;

#[test]
fn a_cancel_before_dispatch_sends_nothing() {
    let mut s = Sim::new(detached());
    let key = s.submit("c1", &cmd());
    // Perform only the accept, then cancel.
    let (id, op) = s.ctl.poll_store_op().unwrap();
    let r = s.store.apply(&op);
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.settle();
    assert!(s.worker.is_empty(), "nothing dispatched");
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Cancelled);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert!(
        s.events
            .iter()
            .any(|e| matches!(e, ControllerEvent::CancelRecorded { result: Ok(_), .. }))
    );
    assert!(s.finished(&key).is_some());
}

#[test]
fn a_cancel_landing_just_before_the_intent_makes_the_intent_fail() {
    let mut s = Sim::new(detached());
    let key = s.submit("c2", &cmd());
    loop {
        let (id, op) = s.ctl.poll_store_op().unwrap();
        let is_intent = matches!(&op, StoreOp::Write { patch, .. }
            if patch.state == Some(ExecState::Dispatching));
        if is_intent {
            // Another process cancels between the claim and the intent.
            s.store
                .apply(&StoreOp::Cancel {
                    key: key.clone(),
                    now_ms: s.now_ms,
                })
                .unwrap();
        }
        let r = s.store.apply(&op);
        if is_intent {
            assert!(r.is_err(), "the intent is refused");
        }
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
        if is_intent {
            break;
        }
    }
    s.settle();
    assert!(s.worker.is_empty(), "nothing dispatched");
    assert_eq!(s.record(&key).state, ExecState::Cancelled);
    assert_eq!(s.record(&key).evidence, RecordEvidence::NotDispatched);
}

#[test]
fn a_cancel_after_dispatch_ends_observation_but_a_late_exit_wins() {
    let mut s = Sim::new(config());
    let key = s.submit("c3", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1);
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.settle();
    assert_eq!(s.record(&key).state, ExecState::Unknown);
    assert!(s.record(&key).cancel_requested_at_ms.is_some());
    let states: Vec<_> = s
        .store_log
        .iter()
        .filter_map(|op| match op {
            StoreOp::Write { patch, .. } => patch.state,
            _ => None,
        })
        .collect();
    assert!(states.ends_with(&[ExecState::Cancelling, ExecState::Unknown]));
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    assert_eq!(s.record(&key).evidence, RecordEvidence::Exited);
}

#[test]
fn cancelling_a_completed_record_changes_nothing() {
    let mut s = Sim::new(config());
    let key = s.submit("c4", &cmd());
    s.settle();
    s.answer_exec(exited(0, ""));
    let before = s.record(&key).clone();
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.settle();
    assert_eq!(s.record(&key), &before);
}
