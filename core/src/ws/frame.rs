//! Frame headers (RFC 6455 §5.2): parsing with every protocol check, and
//! encoding of client headers.

use crate::Reason;
/// A frame opcode (RFC 6455 §5.2, §11.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// 0x0: continuation of a fragmented message.
    Continuation,
    /// 0x1: text (UTF-8) data.
    Text,
    /// 0x2: binary data.
    Binary,
    /// 0x8: close.
    Close,
    /// 0x9: ping.
    Ping,
    /// 0xA: pong.
    Pong,
}

impl Opcode {
    /// The 4-bit wire value.
    pub const fn as_u8(self) -> u8 {
        match self {
            Self::Continuation => 0x0,
            Self::Text => 0x1,
            Self::Binary => 0x2,
            Self::Close => 0x8,
            Self::Ping => 0x9,
            Self::Pong => 0xA,
        }
    }

    /// The opcode for a 4-bit wire value; `None` for the reserved values
    /// 0x3–0x7 and 0xB–0xF.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0x0 => Some(Self::Continuation),
            0x1 => Some(Self::Text),
            0x2 => Some(Self::Binary),
            0x8 => Some(Self::Close),
            0x9 => Some(Self::Ping),
            0xA => Some(Self::Pong),
            _ => None,
        }
    }

    /// True for close, ping and pong (RFC 6455 §5.5).
    pub const fn is_control(self) -> bool {
        matches!(self, Self::Close | Self::Ping | Self::Pong)
    }
}

/// The largest frame header: 2 bytes, 8 length bytes, 4 mask bytes.
pub const MAX_HEADER_LEN: usize = 14;

/// The largest control-frame payload (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// FIN bit: the last frame of a message.
    pub fin: bool,
    /// The opcode.
    pub opcode: Opcode,
    /// The masking key, when the MASK bit is set.
    pub mask: Option<[u8; 4]>,
    /// The payload length the header declares.
    pub payload_len: u64,
    /// Length of the header itself in bytes.
    pub header_len: usize,
}

/// Why a header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// A rule of RFC 6455 §5 was broken; the reason is a fixed code.
    Protocol(Reason),
    /// The declared payload exceeds the frame cap.
    TooLarge {
        /// Declared length.
        len: u64,
        /// The cap.
        max: u64,
    },
}

/// Parses a server-to-client frame header from the start of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed. Checks, as soon as the
/// bytes that decide them are present: RSV bits clear (no extension was
/// negotiated), opcode not reserved, MASK clear (RFC 6455 §5.1: a server
/// never masks), control frames unfragmented and ≤ 125 bytes, minimal
/// length encoding with the top bit of a 64-bit length clear (§5.2), and a
/// data payload no longer than `max_payload` (decided from the header,
/// before any payload is buffered).
///
/// # Errors
/// [`HeaderError`] for a broken rule or a declared length over the cap.
#[inline]
pub fn parse_server_header(
    buf: &[u8],
    max_payload: u64,
) -> Result<Option<FrameHeader>, HeaderError> {
    let [b0, b1, ..] = *buf else {
        return Ok(None);
    };
    if b0 & 0x70 != 0 {
        return Err(HeaderError::Protocol(Reason::RsvBitsSet));
    }
    let Some(opcode) = Opcode::from_u8(b0 & 0x0f) else {
        return Err(HeaderError::Protocol(Reason::ReservedOpcode));
    };
    let fin = b0 & 0x80 != 0;
    if b1 & 0x80 != 0 {
        return Err(HeaderError::Protocol(Reason::MaskedServerFrame));
    }
    let len7 = b1 & 0x7f;
    if opcode.is_control() {
        if !fin {
            return Err(HeaderError::Protocol(Reason::FragmentedControlFrame));
        }
        if len7 > 125 {
            return Err(HeaderError::Protocol(Reason::ControlFrameTooLong));
        }
    }
    let (payload_len, header_len) = match len7 {
        126 => {
            let [_, _, a, b, ..] = *buf else {
                return Ok(None);
            };
            let len = u64::from(u16::from_be_bytes([a, b]));
            if len < 126 {
                return Err(HeaderError::Protocol(Reason::NonMinimalLength));
            }
            (len, 4)
        }
        127 => {
            let Some(bytes) = buf.get(2..10) else {
                return Ok(None);
            };
            let mut arr = [0u8; 8];
            arr.copy_from_slice(bytes);
            let len = u64::from_be_bytes(arr);
            if len >> 63 != 0 {
                return Err(HeaderError::Protocol(Reason::LengthTopBitSet));
            }
            if len <= 0xffff {
                return Err(HeaderError::Protocol(Reason::NonMinimalLength));
            }
            (len, 10)
        }
        n => (u64::from(n), 2),
    };
    if !opcode.is_control() && payload_len > max_payload {
        return Err(HeaderError::TooLarge {
            len: payload_len,
            max: max_payload,
        });
    }
    Ok(Some(FrameHeader {
        fin,
        opcode,
        mask: None,
        payload_len,
        header_len,
    }))
}

/// Parses any frame header (either direction, masked or not) without the
/// client-side policy checks; used by tests and fake servers to read what a
/// client sent.
///
/// Returns `None` when more bytes are needed or the opcode is reserved.
pub fn parse_any_header(buf: &[u8]) -> Option<FrameHeader> {
    let [b0, b1, ..] = *buf else {
        return None;
    };
    let opcode = Opcode::from_u8(b0 & 0x0f)?;
    let (payload_len, mut header_len) = match b1 & 0x7f {
        126 => (
            u64::from(u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?])),
            4,
        ),
        127 => {
            let mut arr = [0u8; 8];
            arr.copy_from_slice(buf.get(2..10)?);
            (u64::from_be_bytes(arr), 10)
        }
        n => (u64::from(n), 2),
    };
    let mask = if b1 & 0x80 != 0 {
        let m = buf.get(header_len..header_len + 4)?;
        header_len += 4;
        Some([m[0], m[1], m[2], m[3]])
    } else {
        None
    };
    Some(FrameHeader {
        fin: b0 & 0x80 != 0,
        opcode,
        mask,
        payload_len,
        header_len,
    })
}

/// Appends a frame header to `out`: FIN as given, no RSV bits, the minimal
/// length encoding, and the masking key when `mask` is `Some`.
#[inline]
pub fn encode_header(
    out: &mut Vec<u8>,
    fin: bool,
    opcode: Opcode,
    payload_len: usize,
    mask: Option<[u8; 4]>,
) {
    let mut hdr = [0u8; MAX_HEADER_LEN];
    hdr[0] = (if fin { 0x80 } else { 0 }) | opcode.as_u8();
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    let mut n = if payload_len < 126 {
        // Truncation is exact: payload_len < 126.
        hdr[1] = mask_bit | payload_len as u8;
        2
    } else if let Ok(len16) = u16::try_from(payload_len) {
        hdr[1] = mask_bit | 126;
        hdr[2..4].copy_from_slice(&len16.to_be_bytes());
        4
    } else {
        hdr[1] = mask_bit | 127;
        hdr[2..10].copy_from_slice(&(payload_len as u64).to_be_bytes());
        10
    };
    if let Some(m) = mask {
        hdr[n..n + 4].copy_from_slice(&m);
        n += 4;
    }
    out.extend_from_slice(&hdr[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = 65_536;

    fn err(buf: &[u8]) -> Reason {
        match parse_server_header(buf, CAP) {
            Err(HeaderError::Protocol(r)) => r,
            other => panic!("expected protocol error, got {other:?}"),
        }
    }

    #[test]
    fn every_header_rule_is_checked() {
        assert_eq!(err(&[0x92, 0x00]), Reason::RsvBitsSet);
        assert_eq!(err(&[0xc2, 0x00]), Reason::RsvBitsSet);
        assert_eq!(err(&[0x83, 0x00]), Reason::ReservedOpcode);
        assert_eq!(err(&[0x8b, 0x00]), Reason::ReservedOpcode);
        assert_eq!(err(&[0x82, 0x81]), Reason::MaskedServerFrame);
        assert_eq!(err(&[0x09, 0x00]), Reason::FragmentedControlFrame);
        assert_eq!(err(&[0x89, 0x7e]), Reason::ControlFrameTooLong);
        assert_eq!(err(&[0x82, 0x7e, 0x00, 0x7d]), Reason::NonMinimalLength);
        assert_eq!(
            err(&[0x82, 0x7f, 0, 0, 0, 0, 0, 0, 0xff, 0xff]),
            Reason::NonMinimalLength
        );
        assert_eq!(
            err(&[0x82, 0x7f, 0x80, 0, 0, 0, 0, 0, 0, 0]),
            Reason::LengthTopBitSet
        );
    }

    #[test]
    fn frame_cap_is_decided_from_the_header() {
        // 65,536 is accepted, 65,537 refused, with no payload present.
        let ok = parse_server_header(&[0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0], CAP)
            .unwrap()
            .unwrap();
        assert_eq!(ok.payload_len, 65_536);
        assert_eq!(ok.header_len, 10);
        assert_eq!(
            parse_server_header(&[0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 1], CAP),
            Err(HeaderError::TooLarge {
                len: 65_537,
                max: CAP
            })
        );
        // A 125-byte ping passes even under a tiny data cap.
        assert!(parse_server_header(&[0x89, 125], 10).unwrap().is_some());
    }

    #[test]
    fn partial_headers_need_more() {
        assert_eq!(parse_server_header(&[], CAP), Ok(None));
        assert_eq!(parse_server_header(&[0x82], CAP), Ok(None));
        assert_eq!(parse_server_header(&[0x82, 126, 1], CAP), Ok(None));
        assert_eq!(
            parse_server_header(&[0x82, 127, 0, 0, 0, 0, 0, 1, 0], CAP),
            Ok(None)
        );
    }

    #[test]
    fn encode_uses_minimal_lengths() {
        for (len, hlen) in [(0, 2), (125, 2), (126, 4), (65_535, 4), (65_536, 10)] {
            let mut out = Vec::new();
            encode_header(&mut out, true, Opcode::Binary, len, Some([1, 2, 3, 4]));
            assert_eq!(out.len(), hlen + 4);
            let h = parse_any_header(&out).unwrap();
            assert_eq!(
                (h.payload_len, h.header_len, h.mask),
                (len as u64, hlen + 4, Some([1, 2, 3, 4]))
            );
        }
    }
}
