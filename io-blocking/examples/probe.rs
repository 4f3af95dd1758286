//! The conformance probe on the blocking shell (`--shell blocking`): the
//! same contract, output and error classes as the tokio shell's
//! `smolbox-probe`, with every read and write on the blocking shell's mio
//! loop. It drives smolbox's HTTP/1.1, SSE and WebSocket state machines
//! against a third-party peer and prints what it saw.
//!
//! `cargo run -p smolbox-blocking --example probe -- MODE URL … --shell blocking`
//!
//! ```text
//! smolbox-probe MODE URL [args] --max-body N --max-header N --max-frame N --max-message N
//!     --max-line N --max-event N --idle-timeout-ms N --deadline-ms N [--shell blocking]
//! MODE http     one request (GET, or --method POST --json DOC), a JSON reply expected
//! MODE sse      GET with Accept: text/event-stream; every event, then `end`
//! MODE ws       open; --send text:STR|hex:HEX (in order); close 1000 after --recv N
//!               messages; --flood BYTES sends 64 KiB binary messages up to BYTES
//! MODE ws-echo  echo every message back with the same type until the close
//! ```
//!
//! Output: one JSON object per line on stdout; the last is a terminator
//! (`response`, `end`, `close`) or one `error` with a class among
//! `protocol, too_large, timeout, truncated, abnormal_close, handshake,
//! invalid_utf8, unsupported_encoding, status, content_type, json, connect`.
//! Redirects are never followed and nothing is decompressed. `--ca FILE`
//! (with an optional `--cert FILE --key FILE`) enables `https`/`wss`.
//!
//! The run itself is `smolbox_probe_common::Probe`, a sans-IO machine
//! shared with the tokio shell's probe; this example connects and drives
//! it with the shell's one driver (`smolbox_blocking::Connection::drive`).

use std::process::ExitCode;
use std::time::Instant;

use smolbox_blocking::{SocketTarget, TlsFiles};
use smolbox_probe_common::{Fail, Opts, Out, Probe, classify};

/// The shell this probe drives (`--shell` must name it).
const SHELL: &str = "blocking";

fn main() -> ExitCode {
    let opts = match Opts::from_env(SHELL) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let mut out = Out;
    let run = run(&opts, &mut out);
    smolbox_probe_common::finish(&mut out, run)
}

fn run(o: &Opts, out: &mut Out) -> Result<Probe, Fail> {
    let deadline = Instant::now() + o.deadline;
    let target = match &o.tls {
        Some(paths) if o.url.secure => {
            let files = TlsFiles {
                ca_file: Some(paths.ca_file.clone()),
                system_roots: false,
                client_identity: paths.client_identity.clone(),
            };
            SocketTarget::tls(o.url.host.clone(), o.url.port, &files)
                .map_err(|e| Fail::new("connect", e.to_string()))?
        }
        _ => SocketTarget::tcp(o.url.host.clone(), o.url.port),
    };
    let mut conn = target
        .connect(deadline, Probe::operation(o))
        .map_err(|e| classify(&e, false))?;
    let mut probe = Probe::new(o, Instant::now(), deadline)?;
    conn.drive(&mut probe, deadline, |line| out.emit(&line));
    Ok(probe)
}
