//! What an error says about the request once something was sent (issue
//! 15): a store failure after the drain's stop reached the worker is
//! `dispatch_uncertain`, never the store call's own evidence; a refusal
//! before anything was sent stays `not_dispatched`.

use super::*;
use crate::managed::testkit::exec_in;

#[test]
fn a_store_failure_after_the_drain_stop_was_sent_is_dispatch_uncertain() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let v = s.machine().version;
    let mkey = s.machine().key.clone();
    let id = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::StopForDrain {
                key: mkey,
                version: v,
            },
        )
        .unwrap();
    s.settle();
    let name = s.machine().assignment.clone().unwrap().machine_name;
    let obs = |state| observation(&name, state, 1_700_000_000);
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    s.answer("stop", Ok(WorkerReply::Machine(obs(MachineState::Stopped))));
    // The write recording the stop fails.
    s.store.fail_next = 1;
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let e = s.answer_of(id).unwrap_err();
    assert_eq!(e.category(), Category::Store);
    assert_eq!(e.evidence(), Evidence::DispatchUncertain, "{e:?}");
}

#[test]
fn known_evidence_keeps_a_definite_error_and_corrects_a_refusal_after_a_send() {
    let k = RecordKey::new("s", "k").unwrap();
    let refusal = Error::stale_claim(
        Operation::StoreWrite,
        Evidence::NotDispatched,
        Reason::ClaimOwner,
    );
    let known = with_known_evidence;
    // Nothing sent: the refusal's own evidence.
    let ready = exec_in(ExecState::Ready, k.clone(), T0).unwrap();
    assert_eq!(
        known(refusal, Some(&ready), false).evidence(),
        Evidence::NotDispatched
    );
    // Past the intent, or sent: the outcome is uncertain.
    let dispatching = exec_in(ExecState::Dispatching, k.clone(), T0).unwrap();
    assert_eq!(
        known(refusal, Some(&dispatching), false).evidence(),
        Evidence::DispatchUncertain
    );
    assert_eq!(
        known(refusal, None, true).evidence(),
        Evidence::DispatchUncertain
    );
    // A recorded exit says more, with its code.
    let completed = exec_in(ExecState::Completed, k, T0).unwrap();
    let e = known(refusal, Some(&completed), true);
    assert_eq!(e.evidence(), Evidence::Exited);
    assert_eq!(
        e.exit_code(),
        completed.result.as_ref().and_then(ExecResult::exit_code)
    );
    // A worker's definite answer is kept.
    let exited = Error::transport(Operation::Exec, Evidence::Exited, Reason::Deadline);
    assert_eq!(
        known(exited, Some(&dispatching), true).evidence(),
        Evidence::Exited
    );
}
