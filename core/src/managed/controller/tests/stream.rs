//! Streamed execs (issue 15 item 2): a caller that wants the output as it
//! comes gets a [`WorkerOp::ExecStream`]; its exit is recorded exactly like
//! a buffered one's, and no output is held or stored.

use super::*;

fn streamed(code: i32, bytes: u64) -> WorkerResult {
    Ok(WorkerReply::Streamed {
        exit_code: code,
        output_bytes: bytes,
    })
}

fn key(id: &str) -> RecordKey {
    RecordKey::new("s", id).unwrap()
}

#[test]
fn a_streamed_command_goes_out_as_a_stream_and_its_exit_is_recorded_like_a_buffered_one() {
    let mut s = Sim::new(config());
    s.settle();
    s.ctl.stream_output(key("st1"), true);
    let from = s.store_log.len();
    let k = s.submit("st1", &cmd());
    s.settle();
    assert_eq!(s.worker.len(), 1);
    let (_, op) = &s.worker[0];
    let WorkerOp::ExecStream {
        worker_id,
        machine,
        command,
        key: stream_key,
    } = op
    else {
        panic!("expected a streamed exec, got {op:?}");
    };
    assert_eq!((worker_id.as_str(), machine.as_str()), (WORKER, "m1"));
    assert_eq!(command.argv(), cmd().argv());
    assert_eq!(command.env_pairs(), cmd().env_pairs());
    assert_eq!(stream_key, &k);
    // The intent was durable before the op was handed out.
    assert_eq!(s.record(&k).state, ExecState::Dispatching);
    s.answer("exec_stream", streamed(4, 11));
    let rec = s.record(&k).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.evidence, RecordEvidence::Exited);
    assert_eq!(
        rec.result,
        Some(ExecResult::Exited {
            exit_code: 4,
            output_bytes: 11,
            truncated: false,
        })
    );
    let f = s.finished(&k).unwrap();
    assert!(f.output.is_none(), "a streamed output is never held");
    assert!(f.error.is_none() && f.dispatched);
    assert_eq!(f.exit_code(), Some(4));
    // Exactly the buffered command's commits.
    let writes: Vec<&str> = s.store_log[from..]
        .iter()
        .map(StoreOp::name)
        .filter(|n| !n.starts_with("fetch") && !n.starts_with("due"))
        .collect();
    assert_eq!(writes, ["accept_dispatching", "write_steps"]);
}

#[test]
fn without_a_stream_request_or_after_it_is_withdrawn_the_command_is_buffered() {
    let mut s = Sim::new(config());
    s.settle();
    s.submit("b1", &cmd());
    s.settle();
    assert_eq!(s.worker[0].1.name(), "exec");
    s.answer_exec(exited(0, "x"));
    s.ctl.stream_output(key("b2"), true);
    s.ctl.stream_output(key("b2"), false);
    s.submit("b2", &cmd());
    s.settle();
    assert_eq!(s.worker[0].1.name(), "exec");
}

#[test]
fn a_command_with_stdin_is_buffered_even_when_a_stream_is_asked_for() {
    let mut s = Sim::new(config());
    s.settle();
    s.ctl.stream_output(key("in1"), true);
    s.submit("in1", &cmd().stdin("data"));
    s.settle();
    assert_eq!(s.worker[0].1.name(), "exec", "C5.3: no stdin on a stream");
    s.answer_exec(exited(0, "data"));
    let f = s.finished(&key("in1")).unwrap();
    assert_eq!(f.output.as_ref().unwrap().stdout, b"data");
}

#[test]
fn a_stream_that_fails_after_sending_is_unknown_and_never_resent() {
    let mut s = Sim::new(config());
    s.settle();
    s.ctl.stream_output(key("u1"), true);
    let k = s.submit("u1", &cmd());
    s.settle();
    let lost = Error::transport(
        Operation::ExecStream,
        Evidence::DispatchUncertain,
        Reason::StreamEndedWithoutExit,
    );
    s.answer("exec_stream", Err(lost));
    assert_eq!(s.record(&k).state, ExecState::Unknown);
    let f = s.finished(&k).unwrap();
    assert_eq!(
        f.error.as_ref().map(Error::evidence),
        Some(Evidence::DispatchUncertain)
    );
    s.advance(5_000);
    assert!(s.worker.is_empty(), "never re-sent");
}

#[test]
fn a_stream_refused_before_sending_fails_not_dispatched() {
    let mut s = Sim::new(config());
    s.settle();
    s.ctl.stream_output(key("n1"), true);
    let k = s.submit("n1", &cmd());
    s.settle();
    let refused =
        Error::admission_exhausted(Operation::ExecStream, Reason::CallbackThreadsExhausted);
    s.answer("exec_stream", Err(refused));
    let rec = s.record(&k).clone();
    assert_eq!(
        (rec.state, rec.evidence),
        (ExecState::Failed, RecordEvidence::NotDispatched)
    );
}

#[test]
fn stream_requests_are_kept_up_to_the_limit_and_the_next_is_buffered() {
    let mut s = Sim::new(config());
    s.settle();
    for i in 0..MAX_STREAMS {
        s.ctl.stream_output(key(&format!("k{i}")), true);
    }
    // N kept: the last of them streams.
    let last = format!("k{}", MAX_STREAMS - 1);
    s.submit(&last, &cmd());
    s.settle();
    assert_eq!(s.worker.remove(0).1.name(), "exec_stream");
    // N+1 ignored: buffered.
    s.ctl.stream_output(key("over"), true);
    s.submit("over", &cmd());
    s.settle();
    assert_eq!(s.worker.remove(0).1.name(), "exec");
}

#[test]
fn a_command_in_a_retained_slot_streams_and_finishes_its_slot() {
    let mut s = Sim::new(disposable_config());
    s.running_machine();
    s.ctl.stream_output(key("sl1"), true);
    s.submit_to_slot("sl1", &cmd()).unwrap();
    let k = key("sl1");
    assert_eq!(s.record(&k).state, ExecState::Dispatching);
    let op = s.answer("exec_stream", streamed(0, 3));
    assert!(matches!(op, WorkerOp::ExecStream { key: ref sk, .. } if *sk == k));
    let rec = s.record(&k).clone();
    assert_eq!(rec.state, ExecState::Completed);
    assert_eq!(rec.result.as_ref().and_then(ExecResult::exit_code), Some(0));
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert!(s.machine().active_execution.is_none(), "the slot is free");
}
