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
  N    exec, run, shell: the guest command's own exit code, when confirmed
  1    local failure (reading or writing a local file, the terminal)
  2    validation or unsupported capability: bad input, nothing was sent
  3    unknown or uncertain outcome: the request may have reached the worker
       and its effect is not known (it was not retried)
  4    authentication refused (401/403)
  5    not found
  6    the worker could not be reached (nothing was sent)
  7    protocol violation or output limit
  8    refused: admission exhausted, conflict, stale claim or version, store
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

/// Writes one error: a readable line, then its fields one by one.
fn print_error(out: &mut impl Write, e: &Error) -> io::Result<()> {
    writeln!(out, "smolbox: error: {e}")?;
    write!(
        out,
        "  category={} operation={} evidence={}",
        e.category().as_str(),
        e.operation().as_str(),
        e.evidence().as_str()
    )?;
    if !e.reason().is_empty() {
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
    let hint = match e.evidence() {
        Evidence::NotDispatched => "nothing was sent to the worker",
        Evidence::DispatchUncertain | Evidence::Unknown => {
            "the request may have reached the worker; its effect is unknown and it was not retried"
        }
        Evidence::RunningObserved => "the command was seen running; its end is unknown",
        Evidence::Exited => "the command exited",
        Evidence::TerminationConfirmed => "the guest stopped; no exit status is known",
    };
    writeln!(out, "  ({hint})")
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
