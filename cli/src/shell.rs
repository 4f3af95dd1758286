//! `shell MACHINE`: an interactive terminal over the worker's WebSocket.
//!
//! On a local tty, raw mode is switched on (crossterm) so every key,
//! Ctrl-C included, goes to the guest as bytes; it is switched off again on
//! every way out: a normal end, an error (the guard's `Drop`) and a panic
//! (the guard's `Drop` while unwinding, and a panic hook for the rest).
//! The window size is forwarded when it changes. The exit code is the
//! guest program's when its exit was confirmed; an uncertain end is an
//! error (exit code 3 and the reason on stderr).

use std::io::{self, IsTerminal, Read};
use std::sync::Once;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Duration;

use smolbox_core::terminal::TerminalSpec;
use smolbox_core::worker::MachineName;
use smolbox_core::{Category, Error, Operation};

use crate::args::ShellArgs;
use smolbox_core::terminal::TerminalEvent;

use crate::backend::Backend;
use crate::report::{self, Failure};
use crate::term::Term;

/// How long one wait for output lasts before input and the window size are
/// looked at again.
const TURN: Duration = Duration::from_millis(20);
/// The whole interactive session may last this long.
const SESSION: Duration = Duration::from_secs(12 * 3600);
/// … and stay silent this long.
const IDLE: Duration = Duration::from_secs(3600);
/// Ctrl-D: sent once when local stdin ends, so the guest's shell sees EOF.
const EOT: u8 = 0x04;

/// `shell MACHINE`.
pub(crate) fn shell(b: &Backend, args: &ShellArgs) -> Result<i32, Failure> {
    MachineName::new(&args.machine)?;
    let tty = io::stdin().is_terminal();
    let size = if tty { window_size() } else { None };
    let (cols, rows) = size.unwrap_or((80, 24));
    let spec = TerminalSpec {
        program: args.program.clone(),
        cols,
        rows,
        session_budget: SESSION,
        idle_budget: IDLE,
        ..TerminalSpec::default()
    };
    let term = b.terminal(&args.machine, &spec)?;
    let guard = if tty { Some(RawMode::enable()?) } else { None };
    let input = spawn_stdin_reader();
    let result = pump(term, &input, tty.then_some((cols, rows)));
    drop(guard);
    result
}

fn window_size() -> Option<(u16, u16)> {
    crossterm::terminal::size()
        .ok()
        .filter(|&(c, r)| c > 0 && r > 0)
}

/// Moves bytes both ways until the session ends.
fn pump(
    mut term: Box<dyn Term>,
    input: &Receiver<Vec<u8>>,
    mut size: Option<(u16, u16)>,
) -> Result<i32, Failure> {
    let mut eof_sent = false;
    // A failed input or resize: the session probably ended; its outcome
    // is read before this error is reported.
    let mut send_failed: Option<Error> = None;
    loop {
        while send_failed.is_none() {
            let sent = match input.try_recv() {
                Ok(bytes) => term.input(&bytes),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if !eof_sent => {
                    eof_sent = true;
                    term.input(&[EOT])
                }
                Err(TryRecvError::Disconnected) => break,
            };
            if let Err(e) = sent {
                send_failed = Some(e);
            }
        }
        if let Some(last) = size
            && send_failed.is_none()
            && let Some(now) = window_size()
            && now != last
        {
            size = Some(now);
            if let Err(e) = term.resize(now.0, now.1) {
                send_failed = Some(e);
            }
        }
        match term.next(TURN) {
            Ok(TerminalEvent::Output(bytes)) => {
                if let Err(f) = report::out(&bytes) {
                    // Nowhere to show output: end the session, report why.
                    let _ = term.close();
                    return Err(f);
                }
            }
            Ok(TerminalEvent::Closed(Ok(exit))) => return Ok(exit.code),
            Ok(TerminalEvent::Closed(Err(e))) => return Err(e.into()),
            Err(e) if is_wait_timeout(&e) => {
                if let Some(e) = send_failed {
                    return Err(e.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The expiry of one `next` wait (the session keeps running).
fn is_wait_timeout(e: &Error) -> bool {
    e.category() == Category::Expired && e.operation() == Operation::TerminalOutput
}

/// Reads local stdin on a helper thread (a blocking read cannot be
/// combined with the terminal's waits otherwise). The channel closes at
/// EOF. The thread may stay blocked in `read` until the process exits.
fn spawn_stdin_reader() -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(16);
    let spawned = std::thread::Builder::new()
        .name("smolbox-stdin".into())
        .spawn(move || {
            let mut stdin = io::stdin().lock();
            let mut buf = [0u8; 4096];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        });
    if spawned.is_err() {
        report::note("could not read stdin: no input will be sent");
    }
    rx
}

/// Raw mode on the local tty, switched off when dropped.
struct RawMode;

static PANIC_HOOK: Once = Once::new();

impl RawMode {
    fn enable() -> Result<Self, Failure> {
        PANIC_HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let _ = crossterm::terminal::disable_raw_mode();
                previous(info);
            }));
        });
        crossterm::terminal::enable_raw_mode()
            .map_err(|e| Failure::local("switch the terminal to raw mode", &e))?;
        Ok(Self)
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}
