//! Exec over the blocking client: buffered, streamed as an iterator, and
//! observed by a callback (panicking, blocked, thread bound).

use smolbox_core::Reason;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use smolbox_core::exec::{Command, ExecOutcome};
use smolbox_core::{Category, Evidence};

use super::client::{budgets, tcp_client, worker_peer as peer};
use crate::{ExecEvent, MAX_DELIVERY_THREADS};

const SSE_BODY: &str = "event: stdout\ndata: hi\ndata: \n\nevent: stderr\ndata: boom\ndata: \n\nevent: exit\ndata: {\"exitCode\":3}\n\n";

fn sse_reply() -> &'static [u8] {
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{SSE_BODY}\r\n0\r\n\r\n",
        SSE_BODY.len()
    );
    Box::leak(reply.into_bytes().into_boxed_slice())
}

fn echo() -> Command {
    Command::new(["echo", "hi"])
}

#[test]
fn buffered_exec_decodes_exit_and_bytes() {
    let body = r#"{"exitCode":7,"stdout":"","stderr":"err","stdoutB64":"AP/+","stderrB64":"ZXJy"}"#;
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let p = peer(Box::leak(reply.into_bytes().into_boxed_slice()));
    let out = tcp_client(p.port, budgets()).exec("dev", &echo()).unwrap();
    let ExecOutcome::Exited(out) = out else {
        panic!("not an exit")
    };
    assert_eq!(
        (out.exit_code, &out.stdout[..], &out.stderr[..]),
        (7, &[0u8, 0xff, 0xfe][..], &b"err"[..])
    );
}

#[test]
fn exec_stream_is_an_iterator_of_events_and_reuses_the_connection() {
    let p = peer(sse_reply());
    let client = tcp_client(p.port, budgets());
    for _ in 0..2 {
        let events: Vec<_> = client
            .exec_stream("dev", &echo())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            events,
            vec![
                ExecEvent::Stdout("hi\n".into()),
                ExecEvent::Stderr("boom\n".into()),
                ExecEvent::Exit(3)
            ]
        );
    }
    assert_eq!(p.conns.load(Ordering::SeqCst), 1);
}

#[test]
fn exec_stream_status_is_mapped_by_the_core() {
    let p = peer(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 54\r\n\r\n{\"error\":\"machine 'dev' not found\",\"code\":\"NOT_FOUND\"}");
    let e = tcp_client(p.port, budgets())
        .exec_stream("dev", &echo())
        .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::NotFound, Evidence::DispatchUncertain)
    );
}

#[test]
fn detaching_a_stream_says_the_command_may_still_run() {
    let p = peer(sse_reply());
    let mut stream = tcp_client(p.port, budgets())
        .exec_stream("dev", &echo())
        .unwrap();
    assert!(matches!(stream.next(), Some(Ok(ExecEvent::Stdout(_)))));
    let e = stream.detach().unwrap();
    assert_eq!(
        (e.evidence(), e.reason()),
        (Evidence::DispatchUncertain, Reason::Detached)
    );
}

#[test]
fn callback_sees_every_event_and_output_is_captured() {
    let p = peer(sse_reply());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let out = tcp_client(p.port, budgets())
        .exec_with("dev", &echo(), move |ev| {
            s2.lock().unwrap().push(ev.clone())
        })
        .unwrap();
    assert_eq!(
        (out.exit_code, &out.stdout[..], &out.stderr[..]),
        (3, &b"hi\n"[..], &b"boom\n"[..])
    );
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[test]
fn a_panicking_callback_is_detached_and_capture_continues() {
    let p = peer(sse_reply());
    let calls = Arc::new(Mutex::new(0));
    let c2 = calls.clone();
    let out = tcp_client(p.port, budgets())
        .exec_with("dev", &echo(), move |_| {
            *c2.lock().unwrap() += 1;
            panic!("callback bug");
        })
        .unwrap();
    assert_eq!((out.exit_code, &out.stderr[..]), (3, &b"boom\n"[..]));
    assert_eq!(
        *calls.lock().unwrap(),
        1,
        "a panicked callback was called again"
    );
}

#[test]
fn a_blocked_callback_is_cut_off_at_the_deadline_and_threads_stay_bounded() {
    let p = peer(sse_reply());
    let mut b = budgets();
    b.operation = Duration::from_millis(100);
    let client = tcp_client(p.port, b);
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    for _ in 0..MAX_DELIVERY_THREADS {
        let rx = release_rx.clone();
        let e = client
            .exec_with("dev", &echo(), move |_| {
                // Blocks until the test releases it.
                let _ = rx.lock().map(|r| r.recv());
            })
            .unwrap_err();
        assert_eq!(
            (e.category(), e.evidence(), e.reason()),
            (
                Category::Transport,
                Evidence::DispatchUncertain,
                Reason::CallbackDeadline
            )
        );
    }
    assert_eq!(client.inner_callback_threads(), MAX_DELIVERY_THREADS);
    let before = p.requests.load(Ordering::SeqCst);
    let e = client.exec_with("dev", &echo(), |_| {}).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::AdmissionExhausted, Evidence::NotDispatched)
    );
    assert_eq!(
        p.requests.load(Ordering::SeqCst),
        before,
        "a refused call sent a request"
    );
    drop(release_tx);
}
