//! Request-head encoding.

use super::config::{ExchangeConfig, is_field_byte, is_visible};
use super::types::{Method, Request};
use crate::Reason;
use crate::error::{Error, Operation};

/// Checks `request` against `config` and writes its head (request line,
/// headers, blank line) to `out`. Nothing is written on error.
///
/// Headers, in order: `Host`, `Authorization: Bearer` (when configured),
/// `Content-Type` (when set), `Content-Length` (when there is a body, and
/// `0` for a bodyless POST or PUT), `Accept` (when set),
/// `Accept-Encoding: identity` (no compression is ever offered),
/// `User-Agent`, and `Connection: close` when keep-alive is off.
pub(crate) fn encode_head(
    request: &Request,
    config: &ExchangeConfig,
    out: &mut Vec<u8>,
) -> Result<(), Error> {
    config.validate()?;
    let op = request.operation;
    let body_len = request.body.len();
    if body_len > config.max_request_body {
        return Err(
            Error::validation(Operation::RequestSize, Reason::RequestBody)
                .with_limit(body_len as u64, config.max_request_body as u64),
        );
    }
    let target = request.target.as_bytes();
    if target.first() != Some(&b'/') || !target.iter().all(|&b| is_visible(b)) {
        return Err(Error::validation(op, Reason::RequestTarget));
    }
    let field_ok =
        |v: Option<&str>| v.is_none_or(|v| !v.is_empty() && v.bytes().all(is_field_byte));
    if !field_ok(request.accept) {
        return Err(Error::validation(op, Reason::Accept));
    }
    if !field_ok(request.content_type) {
        return Err(Error::validation(op, Reason::ContentType));
    }

    out.reserve(160 + target.len() + config.host.len());
    out.extend_from_slice(request.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target);
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(config.host.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(token) = &config.bearer {
        out.extend_from_slice(b"Authorization: Bearer ");
        out.extend_from_slice(token.expose().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(ct) = request.content_type {
        push_header(out, "Content-Type", ct.as_bytes());
    }
    if body_len > 0 || matches!(request.method, Method::Post | Method::Put) {
        let mut digits = [0u8; 20];
        push_header(
            out,
            "Content-Length",
            format_u64(body_len as u64, &mut digits),
        );
    }
    if let Some(accept) = request.accept {
        push_header(out, "Accept", accept.as_bytes());
    }
    out.extend_from_slice(b"Accept-Encoding: identity\r\n");
    push_header(out, "User-Agent", config.user_agent.as_bytes());
    if !config.keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

fn push_header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn format_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Reason;
    use std::time::Instant;

    use super::*;
    use crate::secret::Secret;

    #[allow(clippy::disallowed_methods)] // an arbitrary origin for the deadline
    fn cfg() -> ExchangeConfig {
        ExchangeConfig::new(
            "worker:8080",
            Instant::now() + std::time::Duration::from_secs(5),
        )
    }

    #[test]
    fn get_has_no_content_length() {
        let req = Request::new(Operation::Health, Method::Get, "/health".into())
            .accept("application/json");
        let mut out = Vec::new();
        encode_head(&req, &cfg(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                "GET /health HTTP/1.1\r\nHost: worker:8080\r\nAccept: application/json\r\n\
                 Accept-Encoding: identity\r\nUser-Agent: {DEFAULT_USER_AGENT}\r\n\r\n",
                DEFAULT_USER_AGENT = super::super::config::DEFAULT_USER_AGENT
            )
        );
    }

    #[test]
    fn bodyless_post_says_zero_and_bearer_is_sent() {
        let req = Request::new(
            Operation::Start,
            Method::Post,
            "/api/v1/machines/a/start".into(),
        );
        let config = cfg().bearer(Secret::new("tok"));
        let mut out = Vec::new();
        encode_head(&req, &config, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\r\nContent-Length: 0\r\n"), "{text}");
        assert!(text.contains("\r\nAuthorization: Bearer tok\r\n"), "{text}");
        assert!(!text.contains("Content-Type"));
    }

    #[test]
    fn bad_target_and_host_are_refused_without_output() {
        let mut out = Vec::new();
        let req = Request::new(Operation::Get, Method::Get, "/a b".into());
        let e = encode_head(&req, &cfg(), &mut out).unwrap_err();
        assert_eq!(
            (e.reason(), e.operation()),
            (Reason::RequestTarget, Operation::Get)
        );
        let req = Request::new(Operation::Get, Method::Get, "a".into());
        assert!(encode_head(&req, &cfg(), &mut out).is_err());
        let mut c = cfg();
        c.host = "h\r\nX: y".into();
        let req = Request::new(Operation::Get, Method::Get, "/".into());
        assert_eq!(
            encode_head(&req, &c, &mut out).unwrap_err().reason(),
            Reason::Host
        );
        assert!(out.is_empty());
    }

    #[test]
    fn format_u64_edges() {
        let mut b = [0u8; 20];
        assert_eq!(format_u64(0, &mut b), b"0");
        assert_eq!(format_u64(u64::MAX, &mut b), b"18446744073709551615");
    }
}
