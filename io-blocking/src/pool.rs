//! The connection pool of one endpoint: at most [`MAX_CONNECTIONS`] open
//! connections, idle ones reused only when the core said the exchange left
//! the connection reusable, and only if nothing arrived on them while idle.
//!
//! Checkout waits (on a condition variable, on the caller's thread) until a
//! connection is free or the checkout budget runs out; connecting happens
//! outside the lock with its own budget.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use smolbox_core::{Error, Evidence, Operation, Reason};

use crate::conn::Conn;
use crate::errors;
use crate::errors::ConnectError;
use crate::transport::SocketTarget;

/// Connections per endpoint, at most (features C1.2).
pub const MAX_CONNECTIONS: usize = 4;

/// Where and how to connect.
#[derive(Debug)]
pub(crate) struct Pool {
    target: SocketTarget,
    max: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct PoolState {
    idle: Vec<Conn>,
    open: usize,
}

/// A connection checked out of the pool. Dropping it discards the
/// connection; [`PooledConn::release`] returns it for reuse.
#[derive(Debug)]
pub(crate) struct PooledConn {
    pool: Arc<Pool>,
    conn: Option<Conn>,
    /// True when this came from the idle list rather than a fresh connect.
    // Only the pool tests read it; it documents what checkout did.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) reused: bool,
}

impl Pool {
    pub(crate) fn new(target: SocketTarget, max: usize) -> Self {
        Self {
            target,
            max: max.clamp(1, MAX_CONNECTIONS),
            state: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
        }
    }

    /// Checks out an idle connection or opens a new one.
    ///
    /// # Errors
    /// `transport`/`not_dispatched` when no connection became free before
    /// `checkout_deadline`, or the connect failed or ran past its budget
    /// (counted from when it starts, and never past `operation_deadline`).
    pub(crate) fn checkout(
        self: &Arc<Self>,
        operation: Operation,
        checkout_deadline: Instant,
        connect_budget: Duration,
        operation_deadline: Instant,
    ) -> Result<PooledConn, Error> {
        let mut state = self.lock();
        loop {
            while let Some(mut conn) = state.idle.pop() {
                if conn.is_idle_usable() {
                    return Ok(PooledConn {
                        pool: self.clone(),
                        conn: Some(conn),
                        reused: true,
                    });
                }
                state.open -= 1;
                conn.shutdown();
            }
            if state.open < self.max {
                state.open += 1;
                drop(state);
                let connect_deadline = (Instant::now() + connect_budget).min(operation_deadline);
                return match Conn::connect(&self.target, connect_deadline) {
                    Ok(conn) => Ok(PooledConn {
                        pool: self.clone(),
                        conn: Some(conn),
                        reused: false,
                    }),
                    Err(e) => {
                        self.forget_one();
                        Err(errors::connect(operation, &e))
                    }
                };
            }
            let now = Instant::now();
            if now >= checkout_deadline {
                return Err(Error::transport(
                    operation,
                    Evidence::NotDispatched,
                    Reason::PoolCheckoutTimeout,
                ));
            }
            state = match self.freed.wait_timeout(state, checkout_deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Opens a connection outside the pool's count (upgraded connections
    /// such as terminals never come back to the pool).
    ///
    /// # Errors
    /// As [`Pool::checkout`]'s connect errors.
    pub(crate) fn connect_dedicated(
        &self,
        operation: Operation,
        connect_deadline: Instant,
    ) -> Result<Conn, Error> {
        Conn::connect(&self.target, connect_deadline)
            .map_err(|e: ConnectError| errors::connect(operation, &e))
    }

    /// Open connections (idle and checked out).
    #[cfg(test)]
    pub(crate) fn open_count(&self) -> usize {
        self.lock().open
    }

    /// Idle connections.
    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        self.lock().idle.len()
    }

    fn forget_one(&self) {
        let mut state = self.lock();
        state.open = state.open.saturating_sub(1);
        drop(state);
        self.freed.notify_one();
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding this lock cannot leave the counters
        // inconsistent (every update is a single statement), so keep going.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl PooledConn {
    /// The connection.
    pub(crate) fn conn(&mut self) -> &mut Conn {
        // The Option is only taken by `release`/`detach`, which consume self.
        self.conn.as_mut().unwrap_or_else(|| unreachable!())
    }

    /// Returns the connection to the pool when `reusable` (the core's
    /// verdict), else closes it.
    pub(crate) fn release(mut self, reusable: bool) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if reusable && !conn.is_eof() && !conn.has_parked() {
            conn.reset_sent();
            let mut state = self.pool.lock();
            state.idle.push(conn);
            drop(state);
            self.pool.freed.notify_one();
        } else {
            conn.shutdown();
            self.pool.forget_one();
        }
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.shutdown();
            self.pool.forget_one();
        }
    }
}
