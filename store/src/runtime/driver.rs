//! The driver's turn, written once for both shells: what the driver task
//! (tokio) or thread (blocking) does between two waits.
//!
//! A shell builds a [`Driver`] from the runtime's [`Host`], the [`Shared`]
//! notices and its [`Perform`], then loops: [`Driver::turn`] starts every
//! op the controller asks for, wakes the waiters when they should look
//! again, and says whether to stop or how long to wait at most; the shell
//! waits — its only part — for a handle's command, an op's answer, the last
//! handle's drop or the time, and hands what came to [`Driver::handle`].
//!
//! ```text
//! loop {
//!     let Turn::Wait(left) = driver.turn() else { return };
//!     let input = /* the shell's wait, at most `left` */;
//!     driver.handle(input);
//! }
//! ```

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::{Answer, Command, Host, Notices, Perform};

/// How a shell wakes the waiters of its [`Shared`] notices (a tokio
/// `Notify`'s `notify_waiters`, a [`Condvar`]'s `notify_all`).
pub trait Wake {
    /// Wakes every waiter now waiting; each then reads the store again.
    fn wake_all(&self);
}

impl Wake for Condvar {
    fn wake_all(&self) {
        self.notify_all();
    }
}

/// The driver's notices, shared with the runtime's waiters, and how they
/// are woken.
#[derive(Debug)]
pub struct Shared<W> {
    /// What the driver delivered (read under [`super::lock`]).
    pub notices: Mutex<Notices>,
    /// Woken by the driver when the notices changed.
    pub changed: W,
}

impl<W: Default> Shared<W> {
    /// The runtime's notices (from its builder's parts).
    pub fn new(notices: Notices) -> Self {
        Self {
            notices: Mutex::new(notices),
            changed: W::default(),
        }
    }
}

/// What the driver waited for.
pub enum Input {
    /// A runtime handle's request.
    Command(Command),
    /// A performed op's result.
    Answer(Answer),
    /// The wait [`Turn::Wait`] allowed ran out.
    Timeout,
    /// The last handle was dropped: finish what is in flight, then stop.
    Close,
}

/// What the driver does after a [`Driver::turn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// The runtime is closed and nothing is in flight: the driver ends.
    Stop,
    /// Wait for the next [`Input`]; at most this long (`None`: no timer,
    /// wait for a command or an answer).
    Wait(Option<Duration>),
}

/// The driver's state: the bookkeeping, the shared notices and the
/// shell's [`Perform`]. The shell owns it on its driver task or thread.
pub struct Driver<W, P> {
    host: Host,
    shared: Arc<Shared<W>>,
    io: P,
    closed: bool,
}

impl<W, P> std::fmt::Debug for Driver<W, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("host", &self.host)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl<W: Wake, P: Perform> Driver<W, P> {
    /// A driver of `host` that delivers into `shared` and performs ops
    /// through `io`.
    pub fn new(host: Host, shared: Arc<Shared<W>>, io: P) -> Self {
        Self {
            host,
            shared,
            io,
            closed: false,
        }
    }

    /// Starts what the controller asks for ([`Host::drain`]), wakes the
    /// waiters when they should look again, and says what to do next: stop
    /// once closed and stopped, else wait until the controller's next
    /// timer at most (measured on the runtime's clock).
    pub fn turn(&mut self) -> Turn {
        if self.host.drain(&self.shared.notices, &mut self.io) {
            self.shared.changed.wake_all();
        }
        if self.host.is_stopped() && self.closed {
            return Turn::Stop;
        }
        let now = self.host.clock.now();
        Turn::Wait(
            self.host
                .poll_timeout()
                .map(|at| at.saturating_duration_since(now)),
        )
    }

    /// The shell's [`Perform`] (a shell that performs ops on the driver
    /// itself keeps their answers there until the turn ends).
    pub fn io_mut(&mut self) -> &mut P {
        &mut self.io
    }

    /// Hands what the wait brought to the bookkeeping.
    pub fn handle(&mut self, input: Input) {
        match input {
            Input::Command(cmd) => self.host.command(cmd),
            Input::Answer(answer) => self.host.handle_answer(answer),
            Input::Timeout => self.host.handle_timeout(),
            Input::Close => {
                self.closed = true;
                self.host.close();
            }
        }
    }
}
