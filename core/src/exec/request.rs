//! The exec requests: buffered (`POST …/exec`, worker-api.md §6) and
//! streamed (`POST …/exec/stream`, §7).

use super::Command;
use crate::Reason;
use crate::error::{Error, Operation};
use crate::http1::encode::push_path_segment;
use crate::http1::{Method, Request};

/// `application/json`
pub const JSON: &str = "application/json";
/// `text/event-stream`
pub const EVENT_STREAM: &str = "text/event-stream";

/// The request for `POST /api/v1/machines/{name}/exec`, the name
/// percent-encoded as one path segment. A background command's request is
/// attributed to [`Operation::Launch`], any other to [`Operation::Exec`].
///
/// Crate-private: outside core a request is built only through the gated
/// [`super::ExecCall`], so no caller can skip the version gates or the
/// image preflight the call carries.
///
/// # Errors
/// `validation` / `not_dispatched`: an empty machine name, or any C5.1 bound
/// of the command (see [`Command::validate`]).
pub(crate) fn exec_request(machine_name: &str, command: &Command) -> Result<Request, Error> {
    let operation = if command.is_background() {
        Operation::Launch
    } else {
        Operation::Exec
    };
    build(operation, machine_name, "/exec", JSON, command)
}

/// The request for `POST /api/v1/machines/{name}/exec/stream` (reply:
/// `text/event-stream`, decoded by [`super::ExecStreamDecoder`]).
/// Crate-private like [`exec_request`]; outside core through
/// [`super::ExecStreamCall`].
///
/// # Errors
/// `unsupported_capability` / `exec_stream` / `not_dispatched` when the
/// command has stdin or is a background command (the worker would ignore
/// both); otherwise as [`exec_request`].
pub(crate) fn exec_stream_request(machine_name: &str, command: &Command) -> Result<Request, Error> {
    let unsupported = |reason| Error::unsupported_capability(Operation::ExecStream, reason);
    if command.stdin_text().is_some() {
        return Err(unsupported(Reason::StreamWithStdin));
    }
    if command.is_background() {
        return Err(unsupported(Reason::StreamWithBackground));
    }
    build(
        Operation::ExecStream,
        machine_name,
        "/exec/stream",
        EVENT_STREAM,
        command,
    )
}

fn build(
    operation: Operation,
    machine_name: &str,
    suffix: &str,
    accept: &'static str,
    command: &Command,
) -> Result<Request, Error> {
    // The one machine-name rule (and reason code) of every API.
    crate::worker::MachineName::new(machine_name).map_err(|e| e.with_operation(operation))?;
    let body = command.wire_body()?;
    let mut target = String::with_capacity(24 + machine_name.len() * 3 + suffix.len());
    target.push_str("/api/v1/machines/");
    push_path_segment(&mut target, machine_name);
    target.push_str(suffix);
    Ok(Request::new(operation, Method::Post, target)
        .accept(accept)
        .body(JSON, body))
}
