//! Deterministic simulation: a `TerminalSession` wired to a sans-IO fake
//! worker over a virtual network (latency, arbitrary read chunking) with a
//! virtual clock that jumps to the next delivery or deadline. Every budget
//! and limit of features C7.2/C7.3 is checked at N and N+1, with a stalled
//! or an active consumer.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use smolbox_core::Reason;
mod ws_support;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use smolbox_core::terminal::{
    Next, READ_GRACE, TerminalConfig, TerminalExit, TerminalSession, TerminalSpec, TerminalTimer,
};
use smolbox_core::ws::frame::{Opcode, parse_any_header};
use smolbox_core::ws::handshake;
use smolbox_core::{Category, Error, Evidence, Operation};
use ws_support::{server_frame, t0};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A sans-IO stand-in for the worker's terminal endpoint.
#[derive(Default)]
struct FakeWorker {
    rx: Vec<u8>,
    upgraded: bool,
    out: Vec<u8>,
    /// Frames received from the client, unmasked.
    received: Vec<(Opcode, Vec<u8>)>,
    /// Answer a client close with a close (the worker does).
    echo_close: bool,
    /// Answer pings with pongs (the worker's WebSocket library does).
    answer_pings: bool,
    saw_close: bool,
}

impl FakeWorker {
    fn new() -> Self {
        Self {
            echo_close: true,
            answer_pings: true,
            ..Self::default()
        }
    }

    fn handle(&mut self, bytes: &[u8]) {
        self.rx.extend_from_slice(bytes);
        if !self.upgraded {
            let Some(end) = self.rx.windows(4).position(|w| w == b"\r\n\r\n") else {
                return;
            };
            let head = String::from_utf8(self.rx[..end].to_vec()).unwrap();
            let key = head
                .lines()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                .unwrap()
                .to_owned();
            let reply = format!(
                "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {}\r\n\r\n",
                handshake::accept_for(&key)
            );
            self.out.extend_from_slice(reply.as_bytes());
            self.rx.drain(..end + 4);
            self.upgraded = true;
        }
        while let Some(h) = parse_any_header(&self.rx) {
            let end = h.header_len + h.payload_len as usize;
            if self.rx.len() < end {
                break;
            }
            let mask = h.mask.expect("client frames are masked");
            let payload: Vec<u8> = self.rx[h.header_len..end]
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ mask[i % 4])
                .collect();
            self.rx.drain(..end);
            if h.opcode == Opcode::Ping && self.answer_pings && !self.saw_close {
                self.out.extend(server_frame(true, 0xa, &payload));
            }
            if h.opcode == Opcode::Close && !self.saw_close {
                self.saw_close = true;
                if self.echo_close {
                    self.out.extend(server_frame(true, 0x8, &payload));
                }
            }
            self.received.push((h.opcode, payload));
        }
    }

    fn output(&mut self, bytes: &[u8]) {
        self.out.extend(server_frame(true, 0x2, bytes));
    }

    fn exit(&mut self, code: i32) {
        self.out.extend(server_frame(
            true,
            0x1,
            format!(r#"{{"type":"exit","code":{code}}}"#).as_bytes(),
        ));
        self.out.extend(server_frame(true, 0x8, &[]));
    }

    fn inputs(&self) -> Vec<u8> {
        self.received
            .iter()
            .filter(|(o, _)| *o == Opcode::Binary)
            .flat_map(|(_, p)| p.clone())
            .collect()
    }

    fn close_code(&self) -> Option<u16> {
        self.received
            .iter()
            .find(|(o, _)| *o == Opcode::Close)
            .map(|(_, p)| u16::from_be_bytes([p[0], p[1]]))
    }
}

/// What a blocking `next(timeout)` returned, owned.
#[derive(Debug, PartialEq, Eq)]
enum Pulled {
    Output(Vec<u8>),
    Closed(Result<TerminalExit, Error>),
    TimedOut(Error),
}

/// Client, worker, two one-way links and the virtual clock.
struct Sim {
    now: Instant,
    start: Instant,
    client: TerminalSession,
    worker: FakeWorker,
    to_worker: VecDeque<(Instant, Vec<u8>)>,
    /// `None` is the worker ending the TCP stream.
    to_client: VecDeque<(Instant, Option<Vec<u8>>)>,
    latency: Duration,
    max_chunk: usize,
    rng: u64,
    steps: usize,
}

impl Sim {
    fn new(
        spec: &TerminalSpec,
        config: TerminalConfig,
        latency: Duration,
        max_chunk: usize,
        seed: u64,
    ) -> Self {
        let now = t0();
        let mut client = TerminalSession::new(spec, config, [seed as u8; 16], now).unwrap();
        client.handle_entropy(&entropy(seed, 4_096));
        Self {
            now,
            start: now,
            client,
            worker: FakeWorker::new(),
            to_worker: VecDeque::new(),
            to_client: VecDeque::new(),
            latency,
            max_chunk,
            rng: seed | 1,
            steps: 0,
        }
    }

    fn default(spec: &TerminalSpec) -> Self {
        Self::new(
            spec,
            TerminalConfig::new("localhost", "dev"),
            ms(5),
            4_096,
            7,
        )
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn rand(&mut self) -> u64 {
        // xorshift64: deterministic read chunking.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Moves both sides' output onto the links.
    fn flush(&mut self) {
        let wanted = self.client.entropy_wanted();
        if wanted > 0 {
            let seed = self.rand();
            self.client.handle_entropy(&entropy(seed, wanted));
        }
        let mut out = Vec::new();
        let _ = self.client.poll_transmit(&mut out);
        // The simulated socket takes every byte at once.
        self.client.handle_written(self.now, out.len());
        if !out.is_empty() {
            self.to_worker.push_back((self.now + self.latency, out));
        }
        let out = std::mem::take(&mut self.worker.out);
        let mut rest = &out[..];
        while !rest.is_empty() {
            let n = (self.rand() as usize % self.max_chunk + 1).min(rest.len());
            self.to_client
                .push_back((self.now + self.latency, Some(rest[..n].to_vec())));
            rest = &rest[n..];
        }
    }

    fn worker_eof(&mut self) {
        self.flush();
        self.to_client.push_back((self.now + self.latency, None));
    }

    /// Runs the world until virtual time `until` (deliveries and timers in
    /// time order). Returns early after the first delivery to the client
    /// when `stop_on_delivery` is set.
    fn run_until(&mut self, until: Instant, stop_on_delivery: bool) {
        loop {
            self.steps += 1;
            assert!(self.steps < 1_000_000, "livelock");
            self.flush();
            let candidates = [
                self.to_worker.front().map(|(t, _)| *t),
                self.to_client.front().map(|(t, _)| *t),
                self.client.poll_timeout().map(|(t, _)| t),
            ];
            let Some(t) = candidates.into_iter().flatten().min() else {
                self.now = self.now.max(until);
                return;
            };
            if t > until {
                self.now = self.now.max(until);
                return;
            }
            self.now = self.now.max(t);
            let mut delivered = false;
            while self.to_worker.front().is_some_and(|(t, _)| *t <= self.now) {
                let (_, bytes) = self.to_worker.pop_front().unwrap();
                self.worker.handle(&bytes);
            }
            while self.to_client.front().is_some_and(|(t, _)| *t <= self.now) {
                match self.to_client.pop_front().unwrap().1 {
                    Some(bytes) => self.client.handle_input(self.now, &bytes).unwrap(),
                    None => self.client.handle_eof(self.now),
                }
                delivered = true;
            }
            if self
                .client
                .poll_timeout()
                .is_some_and(|(t, _)| t <= self.now)
            {
                self.client.handle_timeout(self.now);
                delivered = true;
            }
            if delivered && stop_on_delivery {
                return;
            }
        }
    }

    /// A consumer that does not pull for longer than the read grace (the
    /// open counts as a pull) while everything in flight arrives.
    fn stall(&mut self) {
        let limit = self.now + READ_GRACE + self.latency * 4;
        self.run_until(limit, false);
    }

    /// Runs until nothing is in flight (and no timer is due before `limit`).
    fn settle(&mut self) {
        let limit = self.now + self.latency * 4;
        self.run_until(limit, false);
    }

    /// A shell's blocking `next(timeout)`, on virtual time.
    fn next(&mut self, timeout: Duration) -> Pulled {
        let until = self.client.begin_next(self.now, timeout).unwrap();
        loop {
            self.flush();
            match self.client.next(self.now, until) {
                Next::Output(b) => return Pulled::Output(b.to_vec()),
                Next::Closed(r) => return Pulled::Closed(r),
                Next::TimedOut(e) => return Pulled::TimedOut(e),
                Next::Pending(at) => {
                    assert!(
                        at > self.now || at == until,
                        "a pending wake must be in the future"
                    );
                    self.run_until(at, true);
                }
            }
        }
    }

    /// Reads output until the session closes; returns (output, outcome).
    fn read_to_end(&mut self) -> (Vec<u8>, Result<TerminalExit, Error>) {
        let mut all = Vec::new();
        loop {
            match self.next(ms(900_000)) {
                Pulled::Output(b) => all.extend(b),
                Pulled::Closed(r) => return (all, r),
                Pulled::TimedOut(e) => panic!("unexpected wait timeout {e:?}"),
            }
        }
    }

    /// Opens the session (handshake through the links).
    fn open(&mut self) {
        self.run_until(self.now + self.latency * 3, false);
        assert!(self.client.is_open());
    }
}

fn entropy(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn spec() -> TerminalSpec {
    TerminalSpec {
        session_budget: ms(60_000),
        idle_budget: ms(60_000),
        attach_wait: ms(30_000),
        ..TerminalSpec::default()
    }
}

fn outcome_err(r: Result<TerminalExit, Error>) -> Error {
    r.expect_err("an uncertain outcome")
}

#[test]
fn output_survives_any_chunking_and_latency() {
    let payloads: Vec<Vec<u8>> = (0..40u32)
        .map(|i| (0..(i * 997 % 5_000 + 1)).map(|j| (i + j) as u8).collect())
        .collect();
    let expected: Vec<u8> = payloads.concat();
    for (seed, chunk, latency) in [
        (1, 1, 0),
        (2, 3, 1),
        (3, 100, 7),
        (4, 4_096, 50),
        (5, 65_536, 2),
        (6, 17, 1_000),
    ] {
        let mut sim = Sim::new(
            &spec(),
            TerminalConfig::new("localhost", "dev"),
            ms(latency),
            chunk,
            seed,
        );
        sim.open();
        for p in &payloads {
            sim.worker.output(p);
        }
        sim.worker.exit(0);
        let (out, outcome) = sim.read_to_end();
        assert_eq!(out, expected, "seed {seed} chunk {chunk}");
        assert_eq!(outcome, Ok(TerminalExit { code: 0 }));
        sim.settle();
        assert!(sim.client.is_transport_finished());
        assert_eq!(
            sim.worker.received.last().map(|(o, _)| *o),
            Some(Opcode::Close),
            "close echoed"
        );
    }
}

#[test]
fn stalled_consumer_unread_bytes_at_n_and_n_plus_one() {
    for (extra, overflow) in [(0usize, false), (1, true)] {
        let spec = TerminalSpec {
            max_buffer_bytes: 1_024,
            ..spec()
        };
        let mut sim = Sim::new(&spec, TerminalConfig::new("localhost", "dev"), ms(3), 5, 11);
        sim.open();
        sim.client.attach(sim.now);
        sim.worker.output(&[b'a'; 1_000]);
        sim.worker.output(&vec![b'b'; 24 + extra]);
        sim.worker.exit(0);
        sim.stall(); // the consumer is stalled while all of it arrives
        let (out, outcome) = sim.read_to_end();
        if overflow {
            assert_eq!(out, vec![b'a'; 1_000], "queued output stays readable");
            let e = outcome_err(outcome);
            assert_eq!(
                (e.category(), e.evidence(), e.reason()),
                (
                    Category::OutputLimit,
                    Evidence::Unknown,
                    Reason::UnreadOutputBytes
                )
            );
            assert_eq!(e.exit_code(), None, "never a fabricated exit");
            assert_eq!(e.limit().unwrap().actual, 1_025);
            assert_eq!(sim.worker.close_code(), Some(1008));
        } else {
            assert_eq!(out.len(), 1_024);
            assert_eq!(outcome, Ok(TerminalExit { code: 0 }));
        }
    }
}

#[test]
fn stalled_consumer_unread_chunks_at_n_and_n_plus_one() {
    for (chunks, overflow) in [(1_024usize, false), (1_025, true)] {
        let mut sim = Sim::default(&spec());
        sim.open();
        sim.client.attach(sim.now);
        for _ in 0..chunks {
            sim.worker.output(b"x");
        }
        sim.worker.exit(3);
        sim.stall();
        assert_eq!(sim.client.unread_chunks(), chunks.min(1_024));
        let (out, outcome) = sim.read_to_end();
        assert_eq!(out.len(), chunks.min(1_024));
        if overflow {
            assert_eq!(outcome_err(outcome).reason(), Reason::UnreadOutputChunks);
        } else {
            assert_eq!(outcome, Ok(TerminalExit { code: 3 }));
        }
    }
}

#[test]
fn frame_cap_follows_the_buffer_at_n_and_n_plus_one() {
    for (len, ok) in [(1_024usize, true), (1_025, false)] {
        let spec = TerminalSpec {
            max_buffer_bytes: 1_024,
            ..spec()
        };
        let mut sim = Sim::default(&spec);
        sim.open();
        sim.worker.output(&vec![1; len]);
        sim.worker.exit(0);
        let (out, outcome) = sim.read_to_end();
        if ok {
            assert_eq!((out.len(), outcome), (1_024, Ok(TerminalExit { code: 0 })));
        } else {
            let e = outcome_err(outcome);
            assert_eq!(
                (e.category(), e.reason(), e.operation()),
                (
                    Category::OutputLimit,
                    Reason::FrameTooLarge,
                    Operation::TerminalOutput
                )
            );
            sim.settle();
            assert_eq!(sim.worker.close_code(), Some(1009));
        }
    }
}

#[test]
fn per_input_cap_at_n_and_n_plus_one() {
    let spec = TerminalSpec {
        max_input_bytes: 10,
        ..spec()
    };
    let mut sim = Sim::default(&spec);
    sim.open();
    let now = sim.now;
    assert!(sim.client.input(now, &[b'k'; 10]).is_ok());
    let e = sim.client.input(now, &[b'k'; 11]).unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence()),
        (
            Category::Validation,
            Operation::TerminalInput,
            Evidence::NotDispatched
        )
    );
    assert_eq!(
        sim.client.input(now, b"").unwrap_err().category(),
        Category::Validation
    );
    sim.settle();
    assert_eq!(
        sim.worker.inputs(),
        vec![b'k'; 10],
        "the refused input never left"
    );
    assert!(
        sim.client.outcome().is_none(),
        "a refused input does not end the session"
    );
}

#[test]
fn cumulative_input_and_resize_cap_at_n_and_n_plus_one() {
    let resize_len = r#"{"type":"resize","cols":120,"rows":40}"#.len() as u64;
    for (last, over) in [(10usize, false), (11, true)] {
        let mut config = TerminalConfig::new("localhost", "dev");
        config.max_request_bytes = 50 + resize_len + 10;
        let mut sim = Sim::new(&spec(), config, ms(2), 64, 3);
        sim.open();
        let now = sim.now;
        sim.client.input(now, &[b'a'; 50]).unwrap();
        sim.client.resize(now, 120, 40).unwrap();
        let r = sim.client.input(now, &vec![b'b'; last]);
        sim.settle();
        if over {
            let e = r.unwrap_err();
            assert_eq!(
                (e.category(), e.evidence(), e.reason()),
                (
                    Category::OutputLimit,
                    Evidence::Unknown,
                    Reason::CumulativeInput
                )
            );
            assert_eq!(e.limit().unwrap().actual, 50 + resize_len + 11);
            assert_eq!(
                sim.worker.inputs().len(),
                50,
                "the input over the cap never left"
            );
            assert_eq!(sim.worker.close_code(), Some(1008));
            let (_, outcome) = sim.read_to_end();
            assert_eq!(outcome_err(outcome), e);
        } else {
            r.unwrap();
            assert_eq!(sim.client.sent_bytes(), 50 + resize_len + 10);
            assert_eq!(sim.worker.inputs().len(), 60);
            let resize = sim
                .worker
                .received
                .iter()
                .find(|(o, _)| *o == Opcode::Text)
                .unwrap();
            assert_eq!(resize.1, br#"{"type":"resize","cols":120,"rows":40}"#);
        }
    }
}

#[test]
fn session_budget_ends_at_exactly_its_deadline() {
    let spec = TerminalSpec {
        session_budget: ms(2_000),
        idle_budget: ms(2_000),
        ..spec()
    };
    let mut sim = Sim::default(&spec);
    sim.open();
    sim.client.attach(sim.now);
    assert_eq!(
        sim.client.poll_timeout(),
        Some((sim.start + ms(1_000), TerminalTimer::Liveness)),
        "a keepalive ping at half the idle budget"
    );
    sim.run_until(sim.start + ms(1_500), false);
    assert_eq!(
        sim.client.poll_timeout(),
        Some((sim.start + ms(2_000), TerminalTimer::Session)),
        "session wins the tie with idle and liveness"
    );
    sim.run_until(sim.start + ms(2_000) - Duration::from_nanos(1), false);
    assert!(sim.client.outcome().is_none());
    let (_, outcome) = sim.read_to_end();
    let e = outcome_err(outcome);
    assert_eq!(
        (e.category(), e.operation(), e.evidence()),
        (
            Category::Expired,
            Operation::TerminalSession,
            Evidence::Unknown
        )
    );
    assert_eq!(sim.elapsed(), ms(2_000));
    sim.settle();
    assert_eq!(sim.worker.close_code(), Some(1001));
}

#[test]
fn idle_budget_moves_with_activity() {
    let spec = TerminalSpec {
        session_budget: ms(10_000),
        idle_budget: ms(1_000),
        ..spec()
    };
    let mut sim = Sim::new(&spec, TerminalConfig::new("localhost", "dev"), ms(0), 64, 9);
    sim.open();
    sim.client.attach(sim.now);
    sim.run_until(sim.start + ms(600), false);
    sim.client.input(sim.now, b"k").unwrap(); // activity at 600 ms
    sim.run_until(sim.start + ms(1_599), false);
    assert!(
        sim.client.outcome().is_none(),
        "idle counts from the last activity"
    );
    sim.worker.output(b"o"); // activity at 1,599 ms
    sim.run_until(sim.start + ms(2_598), false);
    assert!(sim.client.outcome().is_none());
    let (out, outcome) = sim.read_to_end();
    assert_eq!(out, b"o");
    let e = outcome_err(outcome);
    assert_eq!(
        (e.category(), e.operation()),
        (Category::Expired, Operation::TerminalIdle)
    );
    assert_eq!(sim.elapsed(), ms(2_599));
}

#[test]
fn attach_wait_needs_a_consumer_in_time() {
    let spec = TerminalSpec {
        attach_wait: ms(100),
        ..spec()
    };
    // Nobody pulls: the session ends at exactly 100 ms.
    let mut sim = Sim::default(&spec);
    sim.run_until(sim.start + ms(99), false);
    assert!(sim.client.outcome().is_none());
    sim.run_until(sim.start + ms(200), false);
    let e = outcome_err(sim.client.outcome().unwrap());
    assert_eq!(
        (e.category(), e.operation()),
        (Category::Expired, Operation::TerminalConsumer)
    );
    // A consumer at 99 ms keeps it alive.
    let mut sim = Sim::default(&spec);
    sim.run_until(sim.start + ms(99), false);
    assert_eq!(sim.next(ms(0)), Pulled::TimedOut(sim_wait_timeout()));
    sim.run_until(sim.start + ms(5_000), false);
    assert!(sim.client.outcome().is_none());
    // Losing the consumer ends it with terminal_consumer.
    sim.client.detach(sim.now);
    let e = outcome_err(sim.client.outcome().unwrap());
    assert_eq!(
        (e.category(), e.operation()),
        (Category::Unknown, Operation::TerminalConsumer)
    );
}

fn sim_wait_timeout() -> Error {
    Error::expired(
        Operation::TerminalOutput,
        Evidence::Unknown,
        Reason::WaitTimeout,
    )
}

#[test]
fn next_timeout_ends_the_wait_not_the_session() {
    let mut sim = Sim::default(&spec());
    sim.open();
    let before = sim.now;
    assert_eq!(sim.next(ms(250)), Pulled::TimedOut(sim_wait_timeout()));
    assert_eq!(sim.now - before, ms(250));
    assert!(sim.client.outcome().is_none());
    sim.worker.output(b"later");
    assert_eq!(sim.next(ms(1_000)), Pulled::Output(b"later".to_vec()));
    // A zero wait returns at once.
    assert_eq!(sim.next(ms(0)), Pulled::TimedOut(sim_wait_timeout()));
}

/// One `next` may wait at most `MAX_NEXT_WAIT` (900 s): that wait is
/// accepted, a nanosecond more is refused before anything waits.
#[test]
fn one_next_wait_at_n_and_n_plus_one() {
    let sim = Sim::default(&spec());
    let max = smolbox_core::terminal::MAX_NEXT_WAIT;
    assert_eq!(max, Duration::from_secs(900));
    assert_eq!(sim.client.wait_deadline(sim.now, max), Ok(sim.now + max));
    let e = sim
        .client
        .wait_deadline(sim.now, max + Duration::from_nanos(1))
        .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.operation(), e.reason()),
        (
            Category::Validation,
            Evidence::NotDispatched,
            Operation::TerminalOutput,
            Reason::WaitOutOfRange
        )
    );
}

#[test]
fn close_wait_at_n_and_n_plus_one() {
    let spec = TerminalSpec {
        close_wait: ms(100),
        ..spec()
    };
    // The worker's close arrives within the close wait (2 × 49 ms latency).
    let mut sim = Sim::new(
        &spec,
        TerminalConfig::new("localhost", "dev"),
        ms(49),
        64,
        5,
    );
    sim.open();
    sim.client.close(sim.now);
    let (_, outcome) = sim.read_to_end();
    let e = outcome_err(outcome);
    assert_eq!(
        (e.category(), e.operation(), e.reason()),
        (
            Category::Unknown,
            Operation::TerminalClose,
            Reason::ClosedByClient
        )
    );
    // It does not answer: expired at exactly close wait.
    let mut sim = Sim::new(
        &spec,
        TerminalConfig::new("localhost", "dev"),
        ms(49),
        64,
        5,
    );
    sim.worker.echo_close = false;
    sim.open();
    let closed_at = sim.now;
    sim.client.close(sim.now);
    assert_eq!(
        sim.client.poll_timeout(),
        Some((closed_at + ms(100), TerminalTimer::Close))
    );
    let (_, outcome) = sim.read_to_end();
    let e = outcome_err(outcome);
    assert_eq!(
        (e.category(), e.operation()),
        (Category::Expired, Operation::TerminalClose)
    );
    assert_eq!(sim.now - closed_at, ms(100));
}

#[test]
fn exit_without_close_waits_close_wait() {
    let spec = TerminalSpec {
        close_wait: ms(300),
        ..spec()
    };
    let mut sim = Sim::default(&spec);
    sim.open();
    sim.worker
        .out
        .extend(server_frame(true, 0x1, br#"{"type":"exit","code":0}"#));
    let (_, outcome) = sim.read_to_end();
    let e = outcome_err(outcome);
    assert_eq!(
        (e.category(), e.operation()),
        (Category::Expired, Operation::TerminalClose)
    );
}

#[test]
fn timers_due_together_fire_in_c7_3_order() {
    // close wait beats the session budget at the same instant.
    let spec = TerminalSpec {
        session_budget: ms(1_000),
        idle_budget: ms(1_000),
        close_wait: ms(500),
        attach_wait: ms(1_000),
        ..spec()
    };
    let mut sim = Sim::new(&spec, TerminalConfig::new("localhost", "dev"), ms(0), 64, 1);
    sim.worker.echo_close = false;
    sim.open();
    sim.run_until(sim.start + ms(500), false);
    sim.client.close(sim.now);
    sim.run_until(sim.start + ms(1_000), false);
    assert_eq!(
        outcome_err(sim.client.outcome().unwrap()).operation(),
        Operation::TerminalClose
    );
    // session beats consumer and idle.
    let mut sim = Sim::new(&spec, TerminalConfig::new("localhost", "dev"), ms(0), 64, 1);
    sim.open();
    sim.run_until(sim.start + ms(1_000), false);
    assert_eq!(
        outcome_err(sim.client.outcome().unwrap()).operation(),
        Operation::TerminalSession
    );
    // consumer beats idle.
    let spec = TerminalSpec {
        session_budget: ms(5_000),
        ..spec
    };
    let mut sim = Sim::new(&spec, TerminalConfig::new("localhost", "dev"), ms(0), 64, 1);
    sim.open();
    sim.run_until(sim.start + ms(1_000), false);
    assert_eq!(
        outcome_err(sim.client.outcome().unwrap()).operation(),
        Operation::TerminalConsumer
    );
}

#[test]
fn exit_codes_confirmed_or_uncertain() {
    for (code, confirmed) in [
        (0, true),
        (1, true),
        (123, true),
        (124, false),
        (125, true),
        (129, true),
        (130, false),
        (131, true),
        (255, true),
        (-1, false),
        (256, false),
    ] {
        let mut sim = Sim::default(&spec());
        sim.open();
        sim.worker.output(b"bye");
        sim.worker.exit(code);
        let (out, outcome) = sim.read_to_end();
        assert_eq!(out, b"bye");
        if confirmed {
            assert_eq!(outcome, Ok(TerminalExit { code }), "{code}");
        } else {
            let e = outcome_err(outcome);
            assert_eq!(e.evidence(), Evidence::Unknown, "{code}");
        }
    }
}

#[test]
fn contract_breaks_make_the_outcome_uncertain() {
    let cases: Vec<(Vec<u8>, Reason)> = vec![
        // Output after the exit frame.
        (
            [
                server_frame(true, 0x1, br#"{"type":"exit","code":0}"#),
                server_frame(true, 0x2, b"more"),
                server_frame(true, 0x8, &[]),
            ]
            .concat(),
            Reason::OutputAfterExit,
        ),
        // Any other text frame.
        (
            server_frame(true, 0x1, br#"{"type":"stdin","data":"x"}"#),
            Reason::UnexpectedTextFrame,
        ),
        // A close before any exit.
        (
            server_frame(true, 0x8, &[0x03, 0xe8]),
            Reason::ClosedWithoutExit,
        ),
        // A second exit.
        (
            [
                server_frame(true, 0x1, br#"{"type":"exit","code":0}"#),
                server_frame(true, 0x1, br#"{"type":"exit","code":0}"#),
            ]
            .concat(),
            Reason::TextAfterExit,
        ),
    ];
    for (bytes, reason) in cases {
        let mut sim = Sim::default(&spec());
        sim.open();
        sim.worker.out.extend(bytes);
        let (_, outcome) = sim.read_to_end();
        let e = outcome_err(outcome);
        assert_eq!(
            (e.reason(), e.evidence(), e.exit_code()),
            (reason, Evidence::Unknown, None)
        );
    }
    // TCP end without a close frame, even after an exit.
    for exit_first in [false, true] {
        let mut sim = Sim::default(&spec());
        sim.open();
        if exit_first {
            sim.worker
                .out
                .extend(server_frame(true, 0x1, br#"{"type":"exit","code":0}"#));
        }
        sim.worker_eof();
        let (_, outcome) = sim.read_to_end();
        let e = outcome_err(outcome);
        assert_eq!(
            (e.category(), e.reason(), e.evidence()),
            (
                Category::Transport,
                Reason::AbnormalClose,
                Evidence::Unknown
            )
        );
    }
}

#[test]
fn pings_are_answered_and_nothing_follows_the_close() {
    let mut sim = Sim::default(&spec());
    sim.open();
    sim.worker.out.extend(server_frame(true, 0x9, b"keepalive"));
    sim.settle();
    assert_eq!(
        sim.worker.received,
        vec![(Opcode::Pong, b"keepalive".to_vec())]
    );
    sim.worker.exit(0);
    let (_, outcome) = sim.read_to_end();
    assert_eq!(outcome, Ok(TerminalExit { code: 0 }));
    assert!(sim.client.input(sim.now, b"x").is_err());
    assert!(sim.client.resize(sim.now, 10, 10).is_err());
    sim.worker.out.extend(server_frame(true, 0x9, b"late"));
    sim.settle();
    assert_eq!(
        sim.worker.received.last().unwrap().0,
        Opcode::Close,
        "no pong after the close"
    );
}

#[test]
fn the_workers_close_code_and_reason_reach_the_outcome() {
    let mut sim = Sim::default(&spec());
    sim.open();
    let mut payload = 1011u16.to_be_bytes().to_vec();
    payload.extend_from_slice("agent lost: pty ✗".as_bytes());
    sim.worker.out.extend(server_frame(true, 0x8, &payload));
    let (_, outcome) = sim.read_to_end();
    let e = outcome_err(outcome);
    assert_eq!(
        (e.reason(), e.close_code(), e.evidence()),
        (Reason::ClosedWithoutExit, Some(1011), Evidence::Unknown)
    );
    let info = sim.client.peer_close().unwrap();
    assert_eq!(info.code.map(|c| c.as_u16()), Some(1011));
    assert_eq!(info.reason.as_str(), "agent lost: pty ✗");
    // Neither the error nor the session's Debug prints the reason text.
    assert!(!format!("{e:?} {e} {:?}", sim.client).contains("agent"));
}

#[test]
fn our_close_frame_carries_the_fixed_reason_code_only() {
    let mut sim = Sim::default(&spec());
    sim.open();
    sim.worker.output(b"secret terminal bytes");
    let (_, outcome) = sim.read_to_end();
    assert_eq!(outcome_err(outcome).reason(), Reason::SessionBudget);
    sim.settle();
    let close = sim
        .worker
        .received
        .iter()
        .find(|(o, _)| *o == Opcode::Close)
        .map(|(_, p)| p.clone())
        .unwrap();
    let mut want = 1001u16.to_be_bytes().to_vec();
    want.extend_from_slice(b"session_budget");
    assert_eq!(close, want);
}

#[test]
fn a_silent_peer_ends_the_session_within_the_idle_budget_while_the_consumer_types() {
    let spec = TerminalSpec {
        session_budget: ms(60_000),
        idle_budget: ms(1_000),
        ..spec()
    };
    for answer in [true, false] {
        let mut sim = Sim::new(&spec, TerminalConfig::new("localhost", "dev"), ms(0), 64, 3);
        sim.worker.answer_pings = answer;
        sim.open();
        sim.client.attach(sim.now);
        // The consumer types every 300 ms: the session's idle budget never
        // runs out; only the peer's silence can end it.
        let rounds = if answer { 10u64 } else { 3 };
        for i in 1..=rounds {
            sim.run_until(sim.start + ms(300 * i), false);
            sim.client.input(sim.now, b"k").unwrap();
        }
        if answer {
            assert!(sim.client.outcome().is_none(), "a peer that pongs is alive");
            let pings = sim
                .worker
                .received
                .iter()
                .filter(|(o, _)| *o == Opcode::Ping)
                .count();
            assert!(pings >= 5, "one ping per half idle budget, got {pings}");
            continue;
        }
        let (_, outcome) = sim.read_to_end();
        let e = outcome_err(outcome);
        assert_eq!(
            (e.category(), e.reason(), e.evidence()),
            (Category::Transport, Reason::IdleTimeout, Evidence::Unknown)
        );
        // A ping at 500 ms, unanswered; the end at exactly 1,000 ms after
        // the last byte received (the 101 at t = 0).
        assert_eq!(sim.elapsed(), ms(1_000));
        let pings = sim
            .worker
            .received
            .iter()
            .filter(|(o, _)| *o == Opcode::Ping)
            .count();
        assert_eq!(pings, 1);
        sim.settle();
        assert_eq!(sim.worker.close_code(), Some(1001));
    }
}

#[test]
fn empty_output_frames_do_not_keep_an_idle_session_alive() {
    let spec = TerminalSpec {
        session_budget: ms(60_000),
        idle_budget: ms(1_000),
        ..spec()
    };
    let mut sim = Sim::new(&spec, TerminalConfig::new("localhost", "dev"), ms(0), 64, 5);
    sim.open();
    sim.client.attach(sim.now);
    for i in 1..=4u64 {
        sim.run_until(sim.start + ms(200 * i), false);
        sim.worker.output(b"");
    }
    let (_, outcome) = sim.read_to_end();
    let e = outcome_err(outcome);
    assert_eq!(
        (e.category(), e.operation(), e.reason()),
        (
            Category::Expired,
            Operation::TerminalIdle,
            Reason::IdleBudget
        )
    );
    assert_eq!(sim.elapsed(), ms(1_000));
}
