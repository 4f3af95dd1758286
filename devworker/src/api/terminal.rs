//! Interactive terminal over WebSocket (`GET /{id}/exec/interactive`): the
//! program runs under a real PTY (worker-api.md §8).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Path as UrlPath, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use portable_pty::{CommandBuilder, MasterPty, PtySize, native_pty_system};
use serde::Deserialize;
use sha1::{Digest, Sha1};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

use super::machines::ensure_running;
use super::{ApiError, active_faults};
use crate::faults::{ActiveFaults, Fault};
use crate::process::map_arg;
use crate::state::{AppState, lock};

#[derive(Deserialize)]
pub(crate) struct TermQuery {
    #[serde(default)]
    cmd: Option<String>,
    #[serde(default)]
    cols: Option<u16>,
    #[serde(default)]
    rows: Option<u16>,
}

#[derive(Deserialize)]
struct ClientText {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    cols: Option<u64>,
    #[serde(default)]
    rows: Option<u64>,
    #[serde(default)]
    data: Option<serde_json::Value>,
}

pub(crate) async fn interactive(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    req: Request,
) -> Response {
    let faults = active_faults(&req);
    let raw_fault = faults
        .0
        .iter()
        .find(|f| matches!(f, Fault::MaskedFrame | Fault::OversizeFrame { .. }))
        .cloned();
    let (mut parts, body) = req.into_parts();
    // The real handler's extractor order: the query, then the upgrade
    // headers, then the machine lookup.
    let q = match Query::<TermQuery>::try_from_uri(&parts.uri) {
        Ok(q) => q.0,
        Err(rej) => return rej.into_response(),
    };
    let ws = if raw_fault.is_some() {
        None
    } else {
        match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => Some(ws),
            Err(rej) => return rej.into_response(),
        }
    };
    if let Err(e) = ensure_running(&st, &name) {
        return e.into_response();
    }
    let Some((root, kill)) = st.with_machine(&name, |m| (m.rootfs(), m.kill.subscribe())) else {
        return ApiError::machine_not_found(&name).into_response();
    };
    if let Some(fault) = raw_fault {
        return raw_upgrade(Request::from_parts(parts, body), fault);
    }
    let Some(ws) = ws else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let cmd = q.cmd.unwrap_or_else(|| "/bin/sh".to_owned());
    let size = PtySize {
        rows: q.rows.unwrap_or(24),
        cols: q.cols.unwrap_or(80),
        pixel_width: 0,
        pixel_height: 0,
    };
    let generation = st.generation.subscribe();
    let commands = st.commands.clone();
    let ctx = Session {
        root,
        cmd,
        size,
        faults,
        machine_kill: kill,
        generation,
        commands,
        grace: st.config.limits.terminal_hangup_grace,
    };
    ws.on_upgrade(move |socket| session(socket, ctx))
}

fn raw_upgrade(mut req: Request, fault: Fault) -> Response {
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "`Sec-WebSocket-Key` header did not include a valid key",
        )
            .into_response();
    };
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let accept = base64::engine::general_purpose::STANDARD.encode(sha.finalize());
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(up) = on_upgrade.await else { return };
        let mut io = hyper_util::rt::TokioIo::new(up);
        let mut frame = Vec::new();
        match fault {
            Fault::MaskedFrame => {
                let mask = [0x37u8, 0xfa, 0x21, 0x3d];
                frame.extend_from_slice(&[0x82, 0x84]);
                frame.extend_from_slice(&mask);
                frame.extend(b"/ # ".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
            }
            Fault::OversizeFrame { len } => {
                frame.extend_from_slice(&[0x82, 0x7f]);
                frame.extend_from_slice(&len.to_be_bytes());
                frame.extend(std::iter::repeat_n(
                    b'x',
                    usize::try_from(len.min(4096)).unwrap_or(0),
                ));
            }
            _ => {}
        }
        let _ = io.write_all(&frame).await;
        let _ = io.flush().await;
        let _ = io.shutdown().await;
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

type Master = Arc<Mutex<Box<dyn MasterPty + Send>>>;

struct Pty {
    master: Master,
    /// Bounded ([`MAX_QUEUED_INPUT`] chunks): a program that does not read
    /// its terminal stops the session reading the socket (back-pressure).
    input: std::sync::mpsc::SyncSender<Vec<u8>>,
    output: mpsc::Receiver<Vec<u8>>,
    exit: mpsc::Receiver<i32>,
    /// The program's process group (it leads a session of its own).
    pgid: i32,
    /// SIGKILL follows SIGHUP after this grace at teardown.
    grace: Duration,
}

impl Pty {
    /// Teardown: the whole process group is hung up, then killed.
    fn hang_up(&self) {
        crate::process::hangup_group(self.pgid, self.grace);
    }
}

fn open_pty(
    root: &std::path::Path,
    cmd: &str,
    size: PtySize,
    registry: &crate::process::Registry,
    grace: Duration,
) -> Result<Pty, String> {
    let pair = native_pty_system()
        .openpty(size)
        .map_err(|e| e.to_string())?;
    let mut builder = CommandBuilder::new(map_arg(root, cmd));
    builder.env_clear();
    builder.env("TERM", "xterm-256color");
    builder.env(
        "PATH",
        std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
    );
    builder.env("HOME", root.join("root"));
    builder.cwd(root);
    let mut child = pair
        .slave
        .spawn_command(builder)
        .map_err(|e| e.to_string())?;
    drop(pair.slave);
    let pgid = child
        .process_id()
        .and_then(|p| i32::try_from(p).ok())
        .unwrap_or(0);
    registry.add(pgid);
    let registry = registry.clone();
    let mut reader = pair.master.try_clone_reader().map_err(|e| e.to_string())?;
    let mut writer = pair.master.take_writer().map_err(|e| e.to_string())?;
    let (out_tx, output) = mpsc::channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if out_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let (input, in_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(MAX_QUEUED_INPUT);
    std::thread::spawn(move || {
        while let Ok(bytes) = in_rx.recv() {
            if writer
                .write_all(&bytes)
                .and_then(|()| writer.flush())
                .is_err()
            {
                break;
            }
        }
    });
    let (exit_tx, exit) = mpsc::channel(1);
    std::thread::spawn(move || {
        let code = child
            .wait()
            .map(|s| i32::try_from(s.exit_code()).unwrap_or(-1))
            .unwrap_or(-1);
        registry.remove(pgid);
        let _ = exit_tx.blocking_send(code);
    });
    Ok(Pty {
        master: Arc::new(Mutex::new(pair.master)),
        input,
        output,
        exit,
        pgid,
        grace,
    })
}

fn exit_text(code: i32) -> Message {
    Message::Text(format!("{{\"type\":\"exit\",\"code\":{code}}}").into())
}

/// What a terminal session needs once upgraded.
struct Session {
    root: PathBuf,
    cmd: String,
    size: PtySize,
    faults: ActiveFaults,
    machine_kill: watch::Receiver<u64>,
    generation: watch::Receiver<u64>,
    commands: crate::process::Registry,
    grace: Duration,
}

async fn session(mut socket: WebSocket, ctx: Session) {
    let Session {
        root,
        cmd,
        size,
        faults,
        mut machine_kill,
        mut generation,
        commands,
        grace,
    } = ctx;
    let Ok(mut pty) = open_pty(&root, &cmd, size, &commands, grace) else {
        let _ = socket.send(exit_text(-1)).await;
        let _ = socket.send(Message::Close(None)).await;
        return;
    };
    let close_before_exit = faults.has(|f| matches!(f, Fault::CloseBeforeExit));
    let exit130 = faults.has(|f| matches!(f, Fault::Exit130));
    let stall = faults.has(|f| matches!(f, Fault::StallStream));
    let mut code: Option<i32> = None;
    let mut output_done = false;
    let mut drain_deadline: Option<tokio::time::Instant> = None;
    let mut frames_sent = 0usize;
    // Input the PTY's queue could not take yet: while it is held the
    // socket is not read, so a client typing into a program that does not
    // read is slowed by TCP instead of growing this process's memory.
    let mut pending: Option<Vec<u8>> = None;
    let mut stalled = false;
    loop {
        if code.is_some() && output_done {
            break;
        }
        let drain = async {
            match drain_deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            chunk = pty.output.recv(), if !output_done && !stalled => match chunk {
                Some(bytes) => {
                    if socket.send(Message::Binary(bytes.into())).await.is_err() {
                        pty.hang_up();
                        return;
                    }
                    frames_sent += 1;
                    if stall && frames_sent > 0 {
                        stalled = true;
                    }
                }
                None => output_done = true,
            },
            c = pty.exit.recv(), if code.is_none() => {
                code = Some(c.unwrap_or(-1));
                drain_deadline = Some(tokio::time::Instant::now() + Duration::from_millis(300));
            }
            () = drain => output_done = true,
            () = tokio::time::sleep(Duration::from_millis(5)), if pending.is_some() => {
                if let Some(bytes) = pending.take() {
                    pending = queue_input(&pty.input, bytes);
                }
            }
            msg = socket.recv(), if pending.is_none() => match msg {
                Some(Ok(Message::Binary(b))) => pending = queue_input(&pty.input, b.to_vec()),
                Some(Ok(Message::Text(t))) => pending = handle_text(&pty, t.as_str()),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    // Client went away: the session ends with 130 and the
                    // program is killed (the code is not deliverable).
                    let _ = pty.input.try_send(vec![4]);
                    pty.hang_up();
                    return;
                }
            },
            _ = machine_kill.changed() => {
                // The machine stopped under the session: internal error.
                pty.hang_up();
                let _ = socket.send(exit_text(-1)).await;
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            _ = generation.changed() => {
                // Worker restart: the connection is simply gone.
                pty.hang_up();
                return;
            }
        }
        if stalled {
            // Silent: keep the socket open, read nothing more from the PTY.
            loop {
                match socket.recv().await {
                    Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                    _ => {}
                }
            }
            pty.hang_up();
            return;
        }
    }
    // The program exited: whatever it left in its group is hung up too.
    pty.hang_up();
    let code = if exit130 { 130 } else { code.unwrap_or(-1) };
    if !close_before_exit {
        let _ = socket.send(exit_text(code)).await;
    }
    let _ = socket.send(Message::Close(None)).await;
}

/// PTY input chunks queued for the writer thread at most; past it the
/// session keeps one chunk aside and stops reading the socket.
const MAX_QUEUED_INPUT: usize = 16;

/// Queues `bytes` for the PTY; gives them back when the queue is full (the
/// caller holds them and stops reading until they fit).
fn queue_input(input: &std::sync::mpsc::SyncSender<Vec<u8>>, bytes: Vec<u8>) -> Option<Vec<u8>> {
    match input.try_send(bytes) {
        Err(std::sync::mpsc::TrySendError::Full(bytes)) => Some(bytes),
        // Sent, or the writer is gone (the program ended): nothing to hold.
        _ => None,
    }
}

fn handle_text(pty: &Pty, text: &str) -> Option<Vec<u8>> {
    match serde_json::from_str::<ClientText>(text) {
        Ok(m) if m.kind == "resize" => {
            let cols = m.cols.unwrap_or(80) as u16;
            let rows = m.rows.unwrap_or(24) as u16;
            let _ = lock(&pty.master).resize(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            });
            None
        }
        Ok(m) if m.kind == "stdin" => match m.data {
            Some(serde_json::Value::String(s)) => queue_input(&pty.input, s.into_bytes()),
            _ => None,
        },
        _ => queue_input(&pty.input, text.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod input_tests {
    use super::{MAX_QUEUED_INPUT, queue_input};

    #[test]
    fn pty_input_is_bounded_at_n_chunks_then_held() {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(MAX_QUEUED_INPUT);
        for i in 0..MAX_QUEUED_INPUT {
            assert_eq!(queue_input(&tx, vec![i as u8]), None, "chunk {i} queued");
        }
        // N + 1: given back to be held (the session stops reading).
        assert_eq!(queue_input(&tx, vec![0xff]), Some(vec![0xff]));
        // The writer takes one: the held chunk fits again.
        assert_eq!(rx.recv().ok(), Some(vec![0]));
        assert_eq!(queue_input(&tx, vec![0xff]), None);
        // A writer that is gone holds nothing back.
        drop(rx);
        assert_eq!(queue_input(&tx, vec![1]), None);
    }
}
