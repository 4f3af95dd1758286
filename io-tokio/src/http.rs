//! One HTTP/1.1 exchange driven over a pooled connection.
//!
//! [`Exchange`] checks a connection out of the endpoint's pool (within the
//! checkout and connect budgets, both bounded by the operation deadline),
//! hands the request to `core::http1::HttpExchange`, and then pulls the
//! core's events one at a time. The connection goes back to the pool only
//! when the core says it is reusable.

use std::sync::Arc;
use std::time::Instant;

use smolbox_core::Error;
use smolbox_core::http1::{ExchangeConfig, HttpExchange, Pulled, Request, ResponseHead};
use smolbox_core::worker::OperationDeadlines;
use tokio::sync::OwnedSemaphorePermit;

use crate::drive::Driver;
use crate::pool::Pool;

/// A request in flight on a checked-out connection.
#[derive(Debug)]
pub(crate) struct Exchange {
    pool: Arc<Pool>,
    /// `None` once the connection went back to the pool.
    driver: Option<Driver>,
    permit: Option<OwnedSemaphorePermit>,
    core: HttpExchange,
}

impl Exchange {
    /// Builds the core exchange (which validates the request before any I/O),
    /// then checks out a connection.
    ///
    /// # Errors
    /// Validation errors of the request; checkout and connect failures
    /// (`transport`, `not_dispatched`).
    pub(crate) async fn start(
        pool: Arc<Pool>,
        request: &Request,
        config: &ExchangeConfig,
        deadlines: OperationDeadlines,
    ) -> Result<Self, Error> {
        let core = HttpExchange::new(request, config, Instant::now())?;
        let op = request.operation;
        let checkout = pool
            .checkout(
                op,
                deadlines.checkout.min(deadlines.operation),
                deadlines.connect,
                deadlines.operation,
            )
            .await
            .map_err(|e| deadlines.checkout_error(e, Instant::now()))?;
        let (conn, permit) = checkout.into_parts();
        let buffers = pool.take_buffers();
        Ok(Self {
            pool,
            driver: Some(Driver::with_buffers(conn, buffers)),
            permit: Some(permit),
            core,
        })
    }

    /// Drives until the next event: the head, body bytes (handed to `sink`),
    /// or the end. After `End` the connection returns to the pool if the core
    /// says it is reusable.
    ///
    /// # Errors
    /// The core's errors (status, limits, timeouts, truncation) and transport
    /// failures; `sink`'s errors are returned as they are.
    pub(crate) async fn next(
        &mut self,
        sink: &mut (dyn FnMut(&[u8]) -> Result<(), Error> + Send),
    ) -> Result<Pulled, Error> {
        loop {
            if let Some(step) = self.poll_step(sink).await? {
                return Ok(step);
            }
        }
    }

    /// The next event if the core has one, else one turn of the
    /// connection (`None`: nothing to report yet).
    async fn poll_step(
        &mut self,
        sink: &mut (dyn FnMut(&[u8]) -> Result<(), Error> + Send),
    ) -> Result<Option<Pulled>, Error> {
        if let Some(step) = self.core.pull(sink)? {
            if let Pulled::End = step {
                self.release();
            }
            return Ok(Some(step));
        }
        let Some(driver) = self.driver.as_mut() else {
            // Released after `End`: nothing more will come.
            return Ok(Some(Pulled::End));
        };
        driver.turn(&mut self.core).await;
        Ok(None)
    }

    /// Reads the head like [`head`](Self::head), handing `progress` the
    /// request body bytes the socket took so far after every turn in which
    /// that count moved (an upload's progress; the core counts them).
    ///
    /// # Errors
    /// As [`next`](Self::next).
    pub(crate) async fn head_reporting(
        &mut self,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<ResponseHead, Error> {
        let mut no_body = |_: &[u8]| Ok(());
        loop {
            let step = self.poll_step(&mut no_body).await?;
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
    /// As [`next`](Self::next); body bytes before a head cannot happen.
    pub(crate) async fn head(&mut self) -> Result<ResponseHead, Error> {
        let mut no_body = |_: &[u8]| Ok(());
        loop {
            if let Pulled::Head(h) = self.next(&mut no_body).await? {
                return Ok(h);
            }
        }
    }

    /// Reads the whole body into `body`, until the end.
    ///
    /// # Errors
    /// As [`next`](Self::next).
    pub(crate) async fn read_body(&mut self, body: &mut Vec<u8>) -> Result<(), Error> {
        let mut sink = |b: &[u8]| {
            body.extend_from_slice(b);
            Ok(())
        };
        loop {
            if let Pulled::End = self.next(&mut sink).await? {
                return Ok(());
            }
        }
    }

    fn release(&mut self) {
        if self.core.is_reusable()
            && self.driver.as_ref().is_some_and(Driver::is_flushed)
            && let (Some(permit), Some(driver)) = (self.permit.take(), self.driver.take())
        {
            let (conn, buffers) = driver.into_parts();
            self.pool.keep_buffers(buffers);
            self.pool.give_back(conn, permit);
        }
    }
}
