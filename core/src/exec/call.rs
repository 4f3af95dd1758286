//! The exec operations as worker calls ([`WorkerCall`]): version gates,
//! request, status and media-type checks, and reply decoding in one value.

use super::{
    Command, ExecOutcome, ExecOutput, ExecStreamDecoder, MAX_STREAM_CHUNK_LEN, OutputAllowance,
    OutputEncoding, decode_reply_for, exec_request, exec_stream_request,
};
use crate::Reason;
use crate::error::{Error, Operation};
use crate::http1::{Request, ResponseHead};
use crate::worker::status::{check_media_type, check_status};
use crate::worker::{
    APPLICATION_JSON, Feature, ImageCheck, Profile, TEXT_EVENT_STREAM, Version, WorkerCall,
};

/// Reply cap of a launch acknowledgement (a few dozen bytes in practice).
const LAUNCH_REPLY_CAP: u64 = 65_536;

/// Buffered exec, `POST /api/v1/machines/{name}/exec` (C5.2), or a
/// background launch (C5.4) when the command is a background one.
///
/// Decoding a 200 gives [`ExecOutcome::Exited`] for a foreground command and
/// [`ExecOutcome::Launched`] for a background one; other statuses map as
/// C1.2 (404 `not_found`, 408 `unknown`: the command may still be running).
/// An extended command (C5.4) carries an [`ImageCheck`]
/// ([`WorkerCall::image_check`]): the shell inspects the machine within the
/// same operation deadline and sends the exec only to a plain image machine.
#[derive(Clone, Debug)]
pub struct ExecCall {
    machine: String,
    command: Command,
    allowance: OutputAllowance,
    check: Option<ImageCheck>,
}

impl ExecCall {
    /// A checked exec call against a worker with `profile`.
    ///
    /// # Errors
    /// `validation` (C5.1 bounds, empty machine name) or
    /// `unsupported_capability` (an extended command before 1.17.0, `user`
    /// on 1.9.2), all `not_dispatched`.
    pub fn new(
        profile: &Profile,
        machine: impl Into<String>,
        command: Command,
        allowance: OutputAllowance,
    ) -> Result<Self, Error> {
        let operation = operation_of(&command);
        check_command(profile, &command, operation)?;
        let machine = machine.into();
        exec_request(&machine, &command)?;
        let check = image_check(profile, &machine, &command, operation)?;
        Ok(Self {
            machine,
            command,
            allowance,
            check,
        })
    }

    /// The command.
    pub fn command(&self) -> &Command {
        &self.command
    }
}

impl WorkerCall for ExecCall {
    type Output = ExecOutcome;

    fn operation(&self) -> Operation {
        operation_of(&self.command)
    }

    fn request(&self) -> Result<Request, Error> {
        exec_request(&self.machine, &self.command)
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<ExecOutcome, Error> {
        let op = self.operation();
        check_status(op, head, body, 200)?;
        check_media_type(op, head, APPLICATION_JSON)?;
        decode_reply_for(&self.command, body, self.allowance)
    }

    /// The reply carries the output twice: lossy JSON text (≤ 6 bytes per
    /// output byte, `\u00XX`) and base64 (4 per 3), so a reply within the
    /// allowance is at most 8× it plus the envelope.
    fn max_response_bytes(&self) -> Option<u64> {
        if self.command.is_background() {
            return Some(LAUNCH_REPLY_CAP);
        }
        let allowance = u64::try_from(self.allowance.bytes()).unwrap_or(u64::MAX);
        Some(allowance.saturating_mul(8).saturating_add(4_096))
    }

    /// An extended command (C5.4) may stay silent up to its own timeout:
    /// only the operation deadline holds.
    fn uses_receive_idle(&self) -> bool {
        !self.command.is_extended()
    }

    fn image_check(&self) -> Option<&ImageCheck> {
        self.check.as_ref()
    }
}

/// Streamed exec, `POST /api/v1/machines/{name}/exec/stream` (C5.3).
///
/// A shell reads the head, calls [`Self::check_head`] (and
/// [`Self::decode_error`] with the body of a non-200), then feeds the body
/// to [`Self::decoder`]. [`WorkerCall::decode`] does all of it over a
/// complete body.
#[derive(Clone, Debug)]
pub struct ExecStreamCall {
    machine: String,
    command: Command,
    allowance: OutputAllowance,
    check: Option<ImageCheck>,
}

impl ExecStreamCall {
    /// A checked streaming call against a worker with `profile`.
    ///
    /// # Errors
    /// As [`ExecCall::new`], and `unsupported_capability` for a command with
    /// stdin or a background command (C5.3, AC-5.4.2).
    pub fn new(
        profile: &Profile,
        machine: impl Into<String>,
        command: Command,
        allowance: OutputAllowance,
    ) -> Result<Self, Error> {
        let machine = machine.into();
        exec_stream_request(&machine, &command)?;
        check_command(profile, &command, Operation::ExecStream)?;
        let check = image_check(profile, &machine, &command, Operation::ExecStream)?;
        Ok(Self {
            machine,
            command,
            allowance,
            check,
        })
    }

    /// The request.
    ///
    /// # Errors
    /// As [`Self::new`] (never, once constructed).
    pub fn request(&self) -> Result<Request, Error> {
        exec_stream_request(&self.machine, &self.command)
    }

    /// `Ok(true)` for a 200 with `text/event-stream` (decode the body with
    /// [`Self::decoder`]); `Ok(false)` for another status (read the body and
    /// call [`Self::decode_error`]).
    ///
    /// # Errors
    /// `protocol` / `dispatch_uncertain` for a 200 with another media type.
    pub fn check_head(&self, head: &ResponseHead) -> Result<bool, Error> {
        if head.status != 200 {
            return Ok(false);
        }
        check_media_type(Operation::ExecStream, head, TEXT_EVENT_STREAM)?;
        Ok(true)
    }

    /// The error of a non-200 reply (C1.2 mapping).
    pub fn decode_error(&self, head: &ResponseHead, body: &[u8]) -> Error {
        match check_status(Operation::ExecStream, head, body, 200) {
            Err(e) => e,
            Ok(()) => Error::protocol(Operation::ExecStream, Reason::UnexpectedStatus),
        }
    }

    /// A body decoder with this call's output allowance.
    pub fn decoder(&self) -> ExecStreamDecoder {
        ExecStreamDecoder::new(self.allowance)
    }
}

impl WorkerCall for ExecStreamCall {
    /// The exit and the captured output, tagged `lossy_utf8`.
    type Output = ExecOutput;

    fn operation(&self) -> Operation {
        Operation::ExecStream
    }

    fn request(&self) -> Result<Request, Error> {
        Self::request(self)
    }

    /// As for [`ExecCall`]: an extended command runs without the
    /// receive-idle timeout.
    fn uses_receive_idle(&self) -> bool {
        !self.command.is_extended()
    }

    fn image_check(&self) -> Option<&ImageCheck> {
        self.check.as_ref()
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<ExecOutput, Error> {
        if !self.check_head(head)? {
            return Err(self.decode_error(head, body));
        }
        let mut decoder = self.decoder();
        let mut out = ExecOutput::empty(OutputEncoding::LossyUtf8);
        for chunk in body.chunks(MAX_STREAM_CHUNK_LEN) {
            decoder.handle_input(chunk)?;
            decoder.drain_into(&mut out)?;
        }
        out.exit_code = decoder.finish()?;
        Ok(out)
    }
}

fn operation_of(command: &Command) -> Operation {
    if command.is_background() {
        Operation::Launch
    } else {
        Operation::Exec
    }
}

/// The image-machine preflight of an extended command (C5.4), `None` for
/// any other.
fn image_check(
    profile: &Profile,
    machine: &str,
    command: &Command,
    operation: Operation,
) -> Result<Option<ImageCheck>, Error> {
    if command.is_extended() {
        ImageCheck::new(profile, machine, operation).map(Some)
    } else {
        Ok(None)
    }
}

/// Version gates of a command: extended exec from 1.17.0 (C5.4); `user`
/// is refused by 1.9.2's strict request struct (worker-api.md §12.2 #5).
fn check_command(profile: &Profile, command: &Command, operation: Operation) -> Result<(), Error> {
    command.validate()?;
    if command.is_extended() {
        profile.require(Feature::ExtendedExec, operation)?;
    }
    if command.user_name().is_some() && profile.base() == Version::V1_9_2 {
        return Err(Error::unsupported_capability(
            operation,
            Reason::ExecUserNotInVersion,
        ));
    }
    Ok(())
}
