//! [`Client`]: one verified worker operation per call.

use std::sync::Arc;
use std::time::Instant;

use smolbox_core::Error;
use smolbox_core::exec::{
    self, Command, ExecCall, ExecOutcome, ExecOutput, ExecStreamCall, OutputAllowance,
};
use smolbox_core::http1::Pulled;
use smolbox_core::worker::{
    Capacity, CapacityReply, Create, Delete, Endpoint, Get, Health, HealthReply, List, MachineName,
    MachineSpec, Measure, Measurements, Metrics, Observation, OperationDeadlines, Profile, Readyz,
    Start, Stop, WorkerCall,
};
use smolbox_core::worker::{
    Download, ImageCheck, Logs, Upload, UploadReply, VolumeCreate, VolumeDelete,
};

use crate::callback::CallbackPool;
use crate::http::Exchange;
use crate::pool::{MAX_CONNECTIONS, Pool};
use crate::stream::{ExecEvent, ExecStream, run_with_callback};
use crate::transport::SocketTarget;

/// The blocking worker client. Cheap to clone (clones share one connection
/// pool of at most [`MAX_CONNECTIONS`]); `Send + Sync`, so several threads
/// may call it at once.
///
/// Every operation runs on the calling thread under the endpoint's budgets,
/// fixed when the call starts: pool checkout, connect (both inside the
/// operation deadline), receive idle, the overall operation deadline, and
/// the request and response byte caps. Nothing is retried, no redirect is
/// followed and no reply is decompressed. A failure is a
/// [`smolbox_core::Error`]; its evidence is `not_dispatched` only when not
/// one request byte was written.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    endpoint: Endpoint,
    pool: Arc<Pool>,
    callbacks: CallbackPool,
}

impl Client {
    /// A client for `endpoint`. Reads the TLS files (CA, client identity)
    /// once; opens no connection.
    ///
    /// # Errors
    /// `validation` (operation `config`) when a file is missing, not a
    /// regular file, or cannot be parsed; `unsupported_capability` for HTTPS
    /// without a CA file (no system roots are consulted).
    pub fn new(endpoint: Endpoint) -> Result<Self, Error> {
        let target = SocketTarget::of(&endpoint)?;
        Ok(Self {
            inner: Arc::new(Inner {
                endpoint,
                pool: Arc::new(Pool::new(target, MAX_CONNECTIONS)),
                callbacks: CallbackPool::default(),
            }),
        })
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.endpoint
    }

    /// Performs one worker operation: sends `call`'s request and decodes and
    /// validates the reply with `call`.
    ///
    /// # Errors
    /// The call's validation errors (nothing sent), transport failures, and
    /// the decode errors of the call (status, media type, contract).
    pub fn call<C: WorkerCall + ?Sized>(&self, call: &C) -> Result<C::Output, Error> {
        self.call_within(call, self.deadlines(Instant::now()))
    }

    /// [`call`](Self::call) within deadlines already running.
    fn call_within<C: WorkerCall + ?Sized>(
        &self,
        call: &C,
        deadlines: OperationDeadlines,
    ) -> Result<C::Output, Error> {
        let mut exchange = self.send(call, deadlines)?;
        let head = exchange.head()?;
        let mut body = Vec::new();
        exchange.read_body(&mut body)?;
        call.decode(&head, &body)
    }

    /// Sends `call`'s request on a pooled connection, configured by core
    /// for that call and this endpoint. A call that needs an image machine
    /// (core's [`WorkerCall::image_check`]) first inspects it within the
    /// same deadlines; the call is sent only when core admits the result.
    fn send<C: WorkerCall + ?Sized>(
        &self,
        call: &C,
        deadlines: OperationDeadlines,
    ) -> Result<Exchange, Error> {
        if let Some(check) = call.image_check() {
            self.image_preflight(check, deadlines)?;
        }
        let (request, config) = self.inner.endpoint.prepare(call, deadlines.operation)?;
        Exchange::start(&self.inner.pool, &request, &config, deadlines)
    }

    /// Performs `check`'s inspect within `deadlines` and returns core's
    /// verdict on it (C5.4, C6.1, C7.4).
    pub(crate) fn image_preflight(
        &self,
        check: &ImageCheck,
        deadlines: OperationDeadlines,
    ) -> Result<(), Error> {
        check.admit(self.call_within(check.inspect(), deadlines))
    }

    /// The worker's version profile, from a `GET /health` preflight inside
    /// the caller's operation deadline (an unknown version is refused:
    /// `unsupported_capability`, nothing else sent).
    pub(crate) fn preflight(&self, deadlines: OperationDeadlines) -> Result<Profile, Error> {
        Profile::preflight(self.call_within(&Health::new(), deadlines))
    }

    /// `GET /health`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn health(&self) -> Result<HealthReply, Error> {
        self.call(&Health::new())
    }

    /// `GET /health`, then the profile of the reported version: a known one,
    /// or one of `supplied` (an unknown version is refused with
    /// `unsupported_capability`).
    ///
    /// # Errors
    /// As [`call`](Self::call), and the core's admission errors.
    pub fn admit(&self, supplied: &[Profile]) -> Result<Profile, Error> {
        let health = self.health()?;
        Profile::admit(&health.version, supplied)
    }

    /// `GET /readyz` (exactly 200 with an empty body).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn readyz(&self) -> Result<(), Error> {
        self.call(&Readyz)
    }

    /// `GET /capacity`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn capacity(&self) -> Result<CapacityReply, Error> {
        self.call(&Capacity)
    }

    /// `GET /metrics`: the text, uninterpreted.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn metrics(&self) -> Result<String, Error> {
        self.call(&Metrics)
    }

    /// `POST /api/v1/machines`: creates `name` from `spec` and checks that
    /// the reply matches the request.
    ///
    /// # Errors
    /// As [`call`](Self::call); spec and profile errors before sending.
    pub fn create(
        &self,
        profile: &Profile,
        name: MachineName,
        spec: &MachineSpec,
    ) -> Result<Observation, Error> {
        self.call(&Create::new(profile, name, spec)?)
    }

    /// `GET /api/v1/machines` (≤ 1,024 entries).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn list(&self, profile: &Profile) -> Result<Vec<Observation>, Error> {
        self.call(&List::new(profile))
    }

    /// `GET /api/v1/machines/{name}` (never starts the machine).
    ///
    /// # Errors
    /// As [`call`](Self::call); `not_found` when absent.
    pub fn get(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.call(&Get::new(profile, name))
    }

    /// The machine's measurements, from the same single GET.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn measure(&self, profile: &Profile, name: MachineName) -> Result<Measurements, Error> {
        self.call(&Measure::new(profile, name))
    }

    /// `POST /api/v1/machines/{name}/start`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn start(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.call(&Start::new(profile, name))
    }

    /// `POST /api/v1/machines/{name}/stop`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn stop(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.call(&Stop::new(profile, name))
    }

    /// `DELETE /api/v1/machines/{name}` (only `{"deleted": name}` succeeds).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn delete(&self, name: MachineName) -> Result<(), Error> {
        self.call(&Delete::new(name))
    }

    /// Buffered exec (`POST …/exec`) with the default output allowance: a
    /// foreground command's exit (any exit code is a result) or a background
    /// command's launch acknowledgement.
    ///
    /// # Errors
    /// Command validation before sending; transport, status and decode
    /// errors after (an output overflow is `output_limit` with evidence
    /// `exited` and the exit code).
    pub fn exec(&self, machine: &str, command: &Command) -> Result<ExecOutcome, Error> {
        self.exec_with_allowance(machine, command, OutputAllowance::DEFAULT)
    }

    /// [`exec`](Self::exec) with an explicit output allowance.
    ///
    /// # Errors
    /// As [`exec`](Self::exec).
    pub fn exec_with_allowance(
        &self,
        machine: &str,
        command: &Command,
        allowance: OutputAllowance,
    ) -> Result<ExecOutcome, Error> {
        let deadlines = self.deadlines(Instant::now());
        let profile = self.preflight(deadlines)?;
        let call = ExecCall::new(&profile, machine, command.clone(), allowance)?;
        self.call_within(&call, deadlines)
    }

    /// Streamed exec (`POST …/exec/stream`): returns once the 200
    /// `text/event-stream` head was read; events are pulled from the
    /// [`ExecStream`] iterator. The output allowance is the default (1 MiB).
    ///
    /// # Errors
    /// Command validation (stdin and background are refused) before
    /// sending; transport and status errors.
    pub fn exec_stream(&self, machine: &str, command: &Command) -> Result<ExecStream, Error> {
        self.exec_stream_with_allowance(machine, command, OutputAllowance::DEFAULT)
    }

    /// [`exec_stream`](Self::exec_stream) with an explicit output allowance.
    ///
    /// # Errors
    /// As [`exec_stream`](Self::exec_stream).
    pub fn exec_stream_with_allowance(
        &self,
        machine: &str,
        command: &Command,
        allowance: OutputAllowance,
    ) -> Result<ExecStream, Error> {
        let deadlines = self.deadlines(Instant::now());
        let profile = self.preflight(deadlines)?;
        let call = ExecStreamCall::new(&profile, machine, command.clone(), allowance)?;
        let exchange = self.send(&call, deadlines)?;
        ExecStream::open_call(exchange, &call)
    }

    /// Streamed exec observed by a synchronous `callback`, one event at a
    /// time, with back-pressure: a slow callback slows reading. Returns the
    /// captured output (tagged lossy UTF-8) and exit code. A callback that
    /// panics is detached and capture continues; one that blocks is
    /// abandoned at the operation deadline and the call fails with
    /// `transport`/`dispatch_uncertain` (`callback_deadline`).
    ///
    /// The loop runs on the calling thread; the callback runs on one of the
    /// client's reusable delivery threads (see [`MAX_DELIVERY_THREADS`]),
    /// which is what lets the deadline cut a blocked callback off without a
    /// thread per operation.
    ///
    /// # Errors
    /// As [`exec_stream`](Self::exec_stream), plus the stream's errors;
    /// `admission_exhausted`/`not_dispatched` (nothing sent) when every
    /// delivery thread is busy or stuck in an abandoned callback.
    ///
    /// [`MAX_DELIVERY_THREADS`]: crate::MAX_DELIVERY_THREADS
    pub fn exec_with<F>(
        &self,
        machine: &str,
        command: &Command,
        callback: F,
    ) -> Result<ExecOutput, Error>
    where
        F: FnMut(&ExecEvent) + Send + 'static,
    {
        let deadline = Instant::now() + self.inner.endpoint.budgets().operation;
        // Before anything is sent, so a refusal is `not_dispatched`.
        let observer = self.inner.callbacks.observer(callback)?;
        let stream = self.exec_stream(machine, command)?;
        run_with_callback(stream, observer, deadline)
    }

    /// Background launch (`POST …/exec` with `background: true`): the launch
    /// acknowledgement (`pid=N`), which proves a launch only.
    ///
    /// # Errors
    /// As [`exec`](Self::exec); `validation` for a foreground command.
    pub fn launch(&self, machine: &str, command: &Command) -> Result<exec::Launched, Error> {
        command.check_launch()?;
        self.exec(machine, command)?.into_launched()
    }

    /// `PUT …/files/{path}` (build the [`Upload`] with its digest first).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn upload(&self, upload: &Upload) -> Result<UploadReply, Error> {
        self.call(upload)
    }

    /// [`upload`](Self::upload), reporting progress: `progress` gets the
    /// request body bytes the socket took so far, each time that count
    /// moves (the core counts them; the head is excluded), on the calling
    /// thread. The reply is decoded and checked exactly as by
    /// [`upload`](Self::upload).
    ///
    /// # Errors
    /// As [`upload`](Self::upload).
    pub fn upload_with_progress(
        &self,
        upload: &Upload,
        progress: &mut dyn FnMut(u64),
    ) -> Result<UploadReply, Error> {
        let mut exchange = self.send(upload, self.deadlines(Instant::now()))?;
        let head = exchange.head_reporting(progress)?;
        let mut body = Vec::new();
        exchange.read_body(&mut body)?;
        upload.decode(&head, &body)
    }

    /// `GET …/files/{path}` within the download's byte cap.
    ///
    /// # Errors
    /// As [`call`](Self::call); `output_limit` past the cap.
    pub fn download(&self, download: &Download) -> Result<bytes::Bytes, Error> {
        self.call(download)
    }

    /// [`download`](Self::download), reporting progress: `progress` gets
    /// the body bytes received so far after each read (the head excluded),
    /// on the calling thread. The reply is decoded and checked exactly as
    /// by [`download`](Self::download).
    ///
    /// # Errors
    /// As [`download`](Self::download).
    pub fn download_with_progress(
        &self,
        download: &Download,
        progress: &mut dyn FnMut(u64),
    ) -> Result<bytes::Bytes, Error> {
        let mut exchange = self.send(download, self.deadlines(Instant::now()))?;
        let head = exchange.head()?;
        let mut body = Vec::new();
        loop {
            let mut sink = |bytes: &[u8]| {
                body.extend_from_slice(bytes);
                Ok(())
            };
            let step = exchange.next(&mut sink)?;
            progress(body.len() as u64);
            if let Pulled::End = step {
                return download.decode(&head, &body);
            }
        }
    }

    /// Console logs (`GET …/logs`, SSE): the history lines (tail).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn logs(&self, logs: &Logs) -> Result<Vec<String>, Error> {
        self.call(logs)
    }

    /// Console logs followed (`GET …/logs` with `follow=true`, SSE): each
    /// line goes to `on_line` as it is decoded, on the calling thread
    /// (back-pressure: reading waits for it). `on_line` returning `false`
    /// ends the read (the connection is closed). No reconnect and no cursor
    /// (C8.2): the read ends at the body's end, or with the first error —
    /// among them the read's own bounds (10,000 events, the allowance:
    /// `output_limit`; its timeout: `expired`).
    ///
    /// # Errors
    /// As [`call`](Self::call), and the stream's (`output_limit`,
    /// `protocol`, all `dispatch_uncertain`).
    pub fn logs_follow(
        &self,
        logs: &Logs,
        on_line: &mut dyn FnMut(String) -> bool,
    ) -> Result<(), Error> {
        let mut exchange = self.send(logs, self.deadlines(Instant::now()))?;
        let head = exchange.head()?;
        if !logs.check_head(&head)? {
            let mut body = Vec::new();
            exchange.read_body(&mut body)?;
            return Err(logs.decode_error(&head, &body));
        }
        let mut stream = logs.stream();
        loop {
            let mut sink = |bytes: &[u8]| stream.handle_input(bytes);
            let step = exchange.next(&mut sink);
            // The lines decoded before an error are delivered first.
            if !stream.deliver(on_line) {
                return Ok(());
            }
            if let Pulled::End = step? {
                stream.finish()?;
                return Ok(());
            }
        }
    }

    /// `POST /api/v1/volumes`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn volume_create(&self, call: &VolumeCreate) -> Result<String, Error> {
        self.call(call)
    }

    /// `DELETE /api/v1/volumes/{id}` (204).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn volume_delete(
        &self,
        call: &VolumeDelete,
    ) -> Result<<VolumeDelete as WorkerCall>::Output, Error> {
        self.call(call)
    }

    /// The deadlines of an operation starting at `start` (the endpoint's).
    pub(crate) fn deadlines(&self, start: Instant) -> OperationDeadlines {
        self.inner.endpoint.deadlines(start)
    }

    /// Delivery threads that exist now (tests).
    #[cfg(test)]
    pub(crate) fn inner_callback_threads(&self) -> usize {
        self.inner.callbacks.alive()
    }

    /// The endpoint's pool.
    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }
}
