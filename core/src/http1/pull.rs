//! [`HttpExchange::pull`]: the exchange's events one step at a time, the
//! way both shells' request loops read them.

use super::exchange::{HttpEvent, HttpExchange};
use super::types::ResponseHead;
use crate::error::Error;

/// One step of an exchange, as [`HttpExchange::pull`] reports it.
#[derive(Debug)]
pub enum Pulled {
    /// The final response head.
    Head(ResponseHead),
    /// Body bytes were handed to the sink.
    Data,
    /// The body is complete.
    End,
}

impl HttpExchange {
    /// The next step the exchange has decoded, body bytes handed to `sink`
    /// (its error is returned as it is); `Ok(None)` when the exchange needs
    /// a turn of the connection first. After a failure every call returns
    /// that failure again, so a loop that asks once more never waits on a
    /// finished exchange.
    ///
    /// # Errors
    /// The exchange's failure (status, limits, timeouts, truncation,
    /// transport) and `sink`'s.
    pub fn pull<F>(&mut self, sink: &mut F) -> Result<Option<Pulled>, Error>
    where
        F: FnMut(&[u8]) -> Result<(), Error> + ?Sized,
    {
        match self.poll_event() {
            Some(HttpEvent::Head(head)) => Ok(Some(Pulled::Head(head))),
            Some(HttpEvent::Data(bytes)) => sink(bytes).map(|()| Some(Pulled::Data)),
            Some(HttpEvent::End) => Ok(Some(Pulled::End)),
            Some(HttpEvent::Failed(e)) => Err(e),
            None => self.error().map_or(Ok(None), Err),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::Pulled;
    use crate::Operation;
    use crate::http1::{ExchangeConfig, HttpExchange, Method, Request};

    #[allow(clippy::disallowed_methods)] // an arbitrary origin; time does not move
    fn origin() -> Instant {
        Instant::now()
    }

    fn exchange(now: Instant) -> HttpExchange {
        let config = ExchangeConfig::new("127.0.0.1:1", now + Duration::from_secs(5));
        let request = Request::new(Operation::Health, Method::Get, "/health".into());
        let Ok(mut x) = HttpExchange::new(&request, &config, now) else {
            panic!("request refused");
        };
        let mut wire = Vec::new();
        assert!(x.poll_transmit(&mut wire));
        x
    }

    #[test]
    fn pull_reports_head_data_end_then_needs_nothing() {
        let now = origin();
        let mut x = exchange(now);
        let mut body = Vec::new();
        let mut sink = |b: &[u8]| {
            body.extend_from_slice(b);
            Ok(())
        };
        assert!(matches!(x.pull(&mut sink), Ok(None)));
        let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert!(x.handle_input(now, reply).is_ok());
        assert!(matches!(x.pull(&mut sink), Ok(Some(Pulled::Head(h))) if h.status == 200));
        assert!(matches!(x.pull(&mut sink), Ok(Some(Pulled::Data))));
        assert!(matches!(x.pull(&mut sink), Ok(Some(Pulled::End))));
        assert!(matches!(x.pull(&mut sink), Ok(None)));
        assert_eq!(body, b"ok");
    }

    #[test]
    fn a_failure_is_returned_on_every_later_pull() {
        let now = origin();
        let mut x = exchange(now);
        let mut sink = |_: &[u8]| Ok(());
        // The input call may report the failure itself; the pulls must too.
        let _fed = x.handle_input(now, b"NOT HTTP\r\n\r\n");
        let first = x.pull(&mut sink);
        let Err(e) = first else {
            panic!("garbage accepted: {first:?}");
        };
        for _ in 0..3 {
            assert!(matches!(x.pull(&mut sink), Err(again) if again == e));
        }
    }
}
