//! A configuration with no worker able to create or drive machines (no
//! admitted version profile): every machine request is refused
//! (`retained_machines`), but a create or a slot command whose key is
//! stored is answered from the store as the other configuration refusals
//! are (AC-12.5.2): the stored record, `identity_conflict`, the refusal
//! when nothing is stored, or the store's own error.

use super::*;

/// The machine running with command `c1` completed in its slot, as
/// another configuration left them; `config()`'s worker has no profile.
fn left_by_another_configuration() -> Sim {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.submit_to_slot("c1", &cmd()).unwrap();
    s.answer("exec", exited(0, ""));
    assert_eq!(
        s.record(&RecordKey::new("s", "c1").unwrap()).state,
        ExecState::Completed
    );
    let mut d = Sim::new(config());
    d.store.machines = s.store.machines.clone();
    d.store.records = s.store.records.clone();
    d.settle();
    d.store_log.clear();
    d
}

fn no_machines(e: &Error) {
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::UnsupportedCapability,
            Reason::RetainedMachines,
            Evidence::NotDispatched
        ),
        "{e:?}"
    );
}

/// Reads only: nothing written, nothing sent.
fn only_reads(s: &Sim) {
    assert!(
        s.store_log
            .iter()
            .all(|op| op.name().starts_with("fetch") || op.name().starts_with("due")),
        "{:?}",
        s.store_log
    );
    assert!(s.worker.is_empty(), "{:?}", s.worker);
}

#[test]
fn a_stored_machine_resolves_as_a_duplicate_and_a_new_key_is_refused() {
    let mut s = left_by_another_configuration();
    let stored = s.machine().clone();
    let a = s
        .request(MachineRequest::Create {
            key: mkey(),
            spec: mspec(),
        })
        .unwrap();
    let MachineAnswer::Machine { record, existing } = a else {
        panic!("{a:?}")
    };
    assert!(existing);
    assert_eq!(*record, stored);
    let mut other = mspec();
    other.checkpointable = true;
    let e = s
        .request(MachineRequest::Create {
            key: mkey(),
            spec: other,
        })
        .unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict, "{e:?}");
    let new = RecordKey::new("s", "box-new").unwrap();
    let e = s
        .request(MachineRequest::Create {
            key: new.clone(),
            spec: mspec(),
        })
        .unwrap_err();
    no_machines(&e);
    assert!(!s.store.machines.contains_key(&new));
    // The store could not answer: its error, never "not stored".
    s.store.fail_next = 1;
    let e = s
        .request(MachineRequest::Create {
            key: new,
            spec: mspec(),
        })
        .unwrap_err();
    assert_eq!(e.category(), Category::Store, "{e:?}");
    only_reads(&s);
    assert_eq!(s.machine(), &stored);
}

#[test]
fn a_stored_slot_command_resolves_as_a_duplicate_and_a_new_key_is_refused() {
    let mut s = left_by_another_configuration();
    let c1 = RecordKey::new("s", "c1").unwrap();
    let stored = s.record(&c1).clone();
    let a = s.submit_to_slot("c1", &cmd()).unwrap();
    let MachineAnswer::Submitted {
        execution,
        existing,
        ..
    } = a
    else {
        panic!("{a:?}")
    };
    assert!(existing);
    assert_eq!(*execution, stored);
    let e = s
        .submit_to_slot("c1", &Command::new(["echo", "other"]))
        .unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict, "{e:?}");
    let e = s.submit_to_slot("c2", &cmd()).unwrap_err();
    no_machines(&e);
    assert!(
        !s.store
            .records
            .contains_key(&RecordKey::new("s", "c2").unwrap())
    );
    // The machine read, then the command's: the second fails.
    s.store.fail_next = 0;
    let id = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::Submit {
                machine: mkey(),
                key: RecordKey::new("s", "c3").unwrap(),
                command: cmd(),
                files: crate::managed::CommandFiles::default(),
            },
        )
        .unwrap();
    let (oid, op) = s.ctl.poll_store_op().unwrap();
    assert_eq!(op.name(), "fetch_machine");
    let r = s.store.apply(&op);
    s.ctl.handle_stored(s.now, s.now_ms, oid, r);
    s.store.fail_next = 1;
    s.settle();
    let e = s.answer_of(id).unwrap_err();
    assert_eq!(e.category(), Category::Store, "{e:?}");
    only_reads(&s);
    assert_eq!(s.record(&c1), &stored);
}

#[test]
fn other_machine_requests_are_refused_at_once() {
    let mut s = left_by_another_configuration();
    let version = s.machine().version;
    let e = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::Lifecycle {
                key: mkey(),
                action: Op::Stop,
                version,
            },
        )
        .unwrap_err();
    no_machines(&e);
    s.settle();
    assert!(s.store_log.iter().all(|op| op.name().starts_with("due")));
}

#[test]
fn a_duplicate_of_the_command_holding_the_slot_is_not_driven_here() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.submit_to_slot("c1", &cmd()).unwrap();
    assert!(s.worker.iter().any(|(_, op)| op.name() == "exec"), "out");
    let mut d = Sim::new(config());
    d.store.machines = s.store.machines.clone();
    d.store.records = s.store.records.clone();
    d.settle();
    d.store_log.clear();
    let c1 = RecordKey::new("s", "c1").unwrap();
    let stored = d.record(&c1).clone();
    let a = d.submit_to_slot("c1", &cmd()).unwrap();
    assert!(
        matches!(a, MachineAnswer::Submitted { existing: true, .. }),
        "{a:?}"
    );
    d.advance(5_000);
    only_reads(&d);
    assert_eq!(d.record(&c1), &stored, "left to the controller driving it");
}
