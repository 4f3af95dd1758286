//! Buffered exec replies (C5.2, worker-api.md §6.2) and the background
//! launch acknowledgement (C5.4, §6.3).

use crate::Reason;
use core::fmt;
use std::borrow::Cow;

use serde::Deserialize;
use serde::de::{Deserializer, Visitor};

use super::Command;
use crate::error::{Error, Evidence, Operation};

/// Default output allowance (stdout + stderr): 1 MiB.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1_048_576;
/// Largest output allowance: 8 MiB.
pub const MAX_OUTPUT_BYTES: usize = 8_388_608;

/// How many output bytes (stdout and stderr together) a caller accepts:
/// 1 B – 8 MiB, default 1 MiB. This is also the worst-case memory a decoded
/// result holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OutputAllowance(usize);

impl OutputAllowance {
    /// The default allowance, 1 MiB.
    pub const DEFAULT: Self = Self(DEFAULT_MAX_OUTPUT_BYTES);

    /// An allowance of `max_bytes`.
    ///
    /// # Errors
    /// `validation` / `command_spec` / `not_dispatched` outside 1 B – 8 MiB.
    pub fn new(max_bytes: usize) -> Result<Self, Error> {
        if (1..=MAX_OUTPUT_BYTES).contains(&max_bytes) {
            Ok(Self(max_bytes))
        } else {
            Err(
                Error::validation(Operation::CommandSpec, Reason::OutputAllowanceOutOfRange)
                    .with_limit(to_u64(max_bytes), to_u64(MAX_OUTPUT_BYTES)),
            )
        }
    }

    /// The allowance in bytes.
    pub const fn bytes(self) -> usize {
        self.0
    }

    /// The most base64 text (both fields together) that can decode within
    /// the allowance: `ceil(max / 3) · 4 + 8` (one padded group per field).
    pub const fn max_encoded_bytes(self) -> usize {
        self.0.div_ceil(3) * 4 + 8
    }
}

impl Default for OutputAllowance {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How a result's bytes relate to the guest's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputEncoding {
    /// Exactly the bytes the command wrote (buffered exec, base64 fields).
    Bytes,
    /// UTF-8 after the worker's lossy conversion (SSE exec: invalid
    /// sequences became U+FFFD and carriage returns became line feeds).
    LossyUtf8,
}

impl OutputEncoding {
    /// The snake_case tag used in output and records.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::LossyUtf8 => "lossy_utf8",
        }
    }
}

/// An observed exit with the command's output. Any exit code — 3, 124,
/// anything — is a successful observation, not an error.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The guest exit code.
    pub exit_code: i32,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// Whether the bytes are exact or lossy UTF-8.
    pub encoding: OutputEncoding,
}

impl ExecOutput {
    /// An empty result with the given tag, to be filled (and reused).
    pub const fn empty(encoding: OutputEncoding) -> Self {
        Self {
            exit_code: 0,
            stdout: Vec::new(),
            stderr: Vec::new(),
            encoding,
        }
    }

    /// Adds one streamed event to the capture: output is appended, an exit
    /// sets the exit code (how a callback's run captures the stream).
    pub fn record(&mut self, event: &super::ExecEvent) {
        match event {
            super::ExecEvent::Stdout(s) => self.stdout.extend_from_slice(s.as_bytes()),
            super::ExecEvent::Stderr(s) => self.stderr.extend_from_slice(s.as_bytes()),
            super::ExecEvent::Exit(code) => self.exit_code = *code,
        }
    }
}

impl fmt::Debug for ExecOutput {
    /// Sizes only: output is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecOutput")
            .field("exit_code", &self.exit_code)
            .field("stdout_len", &self.stdout.len())
            .field("stderr_len", &self.stderr.len())
            .field("encoding", &self.encoding)
            .finish()
    }
}

/// A background launch acknowledgement. The PID is evidence of launch only:
/// not identity, readiness, liveness or exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launched {
    /// The guest PID the worker reported.
    pub pid: u32,
}

/// What a buffered exec reply means for the command that was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecOutcome {
    /// A foreground command exited.
    Exited(ExecOutput),
    /// A background command was launched.
    Launched(Launched),
}

impl ExecOutcome {
    /// The launch acknowledgement a background launch must yield (what
    /// both shells' `launch` return).
    ///
    /// # Errors
    /// `protocol` (`launch_without_ack`) for an exit: the worker answered
    /// the launch like a foreground exec.
    pub fn into_launched(self) -> Result<Launched, Error> {
        match self {
            Self::Launched(l) => Ok(l),
            Self::Exited(_) => Err(Error::protocol(Operation::Launch, Reason::LaunchWithoutAck)),
        }
    }
}

/// Decodes the 200 body of `POST …/exec` for `command`: a background command
/// must yield a launch acknowledgement, a foreground one an exit (so a
/// foreground `pid=12\n` is output, never a launch — AC-5.4.1).
///
/// # Errors
/// As [`decode_exec_reply`] or [`decode_launch_reply`].
pub fn decode_reply_for(
    command: &Command,
    body: &[u8],
    allowance: OutputAllowance,
) -> Result<ExecOutcome, Error> {
    if command.is_background() {
        decode_launch_reply(body).map(ExecOutcome::Launched)
    } else {
        decode_exec_reply(body, allowance).map(ExecOutcome::Exited)
    }
}

/// Decodes the 200 body of a foreground `POST …/exec` (C5.2). Allocates the
/// result; [`ExecReplyDecoder`] reuses buffers.
///
/// # Errors
/// See [`ExecReplyDecoder::decode_into`].
pub fn decode_exec_reply(body: &[u8], allowance: OutputAllowance) -> Result<ExecOutput, Error> {
    let mut out = ExecOutput::empty(OutputEncoding::Bytes);
    ExecReplyDecoder::new(allowance).decode_into(body, &mut out)?;
    Ok(out)
}

/// Decodes buffered exec replies into a caller's reusable [`ExecOutput`]
/// (base64 is decoded with a SIMD engine straight into its buffers).
#[derive(Clone, Copy, Debug)]
pub struct ExecReplyDecoder {
    allowance: OutputAllowance,
    operation: Operation,
}

impl ExecReplyDecoder {
    /// A decoder for replies to [`Operation::Exec`].
    pub const fn new(allowance: OutputAllowance) -> Self {
        Self {
            allowance,
            operation: Operation::Exec,
        }
    }

    /// Attributes errors to `operation` instead.
    #[must_use]
    pub const fn with_operation(mut self, operation: Operation) -> Self {
        self.operation = operation;
        self
    }

    /// Decodes `{exitCode, stdout, stderr, stdoutB64, stderrB64}` (exactly
    /// those fields, as the worker sends them) into `out`, replacing its
    /// contents and keeping its capacity. Only the `*B64` fields are used.
    ///
    /// # Errors
    /// * `protocol` / `dispatch_uncertain`: invalid JSON, a missing, extra or
    ///   duplicate field, an exit code outside `i32`, invalid base64.
    /// * `output_limit` / `exited` with the exit code: the base64 text is
    ///   longer than [`OutputAllowance::max_encoded_bytes`] (checked before
    ///   decoding), or the decoded output is over the allowance.
    pub fn decode_into(&self, body: &[u8], out: &mut ExecOutput) -> Result<(), Error> {
        let op = self.operation;
        let reply: WireReply<'_> = serde_json::from_slice(body)
            .map_err(|_| Error::protocol(op, Reason::ExecReplyInvalid))?;
        let over = |actual: usize, max: usize| {
            Error::output_limit(op, Evidence::Exited, Reason::OutputAllowance)
                .with_exit_code(reply.exit_code)
                .with_limit(to_u64(actual), to_u64(max))
        };
        let encoded = reply.stdout_b64.len() + reply.stderr_b64.len();
        if encoded > self.allowance.max_encoded_bytes() {
            return Err(over(encoded, self.allowance.max_encoded_bytes()));
        }
        out.exit_code = reply.exit_code;
        out.encoding = OutputEncoding::Bytes;
        if !(decode_b64(reply.stdout_b64.as_bytes(), &mut out.stdout)
            && decode_b64(reply.stderr_b64.as_bytes(), &mut out.stderr))
        {
            return Err(Error::protocol(op, Reason::ExecReplyBase64));
        }
        let decoded = out.stdout.len() + out.stderr.len();
        if decoded > self.allowance.bytes() {
            return Err(over(decoded, self.allowance.bytes()));
        }
        Ok(())
    }
}

/// The standard alphabet, canonical padding required, no trailing bits: the
/// `base64` crate's engine that picks AVX2/NEON at run time (detected once)
/// and falls back to its scalar engine.
static B64: std::sync::LazyLock<base64::engine::simd::Simd> = std::sync::LazyLock::new(|| {
    base64::engine::simd::Simd::standard(base64::engine::general_purpose::PAD)
});

/// Decodes standard padded base64 into `out` (cleared first; capacity kept),
/// with a SIMD engine. Returns `false` on any invalid byte, length or padding.
pub fn decode_b64(input: &[u8], out: &mut Vec<u8>) -> bool {
    use base64::Engine as _;
    out.clear();
    B64.decode_vec(input, out).is_ok()
}

/// Decodes the 200 body of a background `POST …/exec` (C5.4): exit 0, empty
/// stderr, stdout exactly `pid=<N>\n` with N `[1-9][0-9]{0,9}` ≤ 4,294,967,295.
///
/// # Errors
/// `protocol` / `launch` / `dispatch_uncertain` for anything else,
/// including a reply too large for an acknowledgement.
pub fn decode_launch_reply(body: &[u8]) -> Result<Launched, Error> {
    // "pid=4294967295\n" is 15 bytes; anything longer is not an acknowledgement.
    let allowance = OutputAllowance(64);
    let mut out = ExecOutput::empty(OutputEncoding::Bytes);
    ExecReplyDecoder::new(allowance)
        .with_operation(Operation::Launch)
        .decode_into(body, &mut out)
        .map_err(|e| Error::protocol(Operation::Launch, e.reason()))?;
    launch_from_output(&out)
}

/// Reads a launch acknowledgement from a decoded background reply.
///
/// # Errors
/// `protocol` / `launch` / `dispatch_uncertain` unless exit 0, empty stderr
/// and stdout exactly `pid=<N>\n` (N `[1-9][0-9]{0,9}`, ≤ `u32::MAX`).
pub fn launch_from_output(out: &ExecOutput) -> Result<Launched, Error> {
    let bad = |reason| Error::protocol(Operation::Launch, reason);
    if out.exit_code != 0 {
        return Err(bad(Reason::LaunchExitNonzero).with_exit_code(out.exit_code));
    }
    if !out.stderr.is_empty() {
        return Err(bad(Reason::LaunchStderr));
    }
    let digits = out
        .stdout
        .strip_prefix(b"pid=")
        .and_then(|s| s.strip_suffix(b"\n"))
        .ok_or_else(|| bad(Reason::LaunchAckShape))?;
    let well_formed = (1..=10).contains(&digits.len())
        && digits[0] != b'0'
        && digits.iter().all(u8::is_ascii_digit);
    if !well_formed {
        return Err(bad(Reason::LaunchAckShape));
    }
    let pid = digits
        .iter()
        .try_fold(0u64, |n, &d| Some(n * 10 + u64::from(d - b'0')))
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(Reason::LaunchPidRange))?;
    Ok(Launched { pid })
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The reply of worker-api.md §6.2. Base64 has no JSON escapes, so the
/// `*B64` fields borrow from the body; the lossy fields are skipped unread.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireReply<'a> {
    #[serde(rename = "exitCode")]
    exit_code: i32,
    #[allow(dead_code)] // required, never used: the base64 fields are exact
    stdout: SkippedStr,
    #[allow(dead_code)] // as above
    stderr: SkippedStr,
    #[serde(rename = "stdoutB64", borrow)]
    stdout_b64: Cow<'a, str>,
    #[serde(rename = "stderrB64", borrow)]
    stderr_b64: Cow<'a, str>,
}

/// A JSON string whose text is checked and dropped (no allocation).
struct SkippedStr;

impl<'de> Deserialize<'de> for SkippedStr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SkippedStr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<SkippedStr, E> {
                Ok(SkippedStr)
            }
        }
        deserializer.deserialize_str(V)
    }
}
