//! Reads of a retained machine (C14.2): `logs` and `measurements` reach the
//! worker only for the recorded incarnation and write nothing.

use super::*;

/// `logs` and `measurements` (C14.2) read the worker only after the
/// recorded incarnation is verified: the inspect's measurements, the
/// console lines; another incarnation under the name is refused; a deleted
/// machine or one without creation evidence is refused before any call;
/// `follow` is refused at the request. Nothing is written.
#[test]
fn logs_and_measurements_read_the_recorded_incarnation_only() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let before = s.machine().clone();
    s.store_log.clear();
    let id = s.request_async(MachineRequest::Measurements { key: mkey() });
    let mut o = obs(MachineState::Running);
    o.measurements.rss_mb = Some(42);
    s.answer("inspect", Ok(WorkerReply::Machine(o)));
    let (m, rec) = s.answer_of(id).unwrap().into_measurements().unwrap();
    assert_eq!(m.rss_mb, Some(42));
    assert_eq!(rec.key, mkey());
    let params = crate::worker::LogsParams {
        tail: 5,
        ..crate::worker::LogsParams::default()
    };
    let id = s.request_async(MachineRequest::Logs {
        key: mkey(),
        params,
    });
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    let op = s.answer("logs", Ok(WorkerReply::Logs(vec!["booted".into()])));
    let WorkerOp::Logs {
        params: sent, name, ..
    } = op
    else {
        panic!("{op:?}");
    };
    assert_eq!((sent.tail, name.as_str()), (5, machine_name().as_str()));
    assert_eq!(s.answer_of(id).unwrap().into_logs().unwrap(), ["booted"]);
    // Another incarnation under the name: refused, no logs read.
    let id = s.request_async(MachineRequest::Logs {
        key: mkey(),
        params,
    });
    let other = observation(&machine_name(), MachineState::Running, 1_700_000_999);
    s.answer("inspect", Ok(WorkerReply::Machine(other)));
    let e = s.answer_of(id).unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::IdentityConflict, Reason::IncarnationMismatch)
    );
    assert!(s.worker.is_empty());
    let follow = crate::worker::LogsParams {
        follow: true,
        ..params
    };
    let e = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::Logs {
                key: mkey(),
                params: follow,
            },
        )
        .unwrap_err();
    assert_eq!(e.reason(), Reason::FollowUnsupported);
    assert!(
        !s.store_log.iter().any(|op| matches!(
            op,
            StoreOp::WriteMachine { .. } | StoreOp::ClaimMachine { .. }
        )),
        "reads write nothing"
    );
    assert_eq!(s.machine(), &before);
}

/// A machine without creation evidence has nothing to read: refused with
/// no worker call.
#[test]
fn measurements_of_a_machine_never_created_are_refused_unsent() {
    let mut s = create_out();
    s.worker.clear();
    let id = s.request_async(MachineRequest::Measurements { key: mkey() });
    let e = s.answer_of(id).unwrap_err();
    assert_eq!(
        (e.reason(), e.evidence()),
        (Reason::NoCreationEvidence, Evidence::NotDispatched)
    );
    assert!(s.worker.is_empty());
}
