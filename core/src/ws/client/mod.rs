//! The connection state machine: handshake, receive path, send path, close.

use crate::Reason;
mod recv;

use core::fmt;
use core::ops::Range;
use std::time::Instant;

use crate::error::{Category, Error, Evidence, Operation};
use crate::machine::{Machine, TransportFailure};
use crate::ws::close::{CloseCode, CloseReason, MAX_CLOSE_REASON};
use crate::ws::config::{MAX_HANDSHAKE_LEN, MAX_INPUT_CHUNK, WsConfig};
use crate::ws::frame::{self, MAX_CONTROL_PAYLOAD, MAX_HEADER_LEN, Opcode};
use crate::ws::handshake;
use crate::ws::mask::MaskPool;
use crate::ws::send::TxBuf;

/// Masking keys kept back from application sends so that a pong or a close
/// can always be masked.
const MASK_RESERVE_BYTES: usize = 8;

/// A frame at least this long that is split across reads makes
/// [`WsClient::input_buffer`] offer exactly its remainder, so it is never
/// moved; shorter partial frames are moved (cheaply) instead.
const LARGE_FRAME: usize = 4_096;

/// Largest number of bytes waiting in the send buffer (1 MiB of payload plus
/// headers). A send that would exceed it is refused and changes nothing.
pub const MAX_PENDING_TRANSMIT: usize = 1_048_576 + 64 * 1_024;

/// A WebSocket client connection (RFC 6455), sans-IO.
///
/// # Contract
/// * **Inputs** — [`handle_input`](Self::handle_input) (bytes read from the
///   socket, at most [`MAX_INPUT_CHUNK`](super::MAX_INPUT_CHUNK) per call),
///   [`handle_eof`](Self::handle_eof) (the peer ended the TCP stream),
///   [`handle_timeout`](Self::handle_timeout), and
///   [`handle_entropy`](Self::handle_entropy) (random bytes for masking keys;
///   add [`entropy_wanted`](Self::entropy_wanted) bytes whenever it is
///   non-zero, before sending).
/// * **Commands** — [`send_binary`](Self::send_binary),
///   [`send_text`](Self::send_text), [`send_ping`](Self::send_ping),
///   [`close`](Self::close).
/// * **Outputs** — [`poll_transmit`](Self::poll_transmit) (bytes to write),
///   [`poll_event`](Self::poll_event) (lends messages out of the receive
///   buffer without copying), [`poll_timeout`](Self::poll_timeout).
///
/// Drain order after every input or command: `poll_transmit`, then
/// `poll_event` until `None`, then `poll_transmit` again (decoding a ping or
/// a close queues a pong or a close echo), then `poll_timeout`. Frames are
/// decoded lazily by `poll_event`, so a caller that stops draining events
/// also stops the decoder; `handle_input` refuses more bytes than one
/// partial frame plus one chunk.
///
/// When [`is_finished`](Self::is_finished) is true the shell closes the
/// socket. It implements the driver contract [`Machine`](crate::Machine),
/// with one difference the generic drivers absorb: frames are decoded by
/// `poll_event`, not by `handle_input` (messages are lent from the receive
/// buffer without a copy), so a pong or close echo is queued while events
/// are drained and goes out with the next turn's `poll_transmit`.
pub struct WsClient {
    config: WsConfig,
    phase: Phase,
    expected_accept: String,
    head_scan: usize,
    /// Receive buffer: `rx[rx_pos..rx_end]` is unconsumed input; `rx.len()`
    /// is the initialised room (so reads can land in it directly).
    rx: Vec<u8>,
    rx_pos: usize,
    rx_end: usize,
    /// Length of the slice [`WsClient::input_buffer`] last handed out.
    rx_offered: usize,
    eof: bool,
    /// Message assembly: the message is `msg[msg_off..]`.
    msg: Vec<u8>,
    msg_off: usize,
    msg_opcode: Option<Opcode>,
    tx: TxBuf,
    masks: MaskPool,
    deferred_pong: Option<([u8; MAX_CONTROL_PAYLOAD], u8)>,
    deferred_close: Option<(Option<CloseCode>, &'static str)>,
    close_sent: bool,
    close_received: bool,
    handshake_deadline: Option<Instant>,
    close_deadline: Option<Instant>,
    last_now: Instant,
    /// Peer liveness: the last time a byte arrived, and whether the
    /// keepalive ping for this silence was sent.
    last_rx: Instant,
    keepalive_sent: bool,
    /// Bytes handed out by `poll_transmit` the socket has not taken yet.
    unwritten: usize,
    /// The last write progress (or the last call while nothing was pending).
    write_progress_at: Instant,
    /// A pong is in `tx`, not yet handed out: a later ping's pong waits in
    /// `deferred_pong` (only the latest is kept, RFC 6455 §5.5.3).
    pong_in_tx: bool,
    sent_any: bool,
    open_pending: bool,
    end: Option<End>,
    error: Option<Error>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the 101 reply.
    Handshake,
    /// Frames flow.
    Open,
    /// Nothing more is decoded (closed, failed, timed out).
    Done,
}

#[derive(Clone, Copy, Debug)]
enum End {
    Closed(CloseInfo),
    Failed(Error),
}

/// The timers a [`WsClient`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WsTimer {
    /// The 101 reply must be complete by then.
    Handshake,
    /// The peer's close must arrive by then (after ours).
    CloseWait,
    /// Half the idle timeout passed without a received byte: a ping is sent.
    Keepalive,
    /// The idle timeout passed without a received byte (`idle_timeout`).
    Idle,
    /// Pending transmits made no progress for the write bound
    /// (`write_timeout`).
    WriteStall,
}

/// How a connection closed cleanly (a close frame was received).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloseInfo {
    /// The peer's code; `None` when its close frame had no payload (1005).
    pub code: Option<CloseCode>,
    /// The peer's reason (UTF-8, at most 123 bytes; empty when none).
    pub reason: CloseReason,
    /// True when the peer closed first and we echoed.
    pub by_peer: bool,
}

/// Something that happened on the connection. Payloads are lent from the
/// client's buffers (no copy) until the next call on the client.
#[non_exhaustive]
pub enum WsEvent<'a> {
    /// The 101 reply was valid; frames may flow.
    Open,
    /// A complete binary message.
    Binary(&'a [u8]),
    /// A complete text message (valid UTF-8).
    Text(&'a str),
    /// A ping arrived; the pong is already queued.
    Ping(&'a [u8]),
    /// A pong arrived.
    Pong(&'a [u8]),
    /// The close handshake completed (final event).
    Closed(CloseInfo),
    /// The connection failed (final event). A close frame with the matching
    /// code (1002, 1007, 1009) is queued when one may still be sent.
    Failed(Error),
}

impl fmt::Debug for WsEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Payloads are peer bytes: print lengths only.
        match self {
            Self::Open => f.write_str("Open"),
            Self::Binary(b) => write!(f, "Binary(len {})", b.len()),
            Self::Text(t) => write!(f, "Text(len {})", t.len()),
            Self::Ping(b) => write!(f, "Ping(len {})", b.len()),
            Self::Pong(b) => write!(f, "Pong(len {})", b.len()),
            Self::Closed(c) => write!(f, "Closed({c:?})"),
            Self::Failed(e) => write!(f, "Failed({e:?})"),
        }
    }
}

/// What one decode step found; ranges index `rx`, so no borrow is held.
enum Step {
    NeedMore,
    Binary(Range<usize>),
    Text(Range<usize>),
    Message(Opcode),
    Ping(Range<usize>),
    Pong(Range<usize>),
    End,
}

impl WsClient {
    /// Starts a connection: the upgrade request is queued for
    /// `poll_transmit` and the handshake timer starts at `now`.
    ///
    /// # Errors
    /// `validation` when [`WsConfig::validate`] refuses the configuration.
    pub fn new(config: WsConfig, key: [u8; 16], now: Instant) -> Result<Self, Error> {
        config.validate()?;
        let key_b64 = handshake::encode_key(&key);
        let expected_accept = handshake::accept_for(&key_b64);
        let mut request = Vec::with_capacity(512);
        handshake::write_request(&mut request, &config, &key_b64);
        let mut tx = TxBuf::default();
        tx.push(&request);
        Ok(Self {
            handshake_deadline: Some(now + config.handshake_timeout),
            config,
            phase: Phase::Handshake,
            expected_accept,
            head_scan: 0,
            rx: Vec::new(),
            rx_pos: 0,
            rx_end: 0,
            rx_offered: 0,
            eof: false,
            msg: Vec::new(),
            msg_off: 0,
            msg_opcode: None,
            tx,
            masks: MaskPool::new(),
            deferred_pong: None,
            deferred_close: None,
            close_sent: false,
            close_received: false,
            close_deadline: None,
            last_now: now,
            last_rx: now,
            keepalive_sent: false,
            unwritten: 0,
            write_progress_at: now,
            pong_in_tx: false,
            sent_any: false,
            open_pending: false,
            end: None,
            error: None,
        })
    }

    // ---- inputs -------------------------------------------------------

    /// Feeds bytes read from the socket (any chunking, at most
    /// [`MAX_INPUT_CHUNK`](super::MAX_INPUT_CHUNK) per call). During the
    /// handshake the reply head is checked here; bytes after it in the same
    /// chunk are kept as frames.
    ///
    /// # Errors
    /// The connection's error once it failed (sticky; bytes are then
    /// ignored); `validation` for a chunk over the cap or when undrained
    /// input would exceed one partial frame plus one chunk (nothing is
    /// consumed then).
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) -> Result<(), Error> {
        self.touch(now);
        if let Some(e) = self.error {
            return Err(e);
        }
        if bytes.len() > MAX_INPUT_CHUNK {
            return Err(self
                .err(Category::Validation, Reason::InputChunkTooLarge)
                .with_limit(bytes.len() as u64, MAX_INPUT_CHUNK as u64));
        }
        match self.phase {
            Phase::Done => Ok(()),
            Phase::Handshake => {
                self.make_room(bytes.len());
                self.rx[self.rx_end..self.rx_end + bytes.len()].copy_from_slice(bytes);
                self.rx_end += bytes.len();
                self.advance_handshake();
                self.error.map_or(Ok(()), Err)
            }
            Phase::Open => {
                let pending = self.rx_end - self.rx_pos;
                let max = self.max_buffered();
                if pending + bytes.len() > max {
                    return Err(self
                        .err(Category::Validation, Reason::InputNotDrained)
                        .with_limit((pending + bytes.len()) as u64, max as u64));
                }
                self.note_received(now, bytes.len());
                self.make_room(bytes.len());
                self.rx[self.rx_end..self.rx_end + bytes.len()].copy_from_slice(bytes);
                self.rx_end += bytes.len();
                Ok(())
            }
        }
    }

    /// Room to read socket bytes into directly, without a copy through
    /// [`handle_input`](Self::handle_input); report how many were written
    /// at its start with [`handle_read`](Self::handle_read).
    ///
    /// Its length (≤ 64 KiB) is chosen so that a large frame split across
    /// reads completes exactly at the end of a read: the buffer then empties
    /// and no partial frame is ever moved. Empty when the connection ended,
    /// or when undrained events hold the buffer (drain `poll_event` first).
    pub fn input_buffer(&mut self) -> &mut [u8] {
        let pending = self.rx_end - self.rx_pos;
        let mut want = MAX_INPUT_CHUNK.min(self.max_buffered().saturating_sub(pending));
        if self.phase == Phase::Done {
            want = 0;
        }
        if self.phase == Phase::Open
            && let Ok(Some(h)) = frame::parse_server_header(
                &self.rx[self.rx_pos..self.rx_end],
                self.config.max_frame_len as u64,
            )
        {
            let total = h.header_len + h.payload_len as usize;
            if total > pending && total >= LARGE_FRAME {
                want = want.min(total - pending);
            }
        }
        self.make_room(want);
        self.rx_offered = want;
        &mut self.rx[self.rx_end..self.rx_end + want]
    }

    /// `n` bytes were read into the start of the last
    /// [`input_buffer`](Self::input_buffer).
    ///
    /// # Errors
    /// As [`handle_input`](Self::handle_input); `validation` when `n` is
    /// larger than the slice handed out.
    pub fn handle_read(&mut self, now: Instant, n: usize) -> Result<(), Error> {
        self.touch(now);
        if let Some(e) = self.error {
            return Err(e);
        }
        if n > self.rx_offered {
            return Err(self
                .err(Category::Validation, Reason::ReadPastInputBuffer)
                .with_limit(n as u64, self.rx_offered as u64));
        }
        self.rx_offered = 0;
        match self.phase {
            Phase::Done => Ok(()),
            Phase::Handshake => {
                self.rx_end += n;
                self.advance_handshake();
                self.error.map_or(Ok(()), Err)
            }
            Phase::Open => {
                self.note_received(now, n);
                self.rx_end += n;
                Ok(())
            }
        }
    }

    /// The peer ended the byte stream. Frames already buffered are still
    /// delivered; then, unless a close frame was received, the connection
    /// fails as an abnormal close (1006, `transport`).
    pub fn handle_eof(&mut self, now: Instant) {
        self.touch(now);
        self.eof = true;
        if self.phase == Phase::Handshake {
            let e = self.err(Category::Transport, Reason::EofDuringHandshake);
            self.fail(e, None);
        }
    }

    /// Acts on every timer due at `now`; early or repeated calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.touch(now);
        if self.write_deadline().is_some_and(|t| t <= now) {
            let e = self.err(Category::Transport, Reason::WriteTimeout);
            self.fail(e, None);
            // The peer does not read: nothing more is written, the shell
            // drops the socket.
            let pending = self.tx.len();
            self.tx.consume(pending);
            self.unwritten = 0;
            self.pong_in_tx = false;
            self.deferred_pong = None;
        } else if self.handshake_deadline.is_some_and(|t| t <= now) {
            let e = self.err(Category::Transport, Reason::HandshakeTimeout);
            self.fail(e, None);
        } else if self.close_deadline.is_some_and(|t| t <= now) {
            let e = self.err(Category::Transport, Reason::CloseWaitExpired);
            self.fail(e, None);
        } else if let Some((at, timer)) = self.liveness_deadline()
            && at <= now
        {
            if timer == WsTimer::Idle {
                let e = self.err(Category::Transport, Reason::IdleTimeout);
                self.fail(e, Some(CloseCode::GOING_AWAY));
            } else {
                self.keepalive_sent = true;
                if self.masks.available() >= 4 + MASK_RESERVE_BYTES
                    && let Some(mask) = self.masks.take()
                {
                    self.tx.write_frame(Opcode::Ping, b"", mask);
                }
            }
        }
    }

    /// The socket took `n` more of the bytes [`poll_transmit`](Self::poll_transmit)
    /// handed out (this feeds the write bound, [`WsConfig::write_wait`]).
    pub fn handle_written(&mut self, now: Instant, n: usize) {
        let now = self.touch(now);
        if n > 0 {
            self.unwritten = self.unwritten.saturating_sub(n);
            self.write_progress_at = now;
        }
    }

    /// Adds caller-generated random bytes for masking keys (4 per frame).
    /// Bytes beyond the pool's room ([`MASK_POOL_BYTES`](super::MASK_POOL_BYTES))
    /// are ignored. A pong or close that waited for a key is queued now.
    pub fn handle_entropy(&mut self, random: &[u8]) {
        self.masks.add(random);
        if let Some((code, reason)) = self.deferred_close {
            if let Some(mask) = self.masks.take() {
                self.deferred_close = None;
                self.tx.write_close(code, reason, mask);
            }
        } else {
            self.flush_deferred_pong();
        }
    }

    /// How many random bytes [`handle_entropy`](Self::handle_entropy) should
    /// be given now (0 while the pool is at least half full).
    pub fn entropy_wanted(&self) -> usize {
        self.masks.wanted()
    }

    // ---- commands -----------------------------------------------------

    /// Queues one unfragmented binary message.
    ///
    /// # Errors
    /// See [`send_text`](Self::send_text).
    #[inline]
    pub fn send_binary(&mut self, now: Instant, payload: &[u8]) -> Result<(), Error> {
        self.send(now, Opcode::Binary, payload)
    }

    /// Queues one unfragmented text message.
    ///
    /// # Errors
    /// The sticky error after a failure; `validation` before the handshake
    /// completed, after a close was sent or received, or without enough
    /// random bytes for a masking key; `admission_exhausted` when the send
    /// buffer would pass [`MAX_PENDING_TRANSMIT`]. Nothing is queued then.
    pub fn send_text(&mut self, now: Instant, text: &str) -> Result<(), Error> {
        self.send(now, Opcode::Text, text.as_bytes())
    }

    /// Queues a ping (payload ≤ 125 bytes).
    ///
    /// # Errors
    /// As [`send_text`](Self::send_text), and `validation` for a payload over
    /// 125 bytes.
    pub fn send_ping(&mut self, now: Instant, payload: &[u8]) -> Result<(), Error> {
        if payload.len() > MAX_CONTROL_PAYLOAD {
            return Err(self
                .err(Category::Validation, Reason::PingPayloadTooLong)
                .with_limit(payload.len() as u64, MAX_CONTROL_PAYLOAD as u64));
        }
        self.send(now, Opcode::Ping, payload)
    }

    /// Starts the close handshake: queues a close frame with `code` and
    /// starts the close-wait timer. After this no data frame is sent. Before
    /// the handshake completed it abandons the connection instead (no close
    /// frame; the final event is `Failed` with reason `closed_before_open`).
    /// A second call, or a call after the connection ended, does nothing.
    ///
    /// # Errors
    /// `validation` when `code` may not be sent (1005, 1006, 1015, reserved).
    pub fn close(&mut self, now: Instant, code: CloseCode) -> Result<(), Error> {
        self.close_with_reason(now, code, "")
    }

    /// As [`close`](Self::close), with a reason in the frame. The reason is
    /// `'static` text (a fixed reason code such as an [`Error::reason`]):
    /// it can never carry terminal or peer bytes.
    ///
    /// # Errors
    /// As [`close`](Self::close), and `validation` (`close_reason_too_long`)
    /// for a reason over [`MAX_CLOSE_REASON`](super::MAX_CLOSE_REASON)
    /// (123) bytes. Nothing is queued then.
    pub fn close_with_reason(
        &mut self,
        now: Instant,
        code: CloseCode,
        reason: &'static str,
    ) -> Result<(), Error> {
        let now = self.touch(now);
        if !code.is_sendable() {
            return Err(self.err(Category::Validation, Reason::CloseCodeNotSendable));
        }
        if reason.len() > MAX_CLOSE_REASON {
            return Err(self
                .err(Category::Validation, Reason::CloseReasonTooLong)
                .with_limit(reason.len() as u64, MAX_CLOSE_REASON as u64));
        }
        match self.phase {
            Phase::Handshake => {
                let e = self.err(Category::Transport, Reason::ClosedBeforeOpen);
                self.fail(e, None);
            }
            Phase::Open if !self.close_sent => {
                self.queue_close(Some(code), reason);
                self.close_deadline = Some(now + self.config.close_wait);
            }
            _ => {}
        }
        Ok(())
    }

    // ---- outputs ------------------------------------------------------

    /// Appends every queued byte to `out` and returns how many (one copy;
    /// [`transmit_data`](Self::transmit_data) avoids it).
    #[inline]
    #[must_use]
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        let n = self.tx.len();
        if n == 0 {
            return None;
        }
        self.sent_any = true;
        out.extend_from_slice(self.tx.pending());
        self.tx.consume(n);
        self.unwritten += n;
        self.pong_in_tx = false;
        // The latest ping's pong, if one waited, goes out with the next call.
        self.flush_deferred_pong();
        Some(n)
    }

    /// The queued bytes, to write to the socket straight from the client's
    /// buffer; report what the socket took with
    /// [`consume_transmit`](Self::consume_transmit) (partial writes are
    /// fine).
    #[inline]
    pub fn transmit_data(&self) -> &[u8] {
        self.tx.pending()
    }

    /// `n` bytes of [`transmit_data`](Self::transmit_data) were written.
    #[inline]
    pub fn consume_transmit(&mut self, n: usize) {
        if n > 0 {
            self.sent_any = true;
            self.write_progress_at = self.last_now;
        }
        self.tx.consume(n);
        if self.tx.len() == 0 {
            self.pong_in_tx = false;
            self.flush_deferred_pong();
        }
    }

    /// The next event. Messages are lent from the receive or message buffer
    /// and valid until the next call on the client. Decoding a ping or close
    /// may queue a transmit.
    #[inline]
    #[must_use]
    pub fn poll_event(&mut self) -> Option<WsEvent<'_>> {
        // Fast path: a complete, final, unmasked binary frame shorter than
        // 64 KiB outside a fragmented message (the terminal's output). Every
        // check the slow path makes is implied by these bytes and caps;
        // anything else goes the general way.
        if self.phase == Phase::Open && self.msg_opcode.is_none() && !self.open_pending {
            let avail = &self.rx[self.rx_pos..self.rx_end];
            if let [0x82, b1, ..] = *avail {
                let (hl, len) = match (b1, avail.get(2..4)) {
                    (0..=125, _) => (2, usize::from(b1)),
                    (126, Some(&[hi, lo])) => (4, usize::from(u16::from_be_bytes([hi, lo]))),
                    _ => (0, 0),
                };
                if hl != 0
                    && (hl == 2 || len >= 126)
                    && len <= self.config.max_frame_len
                    && len <= self.config.max_message_len
                    && avail.len() >= hl + len
                {
                    let start = self.rx_pos + hl;
                    self.rx_pos = start + len;
                    return Some(WsEvent::Binary(&self.rx[start..start + len]));
                }
            }
        }
        self.poll_event_general()
    }

    /// Lends the complete binary frames at the front of the receive buffer
    /// to `f`, one after another, as long as `f` returns `true`: the frames
    /// [`poll_event`](Self::poll_event)'s fast path would return as
    /// [`WsEvent::Binary`] (final, unmasked, shorter than 64 KiB, within the
    /// caps, outside a fragmented message), with the same checks. It stops
    /// at the first frame that is anything else or not complete, and leaves
    /// that to `poll_event`. Returns how many frames were lent.
    ///
    /// This is the same decoding as calling `poll_event` in a loop, without
    /// storing the read position between frames.
    #[inline]
    pub fn poll_binary_frames(&mut self, mut f: impl FnMut(&[u8]) -> bool) -> usize {
        if self.phase != Phase::Open || self.msg_opcode.is_some() || self.open_pending {
            return 0;
        }
        let max = self.config.max_frame_len.min(self.config.max_message_len);
        let rx = &self.rx[..self.rx_end];
        let mut pos = self.rx_pos;
        let mut lent = 0;
        while let Some(avail) = rx.get(pos..) {
            let (hl, len) = match *avail {
                [0x82, b1 @ 0..=125, ..] => (2, usize::from(b1)),
                [0x82, 126, hi, lo, ..] => {
                    let len = usize::from(u16::from_be_bytes([hi, lo]));
                    if len < 126 {
                        // Not minimal: the general path refuses it.
                        break;
                    }
                    (4, len)
                }
                _ => break,
            };
            if len > max || avail.len() < hl + len {
                break;
            }
            let start = pos + hl;
            pos = start + len;
            lent += 1;
            if !f(&rx[start..pos]) {
                break;
            }
        }
        self.rx_pos = pos;
        lent
    }

    fn poll_event_general(&mut self) -> Option<WsEvent<'_>> {
        if self.open_pending {
            self.open_pending = false;
            return Some(WsEvent::Open);
        }
        let step = if self.phase == Phase::Open {
            self.decode()
        } else {
            Step::NeedMore
        };
        match step {
            Step::Binary(r) => Some(WsEvent::Binary(&self.rx[r])),
            Step::Ping(r) => Some(WsEvent::Ping(&self.rx[r])),
            Step::Pong(r) => Some(WsEvent::Pong(&self.rx[r])),
            Step::Text(r) => {
                if core::str::from_utf8(&self.rx[r.clone()]).is_err() {
                    self.fail_invalid_utf8();
                    return self.take_end();
                }
                core::str::from_utf8(&self.rx[r]).ok().map(WsEvent::Text)
            }
            Step::Message(Opcode::Text) => {
                if core::str::from_utf8(&self.msg[self.msg_off..]).is_err() {
                    self.fail_invalid_utf8();
                    return self.take_end();
                }
                core::str::from_utf8(&self.msg[self.msg_off..])
                    .ok()
                    .map(WsEvent::Text)
            }
            Step::Message(_) => Some(WsEvent::Binary(&self.msg[self.msg_off..])),
            Step::NeedMore | Step::End => self.take_end(),
        }
    }

    /// The next deadline and which timer it is; `handle_timeout` acts at
    /// exactly that instant.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<(Instant, WsTimer)> {
        let candidates = [
            self.write_deadline().map(|t| (t, WsTimer::WriteStall)),
            self.handshake_deadline.map(|t| (t, WsTimer::Handshake)),
            self.close_deadline.map(|t| (t, WsTimer::CloseWait)),
            self.liveness_deadline(),
        ];
        let mut best: Option<(Instant, WsTimer)> = None;
        for c in candidates.into_iter().flatten() {
            if best.is_none_or(|b| c.0 < b.0) {
                best = Some(c);
            }
        }
        best
    }

    // ---- getters ------------------------------------------------------

    /// True once the 101 reply was accepted and until the connection ended.
    pub fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    /// True once the final event (`Closed` or `Failed`) is decided (a
    /// close echo may still wait for `poll_transmit`).
    pub fn is_ended(&self) -> bool {
        self.phase == Phase::Done
    }

    /// True once the final event is decided and nothing is left to send:
    /// the shell may close the socket.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Done && self.tx.len() == 0
    }

    /// True once a close frame was queued; no data frame follows it.
    pub fn is_close_sent(&self) -> bool {
        self.close_sent
    }

    /// The sticky error, once the connection failed.
    pub fn error(&self) -> Option<Error> {
        self.error
    }

    /// True once `poll_transmit` handed out a byte (so the request may
    /// have reached the peer).
    pub fn has_transmitted(&self) -> bool {
        self.sent_any
    }

    /// Received bytes not yet returned as events (complete frames left
    /// unpolled, or the start of an incomplete one).
    pub fn unprocessed_input(&self) -> usize {
        self.rx_end - self.rx_pos
    }

    /// Bytes waiting for `poll_transmit`.
    pub fn pending_transmit(&self) -> usize {
        self.tx.len()
    }

    /// Random bytes buffered for masking keys.
    pub fn entropy_available(&self) -> usize {
        self.masks.available()
    }

    // ---- internals ----------------------------------------------------

    #[inline]
    fn touch(&mut self, now: Instant) -> Instant {
        self.last_now = self.last_now.max(now);
        if self.unwritten == 0 && self.tx.len() == 0 {
            // Nothing pending: the write bound starts with the next bytes.
            self.write_progress_at = self.last_now;
        }
        self.last_now
    }

    /// `n` bytes arrived from the peer (a sign of life).
    #[inline]
    fn note_received(&mut self, now: Instant, n: usize) {
        if n > 0 {
            self.last_rx = self.last_rx.max(now);
            self.keepalive_sent = false;
        }
    }

    /// When the write bound ([`WsConfig::write_wait`]) ends, while bytes
    /// handed out are not all written: a shell that writes a batch in one
    /// blocking call uses it as that call's deadline, then calls
    /// [`handle_timeout`](Self::handle_timeout).
    pub fn write_deadline(&self) -> Option<Instant> {
        let wait = self.config.write_wait?;
        (self.unwritten + self.tx.len() > 0).then(|| self.write_progress_at + wait)
    }

    /// The keepalive ping or the idle failure, while the connection is
    /// open and our close was not sent.
    fn liveness_deadline(&self) -> Option<(Instant, WsTimer)> {
        let idle = self.config.idle_timeout?;
        if self.phase != Phase::Open || self.close_sent {
            return None;
        }
        if self.keepalive_sent {
            Some((self.last_rx + idle, WsTimer::Idle))
        } else {
            Some((self.last_rx + idle / 2, WsTimer::Keepalive))
        }
    }

    /// Queues the pong that waited for a key or for the previous pong to
    /// be handed out.
    fn flush_deferred_pong(&mut self) {
        if self.pong_in_tx || self.close_sent {
            return;
        }
        if let Some((buf, len)) = self.deferred_pong
            && let Some(mask) = self.masks.take()
        {
            self.deferred_pong = None;
            self.tx
                .write_frame(Opcode::Pong, &buf[..usize::from(len)], mask);
            self.pong_in_tx = true;
        }
    }

    /// Evidence for errors: `not_dispatched` until the first request byte
    /// was handed to the shell.
    fn evidence(&self) -> Evidence {
        if self.sent_any {
            Evidence::DispatchUncertain
        } else {
            Evidence::NotDispatched
        }
    }

    fn err(&self, category: Category, reason: Reason) -> Error {
        let evidence = match category {
            // The caller's own mistake says nothing new about dispatch.
            Category::Validation | Category::AdmissionExhausted => Evidence::NotDispatched,
            _ => self.evidence(),
        };
        Error::of(category, self.config.operation, evidence, reason)
    }

    fn op(&self) -> Operation {
        self.config.operation
    }

    /// Most unconsumed bytes the receive buffer holds: one partial frame
    /// plus one chunk (a handshake head is smaller).
    fn max_buffered(&self) -> usize {
        self.config.max_frame_len + MAX_HEADER_LEN + MAX_INPUT_CHUNK
    }

    /// Makes `rx[rx_end..rx_end + n]` available: restart at 0 when all was
    /// consumed, move the unconsumed tail to the front only when the room
    /// at the end is short, grow (bounded by the callers' checks) last.
    fn make_room(&mut self, n: usize) {
        if self.rx_pos == self.rx_end {
            self.rx_pos = 0;
            self.rx_end = 0;
        }
        if self.rx_end + n > self.rx.len() {
            if self.rx_pos > 0 {
                self.rx.copy_within(self.rx_pos..self.rx_end, 0);
                self.rx_end -= self.rx_pos;
                self.rx_pos = 0;
            }
            if self.rx_end + n > self.rx.len() {
                self.rx.resize(self.rx_end + n, 0);
            }
        }
    }

    fn advance_handshake(&mut self) {
        let Some(end) = handshake::find_head_end(&self.rx[..self.rx_end], self.head_scan) else {
            self.head_scan = self.rx_end;
            if self.rx_end >= MAX_HANDSHAKE_LEN {
                let e = Error::protocol(self.op(), Reason::HandshakeTooLarge)
                    .with_limit(MAX_HANDSHAKE_LEN as u64 + 1, MAX_HANDSHAKE_LEN as u64);
                self.fail(e, None);
            }
            return;
        };
        if end > MAX_HANDSHAKE_LEN {
            let e = Error::protocol(self.op(), Reason::HandshakeTooLarge)
                .with_limit(end as u64, MAX_HANDSHAKE_LEN as u64);
            self.fail(e, None);
            return;
        }
        if let Err(e) = handshake::check_reply(&self.rx[..end], &self.expected_accept, &self.config)
        {
            self.fail(e, None);
            return;
        }
        self.rx_pos = end;
        self.phase = Phase::Open;
        self.handshake_deadline = None;
        self.open_pending = true;
    }

    #[inline]
    fn send(&mut self, now: Instant, opcode: Opcode, payload: &[u8]) -> Result<(), Error> {
        self.touch(now);
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.phase != Phase::Open || self.close_sent {
            let reason = match self.phase {
                Phase::Handshake => Reason::NotOpen,
                _ => Reason::Closed,
            };
            return Err(self.err(Category::Validation, reason));
        }
        let frame_len = payload.len() + MAX_HEADER_LEN;
        if self.tx.len() + frame_len > MAX_PENDING_TRANSMIT {
            return Err(self
                .err(Category::AdmissionExhausted, Reason::SendBufferFull)
                .with_limit(
                    (self.tx.len() + frame_len) as u64,
                    MAX_PENDING_TRANSMIT as u64,
                ));
        }
        if self.masks.available() < 4 + MASK_RESERVE_BYTES {
            return Err(self.err(Category::Validation, Reason::MaskEntropyExhausted));
        }
        let Some(mask) = self.masks.take() else {
            return Err(self.err(Category::Validation, Reason::MaskEntropyExhausted));
        };
        self.tx.write_frame(opcode, payload, mask);
        Ok(())
    }

    /// Answers a ping. At most one pong waits in `tx` (not yet handed
    /// out) and one more is kept aside, the latest (RFC 6455 §5.5.3 allows
    /// answering only the most recent ping): a ping flood from a peer that
    /// does not read cannot grow the send buffer.
    fn queue_pong(&mut self, range: Range<usize>) {
        if self.close_sent {
            return;
        }
        let payload = &self.rx[range];
        if !self.pong_in_tx
            && let Some(mask) = self.masks.take()
        {
            self.deferred_pong = None;
            self.tx.write_frame(Opcode::Pong, payload, mask);
            self.pong_in_tx = true;
            return;
        }
        let mut buf = [0u8; MAX_CONTROL_PAYLOAD];
        buf[..payload.len()].copy_from_slice(payload);
        // A control payload is ≤ 125 bytes (checked in the header).
        self.deferred_pong = Some((buf, payload.len() as u8));
    }

    /// Queues our close frame; `reason` is fixed text (≤ 123 bytes, never
    /// peer or terminal bytes; longer text is cut by the encoder).
    fn queue_close(&mut self, code: Option<CloseCode>, reason: &'static str) {
        if self.close_sent {
            return;
        }
        self.close_sent = true;
        self.deferred_pong = None;
        match self.masks.take() {
            Some(mask) => self.tx.write_close(code, reason, mask),
            None => self.deferred_close = Some((code, reason)),
        }
    }

    fn fail_too_big(&mut self, reason: Reason, len: u64, max: u64) {
        let e = self.err(Category::OutputLimit, reason).with_limit(len, max);
        self.fail(e, Some(CloseCode::MESSAGE_TOO_BIG));
    }

    fn fail_invalid_utf8(&mut self) {
        let e = Error::protocol(self.op(), Reason::InvalidUtf8);
        self.fail(e, Some(CloseCode::INVALID_PAYLOAD));
    }

    /// Ends the connection with `error`; queues a close with `code` (and
    /// the error's fixed reason code as the close reason) when the
    /// connection is open and no close was sent yet.
    fn fail(&mut self, error: Error, code: Option<CloseCode>) {
        if self.phase == Phase::Done {
            return;
        }
        if self.phase == Phase::Open
            && let Some(code) = code
        {
            self.queue_close(Some(code), error.reason().as_str());
        }
        self.phase = Phase::Done;
        self.handshake_deadline = None;
        self.close_deadline = None;
        self.error = Some(error);
        self.end = Some(End::Failed(error));
    }

    fn take_end(&mut self) -> Option<WsEvent<'static>> {
        match self.end.take()? {
            End::Closed(info) => Some(WsEvent::Closed(info)),
            End::Failed(e) => Some(WsEvent::Failed(e)),
        }
    }
}

impl fmt::Debug for WsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No buffer contents: they are peer or terminal bytes.
        f.debug_struct("WsClient")
            .field("phase", &self.phase)
            .field("operation", &self.config.operation)
            .field("buffered_rx", &(self.rx_end - self.rx_pos))
            .field("pending_tx", &self.tx.len())
            .field("close_sent", &self.close_sent)
            .field("close_received", &self.close_received)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl Machine for WsClient {
    type Event<'a> = WsEvent<'a>;
    type Timer = WsTimer;

    /// As [`WsClient::handle_input`], in chunks of at most
    /// [`MAX_INPUT_CHUNK`]; input the client cannot hold (events not
    /// drained) fails the connection instead of being lost.
    fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        for chunk in bytes.chunks(MAX_INPUT_CHUNK) {
            if let Err(e) = Self::handle_input(self, now, chunk) {
                if e.category() == Category::Validation {
                    let e = self.err(Category::OutputLimit, Reason::InputNotDrained);
                    self.fail(e, Some(CloseCode::MESSAGE_TOO_BIG));
                }
                return;
            }
        }
    }

    fn handle_eof(&mut self, now: Instant) {
        Self::handle_eof(self, now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now);
    }

    fn handle_written(&mut self, now: Instant, n: usize) {
        Self::handle_written(self, now, n);
    }

    fn handle_transport_error(&mut self, now: Instant, failure: TransportFailure) {
        self.touch(now);
        self.eof = true;
        let e = self.err(Category::Transport, failure.reason());
        self.fail(e, None);
        let pending = self.tx.len();
        self.tx.consume(pending);
        self.unwritten = 0;
    }

    fn poll_transmit(&mut self, out: &mut Vec<u8>) -> bool {
        Self::poll_transmit(self, out).is_some()
    }

    fn poll_timeout(&self) -> Option<(Instant, WsTimer)> {
        Self::poll_timeout(self)
    }

    fn poll_event(&mut self) -> Option<WsEvent<'_>> {
        Self::poll_event(self)
    }

    fn is_finished(&self) -> bool {
        Self::is_finished(self)
    }

    fn wants_read(&self) -> bool {
        self.phase != Phase::Done && !self.eof
    }
}
