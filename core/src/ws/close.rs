//! Close codes (RFC 6455 §7.4) and close-frame payloads.

use crate::Reason;
use core::fmt;

/// A WebSocket close status code (RFC 6455 §7.4.1).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CloseCode(u16);

impl CloseCode {
    /// 1000: normal closure.
    pub const NORMAL: Self = Self(1000);
    /// 1001: the endpoint is going away.
    pub const GOING_AWAY: Self = Self(1001);
    /// 1002: protocol error.
    pub const PROTOCOL_ERROR: Self = Self(1002);
    /// 1003: a data type the endpoint cannot accept.
    pub const UNSUPPORTED_DATA: Self = Self(1003);
    /// 1005: no status code was present (never on the wire).
    pub const NO_STATUS: Self = Self(1005);
    /// 1006: the connection ended without a close frame (never on the wire).
    pub const ABNORMAL: Self = Self(1006);
    /// 1007: a text message was not valid UTF-8.
    pub const INVALID_PAYLOAD: Self = Self(1007);
    /// 1008: policy violation.
    pub const POLICY_VIOLATION: Self = Self(1008);
    /// 1009: a message was too big to process.
    pub const MESSAGE_TOO_BIG: Self = Self(1009);
    /// 1010: a required extension was not negotiated.
    pub const MANDATORY_EXTENSION: Self = Self(1010);
    /// 1011: internal error.
    pub const INTERNAL_ERROR: Self = Self(1011);

    /// Wraps a raw code without checking it; see [`CloseCode::is_sendable`].
    pub const fn from_u16(code: u16) -> Self {
        Self(code)
    }

    /// The numeric code.
    pub const fn as_u16(self) -> u16 {
        self.0
    }

    /// True when the code may appear in a close frame on the wire
    /// (RFC 6455 §7.4.1–§7.4.2 and the IANA registry): 1000–1003, 1007–1014
    /// and 3000–4999. 1004 is reserved, 1005/1006/1015 are never sent, the
    /// rest of 0–2999 is reserved for the protocol and ≥ 5000 is undefined.
    pub const fn is_sendable(self) -> bool {
        matches!(self.0, 1000..=1003 | 1007..=1014 | 3000..=4999)
    }
}

impl fmt::Debug for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CloseCode({})", self.0)
    }
}

/// Longest close reason (RFC 6455 §5.5: a control payload is at most 125
/// bytes, two of them the code).
pub const MAX_CLOSE_REASON: usize = 123;

/// The UTF-8 reason of a close frame (at most [`MAX_CLOSE_REASON`] bytes),
/// stored inline so [`CloseInfo`](super::CloseInfo) stays `Copy`.
///
/// Its `Debug` output shows the length only: the text is the peer's and
/// may echo anything. [`CloseReason::as_str`] gives it exactly.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CloseReason {
    bytes: [u8; MAX_CLOSE_REASON],
    len: u8,
}

impl CloseReason {
    /// No reason.
    pub const EMPTY: Self = Self {
        bytes: [0; MAX_CLOSE_REASON],
        len: 0,
    };

    /// A reason from UTF-8 bytes; `None` when they are not UTF-8 or longer
    /// than [`MAX_CLOSE_REASON`].
    pub fn from_utf8(reason: &[u8]) -> Option<Self> {
        if reason.len() > MAX_CLOSE_REASON || core::str::from_utf8(reason).is_err() {
            return None;
        }
        let mut bytes = [0; MAX_CLOSE_REASON];
        bytes[..reason.len()].copy_from_slice(reason);
        // Checked above: at most 123.
        Some(Self {
            bytes,
            len: reason.len() as u8,
        })
    }

    /// The reason text, exactly as received.
    pub fn as_str(&self) -> &str {
        // Validated at construction; the fallback is unreachable.
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    /// The reason's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// True when there is no reason.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for CloseReason {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl fmt::Debug for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CloseReason(len {})", self.len)
    }
}

/// Why a close payload was refused (maps to close 1002 or 1007).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClosePayloadError {
    /// One byte, or a code that must not be on the wire (the code is
    /// attached when there was one).
    Protocol(Reason, Option<u16>),
    /// The reason is not UTF-8.
    InvalidUtf8(CloseCode),
}

/// Parses a received close payload (RFC 6455 §5.5.1): empty, or a 2-byte code
/// followed by a UTF-8 reason of at most 123 bytes.
pub(crate) fn parse_close_payload(
    payload: &[u8],
) -> Result<Option<(CloseCode, CloseReason)>, ClosePayloadError> {
    match payload {
        [] => Ok(None),
        [_] => Err(ClosePayloadError::Protocol(
            Reason::ClosePayloadOneByte,
            None,
        )),
        [hi, lo, reason @ ..] => {
            let code = CloseCode(u16::from_be_bytes([*hi, *lo]));
            if !code.is_sendable() {
                return Err(ClosePayloadError::Protocol(
                    Reason::CloseCodeInvalid,
                    Some(code.0),
                ));
            }
            if reason.len() > MAX_CLOSE_REASON {
                // The frame header check bounds a control payload by 125,
                // so only a caller outside the decoder can get here.
                return Err(ClosePayloadError::Protocol(
                    Reason::CloseReasonTooLong,
                    Some(code.0),
                ));
            }
            match CloseReason::from_utf8(reason) {
                Some(reason) => Ok(Some((code, reason))),
                None => Err(ClosePayloadError::InvalidUtf8(code)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_codes_follow_rfc_6455_7_4() {
        for ok in [
            1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1014, 3000, 4999,
        ] {
            assert!(CloseCode(ok).is_sendable(), "{ok}");
        }
        for bad in [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, u16::MAX] {
            assert!(!CloseCode(bad).is_sendable(), "{bad}");
        }
    }

    #[test]
    fn close_payload_rules() {
        assert_eq!(parse_close_payload(&[]), Ok(None));
        assert!(matches!(
            parse_close_payload(&[3]),
            Err(ClosePayloadError::Protocol(_, None))
        ));
        let (code, reason) = parse_close_payload(&[3, 0xe8, b'o', b'k'])
            .ok()
            .flatten()
            .map_or((CloseCode(0), CloseReason::EMPTY), |c| c);
        assert_eq!((code, reason.as_str()), (CloseCode::NORMAL, "ok"));
        assert_eq!(
            parse_close_payload(&[3, 0xed]),
            Err(ClosePayloadError::Protocol(
                Reason::CloseCodeInvalid,
                Some(1005)
            ))
        );
        assert_eq!(
            parse_close_payload(&[3, 0xe8, 0xff]),
            Err(ClosePayloadError::InvalidUtf8(CloseCode::NORMAL))
        );
    }

    #[test]
    fn close_reason_is_bounded_at_123_bytes() {
        let mut payload = vec![3, 0xe8];
        payload.extend(std::iter::repeat_n(b'r', MAX_CLOSE_REASON));
        let parsed = parse_close_payload(&payload).ok().flatten();
        assert_eq!(parsed.map(|(_, r)| r.len()), Some(MAX_CLOSE_REASON));
        payload.push(b'r');
        assert_eq!(
            parse_close_payload(&payload),
            Err(ClosePayloadError::Protocol(
                Reason::CloseReasonTooLong,
                Some(1000)
            ))
        );
        assert!(CloseReason::from_utf8(&[b'x'; MAX_CLOSE_REASON]).is_some());
        assert!(CloseReason::from_utf8(&[b'x'; MAX_CLOSE_REASON + 1]).is_none());
        // Debug shows the length, never the peer's text.
        let r = CloseReason::from_utf8(b"secret output").map(|r| format!("{r:?}"));
        assert_eq!(r.as_deref(), Some("CloseReason(len 13)"));
    }
}
