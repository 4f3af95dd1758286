//! A worker answer that arrives while the machine task's claim renewal is
//! in flight.

use super::*;

/// Fires timers (performing every other store op) until the machine
/// task's claim renewal is emitted; returns it unperformed.
fn hold_the_renewal(s: &mut Sim) -> (OpId, StoreOp) {
    for _ in 0..100 {
        let t = s.ctl.poll_timeout().expect("a timer");
        let step = u64::try_from(t.saturating_duration_since(s.now).as_millis()).unwrap();
        s.now = t.max(s.now);
        s.now_ms += step;
        s.ctl.handle_timeout(s.now, s.now_ms);
        while let Some((id, op)) = s.ctl.poll_store_op() {
            if matches!(&op, StoreOp::ClaimMachine { key, .. } if *key == mkey()) {
                return (id, op);
            }
            let r = s.store.apply(&op);
            s.ctl.handle_stored(s.now, s.now_ms, id, r);
        }
        assert!(
            s.worker.len() == 1,
            "only the create is out: {:?}",
            s.worker
        );
    }
    panic!("no claim renewal while the create is out");
}

/// Recovery simulation, retained run, seed 7961 (finding 12): the
/// machine's create is out; its claim renewal is sent; the create's
/// answer arrives before the renewal's. The renewal's answer (not a
/// write) gave back the worker answer the *previous* store op acted on
/// (none) and so overwrote the create's answer: the task waited for a
/// reply it had already dropped, with no timer, and the record stayed
/// `creating` with `Create` dispatching for good (its due scan skips a
/// machine this controller drives). Now the answer is kept and written.
#[test]
fn a_create_answer_arriving_during_a_claim_renewal_is_written() {
    let mut s = create_out();
    assert_eq!(s.machine().operation, Op::Create);
    // The renewal falls due while the create is out; its answer is held.
    let (sid, sop) = hold_the_renewal(&mut s);
    // The create's answer arrives first.
    let (wid, wop) = s.worker.remove(0);
    assert_eq!(wop.name(), "create");
    s.ctl.handle_worker(
        s.now,
        s.now_ms,
        wid,
        Ok(WorkerReply::Machine(obs(MachineState::Created))),
    );
    s.settle();
    // Then the renewal's.
    let r = s.store.apply(&sop);
    s.ctl.handle_stored(s.now, s.now_ms, sid, r);
    s.settle();
    let m = s.machine().clone();
    assert_eq!(
        (m.state, m.operation, m.phase),
        (MS::Created, Op::None, MachinePhase::None),
        "{m:#?}"
    );
    assert!(m.creation.is_some(), "the creation evidence is recorded");
    assert_eq!(m.next_due_at_ms, None);
    assert!(s.worker.is_empty(), "nothing resent: {:?}", s.worker);
}

/// The same race with an uncertain answer (what seed 7961 had: the
/// create's reply was lost): the record becomes `unknown` with the create
/// `uncertain` (reconcile or resolve settles it) instead of staying
/// `creating` forever; the create is never sent again.
#[test]
fn an_uncertain_create_answer_arriving_during_a_claim_renewal_is_recorded() {
    let mut s = create_out();
    let (sid, sop) = hold_the_renewal(&mut s);
    let (wid, _) = s.worker.remove(0);
    s.ctl.handle_worker(
        s.now,
        s.now_ms,
        wid,
        Err(Error::transport(
            Operation::Create,
            Evidence::DispatchUncertain,
            Reason::ConnectionReset,
        )),
    );
    s.settle();
    let r = s.store.apply(&sop);
    s.ctl.handle_stored(s.now, s.now_ms, sid, r);
    s.settle();
    let m = s.machine().clone();
    assert_eq!(
        (m.state, m.operation, m.phase),
        (MS::Unknown, Op::Create, MachinePhase::Uncertain),
        "{m:#?}"
    );
    s.advance(5_000);
    assert!(
        !s.worker
            .iter()
            .any(|(_, op)| matches!(op, WorkerOp::Create { .. })),
        "never a second create"
    );
}

/// C15 (session 11): the machine task's claim counts from when its renewal
/// was asked, not from when the answer arrived: answered a sixth of the
/// TTL late, the next renewal goes out a third of the TTL after the
/// request (after the answer before).
#[test]
fn a_renewal_answered_late_counts_from_its_request() {
    let ttl = disposable_config().lease_ttl_ms;
    let mut s = create_out();
    let (sid, sop) = hold_the_renewal(&mut s);
    let asked = s.now;
    let r = s.store.apply(&sop);
    s.now += Duration::from_millis(ttl / 6);
    s.now_ms += ttl / 6;
    s.ctl.handle_stored(s.now, s.now_ms, sid, r);
    s.settle();
    let _ = hold_the_renewal(&mut s);
    assert_eq!(s.now, asked + Duration::from_millis(ttl / 3));
}
