//! The tokio runtime's streamed runs can be spawned: the futures of
//! `Runtime::run_streamed` and `Machines::run_streamed` are `Send` (a
//! compile-time check; a non-`Send` future makes this file fail to build).

use smolbox_core::exec::{Command, ExecEvent};
use smolbox_core::managed::RecordKey;
use smolbox_core::managed::controller::Submit;
use smolbox_tokio::Runtime;
use smolbox_tokio::runtime::Machines;

fn assert_send<F: Future + Send>(f: F) -> F {
    f
}

/// Builds (never polls) both futures, each with a `Send` callback, and
/// proves they are `Send` by the bound of [`assert_send`].
fn both_are_send(rt: &Runtime, m: &Machines<'_>, submit: Submit, key: &RecordKey) {
    let mut seen = 0_usize;
    drop(assert_send(
        rt.run_streamed(submit, |_: &ExecEvent| seen += 1),
    ));
    let cmd = Command::new(["true"]);
    drop(assert_send(m.run_streamed(
        key,
        key,
        &cmd,
        |_: &ExecEvent| {},
    )));
}

/// The check is that this item compiles (every test build does): nothing
/// runs, so nothing can pass by accident.
const _: fn(&Runtime, &Machines<'_>, Submit, &RecordKey) = both_are_send;
