//! One HTTP/1.1 exchange driven over a pooled connection.
//!
//! [`Exchange`] builds `core::http1::HttpExchange` (which validates the
//! request before any I/O), checks a connection out of the endpoint's pool
//! (within the checkout and connect budgets, both bounded by the operation
//! deadline), then turns the loop and pulls the core's events one at a
//! time. The connection goes back to the pool only when the core says it is
//! reusable.

use std::sync::Arc;
use std::time::Instant;

use smolbox_core::Error;
use smolbox_core::http1::{ExchangeConfig, HttpExchange, Pulled, Request, ResponseHead};
use smolbox_core::worker::OperationDeadlines;

use crate::pool::{Pool, PooledConn};

/// A request in flight on a checked-out connection.
#[derive(Debug)]
pub(crate) struct Exchange {
    /// `None` once the connection went back to the pool.
    conn: Option<PooledConn>,
    core: HttpExchange,
}

impl Exchange {
    /// Builds the core exchange, then checks out a connection.
    ///
    /// # Errors
    /// Validation errors of the request; checkout and connect failures
    /// (`transport`, `not_dispatched`).
    pub(crate) fn start(
        pool: &Arc<Pool>,
        request: &Request,
        config: &ExchangeConfig,
        deadlines: OperationDeadlines,
    ) -> Result<Self, Error> {
        let core = HttpExchange::new(request, config, Instant::now())?;
        let conn = pool
            .checkout(
                request.operation,
                deadlines.checkout.min(deadlines.operation),
                deadlines.connect,
                deadlines.operation,
            )
            .map_err(|e| deadlines.checkout_error(e, Instant::now()))?;
        Ok(Self {
            conn: Some(conn),
            core,
        })
    }

    /// Drives until the next event: the head, body bytes (handed to `sink`),
    /// or the end. After `End` the connection returns to the pool if the
    /// core says it is reusable.
    ///
    /// # Errors
    /// The core's errors (status, limits, timeouts, truncation) and
    /// transport failures; `sink`'s errors are returned as they are.
    pub(crate) fn next(
        &mut self,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<Pulled, Error> {
        loop {
            if let Some(step) = self.poll_step(sink)? {
                return Ok(step);
            }
        }
    }

    /// The next event if the core has one, else one turn of the
    /// connection (`None`: nothing to report yet).
    fn poll_step(
        &mut self,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<Option<Pulled>, Error> {
        if let Some(step) = self.core.pull(sink)? {
            if let Pulled::End = step {
                self.release();
            }
            return Ok(Some(step));
        }
        let Some(pooled) = self.conn.as_mut() else {
            // Released after `End`: nothing more will come.
            return Ok(Some(Pulled::End));
        };
        pooled.conn().turn(&mut self.core, None);
        Ok(None)
    }

    /// Reads the head like [`head`](Self::head), handing `progress` the
    /// request body bytes the socket took so far after every turn in which
    /// that count moved (an upload's progress; the core counts them).
    ///
    /// # Errors
    /// As [`next`](Self::next).
    pub(crate) fn head_reporting(
        &mut self,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ResponseHead, Error> {
        let mut no_body = |_: &[u8]| Ok(());
        loop {
            let step = self.poll_step(&mut no_body)?;
            if let Some(sent) = self.core.poll_body_progress() {
                progress(sent);
            }
            if let Some(Pulled::Head(h)) = step {
                return Ok(h);
            }
        }
    }

    /// Reads the head (the body is left to [`next`](Self::next)).
    ///
    /// # Errors
    /// As [`next`](Self::next).
    pub(crate) fn head(&mut self) -> Result<ResponseHead, Error> {
        let mut no_body = |_: &[u8]| Ok(());
        loop {
            if let Pulled::Head(h) = self.next(&mut no_body)? {
                return Ok(h);
            }
        }
    }

    /// Reads the whole body into `body`, until the end.
    ///
    /// # Errors
    /// As [`next`](Self::next).
    pub(crate) fn read_body(&mut self, body: &mut Vec<u8>) -> Result<(), Error> {
        let mut sink = |b: &[u8]| {
            body.extend_from_slice(b);
            Ok(())
        };
        loop {
            if let Pulled::End = self.next(&mut sink)? {
                return Ok(());
            }
        }
    }

    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.release(self.core.is_reusable());
        }
    }
}
