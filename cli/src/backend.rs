//! One worker client, either shell: every command is written once against
//! [`Backend`], which forwards each operation to `smolbox-tokio` (on a small
//! runtime of its own) or to `smolbox-blocking`. Both take the same inputs
//! and return the same core types, so the two shells behave the same.

use smolbox_core::Reason;
use std::sync::Arc;
use std::time::Duration;

use smolbox_core::Error;
use smolbox_core::exec::{Command, ExecOutcome};
use smolbox_core::terminal::{TerminalEvent, TerminalExit, TerminalSpec};
use smolbox_core::worker::{
    Budgets, Endpoint, HealthReply, MachineName, MachineSpec, Observation, Profile, WorkerCall,
};
use tokio::runtime::Runtime;

use crate::term::Term;

/// Which shell drives the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ShellKind {
    /// `smolbox-tokio` (async, on a one-thread runtime owned by the command).
    Tokio,
    /// `smolbox-blocking` (mio, on the caller's thread).
    Blocking,
}

/// One piece of streamed exec output.
pub(crate) enum StreamPiece<'a> {
    /// Standard output text.
    Stdout(&'a str),
    /// Standard error text.
    Stderr(&'a str),
}

/// The worker client of the chosen shell.
pub(crate) enum Backend {
    /// The async client and the runtime that drives it.
    Tokio {
        /// A multi-thread runtime with one worker, so background tasks of
        /// the client (a terminal's driver) progress between calls.
        rt: Arc<Runtime>,
        /// The client.
        client: smolbox_tokio::Client,
    },
    /// The blocking client.
    Blocking(smolbox_blocking::Client),
}

impl Backend {
    /// A client for `endpoint` on `kind`.
    pub(crate) fn new(kind: ShellKind, endpoint: Endpoint) -> Result<Self, crate::report::Failure> {
        Ok(match kind {
            ShellKind::Tokio => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("smolbox-cli")
                    .enable_all()
                    .build()
                    .map_err(|e| crate::report::Failure::local("start the tokio runtime", &e))?;
                Self::Tokio {
                    rt: Arc::new(rt),
                    client: smolbox_tokio::Client::new(endpoint)?,
                }
            }
            ShellKind::Blocking => Self::Blocking(smolbox_blocking::Client::new(endpoint)?),
        })
    }

    /// The shell this backend runs on.
    pub(crate) fn kind(&self) -> ShellKind {
        match self {
            Self::Tokio { .. } => ShellKind::Tokio,
            Self::Blocking(_) => ShellKind::Blocking,
        }
    }

    /// The endpoint.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        match self {
            Self::Tokio { client, .. } => client.endpoint(),
            Self::Blocking(client) => client.endpoint(),
        }
    }

    /// The endpoint's budgets.
    pub(crate) fn endpoint_budgets(&self) -> &Budgets {
        match self {
            Self::Tokio { client, .. } => client.endpoint().budgets(),
            Self::Blocking(client) => client.endpoint().budgets(),
        }
    }

    /// Any core worker operation.
    pub(crate) fn call<C: WorkerCall + Sync>(&self, call: &C) -> Result<C::Output, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.call(call)),
            Self::Blocking(client) => client.call(call),
        }
    }

    /// `GET /health`.
    pub(crate) fn health(&self) -> Result<HealthReply, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.health()),
            Self::Blocking(client) => client.health(),
        }
    }

    /// The profile of the worker's reported version.
    pub(crate) fn admit(&self) -> Result<Profile, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.admit(&[])),
            Self::Blocking(client) => client.admit(&[]),
        }
    }

    /// Creates a machine.
    pub(crate) fn create(
        &self,
        profile: &Profile,
        name: MachineName,
        spec: &MachineSpec,
    ) -> Result<Observation, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.create(profile, name, spec)),
            Self::Blocking(client) => client.create(profile, name, spec),
        }
    }

    /// Lists machines.
    pub(crate) fn list(&self, profile: &Profile) -> Result<Vec<Observation>, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.list(profile)),
            Self::Blocking(client) => client.list(profile),
        }
    }

    /// Reads one machine.
    pub(crate) fn get(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.get(profile, name)),
            Self::Blocking(client) => client.get(profile, name),
        }
    }

    /// Starts a machine.
    pub(crate) fn start(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.start(profile, name)),
            Self::Blocking(client) => client.start(profile, name),
        }
    }

    /// Stops a machine.
    pub(crate) fn stop(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.stop(profile, name)),
            Self::Blocking(client) => client.stop(profile, name),
        }
    }

    /// Deletes a machine.
    pub(crate) fn delete(&self, name: MachineName) -> Result<(), Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.delete(name)),
            Self::Blocking(client) => client.delete(name),
        }
    }

    /// Buffered exec.
    pub(crate) fn exec(&self, machine: &str, command: &Command) -> Result<ExecOutcome, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.exec(machine, command)),
            Self::Blocking(client) => client.exec(machine, command),
        }
    }

    /// Streamed exec: hands each piece of output to `on_output` as it
    /// arrives and returns the exit code.
    pub(crate) fn exec_stream(
        &self,
        machine: &str,
        command: &Command,
        on_output: &mut dyn FnMut(StreamPiece<'_>),
    ) -> Result<i32, Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(async {
                let mut stream = client.exec_stream(machine, command).await?;
                while let Some(event) = stream.next().await {
                    match event? {
                        smolbox_tokio::ExecEvent::Stdout(s) => on_output(StreamPiece::Stdout(&s)),
                        smolbox_tokio::ExecEvent::Stderr(s) => on_output(StreamPiece::Stderr(&s)),
                        smolbox_tokio::ExecEvent::Exit(code) => return Ok(code),
                        // A kind of event this build does not show.
                        _ => {}
                    }
                }
                Err(Error::unknown(
                    smolbox_core::Operation::ExecStream,
                    smolbox_core::Evidence::DispatchUncertain,
                    Reason::StreamEndedWithoutExit,
                ))
            }),
            Self::Blocking(client) => {
                for event in client.exec_stream(machine, command)? {
                    match event? {
                        smolbox_blocking::ExecEvent::Stdout(s) => {
                            on_output(StreamPiece::Stdout(&s));
                        }
                        smolbox_blocking::ExecEvent::Stderr(s) => {
                            on_output(StreamPiece::Stderr(&s));
                        }
                        smolbox_blocking::ExecEvent::Exit(code) => return Ok(code),
                        // A kind of event this build does not show.
                        _ => {}
                    }
                }
                Err(Error::unknown(
                    smolbox_core::Operation::ExecStream,
                    smolbox_core::Evidence::DispatchUncertain,
                    Reason::StreamEndedWithoutExit,
                ))
            }
        }
    }

    /// An upload, with the body bytes the socket took so far reported to
    /// `progress` each time that count moves.
    pub(crate) fn upload_with_progress(
        &self,
        upload: &smolbox_core::worker::Upload,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<smolbox_core::worker::UploadReply, Error> {
        match self {
            Self::Tokio { rt, client } => {
                rt.block_on(client.upload_with_progress(upload, progress))
            }
            Self::Blocking(client) => client.upload_with_progress(upload, progress),
        }
    }

    /// A download, with the body bytes received so far reported to
    /// `progress` after each read.
    pub(crate) fn download_with_progress(
        &self,
        download: &smolbox_core::worker::Download,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<bytes::Bytes, Error> {
        match self {
            Self::Tokio { rt, client } => {
                rt.block_on(client.download_with_progress(download, progress))
            }
            Self::Blocking(client) => client.download_with_progress(download, progress),
        }
    }

    /// A followed console-log read: each line to `on_line` (which returns
    /// `false` to stop), until the body ends or an error.
    pub(crate) fn logs_follow(
        &self,
        logs: &smolbox_core::worker::Logs,
        on_line: &mut (dyn FnMut(String) -> bool + Send),
    ) -> Result<(), Error> {
        match self {
            Self::Tokio { rt, client } => rt.block_on(client.logs_follow(logs, on_line)),
            Self::Blocking(client) => client.logs_follow(logs, on_line),
        }
    }

    /// Opens an interactive terminal.
    pub(crate) fn terminal(
        &self,
        machine: &str,
        spec: &TerminalSpec,
    ) -> Result<Box<dyn Term>, Error> {
        match self {
            Self::Tokio { rt, client } => {
                crate::backend_tokio_term::open(rt, client, machine, spec)
            }
            Self::Blocking(client) => Ok(Box::new(client.terminal(machine, spec)?)),
        }
    }
}

impl Term for smolbox_blocking::Terminal {
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        Self::input(self, bytes)
    }

    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        Self::resize(self, cols, rows)
    }

    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        Self::next(self, timeout)
    }

    fn close(self: Box<Self>) -> Result<TerminalExit, Error> {
        Self::close(*self)
    }
}

impl Term for smolbox_blocking::ManagedTerminal {
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        Self::input(self, bytes)
    }

    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        Self::resize(self, cols, rows)
    }

    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        Self::next(self, timeout)
    }

    fn close(self: Box<Self>) -> Result<TerminalExit, Error> {
        Self::close(*self)
    }
}
