//! Server-sent events, encoded exactly like axum 0.8's encoder: the data text
//! is split at every `\n` and `\r`, the split byte itself ends the line.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::mpsc;

/// One event: optional `event:` name, then the `data:` lines, then a blank line.
pub(crate) fn event(name: Option<&str>, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + 32);
    if let Some(n) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(n.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    let mut last = 0;
    for (i, b) in data.iter().enumerate() {
        if *b == b'\n' || *b == b'\r' {
            out.extend_from_slice(&data[last..=i]);
            out.extend_from_slice(b"data: ");
            last = i + 1;
        }
    }
    out.extend_from_slice(&data[last..]);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The keep-alive comment.
pub(crate) const KEEPALIVE: &[u8] = b":\n\n";

/// A `200 text/event-stream` reply whose body is what `rx` yields.
pub(crate) fn response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_matches_the_vectors() {
        assert_eq!(
            &event(Some("stdout"), "café\n".as_bytes())[..],
            "event: stdout\ndata: café\ndata: \n\n".as_bytes()
        );
        assert_eq!(
            &event(Some("stdout"), b"a\r\nb")[..],
            b"event: stdout\ndata: a\rdata: \ndata: b\n\n"
        );
        assert_eq!(&event(None, b"x")[..], b"data: x\n\n");
        assert_eq!(
            &event(Some("exit"), b"{\"exitCode\":0}")[..],
            b"event: exit\ndata: {\"exitCode\":0}\n\n"
        );
    }
}
