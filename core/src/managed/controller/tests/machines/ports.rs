//! Host ports of retained machines (C14, C9.2): a conflicting reservation
//! is recorded as `conflict` and deleted with no worker call, a `conflict`
//! machine is deleted once ownership or absence is verified, and the spec's
//! ports reach the worker's create.

use super::*;

/// C14 ports: a host port another machine on the worker holds makes the
/// reservation fail as a whole: the machine is `conflict`, with nothing
/// reserved and no worker request; it is deleted with no worker call.
#[test]
fn a_port_conflict_is_recorded_and_deleted_without_a_worker_call() {
    let mut s = Sim::new(disposable_config());
    let with_port = || {
        let mut spec = mspec();
        spec.ports = vec![crate::managed::spec::ReservedPort {
            host: 8080,
            guest: 80,
        }];
        spec
    };
    s.settle();
    s.request(MachineRequest::Create {
        key: mkey(),
        spec: with_port(),
    })
    .unwrap();
    s.settle();
    s.answer(
        "create",
        Ok(WorkerReply::Machine(obs(MachineState::Created))),
    );
    let k2 = RecordKey::new("s", "box-2").unwrap();
    s.request(MachineRequest::Create {
        key: k2.clone(),
        spec: with_port(),
    })
    .unwrap();
    s.advance(1_000);
    let m = s.store.machines[&k2].clone();
    assert_eq!(m.state, MS::Conflict);
    assert_eq!(
        m.last_error.as_ref().map(|e| e.category.as_str()),
        Some("port_conflict")
    );
    assert!(m.assignment.is_none() && m.reservation.is_none() && m.reserved_ports.is_empty());
    assert!(s.worker.is_empty(), "no worker request");
    assert!(machine_settled(&m));
    let d = s
        .request(MachineRequest::Lifecycle {
            key: k2.clone(),
            action: Op::Delete,
            version: m.version,
        })
        .unwrap();
    assert_eq!(d.into_machine().unwrap().0.operation, Op::Delete);
    s.advance(1_000);
    assert_eq!(s.store.machines[&k2].state, MS::Deleted);
    assert!(s.worker.is_empty(), "deleted with no worker call");
    assert_eq!(
        s.machine().reserved_ports,
        vec![8080],
        "the holder keeps its port"
    );
}

/// Runs the machine into `conflict`: a stop whose answer is lost leaves it
/// `unknown` (stop `uncertain`), then a reconcile finds another
/// incarnation under its name.
fn conflicted(s: &mut Sim) {
    s.running_machine();
    s.lifecycle(Op::Stop).unwrap();
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    s.answer(
        "stop",
        Err(Error::transport(
            Operation::Stop,
            Evidence::DispatchUncertain,
            Reason::Unspecified,
        )),
    );
    assert_eq!(
        (s.machine().state, s.machine().phase),
        (MS::Unknown, MachinePhase::Uncertain)
    );
    s.request_async(MachineRequest::Reconcile { key: mkey() });
    let other = observation(&machine_name(), MachineState::Running, 1_700_000_999);
    s.answer("inspect", Ok(WorkerReply::Machine(other)));
    assert_eq!(s.machine().state, MS::Conflict);
    assert_eq!(
        s.machine().operation,
        Op::Stop,
        "the reconcile keeps the uncertain stop"
    );
}

/// An assigned machine in `conflict` (C14, ownership): the delete
/// supersedes the uncertain operation and inspects first. Another
/// incarnation under its name is refused (`identity_conflict`, nothing
/// mutated, reservation kept); once the worker answers 404 the deletion
/// and absence are recorded and capacity is released, with no delete sent.
#[test]
fn an_assigned_conflict_machine_is_deleted_once_absence_is_verified() {
    let mut s = Sim::new(disposable_config());
    conflicted(&mut s);
    s.lifecycle(Op::Delete).unwrap();
    let other = observation(&machine_name(), MachineState::Running, 1_700_000_999);
    s.answer("inspect", Ok(WorkerReply::Machine(other)));
    let m = s.machine().clone();
    assert_eq!((m.state, m.operation), (MS::Conflict, Op::None));
    assert_eq!(
        m.last_error.as_ref().map(|e| e.reason.as_str()),
        Some("incarnation_mismatch")
    );
    assert!(m.reservation.is_some());
    assert!(s.worker.is_empty(), "nothing mutated on the worker");
    // The foreign machine is removed out of band: the 404 is the absence.
    s.lifecycle(Op::Delete).unwrap();
    s.answer("inspect", Err(not_found()));
    let m = s.machine().clone();
    assert_eq!(m.state, MS::Deleted);
    assert!(m.absence_at_ms.is_some() && m.reservation.is_none());
    assert!(s.worker.is_empty(), "no delete sent");
}

/// The recorded incarnation found again under the name: ownership is
/// verified, so the delete goes to the worker (`conflict` → `deleting`).
#[test]
fn a_conflict_machine_showing_its_own_incarnation_is_deleted_on_the_worker() {
    let mut s = Sim::new(disposable_config());
    conflicted(&mut s);
    s.lifecycle(Op::Delete).unwrap();
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    assert_eq!(s.machine().state, MS::Deleting);
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    assert_eq!(s.machine().state, MS::Deleted);
    assert!(s.machine().reservation.is_none());
}

/// The spec's ports are reserved with the assignment and sent in the
/// worker's create (C14, C9.2).
#[test]
fn the_spec_ports_reach_the_workers_create() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    let mut spec = mspec();
    spec.ports = vec![
        crate::managed::spec::ReservedPort {
            host: 8080,
            guest: 80,
        },
        crate::managed::spec::ReservedPort {
            host: 8443,
            guest: 443,
        },
    ];
    s.request(MachineRequest::Create { key: mkey(), spec })
        .unwrap();
    s.settle();
    assert_eq!(s.machine().reserved_ports, vec![8080, 8443]);
    let (_, op) = &s.worker[0];
    let WorkerOp::Create { spec, .. } = op else {
        panic!("expected a create, got {op:?}");
    };
    let sent: Vec<(u16, u16)> = spec.ports.iter().map(|p| (p.host(), p.guest())).collect();
    assert_eq!(sent, [(8080, 80), (8443, 443)]);
}
