//! Only the run's own intent opens (the session-9 audit of the terminal
//! run against the class of `controller` fuzz findings 4, 5 and 9: a store
//! reply taken for the run's own dispatch intent when it was not).

use super::*;

/// Opens a run, performing every store op; `lie` may rewrite the reply to
/// the first op it matches (given the op, the true reply).
fn open_with(
    sim: &mut Sim,
    id: &str,
    lie: impl Fn(&TermStoreOp, &mut TermStoreResult) -> bool,
) -> TerminalRun {
    let mut run = TerminalRun::open(
        cfg(),
        fingerprint_key(),
        key("s", id),
        sim.machine.clone(),
        ManagedTerminalSpec::default(),
        true,
    )
    .unwrap();
    let mut lied = false;
    while let Some(o) = run.poll_output() {
        match o {
            TermOutput::Store(op_id, op) => {
                let mut r = sim.fake.apply(&op);
                if !lied {
                    lied = lie(&op, &mut r);
                }
                run.handle_stored(sim.now, sim.now_ms, op_id, r);
            }
            TermOutput::Inspect { .. } => {
                run.handle_inspected(sim.now, sim.now_ms, sim.inspect);
            }
            other => sim.seen.push(other),
        }
    }
    assert!(lied, "the lie was told");
    run
}

fn write_to(op: &TermStoreOp, to: ExecState) -> bool {
    matches!(op, TermStoreOp::Write { patch, .. } if patch.state == Some(to))
}

/// [`open_with`], `lie` rewriting the record in the reply to the first
/// write to `to`.
fn open_lying_about(
    sim: &mut Sim,
    id: &str,
    to: ExecState,
    lie: impl Fn(&mut ExecutionRecord),
) -> TerminalRun {
    open_with(sim, id, |op, r| {
        if !write_to(op, to) {
            return false;
        }
        let Ok(TermStoreReply::Record(rec)) = r else {
            return false;
        };
        lie(rec);
        true
    })
}

/// The reply to a write that did not ask for the intent (`accepted` →
/// `preparing`) shows the record `dispatching`: any write's reply showing
/// `dispatching` was taken for the run's own intent and the terminal
/// opened. Only the intent write's reply is that intent; a record shown
/// past `ready` otherwise is never opened from this run, and a later read
/// showing it before dispatch ends the run (`record_went_back`), as for a
/// command (fuzz findings 3 and 5).
#[test]
fn a_write_reply_showing_dispatching_is_not_the_runs_intent() {
    let mut sim = Sim::new();
    let _run = open_lying_about(&mut sim, "t1", ExecState::Preparing, |rec| {
        // As the store would show it after `ready` and the intent (its
        // execution deadline set): only its origin is a lie.
        for st in [ExecState::Ready, ExecState::Dispatching] {
            let patch = crate::managed::testkit::entry_patch(rec, st);
            *rec = apply_exec(rec, &patch, rec.updated_at_ms).unwrap();
        }
        assert!(rec.deadlines.execution_ms.is_some());
    });
    assert_eq!(sim.opens(), 0, "opened on a reply's word");
    // Marked `unknown` under the lie's version (refused), re-read: the
    // store still holds `preparing`, so the run ends `record_went_back`.
    let e = done_error(&sim);
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Store,
            Reason::RecordWentBack,
            Evidence::DispatchUncertain
        )
    );
    assert_eq!(sim.exec("t1").state, ExecState::Preparing);
}

fn done_error(sim: &Sim) -> Error {
    let done = sim
        .events()
        .into_iter()
        .find_map(|e| match e {
            TermEvent::Done { error, .. } => Some(*error),
            _ => None,
        })
        .expect("the run ended");
    done.expect("with an error")
}

/// The reply to the run's intent write carries another record (another
/// key): it was taken for this run's intent and that record's terminal
/// opened. A reply about another record is refused; nothing opens.
#[test]
fn an_intent_reply_about_another_record_never_opens() {
    let mut sim = Sim::new();
    let _run = open_lying_about(&mut sim, "t1", ExecState::Dispatching, |rec| {
        rec.key = key("s", "t2");
    });
    assert_eq!(sim.opens(), 0, "opened for another record");
    let e = done_error(&sim);
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Protocol, Reason::UnexpectedReply)
    );
}

/// The reply to the run's intent write shows the record `dispatching`, but
/// under another claim generation and owner: not the write's own outcome
/// (the command's rule, fuzz finding 11). It was taken for the run's
/// intent and the terminal opened. Only the outcome (the next version of
/// the same record, the same generation and claim of this controller)
/// makes the intent the run's own; nothing opens, the record ends
/// `unknown`.
#[test]
fn an_intent_reply_under_another_claim_never_opens() {
    let mut sim = Sim::new();
    let _run = open_lying_about(&mut sim, "t1", ExecState::Dispatching, |rec| {
        rec.generation += 1;
        if let Some(c) = rec.claim.as_mut() {
            c.owner = "ctl-other".into();
        }
    });
    assert_eq!(sim.opens(), 0, "opened on another claim's intent");
    assert_eq!(sim.exec("t1").state, ExecState::Unknown);
}

/// C15 (session 11): a live session's claim counts from when its renewal
/// was asked, not from when the answer arrived: answered `gap` ms late,
/// the next renewal is due a third of the TTL after the request.
#[test]
fn a_renewal_answered_late_counts_from_its_request() {
    let gap = TTL / 6;
    let mut sim = Sim::new();
    let mut run = sim.open("late", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    let due = run.poll_timeout().expect("a renewal is due");
    sim.advance(due.duration_since(sim.now).as_millis() as u64);
    run.handle_timeout(sim.now, sim.now_ms);
    let asked = sim.now;
    let Some(TermOutput::Store(id, op)) = run.poll_output() else {
        unreachable!("the renewal is a store op")
    };
    assert!(matches!(*op, TermStoreOp::Claim { .. }), "{op:?}");
    let r = sim.fake.apply(&op);
    sim.advance(gap);
    run.handle_stored(sim.now, sim.now_ms, id, r);
    sim.settle(&mut run);
    assert_eq!(
        run.poll_timeout(),
        Some(asked + Duration::from_millis(TTL / 3)),
        "the next renewal counts from the request"
    );
    assert_eq!(sim.opens(), 1);
}

/// A store whose every answer arrives a third of the TTL (+1 ms) after
/// the request: a claim is never fresh by its request time when it
/// arrives, yet the op right after it goes out under it (its whole TTL
/// has not run out), so the run still reaches the open.
#[test]
fn a_store_slower_than_a_third_of_the_ttl_still_opens() {
    let late = TTL / 3 + 1;
    let mut sim = Sim::new();
    let mut run = TerminalRun::open(
        cfg(),
        fingerprint_key(),
        key("s", "slow"),
        sim.machine.clone(),
        ManagedTerminalSpec::default(),
        true,
    )
    .unwrap();
    let mut ops = 0;
    while sim.opens() == 0 {
        match run.poll_output() {
            Some(TermOutput::Store(id, op)) => {
                ops += 1;
                assert!(ops < 20, "never opened");
                let r = sim.fake.apply(&op);
                sim.advance(late);
                run.handle_stored(sim.now, sim.now_ms, id, r);
            }
            Some(TermOutput::Inspect { .. }) => {
                run.handle_inspected(sim.now, sim.now_ms, sim.inspect);
            }
            Some(other) => sim.seen.push(other),
            None => panic!("stalled after {ops} store ops"),
        }
    }
    assert_eq!(sim.exec("slow").state, ExecState::Dispatching);
}
