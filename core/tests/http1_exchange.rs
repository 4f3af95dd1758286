//! Byte-in / event-out tests of `core::http1::HttpExchange`: framing,
//! interim replies, refusals, evidence, timers, keep-alive, and every limit
//! at N (accepted) and N+1 (refused), fed whole and byte by byte.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use smolbox_core::Reason;
use std::time::{Duration, Instant};

use smolbox_core::http1::fuzzing::{Transcript, drive};
use smolbox_core::http1::{
    ExchangeConfig, HttpEvent, HttpExchange, MAX_REQUEST_BODY_CEILING, Method, Request, Timer,
    status_error,
};
use smolbox_core::{Category, Error, Evidence, Operation, Secret};

#[allow(clippy::disallowed_methods)] // an arbitrary origin; tests move time by hand
fn t0() -> Instant {
    Instant::now()
}

fn config(now: Instant) -> ExchangeConfig {
    ExchangeConfig::new("worker:1", now + Duration::from_secs(30))
}

fn get() -> Request {
    Request::new(Operation::Get, Method::Get, "/api/v1/machines/m".into())
        .accept("application/json")
}

/// Runs `reply` whole and byte by byte (EOF at the end); both must agree.
fn run_with(config: &ExchangeConfig, reply: &[u8], eof: bool) -> Transcript {
    let now = t0();
    let whole = drive(&get(), config, now, [reply], eof);
    let bytes = drive(&get(), config, now, reply.chunks(1), eof);
    assert_eq!(whole, bytes, "chunking changed the outcome");
    whole
}

fn run(reply: &[u8], eof: bool) -> Transcript {
    run_with(&config(t0()), reply, eof)
}

fn failed(ev: Option<HttpEvent<'_>>) -> Error {
    match ev {
        Some(HttpEvent::Failed(e)) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn err(t: &Transcript) -> Error {
    t.error.unwrap()
}

#[test]
fn content_length_body_is_reusable() {
    let t = run(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        false,
    );
    assert_eq!(
        (t.heads[0].status, t.body.as_slice(), t.ended),
        (200, &b"{}"[..], true)
    );
    assert!(t.heads[0].media_type_is("application/json"));
    assert!(t.reusable);
}

#[test]
fn chunked_body_with_extension_and_trailers() {
    let t = run(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n",
        false,
    );
    assert_eq!(t.body, b"abc0123456789");
    assert!(t.ended && t.reusable && t.heads[0].chunked);
}

#[test]
fn read_to_close_body_ends_at_eof_and_is_not_reusable() {
    let t = run(b"HTTP/1.1 200 OK\r\n\r\nall of it", true);
    assert_eq!(
        (t.body.as_slice(), t.ended, t.reusable),
        (&b"all of it"[..], true, false)
    );
    let t = run(b"HTTP/1.1 200 OK\r\n\r\nall of it", false);
    assert!(!t.ended && t.error.is_none());
}

#[test]
fn interim_replies_are_skipped_but_101_is_final() {
    let t = run(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
        false,
    );
    assert_eq!((t.heads.len(), t.heads[0].status, t.ended), (1, 201, true));

    let now = t0();
    let mut x = HttpExchange::new(&get(), &config(now), now).unwrap();
    let _ = x.poll_transmit(&mut Vec::new());
    x.handle_input(
        now,
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x00",
    )
    .unwrap();
    assert!(matches!(x.poll_event(), Some(HttpEvent::Head(h)) if h.status == 101));
    assert_eq!(x.poll_event(), Some(HttpEvent::End));
    assert_eq!(x.poll_event(), None);
    assert_eq!(x.leftover(), b"\x81\x00");
    assert!(!x.is_reusable());
}

#[test]
fn no_body_statuses_end_at_once() {
    for status in ["204 No Content", "304 Not Modified"] {
        let t = run(format!("HTTP/1.1 {status}\r\n\r\n").as_bytes(), false);
        assert!(t.ended && t.body.is_empty() && t.reusable, "{status}");
    }
}

#[test]
fn redirect_is_reported_not_followed() {
    let t = run(
        b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n",
        false,
    );
    assert_eq!((t.heads[0].status, t.ended), (302, true));
    let e = status_error(Operation::Get, 302);
    assert_eq!(
        (e.category(), e.evidence(), e.status()),
        (Category::Protocol, Evidence::DispatchUncertain, Some(302))
    );
}

#[test]
fn peer_protocol_violations() {
    let cases: [(&[u8], Reason); 9] = [
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 0\r\n\r\n",
            Reason::ContentEncoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: a/b\r\nContent-Type: a/b\r\n\r\n",
            Reason::DuplicateContentType,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
            Reason::DuplicateContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            Reason::ContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
            Reason::ContentLengthAndTransferEncoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            Reason::TransferEncoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            Reason::ChunkSize,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX",
            Reason::ChunkMissingCrlf,
        ),
        (b"SSH-2.0-OpenSSH\r\n\r\n", Reason::MalformedHead),
    ];
    for (reply, reason) in cases {
        let e = err(&run(reply, true));
        assert_eq!(
            (e.category(), e.reason()),
            (Category::Protocol, reason),
            "{reason}"
        );
        assert_eq!(
            (e.operation(), e.evidence()),
            (Operation::Get, Evidence::DispatchUncertain)
        );
    }
}

#[test]
fn truncation_and_early_close_are_transport_errors() {
    let cases: [(&[u8], Reason); 4] = [
        (b"", Reason::EarlyClose),
        (b"HTTP/1.1 200 OK\r\nContent-Le", Reason::EarlyClose),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
            Reason::Truncated,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
            Reason::Truncated,
        ),
    ];
    for (reply, reason) in cases {
        let e = err(&run(reply, true));
        assert_eq!(
            (e.category(), e.reason(), e.evidence()),
            (Category::Transport, reason, Evidence::DispatchUncertain)
        );
    }
}

#[test]
fn reuse_rules() {
    let not_reusable: [&[u8]; 3] = [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naEXTRA",
    ];
    for reply in not_reusable {
        let t = run(reply, false);
        assert!(t.ended && !t.reusable);
    }
    let mut c = config(t0());
    c.keep_alive = false;
    let mut wire = Vec::new();
    let _ = HttpExchange::new(&get(), &c, t0())
        .unwrap()
        .poll_transmit(&mut wire);
    assert!(
        String::from_utf8(wire)
            .unwrap()
            .contains("\r\nConnection: close\r\n")
    );
}

#[test]
fn one_connection_carries_exchanges_in_sequence() {
    let now = t0();
    let c = config(now);
    for n in 0..3u8 {
        let mut x = HttpExchange::new(&get(), &c, now).unwrap();
        assert!(x.poll_transmit(&mut Vec::new()));
        x.handle_input(
            now,
            &[
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n".as_slice(),
                &[b'0' + n],
            ]
            .concat(),
        )
        .unwrap();
        let mut body = Vec::new();
        while let Some(ev) = x.poll_event() {
            if let HttpEvent::Data(d) = ev {
                body.extend_from_slice(d);
            }
        }
        assert_eq!(body, [b'0' + n]);
        assert!(x.is_reusable());
    }
}

#[test]
fn errors_are_sticky_and_carry_no_peer_bytes() {
    let now = t0();
    let mut x = HttpExchange::new(
        &get(),
        &config(now).bearer(Secret::new("SENTINEL-TOKEN")),
        now,
    )
    .unwrap();
    let _ = x.poll_transmit(&mut Vec::new());
    x.handle_input(
        now,
        b"HTTP/1.1 200 OK\r\nContent-Encoding: SENTINEL-PEER\r\n\r\n",
    )
    .unwrap();
    let e = failed(x.poll_event());
    // The failure is the last event; it stays readable.
    assert_eq!(x.poll_event(), None);
    assert_eq!(x.error(), Some(e));
    assert_eq!(x.handle_input(now, b"more").unwrap_err(), e);
    assert!(!x.poll_transmit(&mut Vec::new()));
    assert_eq!(x.poll_timeout(), None);
    let shown = format!("{e} {e:?} {x:?}");
    assert!(!shown.contains("SENTINEL"), "{shown}");
}

#[test]
fn request_body_cap_at_n_and_n_plus_one() {
    let now = t0();
    let mut c = config(now);
    c.max_request_body = 10;
    let post = |n: usize| {
        Request::new(Operation::Create, Method::Post, "/m".into())
            .body("application/json", vec![b'x'; n])
    };
    let mut wire = Vec::new();
    let mut x = HttpExchange::new(&post(10), &c, now).unwrap();
    assert!(x.poll_transmit(&mut wire));
    let text = String::from_utf8(wire).unwrap();
    assert!(
        text.contains("\r\nContent-Type: application/json\r\nContent-Length: 10\r\n")
            && text.ends_with("\r\n\r\nxxxxxxxxxx"),
        "{text}"
    );
    let e = HttpExchange::new(&post(11), &c, now).unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence()),
        (
            Category::Validation,
            Operation::RequestSize,
            Evidence::NotDispatched
        )
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((11, 10)));
}

#[test]
fn config_ranges_at_n_and_n_plus_one() {
    let now = t0();
    let check = |f: &dyn Fn(&mut ExchangeConfig), ok: bool| {
        let mut c = config(now);
        f(&mut c);
        assert_eq!(c.validate().is_ok(), ok);
        assert_eq!(HttpExchange::new(&get(), &c, now).is_ok(), ok);
    };
    check(&|c| c.max_request_body = MAX_REQUEST_BODY_CEILING, true);
    check(
        &|c| c.max_request_body = MAX_REQUEST_BODY_CEILING + 1,
        false,
    );
    check(&|c| c.max_request_body = 1, true);
    check(&|c| c.max_request_body = 0, false);
    check(&|c| c.max_headers = 256, true);
    check(&|c| c.max_headers = 257, false);
    check(&|c| c.max_response_body = 32 << 20, true);
    check(&|c| c.max_response_body = (32 << 20) + 1, false);
    check(&|c| c.max_head_bytes = 256 << 10, true);
    check(&|c| c.max_head_bytes = (256 << 10) + 1, false);
    check(&|c| c.idle_timeout = Some(Duration::ZERO), false);
}

fn head_of_len(n: usize) -> Vec<u8> {
    let fixed = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX: \r\n\r\n".len();
    let mut s = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX: ".to_vec();
    s.extend(std::iter::repeat_n(b'p', n - fixed));
    s.extend_from_slice(b"\r\n\r\n");
    assert_eq!(s.len(), n);
    s
}

#[test]
fn head_bytes_at_n_and_n_plus_one() {
    let mut c = config(t0());
    c.max_head_bytes = 100;
    let t = run_with(&c, &head_of_len(100), false);
    assert!(t.ended && t.error.is_none());
    let e = err(&run_with(&c, &head_of_len(101), false));
    assert_eq!(
        (e.category(), e.reason()),
        (Category::OutputLimit, Reason::HeadBytes)
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((101, 100)));
    // Interim heads count toward the same cap.
    let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut reply = interim.to_vec();
    reply.extend(head_of_len(100 - interim.len()));
    assert!(run_with(&c, &reply, false).ended);
    let mut reply = interim.to_vec();
    reply.extend(head_of_len(101 - interim.len()));
    assert_eq!(
        err(&run_with(&c, &reply, false)).reason(),
        Reason::HeadBytes
    );
}

#[test]
fn header_count_at_n_and_n_plus_one() {
    let mut c = config(t0());
    c.max_headers = 5;
    let reply = |n: usize| {
        let mut s = String::from("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n");
        for i in 1..n {
            s.push_str(&format!("X-{i}: v\r\n"));
        }
        s + "\r\n"
    };
    assert!(run_with(&c, reply(5).as_bytes(), false).ended);
    let e = err(&run_with(&c, reply(6).as_bytes(), false));
    assert_eq!(
        (e.category(), e.reason()),
        (Category::OutputLimit, Reason::HeaderCount)
    );
}

#[test]
fn response_body_cap_at_n_and_n_plus_one() {
    let mut c = config(t0());
    c.max_response_body = 8;
    let ok_and_over: [(&[u8], &[u8]); 2] = [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n12345678",
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n123456789",
        ),
        (
            b"HTTP/1.1 200 OK\r\n\r\n12345678",
            b"HTTP/1.1 200 OK\r\n\r\n123456789",
        ),
    ];
    for (ok, over) in ok_and_over {
        let t = run_with(&c, ok, true);
        assert!(t.ended && t.error.is_none(), "{t:?}");
        let t = run_with(&c, over, true);
        let e = err(&t);
        assert_eq!(
            (e.category(), e.reason(), e.evidence()),
            (
                Category::OutputLimit,
                Reason::ResponseBody,
                Evidence::DispatchUncertain
            )
        );
        assert!(t.body.len() <= 8, "buffered beyond the cap");
    }
    // Chunked: "1\r\na\r\n0\r\n\r\n" is 11 raw bytes.
    c.max_response_body = 11;
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n";
    assert!(run_with(&c, chunked, true).ended);
    c.max_response_body = 10;
    assert_eq!(
        err(&run_with(&c, chunked, true)).reason(),
        Reason::ResponseBody
    );
}

#[test]
fn timers_idle_and_deadline() {
    let now = t0();
    let mut c = config(now);
    c.idle_timeout = Some(Duration::from_secs(5));
    let mut x = HttpExchange::new(&get(), &c, now).unwrap();
    // Before any byte left: only the deadline, and its error is not_dispatched.
    assert_eq!(
        x.poll_timeout(),
        Some((now + Duration::from_secs(30), Timer::Deadline))
    );
    let mut early = HttpExchange::new(&get(), &c, now).unwrap();
    early.handle_timeout(now + Duration::from_secs(30));
    let e = failed(early.poll_event());
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Transport,
            Reason::Deadline,
            Evidence::NotDispatched
        )
    );

    let t1 = now + Duration::from_secs(1);
    x.handle_timeout(t1); // early: no-op
    assert!(x.poll_transmit(&mut Vec::new()));
    assert_eq!(
        x.poll_timeout(),
        Some((t1 + Duration::from_secs(5), Timer::Idle))
    );
    let t2 = now + Duration::from_secs(4);
    x.handle_input(t2, b"HTTP/1.1 200 OK\r\n").unwrap();
    assert_eq!(x.poll_event(), None);
    assert_eq!(
        x.poll_timeout(),
        Some((t2 + Duration::from_secs(5), Timer::Idle))
    );
    x.handle_timeout(t2 + Duration::from_secs(4)); // early: no-op
    assert_eq!(x.poll_event(), None);
    x.handle_timeout(t2 + Duration::from_secs(5));
    let e = failed(x.poll_event());
    assert_eq!(
        (e.category(), e.reason(), e.evidence()),
        (
            Category::Transport,
            Reason::IdleTimeout,
            Evidence::DispatchUncertain
        )
    );

    // Without idle, the deadline governs, and it fires as dispatch_uncertain.
    let mut x = HttpExchange::new(&get(), &c, now).unwrap();
    x.set_idle_timeout(None);
    let _ = x.poll_transmit(&mut Vec::new());
    assert_eq!(
        x.poll_timeout(),
        Some((now + Duration::from_secs(30), Timer::Deadline))
    );
    x.handle_timeout(now + Duration::from_secs(31));
    let e = failed(x.poll_event());
    assert_eq!(
        (e.reason(), e.evidence()),
        (Reason::Deadline, Evidence::DispatchUncertain)
    );

    // A deadline already passed refuses the exchange before any byte exists.
    let e = HttpExchange::new(&get(), &c, now + Duration::from_secs(30)).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::Transport, Evidence::NotDispatched)
    );
}

#[test]
fn no_timers_after_end() {
    let now = t0();
    let mut x = HttpExchange::new(&get(), &config(now), now).unwrap();
    let _ = x.poll_transmit(&mut Vec::new());
    x.handle_input(now, b"HTTP/1.1 204 No Content\r\n\r\n")
        .unwrap();
    while x.poll_event().is_some() {}
    assert!(x.is_finished());
    assert_eq!(x.poll_timeout(), None);
    x.handle_timeout(now + Duration::from_secs(3600));
    assert!(x.is_finished() && x.error().is_none());
}

#[test]
fn a_huge_caller_built_idle_timeout_saturates_instead_of_panicking() {
    let now = t0();
    let mut c = config(now);
    c.idle_timeout = Some(Duration::MAX);
    let mut x = HttpExchange::new(&get(), &c, now).unwrap();
    assert!(x.poll_transmit(&mut Vec::new()));
    // Past `Instant`'s range the idle timer never fires; the deadline holds.
    assert_eq!(
        x.poll_timeout(),
        Some((now + Duration::from_secs(30), Timer::Deadline))
    );
    x.handle_input(now + Duration::from_secs(1), b"HTTP/1.1 200 OK\r\n")
        .unwrap();
    x.handle_timeout(now + Duration::from_secs(30));
    assert_eq!(failed(x.poll_event()).reason(), Reason::Deadline);
}

/// What an upload's progress shows: the body bytes the socket took, never
/// the head's, and never more than the body.
#[test]
fn body_written_counts_request_body_bytes_the_socket_took() {
    let now = t0();
    let req = Request::new(
        Operation::Upload,
        Method::Put,
        "/api/v1/machines/m/files/f".into(),
    )
    .body("application/octet-stream", vec![b'x'; 100]);
    let mut ex = HttpExchange::new(&req, &config(now), now).unwrap();
    assert_eq!(ex.body_written(), 0);
    let mut out = Vec::new();
    assert!(ex.poll_transmit(&mut out));
    let head = out.len() - 100;
    ex.handle_written(now, head - 1);
    assert_eq!(ex.body_written(), 0, "part of the head");
    ex.handle_written(now, 1);
    assert_eq!(ex.body_written(), 0, "the whole head");
    ex.handle_written(now, 40);
    assert_eq!(ex.body_written(), 40);
    ex.handle_written(now, 60);
    assert_eq!(ex.body_written(), 100);
}

/// An upload's progress is reported once per change of the body count,
/// the first time even at 0.
#[test]
fn body_progress_is_reported_once_per_change() {
    let now = t0();
    let req = Request::new(
        Operation::Upload,
        Method::Put,
        "/api/v1/machines/m/files/f".into(),
    )
    .body("application/octet-stream", vec![b'x'; 100]);
    let mut ex = HttpExchange::new(&req, &config(now), now).unwrap();
    assert_eq!(ex.poll_body_progress(), Some(0));
    assert_eq!(ex.poll_body_progress(), None);
    let mut out = Vec::new();
    assert!(ex.poll_transmit(&mut out));
    ex.handle_written(now, out.len() - 100);
    assert_eq!(ex.poll_body_progress(), None, "only the head went");
    ex.handle_written(now, 40);
    assert_eq!(ex.poll_body_progress(), Some(40));
    assert_eq!(ex.poll_body_progress(), None);
    ex.handle_written(now, 60);
    assert_eq!(ex.poll_body_progress(), Some(100));
}
