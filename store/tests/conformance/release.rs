//! Conformance of `release_claim` (C15): a controller shutting down ends
//! its claims so the next one takes over without waiting out the TTL;
//! guarded by owner and claim generation; never a change of state,
//! evidence, slot, reservation or capacity.

#[allow(clippy::wildcard_imports)]
use super::*;
use smolbox_core::managed::controller::Claimed;
use smolbox_store::Released;

fn exec_of(r: Released) -> ExecutionRecord {
    match r {
        Released::Execution(rec) => *rec,
        other => panic!("expected an execution record, got {other:?}"),
    }
}

fn machine_of(r: Released) -> smolbox_core::managed::MachineRecord {
    match r {
        Released::Machine(rec) => *rec,
        other => panic!("expected a machine record, got {other:?}"),
    }
}

pub(crate) fn release_claim_hands_an_execution_to_the_next_owner_at_once(h: &impl Harness) {
    let s = h.store();
    let b = h.another();
    let k = key("s", "rel1");
    let rec = driven(&*s, k.clone(), ExecState::Unknown, T0);
    let now = T0 + 100;
    // Live: another owner is refused before the release.
    assert_eq!(cat(b.claim(&k, "ctl-b", now, TTL)), Category::StaleClaim);
    // Only the holder at its generation releases; refusals change nothing.
    let wrong = [
        ("ctl-b", rec.generation),
        ("ctl-a", rec.generation + 1),
        ("ctl-a", rec.generation - 1),
    ];
    for (owner, generation) in wrong {
        let e = s
            .release_claim(&Claimed::Execution(k.clone()), owner, generation, now)
            .unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::StaleClaim, Reason::ClaimOwner),
            "{owner} at {generation}"
        );
    }
    assert_eq!(s.fetch(&k).unwrap(), rec, "refusals change nothing");
    let released = exec_of(
        s.release_claim(&Claimed::Execution(k.clone()), "ctl-a", rec.generation, now)
            .unwrap(),
    );
    assert_eq!(released.version, rec.version + 1, "a release is a write");
    assert_eq!(
        (
            released.state,
            released.evidence,
            &released.result,
            released.cleanup,
            released.next_due_at_ms,
            released.generation,
        ),
        (
            rec.state,
            rec.evidence,
            &rec.result,
            rec.cleanup,
            rec.next_due_at_ms,
            rec.generation,
        ),
        "state, evidence, result, cleanup and due time stay"
    );
    let claim = released.claim.clone().unwrap();
    assert_eq!((claim.owner.as_str(), claim.until_ms), ("ctl-a", now));
    assert_eq!(b.fetch(&k).unwrap(), released, "durable, seen by another");
    // The old holder's guard is fenced now.
    assert_eq!(
        cat(s.write(
            &k,
            &owner_guard(&released, "ctl-a"),
            &ExecPatch::default(),
            now
        )),
        Category::StaleClaim
    );
    // The next owner takes it at the same instant, generation + 1.
    let taken = b.claim(&k, "ctl-b", now, TTL).unwrap();
    assert_eq!(taken.generation, rec.generation + 1);
    assert_eq!(taken.claim.as_ref().unwrap().owner, "ctl-b");
    // The old holder's release again: the claim is not its any more.
    assert_eq!(
        cat(s.release_claim(&Claimed::Execution(k.clone()), "ctl-a", rec.generation, now)),
        Category::StaleClaim
    );
    assert_eq!(s.fetch(&k).unwrap(), taken);
    // A lapsed claim: returned as stored, nothing written.
    let later = now + TTL + 1;
    let same = exec_of(
        b.release_claim(
            &Claimed::Execution(k.clone()),
            "ctl-b",
            taken.generation,
            later,
        )
        .unwrap(),
    );
    assert_eq!(same, taken);
    assert_eq!(s.fetch(&k).unwrap(), taken, "nothing written");
    // Absence is positive only; a bad owner is refused.
    assert_eq!(
        cat(s.release_claim(&Claimed::Execution(key("s", "nope")), "ctl-a", 1, now)),
        Category::NotFound
    );
    assert_eq!(
        cat(s.release_claim(&Claimed::Execution(k), "", 1, now)),
        Category::Validation
    );
}

pub(crate) fn release_claim_of_a_machine_keeps_its_slot_reservation_and_version(h: &impl Harness) {
    let s = h.store();
    let b = h.another();
    let (m, c) = held_by(&*s, "rm", "wrm", Vec::new(), ExecState::Unknown);
    let usage = s.usage("wrm").unwrap();
    let now = T0 + 100;
    assert_eq!(
        cat(b.claim_machine(&m.key, "ctl-b", now, TTL)),
        Category::StaleClaim
    );
    let e = s
        .release_claim(&Claimed::Machine(m.key.clone()), "ctl-b", m.generation, now)
        .unwrap_err();
    assert_eq!(e.category(), Category::StaleClaim);
    let released = machine_of(
        s.release_claim(&Claimed::Machine(m.key.clone()), "ctl-a", m.generation, now)
            .unwrap(),
    );
    // Not caller-visible: the version stays, the claim count moves.
    assert_eq!(
        (released.version, released.claims, released.revision()),
        (m.version, m.claims + 1, m.revision() + 1)
    );
    assert_eq!(
        (
            released.state,
            released.operation,
            released.active_execution.as_ref(),
            &released.reservation,
            &released.assignment,
        ),
        (
            m.state,
            m.operation,
            Some(&c.key),
            &m.reservation,
            &m.assignment,
        ),
        "the slot and the reservation stay"
    );
    assert_eq!(s.usage("wrm").unwrap(), usage, "no capacity is freed");
    assert_eq!(b.fetch_machine(&m.key).unwrap(), released);
    assert_eq!(s.fetch(&c.key).unwrap(), c, "the command is untouched");
    // An operator's request at the version read before still applies, and
    // another controller takes the claim at once.
    let taken = b.claim_machine(&m.key, "ctl-b", now, TTL).unwrap();
    assert_eq!(
        (taken.generation, taken.version),
        (m.generation + 1, m.version)
    );
    assert_eq!(
        cat(s.write_machine(
            &m.key,
            &Guard::for_machine(&released, "ctl-a"),
            &MachinePatch::default(),
            now
        )),
        Category::StaleClaim
    );
}

pub(crate) fn release_claim_of_a_worker_lease_hands_it_over_with_generation_plus_one(
    h: &impl Harness,
) {
    let s = h.store();
    let b = h.another();
    let now = T0 + 10;
    let lease = s.claim_worker("wrl", "ctl-a", T0, TTL).unwrap();
    assert_eq!(
        cat(b.claim_worker("wrl", "ctl-b", now, TTL)),
        Category::StaleClaim
    );
    assert_eq!(
        cat(b.release_claim(
            &Claimed::Worker("wrl".into()),
            "ctl-b",
            lease.generation,
            now
        )),
        Category::StaleClaim
    );
    let Released::Worker(Some(l)) = s
        .release_claim(
            &Claimed::Worker("wrl".into()),
            "ctl-a",
            lease.generation,
            now,
        )
        .unwrap()
    else {
        panic!("a held lease is returned");
    };
    assert_eq!(
        (l.owner.as_str(), l.generation, l.until_ms),
        ("ctl-a", lease.generation, now)
    );
    let next = b.claim_worker("wrl", "ctl-b", now, TTL).unwrap();
    assert_eq!(
        (next.owner.as_str(), next.generation),
        ("ctl-b", lease.generation + 1)
    );
    // Never leased: nothing to release.
    assert_eq!(
        s.release_claim(&Claimed::Worker("wnone".into()), "ctl-a", 1, now)
            .unwrap(),
        Released::Worker(None)
    );
}
