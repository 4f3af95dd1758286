//! [`Term`]: an open interactive terminal of either shell, as the `shell`
//! command drives it.

use std::time::Duration;

use smolbox_core::Error;
use smolbox_core::terminal::{TerminalEvent, TerminalExit};

/// An open interactive terminal of either shell.
pub(crate) trait Term {
    /// Sends input bytes to the PTY.
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error>;
    /// Forwards a window size.
    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error>;
    /// Waits up to `timeout` for output or the end.
    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error>;
    /// Closes the session and returns its outcome.
    fn close(self: Box<Self>) -> Result<TerminalExit, Error>;
}
