//! `shell MACHINE`: an interactive terminal.
//!
//! On a managed machine (a machine record in the store) the terminal is a
//! managed one (C7.3, C7.4): its record is made durable in the machine's
//! command slot before the worker's WebSocket is opened, its execution id
//! is printed on stderr, and this process is its one consumer. On a
//! worker's machine used directly (`machine --raw`), it is the worker's
//! WebSocket terminal with no record.
//!
//! On a local tty, raw mode is switched on (crossterm) so every key,
//! Ctrl-C included, goes to the guest as bytes; it is switched off again on
//! every way out: a normal end, an error (the guard's `Drop`) and a panic
//! (the guard's `Drop` while unwinding, and a panic hook for the rest).
//! The window size is forwarded when it changes. One local escape is
//! read from the keys (see [`Escape`]): `Ctrl-]` then `.` closes the
//! session from here. The exit code is the guest program's when its exit
//! was confirmed; an uncertain end is an error (exit code 3, the reason on
//! stderr and, for a managed terminal, its execution id).

use std::io::{self, IsTerminal, Read};
use std::sync::Once;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Duration;

use smolbox_core::managed::spec::ManagedTerminalSpec;
use smolbox_core::managed::{ExecState, MachineRecord};
use smolbox_core::terminal::TerminalSpec;
use smolbox_core::worker::MachineName;
use smolbox_core::{Category, Error, Operation};

use crate::args::{ESCAPE_HELP, ShellArgs};
use smolbox_core::terminal::TerminalEvent;

use crate::backend::Backend;
use crate::machines::Ctx;
use crate::report::{self, Failure};
use crate::term::Term;

/// How long one wait for output lasts before input and the window size are
/// looked at again.
const TURN: Duration = Duration::from_millis(20);
/// The whole interactive session may last this long (a managed one at
/// most its machine profile's execution budget).
const SESSION: Duration = Duration::from_secs(12 * 3600);
/// … and stay silent this long.
const IDLE: Duration = Duration::from_secs(3600);
/// How long this process waits to attach to its own managed terminal
/// once it is accepted (the upgrade happens meanwhile): C7.4's most.
const ATTACH: Duration = Duration::from_secs(30);
/// How long the run is waited for after the session ended (its record
/// settled, the slot finished).
const SETTLE: Duration = Duration::from_secs(60);
/// Ctrl-D: sent once when local stdin ends, so the guest's shell sees EOF.
const EOT: u8 = 0x04;

/// The escape key: `Ctrl-]` (as telnet's).
pub(crate) const ESCAPE: u8 = 0x1d;

/// `shell MACHINE`: a managed terminal on a managed machine, else the
/// worker's terminal on the worker's machine of that name.
pub(crate) fn shell(ctx: &Ctx<'_>, args: &ShellArgs) -> Result<i32, Failure> {
    match crate::machines::lookup(ctx.store, &args.machine)? {
        Some(m) => managed(ctx, &m, args),
        None => raw(ctx.backend, args),
    }
}

/// The terminal size to start with, and whether stdin is a tty.
fn initial_size() -> (bool, u16, u16) {
    let tty = io::stdin().is_terminal();
    let size = if tty { window_size() } else { None };
    let (cols, rows) = size.unwrap_or((80, 24));
    (tty, cols, rows)
}

/// The worker's terminal on its machine `args.machine` (no record).
fn raw(b: &Backend, args: &ShellArgs) -> Result<i32, Failure> {
    MachineName::new(&args.machine)?;
    let (tty, cols, rows) = initial_size();
    let spec = TerminalSpec {
        program: args.program.clone(),
        cols,
        rows,
        session_budget: SESSION,
        idle_budget: IDLE,
        ..TerminalSpec::default()
    };
    let term = b.terminal(&args.machine, &spec)?;
    interact(term, tty, (cols, rows))
}

/// Raw mode on, the session pumped to its end, raw mode off.
fn interact(term: Box<dyn Term + '_>, tty: bool, size: (u16, u16)) -> Result<i32, Failure> {
    let guard = if tty { Some(RawMode::enable()?) } else { None };
    let input = spawn_stdin_reader();
    let result = pump(term, &input, tty.then_some(size));
    drop(guard);
    result
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A managed terminal on managed machine `m` through the runtime's
/// `terminals()`: open (durable, in the slot), attach as the one consumer,
/// pump, then wait for the run to settle. The execution id is on stderr
/// before the first key is read; an uncertain end names it again.
fn managed(ctx: &Ctx<'_>, m: &MachineRecord, args: &ShellArgs) -> Result<i32, Failure> {
    crate::machines::needs_persistent(ctx)?;
    let name = args.machine.as_str();
    let (tty, cols, rows) = initial_size();
    let session_ms = ms(SESSION).min(m.spec.profile.budgets.execution_ms);
    let spec = ManagedTerminalSpec {
        program: args.program.clone(),
        cols,
        rows,
        session_ms,
        idle_ms: ms(IDLE).min(session_ms),
        ..ManagedTerminalSpec::default()
    };
    let id = crate::commands::fresh_name()?
        .as_str()
        .replacen("sb-", "t-", 1);
    let key = crate::records::key(&id)?;
    crate::machines::with_rt(ctx, |rt| {
        rt.t_open(&key, &m.key, spec)
            .map_err(|e| crate::machines::slot_note(e.into(), name))?;
        report::note(&format!(
            "execution {id}: a terminal in the slot of managed machine {name} (Ctrl-] then . \
             closes it)"
        ));
        let result = rt
            .t_attach(&key, ATTACH)
            .map_err(Failure::from)
            .and_then(|term| interact(term, tty, (cols, rows)));
        let settled = rt.t_wait(&key, SETTLE);
        match result {
            Ok(code) => Ok(code),
            Err(f) => {
                let now = match &settled {
                    Ok(r) => format!(
                        "{} (evidence {})",
                        r.state.as_str(),
                        crate::records::ev(r.evidence)
                    ),
                    Err(_) => "not settled yet".to_owned(),
                };
                report::note(&format!(
                    "execution {id} is {now}: `smolbox records show {id}`"
                ));
                if settled
                    .as_ref()
                    .is_ok_and(|r| r.state == ExecState::Unknown)
                {
                    report::note(&format!(
                        "its outcome is unknown, so machine {name}'s slot stays held until \
                         `smolbox resolve {name} --quiesced --stopped|--deleted`"
                    ));
                }
                Err(f)
            }
        }
    })
}

fn window_size() -> Option<(u16, u16)> {
    crossterm::terminal::size()
        .ok()
        .filter(|&(c, r)| c > 0 && r > 0)
}

/// What the local keys mean, one chunk at a time: [`ESCAPE`] starts an
/// escape; the next byte decides it (an escape split across two reads is
/// still one escape).
#[derive(Debug, Default)]
pub(crate) struct Escape {
    pending: bool,
}

/// What one chunk of local keys asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Keys {
    /// The bytes for the guest, in order.
    pub(crate) send: Vec<u8>,
    /// `Ctrl-] .`: close the session (bytes after it are dropped).
    pub(crate) close: bool,
    /// `Ctrl-] ?`: show the escapes.
    pub(crate) help: bool,
}

impl Escape {
    /// Reads one chunk of keys.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Keys {
        let mut keys = Keys::default();
        for &b in bytes {
            if self.pending {
                self.pending = false;
                match b {
                    b'.' => {
                        keys.close = true;
                        return keys;
                    }
                    b'?' => keys.help = true,
                    ESCAPE => keys.send.push(ESCAPE),
                    other => keys.send.extend([ESCAPE, other]),
                }
            } else if b == ESCAPE {
                self.pending = true;
            } else {
                keys.send.push(b);
            }
        }
        keys
    }
}

/// Moves bytes both ways until the session ends.
fn pump(
    mut term: Box<dyn Term + '_>,
    input: &Receiver<Vec<u8>>,
    mut size: Option<(u16, u16)>,
) -> Result<i32, Failure> {
    let mut eof_sent = false;
    let mut escape = Escape::default();
    // A failed input or resize: the session probably ended; its outcome
    // is read before this error is reported.
    let mut send_failed: Option<Error> = None;
    loop {
        while send_failed.is_none() {
            let sent = match input.try_recv() {
                Ok(bytes) => {
                    let keys = escape.feed(&bytes);
                    if keys.help {
                        report::err(format!("\r\nsmolbox: {ESCAPE_HELP}\r\n").as_bytes());
                    }
                    let sent = if keys.send.is_empty() {
                        Ok(())
                    } else {
                        term.input(&keys.send)
                    };
                    if keys.close && sent.is_ok() {
                        report::err(b"\r\nsmolbox: closing the session\r\n");
                        return match term.close() {
                            Ok(exit) => Ok(exit.code),
                            Err(e) => Err(e.into()),
                        };
                    }
                    sent
                }
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
            // A kind of event this build does not show.
            Ok(_) => {}
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

#[cfg(test)]
mod tests {
    use super::{ESCAPE, Escape, Keys};

    #[test]
    fn plain_keys_pass_through() {
        let mut e = Escape::default();
        assert_eq!(
            e.feed(b"ls\r\x03"),
            Keys {
                send: b"ls\r\x03".to_vec(),
                ..Keys::default()
            }
        );
    }

    #[test]
    fn escape_dot_closes_and_drops_what_follows() {
        let mut e = Escape::default();
        let k = e.feed(&[b'a', ESCAPE, b'.', b'b']);
        assert_eq!(k.send, b"a");
        assert!(k.close && !k.help);
    }

    #[test]
    fn an_escape_split_across_reads_is_one_escape() {
        let mut e = Escape::default();
        let k = e.feed(&[b'x', ESCAPE]);
        assert_eq!(k.send, b"x");
        assert!(!k.close);
        assert!(e.feed(b".").close);
    }

    #[test]
    fn a_doubled_escape_sends_one_and_others_send_both() {
        let mut e = Escape::default();
        assert_eq!(e.feed(&[ESCAPE, ESCAPE]).send, [ESCAPE]);
        assert_eq!(e.feed(&[ESCAPE, b'd']).send, [ESCAPE, b'd']);
        let k = e.feed(&[ESCAPE, b'?', b'z']);
        assert!(k.help && !k.close);
        assert_eq!(k.send, b"z");
    }
}
