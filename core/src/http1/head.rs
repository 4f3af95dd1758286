//! Response-head scanning and decoding (httparse underneath).
//!
//! The end of a head is found by a linear scan that resumes where it stopped
//! (`HeadScanner`), so a head fed one byte at a time costs the same as one
//! fed whole, and the byte cap is judged on the logical head, not on reads.
//! httparse then parses exactly the complete head once.

use crate::Reason;
use core::mem::MaybeUninit;

use super::config::MAX_HEADERS_CEILING;
use super::types::ResponseHead;
use crate::error::{Error, Evidence, Operation};

/// Where a head ends, found incrementally.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HeadScanner {
    /// Offset (relative to the head's start) from which to resume scanning.
    resume: usize,
}

/// What scanning found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The head ends at this length (terminating blank line included).
    Complete(usize),
    /// No end yet within the bytes available.
    Partial,
}

impl HeadScanner {
    /// True before the first scan of this head.
    pub(crate) fn is_fresh(&self) -> bool {
        self.resume == 0
    }

    /// Scans `buf` (the head so far, from its first byte) for the blank line
    /// ending it. Only looks at bytes it has not decided on before.
    pub(crate) fn scan(&mut self, buf: &[u8]) -> Scan {
        let mut i = self.resume;
        while i < buf.len() {
            let Some(off) = buf[i..].iter().position(|&b| b == b'\n') else {
                self.resume = buf.len();
                return Scan::Partial;
            };
            let nl = i + off;
            match buf.get(nl + 1) {
                None => {
                    self.resume = nl;
                    return Scan::Partial;
                }
                Some(b'\n') => return Scan::Complete(nl + 2),
                Some(b'\r') => match buf.get(nl + 2) {
                    None => {
                        self.resume = nl;
                        return Scan::Partial;
                    }
                    Some(b'\n') => return Scan::Complete(nl + 3),
                    Some(_) => i = nl + 1,
                },
                Some(_) => i = nl + 1,
            }
        }
        self.resume = buf.len();
        Scan::Partial
    }
}

/// A decoded head: either an interim (1xx other than 101) to skip, or the
/// final head with its body framing.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// 100, 102, 103, … : skipped.
    Interim,
    /// The final head.
    Final(ResponseHead, Framing),
}

/// How the body of a final response is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (204, 304, 101).
    None,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Read until the peer closes.
    Close,
}

/// Parses one complete head (`head` ends with its blank line) with at most
/// `max_headers` fields and validates framing, encoding and content type.
/// Errors carry operation `http` and evidence `dispatch_uncertain`; the
/// exchange re-attributes them.
pub(crate) fn decode(head: &[u8], max_headers: usize) -> Result<Decoded, Error> {
    let mut table = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS_CEILING];
    let table = &mut table[..max_headers.min(MAX_HEADERS_CEILING)];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        head,
        table,
    );
    match parsed {
        Ok(httparse::Status::Complete(n)) if n == head.len() => interpret(&response),
        Ok(_) => Err(Error::protocol(Operation::Http, Reason::MalformedHead)),
        Err(httparse::Error::TooManyHeaders) => Err(Error::output_limit(
            Operation::Http,
            Evidence::DispatchUncertain,
            Reason::HeaderCount,
        )
        .with_limit(max_headers as u64 + 1, max_headers as u64)),
        Err(_) => Err(Error::protocol(Operation::Http, Reason::MalformedHead)),
    }
}

/// The fast path for a head that arrived whole: parses `window` (the
/// unscanned head bytes, cut at the head-byte budget) directly. Returns
/// `None` unless httparse finds a complete, valid head, in which case the
/// outcome (its length and decoding) is the one [`HeadScanner`] followed by
/// [`decode`] would give: a head that starts with its status line ends at
/// its first empty line for both. Anything else (partial, malformed, too
/// many headers) is left to the incremental path, so verdicts never depend
/// on how the head was split into reads.
pub(crate) fn decode_whole(
    window: &[u8],
    max_headers: usize,
) -> Option<Result<(usize, Decoded), Error>> {
    if !window.starts_with(b"HTTP/") {
        return None;
    }
    let mut table = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS_CEILING];
    let table = &mut table[..max_headers.min(MAX_HEADERS_CEILING)];
    let mut response = httparse::Response::new(&mut []);
    match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        window,
        table,
    ) {
        Ok(httparse::Status::Complete(n)) => Some(interpret(&response).map(|d| (n, d))),
        _ => None,
    }
}

/// Status, framing, encoding and content-type rules on a parsed head.
fn interpret(response: &httparse::Response<'_, '_>) -> Result<Decoded, Error> {
    let status = response.code.unwrap_or(0);
    if !(100..=599).contains(&status) {
        return Err(Error::protocol(Operation::Http, Reason::StatusCode));
    }
    if (100..200).contains(&status) && status != 101 {
        return Ok(Decoded::Interim);
    }
    let http11 = response.version == Some(1);

    let mut content_length: Option<u64> = None;
    let mut transfer_encoding = false;
    let mut chunked = false;
    let mut content_type: Option<&[u8]> = None;
    let mut close = false;
    let mut keep_alive_token = false;
    for h in response.headers.iter() {
        let value = h.value;
        match known(h.name.as_bytes()) {
            Known::Other => {}
            Known::ContentLength => {
                if content_length.is_some() {
                    return Err(Error::protocol(
                        Operation::Http,
                        Reason::DuplicateContentLength,
                    ));
                }
                content_length = Some(
                    parse_decimal(value)
                        .ok_or_else(|| Error::protocol(Operation::Http, Reason::ContentLength))?,
                );
            }
            Known::TransferEncoding => {
                for coding in tokens(value) {
                    // Only a single `chunked` is understood; anything else,
                    // including `chunked` twice or after another coding, is refused.
                    if chunked || !eq_lower(coding, b"chunked") {
                        return Err(Error::protocol(Operation::Http, Reason::TransferEncoding));
                    }
                    chunked = true;
                }
                transfer_encoding = true;
            }
            Known::ContentEncoding => {
                if !tokens(value).all(|c| eq_lower(c, b"identity")) {
                    return Err(Error::protocol(Operation::Http, Reason::ContentEncoding));
                }
            }
            Known::ContentType => {
                if content_type.is_some() {
                    return Err(Error::protocol(
                        Operation::Http,
                        Reason::DuplicateContentType,
                    ));
                }
                content_type = Some(value);
            }
            Known::Connection => {
                for token in tokens(value) {
                    close |= eq_lower(token, b"close");
                    keep_alive_token |= eq_lower(token, b"keep-alive");
                }
            }
        }
    }
    if transfer_encoding && !chunked {
        return Err(Error::protocol(Operation::Http, Reason::TransferEncoding));
    }
    if transfer_encoding && content_length.is_some() {
        return Err(Error::protocol(
            Operation::Http,
            Reason::ContentLengthAndTransferEncoding,
        ));
    }
    let content_type = match content_type {
        None => None,
        Some(v) => Some(
            core::str::from_utf8(v)
                .map_err(|_| Error::protocol(Operation::Http, Reason::ContentType))?
                .to_owned(),
        ),
    };
    let framing = if status == 101 || status == 204 || status == 304 {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = content_length {
        Framing::Length(n)
    } else {
        Framing::Close
    };
    let keep_alive =
        status != 101 && framing != Framing::Close && !close && (http11 || keep_alive_token);
    let head = ResponseHead {
        status,
        content_type,
        content_length: match framing {
            Framing::Length(n) => Some(n),
            _ => None,
        },
        chunked,
        keep_alive,
    };
    Ok(Decoded::Final(head, framing))
}

/// The header fields the decoder looks at.
enum Known {
    ContentLength,
    TransferEncoding,
    ContentEncoding,
    ContentType,
    Connection,
    Other,
}

/// Classifies a field name (case-insensitive), by length first so most
/// names cost one comparison of lengths.
fn known(name: &[u8]) -> Known {
    let (candidate, kind): (&[u8], _) = match name.len() {
        10 => (b"connection", Known::Connection),
        12 => (b"content-type", Known::ContentType),
        14 => (b"content-length", Known::ContentLength),
        16 => (b"content-encoding", Known::ContentEncoding),
        17 => (b"transfer-encoding", Known::TransferEncoding),
        _ => return Known::Other,
    };
    if eq_lower(name, candidate) {
        kind
    } else {
        Known::Other
    }
}

/// Case-insensitive equality of a header name or token with `lower`, a
/// lowercase ASCII word of letters, digits and `-`. Setting bit 0x20 maps
/// `A-Z` onto `a-z` and no other byte httparse lets through (no CR, LF or
/// other control in names or values) onto a letter, digit or `-`, so the
/// comparison is exact; it runs eight bytes at a time.
fn eq_lower(a: &[u8], lower: &[u8]) -> bool {
    const CASE: u64 = 0x2020_2020_2020_2020;
    if a.len() != lower.len() {
        return false;
    }
    let word = |s: &[u8], i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[i..i + 8]);
        u64::from_le_bytes(w)
    };
    if a.len() < 8 {
        return a.iter().zip(lower).all(|(&x, &y)| x | 0x20 == y | 0x20);
    }
    // Whole words, then one last (overlapping) word for the tail.
    let mut i = 0;
    while i + 8 <= a.len() {
        if word(a, i) | CASE != word(lower, i) | CASE {
            return false;
        }
        i += 8;
    }
    let last = a.len() - 8;
    i == a.len() || word(a, last) | CASE == word(lower, last) | CASE
}

/// `1*DIGIT` as a u64; `None` on anything else or overflow.
fn parse_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// The comma-separated, OWS-trimmed, non-empty elements of a header value.
fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',')
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Category;
    use crate::Reason;

    fn scan_all(buf: &[u8]) -> Scan {
        HeadScanner::default().scan(buf)
    }

    #[test]
    fn scanner_finds_crlf_and_lf_ends_and_resumes() {
        assert_eq!(scan_all(b"HTTP/1.1 200 OK\r\n\r\nbody"), Scan::Complete(19));
        assert_eq!(scan_all(b"HTTP/1.1 200 OK\n\nbody"), Scan::Complete(17));
        assert_eq!(scan_all(b"HTTP/1.1 200 OK\r\nA: b\r\n"), Scan::Partial);
        let full = b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n";
        let mut s = HeadScanner::default();
        for end in 0..full.len() {
            assert_eq!(s.scan(&full[..end]), Scan::Partial, "{end}");
        }
        assert_eq!(s.scan(full), Scan::Complete(full.len()));
    }

    fn final_head(raw: &str) -> Result<(ResponseHead, Framing), Error> {
        match decode(raw.as_bytes(), 64)? {
            Decoded::Final(h, f) => Ok((h, f)),
            Decoded::Interim => panic!("interim"),
        }
    }

    #[test]
    fn framing_rules() {
        let (h, f) = final_head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!((f, h.keep_alive), (Framing::Length(5), true));
        let (h, f) = final_head("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
        assert_eq!((f, h.chunked, h.keep_alive), (Framing::Chunked, true, true));
        let (h, f) = final_head("HTTP/1.1 200 OK\r\n\r\n").unwrap();
        assert_eq!((f, h.keep_alive), (Framing::Close, false));
        let (h, _) = final_head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        let (h, _) =
            final_head("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
                .unwrap();
        assert!(h.keep_alive);
        let (h, _) =
            final_head("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                .unwrap();
        assert!(!h.keep_alive);
        let (_, f) = final_head("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n").unwrap();
        assert_eq!(f, Framing::None);
        assert!(matches!(
            decode(b"HTTP/1.1 100 Continue\r\n\r\n", 64),
            Ok(Decoded::Interim)
        ));
        let (h, f) = final_head("HTTP/1.1 101 Switching Protocols\r\n\r\n").unwrap();
        assert_eq!((h.status, f, h.keep_alive), (101, Framing::None, false));
    }

    #[test]
    fn refusals() {
        let cases = [
            (
                "Content-Length: 1\r\nContent-Length: 1\r\n",
                Reason::DuplicateContentLength,
            ),
            ("Content-Length: +1\r\n", Reason::ContentLength),
            ("Content-Length: 1 2\r\n", Reason::ContentLength),
            (
                "Content-Length: 99999999999999999999\r\n",
                Reason::ContentLength,
            ),
            (
                "Transfer-Encoding: gzip, chunked\r\n",
                Reason::TransferEncoding,
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                Reason::TransferEncoding,
            ),
            ("Transfer-Encoding: ,\r\n", Reason::TransferEncoding),
            (
                "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n",
                Reason::ContentLengthAndTransferEncoding,
            ),
            ("Content-Encoding: gzip\r\n", Reason::ContentEncoding),
            (
                "Content-Type: a/b\r\ncontent-type: a/b\r\n",
                Reason::DuplicateContentType,
            ),
        ];
        for (headers, reason) in cases {
            let e = final_head(&format!("HTTP/1.1 200 OK\r\n{headers}\r\n")).unwrap_err();
            assert_eq!(
                (e.category(), e.reason()),
                (Category::Protocol, reason),
                "{headers}"
            );
        }
        assert!(final_head("HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\n\r\n").is_ok());
        assert_eq!(
            final_head("HTTP/1.1 099 X\r\n\r\n").unwrap_err().reason(),
            Reason::StatusCode
        );
        assert_eq!(
            final_head("HTTP/1.1 2000 X\r\n\r\n").unwrap_err().reason(),
            Reason::MalformedHead
        );
    }

    #[test]
    fn eq_lower_is_exact_case_folding() {
        assert!(eq_lower(b"Transfer-Encoding", b"transfer-encoding"));
        assert!(eq_lower(b"KEEP-ALIVE", b"keep-alive"));
        assert!(!eq_lower(b"Content-Typf", b"content-type"));
        assert!(!eq_lower(b"content-typ", b"content-type"));
        // Every byte httparse could pass, against every target byte.
        for x in (0x20u8..=0xff).chain([b'\t']) {
            for y in b"abcdefghijklmnopqrstuvwxyz0123456789-" {
                assert_eq!(
                    eq_lower(&[x], &[*y]),
                    x.to_ascii_lowercase() == *y,
                    "{x:#x} {y}"
                );
            }
        }
    }

    #[test]
    fn header_count_at_n_and_n_plus_one() {
        let head = |n: usize| {
            let mut s = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..n {
                s.push_str(&format!("X-{i}: v\r\n"));
            }
            s.push_str("\r\n");
            s
        };
        assert!(decode(head(3).as_bytes(), 3).is_ok());
        let e = decode(head(4).as_bytes(), 3).unwrap_err();
        assert_eq!(
            (e.category(), e.reason()),
            (Category::OutputLimit, Reason::HeaderCount)
        );
        assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((4, 3)));
    }
}
