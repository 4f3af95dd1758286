//! Conformance of the operations that fold commits of one command (issue
//! 16): `accept_dispatching`, `submit_dispatching` and `write_steps`, and
//! the adapters' commit counters.

#[allow(clippy::wildcard_imports)]
use super::*;
use smolbox_core::managed::record::Claim;

/// A fresh record carrying `owner`'s claim (generation 1), as a submitter
/// that claims in the acceptance writes it.
fn claimed_fresh(k: RecordKey, spec: smolbox_core::managed::ExecutionSpec) -> ExecutionRecord {
    let mut rec = accepted(k, spec, T0);
    rec.claim = Some(Claim {
        owner: "ctl-a".into(),
        until_ms: T0 + TTL,
    });
    rec.generation = 1;
    rec
}

/// Commits `f` made on `s`, when the adapter counts them.
fn commits_of<T>(s: &dyn Store, f: impl FnOnce() -> T) -> (T, Option<u64>) {
    let before = s.commits();
    let out = f();
    let after = s.commits();
    (out, before.zip(after).map(|(b, a)| a - b))
}

pub(crate) fn accept_dispatching_commits_the_claim_and_intent_in_one_transaction(h: &impl Harness) {
    let s = h.store();
    let rec = claimed_fresh(key("ad", "a1"), exec_spec("x"));
    let (got, n) = commits_of(&*s, || s.accept_dispatching(&rec, 10).unwrap());
    let Accepted::Inserted(stored) = got else {
        panic!("not inserted: {got:?}")
    };
    assert_eq!(n.unwrap_or(1), 1, "one commit");
    assert_eq!(stored.state, ExecState::Dispatching);
    assert_eq!(stored.evidence, RecordEvidence::DispatchUncertain);
    assert_eq!(stored.claim, rec.claim);
    assert_eq!(stored.generation, 1);
    // accepted → preparing → ready → dispatching in one insertion (version
    // 1), with the deadlines of the states it entered.
    assert_eq!(stored.version, 1);
    assert!(stored.deadlines.preparation_ms.is_some());
    assert!(stored.deadlines.execution_ms.is_some());
    assert_eq!(s.fetch(&rec.key).unwrap(), stored);
    // The same identity again, from another controller: the stored record,
    // untouched; a changed spec conflicts.
    assert_eq!(
        h.another().accept_dispatching(&rec, 10).unwrap(),
        Accepted::Existing(stored.clone())
    );
    let changed = claimed_fresh(key("ad", "a1"), exec_spec("y"));
    assert_eq!(
        cat(s.accept_dispatching(&changed, 10)),
        Category::IdentityConflict
    );
    // The claim it carries guards the next write.
    let next = s
        .write(
            &rec.key,
            &owner_guard(&stored, "ctl-a"),
            &entry_patch(&stored, ExecState::Collecting),
            T0 + 1,
        )
        .unwrap();
    assert_eq!((next.state, next.version), (ExecState::Collecting, 2));
    assert_eq!(
        cat(s.write(
            &rec.key,
            &owner_guard(&next, "ctl-b"),
            &entry_patch(&next, ExecState::Completed),
            T0 + 2,
        )),
        Category::StaleClaim
    );
}

pub(crate) fn accept_dispatching_refuses_without_a_live_claim_and_stores_nothing(h: &impl Harness) {
    let s = h.store();
    let bare = accepted(key("ad", "b1"), exec_spec("x"), T0);
    let e = s.accept_dispatching(&bare, 10).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Validation, "intent_without_claim")
    );
    assert_eq!(cat(s.fetch(&bare.key)), Category::NotFound);
    let mut expired = claimed_fresh(key("ad", "b2"), exec_spec("x"));
    if let Some(c) = expired.claim.as_mut() {
        c.until_ms = T0;
    }
    assert_eq!(
        cat(s.accept_dispatching(&expired, 10)),
        Category::Validation
    );
    assert_eq!(cat(s.fetch(&expired.key)), Category::NotFound);
    // An identity already accepted without its intent stays as stored: the
    // intent is written only with an insertion.
    let plain = accepted(key("ad", "b3"), exec_spec("x"), T0);
    s.accept(&plain, 10).unwrap();
    let mut again = plain.clone();
    again.claim = Some(Claim {
        owner: "ctl-a".into(),
        until_ms: T0 + TTL,
    });
    again.generation = 1;
    assert_eq!(
        s.accept_dispatching(&again, 10).unwrap(),
        Accepted::Existing(plain.clone())
    );
    assert_eq!(s.fetch(&plain.key).unwrap().state, ExecState::Accepted);
}

pub(crate) fn accept_dispatching_pending_limit_at_n_and_n_plus_one(h: &impl Harness) {
    let s = h.store();
    s.accept(&accepted(key("ap", "p0"), exec_spec("x"), T0), 10)
        .unwrap();
    // N = 2 pending records: the second is accepted with its intent.
    let second = claimed_fresh(key("ap", "p1"), exec_spec("x"));
    assert!(matches!(
        s.accept_dispatching(&second, 2).unwrap(),
        Accepted::Inserted(_)
    ));
    // N + 1: refused, nothing stored; the duplicate still resolves.
    let third = claimed_fresh(key("ap", "p2"), exec_spec("x"));
    let e = s.accept_dispatching(&third, 2).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::AdmissionExhausted, "max_pending")
    );
    assert_eq!(cat(s.fetch(&third.key)), Category::NotFound);
    assert!(matches!(
        s.accept_dispatching(&second, 2).unwrap(),
        Accepted::Existing(_)
    ));
}

pub(crate) fn submit_dispatching_takes_the_slot_and_commits_the_intent(h: &impl Harness) {
    let s = h.store();
    let mk = key("sd", "machine-1");
    let before = running_machine(&*s, mk.clone(), "wsd", Vec::new()).unwrap();
    let c1 = claimed_fresh(key("sd", "c1"), managed_exec_spec("a", &mk));
    let (got, n) = commits_of(&*s, || s.submit_dispatching(&c1, 10).unwrap());
    let Accepted::Inserted(sub) = got else {
        panic!("not inserted: {got:?}")
    };
    assert_eq!(n.unwrap_or(1), 1, "one commit");
    assert_eq!(sub.execution.state, ExecState::Dispatching);
    assert_eq!(sub.execution.evidence, RecordEvidence::DispatchUncertain);
    assert_eq!(sub.execution.version, 1);
    let m = sub.machine.clone().unwrap();
    assert_eq!(m.active_execution.as_ref(), Some(&c1.key));
    // The machine is claimed for the command's claimer in the same commit
    // (renewed here: the same owner held it), one version.
    assert_eq!(m.claim.as_ref().map(|c| c.owner.as_str()), Some("ctl-a"));
    assert_eq!(m.version, before.version + 1);
    assert_eq!(s.fetch(&c1.key).unwrap(), sub.execution);
    assert_eq!(s.fetch_machine(&mk).unwrap(), m);
    // Again: the stored command and machine, untouched.
    assert!(matches!(
        h.another().submit_dispatching(&c1, 1).unwrap(),
        Accepted::Existing(x) if x.execution == sub.execution && x.machine == Some(m.clone())
    ));
    // Another command while the slot is held: refused, nothing stored.
    let c2 = claimed_fresh(key("sd", "c2"), managed_exec_spec("a", &mk));
    let e = s.submit_dispatching(&c2, 10).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::AdmissionExhausted, "slot_busy")
    );
    assert_eq!(cat(s.fetch(&c2.key)), Category::NotFound);
    // Without a claim nothing is stored and the slot stays free.
    let mk2 = key("sd", "machine-2");
    running_machine(&*s, mk2.clone(), "wsd2", Vec::new()).unwrap();
    let bare = accepted(key("sd", "c3"), managed_exec_spec("a", &mk2), T0);
    assert_eq!(cat(s.submit_dispatching(&bare, 10)), Category::Validation);
    assert_eq!(cat(s.fetch(&bare.key)), Category::NotFound);
    assert!(s.fetch_machine(&mk2).unwrap().active_execution.is_none());
    // A machine another controller holds keeps its claim: the slot and the
    // intent are taken, the claim is not.
    let mut other = claimed_fresh(key("sd", "c4"), managed_exec_spec("a", &mk2));
    if let Some(c) = other.claim.as_mut() {
        c.owner = "ctl-b".into();
    }
    let held = s.fetch_machine(&mk2).unwrap();
    let Accepted::Inserted(sub) = s.submit_dispatching(&other, 10).unwrap() else {
        panic!("not inserted")
    };
    let m2 = sub.machine.unwrap();
    assert_eq!(m2.claim, held.claim);
    assert_eq!(m2.generation, held.generation);
    assert_eq!(m2.active_execution.as_ref(), Some(&other.key));
}

pub(crate) fn write_steps_applies_each_patch_by_the_rules_in_one_commit(h: &impl Harness) {
    let s = h.store();
    let rec = claimed(&*s, key("ws", "w1"), "ctl-a", T0);
    let g = owner_guard(&rec, "ctl-a");
    let patches = |states: &[ExecState]| {
        let mut cur = rec.clone();
        let mut out = Vec::new();
        for st in states {
            let p = entry_patch(&cur, *st);
            cur = smolbox_core::managed::patch::apply_exec(&cur, &p, T0 + 1).unwrap();
            out.push(p);
        }
        out
    };
    // 0 and 5 (N + 1) patches are refused; nothing changes.
    for bad in [
        Vec::new(),
        patches(&[
            ExecState::Preparing,
            ExecState::Ready,
            ExecState::Dispatching,
            ExecState::Collecting,
            ExecState::Completed,
        ]),
    ] {
        let e = s.write_steps(&rec.key, &g, &bad, T0 + 1).unwrap_err();
        assert_eq!((e.category(), e.reason()), (Category::Validation, "steps"));
    }
    assert_eq!(s.fetch(&rec.key).unwrap(), rec);
    // A refused later patch stores nothing of the earlier ones.
    let mut broken = patches(&[ExecState::Preparing]);
    broken.push(entry_patch(&rec, ExecState::Completed));
    assert_eq!(
        cat(s.write_steps(&rec.key, &g, &broken, T0 + 1)),
        Category::Validation
    );
    assert_eq!(s.fetch(&rec.key).unwrap(), rec);
    // Another owner's guard and a stale version are refused.
    assert_eq!(
        cat(s.write_steps(
            &rec.key,
            &owner_guard(&rec, "ctl-b"),
            &patches(&[ExecState::Preparing]),
            T0 + 1
        )),
        Category::StaleClaim
    );
    // N = 4 patches: one commit, one version (as every write).
    let four = patches(&[
        ExecState::Preparing,
        ExecState::Ready,
        ExecState::Dispatching,
        ExecState::Collecting,
    ]);
    let (next, n) = commits_of(&*s, || s.write_steps(&rec.key, &g, &four, T0 + 1).unwrap());
    assert_eq!(n.unwrap_or(1), 1, "one commit");
    assert_eq!(
        (next.state, next.version),
        (ExecState::Collecting, rec.version + 1)
    );
    assert_eq!(next.result, Some(EXIT));
    assert_eq!(s.fetch(&rec.key).unwrap(), next);
    assert_eq!(
        cat(s.write_steps(
            &rec.key,
            &g,
            &[entry_patch(&next, ExecState::Completed)],
            T0 + 2
        )),
        Category::StaleVersion
    );
}

pub(crate) fn commits_count_write_transactions_only(h: &impl Harness) {
    let s = h.store();
    let Some(start) = s.commits() else {
        return;
    };
    let rec = accepted(key("cc", "c1"), exec_spec("x"), T0);
    s.accept(&rec, 10).unwrap();
    s.fetch(&rec.key).unwrap();
    let _ = s.due(T0, None, 10).unwrap();
    assert_eq!(s.commits(), Some(start + 1), "reads are not commits");
    // A refused write rolls back and is not counted.
    assert_eq!(
        cat(s.write(
            &rec.key,
            &owner_guard(&rec, "ctl-a"),
            &entry_patch(&rec, ExecState::Preparing),
            T0 + 1
        )),
        Category::StaleClaim
    );
    assert_eq!(s.commits(), Some(start + 1));
    s.claim(&rec.key, "ctl-a", T0 + 1, TTL).unwrap();
    assert_eq!(s.commits(), Some(start + 2));
}
