//! Failures, their exit codes, and what is printed about them.
//!
//! A failure prints its category, operation, evidence and reason (the
//! core error's fixed fields) to stderr. It never prints a token, a body,
//! command text, environment, stdin, file or terminal bytes: the core
//! error cannot hold them, and local failures print only the I/O error
//! kind and the path the user gave.

use std::io::{self, Write};

use smolbox_core::{Category, Error, Evidence};

/// The exit-code table (also in `smolbox --help` and the README).
pub(crate) const EXIT_TABLE: &str = "\
Exit codes:
  0    success
  N    exec, run, shell, wait: the guest command's own exit code, when
       confirmed
  1    local failure (reading or writing a local file, the terminal)
  2    validation or unsupported capability: bad input, nothing was sent
  3    unknown or uncertain outcome: the request may have reached the worker
       and its effect is not known (it was not retried)
  4    authentication refused (401/403)
  5    not found
  6    the worker could not be reached (nothing was sent)
  7    protocol violation or output limit
  8    refused: admission exhausted, conflict, stale claim or version, store;
       wait: the execution ended without running (cancelled, expired, failed)
  9    cleanup failed (e.g. `run` could not remove its machine)";

/// Local failure exit code.
pub(crate) const EXIT_LOCAL: i32 = 1;
/// Cleanup failure exit code.
pub(crate) const EXIT_CLEANUP: i32 = 9;

/// A failure of a command.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A worker or validation error from the library.
    Core(Error),
    /// A local I/O failure: what was being done and the error kind.
    Local {
        /// What the command was doing ("read LOCAL", …).
        doing: String,
        /// The I/O error kind (never its message, which may quote data).
        kind: io::ErrorKind,
    },
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Self::Core(e)
    }
}

impl Failure {
    /// A local failure while `doing`.
    pub(crate) fn local(doing: impl Into<String>, e: &io::Error) -> Self {
        Self::Local {
            doing: doing.into(),
            kind: e.kind(),
        }
    }

    /// The process exit code of this failure.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            Self::Core(e) => exit_code(e),
            Self::Local { .. } => EXIT_LOCAL,
        }
    }

    /// Prints the failure to stderr.
    pub(crate) fn print(&self) {
        let mut err = io::stderr().lock();
        let _ = match self {
            Self::Core(e) => print_error(&mut err, e),
            Self::Local { doing, kind } => {
                writeln!(err, "smolbox: error: could not {doing}: {kind}")
            }
        };
    }

    /// Prints the failure to stderr as one JSON object (for `--json`).
    pub(crate) fn print_json(&self) {
        let v = match self {
            Self::Core(e) => {
                let definite = definite_answer(e);
                serde_json::json!({ "error": {
                    "category": e.category().as_str(),
                    "operation": e.operation().as_str(),
                    "evidence": e.evidence().as_str(),
                    "reason": e.reason().as_str(),
                    "status": e.status(),
                    "limit": e.limit().map(|l| serde_json::json!({"actual": l.actual, "max": l.max})),
                    "guest_exit_code": e.exit_code(),
                    "worker_answered": definite.is_some(),
                    "effect_uncertain": definite.is_none() && effect_uncertain(e.evidence()),
                    "outcome": outcome(e),
                    "exit_code": exit_code(e),
                }})
            }
            Self::Local { doing, kind } => serde_json::json!({ "error": {
                "category": "local",
                "doing": doing,
                "io_error": kind.to_string(),
                "exit_code": EXIT_LOCAL,
            }}),
        };
        let mut err = io::stderr().lock();
        let _ = writeln!(err, "{v}");
    }
}

/// The exit code of a library error (see [`EXIT_TABLE`]).
pub(crate) fn exit_code(e: &Error) -> i32 {
    match e.category() {
        Category::Validation
        | Category::UnsupportedCapability
        | Category::UnsupportedNetworkPolicy => 2,
        Category::Unknown => 3,
        Category::Transport | Category::Expired => {
            if e.evidence() == Evidence::NotDispatched {
                6
            } else {
                3
            }
        }
        Category::Authentication => 4,
        Category::NotFound => 5,
        Category::Protocol | Category::OutputLimit => 7,
        Category::AdmissionExhausted
        | Category::IdentityConflict
        | Category::PortConflict
        | Category::Store
        | Category::StaleClaim
        | Category::StaleVersion => 8,
        Category::Cleanup => EXIT_CLEANUP,
    }
}

/// The status of a definite refusal by the worker: a 4xx reply other than
/// 408 (the worker's request timeout, after which the work may still run).
/// Such a request reached the worker, which answered that it did not carry
/// it out (absent machine, conflict, invalid input, refused credentials):
/// nothing about its effect is uncertain.
pub(crate) fn definite_answer(e: &Error) -> Option<u16> {
    e.status().filter(|s| (400..500).contains(s) && *s != 408)
}

/// What a 4xx answer means, in words.
fn status_words(status: u16) -> &'static str {
    match status {
        400 => "bad request: the worker found the request invalid",
        401 => "unauthorized: the worker refused the credentials",
        403 => "forbidden: the worker refused the request",
        404 => "not found: no such machine or resource on the worker",
        405 => "method not allowed",
        409 => "conflict: the worker refused it against the machine's current state or name",
        413 => "payload too large: the worker refused the body",
        415 => "unsupported media type",
        422 => "unprocessable: the worker could not read the request body",
        429 => "too many requests: the worker refused it for now",
        _ => "refused by the worker",
    }
}

/// Whether the effect of a request that reached the worker is unknown: not
/// when nothing was sent, and not when the command's exit or the guest's
/// stop was observed.
const fn effect_uncertain(evidence: Evidence) -> bool {
    matches!(
        evidence,
        Evidence::DispatchUncertain | Evidence::RunningObserved | Evidence::Unknown
    )
}

/// One sentence on what is known of the request's effect.
fn outcome(e: &Error) -> String {
    if let Some(status) = definite_answer(e) {
        return format!("the worker answered {status}: the request was refused, not carried out");
    }
    match e.evidence() {
        Evidence::NotDispatched => "nothing was sent to the worker".to_owned(),
        Evidence::DispatchUncertain | Evidence::Unknown => {
            "the request may have reached the worker; its effect is unknown and it was not retried"
                .to_owned()
        }
        Evidence::RunningObserved => "the command was seen running; its end is unknown".to_owned(),
        Evidence::Exited => "the command exited".to_owned(),
        Evidence::TerminationConfirmed => "the guest stopped; no exit status is known".to_owned(),
    }
}

/// Writes one error: a readable line, then its fields one by one.
fn print_error(out: &mut impl Write, e: &Error) -> io::Result<()> {
    match definite_answer(e) {
        Some(status) => writeln!(
            out,
            "smolbox: error: {} failed: the worker answered {status} {}",
            e.operation().as_str(),
            status_words(status)
        )?,
        None => writeln!(out, "smolbox: error: {e}")?,
    }
    write!(
        out,
        "  category={} operation={} evidence={}",
        e.category().as_str(),
        e.operation().as_str(),
        e.evidence().as_str()
    )?;
    if e.reason() != smolbox_core::Reason::Unspecified {
        write!(out, " reason={}", e.reason())?;
    }
    if let Some(status) = e.status() {
        write!(out, " status={status}")?;
    }
    if let Some(limit) = e.limit() {
        write!(out, " limit={}/{}", limit.actual, limit.max)?;
    }
    if let Some(code) = e.exit_code() {
        write!(out, " exit_code={code}")?;
    }
    writeln!(out)?;
    writeln!(out, "  ({})", outcome(e))
}

/// Prints a note to stderr.
pub(crate) fn note(text: &str) {
    let _ = writeln!(io::stderr().lock(), "smolbox: {text}");
}

/// Writes `bytes` to stdout and flushes; a closed pipe is not an error.
pub(crate) fn out(bytes: &[u8]) -> Result<(), Failure> {
    let mut o = io::stdout().lock();
    match o.write_all(bytes).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::local("write to stdout", &e)),
    }
}

/// Writes `bytes` to stderr and flushes.
pub(crate) fn err(bytes: &[u8]) {
    let mut o = io::stderr().lock();
    let _ = o.write_all(bytes).and_then(|()| o.flush());
}

/// Writes one line to stdout.
pub(crate) fn line(text: &str) -> Result<(), Failure> {
    let mut s = String::with_capacity(text.len() + 1);
    s.push_str(text);
    s.push('\n');
    out(s.as_bytes())
}
