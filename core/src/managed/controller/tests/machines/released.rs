//! A machine claim this process ended (a settled terminal run releases the
//! machine claim it holds, under the controller's own owner) while a
//! machine task or a request flow of the same controller had just claimed
//! the machine (issue 13, left from session 6: "same owner, one window",
//! docs/decisions/runtime.md).

use super::*;
use crate::managed::claim::Release;

/// Ends this controller's claim on the machine in the store, as
/// `TerminalRun`'s `release_claim` does: owner and generation kept, the
/// claim's expiry now.
fn release_in_store(s: &mut Sim) {
    let m = s.machine().clone();
    let c = m.claim.clone().expect("claimed");
    assert_eq!(c.owner, OWNER);
    assert!(c.until_ms > s.now_ms, "the claim was live");
    let Release::Ended(next) = claim::release_machine(&m, OWNER, m.generation, s.now_ms).unwrap()
    else {
        panic!("nothing to release");
    };
    s.store.machines.insert(mkey(), next);
}

/// A stop requested right after the claim was ended: the machine task's
/// intent write is refused `stale_claim` / `claim_expired`. That claim is
/// still this owner's at the same generation (nobody else claimed since),
/// so the task re-takes it and goes on: the stop is sent now. Before, the
/// task stopped with the refusal and the stop waited for a later due scan.
#[test]
fn a_stop_whose_claim_this_process_released_meanwhile_reclaims_and_is_sent() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let version = s.machine().version;
    s.request(MachineRequest::Lifecycle {
        key: mkey(),
        action: Op::Stop,
        version,
    })
    .unwrap();
    // The task claimed and inspects (ownership check before the stop).
    assert_eq!(s.worker.first().map(|(_, op)| op.name()), Some("inspect"));
    let generation = s.machine().generation;
    release_in_store(&mut s);
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    let m = s.machine().clone();
    assert_eq!(
        (m.state, m.operation, m.phase),
        (MS::Stopping, Op::Stop, MachinePhase::Dispatching),
        "the intent is written under the re-taken claim: {m:#?}"
    );
    assert_eq!(m.generation, generation, "the same claim, re-taken");
    assert_eq!(s.worker.first().map(|(_, op)| op.name()), Some("stop"));
    s.answer("stop", Ok(WorkerReply::Machine(obs(MachineState::Stopped))));
    assert_eq!(s.machine().state, MS::Stopped);
}

/// A reconcile whose claim was ended while its inspect was out: the write
/// is refused `claim_expired`; the flow re-takes the claim, finds the
/// same generation and version (nobody else claimed or wrote), and makes
/// the same write. Before, the caller got `stale_claim`.
#[test]
fn a_reconcile_whose_claim_this_process_released_meanwhile_reclaims_and_writes() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let id = s.request_async(MachineRequest::Reconcile { key: mkey() });
    release_in_store(&mut s);
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let MachineAnswer::Machine { record, .. } = s.answer_of(id).unwrap() else {
        panic!("not a machine answer")
    };
    assert_eq!(record.state, MS::Stopped, "the observed state is recorded");
    assert!(s.worker.is_empty(), "nothing but the inspect was sent");
}

/// The re-take finds another controller's claim (it took the machine
/// over after the release): nothing is written and the answer is
/// `stale_claim`; what was inspected no longer speaks for the record.
#[test]
fn a_reconcile_whose_released_claim_another_controller_took_is_refused() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let id = s.request_async(MachineRequest::Reconcile { key: mkey() });
    release_in_store(&mut s);
    let m = s.machine().clone();
    let other = claim::claim_machine(&m, "ctl-other", s.now_ms, 60_000).unwrap();
    s.store.machines.insert(mkey(), other.clone());
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let e = s.answer_of(id).unwrap_err();
    assert_eq!(e.category(), Category::StaleClaim, "{e:?}");
    assert_eq!(s.machine(), &other, "nothing written");
}
