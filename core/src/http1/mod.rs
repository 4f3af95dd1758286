//! HTTP/1.1 client exchange as a sans-IO state machine (features C1.2, C1.3).
//!
//! [`Request`] and [`ResponseHead`] are the values worker operations build and
//! read; [`HttpExchange`] runs one request/response on a connection: it
//! encodes the request ([`ExchangeConfig`] supplies Host, bearer token and
//! limits), decodes the response head with httparse (byte and header-count
//! caps judged on the logical head, whatever the read chunking; 1xx interim
//! heads skipped, 101 final), streams the body (Content-Length, chunked or
//! read-to-close; raw-byte cap; chunk extensions and trailers bounded) and
//! runs the receive-idle and overall deadline timers. It never follows
//! redirects, never decompresses (`content-encoding` other than `identity`
//! is a protocol error) and never retries. [`status_error`] maps an
//! unexpected status to the error C1.2 prescribes.
//!
//! # Drive loop
//!
//! After every input, drain `poll_transmit`, then `poll_event` until `None`,
//! then read `poll_timeout`. Body bytes arrive as [`HttpEvent::Data`]
//! slices borrowed from the exchange (no allocation per chunk).
//!
//! ```
//! use std::time::{Duration, Instant};
//! use smolbox_core::Operation;
//! use smolbox_core::http1::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request};
//!
//! # fn main() -> Result<(), smolbox_core::Error> {
//! let now = Instant::now();
//! let config = ExchangeConfig::new("127.0.0.1:8080", now + Duration::from_secs(30));
//! let request = Request::new(Operation::Health, Method::Get, "/health".into())
//!     .accept("application/json");
//! let mut exchange = HttpExchange::new(&request, &config, now)?;
//!
//! let mut wire = Vec::new();
//! assert!(exchange.poll_transmit(&mut wire)); // the shell writes `wire`
//! assert!(wire.starts_with(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"));
//!
//! // The shell reads; here the reply arrives in two pieces.
//! let reply: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
//!     Transfer-Encoding: chunked\r\n\r\n7\r\n{\"a\":1}\r\n0\r\n\r\n";
//! let mut body = Vec::new();
//! let mut ended = false;
//! for piece in [&reply[..40], &reply[40..]] {
//!     exchange.handle_input(now, piece)?;
//!     while let Some(event) = exchange.poll_event() {
//!         match event {
//!             HttpEvent::Head(head) => assert!(head.media_type_is("application/json")),
//!             HttpEvent::Data(bytes) => body.extend_from_slice(bytes),
//!             HttpEvent::End => ended = true,
//!             HttpEvent::Failed(e) => return Err(e),
//!             _ => {}
//!         }
//!     }
//!     // else: wait for readable or `exchange.poll_timeout()`, then
//!     // `handle_timeout(now)` when it is due.
//! }
//! assert!(ended && body == b"{\"a\":1}");
//! assert!(exchange.is_reusable()); // keep-alive: the connection may be reused
//! # Ok(())
//! # }
//! ```

mod body;
mod config;
pub mod encode;
mod exchange;
#[cfg(feature = "testkit")]
pub mod fuzzing;
mod head;
mod pull;
mod request;
mod status;
mod types;

pub use config::{
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CHUNK_EXTENSION, DEFAULT_MAX_HEAD_BYTES, DEFAULT_MAX_HEADERS,
    DEFAULT_MAX_REQUEST_BODY, DEFAULT_MAX_RESPONSE_BODY, DEFAULT_MAX_TRAILER_BYTES,
    DEFAULT_USER_AGENT, ExchangeConfig, MAX_HEAD_BYTES_CEILING, MAX_HEADERS_CEILING,
    MAX_REQUEST_BODY_CEILING, MAX_RESPONSE_BODY_CEILING,
};
pub use exchange::{HttpEvent, HttpExchange, Timer};
pub use pull::Pulled;
pub use status::status_error;
pub use types::{Method, Request, ResponseHead};
