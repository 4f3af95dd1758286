use super::*;
use crate::managed::claim::{self, Fence};
use crate::managed::patch::apply_exec;
use crate::managed::testkit;
use crate::{Category, Evidence};

/// A one-record fake store applying the real pure rules, with a switch
/// that fails the n-th operation.
struct FakeStore {
    record: Option<ExecutionRecord>,
    ops: Vec<&'static str>,
    fail_at: Option<usize>,
}

impl FakeStore {
    fn new() -> Self {
        Self {
            record: None,
            ops: Vec::new(),
            fail_at: None,
        }
    }

    fn apply(&mut self, op: StoreOp) -> Result<ExecutionRecord, Error> {
        let name = match &op {
            StoreOp::Accept { .. } => "accept",
            StoreOp::Claim { .. } => "claim",
            StoreOp::Write { patch, .. } => patch.state.map_or("write", ExecState::as_str),
        };
        self.ops.push(name);
        if self.fail_at == Some(self.ops.len()) {
            return Err(
                Error::new(Category::Store, Operation::StoreWrite, Evidence::Unknown)
                    .with_reason("unavailable"),
            );
        }
        let next = match op {
            StoreOp::Accept { record, .. } => match &self.record {
                Some(r) if r.fingerprint == record.fingerprint => r.clone(),
                Some(_) => return Err(Error::validation(Operation::StoreAccept, "conflict")),
                None => *record,
            },
            StoreOp::Claim {
                owner,
                now_ms,
                ttl_ms,
                ..
            } => claim::claim_exec(self.current(), &owner, now_ms, ttl_ms)?,
            StoreOp::Write {
                guard,
                patch,
                now_ms,
                ..
            } => {
                let rec = self.current();
                claim::check_guard(
                    Fence::of_exec(rec),
                    &guard,
                    None,
                    now_ms,
                    Operation::StoreWrite,
                )?;
                apply_exec(rec, &patch, now_ms)?
            }
        };
        self.record = Some(next.clone());
        Ok(next)
    }

    fn current(&self) -> &ExecutionRecord {
        self.record.as_ref().expect("a record")
    }
}

fn exited(code: i32) -> Result<ExecOutcome, Error> {
    Ok(ExecOutcome::Exited(ExecOutput {
        exit_code: code,
        stdout: b"hi\n".to_vec(),
        stderr: Vec::new(),
        encoding: crate::exec::OutputEncoding::Bytes,
    }))
}

fn uncertain() -> Result<ExecOutcome, Error> {
    Err(Error::new(
        Category::Transport,
        Operation::Exec,
        Evidence::DispatchUncertain,
    )
    .with_reason("connection_closed"))
}

fn new_run() -> Run {
    Run::new(
        testkit::key("s", "r1"),
        Command::new(["echo", "argv-SENTINEL"]),
        &RunTarget::unverified(),
        &testkit::fingerprint_key(),
        RunConfig::new("ctl-1"),
        1_000,
    )
    .unwrap()
}

/// Drives `run` against `store`; returns how many times it dispatched.
fn drive(
    run: &mut Run,
    store: &mut FakeStore,
    mut exec: impl FnMut() -> Result<ExecOutcome, Error>,
) -> usize {
    let mut dispatches = 0;
    let mut now = 1_000;
    loop {
        now += 1;
        if let Some(op) = run.poll_store_op() {
            let r = store.apply(op);
            run.handle_stored(now, r);
        } else if run.poll_dispatch().is_some() {
            dispatches += 1;
            run.handle_exec_result(now, exec());
        } else {
            break;
        }
    }
    dispatches
}

#[test]
fn a_run_persists_each_step_and_completes_with_the_exit() {
    let mut store = FakeStore::new();
    let mut run = new_run();
    assert_eq!(drive(&mut run, &mut store, || exited(7)), 1);
    assert_eq!(
        store.ops,
        [
            "accept",
            "claim",
            "preparing",
            "ready",
            "claim",
            "dispatching",
            "collecting",
            "completed"
        ]
    );
    let out = run.take_outcome().unwrap().unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    assert_eq!(out.record.evidence, RecordEvidence::Exited);
    assert_eq!(out.exit_code(), Some(7));
    assert!(out.dispatched);
    assert_eq!(out.output.unwrap().stdout, b"hi\n");
    assert_eq!(store.current(), &out.record);
}

#[test]
fn the_intent_is_durable_before_the_dispatch() {
    let mut store = FakeStore::new();
    let mut run = new_run();
    while let Some(op) = run.poll_store_op() {
        let r = store.apply(op);
        run.handle_stored(2_000, r);
    }
    assert!(run.poll_dispatch().is_some());
    assert_eq!(store.current().state, ExecState::Dispatching);
    assert_eq!(store.current().evidence, RecordEvidence::DispatchUncertain);
    assert!(run.poll_dispatch().is_none(), "one dispatch only");
}

#[test]
fn every_store_failure_is_an_error_with_the_right_evidence() {
    // Steps 1–6 are before the dispatch; 7 and 8 after the exit.
    for step in 1..=8 {
        let mut store = FakeStore::new();
        store.fail_at = Some(step);
        let mut run = new_run();
        let dispatches = drive(&mut run, &mut store, || exited(3));
        let err = run.take_outcome().unwrap().unwrap_err();
        assert_eq!(err.category(), Category::Store, "step {step}");
        assert_eq!(store.ops.len(), step, "nothing after the failure");
        if step <= 6 {
            assert_eq!(dispatches, 0, "no dispatch after failed step {step}");
            assert_eq!(err.evidence(), Evidence::NotDispatched, "step {step}");
        } else {
            assert_eq!(dispatches, 1);
            assert_eq!(err.evidence(), Evidence::Exited, "step {step}");
            assert_eq!(err.exit_code(), Some(3));
        }
    }
}

#[test]
fn a_store_failure_after_an_uncertain_exec_keeps_the_uncertainty() {
    let mut store = FakeStore::new();
    store.fail_at = Some(7);
    let mut run = new_run();
    assert_eq!(drive(&mut run, &mut store, uncertain), 1);
    let err = run.take_outcome().unwrap().unwrap_err();
    assert_eq!(err.category(), Category::Store);
    assert_eq!(err.evidence(), Evidence::DispatchUncertain);
    assert_eq!(store.current().state, ExecState::Dispatching);
}

#[test]
fn an_uncertain_exec_records_unknown_and_is_never_retried() {
    let mut store = FakeStore::new();
    let mut run = new_run();
    assert_eq!(drive(&mut run, &mut store, uncertain), 1);
    let out = run.take_outcome().unwrap().unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert_eq!(out.record.evidence, RecordEvidence::DispatchUncertain);
    assert_eq!(out.record.result, None, "no fabricated exit");
    assert_eq!(out.exit_code(), None);
    assert_eq!(
        out.record.last_error.as_ref().unwrap().evidence,
        "dispatch_uncertain"
    );
    assert_eq!(out.error.unwrap().evidence(), Evidence::DispatchUncertain);

    // Running the same command under the same key again never re-sends.
    let mut again = new_run();
    assert_eq!(drive(&mut again, &mut store, || exited(0)), 0);
    let out = again.take_outcome().unwrap().unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert!(!out.dispatched);
}

#[test]
fn an_output_overflow_with_an_exit_records_the_exit_truncated() {
    let mut store = FakeStore::new();
    let mut run = new_run();
    let over = || {
        Err(
            Error::new(Category::OutputLimit, Operation::Exec, Evidence::Exited)
                .with_exit_code(4)
                .with_reason("output_limit"),
        )
    };
    assert_eq!(drive(&mut run, &mut store, over), 1);
    let out = run.take_outcome().unwrap().unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    assert_eq!(
        out.record.result,
        Some(ExecResult::Exited {
            exit_code: 4,
            output_bytes: 0,
            truncated: true
        })
    );
}

#[test]
fn an_invalid_command_fails_before_dispatch() {
    let mut store = FakeStore::new();
    let mut run = Run::new(
        testkit::key("s", "r1"),
        Command::new(["echo"]).background(true),
        &RunTarget::unverified(),
        &testkit::fingerprint_key(),
        RunConfig::new("ctl-1"),
        1_000,
    )
    .unwrap();
    assert_eq!(drive(&mut run, &mut store, || exited(0)), 0);
    let out = run.take_outcome().unwrap().unwrap();
    assert_eq!(out.record.state, ExecState::Failed);
    assert_eq!(out.record.evidence, RecordEvidence::NotDispatched);
    assert_eq!(out.error.unwrap().evidence(), Evidence::NotDispatched);
}

/// Runs a fresh record up to (and including) the `dispatching` intent,
/// then "crashes".
fn crash_after_intent(store: &mut FakeStore) {
    let mut run = new_run();
    while let Some(op) = run.poll_store_op() {
        let r = store.apply(op);
        run.handle_stored(2_000, r);
    }
    assert!(run.poll_dispatch().is_some());
    assert_eq!(store.current().state, ExecState::Dispatching);
}

#[test]
fn recovery_of_a_dispatching_record_gives_unknown_without_a_dispatch() {
    let mut store = FakeStore::new();
    crash_after_intent(&mut store);
    assert!(matches!(recover(store.current()), Recovery::MarkUnknown(_)));
    // The crashed controller's claim is still live: another owner waits
    // for it to expire (a live claim is stale_claim, never ignored).
    let mut run = Run::resume(store.current().clone(), RunConfig::new("ctl-2"), 2_001);
    assert_eq!(drive(&mut run, &mut store, || exited(0)), 0);
    assert_eq!(
        run.take_outcome().unwrap().unwrap_err().category(),
        Category::StaleClaim
    );
    let later = 2_000 + DEFAULT_CLAIM_TTL_MS + 1;
    let mut run = Run::resume(store.current().clone(), RunConfig::new("ctl-2"), later);
    assert_eq!(drive(&mut run, &mut store, || exited(0)), 0);
    let out = run.take_outcome().unwrap().unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert_eq!(out.record.evidence, RecordEvidence::DispatchUncertain);
    assert_eq!(out.record.result, None);
}

#[test]
fn the_same_run_again_after_a_crash_never_resends() {
    let mut store = FakeStore::new();
    crash_after_intent(&mut store);
    // Same owner (its claim renews): the record is marked unknown, not sent.
    let mut run = new_run();
    assert_eq!(drive(&mut run, &mut store, || exited(0)), 0);
    let out = run.take_outcome().unwrap().unwrap();
    assert_eq!(out.record.state, ExecState::Unknown);
    assert!(!out.dispatched);
}

#[test]
fn a_ready_record_may_dispatch_once() {
    let mut store = FakeStore::new();
    let mut run = new_run();
    // Stop after `ready` was stored.
    while store.record.as_ref().map(|r| r.state) != Some(ExecState::Ready) {
        let op = run.poll_store_op().unwrap();
        let r = store.apply(op);
        run.handle_stored(2_000, r);
    }
    assert_eq!(recover(store.current()), Recovery::MayDispatch);
    // Resuming without the command does not dispatch.
    let mut resumed = Run::resume(store.current().clone(), RunConfig::new("ctl-1"), 2_001);
    assert_eq!(drive(&mut resumed, &mut store, || exited(0)), 0);
    assert_eq!(
        resumed.take_outcome().unwrap().unwrap().record.state,
        ExecState::Ready
    );
    // The same command under the same key dispatches it, once.
    let mut again = new_run();
    assert_eq!(drive(&mut again, &mut store, || exited(5)), 1);
    assert_eq!(again.take_outcome().unwrap().unwrap().exit_code(), Some(5));
}

#[test]
fn a_collecting_record_is_completed_on_recovery() {
    let mut store = FakeStore::new();
    store.fail_at = Some(8);
    let mut run = new_run();
    drive(&mut run, &mut store, || exited(9));
    assert_eq!(store.current().state, ExecState::Collecting);
    store.fail_at = None;
    let mut run = Run::resume(store.current().clone(), RunConfig::new("ctl-1"), 3_000);
    assert_eq!(drive(&mut run, &mut store, || exited(0)), 0);
    let out = run.take_outcome().unwrap().unwrap();
    assert_eq!(out.record.state, ExecState::Completed);
    assert_eq!(out.exit_code(), Some(9));
}

#[test]
fn inputs_after_the_outcome_are_ignored() {
    let mut store = FakeStore::new();
    let mut run = new_run();
    drive(&mut run, &mut store, || exited(0));
    let before = run.outcome().cloned();
    run.handle_exec_result(9_000, exited(1));
    run.handle_stored(9_000, Err(Error::validation(Operation::StoreWrite, "x")));
    assert!(run.poll_store_op().is_none());
    assert!(run.poll_dispatch().is_none());
    assert_eq!(run.outcome().cloned(), before);
}
