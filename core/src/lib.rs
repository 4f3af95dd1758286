//! smolbox-core: the sans-IO protocol core of smolbox.
//!
//! Nothing in this crate blocks, sleeps, spawns, reads a clock, or touches
//! a socket or a database; time (`now: Instant`), randomness (WebSocket keys
//! and masks) and wall-clock milliseconds for records are arguments. The
//! shells (`smolbox-tokio`, `smolbox-blocking`) own sockets, waiting and
//! threads.
//!
//! # The driver contract
//!
//! Every connection object — [`http1::HttpExchange`], [`ws::WsClient`],
//! [`terminal::TerminalSession`] — implements [`Machine`]: inputs are
//! `handle_input`, `handle_eof`, `handle_written`, `handle_transport_error`
//! and `handle_timeout` (early or repeated: a no-op); outputs are
//! `poll_transmit(&mut Vec<u8>)`, `poll_event()` (a failure is the last
//! event) and `poll_timeout() -> Option<(Instant, Timer)>`; `is_finished`
//! says when to stop and `wants_read` paces reading. Each shell has one
//! generic driver over this trait. Here is the whole loop, blocking, over a
//! `std` socket (a real shell adds pooling, TLS and a non-blocking wait):
//!
//! ```
//! use std::io::{ErrorKind, Read, Write};
//! use std::net::{TcpListener, TcpStream};
//! use std::time::{Duration, Instant};
//!
//! use smolbox_core::http1::{ExchangeConfig, HttpEvent, HttpExchange, Method, Request};
//! use smolbox_core::{Machine, Operation, TransportFailure};
//!
//! /// Drives `m` over `sock` until it is finished, handing every event to
//! /// `on_event`.
//! fn drive<M: Machine>(
//!     m: &mut M,
//!     sock: &mut TcpStream,
//!     mut on_event: impl FnMut(M::Event<'_>),
//! ) {
//!     let (mut out, mut buf) = (Vec::new(), [0u8; 4096]);
//!     loop {
//!         // 1. Write what the object queued, and say what the socket took.
//!         out.clear();
//!         while m.poll_transmit(&mut out) {}
//!         if !out.is_empty() {
//!             match sock.write_all(&out) {
//!                 Ok(()) => m.handle_written(Instant::now(), out.len()),
//!                 Err(_) => m.handle_transport_error(Instant::now(), TransportFailure::Write),
//!             }
//!         }
//!         // 2. Deliver events (a failure is the last one).
//!         while let Some(event) = m.poll_event() {
//!             on_event(event);
//!         }
//!         if m.is_finished() {
//!             return;
//!         }
//!         // 3. Wait for bytes or the object's deadline; feed what happened.
//!         let wait = m.poll_timeout().map_or(Duration::from_secs(1), |(at, _)| {
//!             at.saturating_duration_since(Instant::now())
//!         });
//!         let _ = sock.set_read_timeout(Some(wait.max(Duration::from_millis(1))));
//!         if !m.wants_read() {
//!             std::thread::sleep(wait);
//!             m.handle_timeout(Instant::now());
//!             continue;
//!         }
//!         let read = sock.read(&mut buf);
//!         let now = Instant::now();
//!         match read {
//!             Ok(0) => m.handle_eof(now),
//!             Ok(n) => m.handle_input(now, &buf[..n]),
//!             Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
//!                 m.handle_timeout(now)
//!             }
//!             Err(_) => m.handle_transport_error(now, TransportFailure::Read),
//!         }
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A worker stand-in on loopback that answers one request.
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let worker = std::thread::spawn(move || -> std::io::Result<()> {
//!     let (mut s, _) = listener.accept()?;
//!     let mut head = [0u8; 1024];
//!     let _ = s.read(&mut head)?;
//!     s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
//!         Content-Length: 15\r\n\r\n{\"status\":\"ok\"}")
//! });
//!
//! let now = Instant::now();
//! let config = ExchangeConfig::new(addr.to_string(), now + Duration::from_secs(10));
//! let request = Request::new(Operation::Health, Method::Get, "/health".into())
//!     .accept("application/json");
//! let mut exchange = HttpExchange::new(&request, &config, now)?;
//! let mut sock = TcpStream::connect(addr)?;
//! let (mut status, mut body, mut ended) = (0, Vec::new(), false);
//! drive(&mut exchange, &mut sock, |event| match event {
//!     HttpEvent::Head(head) => status = head.status,
//!     HttpEvent::Data(bytes) => body.extend_from_slice(bytes),
//!     HttpEvent::End => ended = true,
//!     HttpEvent::Failed(e) => panic!("{e:?}"),
//!     _ => {}
//! });
//! assert_eq!((status, body.as_slice(), ended), (200, &b"{\"status\":\"ok\"}"[..], true));
//! assert!(exchange.is_reusable());
//! # worker.join().map_err(|_| "worker panicked")??;
//! # Ok(())
//! # }
//! ```
//!
//! Operations are values too: a [`worker::WorkerCall`] builds its request
//! (after the version gates of its [`worker::Profile`]), says its reply cap
//! and idle rule ([`worker::Endpoint::exchange_config_for`]), and decodes
//! and validates the reply. Every [`Error`] says whether the request may
//! have reached the worker (its [`Evidence`]).

#![warn(missing_docs)]

pub mod error;
pub mod exec;
pub mod http1;
pub mod machine;
pub mod managed;
pub mod secret;
pub mod sse;
pub mod terminal;
pub mod worker;
pub mod ws;

pub use error::{Category, Error, Evidence, Limit, Operation, Reason};
pub use machine::{Machine, TransportFailure};
pub use secret::Secret;
