//! A slot command's image-machine preflight before its acceptance (C5.4,
//! C6.1, C14.3; `machines/preinspect.rs`): a command whose dispatch needs
//! a plain image machine is inspected before anything is stored; a
//! refusal leaves no record, no slot taken and the machine as it was.

use super::*;
use crate::managed::controller::machines::preinspect::gated_operation;

fn mkey() -> RecordKey {
    machines::mkey()
}

fn skey(id: &str) -> RecordKey {
    RecordKey::new("s", id).unwrap()
}

/// The retained machine as the worker shows it, with `image` (and
/// `branchable: false` when it has one).
pub(super) fn inspected(image: Option<&str>) -> WorkerResult {
    let name = crate::managed::controller::machines::machine_name_for(&mkey());
    let mut obs = observation(&name, MachineState::Running, 1_700_000_000);
    obs.incarnation.image = image.map(str::to_owned);
    obs.branchable = image.map(|_| false);
    Ok(WorkerReply::Machine(obs))
}

fn extended() -> Command {
    Command::new(["sleep", "1"]).workdir("/tmp")
}

/// Starts a slot submission; returns its request id (answered or not).
pub(super) fn submit_async(
    s: &mut Sim,
    id: &str,
    command: &Command,
    files: &CommandFiles,
) -> RequestId {
    let id = s
        .ctl
        .machine(
            s.now,
            s.now_ms,
            MachineRequest::Submit {
                machine: mkey(),
                key: skey(id),
                command: command.clone(),
                files: files.clone(),
            },
        )
        .unwrap();
    s.settle();
    id
}

fn answered(s: &Sim, id: RequestId) -> Option<Result<MachineAnswer, Error>> {
    s.events.iter().find_map(|e| match e {
        ControllerEvent::Machine(d) if d.id == id => Some(d.result.clone()),
        _ => None,
    })
}

/// Store ops from `from` on, reads left out.
fn writes(s: &Sim, from: usize) -> Vec<&'static str> {
    s.store_log[from..]
        .iter()
        .map(StoreOp::name)
        .filter(|n| !n.starts_with("fetch") && !n.starts_with("due"))
        .collect()
}

#[test]
fn an_extended_slot_command_on_an_imageless_machine_is_refused_before_acceptance() {
    let mut s = Sim::new(files_config());
    s.running_machine();
    let before = s.machine().clone();
    let from = s.store_log.len();
    let id = submit_async(&mut s, "x1", &extended(), &CommandFiles::default());
    // Asked of the worker before anything is stored.
    assert!(
        answered(&s, id).is_none(),
        "waits for the inspect: {:?}",
        answered(&s, id)
    );
    assert_eq!(writes(&s, from), Vec::<&str>::new());
    let op = s.answer("inspect", inspected(None));
    assert!(matches!(&op, WorkerOp::Inspect { worker_id, name, .. }
            if worker_id == WORKER && name.as_str() == before.assignment.as_ref().unwrap().machine_name));
    let e = answered(&s, id).expect("answered").unwrap_err();
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
    assert_eq!(writes(&s, from), Vec::<&str>::new(), "nothing stored");
    assert!(!s.store.records.contains_key(&skey("x1")));
    assert_eq!(s.machine(), &before, "slot free, machine unchanged");
    assert!(s.worker.is_empty(), "no exec: {:?}", s.worker);
    // The machine still takes an ordinary command, uninspected.
    s.submit_to_slot("x2", &cmd()).unwrap();
    s.answer("exec", exited(0, ""));
    assert_eq!(s.record(&skey("x2")).state, ExecState::Completed);
}

#[test]
fn a_failed_inspect_keeps_its_category_and_stores_nothing() {
    let mut s = Sim::new(files_config());
    s.running_machine();
    let before = s.machine().clone();
    let from = s.store_log.len();
    let bg = Command::new(["sleep", "100"]).background(true);
    let id = submit_async(&mut s, "b1", &bg, &CommandFiles::default());
    let uncertain = Error::transport(
        Operation::Get,
        Evidence::DispatchUncertain,
        Reason::Unspecified,
    );
    s.answer("inspect", Err(uncertain));
    let e = answered(&s, id).expect("answered").unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.operation()),
        (Category::Transport, Evidence::NotDispatched, Operation::Get),
        "{e:?}"
    );
    assert_eq!(writes(&s, from), Vec::<&str>::new());
    assert_eq!(s.machine(), &before);
    // A launch on an imageless machine: refused on the launch.
    let id = submit_async(&mut s, "b2", &bg, &CommandFiles::default());
    s.answer("inspect", inspected(None));
    let e = answered(&s, id).expect("answered").unwrap_err();
    assert_eq!(
        (e.reason(), e.operation()),
        (Reason::NeedsPlainImageMachine, Operation::Launch)
    );
    assert_eq!(writes(&s, from), Vec::<&str>::new());
}

/// On a plain image machine the command is accepted after the inspect,
/// with a claim taken then (not when the machine was read): the inspect
/// may take longer than the claim TTL.
#[test]
fn on_an_image_machine_the_command_is_accepted_after_the_inspect_with_a_fresh_claim() {
    let mut s = Sim::new(files_config());
    s.running_machine();
    let id = submit_async(&mut s, "i1", &extended(), &CommandFiles::default());
    s.now += Duration::from_millis(5_000);
    s.now_ms += 5_000;
    let from = s.store_log.len();
    s.answer("inspect", inspected(Some("alpine:3.19")));
    let (rec, _, existing) = answered(&s, id)
        .expect("answered")
        .unwrap()
        .into_submitted()
        .unwrap();
    assert!(!existing);
    assert_eq!(writes(&s, from), ["submit_dispatching"]);
    assert_eq!(rec.accepted_at_ms, s.now_ms);
    assert!(rec.claim.as_ref().unwrap().until_ms > s.now_ms, "{rec:?}");
    assert_eq!(s.machine().active_execution.as_ref(), Some(&skey("i1")));
    s.answer("exec", exited(0, "ok"));
    assert_eq!(s.record(&skey("i1")).state, ExecState::Completed);
}

#[test]
fn an_ordinary_command_and_a_duplicate_in_the_slot_are_not_inspected() {
    let mut s = Sim::new(files_config());
    s.running_machine();
    s.submit_to_slot("o1", &cmd()).unwrap();
    assert_eq!(
        s.worker.iter().map(|(_, op)| op.name()).collect::<Vec<_>>(),
        ["exec"]
    );
    s.answer("exec", exited(0, ""));
    // A duplicate of a command holding the slot is the store's answer.
    let id = submit_async(&mut s, "d1", &extended(), &CommandFiles::default());
    s.answer("inspect", inspected(Some("alpine:3.19")));
    assert!(answered(&s, id).unwrap().is_ok());
    let again = s.submit_to_slot("d1", &extended()).unwrap();
    assert!(matches!(
        again,
        MachineAnswer::Submitted { existing: true, .. }
    ));
    assert_eq!(
        s.worker.iter().map(|(_, op)| op.name()).collect::<Vec<_>>(),
        ["exec"],
        "no second inspect"
    );
}

#[test]
fn large_or_out_of_root_slot_files_are_inspected_first() {
    let mut s = Sim::new(files_config());
    s.running_machine();
    // A machine whose profile takes files over 1 MiB (C6.3).
    let mib = 1_048_576;
    let m = s.store.machines.get_mut(&mkey()).unwrap();
    m.spec.profile.per_file_max = 2 * mib;
    let from = s.store_log.len();
    let files = CommandFiles {
        inputs: Vec::new(),
        outputs: vec![output("/workspace/out", "o", mib + 1)],
    };
    let id = submit_async(&mut s, "f1", &cmd(), &files);
    s.answer("inspect", inspected(Some("")));
    let e = answered(&s, id).expect("answered").unwrap_err();
    assert_eq!(
        (e.reason(), e.evidence(), e.operation()),
        (
            Reason::NeedsPlainImageMachine,
            Evidence::NotDispatched,
            Operation::Download
        )
    );
    assert_eq!(writes(&s, from), Vec::<&str>::new());
    assert!(s.machine().active_execution.is_none());
}

/// Which slot commands carry the preflight: as the worker calls do (an
/// extended command, a file over 1 MiB or outside `/workspace`), at N and
/// N + 1, named by the first gated operation of the dispatch.
#[test]
fn the_gated_operation_of_a_slot_command() {
    let none = CommandFiles::default();
    let plain = Command::new(["true"]);
    assert_eq!(gated_operation(&plain, &none, true), None);
    assert_eq!(
        gated_operation(&plain.clone().timeout_secs(300), &none, false),
        None
    );
    assert_eq!(
        gated_operation(&plain.clone().timeout_secs(301), &none, false),
        Some(Operation::Exec)
    );
    assert_eq!(
        gated_operation(&plain.clone().timeout_secs(301), &none, true),
        Some(Operation::ExecStream)
    );
    assert_eq!(
        gated_operation(&plain.clone().timeout_secs(301).stdin("x"), &none, true),
        Some(Operation::Exec),
        "stdin goes out buffered"
    );
    assert_eq!(
        gated_operation(&plain.clone().background(true), &none, true),
        Some(Operation::Launch)
    );
    assert_eq!(
        gated_operation(&plain.clone().workdir("/workspace/sub"), &none, false),
        None
    );
    assert_eq!(
        gated_operation(&plain.clone().workdir("/tmp"), &none, false),
        Some(Operation::Exec)
    );
    let mib = 1_048_576_u64;
    let sized = |n: u64| CommandFiles {
        inputs: vec![InputFile {
            path: "/workspace/in".into(),
            source: "s".into(),
            sha256: sha(b""),
            size: n,
        }],
        outputs: vec![output("/workspace/out", "o", n)],
    };
    assert_eq!(gated_operation(&plain, &sized(mib), false), None);
    let mut over = sized(mib);
    over.outputs[0].max_size = mib + 1;
    assert_eq!(
        gated_operation(&plain, &over, false),
        Some(Operation::Download)
    );
    assert_eq!(
        gated_operation(&plain.clone().timeout_secs(301), &sized(mib + 1), false),
        Some(Operation::Upload),
        "the uploads go out first"
    );
}
