//! The conformance probe: drives smolbox's HTTP/1.1, SSE and WebSocket
//! state machines against a third-party peer and prints what it saw.
//!
//! ```text
//! smolbox-probe MODE URL [args] --max-body N --max-header N --max-frame N --max-message N
//!     --max-line N --max-event N --idle-timeout-ms N --deadline-ms N [--shell tokio]
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
//! shared with the blocking shell's probe; this binary connects and drives
//! it with the shell's one driver ([`smolbox_tokio::drive`]).

use std::process::ExitCode;
use std::time::Instant;

use smolbox_probe_common::{Fail, Opts, Out, Probe, classify};
use smolbox_tokio::{SocketTarget, TlsFiles};

/// The shell this probe drives (`--shell` must name it).
const SHELL: &str = "tokio";

fn main() -> ExitCode {
    let opts = match Opts::from_env(SHELL) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::from(2);
    };
    let mut out = Out;
    let run = rt.block_on(run(&opts, &mut out));
    smolbox_probe_common::finish(&mut out, run)
}

async fn run(o: &Opts, out: &mut Out) -> Result<Probe, Fail> {
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
    let conn = target
        .connect(deadline, Probe::operation(o))
        .await
        .map_err(|e| classify(&e, false))?;
    let mut probe = Probe::new(o, Instant::now(), deadline)?;
    smolbox_tokio::drive(conn, &mut probe, deadline, |line| out.emit(&line)).await;
    Ok(probe)
}
