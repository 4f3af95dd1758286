//! The blocking shell as a [`Shell`]: `smolbox_blocking::Client` already is
//! the synchronous API, so every call is a direct call (no runtime).

use std::time::Duration;

use smolbox_blocking::{Client, ExecEvent, ExecStream, Terminal, TerminalEvent};
use smolbox_core::Error;
use smolbox_core::exec::{Command, ExecOutcome, ExecOutput, OutputAllowance};
use smolbox_core::terminal::{TerminalExit, TerminalSpec};
use smolbox_core::worker::{
    CapacityReply, Endpoint, HealthReply, MachineName, MachineSpec, Observation, Profile,
};

use crate::shell::{Shell, StreamHandle, TerminalHandle};

/// `smolbox_blocking::Client` as a [`Shell`].
#[derive(Debug)]
pub struct BlockingShell {
    client: Client,
}

/// `smolbox_blocking::ExecStream` (already an iterator).
#[derive(Debug)]
pub struct BlockingStream {
    stream: ExecStream,
}

/// `smolbox_blocking::Terminal`.
#[derive(Debug)]
pub struct BlockingTerminal {
    terminal: Terminal,
}

impl Iterator for BlockingStream {
    type Item = Result<ExecEvent, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.stream.next()?;
        Some(item)
    }
}

impl StreamHandle for BlockingStream {
    fn detach(self) -> Option<Error> {
        self.stream.detach()
    }
}

impl TerminalHandle for BlockingTerminal {
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.terminal.input(bytes)
    }

    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.terminal.resize(cols, rows)
    }

    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        self.terminal.next(timeout)
    }

    fn close(self) -> Result<TerminalExit, Error> {
        self.terminal.close()
    }
}

impl Shell for BlockingShell {
    type Stream = BlockingStream;
    type Terminal = BlockingTerminal;

    fn connect(endpoint: Endpoint) -> Result<Self, Error> {
        Ok(Self {
            client: Client::new(endpoint)?,
        })
    }

    fn health(&self) -> Result<HealthReply, Error> {
        self.client.health()
    }

    fn admit(&self) -> Result<Profile, Error> {
        self.client.admit(&[])
    }

    fn readyz(&self) -> Result<(), Error> {
        self.client.readyz()
    }

    fn capacity(&self) -> Result<CapacityReply, Error> {
        self.client.capacity()
    }

    fn metrics(&self) -> Result<String, Error> {
        self.client.metrics()
    }

    fn create(
        &self,
        profile: &Profile,
        name: MachineName,
        spec: &MachineSpec,
    ) -> Result<Observation, Error> {
        self.client.create(profile, name, spec)
    }

    fn list(&self, profile: &Profile) -> Result<Vec<Observation>, Error> {
        self.client.list(profile)
    }

    fn get(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.client.get(profile, name)
    }

    fn start(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.client.start(profile, name)
    }

    fn stop(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.client.stop(profile, name)
    }

    fn delete(&self, name: MachineName) -> Result<(), Error> {
        self.client.delete(name)
    }

    fn exec(
        &self,
        machine: &str,
        command: &Command,
        allowance: OutputAllowance,
    ) -> Result<ExecOutcome, Error> {
        self.client.exec_with_allowance(machine, command, allowance)
    }

    fn exec_stream(
        &self,
        machine: &str,
        command: &Command,
        allowance: OutputAllowance,
    ) -> Result<BlockingStream, Error> {
        let stream = self
            .client
            .exec_stream_with_allowance(machine, command, allowance)?;
        Ok(BlockingStream { stream })
    }

    fn exec_with(
        &self,
        machine: &str,
        command: &Command,
        mut callback: Box<dyn FnMut(&ExecEvent) + Send>,
    ) -> Result<ExecOutput, Error> {
        self.client
            .exec_with(machine, command, move |e| callback(e))
    }

    fn launch(
        &self,
        machine: &str,
        command: &Command,
    ) -> Result<smolbox_core::exec::Launched, Error> {
        self.client.launch(machine, command)
    }

    fn upload(
        &self,
        upload: &smolbox_core::worker::Upload,
    ) -> Result<smolbox_core::worker::UploadReply, Error> {
        self.client.upload(upload)
    }

    fn upload_with_progress(
        &self,
        upload: &smolbox_core::worker::Upload,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<smolbox_core::worker::UploadReply, Error> {
        self.client.upload_with_progress(upload, progress)
    }

    fn download(&self, download: &smolbox_core::worker::Download) -> Result<Vec<u8>, Error> {
        self.client.download(download).map(|b| b.to_vec())
    }

    fn logs(&self, logs: &smolbox_core::worker::Logs) -> Result<Vec<String>, Error> {
        self.client.logs(logs)
    }

    fn terminal(&self, machine: &str, spec: &TerminalSpec) -> Result<BlockingTerminal, Error> {
        Ok(BlockingTerminal {
            terminal: self.client.terminal(machine, spec)?,
        })
    }
}
