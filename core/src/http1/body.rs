//! Body framing: Content-Length, chunked and read-to-close bodies.
//!
//! [`BodyDecoder`] consumes raw body bytes in stream order and hands back
//! runs of payload as ranges of its input (`decode`) or appends them to a
//! caller buffer (`decode_into`), with no allocation of its own. Chunk
//! framing is decoded one byte at a time by a small state machine that never
//! rescans, so its verdicts (bad hex, size overflow, missing CRLF, extension
//! and trailer caps, the raw-byte cap) depend only on the byte stream, never
//! on how it was split into reads; the steady state of a chunked body (whole
//! chunks, plain size lines) takes a faster path with the same verdicts.

use crate::Reason;
use core::ops::Range;

use super::head::Framing;
use crate::error::{Error, Evidence, Operation};

/// Limits the body decoder enforces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyLimits {
    /// Most raw bytes (payload plus chunk framing and trailers).
    pub(crate) max_raw: u64,
    /// Longest chunk extension.
    pub(crate) max_extension: usize,
    /// Longest trailer section.
    pub(crate) max_trailer: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Payload of a Content-Length body or of a chunk: this many bytes left.
    Data { left: u64, chunked: bool },
    /// Read-to-close payload.
    UntilClose,
    /// Hex digits of a chunk size.
    Size { value: u64, digits: bool },
    /// Whitespace after the size digits, `len` bytes so far: only more
    /// whitespace, `;` (an extension) or CR may follow.
    SizeWs { value: u64, len: usize },
    /// A chunk extension (after `;`), `len` bytes so far.
    Extension { value: u64, len: usize },
    /// The LF ending a chunk-size line.
    SizeLf { value: u64 },
    /// The CR after a chunk's payload.
    DataCr,
    /// The LF after a chunk's payload.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer line.
    TrailerLine,
    /// The LF ending a trailer line.
    TrailerLf,
    /// The LF of the final empty line.
    FinalLf,
    /// The body is complete.
    Done,
}

/// What one [`BodyDecoder::decode`] call produced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Bytes of the input consumed (framing and payload).
    pub(crate) consumed: usize,
    /// A run of payload, as a range of the input.
    pub(crate) data: Option<Range<usize>>,
}

/// Streaming body decoder for one response.
#[derive(Clone, Debug)]
pub(crate) struct BodyDecoder {
    state: State,
    raw: u64,
    trailer: usize,
    limits: BodyLimits,
}

impl BodyDecoder {
    /// A decoder for `framing`. A declared Content-Length over the raw cap
    /// is refused here, before any body byte is read.
    pub(crate) fn new(framing: Framing, limits: BodyLimits) -> Result<Self, Error> {
        let state = match framing {
            Framing::None | Framing::Length(0) => State::Done,
            Framing::Length(n) if n > limits.max_raw => {
                return Err(Error::output_limit(
                    Operation::Http,
                    Evidence::DispatchUncertain,
                    Reason::ResponseBody,
                )
                .with_limit(n, limits.max_raw));
            }
            Framing::Length(n) => State::Data {
                left: n,
                chunked: false,
            },
            Framing::Chunked => State::Size {
                value: 0,
                digits: false,
            },
            Framing::Close => State::UntilClose,
        };
        Ok(Self {
            state,
            raw: 0,
            trailer: 0,
            limits,
        })
    }

    /// True once the body is complete.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes `input` (raw bytes following what was consumed before) until
    /// a run of payload is found, the body ends, or the input is used up.
    /// Input past the end of the body is left unconsumed.
    pub(crate) fn decode(&mut self, input: &[u8]) -> Result<Progress, Error> {
        if self.state == State::Done {
            return Ok(Progress {
                consumed: 0,
                data: None,
            });
        }
        let room = self.limits.max_raw - self.raw;
        let allowed = usize::try_from(room).map_or(input.len(), |r| r.min(input.len()));
        let mut i = 0;
        while i < allowed {
            match self.state {
                State::Data { left, chunked } => {
                    let n = usize::try_from(left).map_or(allowed - i, |l| l.min(allowed - i));
                    let left = left - n as u64;
                    let data = i..i + n;
                    let mut consumed = i + n;
                    self.state = match (left, chunked) {
                        (0, true) => State::DataCr,
                        (0, false) => State::Done,
                        _ => State::Data { left, chunked },
                    };
                    if self.state == State::DataCr {
                        // Take the chunk's CRLF and a plain next size line
                        // along with this payload (one call per chunk). A
                        // size line that would fail is left for the next
                        // call, so the payload is still reported first.
                        consumed += self
                            .fuse_next_chunk(&input[consumed..allowed], self.raw + consumed as u64);
                    }
                    self.raw += consumed as u64;
                    return Ok(Progress {
                        consumed,
                        data: Some(data),
                    });
                }
                State::UntilClose => {
                    self.raw += allowed as u64;
                    return Ok(Progress {
                        consumed: allowed,
                        data: Some(i..allowed),
                    });
                }
                State::Done => break,
                // Fast paths for the common framing (a chunk's CRLF, a plain
                // size line); anything else goes byte by byte below, with the
                // same verdicts.
                State::DataCr if input[i..allowed].starts_with(b"\r\n") => {
                    i += 2;
                    self.state = State::Size {
                        value: 0,
                        digits: false,
                    };
                }
                State::Size {
                    value: 0,
                    digits: false,
                } if let Some((n, value)) = plain_size_line(&input[i..allowed]) => {
                    i += n;
                    self.state = self.chunk_header(value, self.raw + i as u64)?;
                }
                _ => {
                    self.framing_byte(input[i], i)?;
                    i += 1;
                }
            }
        }
        self.raw += i as u64;
        if self.state != State::Done && i < input.len() {
            // The next byte would be one past the cap.
            return Err(Error::output_limit(
                Operation::Http,
                Evidence::DispatchUncertain,
                Reason::ResponseBody,
            )
            .with_limit(self.limits.max_raw + 1, self.limits.max_raw));
        }
        Ok(Progress {
            consumed: i,
            data: None,
        })
    }

    /// One byte of chunk framing; `at` is its offset in the current input
    /// (so `self.raw + at + 1` bytes have been seen once it is consumed).
    fn framing_byte(&mut self, b: u8, at: usize) -> Result<(), Error> {
        self.state = match self.state {
            State::Size { value, digits } => match hex(b) {
                Some(d) => {
                    if value > u64::MAX >> 4 {
                        return Err(Error::protocol(Operation::Http, Reason::ChunkSizeOverflow));
                    }
                    State::Size {
                        value: (value << 4) | u64::from(d),
                        digits: true,
                    }
                }
                None if !digits => return Err(Error::protocol(Operation::Http, Reason::ChunkSize)),
                None => match b {
                    b'\r' => State::SizeLf { value },
                    b';' => State::Extension { value, len: 1 },
                    b' ' | b'\t' => State::SizeWs { value, len: 1 },
                    b'\n' => {
                        return Err(Error::protocol(Operation::Http, Reason::ChunkMissingCrlf));
                    }
                    _ => return Err(Error::protocol(Operation::Http, Reason::ChunkSize)),
                },
            },
            State::SizeWs { value, len } => {
                if len >= self.limits.max_extension {
                    return Err(Error::output_limit(
                        Operation::Http,
                        Evidence::DispatchUncertain,
                        Reason::ChunkExtension,
                    )
                    .with_limit(len as u64 + 1, self.limits.max_extension as u64));
                }
                match b {
                    b' ' | b'\t' => State::SizeWs {
                        value,
                        len: len + 1,
                    },
                    b';' => State::Extension {
                        value,
                        len: len + 1,
                    },
                    b'\r' => State::SizeLf { value },
                    b'\n' => {
                        return Err(Error::protocol(Operation::Http, Reason::ChunkMissingCrlf));
                    }
                    // `52 junk`: after the size only whitespace, `;` or CRLF.
                    _ => return Err(Error::protocol(Operation::Http, Reason::ChunkSize)),
                }
            }
            State::Extension { value, len } => match b {
                b'\r' => State::SizeLf { value },
                b'\n' => return Err(Error::protocol(Operation::Http, Reason::ChunkMissingCrlf)),
                b'\t' | 0x20..=0x7e | 0x80..=0xff => {
                    if len >= self.limits.max_extension {
                        return Err(Error::output_limit(
                            Operation::Http,
                            Evidence::DispatchUncertain,
                            Reason::ChunkExtension,
                        )
                        .with_limit(len as u64 + 1, self.limits.max_extension as u64));
                    }
                    State::Extension {
                        value,
                        len: len + 1,
                    }
                }
                _ => return Err(Error::protocol(Operation::Http, Reason::ChunkExtension)),
            },
            State::SizeLf { value } => {
                if b != b'\n' {
                    return Err(Error::protocol(Operation::Http, Reason::ChunkMissingCrlf));
                }
                self.chunk_header(value, self.raw + at as u64 + 1)?
            }
            State::DataCr if b == b'\r' => State::DataLf,
            State::DataLf if b == b'\n' => State::Size {
                value: 0,
                digits: false,
            },
            State::DataCr | State::DataLf => {
                return Err(Error::protocol(Operation::Http, Reason::ChunkMissingCrlf));
            }
            State::TrailerStart if b == b'\r' => State::FinalLf,
            State::TrailerStart | State::TrailerLine | State::TrailerLf => {
                self.trailer += 1;
                if self.trailer > self.limits.max_trailer {
                    return Err(Error::output_limit(
                        Operation::Http,
                        Evidence::DispatchUncertain,
                        Reason::TrailerBytes,
                    )
                    .with_limit(self.trailer as u64, self.limits.max_trailer as u64));
                }
                match (self.state, b) {
                    (State::TrailerLf, b'\n') => State::TrailerStart,
                    (State::TrailerLf, _) | (_, b'\n') => {
                        return Err(Error::protocol(Operation::Http, Reason::ChunkMissingCrlf));
                    }
                    (_, b'\r') => State::TrailerLf,
                    _ => State::TrailerLine,
                }
            }
            State::FinalLf if b == b'\n' => State::Done,
            State::FinalLf => {
                return Err(Error::protocol(Operation::Http, Reason::ChunkMissingCrlf));
            }
            State::Data { .. } | State::UntilClose | State::Done => self.state,
        };
        Ok(())
    }

    /// Decodes `input` (raw bytes following what was consumed before),
    /// appending payload to `out`, until the input is used up or the body
    /// ends; returns the bytes consumed. On an error, the payload before it
    /// has been appended. Same verdicts as [`decode`](Self::decode), which
    /// it falls back to for anything but the steady state of a chunked body
    /// (whole chunks with plain size lines), handled here in a tight loop.
    pub(crate) fn decode_into(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Error> {
        let mut at = 0;
        while at < input.len() && self.state != State::Done {
            if let State::Data {
                left,
                chunked: true,
            } = self.state
            {
                // The size-line check guarantees the payload fits the cap.
                let rest = &input[at..];
                let Some(n) = usize::try_from(left).ok().filter(|&n| n <= rest.len()) else {
                    out.extend_from_slice(rest);
                    self.raw += rest.len() as u64;
                    self.state = State::Data {
                        left: left - rest.len() as u64,
                        chunked: true,
                    };
                    return Ok(input.len());
                };
                out.extend_from_slice(&rest[..n]);
                at += n;
                self.raw += n as u64;
                self.state = State::DataCr;
                let next = &input[at..];
                if next.starts_with(b"\r\n")
                    && let Some((m, value)) = plain_size_line(&next[2..])
                {
                    let seen = self.raw + 2 + m as u64;
                    if seen <= self.limits.max_raw
                        && let Ok(state) = self.chunk_header(value, seen)
                    {
                        self.state = state;
                        self.raw = seen;
                        at += 2 + m;
                    }
                }
                continue;
            }
            let progress = self.decode(&input[at..])?;
            if let Some(r) = progress.data {
                out.extend_from_slice(&input[at + r.start..at + r.end]);
            }
            if progress.consumed == 0 {
                break;
            }
            at += progress.consumed;
        }
        Ok(at)
    }

    /// In state `DataCr`, `rest` being the input right after a chunk's
    /// payload and `seen` the raw bytes before it: consumes the chunk's CRLF
    /// and a plain next size line when both are there; returns how many
    /// bytes it took. A size line that would be refused is left for the
    /// next call, so the payload before it is still reported first.
    fn fuse_next_chunk(&mut self, rest: &[u8], seen: u64) -> usize {
        if !rest.starts_with(b"\r\n") {
            return 0;
        }
        self.state = State::Size {
            value: 0,
            digits: false,
        };
        let Some((m, value)) = plain_size_line(&rest[2..]) else {
            return 2;
        };
        match self.chunk_header(value, seen + 2 + m as u64) {
            Ok(state) => {
                self.state = state;
                2 + m
            }
            Err(_) => 2,
        }
    }

    /// The state after a complete chunk-size line declaring `value`, once
    /// `seen` raw bytes (that line included) were consumed. A chunk that
    /// cannot fit under the raw cap is refused from its declared size.
    fn chunk_header(&self, value: u64, seen: u64) -> Result<State, Error> {
        if value == 0 {
            return Ok(State::TrailerStart);
        }
        if value > self.limits.max_raw - seen.min(self.limits.max_raw) {
            return Err(Error::output_limit(
                Operation::Http,
                Evidence::DispatchUncertain,
                Reason::ResponseBody,
            )
            .with_limit(seen.saturating_add(value), self.limits.max_raw));
        }
        Ok(State::Data {
            left: value,
            chunked: true,
        })
    }

    /// The peer closed the connection: fine for a read-to-close body,
    /// `transport`/`truncated` for an unfinished one.
    pub(crate) fn finish(&mut self) -> Result<(), Error> {
        match self.state {
            State::Done => Ok(()),
            State::UntilClose => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(Error::transport(
                Operation::Http,
                Evidence::DispatchUncertain,
                Reason::Truncated,
            )),
        }
    }
}

/// A complete `1*16HEXDIG CRLF` line at the start of `input`: its length
/// and value. `None` for anything else (left to the byte-wise decoder).
fn plain_size_line(input: &[u8]) -> Option<(usize, u64)> {
    let mut value = 0u64;
    let mut i = 0;
    while i < 16 {
        match input.get(i).copied().and_then(hex) {
            Some(d) => value = (value << 4) | u64::from(d),
            None => break,
        }
        i += 1;
    }
    if i == 0 || i == 16 || input.get(i..i + 2) != Some(b"\r\n") {
        return None;
    }
    Some((i + 2, value))
}

const fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BodyLimits = BodyLimits {
        max_raw: 1 << 20,
        max_extension: 8,
        max_trailer: 16,
    };

    /// Feeds `input` in pieces of `step` bytes, once through `decode` and
    /// once through `decode_into`; both must agree (payload and verdict).
    fn run(
        framing: Framing,
        limits: BodyLimits,
        input: &[u8],
        step: usize,
    ) -> Result<Vec<u8>, Error> {
        let ranges = run_ranges(framing, limits, input, step);
        let into = run_into(framing, limits, input, step);
        assert_eq!(
            ranges, into,
            "decode and decode_into disagree (step {step})"
        );
        ranges
    }

    fn run_into(
        framing: Framing,
        limits: BodyLimits,
        input: &[u8],
        step: usize,
    ) -> Result<Vec<u8>, Error> {
        let mut d = BodyDecoder::new(framing, limits)?;
        let mut out = Vec::new();
        for piece in input.chunks(step.max(1)) {
            if d.is_done() {
                break;
            }
            d.decode_into(piece, &mut out)?;
        }
        d.finish()?;
        Ok(out)
    }

    fn run_ranges(
        framing: Framing,
        limits: BodyLimits,
        input: &[u8],
        step: usize,
    ) -> Result<Vec<u8>, Error> {
        let mut d = BodyDecoder::new(framing, limits)?;
        let mut out = Vec::new();
        for piece in input.chunks(step.max(1)) {
            let mut at = 0;
            while at < piece.len() && !d.is_done() {
                let p = d.decode(&piece[at..])?;
                if let Some(r) = p.data {
                    out.extend_from_slice(&piece[at..][r]);
                }
                at += p.consumed;
            }
        }
        d.finish()?;
        Ok(out)
    }

    fn reason(r: Result<Vec<u8>, Error>) -> Reason {
        r.unwrap_err().reason()
    }

    #[test]
    fn chunked_with_extension_and_trailer_any_split() {
        let body = b"5;a=b\r\nhello\r\n0\r\nX-T: 1\r\n\r\n";
        for step in 1..body.len() + 1 {
            assert_eq!(
                run(Framing::Chunked, LIMITS, body, step).unwrap(),
                b"hello",
                "{step}"
            );
        }
    }

    #[test]
    fn chunked_rejections() {
        let c = |b: &[u8]| reason(run(Framing::Chunked, LIMITS, b, 3));
        assert_eq!(c(b"x\r\n"), Reason::ChunkSize);
        assert_eq!(c(b"5g\r\n"), Reason::ChunkSize);
        assert_eq!(c(b"10000000000000000\r\n"), Reason::ChunkSizeOverflow);
        assert_eq!(c(b"5\nhello"), Reason::ChunkMissingCrlf);
        assert_eq!(c(b"5\r\nhelloX\r\n"), Reason::ChunkMissingCrlf);
        assert_eq!(c(b"5\r\nhello\rX"), Reason::ChunkMissingCrlf);
        assert_eq!(c(b"0\r\nA\n"), Reason::ChunkMissingCrlf);
        assert_eq!(c(b"0\r\n\rX"), Reason::ChunkMissingCrlf);
        assert_eq!(c(b"5;\x01\r\n"), Reason::ChunkExtension);
        // After the size: only whitespace, then `;` or CRLF.
        assert_eq!(c(b"52 junk\r\n"), Reason::ChunkSize);
        assert_eq!(c(b"5 \tx;a\r\n"), Reason::ChunkSize);
        assert_eq!(c(b"5 \nhello"), Reason::ChunkMissingCrlf);
        assert_eq!(c(b"5\r\nhel"), Reason::Truncated);
        // Largest value that fits still parses (then exceeds the raw cap).
        assert_eq!(c(b"ffffffffffffffff\r\n"), Reason::ResponseBody);
    }

    #[test]
    fn whitespace_after_the_size_any_split() {
        for body in [
            &b"5 \r\nhello\r\n0\r\n\r\n"[..],
            b"5\t ;a=b\r\nhello\r\n0 \r\n\r\n",
            b"5 ; x\r\nhello\r\n0\r\n\r\n",
        ] {
            for step in 1..body.len() + 1 {
                assert_eq!(
                    run(Framing::Chunked, LIMITS, body, step).unwrap(),
                    b"hello",
                    "{step}"
                );
            }
        }
    }

    #[test]
    fn size_whitespace_counts_toward_the_extension_cap() {
        // max_extension 8: 7 spaces + ";" = 8 accepted, 8 spaces + ";" refused.
        assert!(run(Framing::Chunked, LIMITS, b"1       ;\r\na\r\n0\r\n\r\n", 1).is_ok());
        let e = run(Framing::Chunked, LIMITS, b"1        ;\r\na\r\n0\r\n\r\n", 1).unwrap_err();
        assert_eq!(
            (e.reason(), e.limit().map(|l| l.actual)),
            (Reason::ChunkExtension, Some(9))
        );
    }

    #[test]
    fn extension_and_trailer_at_n_and_n_plus_one() {
        // max_extension 8: ";" + 7 bytes = 8 accepted, 9 refused.
        assert!(run(Framing::Chunked, LIMITS, b"1;1234567\r\na\r\n0\r\n\r\n", 1).is_ok());
        let e = run(Framing::Chunked, LIMITS, b"1;12345678\r\na\r\n0\r\n\r\n", 1).unwrap_err();
        assert_eq!(
            (e.reason(), e.limit().map(|l| l.actual)),
            (Reason::ChunkExtension, Some(9))
        );
        // max_trailer 16: "X: 01234567890\r\n" is 16 bytes, one digit more is 17.
        assert!(run(Framing::Chunked, LIMITS, b"0\r\nX: 01234567890\r\n\r\n", 2).is_ok());
        let e = run(Framing::Chunked, LIMITS, b"0\r\nX: 012345678901\r\n\r\n", 2).unwrap_err();
        assert_eq!(
            (e.reason(), e.limit().map(|l| l.actual)),
            (Reason::TrailerBytes, Some(17))
        );
    }

    #[test]
    fn raw_cap_at_n_and_n_plus_one() {
        let lim = |max_raw| BodyLimits { max_raw, ..LIMITS };
        // Content-Length: declared over the cap is refused before reading.
        assert!(run(Framing::Length(10), lim(10), &[b'a'; 10], 4).is_ok());
        assert_eq!(
            reason(run(Framing::Length(11), lim(10), &[b'a'; 11], 4)),
            Reason::ResponseBody
        );
        // Read-to-close: the 11th byte is refused.
        assert!(run(Framing::Close, lim(10), &[b'a'; 10], 3).is_ok());
        assert_eq!(
            reason(run(Framing::Close, lim(10), &[b'a'; 11], 3)),
            Reason::ResponseBody
        );
        // Chunked counts framing: this body is 15 raw bytes.
        let body = b"5\r\nhello\r\n0\r\n\r\n";
        for step in 1..16 {
            assert!(run(Framing::Chunked, lim(15), body, step).is_ok());
            assert_eq!(
                reason(run(Framing::Chunked, lim(14), body, step)),
                Reason::ResponseBody
            );
        }
    }
}
