//! How many requests a managed terminal costs the worker.

use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::{ExecState, RecordEvidence};
use smolbox_core::terminal::TerminalExit;
use smolbox_devworker::Route;
use std::collections::BTreeMap;
use std::time::Duration;

use super::{TermHandle, TermShell, key, outcome_of, setup};
use crate::managed_cases::StoreKind;

/// C0.3, C7.4: a managed terminal checks the worker twice — the health
/// preflight and the image-machine inspect before acceptance
/// (`Client::terminal_preflight`), and both again inside the upgrade's own
/// operation deadline (`Client::terminal`) — and upgrades once: two
/// `GET /health`, two `GET /api/v1/machines/m1`, one upgrade, and no other
/// request from the open to the settled record. The second pair is kept
/// on purpose (docs/decisions/runtime.md, "The managed terminal's second
/// preflight"): this count fails if either pair goes away or repeats.
pub fn a_managed_terminal_checks_the_worker_before_acceptance_and_at_the_open<T: TermShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let rt: T = s.runtime();
    let k = key("term-round-trips");
    let counts = || s.fixture.worker.faults().request_counts();
    let before = counts();
    rt.open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    let mut h = rt.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(b"exit 3\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap(), TerminalExit { code: 3 });
    let rec = rt.wait(&k).unwrap();
    assert_eq!(
        (rec.state, rec.evidence),
        (ExecState::Completed, RecordEvidence::Exited)
    );
    let after = counts();
    // The run dispatches on its own after `open` returns (acceptance is
    // not readiness), so only the whole is counted.
    assert_eq!(
        delta(&before, &after),
        [
            (Route::Health, 2),
            (Route::MachineGet, 2),
            (Route::Terminal, 1)
        ]
        .into(),
        "one health preflight and one inspect before acceptance, both again at the open, one upgrade"
    );
}

/// The routes whose count grew from `from` to `to`, and by how much.
fn delta(from: &BTreeMap<Route, u64>, to: &BTreeMap<Route, u64>) -> BTreeMap<Route, u64> {
    to.iter()
        .map(|(r, n)| (*r, n - from.get(r).copied().unwrap_or(0)))
        .filter(|&(_, d)| d > 0)
        .collect()
}
