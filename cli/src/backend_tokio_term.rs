//! The tokio shell's terminal behind [`Term`]: each call is driven on the
//! command's runtime (its one worker thread keeps the terminal's socket
//! task running between calls).

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
