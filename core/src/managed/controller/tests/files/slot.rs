//! Declared files of a command in a retained machine's slot (C6.4, C14.3,
//! issue 12): staged inside the slot before the dispatch intent, collected
//! after the exit with the machine re-observed as its recorded incarnation,
//! the slot finished (and the cleanup set) in one commit after collection;
//! a failed collection or an interrupted preparation keeps the slot.

use super::*;
use crate::managed::CommandFiles;
use crate::managed::state::MachineRecordState as MS;

fn mkey() -> RecordKey {
    machines::mkey()
}

fn mname() -> String {
    crate::managed::controller::machines::machine_name_for(&mkey())
}

/// The retained machine as the worker shows it: the incarnation the
/// machine tests created (`created_at` 1,700,000,000) in `state`.
fn seen(state: MachineState, created_at: u64) -> WorkerResult {
    Ok(WorkerReply::Machine(observation(
        &mname(),
        state,
        created_at,
    )))
}

fn running() -> WorkerResult {
    seen(MachineState::Running, 1_700_000_000)
}

fn one_in_one_out() -> CommandFiles {
    CommandFiles {
        inputs: vec![input("/workspace/a.txt", "in-a", b"alpha")],
        outputs: vec![output("/workspace/out/x", "out-x", 64)],
    }
}

fn kinds(s: &Sim) -> Vec<&'static str> {
    s.worker.iter().map(|(_, op)| op.name()).collect()
}

fn skey(id: &str) -> RecordKey {
    RecordKey::new("s", id).unwrap()
}

/// A running retained machine with `files` submitted into its slot.
fn submitted(id: &str, files: &CommandFiles) -> (Sim, RecordKey) {
    let mut s = Sim::new(files_config());
    s.running_machine();
    s.submit_files_to_slot(id, &cmd(), files).unwrap();
    (s, skey(id))
}

/// Stages the one input of [`one_in_one_out`]: upload, read back.
fn stage(s: &mut Sim) {
    s.answer("upload", uploaded(5));
    s.answer("download", downloaded(b"alpha"));
}

#[test]
fn inputs_are_staged_in_the_slot_before_the_intent_and_outputs_collected_before_the_slot_finish() {
    let (mut s, key) = submitted("sf1", &one_in_one_out());
    // Accepted with the slot but without the intent: this controller
    // writes `preparing` and stages under it.
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Preparing);
    assert_eq!(rec.spec.inputs.len(), 1);
    assert_eq!(s.machine().active_execution.as_ref(), Some(&key));
    assert_eq!(kinds(&s), ["upload"]);
    let op = s.answer("upload", uploaded(5));
    let WorkerOp::Upload {
        worker_id,
        name,
        source,
        sha256,
        size,
        per_file,
        ..
    } = op
    else {
        unreachable!()
    };
    assert_eq!(
        (worker_id.as_str(), name.as_str()),
        (WORKER, mname().as_str())
    );
    assert_eq!((source.as_str(), sha256, size), ("in-a", sha(b"alpha"), 5));
    assert_eq!(per_file, PER_FILE);
    assert!(!dispatch_written(&s), "no intent before the read-back");
    let op = s.answer("download", downloaded(b"alpha"));
    assert!(matches!(op, WorkerOp::Download { store: None, .. }));
    assert!(dispatch_written(&s));
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    s.answer("exec", exited(3, ""));
    // The exit is stored (`collecting`), the slot still held; the machine
    // is re-observed as its recorded incarnation before the download.
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Collecting);
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(3));
    assert_eq!(s.machine().active_execution.as_ref(), Some(&key));
    s.answer("inspect", running());
    let finishes = s.count("finish_command");
    let op = s.answer("download", downloaded(b"xx"));
    let WorkerOp::Download {
        store: Some((k, dest)),
        max_bytes,
        name,
        ..
    } = op
    else {
        unreachable!()
    };
    assert_eq!((k, dest.as_str(), max_bytes), (key.clone(), "out-x", 64));
    assert_eq!(name.as_str(), mname());
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.artifacts.len(), 1);
    assert_eq!(rec.artifacts[0].sha256, sha(b"xx"));
    // The slot finish and the cleanup: one commit, after the collection.
    assert_eq!(s.count("finish_command"), finishes + 1);
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.next_due_at_ms, None);
    assert!(s.machine().active_execution.is_none(), "slot released");
    assert_eq!(s.machine().state, MS::Running);
    assert!(s.worker.is_empty(), "{:?}", kinds(&s));
    assert_eq!(s.finished(&key).unwrap().exit_code(), Some(3));
    // The next command runs.
    s.submit_to_slot("sf1b", &cmd()).unwrap();
    s.answer("exec", exited(0, ""));
    assert_eq!(s.record(&skey("sf1b")).state, ExecState::Completed);
}

/// Outputs only: nothing to stage, so the submission commits its intent
/// at once (issue 16) and the collection follows the exit.
#[test]
fn outputs_without_inputs_keep_the_intent_at_submission() {
    let files = CommandFiles {
        inputs: Vec::new(),
        outputs: vec![output("/workspace/out/x", "out-x", 64)],
    };
    let (mut s, key) = submitted("sf2", &files);
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    assert_eq!(kinds(&s), ["exec"]);
    s.answer("exec", exited(0, ""));
    s.answer("inspect", running());
    s.answer("download", downloaded(b"x"));
    assert_eq!(s.record(&key).state, ExecState::Completed);
    assert!(s.machine().active_execution.is_none());
}

/// C6.4, C14.3: an output over its maximum fails the collection; the
/// exit is kept; failed collection keeps the slot and marks the machine
/// `unknown` (the command's cleanup `failed`); the next submission is
/// refused.
#[test]
fn an_oversized_output_is_collection_failed_keeps_the_exit_and_the_slot() {
    let (mut s, key) = submitted("sf3", &one_in_one_out());
    stage(&mut s);
    s.answer("exec", exited(5, ""));
    s.answer("inspect", running());
    let over = Error::output_limit(
        Operation::Download,
        Evidence::NotDispatched,
        Reason::Unspecified,
    );
    s.answer("download", Err(over));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::CollectionFailed);
    assert_eq!(rec.collection, crate::managed::Collection::Failed);
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(5));
    assert_eq!(rec.evidence, RecordEvidence::Exited);
    assert_eq!(rec.cleanup, Cleanup::Failed);
    assert_eq!(rec.next_due_at_ms, None);
    assert_eq!(s.machine().active_execution.as_ref(), Some(&key));
    assert_eq!(s.machine().state, MS::Unknown);
    let f = s.finished(&key).unwrap();
    assert_eq!(f.exit_code(), Some(5));
    let e = s.submit_to_slot("sf3b", &cmd()).unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
}

/// C6.4: before each download the retained machine must show its
/// recorded incarnation running; another incarnation (the machine was
/// replaced under the same name) fails the collection with nothing read.
#[test]
fn another_incarnation_before_a_download_fails_the_collection_unread() {
    let (mut s, key) = submitted("sf4", &one_in_one_out());
    stage(&mut s);
    s.answer("exec", exited(0, ""));
    s.answer("inspect", seen(MachineState::Running, 1_700_000_999));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::CollectionFailed);
    assert_eq!(
        rec.last_error.unwrap().reason,
        Reason::MachineNotRunning.as_str()
    );
    assert!(
        s.store_log.iter().all(|op| op.name() != "download")
            && s.worker.iter().all(|(_, op)| op.name() != "download"),
        "{:?}",
        kinds(&s)
    );
    assert_eq!(s.machine().active_execution.as_ref(), Some(&key));
}

/// A read-back that differs fails the preparation `not_dispatched`: no
/// exec; interrupted preparation keeps the slot (C14.3).
#[test]
fn a_staged_input_that_reads_back_differently_fails_unsent_and_keeps_the_slot() {
    let (mut s, key) = submitted("sf5", &one_in_one_out());
    s.answer("upload", uploaded(5));
    s.answer("download", downloaded(b"alphA"));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(
        rec.last_error.unwrap().reason,
        Reason::StagedInputMismatch.as_str()
    );
    assert!(s.worker.is_empty(), "no exec: {:?}", kinds(&s));
    assert_eq!(s.machine().active_execution.as_ref(), Some(&key));
    assert_eq!(s.machine().state, MS::Unknown);
    assert!(!s.finished(&key).unwrap().dispatched);
}

/// Sim finding 10's rule in the slot: a crash mid-staging (an upload out,
/// its outcome unknown) is failed by the controller that finds it,
/// `staging_uncertain`, with no upload resent and no exec; the slot is
/// kept (interrupted preparation, C14.3).
#[test]
fn a_crash_mid_staging_fails_without_another_upload_and_keeps_the_slot() {
    let (mut s, key) = submitted("sf6", &one_in_one_out());
    assert_eq!(kinds(&s), ["upload"]);
    let t = restart(&mut s, "ctl-test-2", 2_500);
    assert!(t.worker.is_empty(), "resent: {:?}", kinds(&t));
    let rec = t.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(
        rec.last_error.unwrap().reason,
        Reason::StagingUncertain.as_str()
    );
    assert_eq!(rec.cleanup, Cleanup::Failed);
    assert_eq!(t.machine().active_execution.as_ref(), Some(&key));
    assert_eq!(t.machine().state, MS::Unknown);
}

/// C17.1: a `collecting` command on a retained machine found after a
/// crash is collected again from its first output (reads and immutable
/// puts) by the controller that finds it, never executed again; then its
/// slot is finished.
#[test]
fn a_crash_mid_collection_is_collected_again_without_a_second_exec() {
    let (mut s, key) = submitted("sf7", &one_in_one_out());
    stage(&mut s);
    s.answer("exec", exited(9, ""));
    s.answer("inspect", running());
    assert_eq!(kinds(&s), ["download"]);
    let mut t = restart(&mut s, "ctl-test-2", 2_500);
    assert_eq!(kinds(&t), ["inspect"], "{:#?}", t.store_log);
    t.answer("inspect", running());
    t.answer("download", downloaded(b"x"));
    let rec = t.record(&key).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(9));
    assert_eq!(rec.artifacts.len(), 1);
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert!(t.machine().active_execution.is_none(), "slot released");
    assert!(t.worker.is_empty(), "{:?}", kinds(&t));
    assert_eq!(t.count("exec"), 0);
}

/// Refused before anything is stored: files without an artifact store
/// (`unsupported_capability`), a broken file rule (the disposable rules:
/// output maximum per-file accepted, per-file + 1 refused; outputs on a
/// background command).
#[test]
fn slot_files_it_cannot_transfer_are_refused_before_anything_is_stored() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    let e = s
        .submit_files_to_slot("sf8", &cmd(), &one_in_one_out())
        .unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
    assert_eq!(e.reason(), Reason::FileTransfer);
    let mut s = Sim::new(files_config());
    s.running_machine();
    let out = |max| CommandFiles {
        inputs: Vec::new(),
        outputs: vec![output("/workspace/o", "o", max)],
    };
    let e = s
        .submit_files_to_slot("sf9", &cmd(), &out(PER_FILE + 1))
        .unwrap_err();
    assert_eq!(e.reason(), Reason::OutputMaxRange);
    let bg = Command::new(["sh", "-c", "sleep 9"]).background(true);
    let e = s.submit_files_to_slot("sf10", &bg, &out(1)).unwrap_err();
    assert_eq!(e.reason(), Reason::BackgroundOutputs);
    let outside = CommandFiles {
        inputs: vec![input("/etc/x", "a", b"")],
        outputs: Vec::new(),
    };
    let e = s
        .submit_files_to_slot("sf11", &cmd(), &outside)
        .unwrap_err();
    assert_eq!(e.reason(), Reason::PathOutsideUploadRoots);
    assert!(s.store.records.is_empty(), "nothing stored");
    assert!(s.machine().active_execution.is_none());
    s.submit_files_to_slot("sf12", &cmd(), &out(PER_FILE))
        .unwrap();
    assert_eq!(s.record(&skey("sf12")).state, ExecState::Dispatching);
}

/// The files are part of the command's identity: the same files join,
/// other files under the same key conflict.
#[test]
fn the_same_files_join_and_other_files_conflict() {
    let (mut s, key) = submitted("sf13", &one_in_one_out());
    let a = s.submit_files_to_slot("sf13", &cmd(), &one_in_one_out());
    assert!(
        matches!(a, Ok(MachineAnswer::Submitted { existing: true, .. })),
        "{a:?}"
    );
    let other = CommandFiles {
        outputs: vec![output("/workspace/out/x", "out-x", 65)],
        ..one_in_one_out()
    };
    let e = s.submit_files_to_slot("sf13", &cmd(), &other).unwrap_err();
    assert_eq!(e.category(), Category::IdentityConflict);
    assert_eq!(kinds(&s), ["upload"], "one staging");
    assert_eq!(s.record(&key).state, ExecState::Preparing);
}

/// C14.3: a cancel during staging stops it before the next transfer (the
/// upload out is answered, nothing more is sent, no exec); `cancelled`
/// with inputs keeps the slot (some may be staged), the machine `unknown`.
#[test]
fn a_cancel_during_staging_sends_nothing_more_and_keeps_the_slot() {
    let files = CommandFiles {
        inputs: vec![
            input("/workspace/a.txt", "in-a", b"alpha"),
            input("/workspace/b.txt", "in-b", b"bravo!"),
        ],
        outputs: Vec::new(),
    };
    let (mut s, key) = submitted("sf14", &files);
    assert_eq!(kinds(&s), ["upload"]);
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.settle();
    s.answer("upload", uploaded(5));
    assert!(s.worker.is_empty(), "nothing more: {:?}", kinds(&s));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Cancelled);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(rec.cleanup, Cleanup::Failed);
    assert_eq!(s.machine().active_execution.as_ref(), Some(&key));
    assert_eq!(s.machine().state, MS::Unknown);
}
