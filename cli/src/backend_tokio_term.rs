//! The tokio shell's terminals behind [`Term`] (the low-level one and the
//! managed one): each call is driven on the command's runtime (its one
//! worker thread keeps the terminal's socket task running between calls).

use std::sync::Arc;
use std::time::Duration;

use smolbox_core::Error;
use smolbox_core::terminal::{TerminalEvent, TerminalExit, TerminalSpec};
use tokio::runtime::Runtime;

use crate::term::Term;

/// A `smolbox_tokio::Terminal` and the runtime that drives it.
struct TokioTerm {
    rt: Arc<Runtime>,
    term: smolbox_tokio::Terminal,
}

/// Opens a terminal on the tokio shell.
pub(crate) fn open(
    rt: &Arc<Runtime>,
    client: &smolbox_tokio::Client,
    machine: &str,
    spec: &TerminalSpec,
) -> Result<Box<dyn Term>, Error> {
    let term = rt.block_on(client.terminal(machine, spec))?;
    Ok(Box::new(TokioTerm {
        rt: Arc::clone(rt),
        term,
    }))
}

impl Term for TokioTerm {
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.rt.block_on(self.term.input(bytes))
    }

    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.rt.block_on(self.term.resize(cols, rows))
    }

    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        self.rt.block_on(self.term.next(timeout))
    }

    fn close(self: Box<Self>) -> Result<TerminalExit, Error> {
        let Self { rt, term } = *self;
        rt.block_on(term.close())
    }
}

/// A managed terminal's handle of the tokio shell, driven on the
/// command's runtime (its driver task runs on that runtime's worker).
pub(crate) struct Managed<'a> {
    /// The runtime the handle's futures are driven on.
    pub(crate) rt: &'a Runtime,
    /// The one consumer's handle.
    pub(crate) term: smolbox_tokio::ManagedTerminal,
}

impl Term for Managed<'_> {
    fn input(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.rt.block_on(self.term.input(bytes))
    }

    fn resize(&mut self, cols: u16, rows: u16) -> Result<(), Error> {
        self.rt.block_on(self.term.resize(cols, rows))
    }

    fn next(&mut self, timeout: Duration) -> Result<TerminalEvent, Error> {
        self.rt.block_on(self.term.next(timeout))
    }

    fn close(self: Box<Self>) -> Result<TerminalExit, Error> {
        let Self { rt, term } = *self;
        rt.block_on(term.close())
    }
}
