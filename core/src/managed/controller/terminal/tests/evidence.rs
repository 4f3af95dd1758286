//! A store refusal ends a run that already opened its terminal: the error
//! says what is known about the terminal (the recorded exit), never the
//! refusal's own `not_dispatched`.

use super::*;

#[test]
fn a_refusal_after_the_terminal_exited_reports_the_recorded_exit() {
    let mut sim = Sim::new();
    let mut run = sim.open("t1", ManagedTerminalSpec::default());
    run.handle_opened(sim.now, sim.now_ms, Ok(()));
    // Another live controller holds the machine's claim all along: the
    // slot finish is refused with `stale_claim` until the run gives up.
    claimed_by_another(&mut sim, 100 * TTL);
    run.handle_closed(sim.now, sim.now_ms, &exit(7));
    sim.settle(&mut run);
    while !run.is_done() {
        sim.advance(100);
        run.handle_timeout(sim.now, sim.now_ms);
        sim.settle(&mut run);
    }
    let Some(TermEvent::Done { error: Some(e), .. }) = sim.events().last().copied().cloned() else {
        panic!("the run ended with an error: {:?}", sim.events());
    };
    assert_eq!(e.category(), Category::StaleClaim);
    assert_eq!(e.evidence(), Evidence::Exited, "{e:?}");
    assert_eq!(e.exit_code(), Some(7));
}

#[test]
fn a_refusal_before_anything_was_sent_stays_not_dispatched() {
    let mut sim = Sim::new();
    sim.fake.fail = Some((
        "submit",
        Error::stale_claim(
            Operation::StoreAccept,
            Evidence::NotDispatched,
            Reason::HeldByOther,
        ),
    ));
    let run = sim.open("t1", ManagedTerminalSpec::default());
    assert!(run.is_done());
    assert_eq!(sim.opens(), 0);
    let Some(TermEvent::Refused(e)) = sim.events().last().copied().cloned() else {
        panic!("refused: {:?}", sim.events());
    };
    assert_eq!(e.evidence(), Evidence::NotDispatched);
}
