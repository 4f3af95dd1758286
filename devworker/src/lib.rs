//! smolbox-devworker: a local stand-in for `smolvm serve`, faithful on the
//! wire, with fault injection.
//!
//! **Commands run on the host, as host processes, without isolation.** Each
//! machine is a record in memory plus a host directory standing for its
//! filesystem (`<state>/machines/<name>/rootfs`; guest `/workspace/a.txt` is
//! `rootfs/workspace/a.txt`). Exec runs argv as a host process in that
//! directory (the working directory is mapped; `/workspace` inside argv
//! elements is rewritten to the host directory; the environment is only
//! `PATH`, `HOME` and the request's `env`). Terminals run under a real PTY.
//! A "running" machine owns a stand-in VMM host process whose PID is the
//! machine's `pid`; killing it makes the machine read `stopped`, and a
//! [`DevWorker::restart`] then deletes it, as the real worker does.
//!
//! The HTTP API follows `worker-api.md` (1.9.2, or the 1.22.0 profile of §12):
//! status codes, content types, JSON field order, axum's own plain-text
//! rejections (it is built on axum 0.8 like the real worker), `x-trace-id`
//! and `vary` on every reply, SSE framing of axum's encoder, the WebSocket
//! terminal protocol, and the 300 s request timeout (408, command still
//! running).
//!
//! # Starting one in a test
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use smolbox_devworker::{DevWorker, Fault, Route};
//! let w = DevWorker::builder()
//!     .version("1.9.2")
//!     .token(None)
//!     .tls(false)
//!     .unix_socket(None)
//!     .state_dir(None)
//!     .start()
//!     .await?;
//! let url = w.base_url(); // "http://127.0.0.1:PORT"
//! w.faults().once(Route::Exec, Fault::DropAfter { bytes: 20 });
//! // ... drive it ...
//! assert_eq!(w.request_count(Route::Exec), 0);
//! w.shutdown().await;
//! # let _ = url; Ok(()) }
//! ```
//!
//! Without tokio: `DevWorker::start_blocking(DevWorker::builder())` returns a
//! [`BlockingDevWorker`] that runs its own runtime.
//!
//! # Faults
//!
//! [`Faults`] (from [`DevWorker::faults`]) takes [`FaultRule`]s per
//! [`Route`] and/or machine: delay, drop after N reply bytes, silent stall
//! after N bytes, raw reply bytes, truncated or malformed JSON, gzip,
//! redirect, mismatched create reply, early 408, close before the exit
//! frame, exit 130, oversize or masked terminal frame, silent stream stall.
//! [`DevWorker::restart`] simulates a worker restart. The same is reachable
//! over HTTP: `POST /_devworker/faults` with a [`FaultRule`] as JSON (e.g.
//! `{"route":"exec","fault":{"kind":"delay","ms":100},"times":1}`),
//! `DELETE /_devworker/faults`, `GET /_devworker/counts`,
//! `POST /_devworker/restart`.

mod api;
mod config;
mod conn;
mod faults;
mod gzip;
mod process;
mod server;
mod state;
mod tls;

pub use config::{Limits, Version};
pub use faults::{Fault, FaultRule, Faults, MismatchField, Route};
pub use server::{BlockingDevWorker, Builder, DevWorker};
pub use tls::TlsFiles;
