//! The end-to-end cases, generic over the shell. Each starts its own
//! devworker, so cases are independent and run in parallel.
//!
//! Every fault case checks the typed error *and* that the devworker saw the
//! request exactly once (no replay).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed case

use smolbox_core::Reason;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::Digest;
use smolbox_core::exec::{Command, ExecOutcome, ExecOutput, OutputAllowance};
use smolbox_core::terminal::{TerminalExit, TerminalSpec};
use smolbox_core::worker::{
    Budgets, Endpoint, EndpointConfig, Feature, MachineName, MachineSpec, MachineState, Profile,
    Source,
};
use smolbox_core::{Category, Error, Evidence, Operation};
use smolbox_devworker::{Fault, MismatchField, Route};

use crate::fixture::{Fixture, TOKEN_SENTINEL, Transport, WORKER_VERSION};
use crate::shell::{ExecEvent, Shell, StreamHandle, TerminalEvent, TerminalHandle};

/// A payload sentinel put in argv, env and output.
pub const PAYLOAD_SENTINEL: &str = "SENTINEL-PAYLOAD-91d2e7";

fn name(s: &str) -> MachineName {
    MachineName::new(s).unwrap()
}

/// The spec of a plain image machine (an OCI reference, 1.19.0+): what
/// terminals, extended and background commands and large or out-of-root
/// files need (C5.4, C6.1, C7.4). The devworker reports the reference as
/// the machine's `image` and pulls nothing.
pub fn image_spec() -> MachineSpec {
    MachineSpec {
        source: Source::Oci {
            reference: "alpine:3.19".into(),
        },
        ..MachineSpec::default()
    }
}

/// Admits the worker and creates machine `m1`: an image machine where the
/// version has image sources, else an imageless one.
fn machine<S: Shell>(s: &S) -> Profile {
    let profile = s.admit().unwrap();
    let spec = if profile.allows(Feature::RegistrySources) {
        image_spec()
    } else {
        MachineSpec::default()
    };
    s.create(&profile, name("m1"), &spec).unwrap();
    profile
}

fn sh(script: &str) -> Command {
    Command::new(["/bin/sh", "-c", script])
}

fn exited(outcome: ExecOutcome) -> ExecOutput {
    match outcome {
        ExecOutcome::Exited(out) => out,
        ExecOutcome::Launched(_) => panic!("expected an exit, got a launch"),
    }
}

fn assert_err(e: &Error, category: Category, evidence: Evidence) {
    assert_eq!((e.category(), e.evidence()), (category, evidence), "{e:?}");
}

fn collect<S: Shell>(stream: S::Stream) -> (Vec<ExecEvent>, Option<Error>) {
    let mut events = Vec::new();
    for item in stream {
        match item {
            Ok(ev) => events.push(ev),
            Err(e) => return (events, Some(e)),
        }
    }
    (events, None)
}

fn stdout_of(events: &[ExecEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ExecEvent::Stdout(s) => Some(s.as_str()),
            _ => None,
        })
        .collect()
}

/// health, admit, readyz, capacity, metrics.
pub fn node_operations<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    let health = s.health().unwrap();
    assert_eq!(health.version, WORKER_VERSION);
    let profile = s.admit().unwrap();
    assert_eq!(profile.version_text(), WORKER_VERSION);
    s.readyz().unwrap();
    s.capacity().unwrap();
    let metrics = s.metrics().unwrap();
    assert!(!metrics.is_empty());
    assert_eq!(fx.worker.request_count(Route::Health), 2);
}

/// create, list, get, start, stop, delete, then get is `not_found`.
pub fn machine_lifecycle<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    let profile = machine(&s);
    let list = s.list(&profile).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].incarnation.name, "m1");
    let got = s.get(&profile, name("m1")).unwrap();
    assert_eq!(got.incarnation, list[0].incarnation);
    let started = s.start(&profile, name("m1")).unwrap();
    assert_eq!(started.state, MachineState::Running);
    let stopped = s.stop(&profile, name("m1")).unwrap();
    assert_eq!(stopped.state, MachineState::Stopped);
    s.delete(name("m1")).unwrap();
    let e = s.get(&profile, name("m1")).unwrap_err();
    assert_err(&e, Category::NotFound, Evidence::DispatchUncertain);
    // A duplicate create is an identity conflict.
    s.create(&profile, name("m2"), &MachineSpec::default())
        .unwrap();
    let e = s
        .create(&profile, name("m2"), &MachineSpec::default())
        .unwrap_err();
    assert_err(&e, Category::IdentityConflict, Evidence::DispatchUncertain);
}

/// Buffered exec: exact bytes, a non-zero exit is a result, stdin and env.
pub fn buffered_exec<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let cmd = sh("printf 'a\\0b'; printf err >&2; exit 3");
    let out = exited(s.exec("m1", &cmd, OutputAllowance::DEFAULT).unwrap());
    assert_eq!(
        (out.exit_code, out.stdout.as_slice(), out.stderr.as_slice()),
        (3, &b"a\0b"[..], &b"err"[..])
    );
    let cmd = sh("cat; printf \"$X\"").stdin("in-").env("X", "env");
    let out = exited(s.exec("m1", &cmd, OutputAllowance::DEFAULT).unwrap());
    assert_eq!(out.stdout, b"in-env");
    assert_eq!(fx.worker.request_count(Route::Exec), 2);
}

/// Streamed exec: stdout and stderr events, then the exit.
pub fn streamed_exec<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let stream = s
        .exec_stream(
            "m1",
            &sh("echo one; echo two >&2; echo three; exit 4"),
            OutputAllowance::DEFAULT,
        )
        .unwrap();
    let (events, err) = collect::<S>(stream);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(stdout_of(&events), "one\nthree\n");
    assert!(events.contains(&ExecEvent::Stderr("two\n".into())));
    assert_eq!(events.last(), Some(&ExecEvent::Exit(4)));
    // Stdin is refused before anything is sent.
    let e = s
        .exec_stream("m1", &sh("cat").stdin("x"), OutputAllowance::DEFAULT)
        .err()
        .unwrap();
    assert_err(&e, Category::UnsupportedCapability, Evidence::NotDispatched);
    assert_eq!(fx.worker.request_count(Route::ExecStream), 1);
}

/// The callback sees every event, in order, and the capture matches.
pub fn streamed_exec_callback<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let out = s
        .exec_with(
            "m1",
            &sh("echo a; echo b >&2; exit 2"),
            Box::new(move |e| sink.lock().unwrap().push(e.clone())),
        )
        .unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_slice(), out.stderr.as_slice()),
        (2, &b"a\n"[..], &b"b\n"[..])
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.last(), Some(&ExecEvent::Exit(2)));
    assert_eq!(stdout_of(&seen), "a\n");
}

/// A panicking callback is detached; capture continues to the exit.
pub fn callback_panic_is_detached<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let out = s
        .exec_with(
            "m1",
            &sh("echo a; sleep 0.05; echo b; exit 5"),
            Box::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
                panic!("observer failure (expected by the test)");
            }),
        )
        .unwrap();
    assert_eq!((out.exit_code, out.stdout.as_slice()), (5, &b"a\nb\n"[..]));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a panicked callback is never called again"
    );
}

/// A callback that never returns is abandoned at the operation deadline.
pub fn callback_blocked_is_cut_at_the_deadline<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell_with(Budgets {
        operation: Duration::from_millis(800),
        ..Fixture::budgets()
    });
    machine(&s);
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let e = s
        .exec_with(
            "m1",
            &sh("echo a; exit 0"),
            Box::new(move |_| {
                // Blocks until the test releases it, after the call returned.
                let _ = release_rx.lock().unwrap().recv();
            }),
        )
        .unwrap_err();
    drop(release_tx);
    assert_err(&e, Category::Transport, Evidence::DispatchUncertain);
    assert_eq!(e.reason(), Reason::CallbackDeadline);
}

/// Dropping (detaching) a stream ends observation and says the command may
/// still run.
pub fn dropped_stream_detaches<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let mut stream = s
        .exec_stream(
            "m1",
            &sh("echo first; sleep 5; echo late"),
            OutputAllowance::DEFAULT,
        )
        .unwrap();
    assert_eq!(
        stream.next().unwrap().unwrap(),
        ExecEvent::Stdout("first\n".into())
    );
    let e = stream.detach().unwrap();
    assert_err(&e, Category::Transport, Evidence::DispatchUncertain);
    assert_eq!(e.reason(), Reason::Detached);
    // The client keeps working.
    s.health().unwrap();
}

/// The reply is cut after 20 bytes: transport, uncertain, sent once.
pub fn fault_drop_after_bytes<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    fx.worker
        .faults()
        .once(Route::Exec, Fault::DropAfter { bytes: 20 });
    let e = s
        .exec("m1", &sh("echo hi"), OutputAllowance::DEFAULT)
        .unwrap_err();
    assert_err(&e, Category::Transport, Evidence::DispatchUncertain);
    assert_eq!(fx.worker.request_count(Route::Exec), 1);
}

/// A reply later than the operation budget: transport, uncertain, sent once.
pub fn fault_delay_past_the_operation_budget<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell_with(Budgets {
        operation: Duration::from_millis(400),
        ..Fixture::budgets()
    });
    let profile = s.admit().unwrap();
    fx.worker
        .faults()
        .once(Route::MachinesCreate, Fault::Delay { ms: 3_000 });
    let e = s
        .create(&profile, name("m1"), &MachineSpec::default())
        .unwrap_err();
    assert_err(&e, Category::Transport, Evidence::DispatchUncertain);
    assert_eq!(e.reason(), Reason::Deadline);
    assert_eq!(fx.worker.request_count(Route::MachinesCreate), 1);
}

/// Truncated and malformed JSON: protocol, uncertain.
pub fn fault_truncated_and_malformed_json<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    let profile = machine(&s);
    for fault in [Fault::TruncateJson, Fault::MalformedJson] {
        fx.worker.faults().once(Route::MachineGet, fault);
        let e = s.get(&profile, name("m1")).unwrap_err();
        assert_err(&e, Category::Protocol, Evidence::DispatchUncertain);
    }
    assert_eq!(fx.worker.request_count(Route::MachineGet), 2);
}

/// A gzip reply and a redirect: protocol, never decoded or followed.
pub fn fault_gzip_and_redirect<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    let profile = machine(&s);
    fx.worker.faults().once(Route::MachineGet, Fault::Gzip);
    let e = s.get(&profile, name("m1")).unwrap_err();
    assert_err(&e, Category::Protocol, Evidence::DispatchUncertain);
    fx.worker.faults().once(
        Route::MachineGet,
        Fault::Redirect {
            location: "/api/v1/machines/other".into(),
        },
    );
    let e = s.get(&profile, name("m1")).unwrap_err();
    assert_err(&e, Category::Protocol, Evidence::DispatchUncertain);
    assert_eq!(e.status(), Some(307));
    assert_eq!(fx.worker.request_count(Route::MachineGet), 2);
}

/// A create reply naming another machine or other resources.
pub fn fault_create_mismatch<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    let profile = s.admit().unwrap();
    fx.worker.faults().once(
        Route::MachinesCreate,
        Fault::CreateMismatch {
            field: MismatchField::Name,
        },
    );
    let e = s
        .create(&profile, name("m1"), &MachineSpec::default())
        .unwrap_err();
    assert_err(&e, Category::IdentityConflict, Evidence::DispatchUncertain);
    fx.worker.faults().once(
        Route::MachinesCreate,
        Fault::CreateMismatch {
            field: MismatchField::Cpus,
        },
    );
    let e = s
        .create(&profile, name("m2"), &MachineSpec::default())
        .unwrap_err();
    assert_err(&e, Category::Protocol, Evidence::DispatchUncertain);
    assert_eq!(fx.worker.request_count(Route::MachinesCreate), 2);
}

/// The worker's request timeout (408) while the command runs on: the
/// outcome is unknown, the request is not replayed.
pub fn fault_timeout_408<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    fx.worker
        .faults()
        .once(Route::Exec, Fault::Timeout408 { ms: 100 });
    let e = s
        .exec("m1", &sh("sleep 1"), OutputAllowance::DEFAULT)
        .unwrap_err();
    assert!(e.may_have_reached_worker());
    assert_eq!(e.status(), Some(408));
    assert_eq!(fx.worker.request_count(Route::Exec), 1);
}

/// A stream that ends without an exit event: protocol, uncertain.
pub fn fault_stream_close_before_exit<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    fx.worker
        .faults()
        .once(Route::ExecStream, Fault::CloseBeforeExit);
    let stream = s
        .exec_stream("m1", &sh("echo x"), OutputAllowance::DEFAULT)
        .unwrap();
    let (events, err) = collect::<S>(stream);
    let e = err.unwrap();
    assert_err(&e, Category::Protocol, Evidence::DispatchUncertain);
    assert!(!events.iter().any(|e| matches!(e, ExecEvent::Exit(_))));
    assert_eq!(fx.worker.request_count(Route::ExecStream), 1);
}

/// A silent stall mid-stream hits the receive-idle budget.
pub fn fault_stream_stall_hits_idle_budget<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell_with(Budgets {
        receive_idle: Duration::from_millis(300),
        ..Fixture::budgets()
    });
    machine(&s);
    fx.worker
        .faults()
        .once(Route::ExecStream, Fault::StallStream);
    let stream = s
        .exec_stream(
            "m1",
            &sh("echo x; sleep 0.2; echo y"),
            OutputAllowance::DEFAULT,
        )
        .unwrap();
    let (_, err) = collect::<S>(stream);
    let e = err.unwrap();
    assert_err(&e, Category::Transport, Evidence::DispatchUncertain);
    assert_eq!(e.reason(), Reason::IdleTimeout);
}

/// Exit 130 through the stream (the worker killed the command at its first
/// output) is an observed exit code. (`exec`: no orphaned `sleep` keeps the
/// output pipes open past the kill.)
pub fn fault_stream_exit_130<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    fx.worker.faults().once(Route::ExecStream, Fault::Exit130);
    let stream = s
        .exec_stream(
            "m1",
            &sh("echo started; exec sleep 5"),
            OutputAllowance::DEFAULT,
        )
        .unwrap();
    let (events, err) = collect::<S>(stream);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(events.last(), Some(&ExecEvent::Exit(130)));
}

/// The response byte cap at exactly the body length, and one below.
pub fn response_byte_cap_at_n_and_n_plus_1<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let body = br#"{"status":"ok","version":"1.22.0"}"#;
    let n = body.len() as u64;
    let raw = |body: &[u8]| {
        let mut r = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    };
    let at_n: S = fx.shell_with(Budgets {
        max_response_bytes: n,
        ..Fixture::budgets()
    });
    fx.worker
        .faults()
        .once(Route::Health, Fault::RawReply { bytes: raw(body) });
    assert_eq!(at_n.health().unwrap().version, "1.22.0");
    let below: S = fx.shell_with(Budgets {
        max_response_bytes: n - 1,
        ..Fixture::budgets()
    });
    fx.worker
        .faults()
        .once(Route::Health, Fault::RawReply { bytes: raw(body) });
    let e = below.health().unwrap_err();
    assert_err(&e, Category::OutputLimit, Evidence::DispatchUncertain);
}

/// The request byte cap: a body of exactly N goes out; N+1 is refused
/// before connecting (nothing reaches the worker).
pub fn request_byte_cap_at_n_and_n_plus_1<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let setup: S = fx.shell();
    machine(&setup);
    let cmd = sh("exit 0");
    let n = cmd.wire_body().unwrap().len() as u64;
    let at_n: S = fx.shell_with(Budgets {
        max_request_body: n,
        ..Fixture::budgets()
    });
    exited(at_n.exec("m1", &cmd, OutputAllowance::DEFAULT).unwrap());
    let below: S = fx.shell_with(Budgets {
        max_request_body: n - 1,
        ..Fixture::budgets()
    });
    let e = below
        .exec("m1", &cmd, OutputAllowance::DEFAULT)
        .unwrap_err();
    assert_err(&e, Category::Validation, Evidence::NotDispatched);
    assert_eq!(e.operation(), Operation::RequestSize);
    assert_eq!(fx.worker.request_count(Route::Exec), 1);
}

/// The output allowance: N bytes of output at allowance N, and N+1.
pub fn output_allowance_at_n_and_n_plus_1<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let cmd = sh("head -c 1000 /dev/zero; exit 7");
    let out = exited(
        s.exec("m1", &cmd, OutputAllowance::new(1000).unwrap())
            .unwrap(),
    );
    assert_eq!(out.stdout.len(), 1000);
    let e = s
        .exec("m1", &cmd, OutputAllowance::new(999).unwrap())
        .unwrap_err();
    assert_err(&e, Category::OutputLimit, Evidence::Exited);
    assert_eq!(e.exit_code(), Some(7));
    // Streamed: N accepted, N+1 refused.
    let cmd = sh("printf 0123456789");
    let stream = s
        .exec_stream("m1", &cmd, OutputAllowance::new(10).unwrap())
        .unwrap();
    assert!(collect::<S>(stream).1.is_none());
    let stream = s
        .exec_stream("m1", &cmd, OutputAllowance::new(9).unwrap())
        .unwrap();
    let e = collect::<S>(stream).1.unwrap();
    assert_err(&e, Category::OutputLimit, Evidence::DispatchUncertain);
}

/// Sequential calls reuse one pooled connection (the devworker counts
/// requests; the shell's pool is observable through success only), and a
/// connection closed by a fault is not reused.
pub fn connection_is_reused<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    for _ in 0..20 {
        s.health().unwrap();
    }
    fx.worker
        .faults()
        .once(Route::Health, Fault::DropAfter { bytes: 5 });
    assert!(s.health().is_err());
    // The dropped connection is gone; the next call opens a fresh one.
    s.health().unwrap();
    assert_eq!(fx.worker.request_count(Route::Health), 22);
}

/// C0.3: a gated call whose health preflight fails uncertainly (the
/// connection dropped mid-reply) is refused with evidence
/// `not_dispatched`: the exec itself never left (the devworker counts
/// none), so a managed runtime records it as not sent, never `unknown`.
pub fn a_failed_health_preflight_leaves_the_gated_call_unsent<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    fx.worker
        .faults()
        .once(Route::Health, Fault::DropAfter { bytes: 5 });
    let e = s
        .exec("m1", &sh("exit 0"), OutputAllowance::DEFAULT)
        .unwrap_err();
    assert_eq!(e.evidence(), Evidence::NotDispatched, "{e}");
    assert_eq!(e.operation(), Operation::Health);
    assert_eq!(fx.worker.request_count(Route::Exec), 0);
    // The next call's preflight answers, and the exec runs once.
    exited(
        s.exec("m1", &sh("exit 0"), OutputAllowance::DEFAULT)
            .unwrap(),
    );
    assert_eq!(fx.worker.request_count(Route::Exec), 1);
}

/// Token and payload sentinels never appear in errors.
pub fn sentinels_never_appear_in_errors<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let cmd = sh(&format!("echo {PAYLOAD_SENTINEL}; head -c 5000 /dev/zero"))
        .env("SECRET", PAYLOAD_SENTINEL)
        .stdin(PAYLOAD_SENTINEL);
    let mut errors = vec![
        s.exec("m1", &cmd, OutputAllowance::new(100).unwrap())
            .unwrap_err(),
    ];
    fx.worker.faults().once(Route::Exec, Fault::MalformedJson);
    errors.push(s.exec("m1", &cmd, OutputAllowance::DEFAULT).unwrap_err());
    fx.worker.faults().once(Route::Exec, Fault::Gzip);
    errors.push(s.exec("m1", &cmd, OutputAllowance::DEFAULT).unwrap_err());
    let stream_cmd = sh(&format!("echo {PAYLOAD_SENTINEL}; head -c 5000 /dev/zero"));
    let stream = s
        .exec_stream("m1", &stream_cmd, OutputAllowance::new(100).unwrap())
        .unwrap();
    errors.push(collect::<S>(stream).1.unwrap());
    for e in errors {
        let text = format!("{e:?} {e}");
        assert!(
            !text.contains(TOKEN_SENTINEL) && !text.contains(PAYLOAD_SENTINEL),
            "{text}"
        );
    }
}

/// Upload then download (the digest is checked before sending), the
/// download cap at N and N-1, a background launch, console logs.
pub fn files_launch_and_logs<S: Shell>(t: Transport) {
    use smolbox_core::worker::{
        Download, FileBudget, GuestPath, Logs, LogsParams, PathPolicy, Upload,
    };
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    let profile = machine(&s);
    let budget = FileBudget::new(1 << 20, &Fixture::budgets()).unwrap();
    let policy = PathPolicy::default();
    let path = || GuestPath::new("/workspace/a.txt").unwrap();
    let data = bytes::Bytes::from_static(b"file body\n\0\xff");
    let digest: String = sha2::Sha256::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let up = Upload::new(
        &profile,
        &policy,
        &budget,
        name("m1"),
        path(),
        data.clone(),
        &digest,
    )
    .unwrap();
    let reply = s.upload(&up).unwrap();
    assert_eq!(
        (reply.path.as_str(), reply.size),
        ("/workspace/a.txt", data.len() as u64)
    );
    let n = data.len() as u64;
    let dl = Download::new(&profile, &policy, &budget, name("m1"), path(), n).unwrap();
    assert_eq!(s.download(&dl).unwrap(), data.to_vec());
    let dl = Download::new(&profile, &policy, &budget, name("m1"), path(), n - 1).unwrap();
    let e = s.download(&dl).unwrap_err();
    assert_err(&e, Category::OutputLimit, Evidence::DispatchUncertain);
    // A wrong digest is refused before anything exists to send.
    let e = Upload::new(
        &profile,
        &policy,
        &budget,
        name("m1"),
        path(),
        data,
        &"0".repeat(64),
    )
    .unwrap_err();
    assert_err(&e, Category::Validation, Evidence::NotDispatched);
    assert_eq!(fx.worker.request_count(Route::FilesPut), 1);
    // An upload's progress: the body bytes the socket took, rising, ending
    // at the body's size (never the head's bytes).
    let big = bytes::Bytes::from(vec![7u8; 512 * 1024]);
    let big_digest: String = sha2::Sha256::digest(&big)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let up = Upload::new(
        &profile,
        &policy,
        &budget,
        name("m1"),
        GuestPath::new("/workspace/big.bin").unwrap(),
        big.clone(),
        &big_digest,
    )
    .unwrap();
    let mut seen = Vec::new();
    let reply = s.upload_with_progress(&up, &mut |n| seen.push(n)).unwrap();
    assert_eq!(reply.size, big.len() as u64);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(seen.last(), Some(&(big.len() as u64)), "{seen:?}");
    assert_eq!(fx.worker.request_count(Route::FilesPut), 2);
    let launched = s.launch("m1", &sh("sleep 1").background(true)).unwrap();
    assert!(launched.pid > 0);
    let logs = Logs::new(&profile, name("m1"), LogsParams::default()).unwrap();
    s.logs(&logs).unwrap();
}

// ---- terminals ----------------------------------------------------------

fn term_spec(program: &str) -> TerminalSpec {
    let mut spec = TerminalSpec::new(program);
    spec.session_budget = Duration::from_secs(20);
    spec.idle_budget = Duration::from_secs(10);
    spec
}

/// Reads output until `needle` appears (bounded by `budget` calls of 5 s).
fn read_until<T: TerminalHandle>(term: &mut T, needle: &str) -> String {
    let mut seen = Vec::new();
    for _ in 0..200 {
        match term.next(Duration::from_secs(5)).unwrap() {
            TerminalEvent::Output(b) => {
                seen.extend_from_slice(&b);
                if String::from_utf8_lossy(&seen).contains(needle) {
                    return String::from_utf8_lossy(&seen).into_owned();
                }
            }
            TerminalEvent::Closed(outcome) => panic!("closed before {needle:?}: {outcome:?}"),
            other => panic!("unexpected event before {needle:?}: {other:?}"),
        }
    }
    panic!("{needle:?} never arrived");
}

/// Waits for the end of the session, discarding output.
fn outcome_of<T: TerminalHandle>(term: &mut T) -> Result<TerminalExit, Error> {
    for _ in 0..10_000 {
        if let TerminalEvent::Closed(outcome) = term.next(Duration::from_secs(5)).unwrap() {
            return outcome;
        }
    }
    panic!("the session never ended");
}

/// Input reaches a shell under a real PTY; its exit code is confirmed.
pub fn terminal_echo_and_exit_code<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let mut term = s.terminal("m1", &term_spec("/bin/sh")).unwrap();
    term.input(b"echo hi-$((40+2))\n").unwrap();
    read_until(&mut term, "hi-42");
    term.input(b"exit 7\n").unwrap();
    assert_eq!(outcome_of(&mut term).unwrap().code, 7);
    assert_eq!(fx.worker.request_count(Route::Terminal), 1);
}

/// A resize is seen by the guest's `stty size`.
pub fn terminal_resize_seen_by_stty<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let mut term = s.terminal("m1", &term_spec("/bin/sh")).unwrap();
    term.resize(123, 45).unwrap();
    term.input(b"stty size\n").unwrap();
    read_until(&mut term, "45 123");
    // Out of range sizes are refused locally.
    let e = term.resize(0, 10).unwrap_err();
    assert_err(&e, Category::Validation, Evidence::NotDispatched);
    term.input(b"exit 0\n").unwrap();
    assert_eq!(outcome_of(&mut term).unwrap().code, 0);
}

/// A wait that times out ends the wait, not the session.
pub fn terminal_next_timeout_keeps_the_session<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let mut term = s.terminal("m1", &term_spec("/bin/cat")).unwrap();
    let e = term.next(Duration::from_millis(50)).unwrap_err();
    assert_eq!(e.category(), Category::Expired);
    term.input(b"ping\n").unwrap();
    read_until(&mut term, "ping");
}

/// Exit 130 (the worker killed the program) is an uncertain outcome.
pub fn terminal_exit_130_is_uncertain<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    fx.worker.faults().once(Route::Terminal, Fault::Exit130);
    let mut term = s.terminal("m1", &term_spec("/bin/sh")).unwrap();
    term.input(b"exit 0\n").unwrap();
    let e = outcome_of(&mut term).unwrap_err();
    assert!(e.may_have_reached_worker(), "{e:?}");
    assert_eq!(e.exit_code(), Some(130));
}

/// A close frame before the exit frame, and our own close before the
/// program exits: both uncertain.
pub fn terminal_close_before_exit_is_uncertain<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    fx.worker
        .faults()
        .once(Route::Terminal, Fault::CloseBeforeExit);
    let mut term = s.terminal("m1", &term_spec("/bin/sh")).unwrap();
    term.input(b"exit 0\n").unwrap();
    let e = outcome_of(&mut term).unwrap_err();
    assert!(e.may_have_reached_worker(), "{e:?}");
    let term = s.terminal("m1", &term_spec("/bin/cat")).unwrap();
    let e = term.close().unwrap_err();
    assert!(e.may_have_reached_worker(), "{e:?}");
}

/// A stalled consumer: output beyond the unread buffer closes the session
/// with `output_limit` and no confirmed exit.
pub fn terminal_stalled_consumer_hits_output_limit<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    let mut spec = term_spec("/bin/sh");
    spec.max_buffer_bytes = 1024;
    let mut term = s.terminal("m1", &spec).unwrap();
    term.input(b"head -c 200000 /dev/zero | tr '\\0' x; sleep 5\n")
        .unwrap();
    // Do not read for longer than the read grace: the consumer is stalled,
    // the driver keeps reading and the queue overflows.
    std::thread::sleep(smolbox_core::terminal::READ_GRACE * 5);
    let e = outcome_of(&mut term).unwrap_err();
    assert_err(&e, Category::OutputLimit, Evidence::Unknown);
}

/// Frames no conforming worker sends: an oversize frame and a masked one.
pub fn terminal_bad_frames_are_protocol_errors<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    for fault in [Fault::OversizeFrame { len: 1 << 20 }, Fault::MaskedFrame] {
        fx.worker.faults().once(Route::Terminal, fault);
        // No input: the worker's first output (the prompt) carries the bad
        // frame, and unread input at its close could turn it into a reset.
        let mut term = s.terminal("m1", &term_spec("/bin/sh")).unwrap();
        let e = outcome_of(&mut term).unwrap_err();
        assert!(
            matches!(e.category(), Category::Protocol | Category::OutputLimit),
            "{e:?}"
        );
    }
}

/// Exec, streamed exec, launch and terminal run the core's gated calls
/// after a health preflight: against 1.9.2 a feature it lacks (extended
/// exec, background launch, `user`) is `unsupported_capability` /
/// `not_dispatched` and the worker sees no request on that route (AC-0.3.2);
/// what 1.9.2 has (a plain exec) still runs.
pub fn gated_features_are_refused_unsent_on_1_9_2<S: Shell>(t: Transport) {
    let fx = Fixture::start_version(t, "1.9.2");
    let s: S = fx.shell();
    let profile = s.admit().unwrap();
    assert_eq!(profile.version_text(), "1.9.2");
    s.create(&profile, name("m1"), &MachineSpec::default())
        .unwrap();
    let extended = sh("true").timeout_secs(301);
    let gated = |e: &Error| {
        assert_err(e, Category::UnsupportedCapability, Evidence::NotDispatched);
    };
    gated(
        &s.exec("m1", &extended, OutputAllowance::DEFAULT)
            .unwrap_err(),
    );
    gated(
        &s.exec_stream("m1", &extended, OutputAllowance::DEFAULT)
            .map(|_| ())
            .unwrap_err(),
    );
    gated(&s.launch("m1", &sh("sleep 1").background(true)).unwrap_err());
    // 1.9.2's strict request struct has no `user`.
    gated(
        &s.exec("m1", &sh("id").user("root"), OutputAllowance::DEFAULT)
            .unwrap_err(),
    );
    for route in [Route::Exec, Route::ExecStream] {
        assert_eq!(fx.worker.request_count(route), 0, "{route:?} was sent");
    }
    let out = exited(
        s.exec("m1", &sh("echo hi"), OutputAllowance::DEFAULT)
            .unwrap(),
    );
    assert_eq!((out.exit_code, &out.stdout[..]), (0, &b"hi\n"[..]));
    assert_eq!(fx.worker.request_count(Route::Exec), 1);
}

/// The same operations against 1.22.0 are sent and run (the gate lets them
/// through).
pub fn gated_features_run_on_1_22_0<S: Shell>(t: Transport) {
    let fx = Fixture::start_version(t, "1.22.0");
    let s: S = fx.shell();
    machine(&s);
    let out = exited(
        s.exec(
            "m1",
            &sh("echo ext").timeout_secs(301),
            OutputAllowance::DEFAULT,
        )
        .unwrap(),
    );
    assert_eq!((out.exit_code, &out.stdout[..]), (0, &b"ext\n"[..]));
    let (events, err) = collect::<S>(
        s.exec_stream(
            "m1",
            &sh("echo st").timeout_secs(301),
            OutputAllowance::DEFAULT,
        )
        .unwrap(),
    );
    assert!(err.is_none(), "{err:?}");
    assert_eq!(stdout_of(&events), "st\n");
    s.launch("m1", &sh("sleep 1").background(true)).unwrap();
    let term = s.terminal("m1", &term_spec("/bin/sh")).unwrap();
    drop(term);
    assert_eq!(fx.worker.request_count(Route::Exec), 2);
    assert_eq!(fx.worker.request_count(Route::ExecStream), 1);
    assert_eq!(fx.worker.request_count(Route::Terminal), 1);
}

/// A worker reporting a version no profile knows (1.21.1) is refused for
/// every operation: admission, exec, streamed exec, launch and terminal all
/// fail `unsupported_capability` / `not_dispatched`, and nothing past the
/// health read is sent (AC-0.3.1).
pub fn unknown_version_is_refused_for_every_operation<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    machine(&s);
    fx.worker.faults().on(
        Route::Health,
        Fault::Reply {
            status: 200,
            content_type: Some("application/json".into()),
            body: r#"{"status":"ok","version":"1.21.1"}"#.into(),
        },
    );
    let refused = |e: &Error| {
        assert_err(e, Category::UnsupportedCapability, Evidence::NotDispatched);
        assert_eq!(e.reason(), Reason::UnknownWorkerVersion, "{e:?}");
    };
    refused(&s.admit().unwrap_err());
    refused(
        &s.exec("m1", &sh("echo hi"), OutputAllowance::DEFAULT)
            .unwrap_err(),
    );
    refused(
        &s.exec_stream("m1", &sh("echo hi"), OutputAllowance::DEFAULT)
            .map(|_| ())
            .unwrap_err(),
    );
    refused(&s.launch("m1", &sh("sleep 1").background(true)).unwrap_err());
    refused(
        &s.terminal("m1", &term_spec("/bin/sh"))
            .map(|_| ())
            .unwrap_err(),
    );
    for route in [Route::Exec, Route::ExecStream, Route::Terminal] {
        assert_eq!(fx.worker.request_count(route), 0, "{route:?} was sent");
    }
}

/// A consumer that pulls as fast as it can, from right after the open, of
/// a worker that floods 8 MiB in 16 KiB frames from its first byte behind
/// the 101 gets every byte and the confirmed exit: the unread queue (64 KiB)
/// is never exceeded, so memory stays bounded by it, and the session never
/// ends with `output_limit`. Not per transport: the peer is a plain TCP
/// one. (Before the open counted as the first pull, the bytes that arrived
/// before the first `next` were read without pause and overflowed the
/// queue.)
pub fn terminal_fast_consumer_of_a_flood_ends_cleanly<S: Shell>() {
    const TOTAL: usize = 8 << 20;
    let peer = crate::flood::FloodPeer::start(TOTAL, 16 << 10);
    let endpoint = Endpoint::new(EndpointConfig {
        id: "flood".into(),
        base_url: peer.base_url(),
        allow_insecure_loopback: true,
        budgets: Fixture::budgets(),
        ..EndpointConfig::default()
    })
    .unwrap();
    let s = S::connect(endpoint).unwrap();
    let mut spec = term_spec("/bin/sh");
    spec.max_buffer_bytes = 64 << 10;
    let mut term = s.terminal("m1", &spec).unwrap();
    let mut delivered = 0usize;
    let outcome = loop {
        match term.next(Duration::from_secs(5)).unwrap() {
            TerminalEvent::Output(b) => delivered += b.len(),
            TerminalEvent::Closed(outcome) => break outcome,
            other => panic!("unexpected event: {other:?}"),
        }
    };
    assert_eq!(outcome.unwrap().code, 0);
    assert_eq!(delivered, TOTAL);
    drop(term);
    peer.join();
}

/// C5.4, C6.1, C7.4: on a 1.17.0+ worker an extended exec (stream too), a
/// background launch, a large or out-of-root file and a terminal inspect
/// the machine first; an imageless machine refuses each with
/// `unsupported_capability` / `needs_plain_image_machine` / `not_dispatched`
/// and the worker sees none of them (one inspect each); an absent machine
/// is the inspect's `not_found`, still `not_dispatched`. Ordinary commands
/// and small `/workspace` files on the same machine are not inspected.
/// The same calls on an image machine run.
pub fn image_preflight_refuses_imageless_machines<S: Shell>(t: Transport) {
    use smolbox_core::worker::{FileBudget, GuestPath, PathPolicy, Upload};
    let fx = Fixture::start(t);
    let s: S = fx.shell();
    let profile = machine(&s);
    s.create(&profile, name("bare"), &MachineSpec::default())
        .unwrap();
    let gets = || fx.worker.request_count(Route::MachineGet);
    let refused = |e: Error, op: Operation| {
        assert_err(&e, Category::UnsupportedCapability, Evidence::NotDispatched);
        assert_eq!(
            (e.reason(), e.operation()),
            (Reason::NeedsPlainImageMachine, op),
            "{e:?}"
        );
    };
    let before = gets();
    let ext = sh("echo ext").timeout_secs(301);
    refused(
        s.exec("bare", &ext, OutputAllowance::DEFAULT).unwrap_err(),
        Operation::Exec,
    );
    refused(
        s.exec("bare", &sh("pwd").workdir("/tmp"), OutputAllowance::DEFAULT)
            .unwrap_err(),
        Operation::Exec,
    );
    refused(
        s.exec_stream("bare", &ext, OutputAllowance::DEFAULT)
            .map(|_| ())
            .unwrap_err(),
        Operation::ExecStream,
    );
    refused(
        s.launch("bare", &sh("sleep 1").background(true))
            .unwrap_err(),
        Operation::Launch,
    );
    refused(
        s.terminal("bare", &term_spec("/bin/sh"))
            .map(|_| ())
            .unwrap_err(),
        Operation::TerminalOpen,
    );
    let wide = PathPolicy::new(
        vec![GuestPath::new("/").unwrap()],
        vec![GuestPath::new("/").unwrap()],
        vec![GuestPath::new("/").unwrap()],
    )
    .unwrap();
    let budget = FileBudget::new(1 << 20, &Fixture::budgets()).unwrap();
    let data = bytes::Bytes::from_static(b"x\n");
    let digest: String = sha2::Sha256::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let upload = |machine: &str, path: &str| {
        Upload::new(
            &profile,
            &wide,
            &budget,
            name(machine),
            GuestPath::new(path).unwrap(),
            data.clone(),
            &digest,
        )
        .unwrap()
    };
    refused(
        s.upload(&upload("bare", "/etc/x")).unwrap_err(),
        Operation::Upload,
    );
    assert_eq!(gets(), before + 6, "one inspect per gated call");
    for route in [
        Route::Exec,
        Route::ExecStream,
        Route::Terminal,
        Route::FilesPut,
    ] {
        assert_eq!(fx.worker.request_count(route), 0, "{route:?} was sent");
    }
    // An absent machine: the inspect's 404, nothing else sent.
    let e = s.exec("nope", &ext, OutputAllowance::DEFAULT).unwrap_err();
    assert_err(&e, Category::NotFound, Evidence::NotDispatched);
    assert_eq!(e.operation(), Operation::Get);
    assert_eq!(fx.worker.request_count(Route::Exec), 0);
    // Ordinary work on the imageless machine is not inspected.
    let before = gets();
    let out = exited(
        s.exec("bare", &sh("echo hi"), OutputAllowance::DEFAULT)
            .unwrap(),
    );
    assert_eq!(out.stdout, b"hi\n");
    s.upload(&upload("bare", "/workspace/x")).unwrap();
    assert_eq!(gets(), before);
    // The image machine runs every one of them.
    let out = exited(s.exec("m1", &ext, OutputAllowance::DEFAULT).unwrap());
    assert_eq!(out.stdout, b"ext\n");
    s.launch("m1", &sh("sleep 1").background(true)).unwrap();
    s.upload(&upload("m1", "/etc/x")).unwrap();
    drop(s.terminal("m1", &term_spec("/bin/sh")).unwrap());
    assert_eq!(gets(), before + 4);
    assert_eq!(fx.worker.request_count(Route::Exec), 3);
    assert_eq!(fx.worker.request_count(Route::FilesPut), 2);
    assert_eq!(fx.worker.request_count(Route::Terminal), 1);
}

/// C5.4: the inspect runs inside the gated call's one operation deadline:
/// an inspect reply later than the operation budget (but within the
/// receive-idle budget) ends the call at the deadline, `not_dispatched`,
/// and the exec is never sent.
pub fn image_preflight_is_inside_the_operation_deadline<S: Shell>(t: Transport) {
    let fx = Fixture::start(t);
    machine(&fx.shell::<S>());
    let s: S = fx.shell_with(Budgets {
        operation: Duration::from_millis(400),
        receive_idle: Duration::from_secs(5),
        ..Fixture::budgets()
    });
    fx.worker
        .faults()
        .once(Route::MachineGet, Fault::Delay { ms: 3_000 });
    let e = s
        .exec(
            "m1",
            &sh("true").timeout_secs(301),
            OutputAllowance::DEFAULT,
        )
        .unwrap_err();
    assert_err(&e, Category::Transport, Evidence::NotDispatched);
    assert_eq!(
        (e.reason(), e.operation()),
        (Reason::Deadline, Operation::Get)
    );
    assert_eq!(fx.worker.request_count(Route::MachineGet), 1);
    assert_eq!(fx.worker.request_count(Route::Exec), 0);
}
