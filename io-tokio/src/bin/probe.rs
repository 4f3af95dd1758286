//! The conformance probe: drives smolbox's HTTP/1.1, SSE and WebSocket
//! state machines against a third-party peer and prints what it saw.
//!
//! ```text
//! smolbox-probe MODE URL [args] --max-body N --max-header N --max-frame N --max-message N
//!     --max-line N --max-event N --idle-timeout-ms N --deadline-ms N [--shell tokio]
//! MODE http     one request (GET, or --method POST --json DOC), a JSON reply expected
//! MODE sse      GET with Accept: text/event-stream; every event, then `end`
//! MODE ws       open; --send text:STR|hex:HEX (in order); close 1000 after --recv N
//!               messages; --flood BYTES sends 64 KiB binary messages up to BYTES
//! MODE ws-echo  echo every message back with the same type until the close
//! ```
//!
//! Output: one JSON object per line on stdout; the last is a terminator
//! (`response`, `end`, `close`) or one `error` with a class among
//! `protocol, too_large, timeout, truncated, abnormal_close, handshake,
//! invalid_utf8, unsupported_encoding, status, content_type, json, connect`.
//! Redirects are never followed and nothing is decompressed. `--ca FILE`
//! (with an optional `--cert FILE --key FILE`) enables `https`/`wss`.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use smolbox_core::http1::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request};
use smolbox_core::sse::{self, SseParser};
use smolbox_core::ws::{CloseCode, MAX_WS_TIMER, WsClient, WsConfig, WsEvent};
use smolbox_core::{Category, Operation};
use smolbox_probe_common::{Fail, Opts, Out, TlsPaths, classify, hex};
use smolbox_tokio::{Connection, SocketTarget, TlsFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Size of one flood message.
const FLOOD_MESSAGE: usize = 64 * 1024;
/// Bytes read per call.
const READ_CHUNK: usize = 64 * 1024;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match Opts::parse(&args, SHELL) {
        Ok(o) => o,
        Err(msg) => {
            let _ = writeln!(std::io::stderr(), "usage error: {msg}");
            return ExitCode::from(2);
        }
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::from(2);
    };
    let mut out = Out;
    let result = rt.block_on(run(&opts, &mut out));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(fail) => {
            out.emit(&fail.to_json());
            ExitCode::from(1)
        }
    }
}

/// The shell this probe drives (`--shell` must name it).
const SHELL: &str = "tokio";

async fn connect(o: &Opts, deadline: Instant, op: Operation) -> Result<Connection, Fail> {
    let target = match &o.tls {
        Some(paths) if o.url.secure => {
            SocketTarget::tls(o.url.host.clone(), o.url.port, &tls_files(paths))
                .map_err(|e| Fail::new("connect", e.to_string()))?
        }
        _ => SocketTarget::tcp(o.url.host.clone(), o.url.port),
    };
    target
        .connect(deadline, op)
        .await
        .map_err(|e| classify(&e, false))
}

async fn run(o: &Opts, out: &mut Out) -> Result<(), Fail> {
    let deadline = Instant::now() + o.deadline;
    match o.mode.as_str() {
        "http" => http(o, out, deadline).await,
        "sse" => sse_mode(o, out, deadline).await,
        _ => ws(o, out, deadline).await,
    }
}

/// Runs one exchange, handing body bytes to `on_body`; returns the head.
async fn exchange(
    o: &Opts,
    request: &Request,
    deadline: Instant,
    on_head: &mut dyn FnMut(&smolbox_core::http1::ResponseHead) -> Result<(), Fail>,
    on_body: &mut dyn FnMut(&[u8]) -> Result<(), Fail>,
) -> Result<(), Fail> {
    let mut conn = connect(o, deadline, request.operation).await?;
    let mut config = ExchangeConfig::new(o.url.host_header.clone(), deadline);
    config.max_response_body = o.max_body;
    config.max_head_bytes = o.max_header;
    config.idle_timeout = Some(o.idle);
    config.keep_alive = false;
    let mut ex =
        HttpExchange::new(request, &config, Instant::now()).map_err(|e| classify(&e, false))?;
    let mut wire = Vec::new();
    let _ = ex.poll_transmit(&mut wire);
    write_all(&mut conn, &wire, ex.poll_timeout().map(|(t, _)| t)).await?;
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        while let Some(ev) = ex.poll_event() {
            match ev {
                HttpEvent::Head(head) => on_head(&head)?,
                HttpEvent::Data(bytes) => on_body(bytes)?,
                HttpEvent::End => return Ok(()),
                HttpEvent::Failed(e) => return Err(classify(&e, false)),
                _ => {}
            }
        }
        let wake = ex.poll_timeout().map(|(t, _)| t);
        match read_until(&mut conn, &mut buf, wake).await {
            Read::Data(n) => {
                let _ = ex.handle_input(Instant::now(), &buf[..n]);
            }
            Read::Eof => ex.handle_eof(Instant::now()),
            Read::Timer => ex.handle_timeout(Instant::now()),
            Read::Failed => return Err(Fail::new("truncated", "read failed")),
        }
    }
}

async fn http(o: &Opts, out: &mut Out, deadline: Instant) -> Result<(), Fail> {
    let mut request =
        Request::new(Operation::Http, o.method, o.url.target.clone()).accept("application/json");
    if let Some(doc) = &o.json {
        request = request.body("application/json", doc.clone().into_bytes());
    }
    let mut status = 0u16;
    let mut body = Vec::new();
    let mut on_head = |h: &smolbox_core::http1::ResponseHead| {
        status = h.status;
        if !(200..300).contains(&h.status) {
            return Err(Fail {
                status: Some(h.status),
                ..Fail::new("status", format!("status {}", h.status))
            });
        }
        if !h.media_type_is("application/json") {
            return Err(Fail::new("content_type", "expected application/json"));
        }
        Ok(())
    };
    let mut on_body = |b: &[u8]| {
        body.extend_from_slice(b);
        Ok(())
    };
    exchange(o, &request, deadline, &mut on_head, &mut on_body).await?;
    let doc: Value = serde_json::from_slice(&body).map_err(|e| Fail::new("json", e.to_string()))?;
    out.emit(&json!({"kind": "response", "status": status, "body": doc}));
    Ok(())
}

async fn sse_mode(o: &Opts, out: &mut Out, deadline: Instant) -> Result<(), Fail> {
    let request =
        Request::new(Operation::Sse, Method::Get, o.url.target.clone()).accept("text/event-stream");
    let mut parser = SseParser::new(sse::Config {
        max_line_len: o.max_line,
        max_event_len: o.max_event,
        max_chunk_len: READ_CHUNK.max(o.max_line),
        operation: Operation::Sse,
    });
    let mut on_head = |h: &smolbox_core::http1::ResponseHead| {
        if !(200..300).contains(&h.status) {
            return Err(Fail {
                status: Some(h.status),
                ..Fail::new("status", format!("status {}", h.status))
            });
        }
        if !h.media_type_is("text/event-stream") {
            return Err(Fail::new("content_type", "expected text/event-stream"));
        }
        Ok(())
    };
    let mut events = Vec::new();
    let mut on_body = |b: &[u8]| {
        parser.handle_input(b).map_err(|e| classify(&e, false))?;
        while let Some(ev) = parser.poll_event().map_err(|e| classify(&e, false))? {
            events.push(event_json(&ev));
        }
        Ok(())
    };
    let r = exchange(o, &request, deadline, &mut on_head, &mut on_body).await;
    for e in &events {
        out.emit(e);
    }
    r?;
    parser.finish().map_err(|e| classify(&e, false))?;
    while let Some(ev) = parser.poll_event().map_err(|e| classify(&e, false))? {
        out.emit(&event_json(&ev));
    }
    out.emit(&json!({
        "kind": "end",
        "last_event_id": String::from_utf8_lossy(parser.last_event_id()),
        "retry_ms": parser.retry(),
    }));
    Ok(())
}

fn event_json(ev: &sse::Event<'_>) -> Value {
    json!({
        "kind": "event",
        "event": String::from_utf8_lossy(ev.event_type()),
        "data": ev.data_lossy(),
        "id": String::from_utf8_lossy(ev.last_event_id()),
    })
}

async fn ws(o: &Opts, out: &mut Out, deadline: Instant) -> Result<(), Fail> {
    let echo = o.mode == "ws-echo";
    let mut conn = connect(o, deadline, Operation::WebSocket).await?;
    let mut config = WsConfig::new(o.url.host_header.clone(), o.url.target.clone());
    config.max_frame_len = o.max_frame;
    config.max_message_len = o.max_message;
    config.handshake_timeout = o.deadline.min(Duration::from_secs(30));
    // A silent peer (no frame, no pong to the keepalive ping) and a peer
    // that stops reading both end within the idle budget.
    let budget = (!o.idle.is_zero()).then(|| o.idle.min(MAX_WS_TIMER));
    config.idle_timeout = budget;
    config.write_wait = budget;
    let mut key = [0u8; 16];
    getrandom::getrandom(&mut key).map_err(|_| Fail::new("connect", "no randomness"))?;
    let mut ws = WsClient::new(config, key, Instant::now()).map_err(|e| classify(&e, true))?;
    let mut opened = false;
    let mut received = 0usize;
    let mut flooded = 0u64;
    let mut sends = o.sends.iter();
    let mut wire = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK];
    let flood_msg = vec![0x5au8; FLOOD_MESSAGE];
    loop {
        top_up(&mut ws)?;
        // Deliver events; queue replies.
        let mut replies: Vec<(bool, Vec<u8>)> = Vec::new();
        let mut close_now = false;
        while let Some(ev) = ws.poll_event() {
            match ev {
                WsEvent::Open => opened = true,
                WsEvent::Text(t) => {
                    out.emit(&json!({"kind": "message", "type": "text", "text": t, "len": t.len(), "sha256": hex(&Sha256::digest(t.as_bytes()))}));
                    received += 1;
                    if echo {
                        replies.push((true, t.as_bytes().to_vec()));
                    }
                }
                WsEvent::Binary(b) => {
                    out.emit(&json!({"kind": "message", "type": "binary", "len": b.len(), "sha256": hex(&Sha256::digest(b))}));
                    received += 1;
                    if echo {
                        replies.push((false, b.to_vec()));
                    }
                }
                WsEvent::Ping(_) | WsEvent::Pong(_) => {}
                WsEvent::Closed(info) => {
                    flush(&mut conn, &mut ws, &mut wire).await?;
                    let code = info.code.map_or(1005, CloseCode::as_u16);
                    out.emit(
                        &json!({"kind": "close", "code": code, "reason": info.reason.as_str()}),
                    );
                    return Ok(());
                }
                WsEvent::Failed(e) => {
                    // The matching close code (1002/1007/1009) is queued by the core.
                    let _ = flush(&mut conn, &mut ws, &mut wire).await;
                    return Err(classify(&e, !opened));
                }
                _ => {}
            }
            if o.recv.is_some_and(|n| received >= n) {
                close_now = true;
            }
        }
        let now = Instant::now();
        for (text, payload) in replies {
            send(&mut ws, &mut conn, &mut wire, now, text, &payload).await?;
        }
        if opened && !ws.is_close_sent() {
            for (text, payload) in sends.by_ref() {
                send(&mut ws, &mut conn, &mut wire, now, *text, payload).await?;
            }
            if let Some(total) = o.flood
                && flooded < total
            {
                let n = usize::try_from((total - flooded).min(FLOOD_MESSAGE as u64))
                    .unwrap_or(FLOOD_MESSAGE);
                send(&mut ws, &mut conn, &mut wire, now, false, &flood_msg[..n]).await?;
                flooded += n as u64;
            }
            if close_now {
                let _ = ws.close(now, CloseCode::NORMAL);
            }
        }
        flush(&mut conn, &mut ws, &mut wire).await?;
        if o.flood.is_some_and(|t| flooded < t) && opened && !ws.is_close_sent() {
            // Keep flooding; read only what is already there.
            if let Read::Data(n) = read_until(&mut conn, &mut buf, Some(Instant::now())).await {
                let _ = ws.handle_input(Instant::now(), &buf[..n]);
            }
            continue;
        }
        let wake = ws
            .poll_timeout()
            .map(|(t, _)| t)
            .map_or(deadline, |t| t.min(deadline));
        match read_until(&mut conn, &mut buf, Some(wake)).await {
            Read::Data(n) => {
                let _ = ws.handle_input(Instant::now(), &buf[..n]);
            }
            Read::Eof => ws.handle_eof(Instant::now()),
            Read::Timer => {
                if Instant::now() >= deadline {
                    return Err(Fail::new("timeout", "deadline"));
                }
                ws.handle_timeout(Instant::now());
            }
            Read::Failed => ws.handle_eof(Instant::now()),
        }
    }
}

fn top_up(ws: &mut WsClient) -> Result<(), Fail> {
    let wanted = ws.entropy_wanted();
    if wanted > 0 {
        let mut r = vec![0u8; wanted];
        getrandom::getrandom(&mut r).map_err(|_| Fail::new("connect", "no randomness"))?;
        ws.handle_entropy(&r);
    }
    Ok(())
}

/// Queues one message, flushing first when the core's send buffer is full.
async fn send(
    ws: &mut WsClient,
    conn: &mut Connection,
    wire: &mut Vec<u8>,
    now: Instant,
    text: bool,
    payload: &[u8],
) -> Result<(), Fail> {
    for _ in 0..2 {
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
            Ok(()) => return Ok(()),
            Err(e) if e.category() == Category::AdmissionExhausted => flush(conn, ws, wire).await?,
            Err(e) => return Err(classify(&e, false)),
        }
    }
    Err(Fail::new("protocol", "send buffer stays full"))
}

async fn flush(conn: &mut Connection, ws: &mut WsClient, wire: &mut Vec<u8>) -> Result<(), Fail> {
    wire.clear();
    while ws.poll_transmit(wire).is_some() {}
    if !wire.is_empty() {
        if let Err(f) = write_all(conn, wire, ws.write_deadline()).await {
            // The core decides what a stalled write means (write_timeout).
            ws.handle_timeout(Instant::now());
            return Err(ws.error().map_or(f, |e| classify(&e, false)));
        }
        ws.handle_written(Instant::now(), wire.len());
        wire.clear();
    }
    Ok(())
}

async fn write_all(
    conn: &mut Connection,
    bytes: &[u8],
    deadline: Option<Instant>,
) -> Result<(), Fail> {
    let w = async {
        conn.write_all(bytes).await?;
        conn.flush().await
    };
    match deadline {
        Some(at) => match tokio::time::timeout_at(at.into(), w).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Fail::new("truncated", "write failed")),
            Err(_) => Err(Fail::new("timeout", "write timed out")),
        },
        None => w.await.map_err(|_| Fail::new("truncated", "write failed")),
    }
}

enum Read {
    Data(usize),
    Eof,
    Timer,
    Failed,
}

async fn read_until(conn: &mut Connection, buf: &mut [u8], wake: Option<Instant>) -> Read {
    let r = async {
        match conn.read(buf).await {
            Ok(0) => Read::Eof,
            Ok(n) => Read::Data(n),
            Err(_) => Read::Failed,
        }
    };
    match wake {
        Some(at) => tokio::time::timeout_at(at.into(), r)
            .await
            .unwrap_or(Read::Timer),
        None => r.await,
    }
}

fn tls_files(paths: &TlsPaths) -> TlsFiles {
    TlsFiles {
        ca_file: paths.ca_file.clone(),
        client_identity: paths.client_identity.clone(),
    }
}
