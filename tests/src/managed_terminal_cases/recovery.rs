//! Recovery and claim release of managed terminals (C7.4, C15): a session
//! a crashed controller may have dispatched is never reopened, a recorded
//! exit is kept and its slot released, and a terminal that ended lets the
//! next controller take the machine at once.

use std::sync::Arc;
use std::time::Duration;

use smolbox_core::Category;
use smolbox_core::exec::Command;
use smolbox_core::managed::record::ExecResult;
use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::state::MachineRecordState;
use smolbox_core::managed::{ExecState, ExecutionRecord, MachineRecord, RecordKey};
use smolbox_core::terminal::TerminalExit;
use smolbox_devworker::Route;

use super::{OWNER, Setup, TermHandle, TermShell, key, now_ms, outcome_of, read_until, setup};
use crate::fixture::Fixture;
use crate::managed_cases::StoreKind;

/// A controller that crashed mid-session and is restarted under the same
/// controller id (so its claim is this runtime's to renew, without waiting
/// out a TTL): a `TerminalRun` driven against the store until the
/// connection was open (one real upgrade, input sent), then — when `exit`
/// is set — until only the `collecting` write of that exit landed; then
/// dropped with its connection.
fn crashed_session(s: &Setup, id: &str, exit: Option<i32>) -> RecordKey {
    use smolbox_core::managed::controller::terminal::{TermConfig, TermOutput, TerminalRun};
    let k = key(id);
    let cfg = TermConfig {
        owner: OWNER.into(),
        lease_ttl_ms: 30_000,
        poll_interval_ms: 100,
        max_pending: 16,
    };
    let mut run = TerminalRun::open(
        cfg,
        s.key.clone(),
        k.clone(),
        s.machine.clone(),
        ManagedTerminalSpec::default(),
        true,
    )
    .unwrap();
    let client = smolbox_blocking::Client::new(s.fixture.endpoint(Fixture::budgets())).unwrap();
    let t0 = std::time::Instant::now();
    let mut term = None;
    let mut budget = usize::MAX;
    while let Some(out) = run.poll_output() {
        match out {
            TermOutput::Store(id, op) if budget > 0 => {
                budget -= 1;
                let r = smolbox_store::apply_terminal_op(&*s.store, &op);
                run.handle_stored(t0, now_ms(), id, r);
            }
            TermOutput::Store(..) => break,
            TermOutput::Inspect { machine, spec, .. } => {
                let r = client.terminal_preflight(&machine, &spec);
                run.handle_inspected(t0, now_ms(), r);
            }
            TermOutput::Open { machine, spec, .. } => {
                let mut t = client.terminal(&machine, &spec).unwrap();
                t.input(b"echo crash-marker >> crash.log\n").unwrap();
                term = Some(t);
                run.handle_opened(t0, now_ms(), Ok(()));
                if let Some(code) = exit {
                    run.handle_closed(t0, now_ms(), &Ok(TerminalExit { code }));
                    // The `running` write, then only `collecting`.
                    budget = 2;
                }
            }
            _ => {}
        }
    }
    drop(run);
    drop(term);
    let rec = s.store.fetch(&k).unwrap();
    match exit {
        None => assert_eq!(rec.state, ExecState::Running),
        Some(_) => assert_eq!(rec.state, ExecState::Collecting),
    }
    k
}

/// Polls the store (bounded) until `pred` holds: recovery runs in the
/// runtime's background and has no waiter of its own.
fn eventually(s: &Setup, k: &RecordKey, pred: impl Fn(&ExecutionRecord, &MachineRecord) -> bool) {
    let mut last = None;
    for _ in 0..1_000 {
        let rec = s.store.fetch(k).unwrap();
        let m = s.machine();
        if pred(&rec, &m) {
            return;
        }
        last = Some((rec.state, m.state, m.active_execution));
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("recovery never settled {k:?}: {last:?}");
}

/// Recovery (C7.4): a session a crashed controller may have dispatched,
/// without a recorded exit, becomes `unknown` and keeps the slot (the
/// machine `unknown`); it is never reopened and no input is replayed.
pub fn recovery_never_reopens_a_possibly_dispatched_session<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let k = crashed_session(&s, "term-crash", None);
    assert_eq!(s.upgrades(), 1);
    let rt: T = s.runtime();
    eventually(&s, &k, |r, m| {
        r.state == ExecState::Unknown && m.state == MachineRecordState::Unknown
    });
    let rec = s.store.fetch(&k).unwrap();
    assert_eq!(
        rec.last_error.as_ref().map(|e| e.reason.as_str()),
        Some("terminal_recovered")
    );
    assert_eq!(rec.result, None);
    assert_eq!(
        s.machine().active_execution,
        Some(k.clone()),
        "the slot stays blocked"
    );
    assert_eq!(s.upgrades(), 1, "never reopened");
    let e = rt.attach(&k, Duration::from_millis(0)).unwrap_err();
    assert_eq!(
        e.category(),
        Category::NotFound,
        "no live connection anywhere"
    );
    // Another submission is still refused: the machine needs resolution.
    let e = s.store.submit(&s.command_record("cmd-x"), 100).unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
}

/// Recovery keeps a recorded exit: the crashed controller stored the exit
/// (`collecting`) but not `completed` nor the slot's release; the runtime
/// completes it and releases the slot, and opens nothing.
pub fn recovery_keeps_a_recorded_exit_and_releases_the_slot<T: TermShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let k = crashed_session(&s, "term-exit", Some(7));
    let _rt: T = s.runtime();
    eventually(&s, &k, |r, m| {
        r.state == ExecState::Completed && m.active_execution.is_none()
    });
    let rec = s.store.fetch(&k).unwrap();
    assert_eq!(rec.result, Some(ExecResult::Terminal { exit_code: 7 }));
    assert_eq!(s.machine().state, MachineRecordState::Running);
    assert_eq!(s.upgrades(), 1);
}

/// A terminal that ended releases its claims (C15): with a ten-minute TTL
/// and every wait here at most 30 s, another controller (the next `smolbox`
/// command) runs a command in the machine's slot and finishes it under its
/// own claim at once, while the first runtime still runs; without the
/// release its slot finish would wait out the terminal's machine claim.
pub fn another_controller_takes_the_machine_at_once_after_a_terminal_ends<T: TermShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let start = |owner: &str| {
        T::start_with(
            Arc::clone(&s.store),
            s.key.clone(),
            s.fixture.endpoint(Fixture::budgets()),
            true,
            owner,
            Some(600_000),
        )
        .unwrap()
    };
    let a = start(OWNER);
    let k = key("term-release");
    a.open(&k, &s.machine, ManagedTerminalSpec::default())
        .unwrap();
    let mut h = a.attach(&k, Duration::from_secs(10)).unwrap();
    h.input(b"echo up-$((3+4))\n").unwrap();
    read_until(&mut h, "up-7");
    h.input(b"exit 0\n").unwrap();
    assert_eq!(outcome_of(&mut h).unwrap().code, 0);
    let rec = a.wait(&k).unwrap();
    assert_eq!(rec.state, ExecState::Completed);
    let now = now_ms();
    let m = s.machine();
    assert_eq!(m.active_execution, None);
    for c in [rec.claim.clone(), m.claim.clone()] {
        let c = c.unwrap();
        assert_eq!(c.owner, OWNER, "ended in place, owner kept");
        assert!(c.until_ms <= now, "released: {c:?} at {now}");
    }
    let b = start("ctl-term-next");
    let out = b
        .slot_command(
            &s.machine,
            &key("after-release"),
            &Command::new(["echo", "two"]),
        )
        .unwrap();
    assert_eq!(out.exit_code(), Some(0), "{:?}", out.error);
    assert_eq!(out.output.unwrap().stdout, b"two\n");
    let m = s.slot_emptied();
    assert_eq!(m.active_execution, None, "the slot finished at once");
    assert_eq!(m.claim.unwrap().owner, "ctl-term-next", "taken over");
    assert_eq!(
        (s.upgrades(), s.fixture.worker.request_count(Route::Exec)),
        (1, 1)
    );
}
