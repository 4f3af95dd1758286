//! The tokio shell's terminal behind [`Term`].
//!
//! `smolbox-tokio` does not export its `Terminal` yet on `main`; until it
//! does, opening a terminal on the tokio shell is refused before anything
//! is sent (`unsupported_capability`, `not_dispatched`).

use std::sync::Arc;

use smolbox_core::terminal::TerminalSpec;
use smolbox_core::{Category, Error, Evidence, Operation};
use tokio::runtime::Runtime;

use crate::backend::Term;

/// Opens a terminal on the tokio shell.
pub(crate) fn open(
    _rt: &Arc<Runtime>,
    _client: &smolbox_tokio::Client,
    _machine: &str,
    spec: &TerminalSpec,
) -> Result<Box<dyn Term>, Error> {
    spec.validate()?;
    Err(Error::new(
        Category::UnsupportedCapability,
        Operation::TerminalOpen,
        Evidence::NotDispatched,
    )
    .with_reason("tokio_terminal_not_available"))
}
