//! Machine lifecycle telemetry (C20): create, start, stop, delete and the
//! recorded absence each produce a bounded, lossy entry naming the machine
//! and its lifecycle position only.

use super::machines::{mkey, mspec};
use super::*;
use crate::managed::state::{MachineOperation as Op, MachinePhase, MachineRecordState as MS};

fn obs(state: MachineState) -> Box<Observation> {
    let name = super::super::machines::machine_name_for(&mkey());
    observation(&name, state, 1_700_000_000)
}

fn machine_entries(s: &Sim) -> Vec<Telemetry> {
    s.events
        .iter()
        .filter_map(|e| match e {
            ControllerEvent::Telemetry(t) if t.key == mkey() => Some(t.clone()),
            _ => None,
        })
        .collect()
}

fn lifecycle(s: &mut Sim, action: Op) {
    let version = s.store.machines[&mkey()].version;
    let r = MachineRequest::Lifecycle {
        key: mkey(),
        action,
        version,
    };
    s.ctl.machine(s.now, s.now_ms, r).unwrap();
    s.settle();
}

/// Create, start, stop, delete and absence, in order, from the answers to
/// this controller's own lifecycle writes; the last entry is the record as
/// stored.
fn whole_life(cfg: ControllerConfig) -> Sim {
    let mut s = Sim::new(cfg);
    s.running_machine();
    lifecycle(&mut s, Op::Stop);
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    s.answer("stop", Ok(WorkerReply::Machine(obs(MachineState::Stopped))));
    assert_eq!(s.machine().state, MS::Stopped);
    lifecycle(&mut s, Op::Delete);
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    assert_eq!(s.machine().state, MS::Deleted);
    s
}

#[test]
fn every_machine_lifecycle_step_is_an_entry_in_order() {
    let s = whole_life(disposable_config());
    let t = machine_entries(&s);
    let states: Vec<MS> = t.iter().filter_map(Telemetry::machine_state).collect();
    // The distinct states, in the order they were recorded.
    let mut distinct = states.clone();
    distinct.dedup();
    for want in [
        MS::Accepted,
        MS::Creating,
        MS::Created,
        MS::Starting,
        MS::Running,
        MS::Stopping,
        MS::Stopped,
        MS::Deleting,
        MS::Deleted,
    ] {
        assert!(distinct.contains(&want), "{want:?} missing: {distinct:?}");
    }
    let pos = |st| distinct.iter().position(|x| *x == st).unwrap();
    assert!(pos(MS::Accepted) < pos(MS::Creating) && pos(MS::Creating) < pos(MS::Created));
    assert!(pos(MS::Running) < pos(MS::Stopping) && pos(MS::Stopped) < pos(MS::Deleting));
    // Each operation's intent is reported before the worker is asked.
    assert!(t.iter().any(|x| matches!(
        x.lifecycle,
        Lifecycle::Machine {
            state: MS::Creating,
            operation: Op::Create,
            phase: MachinePhase::Dispatching,
            ..
        }
    )));
    // Versions only grow: no entry for a claim (claims move no version).
    assert!(t.windows(2).all(|w| w[0].version < w[1].version), "{t:?}");
    // Absence is reported only once it is recorded: the last entry.
    let last = t.last().unwrap();
    let m = s.machine();
    assert_eq!(
        (last.version, last.lifecycle),
        (
            m.version,
            Lifecycle::Machine {
                state: MS::Deleted,
                operation: m.operation,
                phase: m.phase,
                absent: true,
            }
        )
    );
    assert!(
        t[..t.len() - 1]
            .iter()
            .all(|x| !matches!(x.lifecycle, Lifecycle::Machine { absent: true, .. }))
    );
    assert!(t.iter().all(|x| x.exec_state().is_none()));
}

#[test]
fn machine_entries_share_the_bounded_queue_and_count_what_is_dropped() {
    let mut cfg = disposable_config();
    cfg.telemetry_pending = 1;
    let mut s = Sim::new(cfg);
    let r = MachineRequest::Create {
        key: mkey(),
        spec: mspec(),
    };
    s.ctl.machine(s.now, s.now_ms, r).unwrap();
    // Perform store ops without taking events: the queue fills.
    while let Some((id, op)) = s.ctl.poll_store_op() {
        let r = s.store.apply(&op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    assert_eq!(s.machine().state, MS::Creating);
    assert!(s.ctl.telemetry_dropped() >= 1, "accepted then creating");
    let t: Vec<_> = std::iter::from_fn(|| s.ctl.poll_event())
        .filter_map(|e| match e {
            ControllerEvent::Telemetry(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(t.len(), 1, "at most telemetry_pending (1) pending: {t:?}");
    assert_eq!(t[0].machine_state(), Some(MS::Creating), "the newest kept");
    assert_eq!((t[0].epoch, t[0].dropped), (1, s.ctl.telemetry_dropped()));
}

#[test]
fn machine_entries_carry_no_spec_fingerprint_or_worker_detail() {
    let s = whole_life(disposable_config());
    let t = machine_entries(&s);
    assert!(t.len() >= 9, "{t:?}");
    let m = s.machine();
    let text = format!("{t:?}");
    let spec = &m.spec;
    for secret in [
        m.fingerprint.as_str(),
        spec.artifact.id.as_str(),
        spec.artifact.sha256.as_str(),
        spec.profile.id.as_str(),
        WORKER,
    ] {
        assert!(!text.contains(secret), "{secret:?} in {text}");
    }
    let name = super::super::machines::machine_name_for(&mkey());
    assert!(!text.contains(&name), "the worker's machine name");
}

#[test]
fn a_duplicate_create_and_a_claim_make_no_entry() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let before = machine_entries(&s).len();
    let r = MachineRequest::Create {
        key: mkey(),
        spec: mspec(),
    };
    s.ctl.machine(s.now, s.now_ms, r).unwrap();
    s.settle();
    let logged = s
        .store_log
        .iter()
        .filter(|op| matches!(op, StoreOp::AcceptMachine { .. }))
        .count();
    assert_eq!(logged, 2, "the duplicate reached the store");
    assert_eq!(
        machine_entries(&s).len(),
        before,
        "same identity: no change"
    );
}
