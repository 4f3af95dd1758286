//! Regressions for what the recovery simulation found in the controller
//! (tests/src/sim/README.md), and the submitter's claim at acceptance.

use super::*;

/// The accepted record carries the submitter's claim, so another
/// controller's due scan cannot take it before its submitter does; a
/// detached submitter (`claim_at_accept = false`) leaves it unclaimed.
#[test]
fn the_submitter_claims_in_the_acceptance_itself() {
    let mut s = Sim::new(config());
    s.settle();
    let key = s.submit("c1", &cmd());
    s.settle();
    let Some(StoreOp::AcceptDispatching { record, .. }) = s
        .store_log
        .iter()
        .find(|op| matches!(op, StoreOp::AcceptDispatching { record, .. } if record.key == key))
    else {
        panic!("no accept op in {:?}", s.store_log.len());
    };
    let claim = record
        .claim
        .as_ref()
        .expect("the accepted record is claimed");
    assert_eq!(claim.owner, OWNER);
    assert_eq!(claim.until_ms, T0 + config().lease_ttl_ms);
    assert_eq!(record.generation, 1);
    record.validate().unwrap();

    let mut detached = config();
    detached.claim_at_accept = false;
    let mut d = Sim::new(detached);
    d.settle();
    let key = d.submit("c2", &cmd());
    d.settle();
    let Some(StoreOp::Accept { record, .. }) = d
        .store_log
        .iter()
        .find(|op| matches!(op, StoreOp::Accept { record, .. } if record.key == key))
    else {
        panic!("no accept op");
    };
    assert!(record.claim.is_none() && record.generation == 0);
}

/// Sim finding 1 (seeds 3, 10): a renewal that fails with a `store` error
/// while the command runs must not leave `poll_timeout` in the past while
/// `handle_timeout` does nothing (a real driver would busy-loop).
#[test]
fn a_failed_claim_renewal_does_not_leave_the_timeout_in_the_past() {
    let mut s = Sim::new(config());
    let key = s.submit("spin", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1);
    // Past the renewal time (a third of the 1 s TTL); the renewal fails.
    let step = 340;
    s.now += Duration::from_millis(step);
    s.now_ms += step;
    s.store.fail_next = 1;
    s.ctl.handle_timeout(s.now, s.now_ms);
    s.settle();
    assert_eq!(s.store.fail_next, 0, "the renewal was attempted");
    let next = s.ctl.poll_timeout().unwrap();
    assert!(
        next > s.now,
        "poll_timeout is in the past after a failed renewal"
    );
    // Firing at that time renews the claim.
    let step = next.duration_since(s.now).as_millis() as u64;
    s.now = next;
    s.now_ms += step;
    s.ctl.handle_timeout(s.now, s.now_ms);
    s.settle();
    let claim = s.record(&key).claim.clone().unwrap();
    assert_eq!(claim.owner, OWNER);
    assert!(claim.until_ms > s.now_ms);
    assert!(s.ctl.poll_timeout().unwrap() > s.now);
}

/// Sim finding 3 (seeds 348, 385): a late exit after `unknown` (which
/// clears `next_due_at_ms`) is stored. A command with nothing to collect on
/// a caller's machine stores it with its completion in one commit (session
/// 11), so no crash can leave it in `collecting`; a command with outputs
/// goes through `collecting`, which must stay due
/// (`files::a_late_exit_after_unknown_left_collecting_by_a_crash_is_recovered`).
#[test]
fn a_late_exit_after_unknown_is_stored_with_its_completion_in_one_commit() {
    let mut s = Sim::new(config());
    let key = s.submit("late", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1);
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.settle();
    assert_eq!(s.record(&key).state, ExecState::Unknown);
    assert_eq!(s.record(&key).next_due_at_ms, None);
    let from = s.store_log.len();
    let (id, _) = s.worker.remove(0);
    s.ctl.handle_worker(s.now, s.now_ms, id, exited(3, ""));
    s.settle();
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Completed);
    assert!(matches!(
        rec.result,
        Some(ExecResult::Exited { exit_code: 3, .. })
    ));
    let writes: Vec<&str> = s.store_log[from..]
        .iter()
        .map(StoreOp::name)
        .filter(|n| !n.starts_with("fetch") && !n.starts_with("due"))
        .collect();
    assert_eq!(writes, ["write_steps"], "{:#?}", s.store_log);
}

/// Sim finding 2 (seed 25): this controller comes back (after a pause past
/// its claim) with the exit while another controller has marked the
/// record `unknown` and holds its claim: the exit is stored once that
/// claim lapses, never dropped.
#[test]
fn a_late_exit_is_stored_after_a_foreign_claim_on_unknown_lapses() {
    let mut s = Sim::new(config());
    let key = s.submit("paused", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1);
    // Paused past the claim: another controller claims and marks `unknown`.
    s.now += Duration::from_millis(1_500);
    s.now_ms += 1_500;
    let rec = s.record(&key).clone();
    let rec = claim::claim_exec(&rec, "other-ctl", s.now_ms, 1_000).unwrap();
    let patch = ExecPatch {
        state: Some(ExecState::Unknown),
        next_due_at_ms: Some(None),
        ..ExecPatch::default()
    };
    let rec = apply_exec(&rec, &patch, s.now_ms).unwrap();
    s.store.records.insert(key.clone(), rec);
    s.answer_exec(exited(1, ""));
    assert!(s.finished(&key).is_none(), "the exit was dropped");
    assert_eq!(s.record(&key).state, ExecState::Unknown);
    s.advance(2_000);
    let rec = s.record(&key);
    assert_eq!(rec.state, ExecState::Completed);
    assert!(matches!(
        rec.result,
        Some(ExecResult::Exited { exit_code: 1, .. })
    ));
    assert_eq!(s.finished(&key).unwrap().exit_code(), Some(1));
}

/// Sim finding 4 (seed 11334): claim renewals that keep failing with
/// `store` errors while the command runs are retried (bounded backoff)
/// for as long as the command runs; the exit is then stored.
#[test]
fn renewals_failing_while_the_command_runs_are_never_given_up() {
    let mut s = Sim::new(config());
    let key = s.submit("outage", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1);
    s.store.fail_next = 1_000;
    s.advance(10_000);
    let failed = 1_000 - s.store.fail_next;
    assert!(
        failed > MAX_STORE_RETRIES + 1,
        "{failed} renewals attempted"
    );
    assert!(
        s.finished(&key).is_none(),
        "given up while the command runs"
    );
    s.store.fail_next = 0;
    s.advance(1_000);
    let claim = s.record(&key).claim.clone().unwrap();
    assert_eq!(claim.owner, OWNER);
    assert!(claim.until_ms > s.now_ms, "claim renewed after the outage");
    s.answer_exec(exited(7, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    assert_eq!(s.finished(&key).unwrap().exit_code(), Some(7));
}

/// Sim finding 8 (retained seed 1291): while the command runs, another
/// writer commits the record with a later `updated_at` than this
/// controller's next renewal carries (there: another controller's slot
/// finish, landing between this one's read and its renewal). The store
/// refuses the renewal `validation: clock_before_updated_at`; that is a
/// stale view, not a fatal error: the record is re-read, the claim renewed
/// at its `updated_at`, and the late exit is stored.
#[test]
fn a_renewal_refused_for_a_later_updated_at_rereads_and_keeps_the_exit() {
    let mut s = Sim::new(config());
    let key = s.submit("later", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1);
    // A foreign commit, its clock 500 ms ahead; the claim stays ours.
    let mut rec = s.record(&key).clone();
    rec.version += 1;
    rec.updated_at_ms = s.now_ms + 500;
    s.store.records.insert(key.clone(), rec);
    s.advance(3 * config().lease_ttl_ms);
    let claim = s.record(&key).claim.clone().unwrap();
    assert_eq!(claim.owner, OWNER);
    assert!(claim.until_ms > s.now_ms, "the claim is still renewed");
    assert!(
        s.finished(&key).is_none(),
        "given up while the command runs"
    );
    s.answer_exec(exited(3, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    assert_eq!(s.finished(&key).unwrap().exit_code(), Some(3));
}

/// Fuzz finding (`controller` target, docs/fuzzing.md): `shutdown` stopped
/// the due scan's timer but not the machine due scan's, so with a command
/// still running `poll_timeout` stayed in the past while `handle_timeout`
/// did nothing (a driver waiting for `Stopped` would spin).
#[test]
fn shutdown_leaves_no_machine_scan_timer_in_the_past() {
    let mut s = Sim::new(config());
    s.settle();
    s.submit("sd", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1, "the command is outstanding");
    let step = config().poll_interval_ms + 1;
    s.now += Duration::from_millis(step);
    s.now_ms += step;
    s.ctl.shutdown(s.now, s.now_ms);
    s.settle();
    s.ctl.handle_timeout(s.now, s.now_ms);
    s.settle();
    assert!(s.store.fail_next == 0 && s.worker.len() == 1);
    assert!(
        s.ctl.poll_timeout().is_none_or(|t| t > s.now),
        "poll_timeout {:?} is not after now {:?}",
        s.ctl.poll_timeout(),
        s.now
    );
}

/// Fuzz finding (`controller` target): a due scan or machine due scan
/// outstanding at `shutdown` that then failed re-armed its timer, which no
/// scan would ever clear after shutdown: `poll_timeout` stayed in the past
/// while `handle_timeout` did nothing.
#[test]
fn a_scan_failing_after_shutdown_leaves_no_timer_in_the_past() {
    let mut s = Sim::new(config());
    // Both scans of the start are outstanding; then shutdown, then both fail.
    s.ctl.shutdown(s.now, s.now_ms);
    s.store.fail_next = 2;
    s.settle();
    assert_eq!(s.store.fail_next, 0, "both scans were answered with errors");
    let step = config().poll_interval_ms + 1;
    s.now += Duration::from_millis(step);
    s.now_ms += step;
    s.ctl.handle_timeout(s.now, s.now_ms);
    s.settle();
    assert!(
        s.ctl.poll_timeout().is_none_or(|t| t > s.now),
        "poll_timeout {:?} is not after now {:?}",
        s.ctl.poll_timeout(),
        s.now
    );
}

/// Fuzz finding (`controller` target): a record found `dispatching` (by
/// another controller) and then read back `accepted` (a whole-row rollback
/// in the store) was driven from that read and dispatched. A record never
/// moves back before dispatch: the controller now stops with `store` /
/// `record_went_back` and sends nothing.
#[test]
fn a_record_read_back_before_dispatch_is_never_dispatched() {
    let key = RecordKey::new("s", "back").unwrap();
    let spec = spec_for(&cmd(), &RunTarget::unverified(), WORKER, "m1").unwrap();
    let old = ExecutionRecord::accepted(key.clone(), "f".repeat(64), spec, T0).unwrap();
    let mut rec = old.clone();
    for (i, st) in crate::managed::testkit::path_to(ExecState::Dispatching)
        .iter()
        .enumerate()
    {
        let patch = crate::managed::testkit::entry_patch(&rec, *st);
        rec = apply_exec(&rec, &patch, T0 + 1 + i as u64).unwrap();
    }
    let mut s = Sim::new(config());
    s.store.records.insert(key.clone(), rec);
    // The first scan finds it possibly dispatched; then the row rolls back.
    // Later scans find nothing (what the controller forgot after it stopped
    // driving the record is the store's to guard, docs/decisions.md).
    let mut scans = 0;
    while let Some((id, op)) = s.ctl.poll_store_op() {
        let r = match op {
            StoreOp::Due { .. } if scans > 0 => Ok(StoreReply::Due {
                records: Vec::new(),
                next: None,
            }),
            _ => s.store.apply(&op),
        };
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
        if matches!(op, StoreOp::Due { .. }) && scans == 0 {
            s.store.records.insert(key.clone(), old.clone());
            scans += 1;
        }
        while let Some((id, op)) = s.ctl.poll_worker_op() {
            s.worker.push((id, op));
        }
        while let Some(e) = s.ctl.poll_event() {
            s.events.push(e);
        }
    }
    assert!(s.worker.is_empty(), "nothing is dispatched: {:?}", s.worker);
    let f = s.finished(&key).expect("the execution ended here");
    let e = f.error.as_ref().expect("with an error");
    assert_eq!(e.category(), Category::Store);
    assert_eq!(e.reason(), Reason::RecordWentBack);
}

/// Fuzz finding 4 (`controller` target, session 7): a plain acceptance
/// (no intent asked for) whose reply shows the new record `dispatching`
/// is not this process's intent; the command is never sent on it.
#[test]
fn a_plain_acceptance_shown_dispatching_is_never_sent() {
    let mut s = Sim::new(detached());
    s.settle();
    let key = s.submit("lied", &cmd());
    let (id, op) = s.ctl.poll_store_op().unwrap();
    assert!(matches!(&op, StoreOp::Accept { record, .. } if record.key == key));
    let mut r = s.store.apply(&op);
    s.store_log.push(op);
    let Ok(StoreReply::Accepted { record, existing }) = &mut r else {
        panic!("not an acceptance: {r:?}");
    };
    assert!(!*existing);
    // The store holds it `accepted`; the reply says `dispatching`.
    record.state = ExecState::Dispatching;
    record.evidence = RecordEvidence::DispatchUncertain;
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    assert_eq!(s.worker.len(), 0, "an exec went out on a reply's word");
    assert!(s.record(&key).state.is_before_dispatch());
}
/// The intent write `stop` names commits; a due scan answered with the
/// committed row arrives before the write's own answer. The command then
/// goes out once and completes.
fn own_intent_scanned_before_its_answer(
    s: &mut Sim,
    key: &RecordKey,
    stop: impl Fn(&StoreOp) -> bool,
) {
    let (id, r) = perform_until(s, stop);
    let committed = s.record(key).clone();
    assert_eq!(committed.state, ExecState::Dispatching);
    scan_shows(s, committed);
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    assert_eq!(s.worker.len(), 1, "the command goes out once");
    s.answer_exec(exited(0, ""));
    assert_eq!(s.record(key).state, ExecState::Completed);
}

/// Starts a due scan and answers it with the one row `row`.
fn scan_shows(s: &mut Sim, row: ExecutionRecord) {
    s.ctl.reconcile(s.now, s.now_ms);
    let (scan, _) = run_until(s, |op| matches!(op, StoreOp::Due { .. }));
    let due = StoreReply::Due {
        records: vec![row],
        next: None,
    };
    s.ctl.handle_stored(s.now, s.now_ms, scan, Ok(due));
}

/// `rec` as another controller leaves it: claimed by `ctl-other` at
/// `at_ms`, then moved to its dispatch intent.
fn dispatched_by_other(rec: &ExecutionRecord, at_ms: u64) -> ExecutionRecord {
    let mut row = claim::claim_exec(rec, "ctl-other", at_ms, 1_000).unwrap();
    for st in crate::managed::testkit::path_to(ExecState::Dispatching) {
        let patch = crate::managed::testkit::entry_patch(&row, *st);
        row = apply_exec(&row, &patch, at_ms).unwrap();
    }
    row
}

/// Nothing was sent, the record is still before dispatch, and the
/// execution ended with `store` / `record_went_back`; returns that error.
fn unsent_and_went_back(s: &Sim, key: &RecordKey) -> Error {
    assert!(s.worker.is_empty(), "sent: {:?}", s.worker);
    assert!(s.record(key).state.is_before_dispatch());
    let f = s.finished(key).expect("the execution ended here");
    let e = *f.error.as_ref().expect("with an error");
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Store, Reason::RecordWentBack)
    );
    e
}

/// Performs store ops in order (truthfully) until `stop` matches one,
/// which is returned unanswered; collects worker ops and events.
fn run_until(s: &mut Sim, stop: impl Fn(&StoreOp) -> bool) -> (OpId, StoreOp) {
    loop {
        while let Some((id, op)) = s.ctl.poll_worker_op() {
            s.worker.push((id, op));
        }
        while let Some(e) = s.ctl.poll_event() {
            s.events.push(e);
        }
        let (id, op) = s.ctl.poll_store_op().expect("a store op is out");
        if stop(&op) {
            return (id, op);
        }
        let r = s.store.apply(&op);
        s.store_log.push(op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
}

/// [`run_until`], then performs the op it stopped at (applied and logged);
/// its id and the store's answer, not yet handed to the controller.
fn perform_until(s: &mut Sim, stop: impl Fn(&StoreOp) -> bool) -> (OpId, StoreResult) {
    let (id, op) = run_until(s, stop);
    let r = s.store.apply(&op);
    s.store_log.push(op);
    (id, r)
}

/// Fuzz finding 5 (`controller` target, session 7, fixed in session 8):
/// a due scan read the record of an execution driven here showing another
/// controller's dispatching intent; the row was dropped. The store then
/// went back to the accepted row (a rollback the store handle did not
/// see), so this execution's own guarded writes and intent succeeded and
/// it sent the command a second time. The row now goes to the execution:
/// it re-reads the record, and a record shown possibly dispatched and then
/// read back before dispatch is `record_went_back`, nothing sent.
#[test]
fn a_scan_row_showing_another_intent_is_never_followed_by_a_send() {
    let mut s = Sim::new(detached());
    // The start's due scan stays unanswered until the record is driven.
    let (scan, _) = run_until(&mut s, |op| matches!(op, StoreOp::Due { .. }));
    let key = s.submit("twice", &cmd());
    let accept = |op: &StoreOp| matches!(op, StoreOp::Accept { record, .. } if record.key == key);
    let (id, op) = run_until(&mut s, accept);
    let r = s.store.apply(&op);
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    assert!(s.ctl.is_active(&key), "driven here from its acceptance");
    // The row as another controller wrote it: claimed, then its intent.
    let row = dispatched_by_other(s.record(&key), s.now_ms);
    let due = StoreReply::Due {
        records: vec![row],
        next: None,
    };
    s.ctl.handle_stored(s.now, s.now_ms, scan, Ok(due));
    // The store still holds (went back to) the accepted row.
    s.settle();
    let e = unsent_and_went_back(&s, &key);
    assert_eq!(
        e.evidence(),
        Evidence::DispatchUncertain,
        "shown possibly sent"
    );
    assert!(!s.finished(&key).unwrap().dispatched);
}

/// The race the fix of finding 5 must not mistake for another intent: the
/// due scan reads this execution's own intent after it committed and
/// before the write's answer arrives. The command is sent, once.
#[test]
fn a_scan_row_showing_its_own_intent_before_the_answer_still_sends_once() {
    let mut s = Sim::new(detached());
    s.settle();
    let key = s.submit("race", &cmd());
    let intent = |op: &StoreOp| {
        matches!(op, StoreOp::Write { key: k, patch, .. }
            if *k == key && patch.state == Some(ExecState::Dispatching))
    };
    own_intent_scanned_before_its_answer(&mut s, &key, intent);
}

/// The `controller` fuzz campaign of session 9 (fuzz/README.md, finding
/// 19): while the intent write is out, a due scan's page shows, under this
/// key, a row that matches the intent's outcome in state, version,
/// generation and claim but is another record (another spec and
/// fingerprint: another submission's row under this key). It was taken as
/// the early read of the own intent and the command went out. Only a row
/// of this very record is that read; any other row past `ready` forbids
/// the send: the record ends `unknown`, nothing sent.
#[test]
fn a_scan_row_of_another_record_at_the_intents_version_is_never_followed_by_a_send() {
    let mut s = Sim::new(detached());
    s.settle();
    let key = s.submit("other", &cmd());
    let intent = |op: &StoreOp| {
        matches!(op, StoreOp::Write { key: k, patch, .. }
            if *k == key && patch.state == Some(ExecState::Dispatching))
    };
    let (id, r) = perform_until(&mut s, intent);
    let mut foreign = s.record(&key).clone();
    assert_eq!(foreign.state, ExecState::Dispatching);
    foreign.fingerprint = "f".repeat(64);
    foreign.spec.queue_budget_ms += 1;
    scan_shows(&mut s, foreign);
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    assert!(s.worker.is_empty(), "sent: {:?}", s.worker);
    assert_eq!(s.record(&key).state, ExecState::Unknown);
    assert!(!s.finished(&key).expect("ended here").dispatched);
}

/// The `controller` fuzz campaign of session 8 (fuzz/README.md, finding
/// 6): like a due scan's row, the reply to a duplicate submission of a
/// record driven here was dropped. Showing another controller's intent,
/// on a store that then went back, it was followed by this execution's
/// own intent and a second send. The row now goes to the execution.
#[test]
fn a_duplicate_acceptance_showing_another_intent_is_never_followed_by_a_send() {
    let mut s = Sim::new(detached());
    s.settle();
    let key = s.submit("dup", &cmd());
    let (first, op) = run_until(&mut s, |op| matches!(op, StoreOp::Accept { .. }));
    let r = s.store.apply(&op);
    s.submit("dup", &cmd());
    s.ctl.handle_stored(s.now, s.now_ms, first, r);
    assert!(s.ctl.is_active(&key));
    let (dup, op) = run_until(&mut s, |op| matches!(op, StoreOp::Accept { .. }));
    // The duplicate's reply shows the row as another controller wrote it.
    let row = dispatched_by_other(s.record(&key), s.now_ms);
    let Ok(StoreReply::Accepted { existing, .. }) = s.store.apply(&op) else {
        panic!("not an acceptance");
    };
    assert!(existing);
    let reply = StoreReply::Accepted {
        record: row,
        existing: true,
    };
    s.ctl.handle_stored(s.now, s.now_ms, dup, Ok(reply));
    s.settle();
    unsent_and_went_back(&s, &key);
}

/// The `controller` fuzz campaign of session 8 (fuzz/README.md, finding
/// 7): a submission with its intent and a duplicate of it are both out;
/// the duplicate's reply, answered first, shows another controller's
/// intent while no execution drives the key (no room: the intent's
/// acceptance keeps the one slot). The row was dropped; the acceptance
/// then found the record `accepted` (a store gone back) and its execution
/// sent the command. The row is now kept for that execution: re-read,
/// `record_went_back`, nothing sent.
#[test]
fn a_row_shown_while_the_key_is_only_being_accepted_is_never_followed_by_a_send() {
    let mut cfg = config();
    cfg.max_active = 1;
    let mut s = Sim::new(cfg);
    s.settle();
    let key = s.submit("both", &cmd());
    s.submit("both", &cmd());
    let (with_intent, first) = s.ctl.poll_store_op().unwrap();
    assert!(matches!(first, StoreOp::AcceptDispatching { .. }));
    let (dup, op) = s.ctl.poll_store_op().unwrap();
    assert!(matches!(op, StoreOp::Accept { .. }));
    // The duplicate lands first (the record accepted); its reply shows the
    // row as another controller wrote it.
    let Ok(StoreReply::Accepted { record, .. }) = s.store.apply(&op) else {
        panic!("not an acceptance");
    };
    let later = s.now_ms + 2_000; // the submitter's claim lapsed
    let row = dispatched_by_other(&record, later);
    let reply = StoreReply::Accepted {
        record: row,
        existing: false,
    };
    s.ctl.handle_stored(s.now, s.now_ms, dup, Ok(reply));
    assert!(!s.ctl.execs.contains_key(&key), "no room: not driven");
    // The acceptance with intent finds the record `accepted`.
    let r = s.store.apply(&first);
    s.ctl.handle_stored(s.now, s.now_ms, with_intent, r);
    s.settle();
    unsent_and_went_back(&s, &key);
}

/// Fuzz finding 9 (`controller` target, session 8): while an acceptance
/// with intent was out, a due scan showed a row of the key at the very
/// state, version, generation and claim that acceptance then inserted,
/// but with another fingerprint (another record's row under this key, a
/// lie no read of this acceptance's own row can show). It was taken for
/// the acceptance's own intent read early and the command was sent. Only
/// a row identical to the inserted record is that intent; any other row
/// past `ready` means the command is never sent from here (`unknown`).
#[test]
fn a_row_like_the_acceptances_own_intent_but_of_another_record_is_never_followed_by_a_send() {
    let mut s = Sim::new(config());
    s.settle();
    let key = s.submit("own", &cmd());
    let (acc, r) = perform_until(&mut s, |op| matches!(op, StoreOp::AcceptDispatching { .. }));
    let Ok(StoreReply::Accepted { record, .. }) = &r else {
        panic!("not an acceptance");
    };
    assert_eq!(record.state, ExecState::Dispatching);
    let mut lie = record.clone();
    lie.fingerprint = lie.fingerprint.chars().rev().collect();
    assert_ne!(lie.fingerprint, record.fingerprint);
    scan_shows(&mut s, lie);
    s.ctl.handle_stored(s.now, s.now_ms, acc, r);
    s.settle();
    assert!(s.worker.is_empty(), "sent: {:?}", s.worker);
    assert_eq!(s.record(&key).state, ExecState::Unknown);
}

/// The race the fix of finding 9 must still allow: a due scan reads the
/// acceptance's own intent (the row it inserted, identical) before the
/// acceptance's answer arrives. The command is sent, once.
#[test]
fn a_scan_row_showing_the_acceptances_own_intent_before_its_answer_still_sends_once() {
    let mut s = Sim::new(config());
    s.settle();
    let key = s.submit("own", &cmd());
    own_intent_scanned_before_its_answer(&mut s, &key, |op| {
        matches!(op, StoreOp::AcceptDispatching { .. })
    });
}

/// Fuzz finding 10 (`controller` target, session 8, fixed in session 9):
/// finding 7's rule (a row past `ready` shown for a key that is only being
/// accepted is kept for the execution that acceptance starts) did not hold
/// after `shutdown`: the due scan skipped every row of an undriven key
/// before keeping it. An acceptance with intent is still driven at once
/// after shutdown, so a row of another controller's intent read while it
/// was out was forgotten and the command sent. The row is now kept during
/// shutdown too: nothing is sent, the record is marked `unknown`.
#[test]
fn a_row_shown_during_shutdown_while_the_key_is_being_accepted_is_never_followed_by_a_send() {
    let mut s = Sim::new(config());
    s.settle();
    let key = s.submit("late", &cmd());
    let (acc, op) = run_until(&mut s, |op| matches!(op, StoreOp::AcceptDispatching { .. }));
    s.ctl.reconcile(s.now, s.now_ms);
    let (scan, _) = run_until(&mut s, |op| matches!(op, StoreOp::Due { .. }));
    let StoreOp::AcceptDispatching { record, .. } = &op else {
        panic!("not an acceptance with intent");
    };
    // The scan shows the key as another controller's intent, taken after
    // the submitter's claim lapsed (a row the store then lost: the
    // acceptance inserts it afresh).
    let row = dispatched_by_other(record, s.now_ms + 2_000);
    let r = s.store.apply(&op);
    s.store_log.push(op);
    let Ok(StoreReply::Accepted { record, existing }) = &r else {
        panic!("not an acceptance");
    };
    assert!(!*existing && record.state == ExecState::Dispatching);
    s.ctl.shutdown(s.now, s.now_ms);
    let due = StoreReply::Due {
        records: vec![row],
        next: None,
    };
    s.ctl.handle_stored(s.now, s.now_ms, scan, Ok(due));
    s.ctl.handle_stored(s.now, s.now_ms, acc, r);
    s.settle();
    assert!(s.worker.is_empty(), "sent: {:?}", s.worker);
    assert_eq!(s.record(&key).state, ExecState::Unknown);
}

mod slot;

/// Fuzz finding 11 (`controller` target, session 9): the reply to this
/// execution's own intent write (`ready` → `dispatching`) showed the
/// record `accepted` under another controller's claim, a row that is not
/// that intent. The execution took any answered intent write as its own;
/// the next read showed the record `dispatching` (the intent had in fact
/// committed, the reply lied) and the command was sent, though nothing it
/// read proved that intent was its own. Only a reply that is the write's
/// outcome (`dispatching` at the next version, same generation and claim
/// of this controller) is; otherwise the intent is uncertain and the
/// command is never sent from here (`unknown`).
#[test]
fn an_intent_write_answered_with_another_row_is_never_followed_by_a_send() {
    intent_answered_with(|rec, now_ms| {
        rec.state = ExecState::Accepted;
        rec.evidence = RecordEvidence::NotDispatched;
        rec.claim = Some(Claim {
            owner: "ctl-other".into(),
            until_ms: now_ms,
        });
    });
}

/// The same with a reply that is `dispatching` at the outcome's version,
/// generation and claim but of another record (another spec under this
/// key, finding 19's rule on the reply path): not this write's outcome,
/// never sent.
#[test]
fn an_intent_write_answered_with_another_records_row_is_never_followed_by_a_send() {
    intent_answered_with(|rec, _| {
        rec.fingerprint = "f".repeat(64);
        rec.spec.queue_budget_ms += 1;
    });
}

/// A command's intent write, committed, answered with its true row as
/// `lie` rewrites it (given the wall clock): nothing is sent, the record
/// ends `unknown`.
fn intent_answered_with(lie: impl FnOnce(&mut ExecutionRecord, u64)) {
    let mut s = Sim::new(detached());
    s.settle();
    let key = s.submit("lied", &cmd());
    let intent = |op: &StoreOp| matches!(op, StoreOp::Write { patch, .. } if patch.state == Some(ExecState::Dispatching));
    let (id, mut r) = perform_until(&mut s, intent);
    let Ok(StoreReply::Record(rec)) = &mut r else {
        panic!("not a record: {r:?}");
    };
    assert_eq!(rec.state, ExecState::Dispatching, "committed");
    lie(rec, s.now_ms);
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    s.settle();
    assert!(s.worker.is_empty(), "sent: {:?}", s.worker);
    assert_eq!(s.record(&key).state, ExecState::Unknown);
}

/// Fuzz finding 12 (`controller` target, session 9): a store reply carrying
/// the largest version, followed by the reply to a write, overflowed the
/// execution's "the version this write moved to" (`version + 1`): a panic
/// on peer input in a build with overflow checks. The version is now
/// compared saturating; the lie is only a record that moved elsewhere.
#[test]
fn a_reply_at_the_largest_version_does_not_panic() {
    let mut s = Sim::new(detached());
    s.settle();
    let key = s.submit("max", &cmd());
    let claim = |op: &StoreOp| matches!(op, StoreOp::Claim { .. });
    let (id, mut r) = perform_until(&mut s, claim);
    let Ok(StoreReply::Record(rec)) = &mut r else {
        panic!("not a record: {r:?}");
    };
    rec.version = u64::MAX;
    let row = rec.clone();
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    // The next write (its guard at that version) answered with a row.
    let write = |op: &StoreOp| matches!(op, StoreOp::Write { .. });
    let (id, _) = run_until(&mut s, write);
    s.ctl
        .handle_stored(s.now, s.now_ms, id, Ok(StoreReply::Record(row)));
    s.settle();
    // Then the truthful store: the row never showed the record past
    // `ready`, so this execution's own intent (answered truthfully) may
    // send, once.
    assert!(s.worker.len() <= 1, "sent: {:?}", s.worker);
    if s.worker.len() == 1 {
        s.answer_exec(exited(0, ""));
        assert_eq!(s.record(&key).state, ExecState::Completed);
    }
}

/// A disposable execution whose own intent was answered while its worker
/// lease had lapsed, then a due row of another history (finding 16).
fn own_intent_then_another_history(s: &mut Sim) -> RecordKey {
    let key = s.submit_disposable("diverged", &cmd());
    let (id, op) = s.until_intent(&key);
    let r = s.store.apply(&op);
    s.store_log.push(op);
    let Ok(StoreReply::Record(rec)) = &r else {
        panic!("not a record: {r:?}");
    };
    let mut other = rec.clone();
    other.generation += 1;
    // The worker lease lapses before the intent's answer arrives: the
    // exec waits for its renewal.
    let ttl = disposable_config().lease_ttl_ms;
    s.now += Duration::from_millis(2 * ttl);
    s.now_ms += 2 * ttl;
    s.ctl.handle_stored(s.now, s.now_ms, id, r);
    assert!(s.ctl.poll_worker_op().is_none(), "no exec before the lease");
    s.ctl.reconcile(s.now, s.now_ms);
    // The due scan answers before the lease renewal (held meanwhile).
    let mut held = Vec::new();
    while let Some(x) = s.ctl.poll_store_op() {
        held.push(x);
    }
    let scan = held
        .iter()
        .position(|(_, op)| matches!(op, StoreOp::Due { .. }))
        .expect("the due scan is out");
    let (scan, _) = held.remove(scan);
    let due = StoreReply::Due {
        records: vec![other],
        next: None,
    };
    s.ctl.handle_stored(s.now, s.now_ms, scan, Ok(due));
    for (id, op) in held {
        let r = s.store.apply(&op);
        s.store_log.push(op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    key
}

/// Fuzz finding 16 (`controller` target, session 9): after this
/// execution's own intent was answered, while the exec waited for the
/// lapsed worker lease, a due scan showed the record at the intent's
/// version under another claim generation, a history without that intent
/// (a store gone back: another controller's claim and intent possible).
/// Rows were ignored once the intent was this execution's, and the command
/// was sent when the lease came back. A row that does not descend from
/// the own intent now forbids the send (`unknown`).
#[test]
fn a_row_after_the_own_intent_from_another_history_is_never_followed_by_a_send() {
    let mut s = Sim::new(disposable_config());
    let key = own_intent_then_another_history(&mut s);
    s.settle();
    let sent = s.worker.iter().any(|(_, op)| op.name() == "exec");
    assert!(!sent, "sent: {:?}", s.worker);
    assert_eq!(s.record(&key).state, ExecState::Unknown);
}

/// Fuzz finding 18 (`controller` target, session 9): a submission this
/// configuration refuses reads its key to resolve as a duplicate
/// (AC-12.5.2). That read showed the key's record dispatched by another
/// controller while this controller drove its own acceptance of the key;
/// the row was used only to compare fingerprints, and the execution went
/// on through its own intent and sent. The row now counts as any read of
/// the key does: a record shown possibly dispatched and then read back
/// before dispatch is `record_went_back`, nothing sent.
#[test]
fn a_refused_duplicates_read_showing_another_intent_is_never_followed_by_a_send() {
    let mut s = Sim::new(detached());
    s.settle();
    let key = s.submit("dup", &cmd());
    let (acc, r) = perform_until(&mut s, |op| matches!(op, StoreOp::Accept { .. }));
    s.ctl.handle_stored(s.now, s.now_ms, acc, r);
    // The same key for a disposable machine, which no worker here
    // creates: refused by the configuration, so the key is read first.
    let mut spec = spec_for(&cmd(), &RunTarget::unverified(), WORKER, "x").unwrap();
    spec.worker_machine = None;
    let submit = Submit {
        key: key.clone(),
        spec,
    };
    s.ctl.submit(s.now, s.now_ms, submit).unwrap();
    let (fetch, op) = run_until(&mut s, |op| matches!(op, StoreOp::Fetch { .. }));
    assert!(s.worker.is_empty());
    // Taken by another controller once this one's claim lapsed (a row
    // the store then lost).
    let rec = s.record(&key).clone();
    let lapsed = rec.claim.as_ref().map_or(s.now_ms, |c| c.until_ms + 1);
    let row = dispatched_by_other(&rec, lapsed);
    s.store_log.push(op);
    s.ctl
        .handle_stored(s.now, s.now_ms, fetch, Ok(StoreReply::Record(row)));
    s.settle();
    assert!(
        s.events.iter().any(|e| matches!(e,
            ControllerEvent::Refused { key: k, error } if *k == key
                && error.category() == Category::IdentityConflict)),
        "the duplicate is answered"
    );
    unsent_and_went_back(&s, &key);
}

/// Fuzz finding 21 (`controller` target, session 10): this controller's
/// cancel of a record it drives was answered with another record's row
/// (another key, a later version, the same claim and generation). The
/// execution took that row for its own record, ignored every later row of
/// its key (they no longer matched the key it held) and wrote under the
/// other key. A cancel is answered only by a row of the cancelled key:
/// anything else is `protocol` / `unexpected_reply`, and the execution
/// goes on with its own record.
#[test]
fn a_cancel_answered_with_another_records_row_is_a_protocol_error_not_the_record() {
    let mut s = Sim::new(detached());
    s.settle();
    let other = s.submit("other", &cmd());
    s.settle();
    s.answer_exec(exited(0, "other"));
    assert_eq!(s.record(&other).state, ExecState::Completed);
    let key = s.submit("mine", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1, "this key's command is out");
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    let (id, op) = s.ctl.poll_store_op().expect("the cancel is out");
    assert!(matches!(&op, StoreOp::Cancel { key: k, .. } if *k == key));
    // Another record's row: a later version, this record's claim.
    let mut lie = s.record(&other).clone();
    lie.version += 100;
    lie.claim = s.record(&key).claim.clone();
    lie.generation = s.record(&key).generation;
    s.ctl
        .handle_stored(s.now, s.now_ms, id, Ok(StoreReply::Record(lie)));
    s.settle();
    let answer = s.events.iter().find_map(|e| match e {
        ControllerEvent::CancelRecorded { key: k, result } if *k == key => Some(result),
        _ => None,
    });
    let e = answer
        .expect("the cancel is answered")
        .as_ref()
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Protocol, Reason::UnexpectedReply)
    );
    let other_before = s.record(&other).clone();
    s.answer_exec(exited(0, "mine"));
    let mine = s.record(&key);
    assert_eq!(mine.state, ExecState::Completed, "{mine:?}");
    assert!(matches!(
        mine.result,
        Some(ExecResult::Exited { exit_code: 0, .. })
    ));
    assert_eq!(
        *s.record(&other),
        other_before,
        "the other record untouched"
    );
}
