//! Streamed execs through the runtime (issue 15 item 2): the worker op's
//! side and the caller's, over one bounded channel per execution (see
//! `smolbox_store::runtime::stream` for the rules both shells share).

use std::sync::mpsc;

use smolbox_core::exec::{Command, ExecEvent};
use smolbox_core::managed::controller::{Outcome, Submit, WorkerResult};
use smolbox_core::managed::{CommandFiles, RecordKey};
use smolbox_core::{Error, Operation};
use smolbox_store::runtime::stream::{STREAM_EVENTS, Streams, Tally, hand_over, settled};
use smolbox_store::runtime::{Command as Cmd, MAX_WAIT_MS, WAIT_POLL, stopped};

use smolbox_store::runtime::Input;

use super::{Machines, Runtime};
use crate::Client;

/// Where a streamed exec's events go: the waiting caller's channel.
pub(super) type Sink = mpsc::SyncSender<ExecEvent>;
/// The runtime's registered sinks.
pub(super) type Sinks = Streams<Sink>;

/// Performs a streamed exec: each output event to `sink` (waiting while
/// it is full), the exit (with the output's size) to the controller. A
/// receiver that went away stops the forwarding, never the read: the exit
/// is still recorded. The sink is dropped before the answer is sent, so
/// the caller has every event once the record settles.
pub(super) fn perform(
    c: &Client,
    machine: &str,
    command: &Command,
    mut sink: Option<Sink>,
) -> WorkerResult {
    let stream = c.exec_stream(machine, command)?;
    let mut tally = Tally::default();
    for event in stream {
        let event = event?;
        if let Some(answer) = tally.event(&event) {
            return answer;
        }
        if let Some(s) = &sink
            && s.send(event).is_err()
        {
            sink = None;
        }
    }
    tally.ended()
}

/// A caller's registered stream; dropping it unregisters it.
struct Watch<'a> {
    rt: &'a Runtime,
    key: RecordKey,
    rx: mpsc::Receiver<ExecEvent>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.rt.streams.remove(&self.key);
        let _ = self
            .rt
            .cmd
            .send(Input::Command(Cmd::Stream(self.key.clone(), false)));
    }
}

impl Watch<'_> {
    /// Hands every event to `on_event` until the record is terminal or
    /// `unknown`, then returns its outcome (an output that went out
    /// buffered is handed over as events first; the outcome's `output` is
    /// then `None`).
    fn follow(&self, on_event: &mut dyn FnMut(&ExecEvent)) -> Result<Outcome, Error> {
        loop {
            match self.rx.recv_timeout(WAIT_POLL) {
                Ok(event) => on_event(&event),
                // The stream was read to its end (the sink is dropped).
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                // Nothing streams (yet): maybe nothing ever will (an
                // existing record, another controller, a refusal).
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(r) = settled(self.rt.wait(&self.key, 0)) {
                        return r.map(|o| self.finish(o, on_event));
                    }
                }
            }
        }
        loop {
            if let Some(r) = settled(self.rt.wait(&self.key, MAX_WAIT_MS)) {
                return r.map(|o| self.finish(o, on_event));
            }
        }
    }

    fn finish(&self, o: Outcome, on_event: &mut dyn FnMut(&ExecEvent)) -> Outcome {
        while let Ok(event) = self.rx.try_recv() {
            on_event(&event);
        }
        hand_over(o, on_event)
    }
}

impl Runtime {
    /// Registers a stream for `key` and tells the controller, before the
    /// submission.
    fn watch(&self, key: &RecordKey) -> Result<Watch<'_>, Error> {
        let (tx, rx) = mpsc::sync_channel(STREAM_EVENTS);
        self.streams.register(key, tx)?;
        let watch = Watch {
            rt: self,
            key: key.clone(),
            rx,
        };
        self.cmd
            .send(Input::Command(Cmd::Stream(key.clone(), true)))
            .map_err(|_| stopped(Operation::Submit))?;
        Ok(watch)
    }

    /// [`Runtime::run`] with the output handed to `on_event` as it comes
    /// (stdout and stderr events; never the exit, which is the outcome's).
    /// The record is kept exactly as for a buffered run (state, evidence,
    /// exit code, output size); the output is never stored. Delivery is
    /// back-pressured: a slow `on_event` slows the read of the stream.
    /// A command that cannot be streamed (stdin), or that this process
    /// already sent buffered, has its output handed over at the end; one
    /// already finished or driven elsewhere has none. The outcome's
    /// `output` is always `None`.
    ///
    /// # Errors
    /// As [`Runtime::run`]; `admission_exhausted` (`stream_key_taken`,
    /// `streams_exhausted`, nothing submitted) when a caller already streams
    /// the key or `MAX_STREAMS` callers stream.
    pub fn run_streamed(
        &self,
        submit: Submit,
        mut on_event: impl FnMut(&ExecEvent),
    ) -> Result<Outcome, Error> {
        let watch = self.watch(&submit.key)?;
        self.submit(submit)?;
        watch.follow(&mut on_event)
    }
}

impl Machines<'_> {
    /// [`Machines::submit`] into the machine's slot, then the command's
    /// output to `on_event` as it comes, as [`Runtime::run_streamed`].
    ///
    /// # Errors
    /// As [`Machines::submit`] and [`Runtime::run_streamed`].
    pub fn run_streamed(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        on_event: impl FnMut(&ExecEvent),
    ) -> Result<Outcome, Error> {
        self.run_streamed_with_files(machine, key, command, &CommandFiles::default(), on_event)
    }

    /// [`Machines::run_streamed`] with declared files, as
    /// [`Machines::submit_with_files`]: the output is streamed once the
    /// inputs are staged; the outputs are collected after the exit.
    ///
    /// # Errors
    /// As [`Machines::submit_with_files`] and [`Runtime::run_streamed`].
    pub fn run_streamed_with_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &CommandFiles,
        mut on_event: impl FnMut(&ExecEvent),
    ) -> Result<Outcome, Error> {
        let watch = self.rt.watch(key)?;
        self.submit_with_files(machine, key, command, files)?;
        watch.follow(&mut on_event)
    }
}
