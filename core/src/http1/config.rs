//! Limits and connection-level settings of one HTTP/1.1 exchange.

use crate::Reason;
use std::time::{Duration, Instant};

use crate::error::{Error, Operation};
use crate::secret::Secret;

/// Default cap on a request body: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Largest allowed [`ExchangeConfig::max_request_body`]: 16 MiB.
pub const MAX_REQUEST_BODY_CEILING: usize = 16 * 1024 * 1024;
/// Default cap on the response head section (all interim and the final
/// head together, terminating blank lines included): 16 KiB.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest allowed [`ExchangeConfig::max_head_bytes`]: 256 KiB.
pub const MAX_HEAD_BYTES_CEILING: usize = 256 * 1024;
/// Default cap on the number of header fields of one response head.
pub const DEFAULT_MAX_HEADERS: usize = 64;
/// Largest allowed [`ExchangeConfig::max_headers`] (the parser's header
/// table lives on the stack: 256 × 32 bytes).
pub const MAX_HEADERS_CEILING: usize = 256;
/// Default cap on raw response body bytes: 16 MiB.
pub const DEFAULT_MAX_RESPONSE_BODY: u64 = 16 * 1024 * 1024;
/// Largest allowed [`ExchangeConfig::max_response_body`]: 32 MiB.
pub const MAX_RESPONSE_BODY_CEILING: u64 = 32 * 1024 * 1024;
/// Default cap on one chunk's extension (bytes between the chunk size and
/// its CRLF): 256 bytes.
pub const DEFAULT_MAX_CHUNK_EXTENSION: usize = 256;
/// Default cap on the trailer section of a chunked body (bytes after the
/// last-chunk line, excluding the final empty line): 4 KiB.
pub const DEFAULT_MAX_TRAILER_BYTES: usize = 4 * 1024;
/// Default receive-idle timeout: 15 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// The `User-Agent` the exchange sends by default.
pub const DEFAULT_USER_AGENT: &str = concat!("smolbox/", env!("CARGO_PKG_VERSION"));

/// Settings and limits of one exchange.
///
/// Worst-case memory held by an [`HttpExchange`](super::HttpExchange):
/// the encoded request head (≈ 200 B + target + host + token), a reference
/// to the request body (shared, not copied, until `poll_transmit`), and the
/// receive buffer. The receive buffer holds the head being read (at most
/// `max_head_bytes`) or the de-framed payload of the `handle_input` calls
/// not yet drained by `poll_event`; in total the exchange never accepts more
/// than `max_head_bytes + max_response_body + 1` bytes (input past that
/// cannot be part of an acceptable reply and is dropped). A shell that
/// drains `poll_event` after every read holds one read's worth. Body bytes
/// are streamed out as events and never accumulated; chunk extensions and
/// trailers are counted and skipped, never stored.
#[derive(Clone, Debug)]
pub struct ExchangeConfig {
    /// The `Host` header value (`host` or `host:port`).
    pub host: String,
    /// Bearer token for `Authorization`, when the endpoint needs one.
    pub bearer: Option<Secret>,
    /// Largest request body sent (1 B ..= 16 MiB; default 1 MiB).
    pub max_request_body: usize,
    /// Largest response head section (default 16 KiB, at most 256 KiB).
    pub max_head_bytes: usize,
    /// Most header fields in one response head (1 ..= 256; default 64).
    pub max_headers: usize,
    /// Most raw body bytes received, framing of chunked bodies included
    /// (1 B ..= 32 MiB; default 16 MiB).
    pub max_response_body: u64,
    /// Largest extension of one chunk (default 256 B).
    pub max_chunk_extension: usize,
    /// Largest trailer section of a chunked body (default 4 KiB).
    pub max_trailer_bytes: usize,
    /// Receive-idle timeout: longest quiet time between reads once the
    /// request started leaving. `None` disables it (the deadline still holds).
    pub idle_timeout: Option<Duration>,
    /// The overall deadline of the exchange (monotonic).
    pub deadline: Instant,
    /// Ask for a persistent connection (default). When false the request
    /// carries `Connection: close` and the connection is never reused.
    pub keep_alive: bool,
    /// The `User-Agent` value.
    pub user_agent: &'static str,
}

impl ExchangeConfig {
    /// A configuration with the default limits.
    pub fn new(host: impl Into<String>, deadline: Instant) -> Self {
        Self {
            host: host.into(),
            bearer: None,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            max_head_bytes: DEFAULT_MAX_HEAD_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            max_chunk_extension: DEFAULT_MAX_CHUNK_EXTENSION,
            max_trailer_bytes: DEFAULT_MAX_TRAILER_BYTES,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            deadline,
            keep_alive: true,
            user_agent: DEFAULT_USER_AGENT,
        }
    }

    /// Sets the bearer token.
    #[must_use]
    pub fn bearer(mut self, token: Secret) -> Self {
        self.bearer = Some(token);
        self
    }

    /// Checks every field against its allowed range and the header values
    /// against the field-value grammar (`validation`, operation `config`).
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |reason| Err(Error::validation(Operation::Config, reason));
        if self.host.is_empty() || !self.host.bytes().all(is_visible) {
            return bad(Reason::Host);
        }
        if let Some(token) = &self.bearer
            && (token.is_empty() || !token.expose().bytes().all(is_visible))
        {
            return bad(Reason::BearerToken);
        }
        if !self.user_agent.bytes().all(is_field_byte) {
            return bad(Reason::UserAgent);
        }
        if !(1..=MAX_REQUEST_BODY_CEILING).contains(&self.max_request_body) {
            return bad(Reason::MaxRequestBody);
        }
        if !(1..=MAX_HEAD_BYTES_CEILING).contains(&self.max_head_bytes) {
            return bad(Reason::MaxHeadBytes);
        }
        if !(1..=MAX_HEADERS_CEILING).contains(&self.max_headers) {
            return bad(Reason::MaxHeaders);
        }
        if !(1..=MAX_RESPONSE_BODY_CEILING).contains(&self.max_response_body) {
            return bad(Reason::MaxResponseBody);
        }
        if self.max_chunk_extension > 64 * 1024 {
            return bad(Reason::MaxChunkExtension);
        }
        if self.max_trailer_bytes > 64 * 1024 {
            return bad(Reason::MaxTrailerBytes);
        }
        if self.idle_timeout.is_some_and(|d| d.is_zero()) {
            return bad(Reason::IdleTimeout);
        }
        Ok(())
    }
}

/// A visible ASCII byte (`VCHAR`).
pub(crate) const fn is_visible(b: u8) -> bool {
    b.is_ascii_graphic()
}

/// A byte allowed in a header field value (`VCHAR`, SP, HTAB).
pub(crate) const fn is_field_byte(b: u8) -> bool {
    b.is_ascii_graphic() || b == b' ' || b == b'\t'
}
