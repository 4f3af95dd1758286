//! A managed terminal run (`TerminalRun`) driven against a real store
//! adapter through `apply_terminal_op`: acceptance and the slot in one
//! transaction, the intent before the open, completion and the slot's
//! release, and a second terminal refused while the slot is held.
#![allow(clippy::unwrap_used)] // test code

use std::time::{Duration, Instant};

use smolbox_core::Category;
use smolbox_core::managed::claim::Guard;
use smolbox_core::managed::controller::terminal::{TermConfig, TermEvent, TermOutput, TerminalRun};
use smolbox_core::managed::patch::MachinePatch;
use smolbox_core::managed::record::{CreationEvidence, ExecResult, Resources};
use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::state::{MachineOperation, MachinePhase, MachineRecordState};
use smolbox_core::managed::testkit::{accepted_machine, fingerprint_key, key, machine_spec};
use smolbox_core::managed::{ExecState, RecordKey};
use smolbox_core::terminal::TerminalExit;
use smolbox_store::{MemoryConfig, MemoryStore, Reserve, Store, apply_terminal_op};

const T0: u64 = 1_700_000_000_000;
const OWNER: &str = "ctl-a";

fn running_machine(s: &dyn Store, k: &RecordKey) {
    s.accept_machine(&accepted_machine(k.clone(), machine_spec(), T0), 100)
        .unwrap();
    let m = s.claim_machine(k, OWNER, T0, 60_000).unwrap();
    s.claim_worker("dev", OWNER, T0, 60_000).unwrap();
    let req = Reserve {
        worker_id: "dev".into(),
        machine_name: "m1".into(),
        capacity: Resources {
            slots: 1,
            cpus: 1,
            memory_mb: 512,
            disk_gb: 2,
        },
        limit: Resources {
            slots: 4,
            cpus: 64,
            memory_mb: 65_536,
            disk_gb: 1_024,
        },
    };
    let m = s
        .reserve_machine(k, &Guard::for_machine(&m, OWNER), &req, T0 + 1)
        .unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Creating),
        operation: Some((MachineOperation::Create, MachinePhase::Dispatching)),
        ..MachinePatch::default()
    };
    let m = s
        .write_machine(k, &Guard::for_machine(&m, OWNER), &p, T0 + 2)
        .unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Running),
        operation: Some((MachineOperation::None, MachinePhase::None)),
        creation: Some(CreationEvidence {
            created_at_ms: T0 + 2,
            incarnation: "inc-1".into(),
        }),
        ..MachinePatch::default()
    };
    s.write_machine(k, &Guard::for_machine(&m, OWNER), &p, T0 + 3)
        .unwrap();
}

fn cfg() -> TermConfig {
    TermConfig {
        owner: OWNER.into(),
        lease_ttl_ms: 30_000,
        poll_interval_ms: 100,
        max_pending: 16,
    }
}

/// Performs every store op; returns the other outputs.
fn drive(s: &dyn Store, run: &mut TerminalRun, now: Instant, now_ms: u64) -> Vec<TermOutput> {
    let mut seen = Vec::new();
    while let Some(o) = run.poll_output() {
        match o {
            TermOutput::Store(id, op) => {
                let r = apply_terminal_op(s, &op);
                run.handle_stored(now, now_ms, id, r);
            }
            // The image preflight passes (the worker side is not modelled).
            TermOutput::Inspect { .. } => run.handle_inspected(now, now_ms, Ok(())),
            other => seen.push(other),
        }
    }
    seen
}

#[test]
#[allow(clippy::disallowed_methods)] // an arbitrary origin; time is virtual after
fn a_terminal_run_holds_the_slot_and_releases_it_on_exit() {
    let s = MemoryStore::new(MemoryConfig::default()).unwrap();
    let mk = key("s", "machine-1");
    running_machine(&s, &mk);
    let now = Instant::now();
    let now_ms = T0 + 10;
    let spec = ManagedTerminalSpec::default();
    let mut run = TerminalRun::open(
        cfg(),
        fingerprint_key(),
        key("s", "t1"),
        mk.clone(),
        spec.clone(),
        true,
    )
    .unwrap();
    let seen = drive(&s, &mut run, now, now_ms);
    assert!(matches!(
        seen.first(),
        Some(TermOutput::Event(TermEvent::Accepted {
            existing: false,
            ..
        }))
    ));
    assert!(matches!(seen.last(), Some(TermOutput::Open { .. })));
    assert_eq!(
        s.fetch(&key("s", "t1")).unwrap().state,
        ExecState::Dispatching
    );
    assert_eq!(
        s.fetch_machine(&mk).unwrap().active_execution,
        Some(key("s", "t1"))
    );

    // Another terminal on the same machine: refused, nothing stored.
    let mut other = TerminalRun::open(
        cfg(),
        fingerprint_key(),
        key("s", "t2"),
        mk.clone(),
        spec,
        true,
    )
    .unwrap();
    let seen = drive(&s, &mut other, now, now_ms);
    assert!(matches!(
        seen.as_slice(),
        [TermOutput::Event(TermEvent::Refused(e))] if e.category() == Category::AdmissionExhausted
    ));
    assert_eq!(
        s.fetch(&key("s", "t2")).unwrap_err().category(),
        Category::NotFound
    );

    let later = now + Duration::from_millis(100);
    run.handle_opened(later, now_ms + 100, Ok(()));
    drive(&s, &mut run, later, now_ms + 100);
    run.handle_closed(later, now_ms + 200, &Ok(TerminalExit { code: 7 }));
    let seen = drive(&s, &mut run, later, now_ms + 200);
    assert!(matches!(
        seen.last(),
        Some(TermOutput::Event(TermEvent::Done { error: None, .. }))
    ));
    let rec = s.fetch(&key("s", "t1")).unwrap();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.result, Some(ExecResult::Terminal { exit_code: 7 }));
    let m = s.fetch_machine(&mk).unwrap();
    assert_eq!(m.active_execution, None);
    assert_eq!(m.state, MachineRecordState::Running);
}
