//! Fuzzing and test entry points for the response decoder (not API).
//!
//! [`fuzz_response`] is the body of the `http_response` cargo-fuzz target
//! and of the seed-corpus replay test; [`drive`] runs an exchange over a
//! byte stream split into pieces and records what it reported.

use std::time::{Duration, Instant};

use super::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request, ResponseHead};
use crate::error::{Error, Operation};

/// Everything an exchange reported over one byte stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transcript {
    /// Heads reported (at most one).
    pub heads: Vec<ResponseHead>,
    /// Body bytes, concatenated.
    pub body: Vec<u8>,
    /// True when `End` was reported.
    pub ended: bool,
    /// The error, if any.
    pub error: Option<Error>,
    /// `is_reusable()` at the end.
    pub reusable: bool,
}

/// Runs an exchange for `request` under `config`: transmits the request,
/// feeds `pieces` one by one (draining events after each), then EOF when
/// `eof`. Stops feeding after an error.
pub fn drive<'a>(
    request: &Request,
    config: &ExchangeConfig,
    now: Instant,
    pieces: impl IntoIterator<Item = &'a [u8]>,
    eof: bool,
) -> Transcript {
    let mut t = Transcript {
        heads: Vec::new(),
        body: Vec::new(),
        ended: false,
        error: None,
        reusable: false,
    };
    let mut exchange = match HttpExchange::new(request, config, now) {
        Ok(x) => x,
        Err(e) => {
            t.error = Some(e);
            return t;
        }
    };
    let mut wire = Vec::new();
    let _ = exchange.poll_transmit(&mut wire);
    let drain = |x: &mut HttpExchange, t: &mut Transcript| {
        while let Some(ev) = x.poll_event() {
            match ev {
                HttpEvent::Head(h) => t.heads.push(h),
                HttpEvent::Data(d) => t.body.extend_from_slice(d),
                HttpEvent::End => t.ended = true,
                HttpEvent::Failed(e) => {
                    t.error = Some(e);
                    return;
                }
            }
        }
    };
    for piece in pieces {
        if exchange.handle_input(now, piece).is_err() {
            break;
        }
        drain(&mut exchange, &mut t);
    }
    if eof && t.error.is_none() {
        exchange.handle_eof(now);
        drain(&mut exchange, &mut t);
    }
    t.reusable = exchange.is_reusable();
    t
}

/// A config chosen by a fuzz input's first byte: defaults or tight limits.
pub fn fuzz_config(selector: u8, deadline: Instant) -> ExchangeConfig {
    let mut c = ExchangeConfig::new("fuzz.invalid", deadline);
    match selector % 4 {
        0 => {}
        1 => {
            c.max_head_bytes = 256;
            c.max_headers = 8;
            c.max_response_body = 64;
            c.max_chunk_extension = 8;
            c.max_trailer_bytes = 16;
        }
        2 => c.max_head_bytes = 64,
        _ => c.max_response_body = 16,
    }
    c
}

/// The response-decoder fuzz body. `data[0]` picks the limits, `data[1]`
/// the read split, the rest is the response. Runs the stream whole, in
/// pieces, and byte by byte (when short) and asserts that every run reports
/// the same thing and that no limit is exceeded. Never panics otherwise.
#[allow(clippy::disallowed_methods)] // only an arbitrary origin; time never advances
pub fn fuzz_response(data: &[u8]) {
    let [selector, split, input @ ..] = data else {
        return;
    };
    let now = Instant::now();
    let config = fuzz_config(*selector, now + Duration::from_secs(60));
    let request = Request::new(Operation::Http, Method::Post, "/fuzz".into())
        .body("application/json", &b"{}"[..]);
    let whole = drive(&request, &config, now, [input], true);
    let step = 1 + usize::from(*split % 17);
    let pieces = drive(&request, &config, now, input.chunks(step), true);
    assert_eq!(whole, pieces, "split {step} changed the outcome");
    if input.len() <= 4096 {
        let bytes = drive(&request, &config, now, input.chunks(1), true);
        assert_eq!(whole, bytes, "byte-by-byte changed the outcome");
    }
    assert!(whole.heads.len() <= 1);
    assert!(whole.body.len() as u64 <= config.max_response_body);
    if let Some(e) = whole.error {
        assert!(e.may_have_reached_worker(), "{e:?}");
        assert!(!whole.reusable);
    }
}
