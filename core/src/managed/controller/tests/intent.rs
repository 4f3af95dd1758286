//! Between the own dispatch intent and the send (session 10, issue 12):
//! the record's claim renewed before the send (C15, fuzz finding 14's
//! "noticed") and a cancel recorded after the intent (C16, finding 15's).

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use super::machines::mkey;
use super::*;

/// A disposable execution whose own intent committed, answered after two
/// claim TTLs (the clock stepped): its worker lease and the record's claim
/// have lapsed, so the exec waits for the lease. Nothing else is out when
/// this returns except the lease renewal (not yet performed).
fn own_intent_then_lapse(s: &mut Sim, id: &str) -> RecordKey {
    let key = s.submit_disposable(id, &cmd());
    let (id, op) = s.until_intent(&key);
    let r = s.store.apply(&op);
    s.store_log.push(op);
    assert!(r.is_ok(), "{r:?}");
    let ttl = disposable_config().lease_ttl_ms;
    s.now += Duration::from_millis(2 * ttl);
    s.now_ms += 2 * ttl;
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    assert!(s.ctl.poll_worker_op().is_none(), "no exec before the lease");
    let claim = s.record(&key).claim.clone().unwrap();
    assert!(claim.until_ms <= s.now_ms, "the record's claim has lapsed");
    key
}

/// Like `Sim::settle`, one store op at a time; returns the record as
/// stored when the exec went out (if it did) and how many store ops had
/// been performed then.
fn settle_watching_the_exec(s: &mut Sim, key: &RecordKey) -> Option<(ExecutionRecord, usize)> {
    let mut at_send = None;
    loop {
        while let Some((id, op)) = s.ctl.poll_worker_op() {
            if op.name() == "exec" && at_send.is_none() {
                at_send = Some((s.record(key).clone(), s.store_log.len()));
            }
            s.worker.push((id, op));
        }
        while let Some(e) = s.ctl.poll_event() {
            s.events.push(e);
        }
        let Some((id, op)) = s.ctl.poll_store_op() else {
            return at_send;
        };
        let r = s.store.apply(&op);
        s.store_log.push(op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
}

fn sent(s: &Sim) -> bool {
    s.worker.iter().any(|(_, op)| op.name() == "exec")
}

/// Another controller's claim on `key` at `now_ms` (TTL `ttl`), then the
/// states in `to`, written directly into the store.
fn taken_by_other(s: &mut Sim, key: &RecordKey, ttl: u64, to: &[ExecState]) {
    let rec = s.record(key).clone();
    let mut row = claim::claim_exec(&rec, "ctl-other", s.now_ms, ttl).unwrap();
    for st in to {
        let patch = crate::managed::testkit::entry_patch(&row, *st);
        row = apply_exec(&row, &patch, s.now_ms).unwrap();
    }
    s.store.records.insert(key.clone(), row);
}

/// Fuzz finding 14's "noticed" (session 9): the exec went out long after
/// the intent with the record's claim lapsed, renewed only after the send.
/// The claim is now renewed first: the exec goes out under a live claim,
/// once, and the run completes.
#[test]
fn after_a_gap_the_claim_is_renewed_before_the_send() {
    let mut s = Sim::new(disposable_config());
    let key = own_intent_then_lapse(&mut s, "gap");
    let (at_send, _) = settle_watching_the_exec(&mut s, &key).expect("the exec went out");
    let claim = at_send.claim.unwrap();
    assert_eq!(claim.owner, OWNER);
    assert!(
        claim.until_ms > s.now_ms,
        "sent under a lapsed claim: {claim:?} at {}",
        s.now_ms
    );
    assert_eq!(at_send.state, ExecState::Dispatching);
    let execs = s
        .worker
        .iter()
        .filter(|(_, op)| op.name() == "exec")
        .count();
    assert_eq!(execs, 1);
    s.answer("exec", exited(0, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
}

/// The margin is the renewal cadence: a claim confirmed less than a third
/// of the TTL ago is not renewed before the send (no store round trip on
/// the usual path, the exec right after its intent); at a third it is.
#[test]
fn the_claim_is_renewed_before_the_send_from_a_third_of_the_ttl_on() {
    let ttl = disposable_config().lease_ttl_ms;
    for (gap, renewed) in [(ttl / 3 - 1, false), (ttl / 3, true)] {
        let mut s = Sim::new(disposable_config());
        let key = s.submit_disposable("third", &cmd());
        let (id, op) = s.until_intent(&key);
        let r = s.store.apply(&op);
        s.store_log.push(op);
        // The intent's answer arrives `gap` ms after the claim before it.
        s.now += Duration::from_millis(gap);
        s.now_ms += gap;
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
        let before = s.store_log.len();
        let (_, sent_at) = settle_watching_the_exec(&mut s, &key).expect("sent");
        let before_send = &s.store_log[before..sent_at];
        let claims = before_send
            .iter()
            .filter(|op| matches!(op, StoreOp::Claim { .. }))
            .count();
        assert_eq!(claims > 0, renewed, "gap {gap} ms: {before_send:?}");
    }
}

/// C15: the record's claim lapsed while the exec waited; another
/// controller claimed the record meanwhile and, finding it `dispatching`,
/// marked it `unknown`. The renewal before the send is refused
/// (`stale_claim`): this controller never sends, writes nothing, and
/// leaves the record to the other one (`held_elsewhere`).
#[test]
fn a_renewal_refused_before_the_send_sends_nothing_and_writes_nothing() {
    let mut s = Sim::new(disposable_config());
    let key = own_intent_then_lapse(&mut s, "taken");
    taken_by_other(&mut s, &key, 60_000, &[ExecState::Unknown]);
    let theirs = s.record(&key).clone();
    s.settle();
    assert!(
        !sent(&s),
        "sent under another controller's claim: {:?}",
        s.worker
    );
    assert_eq!(s.record(&key), &theirs, "written over the other's claim");
    let f = s.finished(&key).expect("the execution ended here");
    assert!(f.held_elsewhere);
    assert!(!f.dispatched);
    assert_eq!(f.error, None);
}

/// C15: another controller claimed the record while this one waited, and
/// its claim lapsed too (the record still `dispatching`). The renewal
/// succeeds under a new claim generation, a history without this
/// controller's intent: the command is never sent (`unknown`).
#[test]
fn a_renewal_under_another_generation_is_never_followed_by_a_send() {
    let mut s = Sim::new(disposable_config());
    let key = own_intent_then_lapse(&mut s, "regen");
    let generation = s.record(&key).generation;
    // Claimed by the other once this one's claim lapsed: lapsed by now.
    let rec = s.record(&key).clone();
    let lapsed = rec.claim.as_ref().unwrap().until_ms;
    let row = claim::claim_exec(&rec, "ctl-other", lapsed, 1_000).unwrap();
    assert!(row.claim.as_ref().unwrap().until_ms <= s.now_ms);
    s.store.records.insert(key.clone(), row);
    s.settle();
    assert!(!sent(&s), "sent: {:?}", s.worker);
    let rec = s.record(&key);
    assert!(rec.generation > generation + 1, "claimed anew");
    assert_eq!(rec.state, ExecState::Unknown);
}

/// Fuzz finding 15's "noticed" (session 9), C16: this controller's own
/// cancel is recorded after its intent while the exec waits for the
/// worker lease. The command is never sent: the record ends `cancelled` /
/// `not_dispatched`, and the machine is cleaned up as for any record whose
/// command never left (verify, delete, 404, absence, then the release).
#[test]
fn a_cancel_recorded_after_the_intent_before_the_send_sends_nothing() {
    let mut s = Sim::new(disposable_config());
    let key = own_intent_then_lapse(&mut s, "cancel");
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.settle();
    assert!(!sent(&s), "sent after the cancel: {:?}", s.worker);
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Cancelled);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(rec.cleanup, Cleanup::InProgress);
    let name = s.machine_of(&key);
    let running = observation(&name, MachineState::Running, 1_700_000_000);
    s.answer("inspect", Ok(WorkerReply::Machine(running)));
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    let rec = s.record(&key).clone();
    assert!(rec.absence_at_ms.is_some());
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.reservation, None);
    assert_eq!(rec.next_due_at_ms, None);
    assert!(s.worker.is_empty());
    let f = s.finished(&key).unwrap();
    assert!(!f.dispatched);
    assert_eq!(f.error, None);
    // A caller's wait ends on it.
    let out = Outcome::settle(rec, Some(f), false).expect("the wait ends");
    assert_eq!(out.record.state, ExecState::Cancelled);
}

/// The same on a caller's machine: another process cancels right after
/// the intent committed, and the intent's answer comes a third of the TTL
/// after the claim before it. The renewal before the send reads the
/// cancel: the record ends `cancelled`, nothing sent.
#[test]
fn a_cancel_read_by_the_renewal_before_the_send_sends_nothing() {
    let mut s = Sim::new(detached());
    s.settle();
    let key = s.submit("c5", &cmd());
    let is_intent = |op: &StoreOp| matches!(op, StoreOp::Write { patch, .. } if patch.state == Some(ExecState::Dispatching));
    let (id, op) = loop {
        let (id, op) = s.ctl.poll_store_op().unwrap();
        if is_intent(&op) {
            break (id, op);
        }
        let r = s.store.apply(&op);
        s.store_log.push(op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    };
    let r = s.store.apply(&op);
    s.store_log.push(op);
    let cancel = StoreOp::Cancel {
        key: key.clone(),
        now_ms: s.now_ms,
    };
    s.store.apply(&cancel).unwrap();
    let third = detached().lease_ttl_ms / 3;
    s.now += Duration::from_millis(third);
    s.now_ms += third;
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    assert!(!sent(&s), "sent after the cancel: {:?}", s.worker);
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Cancelled);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    let f = s.finished(&key).unwrap();
    assert!(!f.dispatched);
    assert_eq!(f.error, None);
}

/// The store ops between the controller's next op and the exec's send
/// (or the end when it never went out), after `first` was answered `gap`
/// ms after it was asked; `first` is the first op `pick` chooses.
fn claims_before_the_send(
    s: &mut Sim,
    key: &RecordKey,
    gap: u64,
    pick: impl Fn(&Sim, &StoreOp) -> bool,
) -> usize {
    let (id, op) = loop {
        let (id, op) = s.ctl.poll_store_op().expect("a store op");
        if pick(s, &op) {
            break (id, op);
        }
        let r = s.store.apply(&op);
        s.store_log.push(op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    };
    let r = s.store.apply(&op);
    s.store_log.push(op);
    // The answer arrives `gap` ms after the request (a slow store).
    s.now += Duration::from_millis(gap);
    s.now_ms += gap;
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    let before = s.store_log.len();
    let (_, sent_at) = settle_watching_the_exec(s, key).expect("sent");
    s.store_log[before..sent_at]
        .iter()
        .filter(|op| matches!(op, StoreOp::Claim { .. }))
        .count()
}

/// C15 (session 11): a claim's freshness counts from when it was asked,
/// not from when its answer arrived (as the worker lease's monotonic end).
/// The claim right before the intent is answered `gap` ms late and the
/// intent at once: from a third of the TTL on, counted from the request,
/// the claim is renewed before the send; below it, it is not.
#[test]
fn a_claim_answered_late_counts_from_its_request() {
    // The claim before the intent (the record is `ready` then).
    late_by_a_third_renews_once(
        detached,
        "late",
        |s, op| matches!(op, StoreOp::Claim { key: k, .. } if s.record(k).state == ExecState::Ready),
    );
}

/// Submits `id` under `cfg()` and answers the store op `pick` names late,
/// a third of the TTL less 1 ms (no renewal before the send), then exactly
/// a third (one renewal); the command completes either way.
fn late_by_a_third_renews_once(
    cfg: fn() -> ControllerConfig,
    id: &str,
    pick: impl Fn(&Sim, &StoreOp) -> bool + Copy,
) {
    let ttl = cfg().lease_ttl_ms;
    for (gap, renewals) in [(ttl / 3 - 1, 0), (ttl / 3, 1)] {
        let mut s = Sim::new(cfg());
        s.settle();
        let key = s.submit(id, &cmd());
        let n = claims_before_the_send(&mut s, &key, gap, pick);
        assert_eq!(n, renewals, "gap {gap} ms");
        s.answer_exec(exited(0, ""));
        assert_eq!(s.record(&key).state, ExecState::Completed);
    }
}

/// The same for the claim an acceptance with its intent writes (the CLI's
/// run on its machine): an acceptance answered a third of the TTL after it
/// was asked leaves the claim due for renewal before the send.
#[test]
fn an_acceptance_answered_late_counts_its_claim_from_the_request() {
    late_by_a_third_renews_once(config, "late-accept", |_, op| {
        matches!(op, StoreOp::AcceptDispatching { .. })
    });
}

/// The same for a command submitted to a retained machine's slot with its
/// claim and intent (`submit_dispatching`) answered late.
#[test]
fn a_slot_submission_answered_late_counts_its_claim_from_the_request() {
    let ttl = disposable_config().lease_ttl_ms;
    for (gap, renewals) in [(ttl / 3 - 1, 0), (ttl / 3, 1)] {
        let mut s = Sim::new(disposable_config());
        s.running_machine();
        let key = RecordKey::new("s", "late-slot").unwrap();
        let request = MachineRequest::Submit {
            machine: mkey(),
            key: key.clone(),
            command: cmd(),
            files: crate::managed::CommandFiles::default(),
        };
        s.ctl.machine(s.now, s.now_ms, request).unwrap();
        let pick = |_: &Sim, op: &StoreOp| op.name() == "submit_dispatching";
        let n = claims_before_the_send(&mut s, &key, gap, pick);
        assert_eq!(n, renewals, "gap {gap} ms");
        s.answer("exec", exited(0, ""));
        assert_eq!(s.record(&key).state, ExecState::Completed);
    }
}

/// A store whose every answer arrives a third of the TTL (+1 ms) after the
/// request: no claim is ever fresh by its request time when it arrives.
/// The op right after a claim's answer still goes out under it while its
/// whole TTL has not run out, so the command is sent after one renewal
/// (the acceptance's claim is a third of the TTL old at the intent's
/// answer), never held back by renewal after renewal.
#[test]
fn a_store_slower_than_a_third_of_the_ttl_still_sends_after_one_renewal() {
    let late = config().lease_ttl_ms / 3 + 1;
    let mut s = Sim::new(config());
    s.settle();
    let key = s.submit("slow", &cmd());
    let mut performed = Vec::new();
    while s.ctl.poll_worker_op().is_none() {
        let (id, op) = s.ctl.poll_store_op().expect("a store op, or the send");
        assert!(performed.len() < 10, "never sent: {performed:?}");
        let r = s.store.apply(&op);
        performed.push(op.name());
        s.now += Duration::from_millis(late);
        s.now_ms += late;
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    assert_eq!(performed, ["accept_dispatching", "claim"]);
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
}

/// With the exec out, a renewal answered a third of the TTL late is due
/// again at once (counted from its request): the next renewal goes out
/// with the answer, and no timer is left in the past (a driver would spin
/// on it).
#[test]
fn a_late_renewal_while_the_exec_runs_renews_again_without_a_past_timer() {
    let ttl = config().lease_ttl_ms;
    let mut s = Sim::new(config());
    s.settle();
    let key = s.submit("late-renewal", &cmd());
    s.settle();
    assert!(sent(&s));
    // Timers fire (due scans performed) until the renewal goes out.
    let (id, op) = 'renewal: loop {
        let due = s.ctl.poll_timeout().expect("a timer");
        let step = u64::try_from(due.saturating_duration_since(s.now).as_millis()).unwrap();
        s.now = due.max(s.now);
        s.now_ms += step;
        s.ctl.handle_timeout(s.now, s.now_ms);
        while let Some((id, op)) = s.ctl.poll_store_op() {
            if matches!(op, StoreOp::Claim { .. }) {
                break 'renewal (id, op);
            }
            let r = s.store.apply(&op);
            s.ctl.handle_stored(s.now, s.now_ms, id, r);
        }
    };
    let r = s.store.apply(&op);
    s.now += Duration::from_millis(ttl / 3);
    s.now_ms += ttl / 3;
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    let next = s.ctl.poll_store_op();
    assert!(
        matches!(next, Some((_, StoreOp::Claim { .. }))),
        "renewed again at once: {next:?}"
    );
    assert!(s.ctl.poll_timeout().is_none_or(|t| t > s.now));
    let (id, op) = next.unwrap();
    let r = s.store.apply(&op);
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    assert!(s.ctl.poll_timeout().is_some_and(|t| t > s.now));
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
}
