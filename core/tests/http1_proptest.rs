//! Properties of `core::http1`: any split of the input gives the same events,
//! errors and limit verdicts; valid responses decode to their body; request
//! encoding round-trips through `httparse::Request`.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use std::time::{Duration, Instant};

use proptest::prelude::*;
use smolbox_core::http1::encode::{push_path_segment, push_query_component};
use smolbox_core::http1::fuzzing::{drive, fuzz_config};
use smolbox_core::http1::{ExchangeConfig, HttpExchange, Method, Request};
use smolbox_core::{Operation, Secret};

#[allow(clippy::disallowed_methods)] // an arbitrary origin; time never advances here
fn t0() -> Instant {
    Instant::now()
}

fn request() -> Request {
    Request::new(Operation::Exec, Method::Post, "/x".into()).body("application/json", &b"{}"[..])
}

#[derive(Clone, Debug)]
enum Framing {
    Length,
    Chunked {
        sizes: Vec<usize>,
        ext: bool,
        trailer: bool,
    },
    Close,
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        Just(Framing::Length),
        (
            prop::collection::vec(1usize..300, 0..8),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(sizes, ext, trailer)| Framing::Chunked {
                sizes,
                ext,
                trailer
            }),
        Just(Framing::Close),
    ]
}

/// A valid response with `body` framed as `framing` (chunk sizes cycle
/// until the body is used up).
fn response(status: u16, extra: &[(String, String)], framing: &Framing, body: &[u8]) -> Vec<u8> {
    let mut r = format!("HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n");
    for (n, v) in extra {
        r.push_str(&format!("X-{n}: {v}\r\n"));
    }
    let mut out;
    match framing {
        Framing::Length => {
            r.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
            out = r.into_bytes();
            out.extend_from_slice(body);
        }
        Framing::Close => {
            r.push_str("\r\n");
            out = r.into_bytes();
            out.extend_from_slice(body);
        }
        Framing::Chunked {
            sizes,
            ext,
            trailer,
        } => {
            r.push_str("Transfer-Encoding: chunked\r\n\r\n");
            out = r.into_bytes();
            let mut rest = body;
            let mut i = 0;
            while !rest.is_empty() {
                let n = sizes
                    .get(i % sizes.len().max(1))
                    .copied()
                    .unwrap_or(rest.len())
                    .min(rest.len());
                out.extend_from_slice(
                    format!("{n:x}{}\r\n", if *ext { ";k=v" } else { "" }).as_bytes(),
                );
                out.extend_from_slice(&rest[..n]);
                out.extend_from_slice(b"\r\n");
                rest = &rest[n..];
                i += 1;
            }
            out.extend_from_slice(b"0\r\n");
            if *trailer {
                out.extend_from_slice(b"X-Checksum: 1\r\n");
            }
            out.extend_from_slice(b"\r\n");
        }
    }
    out
}

fn split<'a>(input: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    let mut rest = input;
    let mut i = 0;
    while !rest.is_empty() {
        let n = cuts
            .get(i % cuts.len().max(1))
            .copied()
            .unwrap_or(rest.len())
            .clamp(1, rest.len());
        pieces.push(&rest[..n]);
        rest = &rest[n..];
        i += 1;
    }
    pieces
}

fn header() -> impl Strategy<Value = (String, String)> {
    ("[a-z]{1,8}", "[ -~]{0,20}").prop_map(|(n, v)| (n, v.trim().to_owned()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn valid_responses_decode_the_same_whatever_the_split(
        status in prop_oneof![Just(200u16), Just(201), Just(404), Just(500)],
        extra in prop::collection::vec(header(), 0..6),
        framing in framing(),
        body in prop::collection::vec(any::<u8>(), 0..1500),
        cuts in prop::collection::vec(1usize..200, 1..8),
    ) {
        let now = t0();
        let config = ExchangeConfig::new("h", now + Duration::from_secs(9));
        let input = response(status, &extra, &framing, &body);
        let whole = drive(&request(), &config, now, [input.as_slice()], true);
        let pieces = drive(&request(), &config, now, split(&input, &cuts), true);
        prop_assert_eq!(&whole, &pieces);
        prop_assert_eq!(whole.error, None);
        prop_assert!(whole.ended);
        prop_assert_eq!(&whole.body, &body);
        prop_assert_eq!(whole.heads[0].status, status);
    }

    #[test]
    fn mutated_responses_give_the_same_verdict_whatever_the_split(
        selector in any::<u8>(),
        framing in framing(),
        body in prop::collection::vec(any::<u8>(), 0..300),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 0..4),
        cuts in prop::collection::vec(1usize..40, 1..8),
        eof in any::<bool>(),
    ) {
        let now = t0();
        let config = fuzz_config(selector, now + Duration::from_secs(9));
        let mut input = response(200, &[], &framing, &body);
        for (at, byte, kind) in edits {
            let at = at % (input.len() + 1);
            match kind {
                0 if at < input.len() => input[at] = byte,
                1 if at < input.len() => { input.remove(at); }
                _ => input.insert(at, byte),
            }
        }
        let whole = drive(&request(), &config, now, [input.as_slice()], eof);
        let pieces = drive(&request(), &config, now, split(&input, &cuts), eof);
        let bytes = drive(&request(), &config, now, input.chunks(1), eof);
        prop_assert_eq!(&whole, &pieces);
        prop_assert_eq!(&whole, &bytes);
        prop_assert!(whole.body.len() as u64 <= config.max_response_body);
    }

    #[test]
    fn request_encoding_round_trips_through_httparse(
        method in prop_oneof![Just(Method::Get), Just(Method::Post), Just(Method::Put), Just(Method::Delete)],
        segments in prop::collection::vec("\\PC{0,12}", 1..4),
        query in prop::option::of("\\PC{0,16}"),
        host in "[a-z0-9.-]{1,20}(:[0-9]{1,5})?",
        token in prop::option::of("[A-Za-z0-9._~+/=-]{1,40}"),
        body in prop::collection::vec(any::<u8>(), 0..200),
        accept in any::<bool>(),
    ) {
        let mut target = String::new();
        for s in &segments {
            target.push('/');
            push_path_segment(&mut target, s);
        }
        if let Some(q) = &query {
            target.push_str("?q=");
            push_query_component(&mut target, q);
        }
        let mut request = Request::new(Operation::Exec, method, target.clone());
        if accept {
            request = request.accept("application/json");
        }
        if !body.is_empty() {
            request = request.body("application/octet-stream", body.clone());
        }
        let now = t0();
        let mut config = ExchangeConfig::new(host.clone(), now + Duration::from_secs(9));
        if let Some(t) = &token {
            config = config.bearer(Secret::new(t.as_str()));
        }
        let mut wire = Vec::new();
        prop_assert!(HttpExchange::new(&request, &config, now).unwrap().poll_transmit(&mut wire));

        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut parsed = httparse::Request::new(&mut headers);
        let n = match parsed.parse(&wire).unwrap() {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("partial"),
        };
        prop_assert_eq!(parsed.method, Some(method.as_str()));
        prop_assert_eq!(parsed.path, Some(target.as_str()));
        prop_assert_eq!(parsed.version, Some(1));
        let get = |name: &str| parsed.headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value).collect::<Vec<_>>();
        prop_assert_eq!(get("host"), vec![host.as_bytes()]);
        let auth = token.as_ref().map(|t| format!("Bearer {t}"));
        prop_assert_eq!(get("authorization"), auth.iter().map(|a| a.as_bytes()).collect::<Vec<_>>());
        prop_assert_eq!(get("accept-encoding"), vec![&b"identity"[..]]);
        prop_assert_eq!(get("accept").len(), usize::from(accept));
        let expect_cl = !body.is_empty() || matches!(method, Method::Post | Method::Put);
        let cl = body.len().to_string();
        prop_assert_eq!(get("content-length"), if expect_cl { vec![cl.as_bytes()] } else { vec![] });
        prop_assert_eq!(&wire[n..], body.as_slice());
    }
}
