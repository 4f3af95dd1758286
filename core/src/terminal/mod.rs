//! The worker's interactive terminal session (features C7), sans-IO.
//!
//! [`TerminalSpec`] holds what to run and the bounds of C7.1 and builds the
//! upgrade target; [`TerminalSession`] drives one terminal WebSocket
//! (worker-api.md §8): input as binary frames, resize as a JSON text frame,
//! output into a bounded unread queue the consumer pulls with
//! [`TerminalSession::next`], the exit text frame, and the session, idle,
//! attach and close-wait budgets.
//!
//! Terminal bytes never appear in `Debug` output or errors: queued output
//! and input are reported as lengths only.

mod exit;
#[cfg(feature = "testkit")]
mod fuzz;
mod queue;
mod session;
mod spec;

pub use exit::{MAX_EXIT_FRAME_BYTES, TerminalExit};
#[cfg(feature = "testkit")]
pub use fuzz::fuzz_terminal;
pub use queue::MAX_UNREAD_CHUNKS;
pub use session::{
    DEFAULT_MAX_REQUEST_BYTES, MAX_HANDSHAKE_TIMEOUT, MAX_NEXT_WAIT, MAX_WRITE_WAIT, Next,
    READ_GRACE, TerminalCall, TerminalConfig, TerminalEvent, TerminalSession, TerminalTimer,
};
pub use spec::{
    DEFAULT_ATTACH_WAIT, DEFAULT_CLOSE_WAIT, DEFAULT_COLS, DEFAULT_IDLE_BUDGET,
    DEFAULT_MAX_BUFFER_BYTES, DEFAULT_MAX_INPUT_BYTES, DEFAULT_PROGRAM, DEFAULT_ROWS,
    DEFAULT_SESSION_BUDGET, MAX_ATTACH_WAIT, MAX_BUFFER_BYTES, MAX_CLOSE_WAIT, MAX_INPUT_BYTES,
    MAX_MACHINE_NAME_BYTES, MAX_PROGRAM_BYTES, MAX_SESSION_BUDGET, MIN_ATTACH_WAIT,
    MIN_BUFFER_BYTES, MIN_CLOSE_WAIT, MIN_IDLE_BUDGET, MIN_SESSION_BUDGET, TerminalSpec,
    validate_machine_name,
};
