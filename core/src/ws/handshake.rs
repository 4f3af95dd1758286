//! The opening handshake (RFC 6455 §4.1, §4.2.2): the upgrade request and
//! the checks on the 101 reply.

use crate::Reason;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha1::{Digest, Sha1};

use super::config::WsConfig;
use crate::error::{Error, Evidence};

/// RFC 6455 §1.3: the GUID appended to the key before hashing.
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Most headers a 101 reply may carry.
const MAX_HEADERS: usize = 64;

/// `Sec-WebSocket-Key`: the 16 caller-supplied random bytes in base64.
pub fn encode_key(key: &[u8; 16]) -> String {
    STANDARD.encode(key)
}

/// The `Sec-WebSocket-Accept` value a server must answer `key_b64` with.
pub fn accept_for(key_b64: &str) -> String {
    let mut h = Sha1::new();
    h.update(key_b64.as_bytes());
    h.update(GUID);
    STANDARD.encode(h.finalize())
}

/// Appends the upgrade request head to `out`. No extension and no
/// subprotocol are offered.
pub(crate) fn write_request(out: &mut Vec<u8>, config: &WsConfig, key_b64: &str) {
    let mut push = |parts: &[&str]| {
        for p in parts {
            out.extend_from_slice(p.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    };
    push(&["GET ", &config.target, " HTTP/1.1"]);
    push(&["Host: ", &config.host]);
    push(&["Connection: Upgrade"]);
    push(&["Upgrade: websocket"]);
    push(&["Sec-WebSocket-Version: 13"]);
    push(&["Sec-WebSocket-Key: ", key_b64]);
    if let Some(token) = &config.authorization {
        push(&["Authorization: Bearer ", token.expose()]);
    }
    push(&[]);
}

/// Finds the end of a head (`\r\n\r\n`) in `buf`, scanning from `from`
/// (the caller remembers how far it looked, so the scan stays linear).
pub(crate) fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(3);
    buf.get(start..)?
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| start + i + 4)
}

/// Checks a complete reply head (terminator included).
///
/// # Errors
/// 401/403 → `authentication`; any other non-101 status, a bad head, a
/// missing or wrong `Upgrade`, `Connection` or `Sec-WebSocket-Accept`, or an
/// extension or subprotocol that was not asked for → `protocol`. The
/// evidence is `dispatch_uncertain`: the request reached something.
pub(crate) fn check_reply(
    head: &[u8],
    expected_accept: &str,
    config: &WsConfig,
) -> Result<(), Error> {
    let op = config.operation;
    let proto = |reason| Error::protocol(op, reason);
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(proto(Reason::MalformedHead)),
        Err(httparse::Error::TooManyHeaders) => return Err(proto(Reason::TooManyHeaders)),
        Err(_) => return Err(proto(Reason::MalformedHead)),
    }
    if resp.version != Some(1) {
        return Err(proto(Reason::HttpVersion));
    }
    let status = resp.code.unwrap_or(0);
    match status {
        101 => {}
        401 | 403 => {
            return Err(Error::authentication(
                op,
                Evidence::DispatchUncertain,
                Reason::UpgradeRefused,
            )
            .with_status(status));
        }
        _ => return Err(proto(Reason::UnexpectedStatus).with_status(status)),
    }
    let (mut upgrade, mut connection, mut accept) = (0u32, false, 0u32);
    let mut accept_ok = false;
    for h in resp.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("upgrade") {
            upgrade += 1;
            if !has_token(h.value, "websocket") {
                return Err(proto(Reason::UpgradeNotWebsocket));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            connection |= has_token(h.value, "upgrade");
        } else if name.eq_ignore_ascii_case("sec-websocket-accept") {
            accept += 1;
            accept_ok = trim(h.value) == expected_accept.as_bytes();
        } else if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            return Err(proto(Reason::UnrequestedExtension));
        } else if name.eq_ignore_ascii_case("sec-websocket-protocol") {
            return Err(proto(Reason::UnrequestedSubprotocol));
        }
    }
    if upgrade != 1 {
        return Err(proto(Reason::UpgradeHeader));
    }
    if !connection {
        return Err(proto(Reason::ConnectionHeader));
    }
    if accept != 1 || !accept_ok {
        return Err(proto(Reason::AcceptMismatch));
    }
    Ok(())
}

fn trim(v: &[u8]) -> &[u8] {
    v.trim_ascii()
}

/// True when the comma-separated header value lists `token` (ASCII
/// case-insensitive).
fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| trim(t).eq_ignore_ascii_case(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_6455_sample_accept() {
        // RFC 6455 §1.3 / §4.2.2.
        let key = encode_key(b"the sample nonce");
        assert_eq!(key, "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(accept_for(&key), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn head_end_scan_resumes_across_chunks() {
        let buf = b"HTTP/1.1 101 OK\r\n\r\nxx";
        assert_eq!(find_head_end(&buf[..18], 0), None);
        assert_eq!(find_head_end(buf, 18), Some(19));
        assert_eq!(find_head_end(buf, 0), Some(19));
    }

    #[test]
    fn connection_tokens() {
        assert!(has_token(b"keep-alive, Upgrade", "upgrade"));
        assert!(!has_token(b"upgraded", "upgrade"));
    }
}
