//! Console logs as SSE (`GET /{id}/logs`): tail, full read, json filter,
//! follow with keep-alive (worker-api.md §10).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Path as UrlPath, Query, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;

use super::{ApiError, sse};
use crate::state::{AppState, Shared};

#[derive(Deserialize)]
pub(crate) struct LogsQuery {
    #[serde(default)]
    tail: Option<usize>,
    #[serde(default)]
    follow: Option<bool>,
    #[serde(default)]
    format: Option<String>,
}

const FIRST_READ_MAX: usize = 64 * 1024;
const PARTIAL_FLUSH: usize = 1024 * 1024;

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn is_json(line: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(line).is_ok()
}

struct FollowerGuard(Arc<Shared>);

impl Drop for FollowerGuard {
    fn drop(&mut self) {
        self.0.log_followers.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) async fn logs(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<LogsQuery>,
) -> Response {
    let Some((path, started)) = st.with_machine(&name, |m| (m.console_log(), m.vmm.is_some()))
    else {
        return ApiError::machine_not_found(&name).into_response();
    };
    let _ = started;
    let Ok(content) = tokio::fs::read(&path).await else {
        return ApiError::not_found(format!(
            "machine '{name}' has no logs yet \u{2014} it may not have been started"
        ))
        .into_response();
    };
    if let Some(t) = q.tail
        && t > 10_000
    {
        return ApiError::bad_request(format!("tail value {t} exceeds maximum of 10000"))
            .into_response();
    }
    let json_only = q.format.as_deref() == Some("json");
    let follow = q.follow.unwrap_or(false);
    let mut first: Vec<Bytes> = Vec::new();
    let offset = match q.tail {
        Some(n) => {
            let Ok(text) = std::str::from_utf8(&content) else {
                return ApiError::internal("stream did not contain valid UTF-8").into_response();
            };
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            for l in &lines[start..] {
                if !json_only || is_json(l.as_bytes()) {
                    first.push(sse::event(None, l.as_bytes()));
                }
            }
            content.len() as u64
        }
        None => {
            let slice = if follow {
                &content[..]
            } else {
                &content[..content.len().min(FIRST_READ_MAX)]
            };
            let mut parts: Vec<&[u8]> = slice.split(|b| *b == b'\n').collect();
            let partial = parts.pop().filter(|p| !p.is_empty());
            for l in parts {
                let l = strip_cr(l);
                if !json_only || is_json(l) {
                    first.push(sse::event(None, String::from_utf8_lossy(l).as_bytes()));
                }
            }
            if let Some(p) = partial {
                first.push(sse::event(None, String::from_utf8_lossy(p).as_bytes()));
            }
            slice.len() as u64
        }
    };
    let guard = if follow {
        let max = st.config.limits.max_log_followers as u32;
        if st.log_followers.fetch_add(1, Ordering::SeqCst) >= max {
            st.log_followers.fetch_sub(1, Ordering::SeqCst);
            return ApiError::conflict("too many concurrent log followers").into_response();
        }
        Some(FollowerGuard(Arc::clone(&st)))
    } else {
        None
    };
    let (tx, rx) = mpsc::channel(16);
    let keepalive = st.config.limits.keepalive;
    let poll = st.config.limits.log_poll;
    let mut generation = st.generation.subscribe();
    tokio::spawn(async move {
        for b in first {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let Some(_guard) = guard else { return };
        let mut offset = offset;
        let mut pending: Vec<u8> = Vec::new();
        let mut last_event = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(poll) => {}
                () = tx.closed() => return,
                _ = generation.changed() => return,
            }
            let mut chunk = Vec::new();
            let read = async {
                let mut f = tokio::fs::File::open(&path).await?;
                f.seek(std::io::SeekFrom::Start(offset)).await?;
                (&mut f).take(64 * 1024).read_to_end(&mut chunk).await
            }
            .await;
            match read {
                Ok(n) => offset += n as u64,
                Err(e) => {
                    let _ = tx
                        .send(sse::event(None, format!("error: {e}").as_bytes()))
                        .await;
                    return;
                }
            }
            pending.extend_from_slice(&chunk);
            let mut sent = false;
            while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                let line = strip_cr(&line[..line.len() - 1]);
                if (!json_only || is_json(line))
                    && tx
                        .send(sse::event(None, String::from_utf8_lossy(line).as_bytes()))
                        .await
                        .is_err()
                {
                    return;
                }
                sent = true;
            }
            if pending.len() > PARTIAL_FLUSH {
                let line = std::mem::take(&mut pending);
                if tx
                    .send(sse::event(None, String::from_utf8_lossy(&line).as_bytes()))
                    .await
                    .is_err()
                {
                    return;
                }
                sent = true;
            }
            if sent {
                last_event = tokio::time::Instant::now();
            } else if last_event.elapsed() >= keepalive {
                if tx.send(Bytes::from_static(sse::KEEPALIVE)).await.is_err() {
                    return;
                }
                last_event = tokio::time::Instant::now();
            }
        }
    });
    sse::response(rx)
}
