//! The client API as the suite sees it: synchronous, one method per
//! operation, the same names as `smolbox_tokio::Client` and
//! `smolbox_blocking::Client`.

use std::time::Duration;

use smolbox_core::Error;
use smolbox_core::exec::{Command, ExecOutcome, ExecOutput};
use smolbox_core::worker::{
    CapacityReply, Endpoint, HealthReply, MachineName, MachineSpec, Observation, Profile,
};

pub use smolbox_core::exec::ExecEvent;
pub use smolbox_core::terminal::TerminalEvent;

/// A streamed exec being read.
pub trait StreamHandle: Iterator<Item = Result<ExecEvent, Error>> {
    /// Stops observing (see `ExecStream::detach`).
    fn detach(self) -> Option<Error>;
}

/// An open terminal.
pub trait TerminalHandle {
    /// Sends input bytes.
    ///
    /// # Errors
    /// The shell's errors.
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error>;
    /// Sends a window size.
    ///
    /// # Errors
    /// The shell's errors.
    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error>;
    /// Waits up to `timeout` for output or the end.
    ///
    /// # Errors
    /// The shell's errors (a timeout is `expired`).
    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error>;
    /// Closes and returns the outcome.
    ///
    /// # Errors
    /// An uncertain outcome.
    fn close(self) -> Result<smolbox_core::terminal::TerminalExit, Error>;
}

/// A client shell under test.
pub trait Shell: Sized {
    /// A streamed exec.
    type Stream: StreamHandle;
    /// An open terminal.
    type Terminal: TerminalHandle;

    /// `Client::new`.
    ///
    /// # Errors
    /// The client's configuration errors.
    fn connect(endpoint: Endpoint) -> Result<Self, Error>;
    /// `Client::health`.
    ///
    /// # Errors
    /// The operation's errors.
    fn health(&self) -> Result<HealthReply, Error>;
    /// `Client::admit(&[])`.
    ///
    /// # Errors
    /// The operation's errors.
    fn admit(&self) -> Result<Profile, Error>;
    /// `Client::readyz`.
    ///
    /// # Errors
    /// The operation's errors.
    fn readyz(&self) -> Result<(), Error>;
    /// `Client::capacity`.
    ///
    /// # Errors
    /// The operation's errors.
    fn capacity(&self) -> Result<CapacityReply, Error>;
    /// `Client::metrics`.
    ///
    /// # Errors
    /// The operation's errors.
    fn metrics(&self) -> Result<String, Error>;
    /// `Client::create`.
    ///
    /// # Errors
    /// The operation's errors.
    fn create(
        &self,
        profile: &Profile,
        name: MachineName,
        spec: &MachineSpec,
    ) -> Result<Observation, Error>;
    /// `Client::list`.
    ///
    /// # Errors
    /// The operation's errors.
    fn list(&self, profile: &Profile) -> Result<Vec<Observation>, Error>;
    /// `Client::get`.
    ///
    /// # Errors
    /// The operation's errors.
    fn get(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error>;
    /// `Client::start`.
    ///
    /// # Errors
    /// The operation's errors.
    fn start(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error>;
    /// `Client::stop`.
    ///
    /// # Errors
    /// The operation's errors.
    fn stop(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error>;
    /// `Client::delete`.
    ///
    /// # Errors
    /// The operation's errors.
    fn delete(&self, name: MachineName) -> Result<(), Error>;
    /// `Client::exec_with_allowance`.
    ///
    /// # Errors
    /// The operation's errors.
    fn exec(
        &self,
        machine: &str,
        command: &Command,
        allowance: smolbox_core::exec::OutputAllowance,
    ) -> Result<ExecOutcome, Error>;
    /// `Client::exec_stream_with_allowance`.
    ///
    /// # Errors
    /// The operation's errors.
    fn exec_stream(
        &self,
        machine: &str,
        command: &Command,
        allowance: smolbox_core::exec::OutputAllowance,
    ) -> Result<Self::Stream, Error>;
    /// `Client::exec_with`.
    ///
    /// # Errors
    /// The operation's errors.
    fn exec_with(
        &self,
        machine: &str,
        command: &Command,
        callback: Box<dyn FnMut(&ExecEvent) + Send>,
    ) -> Result<ExecOutput, Error>;
    /// `Client::launch`.
    ///
    /// # Errors
    /// The operation's errors.
    fn launch(
        &self,
        machine: &str,
        command: &Command,
    ) -> Result<smolbox_core::exec::Launched, Error>;
    /// `Client::upload`.
    ///
    /// # Errors
    /// The operation's errors.
    fn upload(
        &self,
        upload: &smolbox_core::worker::Upload,
    ) -> Result<smolbox_core::worker::UploadReply, Error>;
    /// `Client::upload_with_progress`.
    ///
    /// # Errors
    /// The operation's errors.
    fn upload_with_progress(
        &self,
        upload: &smolbox_core::worker::Upload,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<smolbox_core::worker::UploadReply, Error>;
    /// `Client::download`.
    ///
    /// # Errors
    /// The operation's errors.
    fn download(&self, download: &smolbox_core::worker::Download) -> Result<Vec<u8>, Error>;
    /// `Client::logs`.
    ///
    /// # Errors
    /// The operation's errors.
    fn logs(&self, logs: &smolbox_core::worker::Logs) -> Result<Vec<String>, Error>;
    /// `Client::terminal`.
    ///
    /// # Errors
    /// The operation's errors.
    fn terminal(
        &self,
        machine: &str,
        spec: &smolbox_core::terminal::TerminalSpec,
    ) -> Result<Self::Terminal, Error>;
}
