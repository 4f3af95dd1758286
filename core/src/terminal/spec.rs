//! The terminal spec (features C7.1) and the upgrade target (C7.2).

use crate::Reason;
use core::fmt;
use core::time::Duration;

use crate::error::{Error, Operation};
use crate::http1::encode;

/// Default program.
pub const DEFAULT_PROGRAM: &str = "/bin/sh";
/// Longest program, in bytes.
pub const MAX_PROGRAM_BYTES: usize = 4_096;
/// Default terminal width.
pub const DEFAULT_COLS: u16 = 80;
/// Default terminal height.
pub const DEFAULT_ROWS: u16 = 24;
/// Default session budget.
pub const DEFAULT_SESSION_BUDGET: Duration = Duration::from_millis(30_000);
/// Shortest session budget.
pub const MIN_SESSION_BUDGET: Duration = Duration::from_millis(1_000);
/// Longest session budget (24 h).
pub const MAX_SESSION_BUDGET: Duration = Duration::from_millis(86_400_000);
/// Default idle budget.
pub const DEFAULT_IDLE_BUDGET: Duration = Duration::from_millis(30_000);
/// Shortest idle budget (the longest is the session budget).
pub const MIN_IDLE_BUDGET: Duration = Duration::from_millis(1_000);
/// Default close wait.
pub const DEFAULT_CLOSE_WAIT: Duration = Duration::from_millis(1_000);
/// Shortest close wait.
pub const MIN_CLOSE_WAIT: Duration = Duration::from_millis(1);
/// Longest close wait.
pub const MAX_CLOSE_WAIT: Duration = Duration::from_millis(5_000);
/// Default attach wait.
pub const DEFAULT_ATTACH_WAIT: Duration = Duration::from_millis(5_000);
/// Shortest attach wait.
pub const MIN_ATTACH_WAIT: Duration = Duration::from_millis(100);
/// Longest attach wait.
pub const MAX_ATTACH_WAIT: Duration = Duration::from_millis(30_000);
/// Default unread-output buffer (256 KiB).
pub const DEFAULT_MAX_BUFFER_BYTES: usize = 262_144;
/// Smallest unread-output buffer.
pub const MIN_BUFFER_BYTES: usize = 1_024;
/// Largest unread-output buffer (1 MiB).
pub const MAX_BUFFER_BYTES: usize = 1_048_576;
/// Default bytes per input call.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 16_384;
/// Largest bytes-per-input setting.
pub const MAX_INPUT_BYTES: usize = 65_536;
/// Longest machine name (features C0.1).
pub const MAX_MACHINE_NAME_BYTES: usize = 31;

/// What to run in an interactive terminal and its bounds (features C7.1).
/// There is no argv, env, workdir, user, stdin or timeout: the worker runs
/// `program` alone under a PTY.
#[derive(Clone, PartialEq, Eq)]
pub struct TerminalSpec {
    /// The program path (1–4,096 bytes of UTF-8, no NUL).
    pub program: String,
    /// Columns, 1–65,535.
    pub cols: u16,
    /// Rows, 1–65,535.
    pub rows: u16,
    /// Whole-session budget, 1,000–86,400,000 ms.
    pub session_budget: Duration,
    /// Longest time without activity, 1,000 ms–`session_budget`.
    pub idle_budget: Duration,
    /// Wait for the peer's close after ours, 1–5,000 ms.
    pub close_wait: Duration,
    /// Time for a consumer to attach, 100–30,000 ms.
    pub attach_wait: Duration,
    /// Unread output held for the consumer, 1,024–1,048,576 bytes (also
    /// the cap on one assembled WebSocket message).
    pub max_buffer_bytes: usize,
    /// Largest single input, 1–65,536 bytes.
    pub max_input_bytes: usize,
}

impl Default for TerminalSpec {
    fn default() -> Self {
        Self {
            program: DEFAULT_PROGRAM.to_owned(),
            cols: DEFAULT_COLS,
            rows: DEFAULT_ROWS,
            session_budget: DEFAULT_SESSION_BUDGET,
            idle_budget: DEFAULT_IDLE_BUDGET,
            close_wait: DEFAULT_CLOSE_WAIT,
            attach_wait: DEFAULT_ATTACH_WAIT,
            max_buffer_bytes: DEFAULT_MAX_BUFFER_BYTES,
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
        }
    }
}

impl TerminalSpec {
    /// The defaults with `program`.
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            ..Self::default()
        }
    }

    /// Checks every bound of features C7.1.
    ///
    /// # Errors
    /// `validation` (operation `terminal_spec`, evidence `not_dispatched`)
    /// naming the first field out of range.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |reason| Error::validation(Operation::TerminalSpec, reason);
        let p = self.program.len();
        if p == 0 || p > MAX_PROGRAM_BYTES {
            return Err(bad(Reason::ProgramLength).with_limit(p as u64, MAX_PROGRAM_BYTES as u64));
        }
        if self.program.contains('\0') {
            return Err(bad(Reason::ProgramNul));
        }
        if self.cols == 0 {
            return Err(bad(Reason::ColsOutOfRange));
        }
        if self.rows == 0 {
            return Err(bad(Reason::RowsOutOfRange));
        }
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let range = |d: Duration, min: Duration, max: Duration, reason| {
            if d < min || d > max {
                Err(bad(reason).with_limit(ms(d), ms(max)))
            } else {
                Ok(())
            }
        };
        range(
            self.session_budget,
            MIN_SESSION_BUDGET,
            MAX_SESSION_BUDGET,
            Reason::SessionBudgetOutOfRange,
        )?;
        range(
            self.idle_budget,
            MIN_IDLE_BUDGET,
            self.session_budget,
            Reason::IdleBudgetOutOfRange,
        )?;
        range(
            self.close_wait,
            MIN_CLOSE_WAIT,
            MAX_CLOSE_WAIT,
            Reason::CloseWaitOutOfRange,
        )?;
        range(
            self.attach_wait,
            MIN_ATTACH_WAIT,
            MAX_ATTACH_WAIT,
            Reason::AttachWaitOutOfRange,
        )?;
        let b = self.max_buffer_bytes;
        if !(MIN_BUFFER_BYTES..=MAX_BUFFER_BYTES).contains(&b) {
            return Err(bad(Reason::BufferOutOfRange).with_limit(b as u64, MAX_BUFFER_BYTES as u64));
        }
        let i = self.max_input_bytes;
        if !(1..=MAX_INPUT_BYTES).contains(&i) {
            return Err(
                bad(Reason::InputLimitOutOfRange).with_limit(i as u64, MAX_INPUT_BYTES as u64)
            );
        }
        Ok(())
    }

    /// The upgrade request target
    /// `/api/v1/machines/<name>/exec/interactive?cmd=…&cols=…&rows=…`, the
    /// name percent-encoded as one path segment and the query form-encoded
    /// (worker-api.md §8.5).
    ///
    /// # Errors
    /// `validation` for an invalid spec or machine name (≤ 31 bytes,
    /// `^[a-z0-9][a-z0-9_-]*$`).
    pub fn upgrade_target(&self, machine: &str) -> Result<String, Error> {
        self.validate()?;
        validate_machine_name(machine)?;
        let mut t = String::with_capacity(64 + self.program.len() * 3);
        t.push_str("/api/v1/machines/");
        encode::push_path_segment(&mut t, machine);
        t.push_str("/exec/interactive?cmd=");
        encode::push_query_component(&mut t, &self.program);
        t.push_str("&cols=");
        t.push_str(&self.cols.to_string());
        t.push_str("&rows=");
        t.push_str(&self.rows.to_string());
        Ok(t)
    }
}

/// Checks a machine name with the one rule of every API
/// ([`MachineName::new`](crate::worker::MachineName::new)).
///
/// # Errors
/// `validation` (operation `terminal_spec`, reason `invalid_machine_name`).
pub fn validate_machine_name(name: &str) -> Result<(), Error> {
    crate::worker::MachineName::new(name)
        .map(|_| ())
        .map_err(|e| e.with_operation(Operation::TerminalSpec))
}

impl fmt::Debug for TerminalSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The program is command text: its length only.
        f.debug_struct("TerminalSpec")
            .field("program_len", &self.program.len())
            .field("cols", &self.cols)
            .field("rows", &self.rows)
            .field("session_budget", &self.session_budget)
            .field("idle_budget", &self.idle_budget)
            .field("close_wait", &self.close_wait)
            .field("attach_wait", &self.attach_wait)
            .field("max_buffer_bytes", &self.max_buffer_bytes)
            .field("max_input_bytes", &self.max_input_bytes)
            .finish()
    }
}
