//! smolbox-devworker: a local stand-in for `smolvm serve`, faithful on the
//! wire, with fault injection.
//!
//! **Commands run on the host, as host processes, without isolation** (it
//! says so on stderr at start unless [`Builder::quiet`]).
//!
//! # Model
//!
//! * Each machine is a record in memory plus a host directory standing for
//!   its filesystem: `<state>/machines/<name>/rootfs` ([`DevWorker::guest_root`]).
//!   Guest paths map into it (`/workspace/a.txt` → `rootfs/workspace/a.txt`;
//!   `..` never leaves it) for files, exec `workdir` and terminal cwd.
//! * Exec runs argv as a host process in its own process group: `/workspace`
//!   inside argv elements (as a word or path prefix, also inside `sh -c`
//!   strings) is rewritten to the host directory; the environment is only
//!   `PATH`, `HOME` (`rootfs/root`) and the request's `env`; default working
//!   directory is `rootfs`. `timeoutSecs` kills the group and reports 124.
//!   `user` (1.22.0) is accepted and ignored.
//! * A running machine owns a stand-in VMM host process (`sleep`), whose PID
//!   is the machine's `pid` ([`DevWorker::machine_pid`]); killing it
//!   ([`DevWorker::kill_machine_process`]) makes the machine read `stopped`,
//!   and a [`DevWorker::restart`] then deletes it, as the real worker does.
//!   Exec, files, terminals and image pulls start a machine implicitly.
//! * Terminals run under a real PTY (portable-pty); the console log that
//!   `/logs` serves is `<state>/machines/<name>/agent-console.log`
//!   ([`DevWorker::console_log`]); the devworker appends a boot line at each
//!   start and tests may write anything there.
//! * With a caller-given state directory, machine records persist: a new
//!   devworker on the same directory is a restarted worker (live VMMs
//!   reconnected, dead ones deleted, records without a PID kept). Shutdown
//!   stops machines unless [`Builder::keep_machines_running`].
//! * Without a state directory a temporary one is used and removed at
//!   shutdown; every process the devworker started is killed at shutdown or
//!   drop.
//!
//! # Wire fidelity
//!
//! The HTTP API follows `worker-api.md`: 1.9.2, or the 1.22.0 profile of §12
//! (`image`, `runtime`, `blockIo`, `branchable`… in replies, `staged` mounts,
//! exec `user`, empty start bodies, `?branchable=true`, `/branches`,
//! directory listings, no 300 s limit on exec). Status codes, content types,
//! JSON field order, axum's own plain-text rejections (it is built on axum
//! 0.8 like the real worker), `x-trace-id` and `vary` on every reply, CORS
//! preflight, the SSE framing of axum's encoder (CR splitting, `:` keep-alive,
//! `error` events), the WebSocket terminal protocol, the 300 s request
//! timeout (empty 408, command still running), body caps and output caps.
//! Listeners: TCP on loopback, a Unix socket, mutual TLS with generated
//! certificates ([`DevWorker::tls_files`]) plus the plain loopback door
//! ([`DevWorker::local_door`]). An optional bearer token
//! ([`Builder::token`]) stands in for an authenticating proxy; it guards every
//! route, the control routes included. Extension routes (resize,
//! `/artifacts/warm`, images list/pull, fork/branches) have simple stand-in
//! semantics. Error messages not captured in the vectors are the
//! devworker's own wording.
//!
//! # A safe neighbour
//!
//! By default ([`Builder::neighbour_checks`]) a TCP request whose `Host` is
//! neither `localhost`, a loopback address nor the bound address is refused
//! with 403 (DNS rebinding), as is a WebSocket upgrade whose `Origin` is
//! present and not one of the CORS origins, and an exec `timeoutSecs` above
//! 86,400 gets 400. The bearer token is compared in constant time and never
//! shown by `Debug`; generated TLS keys are written 0600. Terminal teardown
//! hangs up the PTY's whole process group (SIGHUP, then SIGKILL after
//! [`Limits::terminal_hangup_grace`]). Downloads refuse FIFOs, devices,
//! sockets and files above [`Limits::file_body_max`]. The standalone binary
//! generates a token unless given one (or `--no-token`, loopback only).
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
//! [`BlockingDevWorker`] that runs its own runtime (do not use it from inside
//! an async context). Timings shrink for tests through [`Builder::limits`],
//! [`Builder::request_timeout`], [`Builder::keepalive`] and
//! [`Builder::supervisor_tick`] (or [`DevWorker::tick_supervisor`]).
//!
//! # Faults
//!
//! [`Faults`] (from [`DevWorker::faults`]) takes [`FaultRule`]s per
//! [`Route`] and/or machine, for one request, N requests or until cleared:
//! delay, drop after N reply bytes, silent stall after N bytes, raw reply
//! bytes (broken HTTP), a canned reply (any status, content type and body),
//! truncated or malformed JSON, gzip, redirect, mismatched create reply
//! (name, cpus, memory, disks, ports), early 408 with the command still
//! running, close before the exit frame/event, exit 130, oversize or masked
//! terminal frame, silent stream stall. [`DevWorker::restart`] simulates a
//! worker restart (connections, streams, terminals and commands dropped and
//! forgotten; machines whose process died deleted; new `boot_id`).
//! [`Faults::request_count`] proves "no replay".
//!
//! The same over HTTP (outside the worker API): `POST /_devworker/faults`
//! with a [`FaultRule`] as JSON (e.g.
//! `{"route":"exec","fault":{"kind":"delay","ms":100},"times":1}`),
//! `DELETE /_devworker/faults`, `GET /_devworker/counts`,
//! `POST /_devworker/restart` (202, restarts right after replying).

mod api;
mod config;
mod conn;
mod faults;
mod gzip;
mod persist;
mod process;
mod server;
mod state;
mod tls;
mod util;

pub use config::{Limits, Version};
pub use faults::{Fault, FaultRule, Faults, MismatchField, Route};
pub use server::{BlockingDevWorker, Builder, DevWorker};
pub use tls::TlsFiles;

/// Writes `bytes` to `path` readable by its owner only (0600, forced also
/// on an existing file): how the devworker writes keys and tokens.
///
/// # Errors
/// The I/O error of opening, changing the mode of, or writing the file.
pub fn write_private_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    tls::write_private(path, bytes)
}
