//! The tokio shell as a [`Shell`]: every call runs on a runtime owned by
//! the wrapper (`block_on`).

use smolbox_core::Reason;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use smolbox_core::Error;
use smolbox_core::exec::{Command, ExecOutcome, ExecOutput, OutputAllowance};
use smolbox_core::terminal::{TerminalExit, TerminalSpec};
use smolbox_core::worker::{
    CapacityReply, Endpoint, HealthReply, MachineName, MachineSpec, Observation, Profile,
};
use smolbox_tokio::{Client, ExecEvent, ExecStream, Terminal, TerminalEvent};
use tokio::runtime::Runtime;

use crate::shell::{Shell, StreamHandle, TerminalHandle};

/// `smolbox_tokio::Client` behind a synchronous face.
#[derive(Debug)]
pub struct TokioShell {
    rt: Arc<Runtime>,
    client: Client,
}

/// `smolbox_tokio::ExecStream` as an iterator.
#[derive(Debug)]
pub struct TokioStream {
    rt: Arc<Runtime>,
    stream: ExecStream,
}

/// `smolbox_tokio::Terminal` with blocking calls.
#[derive(Debug)]
pub struct TokioTerminal {
    rt: Arc<Runtime>,
    terminal: Terminal,
}

impl Iterator for TokioStream {
    type Item = Result<ExecEvent, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        // Exercise the `Stream` impl (the inherent `next` shares its code).
        let item = self.rt.block_on(StreamExt::next(&mut self.stream))?;
        Some(item)
    }
}

impl StreamHandle for TokioStream {
    fn detach(self) -> Option<Error> {
        let _guard = self.rt.enter();
        self.stream.detach()
    }
}

impl TerminalHandle for TokioTerminal {
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.rt.block_on(self.terminal.input(bytes))
    }

    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.rt.block_on(self.terminal.resize(cols, rows))
    }

    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        self.rt.block_on(self.terminal.next(timeout))
    }

    fn close(self) -> Result<TerminalExit, Error> {
        let Self { rt, terminal } = self;
        rt.block_on(terminal.close())
    }
}

/// A multi-threaded tokio runtime of `threads` workers for a synchronous
/// face over a tokio shell; failing to start one is `validation` /
/// `thread_spawn`.
///
/// # Errors
/// `validation` when the runtime's threads cannot be started.
pub fn runtime(threads: usize) -> Result<Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|_| Error::validation(smolbox_core::Operation::Config, Reason::ThreadSpawn))
}

impl Shell for TokioShell {
    type Stream = TokioStream;
    type Terminal = TokioTerminal;

    fn connect(endpoint: Endpoint) -> Result<Self, Error> {
        let rt = runtime(1)?;
        let client = Client::new(endpoint)?;
        Ok(Self {
            rt: Arc::new(rt),
            client,
        })
    }

    fn health(&self) -> Result<HealthReply, Error> {
        self.rt.block_on(self.client.health())
    }

    fn admit(&self) -> Result<Profile, Error> {
        self.rt.block_on(self.client.admit(&[]))
    }

    fn readyz(&self) -> Result<(), Error> {
        self.rt.block_on(self.client.readyz())
    }

    fn capacity(&self) -> Result<CapacityReply, Error> {
        self.rt.block_on(self.client.capacity())
    }

    fn metrics(&self) -> Result<String, Error> {
        self.rt.block_on(self.client.metrics())
    }

    fn create(
        &self,
        profile: &Profile,
        name: MachineName,
        spec: &MachineSpec,
    ) -> Result<Observation, Error> {
        self.rt.block_on(self.client.create(profile, name, spec))
    }

    fn list(&self, profile: &Profile) -> Result<Vec<Observation>, Error> {
        self.rt.block_on(self.client.list(profile))
    }

    fn get(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.rt.block_on(self.client.get(profile, name))
    }

    fn start(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.rt.block_on(self.client.start(profile, name))
    }

    fn stop(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.rt.block_on(self.client.stop(profile, name))
    }

    fn delete(&self, name: MachineName) -> Result<(), Error> {
        self.rt.block_on(self.client.delete(name))
    }

    fn exec(
        &self,
        machine: &str,
        command: &Command,
        allowance: OutputAllowance,
    ) -> Result<ExecOutcome, Error> {
        self.rt
            .block_on(self.client.exec_with_allowance(machine, command, allowance))
    }

    fn exec_stream(
        &self,
        machine: &str,
        command: &Command,
        allowance: OutputAllowance,
    ) -> Result<TokioStream, Error> {
        let stream = self.rt.block_on(
            self.client
                .exec_stream_with_allowance(machine, command, allowance),
        )?;
        Ok(TokioStream {
            rt: Arc::clone(&self.rt),
            stream,
        })
    }

    fn exec_with(
        &self,
        machine: &str,
        command: &Command,
        mut callback: Box<dyn FnMut(&ExecEvent) + Send>,
    ) -> Result<ExecOutput, Error> {
        self.rt.block_on(
            self.client
                .exec_with(machine, command, move |e| callback(e)),
        )
    }

    fn launch(
        &self,
        machine: &str,
        command: &Command,
    ) -> Result<smolbox_core::exec::Launched, Error> {
        self.rt.block_on(self.client.launch(machine, command))
    }

    fn upload(
        &self,
        upload: &smolbox_core::worker::Upload,
    ) -> Result<smolbox_core::worker::UploadReply, Error> {
        self.rt.block_on(self.client.upload(upload))
    }

    fn upload_with_progress(
        &self,
        upload: &smolbox_core::worker::Upload,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<smolbox_core::worker::UploadReply, Error> {
        self.rt
            .block_on(self.client.upload_with_progress(upload, progress))
    }

    fn download(&self, download: &smolbox_core::worker::Download) -> Result<Vec<u8>, Error> {
        self.rt
            .block_on(self.client.download(download))
            .map(|b| b.to_vec())
    }

    fn logs(&self, logs: &smolbox_core::worker::Logs) -> Result<Vec<String>, Error> {
        self.rt.block_on(self.client.logs(logs))
    }

    fn terminal(&self, machine: &str, spec: &TerminalSpec) -> Result<TokioTerminal, Error> {
        let terminal = self.rt.block_on(self.client.terminal(machine, spec))?;
        Ok(TokioTerminal {
            rt: Arc::clone(&self.rt),
            terminal,
        })
    }
}
