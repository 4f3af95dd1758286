//! Streamed runs through both shells' `Runtime` (issue 15 item 2): the
//! output reaches the caller as it comes, the record is kept exactly like
//! a buffered run's (state, evidence, exit, output size, three commits),
//! the output is never stored, a resubmission runs nothing, and a retained
//! machine's slot takes a streamed command. Registered by
//! [`managed_stream_suite!`](crate::managed_stream_suite).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::{Arc, Mutex};

use smolbox_core::exec::{Command, ExecEvent};
use smolbox_core::managed::record::ExecResult;
use smolbox_core::managed::state::{MachineOperation as Op, MachineRecordState as MS};
use smolbox_core::managed::{ExecState, RecordEvidence, RecordKey};
use smolbox_devworker::Route;

use crate::managed::{ManagedShell, Options};
use crate::managed_cases::{StoreKind, key, setup, submit_of};

const SENTINEL: &str = "SENTINEL-STREAM-91c3";

/// Prints `first` (and the sentinel), waits for `gate`, prints `second`
/// on stderr, exits 3.
fn two_part(gate: &std::path::Path) -> Command {
    Command::new([
        "sh",
        "-c",
        &format!(
            "echo first {SENTINEL}; while [ ! -e '{}' ]; do sleep 0.02; done; echo second >&2; exit 3",
            gate.display()
        ),
    ])
}

/// The events of a run; the gate is opened when `first` arrives, so the
/// command can only end if the first piece was delivered before its exit.
fn collector(gate: std::path::PathBuf) -> (Arc<Mutex<Vec<String>>>, impl FnMut(&ExecEvent) + Send) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let on_event = move |e: &ExecEvent| {
        let text = match e {
            ExecEvent::Stdout(t) => format!("out:{t}"),
            ExecEvent::Stderr(t) => format!("err:{t}"),
            ExecEvent::Exit(c) => format!("exit:{c}"),
            other => format!("other:{other:?}"),
        };
        if text.starts_with("out:first") {
            std::fs::write(&gate, b"").unwrap();
        }
        s.lock().unwrap().push(text);
    };
    (seen, on_event)
}

fn joined(seen: &Mutex<Vec<String>>) -> String {
    seen.lock().unwrap().concat()
}

/// The output arrives while the command runs (it waits for a gate the
/// first piece opens); the record is `completed` / `exited` with the exit
/// code and the output's size, in the three commits of a buffered run;
/// the outcome holds no output; the worker saw one streamed exec and no
/// buffered one; the output is in no store file.
pub fn a_streamed_run_delivers_output_as_it_comes_and_records_its_exit<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options::default());
    let gate = s.gate("sg1");
    let (seen, mut on_event) = collector(gate.clone());
    let before = s.store.commits().expect("the adapter counts commits");
    let out = rt
        .run_streamed(submit_of("s1", &two_part(&gate)), &mut on_event)
        .unwrap();
    assert_eq!(
        joined(&seen),
        format!("out:first {SENTINEL}\nerr:second\n"),
        "both pieces, in order, no exit event"
    );
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.record.evidence, RecordEvidence::Exited);
    let printed = format!("first {SENTINEL}\nsecond\n").len() as u64;
    assert_eq!(
        out.record.result,
        Some(ExecResult::Exited {
            exit_code: 3,
            output_bytes: printed,
            truncated: false,
        })
    );
    assert!(out.output.is_none());
    assert_eq!(s.store.commits().unwrap() - before, 2, "as a buffered run");
    let w = &s.fixture.worker;
    assert_eq!(w.request_count(Route::ExecStream), 1);
    assert_eq!(w.request_count(Route::Exec), 0);
    rt.shutdown();
    drop(rt);
    if kind != StoreKind::Sqlite {
        return;
    }
    let bytes = s.all_bytes();
    assert!(
        bytes.windows(2).any(|w| w == b"s1"),
        "the database was read"
    );
    assert!(
        !bytes
            .windows(SENTINEL.len())
            .any(|w| w == SENTINEL.as_bytes()),
        "the output is never stored"
    );
}

/// A second streamed run under the same key returns the recorded outcome
/// and sends nothing; a command with stdin (not streamable) goes out
/// buffered and its output is handed over at the end.
pub fn a_streamed_resubmission_runs_once_and_stdin_falls_back_to_buffered<M: ManagedShell>(
    kind: StoreKind,
) {
    let Some(s) = setup(kind) else { return };
    let rt: M = s.runtime(&Options::default());
    let cmd = Command::new(["sh", "-c", "echo once; exit 5"]);
    let mut first = Vec::new();
    let out = rt
        .run_streamed(submit_of("r1", &cmd), &mut |e: &ExecEvent| {
            first.push(format!("{e:?}"));
        })
        .unwrap();
    assert_eq!(out.exit_code(), Some(5));
    assert_eq!(first, ["Stdout(5 bytes)"]);
    let mut second = 0;
    let again = rt
        .run_streamed(submit_of("r1", &cmd), &mut |_: &ExecEvent| second += 1)
        .unwrap();
    assert_eq!(again.record, out.record);
    assert_eq!(second, 0, "nothing ran, nothing streamed");
    assert_eq!(s.fixture.worker.request_count(Route::ExecStream), 1);
    // stdin: buffered, delivered at the end.
    let with_stdin = Command::new(["cat"]).stdin("fed");
    let mut got = String::new();
    let out = rt
        .run_streamed(submit_of("in1", &with_stdin), &mut |e: &ExecEvent| {
            if let ExecEvent::Stdout(t) = e {
                got.push_str(t);
            }
        })
        .unwrap();
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(got, "fed");
    assert_eq!(s.fixture.worker.request_count(Route::Exec), 1);
    assert_eq!(s.fixture.worker.request_count(Route::ExecStream), 1);
    rt.shutdown();
}

/// A streamed command in a retained machine's slot: output as it comes,
/// the exit recorded, the slot freed.
pub fn a_streamed_command_runs_in_a_retained_slot<M: ManagedShell>(kind: StoreKind) {
    let Some(s) = setup(kind) else { return };
    let options = Options {
        disposable: true,
        lease_ttl_ms: 2_000,
        ..Options::default()
    };
    let rt: M = s.runtime(&options);
    let spec = crate::managed_machine_cases::spec();
    let mk = RecordKey::new("boxes", "sbox").unwrap();
    rt.m_create(&mk, &spec).unwrap();
    let m = rt.m_wait(&mk, 30_000).unwrap();
    rt.m_lifecycle(&mk, Op::Start, m.version).unwrap();
    let m = rt.m_wait(&mk, 30_000).unwrap();
    assert_eq!(m.state, MS::Running, "{:?}", m.last_error);
    let gate = s.gate("sg2");
    let (seen, mut on_event) = collector(gate.clone());
    let ck = RecordKey::new("boxes", "sc1").unwrap();
    let out = rt
        .m_run_streamed(&mk, &ck, &two_part(&gate), &mut on_event)
        .unwrap();
    assert_eq!(joined(&seen), format!("out:first {SENTINEL}\nerr:second\n"));
    assert_eq!(out.record.state, ExecState::Completed, "{:?}", out.error);
    assert_eq!(out.exit_code(), Some(3));
    let mut free = None;
    for _ in 0..3_000 {
        let m = rt.m_inspect(&mk).unwrap();
        if m.active_execution.is_none() {
            free = Some(m);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(free.is_some(), "the slot was freed");
    assert_eq!(s.fixture.worker.request_count(Route::ExecStream), 1);
    rt.shutdown();
}

/// The stream limit through a running runtime (issue 15): with the one
/// active slot held by a buffered command, 64 streamed runs
/// ([`MAX_STREAMS`](smolbox_core::managed::controller::MAX_STREAMS)) wait
/// at once, each registered before its submission; the 65th is refused
/// `admission_exhausted` (`streams_exhausted`, with the limit) before
/// anything is stored; once the slot frees, each of the 64 gets exactly its
/// own output and exit.
pub fn sixty_four_streams_wait_and_the_next_is_refused<M: ManagedShell + Sync>(kind: StoreKind) {
    use smolbox_core::managed::controller::MAX_STREAMS;
    use smolbox_core::{Category, Reason};
    let Some(s) = setup(kind) else { return };
    // The blocker's buffered exec sends nothing until it ends: the
    // connection may stay idle for as long as the 64 take to be accepted.
    let patient = smolbox_core::worker::Budgets {
        operation: std::time::Duration::from_secs(60),
        receive_idle: std::time::Duration::from_secs(60),
        ..crate::Fixture::budgets()
    };
    let options = Options {
        max_active: 1,
        ..Options::default()
    };
    let rt = M::start(
        Arc::clone(&s.store),
        s.key.clone(),
        s.fixture.endpoint(patient),
        &options,
    )
    .unwrap();
    let gate = s.gate("streams");
    let blocker = submit_of("blocker", &crate::managed_cases::gated(&gate));
    let blocker_key = blocker.key.clone();
    rt.submit(blocker).unwrap();
    let bounded = |what: &str, done: &dyn Fn() -> bool| {
        for _ in 0..3_000 {
            if done() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("never: {what}");
    };
    bounded("the blocker holds the active slot", &|| s.execs() == 1);
    let echo = |i: usize| Command::new(["echo".to_owned(), format!("stream-{i}")]);
    std::thread::scope(|t| {
        let runs: Vec<_> = (0..MAX_STREAMS)
            .map(|i| {
                let (rt, echo) = (&rt, &echo);
                t.spawn(move || {
                    let mut seen = String::new();
                    let out = rt.run_streamed(
                        submit_of(&format!("st{i}"), &echo(i)),
                        &mut |e: &ExecEvent| {
                            if let ExecEvent::Stdout(x) = e {
                                seen.push_str(x);
                            }
                        },
                    );
                    (out, seen)
                })
            })
            .collect();
        // Each run registers its stream before it submits: all 64 are
        // registered once all 64 records are stored.
        bounded("64 streamed runs accepted", &|| {
            (0..MAX_STREAMS).all(|i| s.store.fetch(&key(&format!("st{i}"))).is_ok())
        });
        let over = rt.run_streamed(submit_of("st-over", &echo(99)), &mut |_: &ExecEvent| {});
        let states: Vec<_> = (0..MAX_STREAMS)
            .map(|i| s.store.fetch(&key(&format!("st{i}"))).unwrap().state)
            .collect();
        let e = over.map(|o| o.record).expect_err(&format!("{states:?}"));
        assert_eq!(
            (e.category(), e.reason()),
            (Category::AdmissionExhausted, Reason::StreamsExhausted),
            "{e:?}"
        );
        let limit = e.limit().unwrap();
        assert_eq!((limit.actual, limit.max), (65, 64));
        assert_eq!(
            s.store.fetch(&key("st-over")).unwrap_err().category(),
            Category::NotFound,
            "refused before anything is stored"
        );
        crate::managed_cases::open(&gate);
        for (i, run) in runs.into_iter().enumerate() {
            let (out, seen) = run.join().unwrap();
            let out = out.unwrap();
            assert_eq!(out.exit_code(), Some(0), "st{i}: {:?}", out.error);
            assert_eq!(seen, format!("stream-{i}\n"), "st{i}: its own output");
        }
    });
    let b = rt.wait(&blocker_key, 30_000).unwrap();
    assert_eq!(b.exit_code(), Some(0), "{:?} {:?}", b.record, b.error);
    let w = &s.fixture.worker;
    assert_eq!(
        (
            w.request_count(Route::ExecStream),
            w.request_count(Route::Exec)
        ),
        (64, 1)
    );
    rt.shutdown();
}

/// Instantiates every streamed-run case for `$shell`, one `#[test]` per
/// case and store (`mod stream_sqlite`, `mod stream_postgres`).
#[macro_export]
macro_rules! managed_stream_suite {
    ($shell:ty) => {
        $crate::store_suite!(
            $shell,
            managed_stream_cases,
            stream_sqlite,
            stream_postgres,
            [
                a_streamed_run_delivers_output_as_it_comes_and_records_its_exit,
                a_streamed_resubmission_runs_once_and_stdin_falls_back_to_buffered,
                a_streamed_command_runs_in_a_retained_slot,
                sixty_four_streams_wait_and_the_next_is_refused,
            ]
        );
    };
}
