//! Exec: buffered (`/exec`), background (`"background": true`) and SSE
//! (`/exec/stream`).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path as UrlPath, Request, State};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::machines::{EnvVar, ensure_running, validate_env, validate_secrets};
use super::{ApiError, active_faults, json_body, ok_json, sse};
use crate::faults::{ActiveFaults, Fault};
use crate::process::{self, CommandSpec, Out};
use crate::state::{AppState, Shared, lock};

/// The 1.9.2 exec body: strict (unknown fields → 422).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ExecRequest {
    command: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    secrets: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    background: bool,
}

/// The 1.22.0 exec body: also `user` (accepted; commands run as the
/// devworker's own user).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ExecRequestLater {
    command: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    secrets: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

/// The `run` body: strict like exec, `image` required (and ignored).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RunRequest {
    #[allow(dead_code)]
    image: String,
    command: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    secrets: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

impl From<ExecRequestLater> for ExecRequest {
    fn from(r: ExecRequestLater) -> Self {
        Self {
            command: r.command,
            env: r.env,
            secrets: r.secrets,
            workdir: r.workdir,
            timeout_secs: r.timeout_secs,
            stdin: r.stdin,
            background: r.background,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExecResponse {
    exit_code: i32,
    stdout: String,
    stderr: String,
    stdout_b64: String,
    stderr_b64: String,
}

impl ExecResponse {
    fn new(exit_code: i32, out: &[u8], err: &[u8]) -> Self {
        Self {
            exit_code,
            stdout: String::from_utf8_lossy(out).into_owned(),
            stderr: String::from_utf8_lossy(err).into_owned(),
            stdout_b64: STANDARD.encode(out),
            stderr_b64: STANDARD.encode(err),
        }
    }
}

async fn parse(st: &Shared, req: Request) -> Result<ExecRequest, Response> {
    if st.config.version.is_later() {
        json_body::<ExecRequestLater>(req).await.map(Into::into)
    } else {
        json_body::<ExecRequest>(req).await
    }
}

/// Parses, checks and implicitly starts; returns the spec and the machine's
/// root and kill watches.
async fn prepare(
    st: &AppState,
    name: &str,
    req: Request,
) -> Result<
    (
        ExecRequest,
        std::path::PathBuf,
        Vec<tokio::sync::watch::Receiver<u64>>,
    ),
    Response,
> {
    let body = parse(st, req).await?;
    checked(st, name, body)
}

/// The real worker's order: the body (415/400/422), then an empty command
/// (400, even for an unknown machine), then the lookup (404), then the
/// implicit start, then env and secrets.
#[allow(clippy::type_complexity, clippy::result_large_err)]
fn checked(
    st: &AppState,
    name: &str,
    body: ExecRequest,
) -> Result<
    (
        ExecRequest,
        std::path::PathBuf,
        Vec<tokio::sync::watch::Receiver<u64>>,
    ),
    Response,
> {
    if body.command.is_empty() {
        return Err(ApiError::bad_request("command cannot be empty").into_response());
    }
    let known = lock(&st.machines).iter().any(|m| m.name == name);
    if !known {
        return Err(ApiError::machine_not_found(name).into_response());
    }
    if st.config.neighbour_checks && body.timeout_secs.is_some_and(|t| t > MAX_TIMEOUT_SECS) {
        return Err(ApiError::bad_request(format!(
            "timeoutSecs must be at most {MAX_TIMEOUT_SECS}"
        ))
        .into_response());
    }
    ensure_running(st, name).map_err(IntoResponse::into_response)?;
    validate_env(&body.env).map_err(IntoResponse::into_response)?;
    validate_secrets(&body.secrets).map_err(IntoResponse::into_response)?;
    let (root, kill) = st
        .with_machine(name, |m| (m.rootfs(), m.kill.subscribe()))
        .ok_or_else(|| ApiError::machine_not_found(name).into_response())?;
    let kills = vec![kill, st.generation.subscribe()];
    Ok((body, root, kills))
}

/// The longest exec `timeoutSecs` the devworker takes (one day; the real
/// worker has no bound). Beyond it a typo would hold a host process for
/// years.
pub(crate) const MAX_TIMEOUT_SECS: u64 = 86_400;

fn spec_of(body: &ExecRequest, with_stdin: bool) -> CommandSpec {
    CommandSpec {
        argv: body.command.clone(),
        env: body
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect(),
        workdir: body.workdir.clone(),
        stdin: if with_stdin {
            body.stdin.as_ref().map(|s| s.as_bytes().to_vec())
        } else {
            None
        },
        timeout: body.timeout_secs.map(Duration::from_secs),
    }
}

pub(crate) async fn exec(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    req: Request,
) -> Response {
    let (body, root, kills) = match prepare(&st, &name, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    buffered(&st, body, root, kills).await
}

/// `POST /api/v1/machines/{name}/run` (1.9.2): a buffered exec "in an
/// image". The devworker has no images: the command runs like an exec.
pub(crate) async fn run(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    req: Request,
) -> Response {
    let body = match json_body::<RunRequest>(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let body = ExecRequest {
        command: body.command,
        env: body.env,
        secrets: body.secrets,
        workdir: body.workdir,
        timeout_secs: body.timeout_secs,
        stdin: None,
        background: false,
    };
    let (body, root, kills) = match checked(&st, &name, body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    buffered(&st, body, root, kills).await
}

async fn buffered(
    st: &AppState,
    body: ExecRequest,
    root: std::path::PathBuf,
    kills: Vec<tokio::sync::watch::Receiver<u64>>,
) -> Response {
    if body.background {
        let mut spec = spec_of(&body, false);
        spec.timeout = None;
        return match process::spawn_background(&root, spec, kills, &st.commands) {
            Ok(pid) => {
                let text = format!("pid={pid}\n");
                ok_json(&ExecResponse::new(0, text.as_bytes(), b""))
            }
            Err(msg) => ApiError::internal(msg).into_response(),
        };
    }
    let mut running = match process::spawn(&root, spec_of(&body, true), kills, &st.commands) {
        Ok(r) => r,
        Err(msg) => return ApiError::internal(msg).into_response(),
    };
    let cap = st.config.limits.exec_output_max;
    let started = std::time::Instant::now();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(ev) = running.rx.recv().await {
        let (buf, chunk) = match ev {
            Out::Stdout(c) => (&mut out, c),
            Out::Stderr(c) => (&mut err, c),
            Out::Exit(code) => {
                st.record_exec(started.elapsed());
                return ok_json(&ExecResponse::new(code, &out, &err));
            }
        };
        buf.extend_from_slice(&chunk);
        if buf.len() > cap {
            process::kill_group(running.pgid);
            return ApiError::internal(format!(
                "command output exceeded {cap} bytes and was truncated. Use streaming exec (/exec/stream) for large outputs"
            ))
            .into_response();
        }
    }
    ApiError::internal("agent connection closed before the command finished").into_response()
}

pub(crate) async fn exec_stream(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    req: Request,
) -> Response {
    let faults = active_faults(&req);
    let (body, root, kills) = match prepare(&st, &name, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (tx, rx) = mpsc::channel(16);
    let running = match process::spawn(&root, spec_of(&body, false), kills, &st.commands) {
        Ok(r) => r,
        Err(msg) => {
            // Agent-side failures arrive in-band, formatted without JSON
            // escaping like the real encoder (often invalid JSON).
            let data =
                format!("{{\"message\":\"Agent {{ operation: \"run\", message: \"{msg}\" }}\"}}");
            let _ = tx.try_send(sse::event(Some("error"), data.as_bytes()));
            return sse::response(rx);
        }
    };
    let keepalive = st.config.limits.keepalive;
    let cap = st.config.limits.stream_output_max;
    let generation = st.generation.subscribe();
    tokio::spawn(pump(running, tx, keepalive, cap, faults, generation));
    sse::response(rx)
}

/// Encodes a command's output as SSE events (see worker-api.md §7).
async fn pump(
    mut running: process::Running,
    tx: mpsc::Sender<bytes::Bytes>,
    keepalive: Duration,
    cap: usize,
    faults: ActiveFaults,
    mut generation: tokio::sync::watch::Receiver<u64>,
) {
    let close_before_exit = faults.has(|f| matches!(f, Fault::CloseBeforeExit));
    let exit130 = faults.has(|f| matches!(f, Fault::Exit130));
    let stall = faults.has(|f| matches!(f, Fault::StallStream));
    let mut client_gone = false;
    let mut total = 0usize;
    let mut emitted = 0usize;
    let mut next_keepalive = tokio::time::Instant::now() + keepalive;
    loop {
        if stall && emitted > 0 {
            break;
        }
        tokio::select! {
            ev = running.rx.recv() => {
                let frame = match ev {
                    Some(Out::Stdout(c)) | Some(Out::Stderr(c)) if exit130 => {
                        let _ = c;
                        process::kill_group(running.pgid);
                        Some((sse::event(Some("exit"), b"{\"exitCode\":130}"), true))
                    }
                    Some(Out::Stdout(c)) => {
                        total += c.len();
                        Some((sse::event(Some("stdout"), String::from_utf8_lossy(&c).as_bytes()), false))
                    }
                    Some(Out::Stderr(c)) => {
                        total += c.len();
                        Some((sse::event(Some("stderr"), String::from_utf8_lossy(&c).as_bytes()), false))
                    }
                    Some(Out::Exit(code)) => {
                        if close_before_exit {
                            None
                        } else {
                            let code = if exit130 { 130 } else { code };
                            Some((sse::event(Some("exit"), format!("{{\"exitCode\":{code}}}").as_bytes()), true))
                        }
                    }
                    None => None,
                };
                let Some((bytes, terminal)) = frame else { break };
                if !client_gone && tx.send(bytes).await.is_err() {
                    client_gone = true;
                }
                emitted += 1;
                next_keepalive = tokio::time::Instant::now() + keepalive;
                if terminal {
                    break;
                }
                if total > cap {
                    process::kill_group(running.pgid);
                    let msg = format!(
                        "{{\"message\":\"streaming output exceeded {cap} byte cap; exec terminated (output truncated)\"}}"
                    );
                    if !client_gone {
                        let _ = tx.send(sse::event(Some("error"), msg.as_bytes())).await;
                    }
                    break;
                }
            }
            () = tokio::time::sleep_until(next_keepalive), if !client_gone => {
                if tx.send(bytes::Bytes::from_static(sse::KEEPALIVE)).await.is_err() {
                    client_gone = true;
                }
                next_keepalive = tokio::time::Instant::now() + keepalive;
            }
            _ = generation.changed() => return,
        }
    }
    if stall {
        // Keep the stream open and silent; the command runs on, unread.
        tokio::spawn(async move { while running.rx.recv().await.is_some() {} });
        tokio::select! {
            () = tx.closed() => {}
            _ = generation.changed() => {}
        }
    }
}
