//! Streamed execs through the runtime (issue 15 item 2), the half shared
//! by both shells.
//!
//! A caller registers a sink under the record key ([`Streams::register`])
//! and tells the controller ([`super::Command::Stream`]) before it submits.
//! If the controller then sends the command, it asks for a
//! [`WorkerOp::ExecStream`](smolbox_core::managed::controller::WorkerOp::ExecStream);
//! the shell takes the sink ([`Streams::take`]), reads the worker's stream,
//! hands each output event to the sink and answers the controller with
//! what [`Tally`] makes of the stream: the exit and the output's size,
//! never the output. The exit is then recorded exactly like a buffered
//! one's.
//!
//! Delivery is **back-pressured, not lossy**: a sink holds at most
//! [`STREAM_EVENTS`] events, and a caller slower than the worker slows the
//! read of the stream (the worker's own buffering, then its socket, hold
//! the rest). A caller that goes away (its receiver dropped) does not
//! stop the command: the rest of the stream is read and discarded so its
//! exit is still recorded. See docs/decisions.md, "CLI: streamed runs".

use std::collections::BTreeMap;
use std::sync::Mutex;

use smolbox_core::exec::ExecEvent;
use smolbox_core::managed::RecordKey;
pub use smolbox_core::managed::controller::MAX_STREAMS;
use smolbox_core::managed::controller::{Outcome, WorkerReply, WorkerResult};
use smolbox_core::{Category, Error, Evidence, Operation, Reason};

/// Output events queued per streamed execution between the worker read and
/// the caller; the read waits while the queue is full.
pub const STREAM_EVENTS: usize = 64;

/// The sinks of the streamed executions callers of one runtime wait for,
/// by record key (at most [`MAX_STREAMS`]); `S` is the shell's sender.
#[derive(Debug)]
pub struct Streams<S> {
    sinks: Mutex<BTreeMap<RecordKey, S>>,
}

impl<S> Default for Streams<S> {
    fn default() -> Self {
        Self {
            sinks: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<S> Streams<S> {
    fn sinks(&self) -> std::sync::MutexGuard<'_, BTreeMap<RecordKey, S>> {
        self.sinks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers `sink` for `key`'s output.
    ///
    /// # Errors
    /// `admission_exhausted` / `not_dispatched` (nothing is submitted):
    /// `stream_key_taken` when a caller already streams `key`,
    /// `streams_exhausted` (with the limit) when [`MAX_STREAMS`] are
    /// registered.
    pub fn register(&self, key: &RecordKey, sink: S) -> Result<(), Error> {
        let mut sinks = self.sinks();
        let refused = |reason| Error::admission_exhausted(Operation::ExecStream, reason);
        if sinks.contains_key(key) {
            return Err(refused(Reason::StreamKeyTaken));
        }
        if sinks.len() >= MAX_STREAMS {
            return Err(refused(Reason::StreamsExhausted)
                .with_limit(sinks.len() as u64 + 1, MAX_STREAMS as u64));
        }
        sinks.insert(key.clone(), sink);
        Ok(())
    }

    /// Takes `key`'s sink for the stream about to be read (`None`: nobody
    /// waits for it here; the events are read and dropped).
    pub fn take(&self, key: &RecordKey) -> Option<S> {
        self.sinks().remove(key)
    }

    /// Removes `key`'s sink if it was never taken (the caller is done).
    pub fn remove(&self, key: &RecordKey) {
        self.sinks().remove(key);
    }

    /// Sinks registered and not taken.
    pub fn len(&self) -> usize {
        self.sinks().len()
    }

    /// True when no sink is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one streamed exec's events add up to, for the controller.
#[derive(Debug, Default)]
pub struct Tally {
    output_bytes: u64,
}

impl Tally {
    /// Counts `event`. `Some(answer)` at the exit (the stream's last
    /// event): answer the controller with it. `None`: forward the event.
    pub fn event(&mut self, event: &ExecEvent) -> Option<WorkerResult> {
        match event {
            ExecEvent::Stdout(s) | ExecEvent::Stderr(s) => {
                self.output_bytes = self.output_bytes.saturating_add(s.len() as u64);
                None
            }
            ExecEvent::Exit(code) => Some(Ok(WorkerReply::Streamed {
                exit_code: *code,
                output_bytes: self.output_bytes,
            })),
            // An event kind this build does not know: neither output nor
            // the exit; forwarded as it is.
            _ => None,
        }
    }

    /// The answer for a stream that ended without an exit event (the
    /// client reports its own errors; this is the defensive case): the
    /// command may have run.
    pub fn ended(&self) -> WorkerResult {
        Err(Error::unknown(
            Operation::ExecStream,
            Evidence::DispatchUncertain,
            Reason::StreamEndedWithoutExit,
        ))
    }
}

/// The events a caller gets for output it did not see streamed (the
/// command went out buffered: it had stdin, or joined a buffered
/// submission): stdout, then stderr, as lossy UTF-8, empty ones left out.
pub fn buffered_events(out: &smolbox_core::exec::ExecOutput) -> Vec<ExecEvent> {
    let mut events = Vec::new();
    if !out.stdout.is_empty() {
        events.push(ExecEvent::Stdout(
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ));
    }
    if !out.stderr.is_empty() {
        events.push(ExecEvent::Stderr(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    events
}

/// A caller's wait, read for a followed stream: `Some` once the wait
/// answered (the record settled, or the wait failed for another reason
/// than its own expiry), `None` when only the wait expired (wait again).
pub fn settled(wait: Result<Outcome, Error>) -> Option<Result<Outcome, Error>> {
    match wait {
        Err(e) if e.category() == Category::Expired && e.operation() == Operation::Await => None,
        other => Some(other),
    }
}

/// The end of a followed stream, after the sink's last events: the
/// output that went out buffered is handed to `on_event` as events (see
/// [`buffered_events`]); the outcome comes back with `output` `None`.
pub fn hand_over(mut outcome: Outcome, on_event: &mut dyn FnMut(&ExecEvent)) -> Outcome {
    if let Some(out) = outcome.output.take() {
        for event in buffered_events(&out) {
            on_event(&event);
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;
    use smolbox_core::Category;
    use smolbox_core::managed::testkit;

    #[test]
    fn only_an_expired_wait_is_waited_again_and_buffered_output_is_handed_over() {
        use smolbox_core::exec::{ExecOutput, OutputEncoding};
        let key = testkit::key("s", "k");
        let record = testkit::accepted(key, testkit::exec_spec("x"), 1);
        let expired = Error::expired(Operation::Await, Evidence::NotDispatched, Reason::Deadline);
        assert!(settled(Err(expired)).is_none());
        let other = Error::expired(
            Operation::ExecStream,
            Evidence::DispatchUncertain,
            Reason::Deadline,
        );
        assert_eq!(settled(Err(other)).map(Result::err), Some(Some(other)));
        let mut out = ExecOutput::empty(OutputEncoding::Bytes);
        out.stdout = b"out".to_vec();
        out.stderr = b"err".to_vec();
        let outcome = Outcome {
            record,
            output: Some(out),
            error: None,
        };
        let Some(Ok(outcome)) = settled(Ok(outcome)) else {
            panic!("a settled record was waited again");
        };
        let mut seen = Vec::new();
        let outcome = hand_over(outcome, &mut |e: &ExecEvent| seen.push(e.clone()));
        assert!(outcome.output.is_none());
        assert_eq!(
            seen,
            [
                ExecEvent::Stdout("out".into()),
                ExecEvent::Stderr("err".into())
            ]
        );
    }

    #[test]
    fn sinks_are_registered_up_to_the_limit_and_one_per_key() {
        let s = Streams::<u32>::default();
        for i in 0..MAX_STREAMS {
            s.register(&testkit::key("s", &format!("k{i}")), 1).unwrap();
        }
        assert_eq!(s.len(), MAX_STREAMS);
        let e = s.register(&testkit::key("s", "over"), 1).unwrap_err();
        assert_eq!(
            (e.category(), e.reason(), e.evidence()),
            (
                Category::AdmissionExhausted,
                Reason::StreamsExhausted,
                Evidence::NotDispatched
            )
        );
        // A freed place is reused; a key already registered is refused.
        assert_eq!(s.take(&testkit::key("s", "k0")), Some(1));
        assert_eq!(s.take(&testkit::key("s", "k0")), None);
        s.register(&testkit::key("s", "over"), 2).unwrap();
        s.remove(&testkit::key("s", "k1"));
        let e = s.register(&testkit::key("s", "over"), 3).unwrap_err();
        assert_eq!(e.reason(), Reason::StreamKeyTaken);
        assert_eq!(s.len(), MAX_STREAMS - 1);
    }

    #[test]
    fn the_tally_counts_output_and_answers_at_the_exit() {
        let mut t = Tally::default();
        assert!(t.event(&ExecEvent::Stdout("abc".into())).is_none());
        assert!(t.event(&ExecEvent::Stderr("de".into())).is_none());
        let answer = t.event(&ExecEvent::Exit(7)).unwrap().unwrap();
        assert_eq!(
            answer,
            WorkerReply::Streamed {
                exit_code: 7,
                output_bytes: 5
            }
        );
        let e = Tally::default().ended().unwrap_err();
        assert_eq!(e.evidence(), Evidence::DispatchUncertain);
    }
}
