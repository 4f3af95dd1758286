//! One probe run as a sans-IO [`Machine`] over one connection, written
//! once for both shells: [`Probe`] wraps the core's `HttpExchange` (modes
//! `http`, `sse`) or `WsClient` (`ws`, `ws-echo`), decides what to send
//! (the `--send` messages, echoes, the flood, the close after `--recv`) and
//! turns what happens into the probe's output lines, which come out of
//! [`Machine::poll_event`]. Each shell drives it with its one generic
//! driver, exactly as it drives the core's objects.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use smolbox_core::http1::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request, ResponseHead};
use smolbox_core::sse::{self, SseParser};
use smolbox_core::ws::{CloseCode, MAX_WS_TIMER, WsClient, WsConfig, WsEvent};
use smolbox_core::{Category, Machine, Operation, TransportFailure};

use crate::{Fail, Opts, classify, hex};

/// Size of one flood message.
pub const FLOOD_MESSAGE: usize = 64 * 1024;
/// Largest SSE chunk the parser takes at once (a shell's read size).
const SSE_CHUNK: usize = 64 * 1024;

/// One probe run (see the module docs).
pub struct Probe {
    kind: Kind,
    lines: VecDeque<Value>,
    /// The run's outcome, once decided (the last line says it too).
    outcome: Option<Result<(), Fail>>,
    /// The probe itself ended the run: nothing more is sent.
    abandoned: bool,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("lines", &self.lines.len())
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

enum Kind {
    Http { ex: Box<HttpExchange>, body: Body },
    Ws(Box<WsRun>),
}

/// What an HTTP mode does with the reply.
enum Body {
    /// `http`: one JSON document.
    Json { status: u16, bytes: Vec<u8> },
    /// `sse`: every event, then `end`.
    Sse(Box<SseParser>),
}

struct WsRun {
    ws: WsClient,
    deadline: Instant,
    echo: bool,
    opened: bool,
    received: usize,
    recv: Option<usize>,
    close_now: bool,
    /// Messages still to send, in order: `--send` ones, then echoes.
    sends: VecDeque<(bool, Vec<u8>)>,
    replies: VecDeque<(bool, Vec<u8>)>,
    flood: Option<u64>,
    flooded: u64,
}

impl Probe {
    /// The operation the connection is for (`connect` errors name it).
    pub fn operation(opts: &Opts) -> Operation {
        match opts.mode.as_str() {
            "http" => Operation::Http,
            "sse" => Operation::Sse,
            _ => Operation::WebSocket,
        }
    }

    /// A run of `opts`' mode starting at `now`, its deadline `deadline`.
    ///
    /// # Errors
    /// The core's refusal of the options; no randomness for the WebSocket
    /// key.
    pub fn new(opts: &Opts, now: Instant, deadline: Instant) -> Result<Self, Fail> {
        let kind = match opts.mode.as_str() {
            "http" => {
                let mut request =
                    Request::new(Operation::Http, opts.method, opts.url.target.clone())
                        .accept("application/json");
                if let Some(doc) = &opts.json {
                    request = request.body("application/json", doc.clone().into_bytes());
                }
                let body = Body::Json {
                    status: 0,
                    bytes: Vec::new(),
                };
                Kind::Http {
                    ex: Box::new(exchange(opts, &request, now, deadline)?),
                    body,
                }
            }
            "sse" => {
                let request = Request::new(Operation::Sse, Method::Get, opts.url.target.clone())
                    .accept("text/event-stream");
                let parser = SseParser::new(sse::Config {
                    max_line_len: opts.max_line,
                    max_event_len: opts.max_event,
                    max_chunk_len: SSE_CHUNK.max(opts.max_line),
                    operation: Operation::Sse,
                });
                Kind::Http {
                    ex: Box::new(exchange(opts, &request, now, deadline)?),
                    body: Body::Sse(Box::new(parser)),
                }
            }
            _ => Kind::Ws(Box::new(WsRun::new(opts, now, deadline)?)),
        };
        Ok(Self {
            kind,
            lines: VecDeque::new(),
            outcome: None,
            abandoned: false,
        })
    }

    /// The run's outcome, once decided.
    pub fn outcome(&self) -> Option<&Result<(), Fail>> {
        self.outcome.as_ref()
    }

    fn fail(&mut self, f: Fail) {
        if self.outcome.is_none() {
            self.lines.push_back(f.to_json());
            self.outcome = Some(Err(f));
        }
    }

    fn succeed(&mut self, last: Value) {
        if self.outcome.is_none() {
            self.lines.push_back(last);
            self.outcome = Some(Ok(()));
        }
    }

    /// Takes what the wrapped object decided after an input.
    fn step(&mut self, now: Instant) {
        if self.outcome.is_some() {
            return;
        }
        let r = match &mut self.kind {
            Kind::Http { ex, body } => http_step(ex, body, &mut self.lines),
            Kind::Ws(run) => run.step(now, &mut self.lines),
        };
        match r {
            Ok(None) => {}
            Ok(Some(last)) => self.succeed(last),
            Err((f, abandon)) => {
                self.abandoned |= abandon;
                self.fail(f);
            }
        }
    }
}

fn exchange(
    opts: &Opts,
    request: &Request,
    now: Instant,
    deadline: Instant,
) -> Result<HttpExchange, Fail> {
    let mut config = ExchangeConfig::new(opts.url.host_header.clone(), deadline);
    config.max_response_body = opts.max_body;
    config.max_head_bytes = opts.max_header;
    config.idle_timeout = Some(opts.idle);
    config.keep_alive = false;
    HttpExchange::new(request, &config, now).map_err(|e| classify(&e, false))
}

/// A step's result: nothing yet, the final line, or a failure (and
/// whether the probe itself ends the run, sending nothing more).
type Step = Result<Option<Value>, (Fail, bool)>;

fn check_head(h: &ResponseHead, media_type: &'static str) -> Result<(), Fail> {
    if !(200..300).contains(&h.status) {
        return Err(Fail {
            status: Some(h.status),
            ..Fail::new("status", format!("status {}", h.status))
        });
    }
    if !h.media_type_is(media_type) {
        return Err(Fail::new("content_type", format!("expected {media_type}")));
    }
    Ok(())
}

fn http_step(ex: &mut HttpExchange, body: &mut Body, lines: &mut VecDeque<Value>) -> Step {
    let abandon = |f| Err((f, true));
    while let Some(ev) = ex.poll_event() {
        match (ev, &mut *body) {
            (HttpEvent::Head(h), Body::Json { status, .. }) => {
                *status = h.status;
                if let Err(f) = check_head(&h, "application/json") {
                    return abandon(f);
                }
            }
            (HttpEvent::Head(h), Body::Sse(_)) => {
                if let Err(f) = check_head(&h, "text/event-stream") {
                    return abandon(f);
                }
            }
            (HttpEvent::Data(b), Body::Json { bytes, .. }) => bytes.extend_from_slice(b),
            (HttpEvent::Data(b), Body::Sse(parser)) => {
                if let Err(f) = sse_input(parser, b, lines) {
                    return abandon(f);
                }
            }
            (HttpEvent::End, Body::Json { status, bytes }) => {
                return match serde_json::from_slice::<Value>(bytes) {
                    Ok(doc) => Ok(Some(
                        json!({"kind": "response", "status": *status, "body": doc}),
                    )),
                    Err(e) => abandon(Fail::new("json", e.to_string())),
                };
            }
            (HttpEvent::End, Body::Sse(parser)) => {
                return match sse_end(parser, lines) {
                    Ok(end) => Ok(Some(end)),
                    Err(f) => abandon(f),
                };
            }
            (HttpEvent::Failed(e), _) => return Err((classify(&e, false), true)),
            _ => {}
        }
    }
    Ok(None)
}

fn sse_input(parser: &mut SseParser, b: &[u8], lines: &mut VecDeque<Value>) -> Result<(), Fail> {
    parser.handle_input(b).map_err(|e| classify(&e, false))?;
    while let Some(ev) = parser.poll_event().map_err(|e| classify(&e, false))? {
        lines.push_back(event_json(&ev));
    }
    Ok(())
}

fn sse_end(parser: &mut SseParser, lines: &mut VecDeque<Value>) -> Result<Value, Fail> {
    parser.finish().map_err(|e| classify(&e, false))?;
    while let Some(ev) = parser.poll_event().map_err(|e| classify(&e, false))? {
        lines.push_back(event_json(&ev));
    }
    Ok(json!({
        "kind": "end",
        "last_event_id": String::from_utf8_lossy(parser.last_event_id()),
        "retry_ms": parser.retry(),
    }))
}

fn event_json(ev: &sse::Event<'_>) -> Value {
    json!({
        "kind": "event",
        "event": String::from_utf8_lossy(ev.event_type()),
        "data": ev.data_lossy(),
        "id": String::from_utf8_lossy(ev.last_event_id()),
    })
}

impl WsRun {
    fn new(opts: &Opts, now: Instant, deadline: Instant) -> Result<Self, Fail> {
        let mut config = WsConfig::new(opts.url.host_header.clone(), opts.url.target.clone());
        config.max_frame_len = opts.max_frame;
        config.max_message_len = opts.max_message;
        config.handshake_timeout = opts.deadline.min(Duration::from_secs(30));
        // A silent peer (no frame, no pong to the keepalive ping) and a peer
        // that stops reading both end within the idle budget.
        let budget = (!opts.idle.is_zero()).then(|| opts.idle.min(MAX_WS_TIMER));
        config.idle_timeout = budget;
        config.write_wait = budget;
        let mut key = [0u8; 16];
        getrandom::getrandom(&mut key).map_err(|_| no_randomness())?;
        let ws = WsClient::new(config, key, now).map_err(|e| classify(&e, true))?;
        Ok(Self {
            ws,
            deadline,
            echo: opts.mode == "ws-echo",
            opened: false,
            received: 0,
            recv: opts.recv,
            close_now: false,
            sends: opts.sends.iter().cloned().collect(),
            replies: VecDeque::new(),
            flood: opts.flood,
            flooded: 0,
        })
    }

    /// True while the flood is still being queued. Then only the write
    /// bound (and the deadline) is timed: a flooding probe does not wait
    /// for the peer, so a peer that stops reading ends the run with
    /// `write_timeout`, not with the keepalive's `idle_timeout`.
    fn flooding(&self) -> bool {
        self.opened && !self.ws.is_close_sent() && self.flood.is_some_and(|t| self.flooded < t)
    }

    fn step(&mut self, now: Instant, lines: &mut VecDeque<Value>) -> Step {
        top_up(&mut self.ws).map_err(|f| (f, true))?;
        while let Some(ev) = self.ws.poll_event() {
            match ev {
                WsEvent::Open => self.opened = true,
                WsEvent::Text(t) => {
                    lines.push_back(json!({"kind": "message", "type": "text", "text": t, "len": t.len(), "sha256": hex(&Sha256::digest(t.as_bytes()))}));
                    self.received += 1;
                    if self.echo {
                        self.replies.push_back((true, t.as_bytes().to_vec()));
                    }
                }
                WsEvent::Binary(b) => {
                    lines.push_back(json!({"kind": "message", "type": "binary", "len": b.len(), "sha256": hex(&Sha256::digest(b))}));
                    self.received += 1;
                    if self.echo {
                        self.replies.push_back((false, b.to_vec()));
                    }
                }
                WsEvent::Closed(info) => {
                    let code = info.code.map_or(1005, CloseCode::as_u16);
                    return Ok(Some(
                        json!({"kind": "close", "code": code, "reason": info.reason.as_str()}),
                    ));
                }
                // The matching close code (1002/1007/1009) is queued by
                // the core; it still goes out.
                WsEvent::Failed(e) => return Err((classify(&e, !self.opened), false)),
                _ => {}
            }
            if self.recv.is_some_and(|n| self.received >= n) {
                self.close_now = true;
            }
        }
        self.fill(now).map_err(|f| (f, true))?;
        Ok(None)
    }

    /// Queues what may go out now: echoes, then (once open) the `--send`
    /// messages, the flood and the close. A full send buffer leaves the
    /// rest for after the next write.
    fn fill(&mut self, now: Instant) -> Result<(), Fail> {
        while let Some((text, payload)) = self.replies.front() {
            if !send(&mut self.ws, now, *text, payload)? {
                return Ok(());
            }
            self.replies.pop_front();
        }
        if !self.opened || self.ws.is_close_sent() {
            return Ok(());
        }
        while let Some((text, payload)) = self.sends.front() {
            if !send(&mut self.ws, now, *text, payload)? {
                return Ok(());
            }
            self.sends.pop_front();
        }
        while let Some(total) = self.flood.filter(|t| self.flooded < *t) {
            let n = usize::try_from((total - self.flooded).min(FLOOD_MESSAGE as u64))
                .unwrap_or(FLOOD_MESSAGE);
            if !send(&mut self.ws, now, false, &vec![0x5a; n])? {
                return Ok(());
            }
            self.flooded += n as u64;
        }
        if self.close_now {
            let _ = self.ws.close(now, CloseCode::NORMAL);
        }
        Ok(())
    }
}

/// Queues one message; false when the core's send buffer is full.
fn send(ws: &mut WsClient, now: Instant, text: bool, payload: &[u8]) -> Result<bool, Fail> {
    top_up(ws)?;
    let r = if text {
        match std::str::from_utf8(payload) {
            Ok(t) => ws.send_text(now, t),
            Err(_) => return Err(Fail::new("invalid_utf8", "text message is not UTF-8")),
        }
    } else {
        ws.send_binary(now, payload)
    };
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.category() == Category::AdmissionExhausted => Ok(false),
        Err(e) => Err(classify(&e, false)),
    }
}

fn top_up(ws: &mut WsClient) -> Result<(), Fail> {
    let wanted = ws.entropy_wanted();
    if wanted > 0 {
        let mut r = vec![0u8; wanted];
        getrandom::getrandom(&mut r).map_err(|_| no_randomness())?;
        ws.handle_entropy(&r);
    }
    Ok(())
}

fn no_randomness() -> Fail {
    Fail::new("connect", "no randomness")
}

/// Applies `f` to the wrapped object.
macro_rules! inner {
    ($self:ident, $m:ident => $e:expr) => {
        match &mut $self.kind {
            Kind::Http { ex, .. } => {
                let $m = &mut **ex;
                $e
            }
            Kind::Ws(run) => {
                let $m = &mut run.ws;
                $e
            }
        }
    };
}

impl Machine for Probe {
    type Event<'a> = Value;
    type Timer = ();

    fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        inner!(self, m => Machine::handle_input(m, now, bytes));
        self.step(now);
    }

    fn handle_eof(&mut self, now: Instant) {
        inner!(self, m => Machine::handle_eof(m, now));
        self.step(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Kind::Ws(run) = &self.kind {
            if now >= run.deadline {
                self.abandoned = true;
                self.fail(Fail::new("timeout", "deadline"));
                return;
            }
            if run.flooding() && run.ws.write_deadline().is_none_or(|at| now < at) {
                return;
            }
        }
        inner!(self, m => Machine::handle_timeout(m, now));
        self.step(now);
    }

    fn handle_written(&mut self, now: Instant, n: usize) {
        inner!(self, m => Machine::handle_written(m, now, n));
        self.step(now);
    }

    fn handle_transport_error(&mut self, now: Instant, failure: TransportFailure) {
        inner!(self, m => Machine::handle_transport_error(m, now, failure));
        self.step(now);
    }

    fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        if self.abandoned {
            return false;
        }
        inner!(self, m => Machine::poll_transmit(m, out))
    }

    fn poll_timeout(&self) -> Option<(Instant, ())> {
        if self.outcome.is_some() {
            return None;
        }
        match &self.kind {
            Kind::Http { ex, .. } => Machine::poll_timeout(&**ex).map(|(at, _)| (at, ())),
            Kind::Ws(run) => {
                let core = if run.flooding() {
                    run.ws.write_deadline()
                } else {
                    Machine::poll_timeout(&run.ws).map(|(t, _)| t)
                };
                Some((core.map_or(run.deadline, |t| t.min(run.deadline)), ()))
            }
        }
    }

    fn poll_event(&mut self) -> Option<Value> {
        self.lines.pop_front()
    }

    fn is_finished(&self) -> bool {
        if self.outcome.is_none() {
            return false;
        }
        match &self.kind {
            Kind::Ws(run) if !self.abandoned => run.ws.is_finished(),
            _ => true,
        }
    }

    fn wants_read(&self) -> bool {
        self.outcome.is_none()
            && match &self.kind {
                Kind::Http { ex, .. } => Machine::wants_read(&**ex),
                Kind::Ws(run) => Machine::wants_read(&run.ws),
            }
    }
}
