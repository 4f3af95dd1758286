//! A command on a caller-named machine that needs a plain image machine
//! is inspected before its acceptance (`controller/accept.rs`): refused
//! with nothing stored or sent, accepted after an admitting inspect, and
//! a stored duplicate resolves whatever the machine is now (AC-12.5.2).

use super::*;

fn extended() -> Command {
    Command::new(["sh", "-c", "echo ext"]).workdir("/tmp")
}

/// The caller's machine `m1` as the worker shows it, with `image` (and
/// `branchable: false` when it has one).
fn m1(image: Option<&str>) -> WorkerResult {
    let mut obs = observation("m1", MachineState::Running, 1_700_000_000);
    obs.incarnation.image = image.map(str::to_owned);
    obs.branchable = image.map(|_| false);
    Ok(WorkerReply::Machine(obs))
}

fn refused(s: &Sim, key: &RecordKey) -> Option<Error> {
    s.events.iter().find_map(|e| match e {
        ControllerEvent::Refused { key: k, error } if k == key => Some(*error),
        _ => None,
    })
}

fn accepted(s: &Sim, key: &RecordKey) -> Option<bool> {
    s.events.iter().find_map(|e| match e {
        ControllerEvent::Accepted {
            key: k, existing, ..
        } if k == key => Some(*existing),
        _ => None,
    })
}

fn writes(s: &Sim) -> Vec<&'static str> {
    s.store_log
        .iter()
        .map(StoreOp::name)
        .filter(|n| !n.starts_with("fetch") && !n.starts_with("due") && *n != "claim_worker")
        .collect()
}

#[test]
fn an_extended_command_on_an_imageless_named_machine_is_refused_before_acceptance() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    s.store_log.clear();
    let key = s.submit("x1", &extended());
    s.settle();
    assert_eq!(writes(&s), Vec::<&str>::new(), "nothing stored before");
    assert!(accepted(&s, &key).is_none() && refused(&s, &key).is_none());
    let op = s.answer("inspect", m1(None));
    assert!(
        matches!(&op, WorkerOp::Inspect { worker_id, name, .. }
            if worker_id == WORKER && name.as_str() == "m1"),
        "{op:?}"
    );
    let e = refused(&s, &key).expect("refused");
    assert_eq!(
        (e.category(), e.reason(), e.evidence(), e.operation()),
        (
            Category::UnsupportedCapability,
            Reason::NeedsPlainImageMachine,
            Evidence::NotDispatched,
            Operation::Exec
        ),
        "{e:?}"
    );
    assert_eq!(writes(&s), Vec::<&str>::new(), "nothing stored");
    assert!(!s.store.records.contains_key(&key));
    assert!(s.worker.is_empty(), "no exec: {:?}", s.worker);
}

#[test]
fn an_image_machine_admits_it_and_it_runs() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    let key = s.submit("x1", &extended());
    s.settle();
    s.answer("inspect", m1(Some("alpine")));
    assert_eq!(accepted(&s, &key), Some(false));
    s.answer("exec", exited(0, "ext\n"));
    assert_eq!(s.record(&key).state, ExecState::Completed);
}

#[test]
fn a_failed_inspect_keeps_its_category_and_stores_nothing() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    s.store_log.clear();
    let key = s.submit("x1", &extended());
    s.settle();
    s.answer("inspect", Err(not_found()));
    let e = refused(&s, &key).expect("refused");
    assert_eq!(
        (e.category(), e.evidence(), e.operation()),
        (Category::NotFound, Evidence::NotDispatched, Operation::Get),
        "{e:?}"
    );
    assert_eq!(writes(&s), Vec::<&str>::new());
    assert!(s.worker.is_empty());
}

#[test]
fn a_stored_duplicate_resolves_whatever_the_machine_is_now() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    let key = s.submit("x1", &extended());
    s.settle();
    s.answer("inspect", m1(Some("alpine")));
    s.answer("exec", exited(0, "ext\n"));
    let stored = s.record(&key).clone();
    // The machine was deleted since: the duplicate still resolves.
    s.events.clear();
    s.store_log.clear();
    s.submit("x1", &extended());
    s.settle();
    s.answer("inspect", Err(not_found()));
    assert_eq!(accepted(&s, &key), Some(true), "{:?}", s.events);
    assert_eq!(s.record(&key), &stored, "nothing written");
    assert_eq!(writes(&s), Vec::<&str>::new());
    // Another spec under the key conflicts; a store failure is its error.
    s.events.clear();
    s.submit("x1", &extended().env("A", "b"));
    s.settle();
    s.answer("inspect", m1(None));
    let e = refused(&s, &key).expect("refused");
    assert_eq!(e.category(), Category::IdentityConflict, "{e:?}");
    s.events.clear();
    s.submit("x1", &extended());
    s.settle();
    s.store.fail_next = 1;
    s.answer("inspect", m1(None));
    let e = refused(&s, &key).expect("refused");
    assert_eq!(e.category(), Category::Store, "{e:?}");
}

#[test]
fn an_ordinary_command_or_an_unprofiled_worker_is_not_inspected() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    let key = s.submit("o1", &cmd());
    s.settle();
    s.answer("exec", exited(4, "hi\n"));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    // No admitted profile: the dispatch's own preflight decides.
    let mut s = Sim::new(config());
    s.settle();
    s.submit("x1", &extended());
    s.settle();
    assert_eq!(s.worker.first().map(|(_, op)| op.name()), Some("exec"));
}

#[test]
fn an_inspect_answered_after_shutdown_began_accepts_nothing() {
    let mut s = Sim::new(disposable_config());
    s.settle();
    s.store_log.clear();
    let key = s.submit("x1", &extended());
    s.settle();
    s.ctl.shutdown(s.now, s.now_ms);
    s.settle();
    s.answer("inspect", m1(Some("alpine")));
    let e = refused(&s, &key).expect("refused");
    assert_eq!(
        (e.category(), e.reason()),
        (Category::AdmissionExhausted, Reason::ShuttingDown),
        "{e:?}"
    );
    assert_eq!(writes(&s), Vec::<&str>::new(), "nothing stored");
    assert!(s.worker.is_empty());
}
