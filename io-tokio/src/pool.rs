//! A small per-endpoint connection pool (features C1.2: at most 4).
//!
//! A permit bounds the connections that exist at once (idle or busy). An idle
//! connection is reused only when the exchange that last used it said it can
//! be (`is_reusable`), and only if it is not stale when checked out.

use smolbox_core::Reason;
use std::sync::{Arc, Mutex};

use smolbox_core::{Error, Evidence, Operation};
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::drive::Buffers;
use crate::transport::{Connection, SocketTarget};

/// Largest number of connections one endpoint may have open (C1.2).
pub const MAX_CONNECTIONS: usize = 4;

/// The pool of one endpoint.
#[derive(Debug)]
pub(crate) struct Pool {
    target: SocketTarget,
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Connection>>,
    /// Drive buffers of finished exchanges (at most one per connection).
    buffers: Mutex<Vec<Buffers>>,
}

/// A checked-out connection. Dropping it closes the connection and frees its
/// slot; [`Pool::give_back`] keeps it for reuse.
#[derive(Debug)]
pub(crate) struct Checkout {
    pub(crate) conn: Connection,
    /// True when this connection was freshly opened for this checkout.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fresh: bool,
    permit: OwnedSemaphorePermit,
}

impl Checkout {
    /// The connection and the slot it occupies.
    pub(crate) fn into_parts(self) -> (Connection, OwnedSemaphorePermit) {
        (self.conn, self.permit)
    }
}

impl Pool {
    pub(crate) fn new(target: SocketTarget, max: usize) -> Self {
        Self {
            target,
            permits: Arc::new(Semaphore::new(max.clamp(1, MAX_CONNECTIONS))),
            idle: Mutex::new(Vec::new()),
            buffers: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn target(&self) -> &SocketTarget {
        &self.target
    }

    /// Takes a connection: waits for a slot until `checkout_deadline`, then
    /// reuses a healthy idle connection or opens one within `connect_budget`
    /// (and before `operation_deadline`).
    ///
    /// # Errors
    /// `transport`/`not_dispatched`: `pool_checkout_timeout`, or a connect error.
    pub(crate) async fn checkout(
        &self,
        operation: Operation,
        checkout_deadline: Instant,
        connect_budget: std::time::Duration,
        operation_deadline: Instant,
    ) -> Result<Checkout, Error> {
        let permit = tokio::time::timeout_at(
            checkout_deadline.into(),
            self.permits.clone().acquire_owned(),
        )
        .await
        .map_err(|_| {
            Error::transport(
                operation,
                Evidence::NotDispatched,
                Reason::PoolCheckoutTimeout,
            )
        })?
        .map_err(|_| Error::transport(operation, Evidence::NotDispatched, Reason::PoolClosed))?;
        while let Some(mut conn) = self.pop_idle() {
            if !conn.is_stale() {
                return Ok(Checkout {
                    conn,
                    fresh: false,
                    permit,
                });
            }
        }
        let connect_deadline = (Instant::now() + connect_budget).min(operation_deadline);
        let conn = self.target.connect(connect_deadline, operation).await?;
        Ok(Checkout {
            conn,
            fresh: true,
            permit,
        })
    }

    /// Keeps a connection whose last exchange the core declared reusable.
    pub(crate) fn give_back(&self, conn: Connection, permit: OwnedSemaphorePermit) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
        // The permit drops here: the slot is free, the connection idles.
        drop(permit);
    }

    /// Drive buffers for an exchange: kept ones, or new.
    pub(crate) fn take_buffers(&self) -> Buffers {
        self.buffers
            .lock()
            .ok()
            .and_then(|mut b| b.pop())
            .unwrap_or_default()
    }

    /// Keeps an exchange's drive buffers for the next one (at most
    /// [`MAX_CONNECTIONS`] sets; more are freed).
    pub(crate) fn keep_buffers(&self, buffers: Buffers) {
        if !buffers.reusable() {
            return;
        }
        if let Ok(mut kept) = self.buffers.lock()
            && kept.len() < MAX_CONNECTIONS
        {
            kept.push(buffers);
        }
    }

    /// Number of kept drive buffer sets (tests).
    #[cfg(test)]
    pub(crate) fn kept_buffers(&self) -> usize {
        self.buffers.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Number of idle connections (tests).
    #[cfg(test)]
    pub(crate) fn idle_len(&self) -> usize {
        self.idle.lock().map(|v| v.len()).unwrap_or(0)
    }

    fn pop_idle(&self) -> Option<Connection> {
        self.idle.lock().ok()?.pop()
    }
}
