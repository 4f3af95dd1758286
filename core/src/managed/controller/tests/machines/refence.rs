//! `stop_for_drain` and `reconcile` on a machine assigned under an older
//! worker-lease generation: they re-fence it (`claim_machine_version`) as
//! the machine task does, instead of failing `stale_claim`.

use super::*;

/// The machine of `s` assigned under generation 1, its lease then taken
/// by a controller that crashed (generation 2, lapsed since); a new
/// controller `t` on the same store.
fn fenced() -> Sim {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    assert_eq!(
        s.machine().assignment.as_ref().unwrap().worker_generation,
        1
    );
    s.store.leases.insert(
        WORKER.into(),
        Lease {
            owner: "ctl-crashed".into(),
            generation: 2,
            until_ms: s.now_ms + 10,
        },
    );
    take_over(&mut s, "ctl-test-3", 5_000)
}

#[test]
fn stop_for_drain_refences_a_machine_left_under_an_older_worker_lease() {
    let mut t = fenced();
    let v = t.machine().version;
    let id = t.request_async(MachineRequest::StopForDrain {
        key: mkey(),
        version: v,
    });
    t.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Running))),
    );
    assert!(machine_refenced(&t), "{:#?}", t.store_log);
    assert_eq!(t.store.leases[WORKER].generation, 3);
    assert_eq!(
        t.machine().assignment.as_ref().unwrap().worker_generation,
        3
    );
    assert!(
        t.machine()
            .last_error
            .as_ref()
            .is_some_and(|e| e.reason == "drain_stop_intent"),
        "the stop intent is durable before the stop"
    );
    t.answer("stop", Ok(WorkerReply::Machine(obs(MachineState::Stopped))));
    t.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let MachineAnswer::Machine { record, .. } = t.answer_of(id).unwrap() else {
        panic!("not a machine answer")
    };
    assert_eq!(
        record.state,
        MS::Stopped,
        "idle: the verified stop is the state"
    );
    assert_eq!(
        record.observation.as_ref().map(|o| o.state),
        Some(MS::Stopped)
    );
}

#[test]
fn reconcile_refences_a_machine_left_under_an_older_worker_lease() {
    let mut t = fenced();
    let id = t.request_async(MachineRequest::Reconcile { key: mkey() });
    t.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let MachineAnswer::Machine { record, .. } = t.answer_of(id).unwrap() else {
        panic!("not a machine answer")
    };
    assert!(machine_refenced(&t), "{:#?}", t.store_log);
    assert_eq!(record.state, MS::Stopped, "the observed state is recorded");
    assert_eq!(record.assignment.as_ref().unwrap().worker_generation, 3);
    assert!(t.worker.is_empty(), "nothing but the inspect was sent");
}

/// Another controller holds the worker lease live: the re-fence is
/// refused (`stale_claim`), nothing is written and the answer says so.
#[test]
fn a_fenced_reconcile_is_refused_while_another_controller_holds_the_worker() {
    let mut t = fenced();
    let live = t.now_ms + 60_000;
    t.store.leases.insert(
        WORKER.into(),
        Lease {
            owner: "ctl-live".into(),
            generation: 2,
            until_ms: live,
        },
    );
    let before = t.machine().clone();
    let id = t.request_async(MachineRequest::Reconcile { key: mkey() });
    t.answer(
        "inspect",
        Ok(WorkerReply::Machine(obs(MachineState::Stopped))),
    );
    let e = t.answer_of(id).unwrap_err();
    assert_eq!(e.category(), Category::StaleClaim);
    let after = t.machine();
    assert_eq!(
        (after.version, after.state, after.assignment.clone()),
        (before.version, before.state, before.assignment.clone()),
        "nothing caller-visible written"
    );
}
