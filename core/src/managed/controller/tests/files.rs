//! Declared files (C6.4, C12.4, C13): inputs staged and read back before
//! the dispatch intent, outputs collected after the result is stored,
//! background launches on a retained machine (C5.4).

use super::*;
use crate::exec::Launched;
use crate::managed::CommandFiles;
use crate::managed::fingerprint;
use crate::managed::spec::{InputFile, OutputFile};

const PER_FILE: u64 = 1_048_576;

fn sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    fingerprint::hex(&sha2::Sha256::digest(bytes))
}

fn files_config() -> ControllerConfig {
    let mut c = disposable_config();
    c.artifacts = true;
    c
}

fn input(path: &str, source: &str, bytes: &[u8]) -> InputFile {
    InputFile {
        path: path.to_owned(),
        source: source.to_owned(),
        sha256: sha(bytes),
        size: bytes.len() as u64,
    }
}

fn output(path: &str, destination: &str, max: u64) -> OutputFile {
    OutputFile {
        path: path.to_owned(),
        destination: destination.to_owned(),
        max_size: max,
    }
}

fn disposable_spec(inputs: Vec<InputFile>, outputs: Vec<OutputFile>) -> ExecutionSpec {
    let mut spec = spec_for(&cmd(), &RunTarget::unverified(), WORKER, "x").unwrap();
    spec.worker_machine = None;
    spec.inputs = inputs;
    spec.outputs = outputs;
    spec
}

fn two_in_two_out() -> ExecutionSpec {
    disposable_spec(
        vec![
            input("/workspace/a.txt", "in-a", b"alpha"),
            input("/workspace/b.txt", "in-b", b"bravo!"),
        ],
        vec![
            output("/workspace/out/x", "out-x", 64),
            output("/workspace/out/y", "out-y", 64),
        ],
    )
}

fn downloaded(bytes: &[u8]) -> WorkerResult {
    Ok(WorkerReply::Downloaded {
        size: bytes.len() as u64,
        sha256: sha(bytes),
    })
}

fn uploaded(n: usize) -> WorkerResult {
    Ok(WorkerReply::Uploaded { size: n as u64 })
}

impl Sim {
    fn submit_spec(&mut self, id: &str, spec: ExecutionSpec) -> Result<RecordKey, Error> {
        let key = RecordKey::new("s", id).unwrap();
        self.ctl.submit(
            self.now,
            self.now_ms,
            Submit {
                key: key.clone(),
                spec,
            },
        )?;
        self.settle();
        Ok(key)
    }

    fn running(&self, name: &str) -> WorkerResult {
        Ok(WorkerReply::Machine(observation(
            name,
            MachineState::Running,
            1_700_000_000,
        )))
    }

    /// Stages both inputs of [`two_in_two_out`].
    fn stage_both(&mut self) {
        let op = self.answer("upload", uploaded(5));
        let WorkerOp::Upload {
            path,
            source,
            sha256,
            size,
            scope,
            ..
        } = op
        else {
            unreachable!()
        };
        assert_eq!(path.as_str(), "/workspace/a.txt");
        assert_eq!((source.as_str(), scope.as_str()), ("in-a", "s"));
        assert_eq!((sha256, size), (sha(b"alpha"), 5));
        let op = self.answer("download", downloaded(b"alpha"));
        assert!(
            matches!(
                op,
                WorkerOp::Download {
                    store: None,
                    max_bytes: 5,
                    ..
                }
            ),
            "a read-back, stored nowhere: {op:?}"
        );
        self.answer("upload", uploaded(6));
        self.answer("download", downloaded(b"bravo!"));
    }

    fn count(&self, name: &str) -> usize {
        self.store_log.iter().filter(|op| op.name() == name).count()
    }
}

fn dispatch_written(s: &Sim) -> bool {
    s.store_log.iter().any(|op| {
        matches!(op, StoreOp::Write { patch, .. } if patch.state == Some(ExecState::Dispatching))
    })
}

#[test]
fn inputs_are_staged_and_verified_before_the_intent_and_outputs_collected_after_the_result() {
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f1", two_in_two_out()).unwrap();
    let name = s.started(&key);
    // Staging comes before `ready` and before the intent.
    assert_eq!(s.record(&key).state, ExecState::Preparing);
    let op = s.answer("upload", uploaded(5));
    assert!(!dispatch_written(&s));
    assert!(matches!(
        op,
        WorkerOp::Upload {
            per_file: PER_FILE,
            ..
        }
    ));
    s.answer("download", downloaded(b"alpha"));
    s.answer("upload", uploaded(6));
    assert_eq!(s.record(&key).state, ExecState::Preparing);
    s.answer("download", downloaded(b"bravo!"));
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    s.answer("exec", exited(0, "done"));
    // The result is stored first, then each output: observe, download.
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Collecting);
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(0));
    assert!(rec.deadlines.collection_ms.is_some());
    s.answer("inspect", s.running(&name));
    let op = s.answer("download", downloaded(b"xx"));
    let WorkerOp::Download {
        store: Some((k, dest)),
        max_bytes,
        ..
    } = op
    else {
        unreachable!()
    };
    assert_eq!((k, dest.as_str(), max_bytes), (key.clone(), "out-x", 64));
    assert_eq!(s.record(&key).state, ExecState::Collecting);
    s.answer("inspect", s.running(&name));
    s.answer("download", downloaded(b"yyyy"));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.collection, crate::managed::Collection::Complete);
    assert_eq!(rec.artifacts.len(), 2);
    assert_eq!(rec.artifacts[0].path, "/workspace/out/x");
    assert_eq!(rec.artifacts[0].destination, "out-x");
    assert_eq!(rec.artifacts[0].size, 2);
    assert_eq!(rec.artifacts[0].sha256, sha(b"xx"));
    assert_eq!(rec.artifacts[1].size, 4);
    // Then the disposable cleanup as always: verify, delete, 404, release.
    s.answer("inspect", s.running(&name));
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    let rec = s.record(&key).clone();
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.reservation, None);
    assert!(s.worker.is_empty());
    assert_eq!(s.finished(&key).unwrap().exit_code(), Some(0));
}

#[test]
fn an_uncertain_upload_fails_the_preparation_is_never_resent_and_the_machine_is_deleted() {
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f2", two_in_two_out()).unwrap();
    let name = s.started(&key);
    let lost = Error::transport(
        Operation::Upload,
        Evidence::DispatchUncertain,
        Reason::Unspecified,
    );
    s.answer("upload", Err(lost));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(rec.last_error.as_ref().unwrap().operation, "upload");
    // Straight to the cleanup: no second upload, no exec.
    s.answer("inspect", s.running(&name));
    s.answer("delete", Ok(WorkerReply::Deleted));
    s.answer("inspect", Err(not_found()));
    s.advance(2_000);
    assert!(s.worker.is_empty(), "{:?}", s.worker);
    assert!(!dispatch_written(&s));
    assert_eq!(s.record(&key).reservation, None);
    let e = s.finished(&key).unwrap().error.unwrap();
    assert_eq!(e.operation(), Operation::Upload);
}

#[test]
fn a_read_back_that_differs_fails_with_staged_input_mismatch() {
    for (size, bytes) in [(5, &b"alphA"[..]), (4, &b"alph"[..])] {
        let mut s = Sim::new(files_config());
        let key = s.submit_spec("f3", two_in_two_out()).unwrap();
        s.started(&key);
        s.answer("upload", uploaded(5));
        s.answer(
            "download",
            Ok(WorkerReply::Downloaded {
                size,
                sha256: sha(bytes),
            }),
        );
        let rec = s.record(&key).clone();
        assert_eq!(rec.state, ExecState::Failed);
        assert_eq!(
            rec.last_error.unwrap().reason,
            Reason::StagedInputMismatch.as_str()
        );
        assert!(!dispatch_written(&s));
        // The next op is the cleanup's inspect, never another transfer.
        assert_eq!(s.worker[0].1.name(), "inspect");
    }
    // An upload reply of another size is the same failure.
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f3b", two_in_two_out()).unwrap();
    s.started(&key);
    s.answer("upload", uploaded(4));
    assert_eq!(s.record(&key).state, ExecState::Failed);
}

#[test]
fn a_failed_download_is_collection_failed_with_the_exit_and_what_was_stored() {
    // The second output fails: `partial`, one artifact, exit kept.
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f4", two_in_two_out()).unwrap();
    let name = s.started(&key);
    s.stage_both();
    s.answer("exec", exited(3, ""));
    s.answer("inspect", s.running(&name));
    s.answer("download", downloaded(b"x"));
    s.answer("inspect", s.running(&name));
    let outage = Error::store(
        Operation::Download,
        Evidence::NotDispatched,
        Reason::Unavailable,
    );
    s.answer("download", Err(outage));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::CollectionFailed);
    assert_eq!(rec.collection, crate::managed::Collection::Partial);
    assert_eq!(rec.artifacts.len(), 1);
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(3));
    assert_eq!(rec.evidence, RecordEvidence::Exited);
    // Cleanup continues independently (C17.2).
    assert_eq!(s.worker[0].1.name(), "inspect");
    // The first output fails: `failed`, no artifact.
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f5", two_in_two_out()).unwrap();
    let name = s.started(&key);
    s.stage_both();
    s.answer("exec", exited(0, ""));
    s.answer("inspect", s.running(&name));
    let over = Error::output_limit(
        Operation::Download,
        Evidence::DispatchUncertain,
        Reason::Unspecified,
    );
    s.answer("download", Err(over));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::CollectionFailed);
    assert_eq!(rec.collection, crate::managed::Collection::Failed);
    assert!(rec.artifacts.is_empty());
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(0));
}

#[test]
fn a_machine_not_running_before_a_download_fails_the_collection_unsent() {
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f6", two_in_two_out()).unwrap();
    let name = s.started(&key);
    s.stage_both();
    s.answer("exec", exited(0, ""));
    s.answer(
        "inspect",
        Ok(WorkerReply::Machine(observation(
            &name,
            MachineState::Stopped,
            1_700_000_000,
        ))),
    );
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::CollectionFailed);
    assert_eq!(
        rec.last_error.unwrap().reason,
        Reason::MachineNotRunning.as_str()
    );
    assert!(
        !s.store_log.is_empty() && s.worker.iter().all(|(_, op)| op.name() != "download"),
        "no download from a machine not seen running"
    );
}

/// A store failure at each new step is retried from what this process
/// holds: it never re-sends a transfer and never reads as absence.
#[test]
fn store_failures_at_the_new_steps_are_retried_without_a_second_transfer() {
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f7", two_in_two_out()).unwrap();
    let name = s.started(&key);
    s.answer("upload", uploaded(5));
    s.answer("download", downloaded(b"alpha"));
    s.answer("upload", uploaded(6));
    // The `ready` write after the last read-back fails once.
    s.store.fail_next = 1;
    s.answer("download", downloaded(b"bravo!"));
    assert_eq!(s.record(&key).state, ExecState::Preparing);
    assert!(
        s.worker.is_empty(),
        "nothing resent while the store is down"
    );
    s.advance(200);
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    // The result (`collecting`) write fails once.
    s.store.fail_next = 1;
    s.answer("exec", exited(0, ""));
    s.advance(200);
    assert_eq!(s.record(&key).state, ExecState::Collecting);
    s.answer("inspect", s.running(&name));
    s.answer("download", downloaded(b"x"));
    s.answer("inspect", s.running(&name));
    // The completion write fails once: retried with the same artifacts.
    s.store.fail_next = 1;
    s.answer("download", downloaded(b"y"));
    assert_eq!(s.record(&key).state, ExecState::Collecting);
    s.advance(200);
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.artifacts.len(), 2);
    let ops: Vec<&str> = s.worker.iter().map(|(_, op)| op.name()).collect();
    assert_eq!(ops, ["inspect"], "only the cleanup's verify is out");
    assert_eq!(s.count("accept"), 1);
}

/// A new controller `owner` (files configuration) on `s`'s store, `ms`
/// later: what a crash of `s` leaves to the next one.
fn restart(s: &mut Sim, owner: &str, ms: u64) -> Sim {
    let mut cfg = files_config();
    cfg.owner = owner.into();
    let mut t = Sim::new(cfg);
    t.store = std::mem::take(&mut s.store);
    t.now_ms = s.now_ms;
    t.advance(ms);
    t
}

/// Crash after `collecting` was stored (the exit is durable, nothing
/// collected): the rebuilt controller's due scan finishes collection and
/// never sends the exec again.
#[test]
fn a_crash_after_collecting_is_stored_finishes_collection_without_a_second_exec() {
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f8", two_in_two_out()).unwrap();
    let name = s.started(&key);
    s.stage_both();
    s.answer("exec", exited(7, ""));
    assert_eq!(s.record(&key).state, ExecState::Collecting);
    // One output was downloaded before the crash: collected again.
    s.answer("inspect", s.running(&name));
    s.answer("download", downloaded(b"x"));
    let mut t = restart(&mut s, "ctl-test-2", 2_500);
    let kinds: Vec<&str> = t.worker.iter().map(|(_, op)| op.name()).collect();
    assert_eq!(kinds, ["inspect"], "{:#?}", t.store_log);
    t.answer("inspect", t.running(&name));
    t.answer("download", downloaded(b"x"));
    t.answer("inspect", t.running(&name));
    t.answer("download", downloaded(b"y"));
    let rec = t.record(&key).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(7));
    assert_eq!(rec.artifacts.len(), 2);
    assert!(
        t.worker.iter().all(|(_, op)| op.name() != "exec"),
        "never a second exec"
    );
}

/// Crash after `ready` (every input staged and verified): the rebuilt
/// controller dispatches once and stages nothing again.
#[test]
fn a_crash_after_ready_dispatches_once_without_restaging() {
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f9", two_in_two_out()).unwrap();
    s.started(&key);
    s.answer("upload", uploaded(5));
    s.answer("download", downloaded(b"alpha"));
    s.answer("upload", uploaded(6));
    // Store only the `ready` write of the last read-back's answer.
    let (id, _) = s.worker.remove(0);
    s.ctl
        .handle_worker(s.now, s.now_ms, id, downloaded(b"bravo!"));
    while s.record(&key).state != ExecState::Ready {
        let (id, op) = s.ctl.poll_store_op().unwrap();
        let r = s.store.apply(&op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    let t = restart(&mut s, "ctl-test-2", 2_500);
    let kinds: Vec<&str> = t.worker.iter().map(|(_, op)| op.name()).collect();
    assert_eq!(kinds, ["exec"], "{:#?}", t.store_log);
    assert_eq!(t.record(&key).state, ExecState::Dispatching);
}

/// Crash mid-staging (`preparing` with creation evidence): the start and
/// uploads may have been sent; the rebuilt controller never sends them
/// again: `failed`, then the machine is deleted.
#[test]
fn a_crash_mid_staging_fails_and_deletes_without_another_upload() {
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f10", two_in_two_out()).unwrap();
    s.started(&key);
    s.answer("upload", uploaded(5));
    let t = restart(&mut s, "ctl-test-2", 2_500);
    let rec = t.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    let kinds: Vec<&str> = t.worker.iter().map(|(_, op)| op.name()).collect();
    assert_eq!(kinds, ["inspect"], "the cleanup's verify only");
}

/// Sim finding 10: a caller's machine, crash mid-staging (`preparing`,
/// the first upload sent and unanswered: it may have landed). The rebuilt
/// controller did not write `preparing`, so it never stages: no upload is
/// resent while the first one's outcome is unknown (C6.1); the record
/// fails `not_dispatched` with `staging_uncertain` and nothing runs. The
/// crashed controller's process is gone; a paused one that comes back
/// with its upload's answer sends nothing more either.
#[test]
fn a_callers_machine_resumed_mid_staging_fails_without_another_upload() {
    let mut s = Sim::new(files_config());
    let mut spec = two_in_two_out();
    spec.worker_machine = Some(crate::managed::spec::WorkerMachine {
        worker_id: WORKER.into(),
        name: "m1".into(),
    });
    let key = s.submit_spec("f13", spec).unwrap();
    assert_eq!(s.record(&key).state, ExecState::Preparing);
    let kinds = |s: &Sim| -> Vec<&str> { s.worker.iter().map(|(_, op)| op.name()).collect() };
    assert_eq!(kinds(&s), ["upload"]);
    let mut t = restart(&mut s, "ctl-test-2", 2_500);
    assert!(t.worker.is_empty(), "resent: {:?}", kinds(&t));
    let rec = t.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert_eq!(
        rec.last_error.as_ref().unwrap().reason,
        Reason::StagingUncertain.as_str()
    );
    let f = t.finished(&key).unwrap();
    assert_eq!(f.error.as_ref().unwrap().reason(), Reason::StagingUncertain);
    assert!(!f.dispatched);
    // The first controller was only paused: its upload is answered now.
    let gap = t.now_ms - s.now_ms;
    s.store = std::mem::take(&mut t.store);
    s.now += Duration::from_millis(gap);
    s.now_ms += gap;
    s.answer("upload", uploaded(5));
    s.advance(3_000);
    assert!(
        s.worker
            .iter()
            .all(|(_, op)| !matches!(op, WorkerOp::Upload { .. } | WorkerOp::Exec { .. })),
        "{:?}",
        kinds(&s)
    );
    assert_eq!(s.record(&key).state, ExecState::Failed);
}

/// The same resumed record without inputs has nothing uncertain: it is
/// prepared and dispatched once by the controller that finds it.
#[test]
fn a_callers_machine_resumed_in_preparing_without_inputs_runs_once() {
    let mut s = Sim::new(files_config());
    let key = foreign(&mut s, "f14", &[ExecState::Preparing], T0 - 5_000);
    s.settle();
    let kinds: Vec<&str> = s.worker.iter().map(|(_, op)| op.name()).collect();
    assert_eq!(kinds, ["exec"]);
    s.answer("exec", exited(0, ""));
    assert_eq!(s.record(&key).state, ExecState::Completed);
}

#[test]
fn the_collection_deadline_ends_collection_with_the_exit_kept() {
    let mut s = Sim::new(files_config());
    let key = s.submit_spec("f11", two_in_two_out()).unwrap();
    let name = s.started(&key);
    s.stage_both();
    s.answer("exec", exited(0, ""));
    s.answer("inspect", s.running(&name));
    s.answer("download", downloaded(b"x"));
    // The deadline passes (monotonic) while the next inspect is out; the
    // wall clock stands still.
    let deadline = s.record(&key).deadlines.collection_ms.unwrap();
    let ms = deadline - s.now_ms + 1;
    s.now += Duration::from_millis(ms);
    s.answer("inspect", s.running(&name));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::CollectionFailed);
    assert_eq!(rec.collection, crate::managed::Collection::Partial);
    assert_eq!(
        rec.last_error.unwrap().reason,
        Reason::CollectionDeadline.as_str()
    );
}

/// A caller's machine stages its inputs in `preparing` too (no machine to
/// re-observe before a download); its submission is never accepted with
/// the intent (something must be staged first).
#[test]
fn a_callers_machine_stages_and_collects_through_the_same_steps() {
    let mut s = Sim::new(files_config());
    let mut spec = two_in_two_out();
    spec.worker_machine = Some(crate::managed::spec::WorkerMachine {
        worker_id: WORKER.into(),
        name: "m1".into(),
    });
    let key = s.submit_spec("f12", spec).unwrap();
    assert_eq!(s.count("accept_dispatching"), 0);
    s.stage_both();
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    s.answer("exec", exited(0, ""));
    s.answer("download", downloaded(b"x"));
    let op = s.answer("download", downloaded(b"y"));
    let WorkerOp::Download { name, .. } = op else {
        unreachable!()
    };
    assert_eq!(name.as_str(), "m1");
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.cleanup, Cleanup::Complete);
}

/// Sim finding 3 (seeds 348, 385), with outputs: a late exit after
/// `unknown` (which clears `next_due_at_ms`) writes `collecting`; a
/// controller that crashes right after must leave the record due, so the
/// next one finishes the collection (and never sends the exec again).
#[test]
fn a_late_exit_after_unknown_left_collecting_by_a_crash_is_recovered() {
    let mut s = Sim::new(files_config());
    let mut spec = disposable_spec(Vec::new(), vec![output("/workspace/o", "out-o", 64)]);
    spec.worker_machine = Some(crate::managed::spec::WorkerMachine {
        worker_id: WORKER.into(),
        name: "m1".into(),
    });
    let key = s.submit_spec("late", spec).unwrap();
    s.settle();
    assert_eq!(s.record(&key).state, ExecState::Dispatching);
    assert_eq!(s.worker.len(), 1);
    s.ctl.cancel(s.now, s.now_ms, key.clone());
    s.settle();
    assert_eq!(s.record(&key).state, ExecState::Unknown);
    assert_eq!(s.record(&key).next_due_at_ms, None);
    // The late exit arrives; perform store ops only until `collecting` is
    // committed, then the controller "crashes".
    let (id, _) = s.worker.remove(0);
    s.ctl.handle_worker(s.now, s.now_ms, id, exited(3, ""));
    while s.record(&key).state != ExecState::Collecting {
        let (id, op) = s.ctl.poll_store_op().unwrap();
        let r = s.store.apply(&op);
        s.ctl.handle_stored(s.now, s.now_ms, id, r);
    }
    assert!(s.record(&key).next_due_at_ms.is_some(), "left due");
    let mut t = restart(&mut s, "ctl-test-2", 3_000);
    t.answer("download", downloaded(b"o"));
    let rec = t.record(&key);
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(3));
    assert!(
        t.worker.iter().all(|(_, op)| op.name() != "exec"),
        "never a second exec"
    );
}

fn refused(cfg: ControllerConfig, spec: ExecutionSpec) -> Option<Reason> {
    let mut s = Sim::new(cfg);
    match s.submit_spec("r", spec) {
        Ok(_) => {
            assert_eq!(s.store.records.len(), 1);
            None
        }
        Err(e) => {
            assert_eq!(e.evidence(), Evidence::NotDispatched);
            assert!(s.store.records.is_empty(), "nothing stored on refusal");
            Some(e.reason())
        }
    }
}

#[test]
fn file_bounds_are_checked_at_acceptance_at_n_and_n_plus_1() {
    let cfg = files_config;
    let empty = |path: &str, src: &str| input(path, src, b"");
    let many = |n: usize| {
        (0..n)
            .map(|i| empty(&format!("/workspace/i{i:02}"), &format!("s{i:02}")))
            .collect::<Vec<_>>()
    };
    // Count: 32 inputs accepted, 33 refused.
    assert_eq!(refused(cfg(), disposable_spec(many(32), vec![])), None);
    assert_eq!(
        refused(cfg(), disposable_spec(many(33), vec![])),
        Some(Reason::TooManyFiles)
    );
    let outs = |n: usize| {
        (0..n)
            .map(|i| output(&format!("/workspace/o{i:02}"), &format!("d{i:02}"), 1))
            .collect::<Vec<_>>()
    };
    assert_eq!(refused(cfg(), disposable_spec(vec![], outs(32))), None);
    assert_eq!(
        refused(cfg(), disposable_spec(vec![], outs(33))),
        Some(Reason::TooManyFiles)
    );
    // Size: per-file accepted, one byte more refused.
    let sized = |n: u64| InputFile {
        size: n,
        ..input("/workspace/a", "a", b"")
    };
    assert_eq!(
        refused(cfg(), disposable_spec(vec![sized(PER_FILE)], vec![])),
        None
    );
    assert_eq!(
        refused(cfg(), disposable_spec(vec![sized(PER_FILE + 1)], vec![])),
        Some(Reason::InputOverPerFile)
    );
    // Aggregate: four full files accepted, one byte more refused.
    let agg = |extra: bool| {
        (0..4)
            .map(|i| InputFile {
                size: PER_FILE,
                ..input(&format!("/workspace/g{i}"), &format!("g{i}"), b"")
            })
            .chain(extra.then(|| InputFile {
                size: 1,
                ..input("/workspace/g9", "g9", b"")
            }))
            .collect::<Vec<_>>()
    };
    assert_eq!(refused(cfg(), disposable_spec(agg(false), vec![])), None);
    assert_eq!(
        refused(cfg(), disposable_spec(agg(true), vec![])),
        Some(Reason::ManifestOverAggregate)
    );
    // Output maxima: 1 and per-file accepted; 0 and per-file + 1 refused.
    for (max, want) in [
        (1, None),
        (PER_FILE, None),
        (0, Some(Reason::OutputMaxRange)),
        (PER_FILE + 1, Some(Reason::OutputMaxRange)),
    ] {
        let spec = disposable_spec(vec![], vec![output("/workspace/o", "o", max)]);
        assert_eq!(refused(cfg(), spec), want, "max {max}");
    }
    let outs4 = |last: u64| {
        (0..5)
            .map(|i| {
                let m = match i {
                    0..=3 => PER_FILE,
                    _ => last,
                };
                output(&format!("/workspace/p{i}"), &format!("p{i}"), m)
            })
            .filter(|o| o.max_size > 0)
            .collect::<Vec<_>>()
    };
    assert_eq!(refused(cfg(), disposable_spec(vec![], outs4(0))), None);
    assert_eq!(
        refused(cfg(), disposable_spec(vec![], outs4(1))),
        Some(Reason::ManifestOverAggregate)
    );
}

#[test]
fn file_specs_it_cannot_transfer_are_refused_before_anything_is_stored() {
    let spec = two_in_two_out;
    // No artifact store.
    assert_eq!(
        refused(disposable_config(), spec()),
        Some(Reason::FileTransfer)
    );
    // A caller's machine on a worker without an admitted profile.
    let mut cfg = config();
    cfg.artifacts = true;
    let mut named = spec();
    named.worker_machine = Some(crate::managed::spec::WorkerMachine {
        worker_id: WORKER.into(),
        name: "m1".into(),
    });
    assert_eq!(refused(cfg, named), Some(Reason::FileTransfer));
    // Paths outside the roots, duplicate references, bad paths.
    let outside = disposable_spec(vec![input("/etc/x", "a", b"")], vec![]);
    assert_eq!(
        refused(files_config(), outside),
        Some(Reason::PathOutsideUploadRoots)
    );
    let out_outside = disposable_spec(vec![], vec![output("/tmp/x", "o", 1)]);
    assert_eq!(
        refused(files_config(), out_outside),
        Some(Reason::PathOutsideDownloadRoots)
    );
    let dup = disposable_spec(
        vec![
            input("/workspace/a", "same", b""),
            input("/workspace/b", "same", b""),
        ],
        vec![],
    );
    assert_eq!(
        refused(files_config(), dup),
        Some(Reason::FileReferenceDuplicate)
    );
    let dotted = disposable_spec(vec![input("/workspace/../etc", "a", b"")], vec![]);
    assert_eq!(
        refused(files_config(), dotted),
        Some(Reason::InvalidGuestPath)
    );
}

#[test]
fn background_is_refused_off_a_retained_machine_and_with_outputs() {
    let bg = Command::new(["sleep", "100"]).background(true);
    let mut spec = spec_for(&bg, &RunTarget::unverified(), WORKER, "x").unwrap();
    spec.worker_machine = None;
    assert_eq!(
        refused(files_config(), spec.clone()),
        Some(Reason::Background)
    );
    spec.outputs = vec![output("/workspace/o", "o", 1)];
    assert_eq!(
        refused(files_config(), spec),
        Some(Reason::BackgroundOutputs)
    );
    let named = spec_for(&bg, &RunTarget::unverified(), WORKER, "m1").unwrap();
    assert_eq!(refused(files_config(), named), Some(Reason::Background));
}

/// C5.4, C13.2, C14.3: a background command in a retained machine's slot
/// ends `launched` (launched evidence, a launch result, collection
/// complete), its slot is released and its machine keeps running; the PID
/// is never stored.
#[test]
fn a_background_command_in_a_retained_slot_is_launched_and_frees_the_slot() {
    let mut s = Sim::new(files_config());
    s.running_machine();
    let bg = Command::new(["sh", "-c", "sleep 100"]).background(true);
    // A launch needs a plain image machine: asked before its acceptance.
    let id = preinspect::submit_async(&mut s, "bg1", &bg, &CommandFiles::default());
    s.answer("inspect", preinspect::inspected(Some("alpine:3.19")));
    assert!(s.answer_of(id).is_ok());
    let k = RecordKey::new("s", "bg1").unwrap();
    assert_eq!(s.record(&k).state, ExecState::Dispatching);
    let op = s.answer(
        "exec",
        Ok(WorkerReply::Exec(ExecOutcome::Launched(Launched {
            pid: 4_242_424,
        }))),
    );
    let WorkerOp::Exec { command, .. } = op else {
        unreachable!()
    };
    assert!(command.is_background());
    let rec = s.record(&k).clone();
    assert_eq!(rec.state, ExecState::Launched);
    assert_eq!(rec.evidence, RecordEvidence::Launched);
    assert!(matches!(rec.result, Some(ExecResult::Launched { .. })));
    assert_eq!(rec.collection, crate::managed::Collection::Complete);
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert!(s.machine().active_execution.is_none(), "slot released");
    assert_eq!(
        s.machine().state,
        crate::managed::state::MachineRecordState::Running
    );
    assert!(
        !format!("{rec:?}").contains("4242424"),
        "the PID is never recorded"
    );
    // No stop, no delete: nothing more goes to the worker.
    s.advance(2_000);
    assert!(s.worker.is_empty(), "{:?}", s.worker);
    let f = s.finished(&k).unwrap();
    assert_eq!(f.exit_code(), None);
    // A foreground command's `pid=12` stdout is an exit, never a launch.
    s.submit_to_slot("fg1", &Command::new(["echo", "pid=12"]))
        .unwrap();
    s.answer("exec", exited(0, "pid=12\n"));
    let fg = s.record(&RecordKey::new("s", "fg1").unwrap()).clone();
    assert_eq!(fg.state, ExecState::Completed);
}

/// A launch reply to a foreground command breaks the contract: unknown.
#[test]
fn a_launch_reply_to_a_foreground_command_is_unknown() {
    let mut s = Sim::new(files_config());
    s.running_machine();
    s.submit_to_slot("fg2", &cmd()).unwrap();
    s.answer(
        "exec",
        Ok(WorkerReply::Exec(ExecOutcome::Launched(Launched {
            pid: 5,
        }))),
    );
    let rec = s.record(&RecordKey::new("s", "fg2").unwrap()).clone();
    assert_eq!(rec.state, ExecState::Unknown);
    assert!(rec.result.is_none());
}

mod preinspect;
mod slot;
mod unowned;
