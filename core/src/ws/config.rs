//! Client configuration and its named limits.

use crate::Reason;
use core::fmt;
use core::time::Duration;

use crate::error::{Error, Operation};
use crate::secret::Secret;

/// Default and largest frame payload accepted from the peer (64 KiB).
pub const DEFAULT_MAX_FRAME_LEN: usize = 65_536;
/// The largest `max_frame_len` a configuration may set.
pub const MAX_FRAME_LEN: usize = 65_536;
/// Default cap on an assembled (fragmented) message: the terminal's default
/// unread-output buffer, 256 KiB.
pub const DEFAULT_MAX_MESSAGE_LEN: usize = 262_144;
/// The largest `max_message_len` a configuration may set (1 MiB).
pub const MAX_MESSAGE_LEN: usize = 1_048_576;
/// The handshake reply head may be at most this long, terminator included.
pub const MAX_HANDSHAKE_LEN: usize = 16_384;
/// Default handshake deadline (features C7.2: at most 30 s).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default wait for the peer's close after ours.
pub const DEFAULT_CLOSE_WAIT: Duration = Duration::from_secs(1);
/// The largest chunk one `handle_input` call may pass (features C7.2).
pub const MAX_INPUT_CHUNK: usize = 65_536;

/// What a [`super::WsClient`] connects to and the limits it enforces.
///
/// Worst-case memory: the receive buffer holds at most one partial frame
/// (`max_frame_len` + 14) plus one input chunk ([`MAX_INPUT_CHUNK`]); the
/// message buffer at most `max_message_len`.
#[derive(Clone)]
pub struct WsConfig {
    /// The `Host` header value (e.g. `localhost` or `worker:8080`).
    pub host: String,
    /// Origin-form request target, already percent-encoded, starting with `/`.
    pub target: String,
    /// Sent as `Authorization: Bearer <token>` when set.
    pub authorization: Option<Secret>,
    /// The operation every error is attributed to.
    pub operation: Operation,
    /// Largest data-frame payload accepted (1..=[`MAX_FRAME_LEN`]).
    pub max_frame_len: usize,
    /// Largest message (all fragments) accepted (1..=[`MAX_MESSAGE_LEN`]).
    pub max_message_len: usize,
    /// From construction until the 101 reply must be complete.
    pub handshake_timeout: Duration,
    /// How long to wait for the peer's close frame after sending ours.
    pub close_wait: Duration,
    /// Peer liveness (`None`: off): once the connection is open, when
    /// nothing was received for half of it a ping is sent, and when nothing
    /// was received for all of it the connection fails with `transport`
    /// (`idle_timeout`). Any received byte counts. At most
    /// [`MAX_WS_TIMER`].
    pub idle_timeout: Option<Duration>,
    /// Write bound (`None`: off): bytes handed out by `poll_transmit` (or
    /// queued for `transmit_data`) that make no progress
    /// (`handle_written` / `consume_transmit`) for this long fail the
    /// connection with `transport` (`write_timeout`); the shell then drops
    /// the socket. At most [`MAX_WS_TIMER`].
    pub write_wait: Option<Duration>,
}

/// The largest idle, write, handshake or close-wait duration a
/// configuration may set (one day): deadlines are `now` plus these, so a
/// bound keeps `Instant` arithmetic from overflowing.
pub const MAX_WS_TIMER: Duration = Duration::from_secs(86_400);

impl WsConfig {
    /// A configuration with the default limits.
    pub fn new(host: impl Into<String>, target: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            target: target.into(),
            authorization: None,
            operation: Operation::WebSocket,
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            max_message_len: DEFAULT_MAX_MESSAGE_LEN,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            close_wait: DEFAULT_CLOSE_WAIT,
            idle_timeout: None,
            write_wait: None,
        }
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// `validation` when a limit is out of range or the host, target or
    /// token could break the request head (control characters, no leading
    /// `/`).
    pub fn validate(&self) -> Result<(), Error> {
        let op = self.operation;
        if !(1..=MAX_FRAME_LEN).contains(&self.max_frame_len) {
            return Err(Error::validation(op, Reason::MaxFrameLenOutOfRange)
                .with_limit(self.max_frame_len as u64, MAX_FRAME_LEN as u64));
        }
        if !(1..=MAX_MESSAGE_LEN).contains(&self.max_message_len) {
            return Err(Error::validation(op, Reason::MaxMessageLenOutOfRange)
                .with_limit(self.max_message_len as u64, MAX_MESSAGE_LEN as u64));
        }
        for (d, reason) in [
            (
                Some(self.handshake_timeout),
                Reason::HandshakeTimeoutOutOfRange,
            ),
            (Some(self.close_wait), Reason::CloseWaitOutOfRange),
            (self.idle_timeout, Reason::IdleTimeoutOutOfRange),
            (self.write_wait, Reason::WriteWaitOutOfRange),
        ] {
            if let Some(d) = d
                && (d.is_zero() || d > MAX_WS_TIMER)
            {
                return Err(Error::validation(op, reason).with_limit(
                    u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
                    MAX_WS_TIMER.as_millis() as u64,
                ));
            }
        }
        if self.host.is_empty() || !is_header_safe(&self.host) || self.host.contains(' ') {
            return Err(Error::validation(op, Reason::InvalidHost));
        }
        if !self.target.starts_with('/')
            || !is_header_safe(&self.target)
            || self.target.contains(' ')
        {
            return Err(Error::validation(op, Reason::InvalidTarget));
        }
        if let Some(token) = &self.authorization
            && (token.is_empty() || !is_header_safe(token.expose()))
        {
            return Err(Error::validation(op, Reason::InvalidToken));
        }
        Ok(())
    }
}

/// No control characters (so no CR/LF header injection) and no DEL.
fn is_header_safe(s: &str) -> bool {
    s.bytes().all(|b| b >= 0x20 && b != 0x7f)
}

impl fmt::Debug for WsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The query may carry a program; print the path only.
        f.debug_struct("WsConfig")
            .field("host", &self.host)
            .field("path", &self.target.split('?').next().unwrap_or(""))
            .field("authorization", &self.authorization)
            .field("operation", &self.operation)
            .field("max_frame_len", &self.max_frame_len)
            .field("max_message_len", &self.max_message_len)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("close_wait", &self.close_wait)
            .field("idle_timeout", &self.idle_timeout)
            .field("write_wait", &self.write_wait)
            .finish()
    }
}
