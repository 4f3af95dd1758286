//! A delete whose ownership check finds the machine already gone.

use super::*;

/// Recovery simulation, retained run, seed 1064: a running machine is
/// deleted while the worker has lost it (a serve restart deletes running
/// machines). The verify answers 404; `running` → `deleted` is no
/// transition, so the write was refused (`forbidden_transition`) on every
/// attempt and the delete never ended. Now the absence is recorded with
/// `missing` and the pending delete settles `deleted`, releasing the
/// reservation; nothing is sent to the worker but the inspect.
#[test]
fn a_delete_that_finds_a_running_machine_gone_records_absence_and_ends_deleted() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    assert!(s.machine().reservation.is_some());
    s.lifecycle(Op::Delete).unwrap();
    s.answer("inspect", Err(not_found()));
    let m = s.machine();
    assert_eq!((m.state, m.operation), (MS::Deleted, Op::None), "{m:#?}");
    assert!(m.absence_at_ms.is_some());
    assert!(m.reservation.is_none(), "released with recorded absence");
    assert!(
        !s.worker
            .iter()
            .any(|(_, op)| matches!(op, WorkerOp::Delete { .. })),
        "no delete sent to a machine that is gone"
    );
}
