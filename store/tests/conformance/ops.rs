//! Conformance of the operations added for retained machines and the
//! managed runtime (C14, C17.3, C18.1): `list`, machine `due`,
//! `claim_version`, `submit`, `finish_command`, machine `max_pending` and
//! `resolve_machine`.

#[allow(clippy::wildcard_imports)]
use super::*;
use smolbox_core::Reason;

/// Moves `rec` through `states` with `owner`'s guard, one millisecond apart.
fn drive(
    s: &dyn Store,
    mut rec: ExecutionRecord,
    owner: &str,
    states: &[ExecState],
    now: u64,
) -> ExecutionRecord {
    for (i, st) in states.iter().enumerate() {
        rec = s
            .write(
                &rec.key,
                &owner_guard(&rec, owner),
                &entry_patch(&rec, *st),
                now + i as u64,
            )
            .unwrap();
    }
    rec
}

pub(crate) fn list_pages_hold_every_state_at_n_and_n_plus_one(h: &impl Harness) {
    let s = h.store();
    // One record in every state, plus a record of another scope.
    let mut expected = Vec::new();
    for (i, st) in ExecState::ALL.into_iter().enumerate() {
        let rec = driven(&*s, key("la", &format!("e{i:02}")), st, T0);
        assert_eq!(rec.state, st);
        expected.push(rec);
    }
    s.accept(&accepted(key("lz", "other"), exec_spec("x"), T0), 10_000)
        .unwrap();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = h.another().list("la", cursor.as_deref(), 4).unwrap();
        assert!(page.records.len() <= 4);
        seen.extend(page.records);
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, expected, "every state, in id order, once");
    // A full last page has a cursor; the page after it is empty with none.
    let all = s.list("la", None, ExecState::ALL.len() as u32).unwrap();
    assert_eq!(all.next.as_deref(), Some("e13"));
    let after = s.list("la", all.next.as_deref(), 10).unwrap();
    assert!(after.records.is_empty() && after.next.is_none());
    let none = s.list("nosuchscope", None, 10).unwrap();
    assert!(none.records.is_empty() && none.next.is_none());
    // Limit 100 (N) is accepted, 101 (N + 1) and 0 are refused.
    for i in 0..=MAX_LIST_PAGE {
        s.accept(
            &accepted(key("lb", &format!("b{i:03}")), exec_spec("x"), T0),
            10_000,
        )
        .unwrap();
    }
    let page = s.list("lb", None, MAX_LIST_PAGE).unwrap();
    assert_eq!(page.records.len(), 100);
    assert_eq!(page.next.as_deref(), Some("b099"));
    let rest = s.list("lb", page.next.as_deref(), MAX_LIST_PAGE).unwrap();
    assert_eq!(
        (
            rest.records.len(),
            rest.records[0].key.id.as_str(),
            rest.next
        ),
        (1, "b100", None)
    );
    for bad in [0, MAX_LIST_PAGE + 1] {
        let e = s.list("lb", None, bad).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Validation, Reason::ListLimit)
        );
    }
    assert_eq!(cat(s.list("bad scope", None, 10)), Category::Validation);
}

pub(crate) fn machine_list_includes_deleted_and_pages(h: &impl Harness) {
    let s = h.store();
    assert_eq!(DEFAULT_LIST_PAGE, 20);
    let mut expected = Vec::new();
    for i in 0..3 {
        let k = key("ml", &format!("m{i}"));
        s.accept_machine(&accepted_machine(k.clone(), machine_spec(), T0), 100)
            .unwrap();
        expected.push(s.fetch_machine(&k).unwrap());
    }
    // An unassigned accepted machine can be deleted with no worker call.
    let m = s.claim_machine(&expected[1].key, "ctl-a", T0, TTL).unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Deleted),
        ..MachinePatch::default()
    };
    expected[1] = s
        .write_machine(&m.key, &Guard::for_machine(&m, "ctl-a"), &p, T0 + 1)
        .unwrap();
    let first = h.another().list_machines("ml", None, 2).unwrap();
    assert_eq!(first.records, expected[..2].to_vec());
    assert_eq!(first.records[1].state, MachineRecordState::Deleted);
    assert_eq!(first.next.as_deref(), Some("m1"));
    let second = s.list_machines("ml", first.next.as_deref(), 2).unwrap();
    assert_eq!(
        (second.records, second.next),
        (expected[2..].to_vec(), None)
    );
    let exact = s.list_machines("ml", None, 3).unwrap();
    let empty = s.list_machines("ml", exact.next.as_deref(), 3).unwrap();
    assert!(empty.records.is_empty() && empty.next.is_none());
    assert_eq!(
        s.list_machines("ml", None, MAX_LIST_PAGE)
            .unwrap()
            .records
            .len(),
        3
    );
    for bad in [0, MAX_LIST_PAGE + 1] {
        assert_eq!(cat(s.list_machines("ml", None, bad)), Category::Validation);
    }
    // Execution and machine lists do not mix.
    assert!(s.list("ml", None, 10).unwrap().records.is_empty());
}

pub(crate) fn machine_due_pages_are_keyset_ordered(h: &impl Harness) {
    let s = h.store();
    let mut expected = Vec::new();
    for i in 0..7u64 {
        let now = T0 + (i % 3) * 10;
        let k = key(if i % 2 == 0 { "ya" } else { "yb" }, &format!("y{i}"));
        s.accept_machine(&accepted_machine(k.clone(), machine_spec(), now), 100)
            .unwrap();
        expected.push((now, k));
    }
    // One machine with nothing due and one due later are never returned.
    let k = key("ya", "idle");
    s.accept_machine(&accepted_machine(k.clone(), machine_spec(), T0), 100)
        .unwrap();
    let m = s.claim_machine(&k, "ctl-a", T0, TTL).unwrap();
    let p = MachinePatch {
        next_due_at_ms: Some(None),
        ..MachinePatch::default()
    };
    s.write_machine(&k, &Guard::for_machine(&m, "ctl-a"), &p, T0 + 1)
        .unwrap();
    s.accept_machine(
        &accepted_machine(key("ya", "later"), machine_spec(), T0 + 1_000),
        100,
    )
    .unwrap();
    expected.sort();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = h
            .another()
            .due_machines(T0 + 999, cursor.as_ref(), 2)
            .unwrap();
        assert!(page.records.len() <= 2);
        seen.extend(
            page.records
                .iter()
                .map(|r| (r.next_due_at_ms.unwrap(), r.key.clone())),
        );
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, expected);
    let empty = s.due_machines(T0 - 1, None, 100).unwrap();
    assert!(empty.records.is_empty() && empty.next.is_none());
    assert_eq!(s.due_machines(T0, None, 100).unwrap().records.len(), 3);
    assert_eq!(cat(s.due_machines(T0, None, 0)), Category::Validation);
    assert_eq!(cat(s.due_machines(T0, None, 101)), Category::Validation);
    // Machines are not in the execution scan.
    assert!(s.due(T0 + 999, None, 100).unwrap().records.is_empty());
}

/// `claim_version` re-fences an assigned record (C15): only the holder of
/// the worker's live lease, only at the version read; afterwards the
/// writer of the older worker-lease generation is fenced and the new one
/// writes.
pub(crate) fn claim_version_refences_an_assigned_record(h: &impl Harness) {
    let s = h.store();
    let k = key("cv", "rf");
    let rec = claimed(&*s, k.clone(), "ctl-a", T0);
    s.claim_worker("w1", "ctl-a", T0, 1_000).unwrap();
    let rec = s
        .reserve(
            &k,
            &owner_guard(&rec, "ctl-a"),
            &reserve_req("w1", "m-rf", 4),
            T0 + 1,
        )
        .unwrap();
    assert_eq!(rec.assignment.as_ref().unwrap().worker_generation, 1);
    // ctl-a's claim and lease lapse; ctl-b takes the worker (generation 2).
    let later = T0 + TTL + 10;
    let b = h.another();
    // Without the worker lease: refused, nothing changes.
    let e = b
        .claim_version(&k, "ctl-b", rec.version, later, 1_000)
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::StaleClaim, Reason::WorkerLease)
    );
    assert_eq!(
        b.claim_worker("w1", "ctl-b", later, 1_000)
            .unwrap()
            .generation,
        2
    );
    assert_eq!(s.fetch(&k).unwrap(), rec);
    // At another version: refused.
    assert_eq!(
        cat(b.claim_version(&k, "ctl-b", rec.version + 1, later, 1_000)),
        Category::StaleVersion
    );
    let taken = b
        .claim_version(&k, "ctl-b", rec.version, later + 1, 1_000)
        .unwrap();
    assert_eq!(taken.assignment.as_ref().unwrap().worker_generation, 2);
    assert_eq!(taken.claim.as_ref().unwrap().owner, "ctl-b");
    assert_eq!(taken.version, rec.version + 1);
    assert_eq!(s.fetch(&k).unwrap(), taken);
    // The old writer is fenced; the new one writes.
    assert_eq!(
        cat(s.write(
            &k,
            &owner_guard(&rec, "ctl-a"),
            &entry_patch(&rec, ExecState::Preparing),
            later + 2,
        )),
        Category::StaleVersion
    );
    assert_eq!(
        cat(s.write(
            &k,
            &owner_guard(&taken, "ctl-a"),
            &entry_patch(&taken, ExecState::Preparing),
            later + 2,
        )),
        Category::StaleClaim
    );
    let w = b
        .write(
            &k,
            &owner_guard(&taken, "ctl-b"),
            &entry_patch(&taken, ExecState::Preparing),
            later + 2,
        )
        .unwrap();
    assert_eq!(w.state, ExecState::Preparing);
}

pub(crate) fn claim_version_claims_only_at_that_version(h: &impl Harness) {
    let s = h.store();
    let k = key("cv", "e1");
    let rec = accepted(k.clone(), exec_spec("x"), T0);
    s.accept(&rec, 100).unwrap();
    let e = h
        .another()
        .claim_version(&k, "ctl-b", 2, T0 + 1, TTL)
        .unwrap_err();
    assert_eq!(e.category(), Category::StaleVersion);
    assert_eq!(s.fetch(&k).unwrap(), rec, "a refused claim changes nothing");
    let c = s.claim_version(&k, "ctl-a", 1, T0 + 1, TTL).unwrap();
    assert_eq!((c.version, c.generation), (2, 1));
    // The same owner renews at the new version; another owner still meets the live claim.
    assert_eq!(
        cat(h.another().claim_version(&k, "ctl-b", 2, T0 + 2, TTL)),
        Category::StaleClaim
    );
    assert_eq!(
        s.claim_version(&k, "ctl-a", 2, T0 + 2, TTL)
            .unwrap()
            .version,
        3
    );
    assert_eq!(
        cat(s.claim_version(&key("cv", "none"), "ctl-a", 1, T0, TTL)),
        Category::NotFound
    );
    // Machines.
    let mk = key("cv", "m1");
    let m = accepted_machine(mk.clone(), machine_spec(), T0);
    s.accept_machine(&m, 100).unwrap();
    assert_eq!(
        cat(s.claim_machine_version(&mk, "ctl-a", 7, T0 + 1, TTL)),
        Category::StaleVersion
    );
    assert_eq!(s.fetch_machine(&mk).unwrap(), m);
    let c = s
        .claim_machine_version(&mk, "ctl-a", 1, T0 + 1, TTL)
        .unwrap();
    // A machine claim moves its claim count, not its version.
    assert_eq!((c.version, c.generation, c.claims), (1, 1, 1));
}

fn submitted(r: Accepted<Submitted>) -> (bool, Submitted) {
    match r {
        Accepted::Inserted(x) => (true, x),
        Accepted::Existing(x) => (false, x),
    }
}

pub(crate) fn submit_accepts_and_takes_the_slot_in_one_transaction(h: &impl Harness) {
    let s = h.store();
    let mk = key("sb", "machine-1");
    running_machine(&*s, mk.clone(), "wsb", Vec::new()).unwrap();
    let cmd = |id: &str, sentinel: &str| {
        accepted(key("sb", id), managed_exec_spec(sentinel, &mk), T0 + 5)
    };
    let c1 = cmd("c1", "a");
    let (inserted, got) = submitted(s.submit(&c1, 10).unwrap());
    assert!(inserted);
    assert_eq!(got.execution, c1);
    let m = got.machine.unwrap();
    assert_eq!(m.active_execution.as_ref(), Some(&c1.key));
    assert_eq!(s.fetch_machine(&mk).unwrap(), m);
    assert_eq!(s.fetch(&c1.key).unwrap(), c1);
    // The identical command again, from another controller: the stored one,
    // even with the slot held and the pending queue full (AC-12.5.2).
    let (inserted, again) = submitted(h.another().submit(&c1, 1).unwrap());
    assert!(!inserted);
    assert_eq!(
        (again.execution, again.machine),
        (c1.clone(), Some(m.clone()))
    );
    // A changed spec under the same id conflicts.
    assert_eq!(
        cat(s.submit(&cmd("c1", "b"), 10)),
        Category::IdentityConflict
    );
    // Another command while the slot is held: refused, nothing stored.
    let c2 = cmd("c2", "a");
    let e = s.submit(&c2, 10).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::AdmissionExhausted, Reason::SlotBusy)
    );
    assert_eq!(cat(s.fetch(&c2.key)), Category::NotFound);
    assert_eq!(s.fetch_machine(&mk).unwrap(), m);
    // A disposable spec, a machine positively absent, a different profile.
    assert_eq!(
        cat(s.submit(&accepted(key("sb", "c3"), exec_spec("x"), T0), 10)),
        Category::Validation
    );
    let ghost = accepted(
        key("sb", "c4"),
        managed_exec_spec("x", &key("sb", "ghost")),
        T0,
    );
    assert_eq!(cat(s.submit(&ghost, 10)), Category::NotFound);
    let mut other = managed_exec_spec("x", &mk);
    other.profile.id = "large".into();
    assert_eq!(
        cat(s.submit(&accepted(key("sb", "c5"), other, T0), 10)),
        Category::Validation
    );
    // The command finishes; the slot frees; the next command takes it.
    let c1 = s.claim(&c1.key, "ctl-a", T0 + 6, TTL).unwrap();
    let c1 = drive(
        &*s,
        c1,
        "ctl-a",
        testkit::path_to(ExecState::Completed),
        T0 + 7,
    );
    let m = s.fetch_machine(&mk).unwrap();
    let (m, fin) = s
        .finish_slot(&mk, &Guard::for_machine(&m, "ctl-a"), &c1.key, T0 + 20)
        .unwrap();
    assert_eq!(fin, Finish::Released);
    assert!(m.active_execution.is_none());
    let c2 = accepted(key("sb", "c2"), managed_exec_spec("a", &mk), T0 + 21);
    // Pending limit: c1 is terminal, so one pending slot (N) fits c2.
    let (inserted, got) = submitted(s.submit(&c2, 1).unwrap());
    assert!(inserted);
    assert_eq!(got.machine.unwrap().active_execution, Some(c2.key.clone()));
    // N + 1: a third pending command is refused by the limit before the slot.
    let c6 = accepted(key("sb", "c6"), managed_exec_spec("a", &mk), T0 + 22);
    let e = s.submit(&c6, 1).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::AdmissionExhausted, Reason::MaxPending)
    );
    // A stopped machine has no slot to give.
    let mk2 = key("sb", "machine-2");
    let m2 = running_machine(&*s, mk2.clone(), "wsb", Vec::new()).unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Stopped),
        ..MachinePatch::default()
    };
    s.write_machine(&mk2, &Guard::for_machine(&m2, "ctl-a"), &p, T0 + 30)
        .unwrap();
    let c7 = accepted(key("sb", "c7"), managed_exec_spec("a", &mk2), T0 + 31);
    let e = s.submit(&c7, 10).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::AdmissionExhausted, Reason::MachineNotIdle)
    );
    assert_eq!(cat(s.fetch(&c7.key)), Category::NotFound);
}

pub(crate) fn submit_race_has_one_winner(h: &impl Harness) {
    for round in 0..4 {
        let mk = key("sr", &format!("machine-{round}"));
        running_machine(&*h.store(), mk.clone(), "wsr", Vec::new()).unwrap();
        let stores = [h.store(), h.another()];
        let cmds: Vec<_> = (0..2)
            .map(|i| {
                accepted(
                    key("sr", &format!("r{round}c{i}")),
                    managed_exec_spec("a", &mk),
                    T0 + 5,
                )
            })
            .collect();
        let barrier = Barrier::new(2);
        let results: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2)
                .map(|i| {
                    let (s, c, barrier) = (&stores[i], &cmds[i], &barrier);
                    sc.spawn(move || {
                        barrier.wait();
                        s.submit(c, 100)
                    })
                })
                .collect();
            hs.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let winners: Vec<usize> = (0..2).filter(|i| results[*i].is_ok()).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        let loser = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert_eq!(loser.category(), Category::AdmissionExhausted, "{loser:?}");
        assert_eq!(
            h.store().fetch_machine(&mk).unwrap().active_execution,
            Some(cmds[winners[0]].key.clone())
        );
        assert_eq!(
            cat(h.store().fetch(&cmds[1 - winners[0]].key)),
            Category::NotFound
        );
    }
}

/// A running machine on `worker` whose slot is held by a command driven to `state`.
pub(super) fn held_by(
    s: &dyn Store,
    scope: &str,
    worker: &str,
    ports: Vec<ReservedPort>,
    state: ExecState,
) -> (smolbox_core::managed::MachineRecord, ExecutionRecord) {
    let mk = key(scope, "machine-1");
    running_machine(s, mk.clone(), worker, ports).unwrap();
    let c = accepted(key(scope, "cmd"), managed_exec_spec("a", &mk), T0 + 5);
    s.submit(&c, 10).unwrap();
    let c = s.claim(&c.key, "ctl-a", T0 + 6, TTL).unwrap();
    let c = drive(s, c, "ctl-a", testkit::path_to(state), T0 + 7);
    (s.fetch_machine(&mk).unwrap(), c)
}

pub(crate) fn finish_command_sets_cleanup_with_the_slot(h: &impl Harness) {
    let s = h.store();
    let (m, c) = held_by(&*s, "fa", "wfa", Vec::new(), ExecState::Completed);
    let (m2, c2, fin) = s
        .finish_command(&m.key, &Guard::for_machine(&m, "ctl-a"), &c.key, T0 + 30)
        .unwrap();
    assert_eq!(fin, Finish::Released);
    assert!(m2.active_execution.is_none());
    assert_eq!((c2.cleanup, c2.version), (Cleanup::Complete, c.version + 1));
    assert_eq!(
        h.another().fetch(&c.key).unwrap(),
        c2,
        "in the same transaction"
    );
    assert_eq!(h.another().fetch_machine(&m.key).unwrap(), m2);
    // An unknown outcome keeps the slot; the machine becomes unknown; cleanup failed.
    let (m, c) = held_by(&*s, "fb", "wfb", Vec::new(), ExecState::Unknown);
    let (m2, fin) = s
        .finish_slot(&m.key, &Guard::for_machine(&m, "ctl-a"), &c.key, T0 + 30)
        .unwrap();
    assert_eq!(fin, Finish::Kept);
    assert_eq!(
        (m2.state, m2.active_execution.as_ref()),
        (MachineRecordState::Unknown, Some(&c.key))
    );
    assert_eq!(s.fetch(&c.key).unwrap().cleanup, Cleanup::Failed);
    assert_eq!(s.usage("wfb").unwrap().slots, 1, "capacity stays");
    // A stale machine guard changes neither record.
    let before = s.fetch(&c.key).unwrap();
    assert_eq!(
        cat(s.finish_command(&m.key, &Guard::for_machine(&m, "ctl-a"), &c.key, T0 + 31)),
        Category::StaleVersion
    );
    assert_eq!(s.fetch(&c.key).unwrap(), before);
}

/// C14.3 (session 9): only a confirmed finish frees the slot. A holder
/// whose collection failed (the exit kept, an output missing), that
/// failed, or whose outcome is unknown keeps it: the machine becomes
/// `unknown`, the command's cleanup `failed`, capacity stays, and a second
/// finish by the same holder still keeps it.
pub(crate) fn finish_command_keeps_the_slot_of_every_unconfirmed_holder(h: &impl Harness) {
    let s = h.store();
    for (i, state) in [
        ExecState::CollectionFailed,
        ExecState::Failed,
        ExecState::Unknown,
    ]
    .into_iter()
    .enumerate()
    {
        let (scope, worker) = (format!("fk{i}"), format!("wfk{i}"));
        let (m, c) = held_by(&*s, &scope, &worker, Vec::new(), state);
        let (m2, c2, fin) = s
            .finish_command(&m.key, &Guard::for_machine(&m, "ctl-a"), &c.key, T0 + 30)
            .unwrap();
        assert_eq!(fin, Finish::Kept, "{state:?}");
        assert_eq!(
            (m2.state, m2.active_execution.as_ref()),
            (MachineRecordState::Unknown, Some(&c.key)),
            "{state:?}"
        );
        assert_eq!(
            (c2.state, c2.cleanup),
            (state, Cleanup::Failed),
            "{state:?}"
        );
        assert_eq!(h.another().fetch_machine(&m.key).unwrap(), m2, "{state:?}");
        assert_eq!(
            s.usage(&worker).unwrap().slots,
            1,
            "{state:?}: capacity stays"
        );
        let (m3, _, fin) = s
            .finish_command(&m2.key, &Guard::for_machine(&m2, "ctl-a"), &c.key, T0 + 31)
            .unwrap();
        assert_eq!(fin, Finish::Kept, "{state:?}: again");
        assert_eq!(m3.active_execution.as_ref(), Some(&c.key), "{state:?}");
    }
}

pub(crate) fn machine_pending_limit_at_n_and_n_plus_one(h: &impl Harness) {
    let s = h.store();
    for i in 0..3 {
        s.accept_machine(
            &accepted_machine(key("mp", &format!("m{i}")), machine_spec(), T0),
            3,
        )
        .unwrap();
    }
    let e = s
        .accept_machine(&accepted_machine(key("mp", "m3"), machine_spec(), T0), 3)
        .unwrap_err();
    assert_eq!(
        (e.category(), e.limit().map(|l| (l.actual, l.max))),
        (Category::AdmissionExhausted, Some((4, 3)))
    );
    // A duplicate still resolves with the limit reached.
    assert!(matches!(
        s.accept_machine(&accepted_machine(key("mp", "m0"), machine_spec(), T0), 3)
            .unwrap(),
        Accepted::Existing(_)
    ));
    // A deleted machine no longer counts.
    let m = s.claim_machine(&key("mp", "m0"), "ctl-a", T0, TTL).unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Deleted),
        ..MachinePatch::default()
    };
    s.write_machine(&m.key, &Guard::for_machine(&m, "ctl-a"), &p, T0 + 1)
        .unwrap();
    s.accept_machine(&accepted_machine(key("mp", "m3"), machine_spec(), T0), 3)
        .unwrap();
    for bad in [0, 10_001] {
        assert_eq!(
            cat(s.accept_machine(&accepted_machine(key("mp", "m9"), machine_spec(), T0), bad)),
            Category::Validation
        );
    }
}

fn stopped(incarnation: &str) -> Disposition {
    Disposition::Stopped {
        observed: MachineRecordState::Stopped,
        incarnation: incarnation.into(),
    }
}

pub(crate) fn resolve_stopped_clears_the_slot_and_keeps_unknown(h: &impl Harness) {
    let s = h.store();
    let (m, c) = held_by(&*s, "ra", "wra", Vec::new(), ExecState::Unknown);
    // The slot blocks the next command.
    let next = accepted(key("ra", "next"), managed_exec_spec("b", &m.key), T0 + 40);
    assert_eq!(cat(s.submit(&next, 10)), Category::AdmissionExhausted);
    // AC-17.3.1: without quiesced = true nothing happens.
    let e = s
        .resolve_machine(&m.key, m.version, false, &stopped("inc-1"), T0 + 50)
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, Reason::NotQuiesced)
    );
    assert_eq!(
        cat(s.resolve_machine(&m.key, m.version - 1, true, &stopped("inc-1"), T0 + 50)),
        Category::StaleVersion
    );
    // AC-17.3.2: a different incarnation, or one still running.
    assert_eq!(
        cat(s.resolve_machine(&m.key, m.version, true, &stopped("inc-2"), T0 + 50)),
        Category::IdentityConflict
    );
    let running = Disposition::Stopped {
        observed: MachineRecordState::Running,
        incarnation: "inc-1".into(),
    };
    assert_eq!(
        cat(s.resolve_machine(&m.key, m.version, true, &running, T0 + 50)),
        Category::IdentityConflict
    );
    assert_eq!(
        s.fetch_machine(&m.key).unwrap(),
        m,
        "refusals change nothing"
    );
    assert_eq!(s.fetch(&c.key).unwrap(), c);
    let r = h
        .another()
        .resolve_machine(&m.key, m.version, true, &stopped("inc-1"), T0 + 50)
        .unwrap();
    assert_eq!(
        (r.machine.state, r.machine.active_execution.as_ref()),
        (MachineRecordState::Stopped, None)
    );
    assert_eq!(r.machine.resolved_at_ms, Some(T0 + 50));
    let cmd = r.command.unwrap();
    assert_eq!(
        (cmd.state, cmd.result.as_ref(), cmd.cleanup),
        (ExecState::Unknown, None, Cleanup::Complete)
    );
    assert_eq!(s.fetch(&c.key).unwrap(), cmd);
    assert_eq!(s.fetch_machine(&m.key).unwrap(), r.machine);
    assert_eq!(
        s.usage("wra").unwrap().slots,
        1,
        "a stopped machine keeps capacity"
    );
    // The old controller's guards are fenced by the versions.
    assert_eq!(
        cat(s.write(
            &c.key,
            &owner_guard(&c, "ctl-a"),
            &ExecPatch::default(),
            T0 + 51
        )),
        Category::StaleVersion
    );
    // Repeating the resolution at the old version is stale.
    assert_eq!(
        cat(s.resolve_machine(&m.key, m.version, true, &stopped("inc-1"), T0 + 52)),
        Category::StaleVersion
    );
}

pub(crate) fn resolve_deleted_releases_capacity_and_ports(h: &impl Harness) {
    let s = h.store();
    let ports = vec![ReservedPort {
        host: 8181,
        guest: 80,
    }];
    let (m, c) = held_by(&*s, "rd", "wrd", ports.clone(), ExecState::Running);
    assert_eq!(s.usage("wrd").unwrap().slots, 1);
    let r = s
        .resolve_machine(&m.key, m.version, true, &Disposition::Deleted, T0 + 50)
        .unwrap();
    assert_eq!(r.machine.state, MachineRecordState::Deleted);
    assert_eq!(r.machine.absence_at_ms, Some(T0 + 50));
    assert!(r.machine.reservation.is_none() && r.machine.reserved_ports.is_empty());
    assert_eq!(r.command.as_ref().unwrap().state, ExecState::Unknown);
    assert_eq!(s.fetch(&c.key).unwrap(), r.command.unwrap());
    assert_eq!(s.usage("wrd").unwrap(), Resources::default());
    // The port is free for another machine on the same worker.
    running_machine(&*s, key("rd", "again"), "wrd", ports).unwrap();
    // A deleted machine cannot be resolved again; the identity still resolves.
    assert_eq!(
        cat(s.resolve_machine(
            &m.key,
            r.machine.version,
            true,
            &Disposition::Deleted,
            T0 + 60
        )),
        Category::Validation
    );
    assert!(matches!(
        s.submit(
            &accepted(c.key.clone(), managed_exec_spec("a", &m.key), T0 + 5),
            10
        )
        .unwrap(),
        Accepted::Existing(_)
    ));
}

/// A machine's claim writes leave its version (issue 13): an operator's
/// versioned `resolve` at the version read before the controller renewed
/// its claim several times applies; the claim still fences controller
/// writes (owner, generation), and every other write moves the version.
pub(crate) fn machine_claims_leave_the_version(h: &impl Harness) {
    let s = h.store();
    let (read, c) = held_by(&*s, "cl", "wcl", Vec::new(), ExecState::Unknown);
    // The controller renews its machine claim three times.
    let mut m = read.clone();
    for i in 1..=3 {
        m = s
            .claim_machine(&read.key, "ctl-a", T0 + 40 + i, TTL)
            .unwrap();
        assert_eq!(
            (m.version, m.generation, m.claims),
            (read.version, read.generation, read.claims + i)
        );
        assert_eq!(m.revision(), read.revision() + i);
    }
    assert_eq!(h.another().fetch_machine(&read.key).unwrap(), m);
    // The renewed claim still fences: another owner meets it live.
    let b = h.another();
    assert_eq!(
        cat(b.claim_machine(&read.key, "ctl-b", T0 + 44, TTL)),
        Category::StaleClaim
    );
    let foreign = Guard::for_machine(&m, "ctl-b");
    assert_eq!(
        cat(b.write_machine(&read.key, &foreign, &MachinePatch::default(), T0 + 44)),
        Category::StaleClaim
    );
    assert_eq!(
        s.fetch_machine(&read.key).unwrap(),
        m,
        "refusals change nothing"
    );
    // The operator read the version before the renewals: it still applies.
    let r = b
        .resolve_machine(&read.key, read.version, true, &stopped("inc-1"), T0 + 50)
        .unwrap();
    assert_eq!(r.machine.version, read.version + 1);
    assert_eq!(
        (r.machine.state, r.machine.active_execution.as_ref()),
        (MachineRecordState::Stopped, None)
    );
    assert_eq!(r.command.unwrap().key, c.key);
    // A caller-visible write moves the version: the controller's guard of
    // the renewed claim, at the old version, is stale now.
    assert_eq!(
        cat(s.write_machine(
            &read.key,
            &Guard::for_machine(&m, "ctl-a"),
            &MachinePatch::default(),
            T0 + 51
        )),
        Category::StaleVersion
    );
    // After the claim lapses another owner takes it: the generation moves,
    // the version does not, and the old holder's guard at that same
    // version is fenced by the generation.
    // (`running_machine` claimed for ten TTLs.)
    let later = T0 + 10 * TTL + 1;
    let taken = b.claim_machine(&read.key, "ctl-b", later, TTL).unwrap();
    assert_eq!(
        (taken.version, taken.generation),
        (r.machine.version, r.machine.generation + 1)
    );
    let mut stale = taken.clone();
    stale.generation = r.machine.generation;
    let e = s
        .write_machine(
            &read.key,
            &Guard::for_machine(&stale, "ctl-a"),
            &MachinePatch::default(),
            later + 1,
        )
        .unwrap_err();
    assert_eq!(e.category(), Category::StaleClaim);
    let w = b
        .write_machine(
            &read.key,
            &Guard::for_machine(&taken, "ctl-b"),
            &MachinePatch {
                next_due_at_ms: Some(Some(later + 5)),
                ..MachinePatch::default()
            },
            later + 1,
        )
        .unwrap();
    assert_eq!((w.version, w.claims), (taken.version + 1, taken.claims));
}

/// `claim_machine_version` re-fences an assigned machine to its worker's
/// live lease (C15), as `claim_version` does for executions: only for the
/// lease holder, only at the version read; the old generation's writers are
/// fenced from then on.
pub(crate) fn claim_machine_version_refences_an_assigned_machine(h: &impl Harness) {
    let s = h.store();
    let mk = key("cmv", "machine-1");
    let m = running_machine(&*s, mk.clone(), "wcmv", Vec::new()).unwrap();
    assert_eq!(m.assignment.as_ref().unwrap().worker_generation, 1);
    // ctl-a's claim (10 TTL) and lease lapse; ctl-b takes the worker.
    let later = T0 + 10 * TTL + 10;
    let b = h.another();
    let e = b
        .claim_machine_version(&mk, "ctl-b", m.version, later, TTL)
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::StaleClaim, Reason::WorkerLease)
    );
    assert_eq!(
        b.claim_worker("wcmv", "ctl-b", later, TTL)
            .unwrap()
            .generation,
        2
    );
    // The plain claim does not re-fence: its writes stay fenced.
    let plain = b.claim_machine(&mk, "ctl-b", later, TTL).unwrap();
    let e = b
        .write_machine(
            &mk,
            &Guard::for_machine(&plain, "ctl-b"),
            &MachinePatch::default(),
            later + 1,
        )
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::StaleClaim, Reason::WorkerGeneration)
    );
    assert_eq!(
        cat(b.claim_machine_version(&mk, "ctl-b", m.version + 1, later + 1, TTL)),
        Category::StaleVersion
    );
    let taken = b
        .claim_machine_version(&mk, "ctl-b", m.version, later + 1, TTL)
        .unwrap();
    assert_eq!(taken.assignment.as_ref().unwrap().worker_generation, 2);
    assert_eq!(taken.claim.as_ref().unwrap().owner, "ctl-b");
    assert_eq!(
        taken.version, m.version,
        "re-fencing is no caller-visible change"
    );
    assert_eq!(s.fetch_machine(&mk).unwrap(), taken);
    // The old holder is fenced; the new one moves the machine forward.
    assert_eq!(
        cat(s.write_machine(
            &mk,
            &Guard::for_machine(&m, "ctl-a"),
            &MachinePatch::default(),
            later + 2
        )),
        Category::StaleClaim
    );
    let p = MachinePatch {
        state: Some(MachineRecordState::Stopping),
        operation: Some((MachineOperation::Stop, MachinePhase::Dispatching)),
        ..MachinePatch::default()
    };
    let w = b
        .write_machine(&mk, &Guard::for_machine(&taken, "ctl-b"), &p, later + 2)
        .unwrap();
    assert_eq!(
        (w.state, w.version),
        (MachineRecordState::Stopping, m.version + 1)
    );
}

/// The due page size (`MAX_DUE_PAGE`, 100), for both due scans: a page of
/// 100 (N) holds 100 due records and a cursor to the rest; 101 (N + 1) and
/// 0 are refused (`validation`, `due_limit`, with the limit).
pub(crate) fn due_page_size_at_n_and_n_plus_one(h: &impl Harness) {
    let s = h.store();
    for i in 0..=MAX_DUE_PAGE {
        s.accept(
            &accepted(key("dp", &format!("p{i:03}")), exec_spec("x"), T0),
            10_000,
        )
        .unwrap();
    }
    let page = s.due(T0 + 1, None, MAX_DUE_PAGE).unwrap();
    assert_eq!(page.records.len(), 100);
    assert!(page.next.is_some(), "a full page has a cursor");
    let rest = h
        .another()
        .due(T0 + 1, page.next.as_ref(), MAX_DUE_PAGE)
        .unwrap();
    assert_eq!(rest.records.len(), 1);
    assert!(rest.next.is_none());
    assert!(s.due_machines(T0 + 1, None, MAX_DUE_PAGE).is_ok());
    for limit in [0, MAX_DUE_PAGE + 1] {
        for e in [
            s.due(T0 + 1, None, limit).unwrap_err(),
            s.due_machines(T0 + 1, None, limit).unwrap_err(),
        ] {
            assert_eq!(
                (
                    e.category(),
                    e.reason(),
                    e.limit().map(|l| (l.actual, l.max))
                ),
                (
                    Category::Validation,
                    Reason::DueLimit,
                    Some((u64::from(limit), u64::from(MAX_DUE_PAGE)))
                )
            );
        }
    }
}
