//! A settled terminal releases the claims it holds (C15): the record claim
//! and the machine claim end in place once the slot is finished, guarded by
//! owner and generation, so the next controller takes the machine over at
//! once instead of waiting out the TTL.

use super::*;

/// The claim of `c`, which must be there.
fn claim_of(c: Option<&Claim>) -> Claim {
    c.cloned().expect("a claim")
}

/// Drives `run` with `closed` after the open, to its end.
fn run_to_end(sim: &mut Sim, closed: &Result<TerminalExit, Error>) -> TerminalRun {
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    sim.advance(50);
    run.handle_closed(sim.now, sim.now_ms, closed);
    sim.settle(&mut run);
    run
}

#[test]
fn a_completed_terminal_releases_its_record_and_machine_claims_before_it_is_done() {
    let mut sim = Sim::new();
    let run = run_to_end(&mut sim, &exit(0));
    assert!(run.is_done());
    let log = &sim.fake.log;
    let n = log.len();
    assert_eq!(
        log[n - 3..],
        ["finish_command", "release_claim", "release_claim"],
        "{log:?}"
    );
    let rec = sim.exec("t1");
    assert_eq!(rec.state, ExecState::Completed);
    let c = claim_of(rec.claim.as_ref());
    assert_eq!(
        (c.owner.as_str(), c.until_ms),
        (OWNER, sim.now_ms),
        "ended in place, owner kept"
    );
    let m = sim.machine().clone();
    let c = claim_of(m.claim.as_ref());
    assert_eq!((c.owner.as_str(), c.until_ms), (OWNER, sim.now_ms));
    assert_eq!(
        (m.state, m.active_execution.as_ref()),
        (MachineRecordState::Running, None),
        "a release changes the claim only"
    );
    // The Done event carries the records as released.
    let Some(TermEvent::Done {
        record: Some(r),
        machine: Some(dm),
        error: None,
    }) = sim.events().last().copied()
    else {
        panic!("{:?}", sim.events());
    };
    assert_eq!((&**r, &**dm), (rec, &m));
    // Another controller takes the machine over now, generation + 1; without
    // the release it would be refused for a whole TTL.
    let next = claim::claim_machine(&m, "ctl-next", sim.now_ms, TTL).unwrap();
    assert_eq!(next.generation, m.generation + 1);
    let next = claim::claim_exec(rec, "ctl-next", sim.now_ms, TTL).unwrap();
    assert_eq!(next.generation, rec.generation + 1);
}

#[test]
fn an_unknown_terminal_releases_its_claims_and_keeps_the_slot_for_resolution() {
    let mut sim = Sim::new();
    let run = run_to_end(&mut sim, &exit(124));
    assert!(run.is_done());
    let rec = sim.exec("t1").clone();
    assert_eq!(rec.state, ExecState::Unknown);
    let m = sim.machine().clone();
    assert_eq!(
        (m.state, m.active_execution.as_ref()),
        (MachineRecordState::Unknown, Some(&rec.key)),
        "the slot is kept (C14.3)"
    );
    for c in [rec.claim.as_ref(), m.claim.as_ref()] {
        let c = claim_of(c);
        assert_eq!((c.owner.as_str(), c.until_ms), (OWNER, sim.now_ms));
    }
    // An operator's drain in another process claims the machine at once.
    assert!(claim::claim_machine(&m, "ctl-operator", sim.now_ms, TTL).is_ok());
}

#[test]
fn a_claim_taken_over_before_its_release_is_left_to_its_new_owner() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    sim.settle(&mut run);
    run.handle_closed(sim.now, sim.now_ms, &exit(0));
    // Perform every op but the machine's release; before it, the run's
    // claim lapses and another controller takes the machine (generation + 1).
    let mut taken = None;
    while let Some(out) = run.poll_output() {
        let TermOutput::Store(id, op) = out else {
            sim.seen.push(out);
            continue;
        };
        if let TermStoreOp::ReleaseClaim {
            claimed: Claimed::Machine(_),
            ..
        } = &*op
        {
            let m = sim.machine().clone();
            let c = claim::claim_machine(&m, "ctl-other", claim_of(m.claim.as_ref()).until_ms, TTL)
                .unwrap();
            sim.fake.machines.insert(c.key.clone(), c.clone());
            taken = Some(c);
        }
        let r = sim.fake.apply(&op);
        if taken.is_some() {
            assert_eq!(
                r.as_ref().map_err(Error::category).err(),
                Some(Category::StaleClaim),
                "guarded by owner and generation"
            );
        }
        run.handle_stored(sim.now, sim.now_ms, id, r);
    }
    let taken = taken.expect("the machine's release was sent");
    assert!(run.is_done());
    assert!(matches!(
        sim.events().last(),
        Some(TermEvent::Done { error: None, .. })
    ));
    assert_eq!(sim.machine(), &taken, "the new owner's claim is untouched");
    assert_eq!(
        sim.fake
            .log
            .iter()
            .filter(|n| **n == "release_claim")
            .count(),
        2,
        "never retried"
    );
}

#[test]
fn a_refused_release_is_not_retried_and_the_next_is_still_made() {
    let mut sim = Sim::new();
    sim.fake.fail = Some((
        "release_claim",
        Error::store(
            Operation::StoreClaim,
            Evidence::Unknown,
            Reason::Unspecified,
        ),
    ));
    let run = run_to_end(&mut sim, &exit(0));
    assert!(run.is_done());
    assert!(matches!(
        sim.events().last(),
        Some(TermEvent::Done { error: None, .. })
    ));
    let releases = sim.fake.log.iter().filter(|n| **n == "release_claim");
    assert_eq!(releases.count(), 2);
    // The record's release failed: its claim lapses with the TTL.
    let c = claim_of(sim.exec("t1").claim.as_ref());
    assert!(c.until_ms > sim.now_ms, "{c:?}");
    let c = claim_of(sim.machine().claim.as_ref());
    assert_eq!(c.until_ms, sim.now_ms, "the machine's was released");
}

#[test]
fn a_duplicate_of_a_finished_terminal_takes_and_releases_nothing() {
    let mut sim = Sim::new();
    run_to_end(&mut sim, &exit(0));
    let before = (sim.exec("t1").clone(), sim.machine().clone());
    sim.fake.log.clear();
    let run = sim.open("t1", ManagedTerminalSpec::default());
    assert!(run.is_done());
    assert_eq!(sim.fake.log, ["fetch_machine", "submit"]);
    assert_eq!((sim.exec("t1").clone(), sim.machine().clone()), before);
}
