//! Delivery threads for exec callbacks: how a blocked callback can be cut
//! off by the operation deadline without a thread per operation.
//!
//! The exec loop runs on the caller's thread. A synchronous callback cannot
//! be interrupted on the thread that runs it, so callbacks run on a small
//! pool of *delivery threads* owned by the [`Client`](crate::Client) (shared
//! by its clones):
//!
//! * threads are created on demand and reused by later operations; one
//!   operation holds one thread for its duration;
//! * each event is handed over through a rendezvous and acknowledged before
//!   the next read (at most one event in flight: back-pressure);
//! * a callback that panics is caught on its thread (`catch_unwind`), the
//!   callback is dropped (detached), the thread returns to the pool and
//!   capture continues;
//! * a callback still running at the operation deadline is abandoned: the
//!   operation returns `callback_deadline` and gives up the thread, which
//!   ends as soon as the callback returns (if it ever does);
//! * at most [`MAX_DELIVERY_THREADS`] threads exist per client, abandoned
//!   ones included. When all are busy or stuck, a callback operation is
//!   refused before anything is sent (`admission_exhausted`,
//!   `not_dispatched`). Since the pool has at most four connections, four
//!   threads serve every concurrent exec; the rest of the bound is room for
//!   abandoned ones.

use smolbox_core::Reason;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use smolbox_core::{Error, Operation};

use smolbox_core::exec::ExecEvent;

/// Delivery threads per client, at most (busy, idle and abandoned).
pub const MAX_DELIVERY_THREADS: usize = 8;

type Callback = Box<dyn FnMut(&ExecEvent) + Send>;

/// One delivery: the event, and where to say whether the callback returned
/// normally (`true`) or panicked (`false`).
struct Job {
    callback: Arc<Mutex<Option<Callback>>>,
    event: ExecEvent,
    ack: SyncSender<bool>,
}

/// A delivery thread's mailbox.
struct Worker {
    jobs: SyncSender<Job>,
}

/// The delivery threads of one client.
#[derive(Default)]
pub(crate) struct CallbackPool {
    state: Arc<Mutex<PoolState>>,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Worker>,
    alive: usize,
}

impl std::fmt::Debug for CallbackPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("CallbackPool")
            .field("alive", &st.alive)
            .field("idle", &st.idle.len())
            .finish()
    }
}

/// What became of one delivery.
pub(crate) enum Delivered {
    /// The callback returned.
    Ok,
    /// The callback panicked; it is detached.
    Panicked,
    /// The callback did not return before the deadline; it is abandoned.
    Deadline,
}

/// One operation's hold on a delivery thread and its callback.
pub(crate) struct Observer {
    pool: Arc<Mutex<PoolState>>,
    worker: Option<Worker>,
    callback: Arc<Mutex<Option<Callback>>>,
}

impl CallbackPool {
    /// Takes an idle delivery thread (or starts one) for `callback`.
    ///
    /// # Errors
    /// `admission_exhausted` / `not_dispatched` when
    /// [`MAX_DELIVERY_THREADS`] threads exist and none is idle, or the
    /// thread cannot be started.
    pub(crate) fn observer<F>(&self, callback: F) -> Result<Observer, Error>
    where
        F: FnMut(&ExecEvent) + Send + 'static,
    {
        let worker = self.take_worker()?;
        Ok(Observer {
            pool: Arc::clone(&self.state),
            worker: Some(worker),
            callback: Arc::new(Mutex::new(Some(Box::new(callback)))),
        })
    }

    /// Threads that exist now (tests).
    #[cfg(test)]
    pub(crate) fn alive(&self) -> usize {
        lock(&self.state).alive
    }

    fn take_worker(&self) -> Result<Worker, Error> {
        let mut st = lock(&self.state);
        if let Some(w) = st.idle.pop() {
            return Ok(w);
        }
        if st.alive >= MAX_DELIVERY_THREADS {
            return Err(Error::admission_exhausted(
                Operation::ExecStream,
                Reason::CallbackThreadsExhausted,
            ));
        }
        let (tx, rx) = sync_channel::<Job>(0);
        // Weak: idle mailboxes live in the pool state, so a strong
        // reference here would keep every idle thread alive forever after
        // the client is gone.
        let state = Arc::downgrade(&self.state);
        std::thread::Builder::new()
            .name("smolbox-exec-callback".into())
            .spawn(move || deliver_loop(&rx, &state))
            .map_err(|_| {
                Error::admission_exhausted(Operation::ExecStream, Reason::CallbackThreadSpawn)
            })?;
        st.alive += 1;
        Ok(Worker { jobs: tx })
    }
}

impl Observer {
    /// Hands `event` to the callback and waits for it to return, at most
    /// until `deadline`.
    pub(crate) fn deliver(&mut self, event: ExecEvent, deadline: Instant) -> Delivered {
        let Some(worker) = self.worker.as_ref() else {
            return Delivered::Panicked;
        };
        let (ack_tx, ack_rx) = sync_channel(1);
        let job = Job {
            callback: Arc::clone(&self.callback),
            event,
            ack: ack_tx,
        };
        // The thread is idle between deliveries (the previous one was
        // acknowledged), so the rendezvous completes at once.
        if worker.jobs.send(job).is_err() {
            self.worker = None;
            return Delivered::Panicked;
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match ack_rx.recv_timeout(wait) {
            Ok(true) => Delivered::Ok,
            Ok(false) | Err(RecvTimeoutError::Disconnected) => Delivered::Panicked,
            Err(RecvTimeoutError::Timeout) => {
                // Abandon the thread: dropping its mailbox makes it end once
                // the callback returns.
                self.worker = None;
                Delivered::Deadline
            }
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        // A callback is owned by one operation; drop it with the operation.
        if let Ok(mut cb) = self.callback.try_lock() {
            cb.take();
        }
        if let Some(worker) = self.worker.take() {
            lock(&self.pool).idle.push(worker);
        }
    }
}

fn deliver_loop(jobs: &Receiver<Job>, state: &Weak<Mutex<PoolState>>) {
    while let Ok(job) = jobs.recv() {
        let ok = {
            let mut slot = job.callback.lock().unwrap_or_else(|p| p.into_inner());
            match slot.as_mut() {
                Some(cb) => {
                    let ok = std::panic::catch_unwind(AssertUnwindSafe(|| cb(&job.event))).is_ok();
                    if !ok {
                        // Detached: it is never called again.
                        slot.take();
                    }
                    ok
                }
                None => false,
            }
        };
        let _ = job.ack.send(ok);
    }
    if let Some(state) = state.upgrade() {
        lock(&state).alive -= 1;
    }
}

fn lock(state: &Mutex<PoolState>) -> MutexGuard<'_, PoolState> {
    // Every update under this lock is a single statement: a panic elsewhere
    // cannot leave it inconsistent.
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
