//! Retained machines, the command slot and quiescent resolution through
//! both shells' `Runtime::machines()` (issue 13 items 1, 2, 4 and the
//! machine half of 5), against the devworker on SQLite and PostgreSQL.
//! Registered by [`managed_machine_suite!`](crate::managed_machine_suite).
//! Devworker request counters prove what reached the worker; commands
//! that must outlive a step wait for a gate file the case creates.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use smolbox_core::Category;
use smolbox_core::Reason;
use smolbox_core::exec::Command;
use smolbox_core::managed::controller::{Resolution, RunTarget};
use smolbox_core::managed::state::{Cleanup, MachineOperation as Op, MachineRecordState as MS};
use smolbox_core::managed::{ExecState, MachineRecord, RecordKey, RetainedMachineSpec};
use smolbox_devworker::{Fault, Route};

use crate::fixture::Fixture;
use crate::managed::{ManagedShell, Options, WORKER};
use crate::managed_cases::{Setup, StoreKind, gated, open, setup};

pub(crate) fn key(id: &str) -> RecordKey {
    RecordKey::new("boxes", id).unwrap()
}

/// A retained machine of the devworker's catalog (the unverified run
/// target's artifact and profile), nothing else declared.
pub(crate) fn spec() -> RetainedMachineSpec {
    let t = RunTarget::unverified();
    RetainedMachineSpec {
        artifact: t.artifact,
        profile: t.profile,
        ports: Vec::new(),
        workload: None,
        checkpointable: false,
        network: None,
        guest_paths: None,
    }
}

fn options() -> Options {
    Options {
        disposable: true,
        lease_ttl_ms: 2_000,
        ..Options::default()
    }
}

/// Creates and starts `id`; returns the running record.
pub(crate) fn running<M: ManagedShell>(rt: &M, id: &str) -> MachineRecord {
    let (m, existing) = rt.m_create(&key(id), &spec()).unwrap();
    assert!(!existing);
    assert_eq!(m.state, MS::Accepted);
    let m = rt.m_wait(&key(id), 30_000).unwrap();
    assert_eq!(m.state, MS::Created, "{:?}", m.last_error);
    assert!(m.creation.is_some() && m.reservation.is_some());
    rt.m_lifecycle(&key(id), Op::Start, m.version).unwrap();
    let m = rt.m_wait(&key(id), 30_000).unwrap();
    assert_eq!(
        (m.state, m.operation),
        (MS::Running, Op::None),
        "{:?}",
        m.last_error
    );
    m
}

/// Waits until the machine's slot is empty (AC-14.3.2).
pub(crate) fn slot_empty<M: ManagedShell>(rt: &M, id: &str) -> MachineRecord {
    let mut last = None;
    for _ in 0..3_000 {
        let m = rt.m_inspect(&key(id)).unwrap();
        if m.active_execution.is_none() {
            return m;
        }
        last = Some(m);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let holder = last
        .as_ref()
        .and_then(|m| m.active_execution.as_ref())
        .map(|k| rt.fetch(k));
    panic!("the slot never emptied: {last:?}; holder {holder:?}");
}

fn worker_names(s: &Setup) -> Vec<String> {
    let client = smolbox_blocking::Client::new(s.fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    client
        .list(&profile)
        .unwrap()
        .into_iter()
        .map(|o| o.incarnation.name)
        .collect()
}

/// The spec's ports reach the worker's create (C9.2, C14): the devworker
/// reports the machine with exactly those mappings (the create reply is
/// checked against them too, so a mismatch would have left it `unknown`);
/// a delete frees them.
pub fn a_machines_ports_reach_the_worker<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&options());
    let mut with_ports = spec();
    with_ports.ports = vec![
        smolbox_core::managed::spec::ReservedPort {
            host: 18_080,
            guest: 80,
        },
        smolbox_core::managed::spec::ReservedPort {
            host: 18_443,
            guest: 443,
        },
    ];
    rt.m_create(&key("ports1"), &with_ports).unwrap();
    let m = rt.m_wait(&key("ports1"), 30_000).unwrap();
    assert_eq!(m.state, MS::Created, "{:?}", m.last_error);
    assert_eq!(m.reserved_ports, vec![18_080, 18_443]);
    let name = m.assignment.as_ref().unwrap().machine_name.clone();
    let client = smolbox_blocking::Client::new(s.fixture.endpoint(Fixture::budgets())).unwrap();
    let profile = client.admit(&[]).unwrap();
    let obs = client
        .list(&profile)
        .unwrap()
        .into_iter()
        .find(|o| o.incarnation.name == name)
        .unwrap();
    let ports: Vec<(u16, u16)> = obs
        .incarnation
        .ports
        .iter()
        .map(|p| (p.host(), p.guest()))
        .collect();
    assert_eq!(ports, [(18_080, 80), (18_443, 443)]);
    rt.m_lifecycle(&key("ports1"), Op::Delete, m.version)
        .unwrap();
    let m = rt.m_wait(&key("ports1"), 30_000).unwrap();
    assert_eq!(m.state, MS::Deleted, "{:?}", m.last_error);
    assert!(m.reserved_ports.is_empty());
    rt.shutdown();
}

/// `logs` and `measurements` through `Runtime::machines()` (C14.2): each
/// inspects the recorded incarnation, then reads; a deleted machine is
/// refused before any worker call.
pub fn logs_and_measurements_of_a_retained_machine<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&options());
    running(&rt, "read1");
    let w = &s.fixture.worker;
    let gets = w.request_count(Route::MachineGet);
    let (_, rec) = rt.m_measurements(&key("read1")).unwrap();
    assert_eq!(rec.key, key("read1"));
    assert_eq!(w.request_count(Route::MachineGet), gets + 1);
    let params = smolbox_core::worker::LogsParams {
        tail: 10,
        ..smolbox_core::worker::LogsParams::default()
    };
    let lines = rt.m_logs(&key("read1"), params).unwrap();
    assert!(lines.len() <= 10);
    assert_eq!(w.request_count(Route::Logs), 1);
    let follow = smolbox_core::worker::LogsParams {
        follow: true,
        ..params
    };
    let e = rt.m_logs(&key("read1"), follow).unwrap_err();
    assert_eq!(e.reason(), Reason::FollowUnsupported);
    let m = rt.m_inspect(&key("read1")).unwrap();
    rt.m_lifecycle(&key("read1"), Op::Stop, m.version).unwrap();
    let m = rt.m_wait(&key("read1"), 30_000).unwrap();
    rt.m_lifecycle(&key("read1"), Op::Delete, m.version)
        .unwrap();
    assert_eq!(rt.m_wait(&key("read1"), 30_000).unwrap().state, MS::Deleted);
    let gets = w.request_count(Route::MachineGet);
    let e = rt.m_logs(&key("read1"), params).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::NotFound, Reason::MachineDeleted)
    );
    let e = rt.m_measurements(&key("read1")).unwrap_err();
    assert_eq!(e.category(), Category::NotFound);
    assert_eq!(w.request_count(Route::MachineGet), gets, "no worker call");
    assert_eq!(w.request_count(Route::Logs), 1);
    rt.shutdown();
}

/// Create/start, a command in the slot, a second submit refused, stop and
/// delete refused while it runs, the slot empty after it, the next command
/// runs, stop, delete with the reservation released only after the 404,
/// and the tombstone deduplicating a repeated create.
pub fn a_retained_machine_runs_one_command_at_a_time<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&options());
    let m = running(&rt, "box1");
    let name = m.assignment.as_ref().unwrap().machine_name.clone();
    assert!(worker_names(&s).contains(&name));
    // List: limit 1–100 (N and N+1), deleted included later.
    for bad in [0, 101] {
        let e = rt.m_list("boxes", None, Some(bad)).unwrap_err();
        assert_eq!(e.category(), Category::Validation);
    }
    let page = rt.m_list("boxes", None, Some(100)).unwrap();
    assert_eq!(page.records.len(), 1);
    assert!(rt.m_wait(&key("box1"), 900_001).is_err());

    let gate = s.gate("g1");
    let c1 = RecordKey::new("boxes", "c1").unwrap();
    let (rec, held, existing) = rt.m_submit(&key("box1"), &c1, &gated(&gate)).unwrap();
    assert!(!existing);
    // The slot, the claim and the dispatch intent in one commit (issue 16).
    assert_eq!(rec.state, ExecState::Dispatching);
    assert_eq!(held.unwrap().active_execution, Some(c1.clone()));
    // No queue: another command is refused, nothing is stored for it.
    let c2 = RecordKey::new("boxes", "c2").unwrap();
    let echo = Command::new(["sh", "-c", "echo second"]);
    let e = rt.m_submit(&key("box1"), &c2, &echo).unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted, "{e:?}");
    assert_eq!(rt.fetch(&c2).unwrap_err().category(), Category::NotFound);
    // AC-14.3.1: stop/delete while the command is active → rejected.
    for action in [Op::Stop, Op::Delete] {
        let v = rt.m_inspect(&key("box1")).unwrap().version;
        let e = rt.m_lifecycle(&key("box1"), action, v).unwrap_err();
        assert_eq!(e.category(), Category::AdmissionExhausted, "{e:?}");
    }
    open(&gate);
    let out = rt.wait(&c1, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.exit_code(), Some(0));
    let m = slot_empty(&rt, "box1");
    assert_eq!(m.state, MS::Running);
    let c1rec = rt.fetch(&c1).unwrap();
    assert_eq!(c1rec.cleanup, Cleanup::Complete, "set with the release");
    // The next command runs.
    rt.m_submit(&key("box1"), &c2, &echo).unwrap();
    let out = rt.wait(&c2, 30_000).unwrap();
    assert_eq!(out.exit_code(), Some(0));
    assert_eq!(
        out.output.as_ref().map(|o| o.stdout.clone()),
        Some(b"second\n".to_vec())
    );
    let m = slot_empty(&rt, "box1");
    assert_eq!(s.execs(), 2, "each command exactly once");
    // Stop: capacity stays while stopped (C14.4).
    rt.m_lifecycle(&key("box1"), Op::Stop, m.version).unwrap();
    let m = rt.m_wait(&key("box1"), 30_000).unwrap();
    assert_eq!(m.state, MS::Stopped, "{:?}", m.last_error);
    assert_eq!(s.store.usage(WORKER).unwrap().slots, 1);
    // Delete with reservation checks: released only with the absence.
    rt.m_lifecycle(&key("box1"), Op::Delete, m.version).unwrap();
    let m = rt.m_wait(&key("box1"), 30_000).unwrap();
    assert_eq!(m.state, MS::Deleted, "{:?}", m.last_error);
    assert!(m.absence_at_ms.is_some());
    assert!(m.reservation.is_none() && m.reserved_ports.is_empty());
    assert_eq!(s.store.usage(WORKER).unwrap().slots, 0);
    assert!(!worker_names(&s).contains(&name));
    let w = &s.fixture.worker;
    assert_eq!(w.request_count(Route::MachineDelete), 1);
    // The tombstone deduplicates a repeated create; list includes it.
    let (again, existing) = rt.m_create(&key("box1"), &spec()).unwrap();
    assert!(existing);
    assert_eq!(again.state, MS::Deleted);
    let page = rt.m_list("boxes", None, None).unwrap();
    assert_eq!(page.records[0].state, MS::Deleted);
    // m1 (the suite's) and box1: one create each, never a second.
    assert_eq!(w.request_count(Route::MachinesCreate), 2);
    rt.shutdown();
}

/// The interrupt scenario without the terminal: a command whose outcome is
/// unknown keeps the slot (machine `unknown`); resolve without `quiesced`
/// is rejected; a drain stop is recorded; resolve `stopped` clears the slot
/// with the command still `unknown`; the program ran exactly once.
pub fn resolve_after_an_unknown_command_frees_the_slot<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&options());
    running(&rt, "box2");
    s.fixture
        .worker
        .faults()
        .once(Route::Exec, Fault::DropAfter { bytes: 0 });
    let c1 = RecordKey::new("boxes", "u1").unwrap();
    rt.m_submit(&key("box2"), &c1, &Command::new(["echo", "x"]))
        .unwrap();
    let out = rt.wait(&c1, 30_000).unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    let mut m = rt.m_inspect(&key("box2")).unwrap();
    for _ in 0..1_000 {
        if m.state == MS::Unknown {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        m = rt.m_inspect(&key("box2")).unwrap();
    }
    assert_eq!(m.state, MS::Unknown);
    assert_eq!(m.active_execution, Some(c1.clone()), "the slot is blocked");
    let c2 = RecordKey::new("boxes", "u2").unwrap();
    let e = rt
        .m_submit(&key("box2"), &c2, &Command::new(["echo", "y"]))
        .unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
    // AC-17.3.1.
    let e = rt
        .m_resolve(&key("box2"), m.version, false, Resolution::Stopped)
        .unwrap_err();
    assert_eq!(e.reason(), Reason::NotQuiesced);
    // Still running: resolve `stopped` is an identity conflict (AC-17.3.2).
    // At the version read above, with no retry: the controller's own claim
    // renewals on the machine no longer move the version callers compare
    // against (issue 13), so an operator does not race the controller.
    let e = rt
        .m_resolve(&key("box2"), m.version, true, Resolution::Stopped)
        .unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict, "{e:?}");
    assert_eq!(rt.m_inspect(&key("box2")).unwrap().version, m.version);
    // An ownership-verified stop for draining, keeping the slot.
    let m = rt.m_stop_for_drain(&key("box2"), m.version).unwrap();
    assert_eq!(m.active_execution, Some(c1.clone()));
    assert_eq!(m.observation.as_ref().map(|o| o.state), Some(MS::Stopped));
    let (m, command) = rt
        .m_resolve(&key("box2"), m.version, true, Resolution::Stopped)
        .unwrap();
    assert!(m.active_execution.is_none());
    assert_eq!(m.state, MS::Stopped);
    let command = command.unwrap();
    assert_eq!((command.state, command.result), (ExecState::Unknown, None));
    assert_eq!(s.execs(), 1, "launched exactly once, never replayed");
    // The machine is usable again: start, run, delete.
    rt.m_lifecycle(&key("box2"), Op::Start, m.version).unwrap();
    let m = rt.m_wait(&key("box2"), 30_000).unwrap();
    assert_eq!(m.state, MS::Running, "{:?}", m.last_error);
    rt.m_submit(&key("box2"), &c2, &Command::new(["echo", "y"]))
        .unwrap();
    assert_eq!(rt.wait(&c2, 30_000).unwrap().exit_code(), Some(0));
    let m = slot_empty(&rt, "box2");
    rt.m_lifecycle(&key("box2"), Op::Delete, m.version).unwrap();
    assert_eq!(rt.m_wait(&key("box2"), 30_000).unwrap().state, MS::Deleted);
    assert_eq!(s.store.usage(WORKER).unwrap().slots, 0);
    rt.shutdown();
}

/// Two controllers (two runtimes, distinct owners) sharing the store race
/// to put a command into one machine's slot: exactly one wins, the other
/// gets `admission_exhausted`; the winner's command runs once and the slot
/// empties.
pub fn two_controllers_race_for_the_slot<M: ManagedShell + Sync>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let a: M = s.runtime(&options());
    let b: M = s.runtime(&options());
    running(&a, "box3");
    let gate = s.gate("race");
    let results: Vec<_> = std::thread::scope(|t| {
        let runs: Vec<_> = [(&a, "ra"), (&b, "rb")]
            .into_iter()
            .map(|(rt, id)| {
                let gate = &gate;
                t.spawn(move || {
                    let k = RecordKey::new("boxes", id).unwrap();
                    (k.clone(), rt.m_submit(&key("box3"), &k, &gated(gate)))
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let won: Vec<_> = results.iter().filter(|(_, r)| r.is_ok()).collect();
    let lost: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    assert_eq!((won.len(), lost.len()), (1, 1), "{results:?}");
    let e = lost[0].1.as_ref().unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted, "{e:?}");
    let winner = won[0].0.clone();
    let m = a.m_inspect(&key("box3")).unwrap();
    assert_eq!(m.active_execution, Some(winner.clone()));
    open(&gate);
    let rt = if winner.id == "ra" { &a } else { &b };
    assert_eq!(rt.wait(&winner, 30_000).unwrap().exit_code(), Some(0));
    slot_empty(&a, "box3");
    assert_eq!(s.execs(), 1);
    a.shutdown();
    b.shutdown();
}

/// `Runtime::shutdown` releases the claims it holds (C15): a second
/// runtime (a new owner) takes the machine over at once. The claim TTL is
/// ten minutes and every wait here is at most 30 s, so the second
/// runtime's command could only finish its slot on a released claim. (A
/// crash releases nothing and needs the TTL: the controller's unit tests
/// `tests::release`.)
pub fn a_new_runtime_takes_over_at_once_after_a_shutdown<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let long = Options {
        lease_ttl_ms: 600_000,
        ..options()
    };
    let a: M = s.runtime(&long);
    running(&a, "hand1");
    let c1 = RecordKey::new("boxes", "hand-c1").unwrap();
    a.m_submit(&key("hand1"), &c1, &Command::new(["echo", "one"]))
        .unwrap();
    assert_eq!(a.wait(&c1, 30_000).unwrap().exit_code(), Some(0));
    let held = slot_empty(&a, "hand1");
    let first = held.claim.clone().unwrap();
    a.shutdown();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let m = s.store.fetch_machine(&key("hand1")).unwrap();
    let claim = m.claim.clone().unwrap();
    assert_eq!(claim.owner, first.owner, "ended in place, owner kept");
    assert!(
        claim.until_ms <= now_ms && claim.until_ms < first.until_ms,
        "released: {claim:?} (was {first:?})"
    );
    assert_eq!(
        (m.state, m.version, m.active_execution.as_ref()),
        (MS::Running, held.version, None),
        "a release changes the claim only"
    );
    drop(a);
    let b: M = s.runtime(&long);
    let c2 = RecordKey::new("boxes", "hand-c2").unwrap();
    b.m_submit(&key("hand1"), &c2, &Command::new(["echo", "two"]))
        .unwrap();
    let out = b.wait(&c2, 30_000).unwrap();
    assert_eq!(out.exit_code(), Some(0), "{:?}", out.error);
    let m = slot_empty(&b, "hand1");
    assert_ne!(m.claim.as_ref().unwrap().owner, first.owner, "taken over");
    assert_eq!(s.execs(), 2, "each command exactly once");
    b.shutdown();
}

/// Instantiates every retained-machine case for `$shell`, one `#[test]`
/// per case and store (`mod sqlite`, `mod postgres`).
#[macro_export]
macro_rules! managed_machine_suite {
    ($shell:ty) => {
        $crate::store_suite!(
            $shell,
            managed_machine_cases,
            machines_sqlite,
            machines_postgres,
            [
                a_retained_machine_runs_one_command_at_a_time,
                resolve_after_an_unknown_command_frees_the_slot,
                two_controllers_race_for_the_slot,
                a_machines_ports_reach_the_worker,
                logs_and_measurements_of_a_retained_machine,
                a_new_runtime_takes_over_at_once_after_a_shutdown,
            ]
        );
    };
}
