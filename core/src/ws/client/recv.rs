//! The receive path: frame decoding, message assembly and the peer's close.

use crate::Reason;
use core::ops::Range;

use super::{CloseInfo, End, Phase, Step, WsClient};
use crate::error::{Category, Error};
use crate::ws::close::{CloseCode, ClosePayloadError, CloseReason, parse_close_payload};
use crate::ws::frame::{self, HeaderError, Opcode};

impl WsClient {
    /// Decodes frames until one yields an event, more bytes are needed, or
    /// the connection ends.
    #[inline]
    pub(super) fn decode(&mut self) -> Step {
        loop {
            let avail = &self.rx[self.rx_pos..self.rx_end];
            let hdr = match frame::parse_server_header(avail, self.config.max_frame_len as u64) {
                Ok(Some(h)) => h,
                Ok(None) => return self.need_more(),
                Err(HeaderError::Protocol(reason)) => {
                    let e = Error::protocol(self.op(), reason);
                    self.fail(e, Some(CloseCode::PROTOCOL_ERROR));
                    return Step::End;
                }
                Err(HeaderError::TooLarge { len, max }) => {
                    self.fail_too_big(Reason::FrameTooLarge, len, max);
                    return Step::End;
                }
            };
            // The header check bounds the length by 64 KiB (data) or 125
            // (control), so it fits in usize.
            let len = hdr.payload_len as usize;
            let total = hdr.header_len + len;
            if avail.len() < total {
                return self.need_more();
            }
            let start = self.rx_pos + hdr.header_len;
            let range = start..start + len;
            self.rx_pos += total;
            let max_msg = self.config.max_message_len;
            match hdr.opcode {
                Opcode::Binary | Opcode::Text => {
                    if self.msg_opcode.is_some() {
                        let e =
                            Error::protocol(self.op(), Reason::DataFrameInsideFragmentedMessage);
                        self.fail(e, Some(CloseCode::PROTOCOL_ERROR));
                        return Step::End;
                    }
                    if len > max_msg {
                        self.fail_too_big(Reason::MessageTooLarge, len as u64, max_msg as u64);
                        return Step::End;
                    }
                    if hdr.fin {
                        return if hdr.opcode == Opcode::Binary {
                            Step::Binary(range)
                        } else {
                            Step::Text(range)
                        };
                    }
                    self.start_message(range.start);
                    self.msg.extend_from_slice(&self.rx[range]);
                    self.msg_opcode = Some(hdr.opcode);
                }
                Opcode::Continuation => {
                    let Some(opcode) = self.msg_opcode else {
                        let e = Error::protocol(self.op(), Reason::ContinuationWithoutStart);
                        self.fail(e, Some(CloseCode::PROTOCOL_ERROR));
                        return Step::End;
                    };
                    let total_len = self.msg.len() - self.msg_off + len;
                    if total_len > max_msg {
                        self.fail_too_big(
                            Reason::MessageTooLarge,
                            total_len as u64,
                            max_msg as u64,
                        );
                        return Step::End;
                    }
                    self.msg.extend_from_slice(&self.rx[range]);
                    if hdr.fin {
                        self.msg_opcode = None;
                        return Step::Message(opcode);
                    }
                }
                Opcode::Ping => {
                    self.queue_pong(range.clone());
                    return Step::Ping(range);
                }
                Opcode::Pong => return Step::Pong(range),
                Opcode::Close => {
                    self.on_close_frame(range);
                    return Step::End;
                }
            }
        }
    }

    /// Empties the message buffer for a new message whose first payload
    /// byte is `rx[src]`. The message starts at an offset chosen so that
    /// `(destination - source) % 4096 == 2048` for the fragment copies:
    /// `memcpy` on some CPUs (AMD Zen with glibc's `rep movsb` path) runs
    /// ~15x slower when the destination is 1–31 bytes past the source
    /// modulo 4 KiB, and later fragments drift only by header sizes. The
    /// buffer is reserved once for a whole message plus that slack, so the
    /// chosen alignment holds (and steady state allocates nothing).
    fn start_message(&mut self, src: usize) {
        self.msg.clear();
        self.msg.reserve(self.config.max_message_len + 4_096);
        let src_addr = self.rx[src..].as_ptr() as usize;
        let dst_addr = self.msg.as_ptr() as usize;
        self.msg_off = src_addr.wrapping_add(2_048).wrapping_sub(dst_addr) % 4_096;
        self.msg.resize(self.msg_off, 0);
    }

    fn need_more(&mut self) -> Step {
        if self.eof && !self.close_received {
            let e = self.err(Category::Transport, Reason::AbnormalClose);
            self.fail(e, None);
            return Step::End;
        }
        Step::NeedMore
    }

    fn on_close_frame(&mut self, range: Range<usize>) {
        match parse_close_payload(&self.rx[range]) {
            Ok(parsed) => {
                self.close_received = true;
                let by_peer = !self.close_sent;
                let (code, reason) = match parsed {
                    Some((code, reason)) => (Some(code), reason),
                    None => (None, CloseReason::EMPTY),
                };
                if by_peer {
                    // RFC 6455 §5.5.1: echo the status code received (its
                    // reason is the peer's text and is not sent back).
                    self.queue_close(code, "");
                }
                self.phase = Phase::Done;
                self.close_deadline = None;
                self.end = Some(End::Closed(CloseInfo {
                    code,
                    reason,
                    by_peer,
                }));
            }
            Err(ClosePayloadError::Protocol(reason, code)) => {
                let mut e = Error::protocol(self.op(), reason);
                if let Some(code) = code {
                    e = e.with_close_code(code);
                }
                self.fail(e, Some(CloseCode::PROTOCOL_ERROR));
            }
            Err(ClosePayloadError::InvalidUtf8(code)) => {
                let e =
                    Error::protocol(self.op(), Reason::InvalidUtf8).with_close_code(code.as_u16());
                self.fail(e, Some(CloseCode::INVALID_PAYLOAD));
            }
        }
    }
}
