//! [`Client`]: one verified worker operation per call.

use std::sync::Arc;
use std::time::Instant;

use smolbox_core::Error;
use smolbox_core::exec::{
    self, Command, ExecCall, ExecOutcome, ExecOutput, ExecStreamCall, OutputAllowance,
};
use smolbox_core::http1::Pulled;
use smolbox_core::worker::{
    Capacity, CapacityReply, Create, Delete, Get, Health, HealthReply, ImageCheck, List,
    MachineName, MachineSpec, Measure, Measurements, Metrics, Observation, OperationDeadlines,
    Profile, Readyz, Start, Stop, WorkerCall,
};
use smolbox_core::worker::{
    Download, Endpoint, Logs, Upload, UploadReply, VolumeCreate, VolumeDelete,
};

use crate::http::Exchange;
use crate::pool::{MAX_CONNECTIONS, Pool};
use crate::stream::{CallbackThreads, ExecEvent, ExecStream, run_with_callback};
use crate::transport::SocketTarget;

/// The async worker client. Cheap to clone (clones share one connection
/// pool of at most [`MAX_CONNECTIONS`]).
///
/// Every operation runs under the endpoint's budgets, fixed when the call
/// starts: pool checkout, connect (both inside the operation deadline),
/// receive idle, the overall operation deadline, and the request and
/// response byte caps. Nothing is retried, no redirect is followed and no
/// reply is decompressed. A failure is a [`smolbox_core::Error`]; its
/// evidence is `not_dispatched` only when not one request byte was written.
///
/// Dropping the future of an operation closes its connection: nothing keeps
/// running in the background.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    endpoint: Endpoint,
    pool: Arc<Pool>,
    callbacks: Arc<CallbackThreads>,
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
                callbacks: Arc::default(),
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
    pub async fn call<C: WorkerCall + ?Sized>(&self, call: &C) -> Result<C::Output, Error> {
        self.call_within(call, self.deadlines(Instant::now())).await
    }

    /// [`call`](Self::call) within deadlines already running.
    async fn call_within<C: WorkerCall + ?Sized>(
        &self,
        call: &C,
        deadlines: OperationDeadlines,
    ) -> Result<C::Output, Error> {
        let mut exchange = self.send(call, deadlines).await?;
        let head = exchange.head().await?;
        let mut body = Vec::new();
        exchange.read_body(&mut body).await?;
        call.decode(&head, &body)
    }

    /// Sends `call`'s request on a pooled connection, configured by core
    /// for that call and this endpoint. A call that needs an image machine
    /// (core's [`WorkerCall::image_check`]) first inspects it within the
    /// same deadlines; the call is sent only when core admits the result.
    async fn send<C: WorkerCall + ?Sized>(
        &self,
        call: &C,
        deadlines: OperationDeadlines,
    ) -> Result<Exchange, Error> {
        if let Some(check) = call.image_check() {
            self.image_preflight(check, deadlines).await?;
        }
        self.send_unchecked(call, deadlines).await
    }

    /// [`send`](Self::send) without the image preflight.
    async fn send_unchecked<C: WorkerCall + ?Sized>(
        &self,
        call: &C,
        deadlines: OperationDeadlines,
    ) -> Result<Exchange, Error> {
        let (request, config) = self.inner.endpoint.prepare(call, deadlines.operation)?;
        Exchange::start(Arc::clone(&self.inner.pool), &request, &config, deadlines).await
    }

    /// Performs `check`'s inspect within `deadlines` and returns core's
    /// verdict on it (C5.4, C6.1, C7.4).
    pub(crate) async fn image_preflight(
        &self,
        check: &ImageCheck,
        deadlines: OperationDeadlines,
    ) -> Result<(), Error> {
        let get = check.inspect();
        let inspected = async {
            let mut exchange = self.send_unchecked(get, deadlines).await?;
            let head = exchange.head().await?;
            let mut body = Vec::new();
            exchange.read_body(&mut body).await?;
            get.decode(&head, &body)
        }
        .await;
        check.admit(inspected)
    }

    /// The worker's version profile, from a `GET /health` preflight inside
    /// the caller's operation deadline (an unknown version is refused:
    /// `unsupported_capability`, nothing else sent).
    pub(crate) async fn preflight(&self, deadlines: OperationDeadlines) -> Result<Profile, Error> {
        Profile::preflight(self.call_within(&Health::new(), deadlines).await)
    }

    /// `GET /health`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn health(&self) -> Result<HealthReply, Error> {
        self.call(&Health::new()).await
    }

    /// `GET /health`, then the profile of the reported version: a known one,
    /// or one of `supplied` (an unknown version is refused with
    /// `unsupported_capability`).
    ///
    /// # Errors
    /// As [`call`](Self::call), and the core's admission errors.
    pub async fn admit(&self, supplied: &[Profile]) -> Result<Profile, Error> {
        let health = self.health().await?;
        Profile::admit(&health.version, supplied)
    }

    /// `GET /readyz` (exactly 200 with an empty body).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn readyz(&self) -> Result<(), Error> {
        self.call(&Readyz).await
    }

    /// `GET /capacity`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn capacity(&self) -> Result<CapacityReply, Error> {
        self.call(&Capacity).await
    }

    /// `GET /metrics`: the text, uninterpreted.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn metrics(&self) -> Result<String, Error> {
        self.call(&Metrics).await
    }

    /// `POST /api/v1/machines`: creates `name` from `spec` and checks that
    /// the reply matches the request.
    ///
    /// # Errors
    /// As [`call`](Self::call); spec and profile errors before sending.
    pub async fn create(
        &self,
        profile: &Profile,
        name: MachineName,
        spec: &MachineSpec,
    ) -> Result<Observation, Error> {
        self.call(&Create::new(profile, name, spec)?).await
    }

    /// `GET /api/v1/machines` (≤ 1,024 entries).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn list(&self, profile: &Profile) -> Result<Vec<Observation>, Error> {
        self.call(&List::new(profile)).await
    }

    /// `GET /api/v1/machines/{name}` (never starts the machine).
    ///
    /// # Errors
    /// As [`call`](Self::call); `not_found` when absent.
    pub async fn get(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.call(&Get::new(profile, name)).await
    }

    /// The machine's measurements, from the same single GET.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn measure(
        &self,
        profile: &Profile,
        name: MachineName,
    ) -> Result<Measurements, Error> {
        self.call(&Measure::new(profile, name)).await
    }

    /// `POST /api/v1/machines/{name}/start`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn start(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.call(&Start::new(profile, name)).await
    }

    /// `POST /api/v1/machines/{name}/stop`.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn stop(&self, profile: &Profile, name: MachineName) -> Result<Observation, Error> {
        self.call(&Stop::new(profile, name)).await
    }

    /// `DELETE /api/v1/machines/{name}` (only `{"deleted": name}` succeeds).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn delete(&self, name: MachineName) -> Result<(), Error> {
        self.call(&Delete::new(name)).await
    }

    /// Buffered exec (`POST …/exec`) with the default output allowance: a
    /// foreground command's exit (any exit code is a result) or a background
    /// command's launch acknowledgement.
    ///
    /// # Errors
    /// Command validation before sending; transport, status and decode
    /// errors after (an output overflow is `output_limit` with evidence
    /// `exited` and the exit code).
    pub async fn exec(&self, machine: &str, command: &Command) -> Result<ExecOutcome, Error> {
        self.exec_with_allowance(machine, command, OutputAllowance::DEFAULT)
            .await
    }

    /// [`exec`](Self::exec) with an explicit output allowance.
    ///
    /// # Errors
    /// As [`exec`](Self::exec).
    pub async fn exec_with_allowance(
        &self,
        machine: &str,
        command: &Command,
        allowance: OutputAllowance,
    ) -> Result<ExecOutcome, Error> {
        let deadlines = self.deadlines(Instant::now());
        let profile = self.preflight(deadlines).await?;
        let call = ExecCall::new(&profile, machine, command.clone(), allowance)?;
        self.call_within(&call, deadlines).await
    }

    /// Streamed exec (`POST …/exec/stream`): returns once the 200
    /// `text/event-stream` head was read; events are pulled from the
    /// [`ExecStream`]. The output allowance is the default (1 MiB).
    ///
    /// # Errors
    /// Command validation (stdin and background are refused) before
    /// sending; transport and status errors.
    pub async fn exec_stream(&self, machine: &str, command: &Command) -> Result<ExecStream, Error> {
        self.exec_stream_with_allowance(machine, command, OutputAllowance::DEFAULT)
            .await
    }

    /// [`exec_stream`](Self::exec_stream) with an explicit output allowance.
    ///
    /// # Errors
    /// As [`exec_stream`](Self::exec_stream).
    pub async fn exec_stream_with_allowance(
        &self,
        machine: &str,
        command: &Command,
        allowance: OutputAllowance,
    ) -> Result<ExecStream, Error> {
        let deadlines = self.deadlines(Instant::now());
        let profile = self.preflight(deadlines).await?;
        let call = ExecStreamCall::new(&profile, machine, command.clone(), allowance)?;
        self.exec_stream_within(&call, deadlines).await
    }

    /// Streamed exec from a core [`ExecStreamCall`] built (and gated) with
    /// a profile the caller admitted.
    ///
    /// # Errors
    /// As [`exec_stream`](Self::exec_stream).
    pub async fn exec_stream_call(&self, call: &ExecStreamCall) -> Result<ExecStream, Error> {
        self.exec_stream_within(call, self.deadlines(Instant::now()))
            .await
    }

    async fn exec_stream_within(
        &self,
        call: &ExecStreamCall,
        deadlines: OperationDeadlines,
    ) -> Result<ExecStream, Error> {
        let exchange = self.send(call, deadlines).await?;
        ExecStream::open_call(exchange, call).await
    }

    /// Streamed exec observed by a synchronous `callback` (run on a helper
    /// thread, one event at a time, with back-pressure: a slow callback
    /// slows reading). Returns the captured output (tagged lossy UTF-8) and
    /// exit code. A callback that panics is detached and capture continues;
    /// one that blocks is abandoned at the operation deadline and the call
    /// fails with `transport`/`dispatch_uncertain` (`callback_deadline`).
    /// At most [`MAX_DELIVERY_THREADS`] callback threads exist per client,
    /// abandoned ones included (an abandoned thread ends when its callback
    /// returns).
    ///
    /// # Errors
    /// As [`exec_stream`](Self::exec_stream), plus the stream's errors;
    /// `admission_exhausted` (`callback_threads_exhausted`, evidence
    /// `not_dispatched`, nothing sent) when all callback threads are taken.
    ///
    /// [`MAX_DELIVERY_THREADS`]: crate::MAX_DELIVERY_THREADS
    pub async fn exec_with<F>(
        &self,
        machine: &str,
        command: &Command,
        callback: F,
    ) -> Result<ExecOutput, Error>
    where
        F: FnMut(&ExecEvent) + Send + 'static,
    {
        let deadline = Instant::now() + self.inner.endpoint.budgets().operation;
        let permit = CallbackThreads::take(&self.inner.callbacks)?;
        let stream = self.exec_stream(machine, command).await?;
        run_with_callback(stream, callback, permit, deadline).await
    }

    /// The deadlines of an operation starting at `start` (the endpoint's).
    pub(crate) fn deadlines(&self, start: Instant) -> OperationDeadlines {
        self.inner.endpoint.deadlines(start)
    }

    /// Callback threads that exist now (tests).
    #[cfg(test)]
    pub(crate) fn callback_threads(&self) -> usize {
        self.inner
            .callbacks
            .alive
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Background launch (`POST …/exec` with `background: true`): the launch
    /// acknowledgement (`pid=N`), which proves a launch only.
    ///
    /// # Errors
    /// As [`exec`](Self::exec); `validation` for a foreground command.
    pub async fn launch(&self, machine: &str, command: &Command) -> Result<exec::Launched, Error> {
        command.check_launch()?;
        self.exec(machine, command).await?.into_launched()
    }

    /// `PUT …/files/{path}` (build the [`Upload`] with its digest first).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn upload(&self, upload: &Upload) -> Result<UploadReply, Error> {
        self.call(upload).await
    }

    /// [`upload`](Self::upload), reporting progress: `progress` gets the
    /// request body bytes the socket took so far, each time that count
    /// moves (the core counts them; the head is excluded), on the task
    /// driving the call. The reply is decoded and checked exactly as by
    /// [`upload`](Self::upload).
    ///
    /// # Errors
    /// As [`upload`](Self::upload).
    pub async fn upload_with_progress(
        &self,
        upload: &Upload,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<UploadReply, Error> {
        let mut exchange = self.send(upload, self.deadlines(Instant::now())).await?;
        let head = exchange.head_reporting(progress).await?;
        let mut body = Vec::new();
        exchange.read_body(&mut body).await?;
        upload.decode(&head, &body)
    }

    /// `GET …/files/{path}` within the download's byte cap.
    ///
    /// # Errors
    /// As [`call`](Self::call); `output_limit` past the cap.
    pub async fn download(&self, download: &Download) -> Result<bytes::Bytes, Error> {
        self.call(download).await
    }

    /// [`download`](Self::download), reporting progress: `progress` gets
    /// the body bytes received so far after each read (the head excluded),
    /// on the calling task. The reply is decoded and checked exactly as
    /// by [`download`](Self::download).
    ///
    /// # Errors
    /// As [`download`](Self::download).
    pub async fn download_with_progress(
        &self,
        download: &Download,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<bytes::Bytes, Error> {
        let mut exchange = self.send(download, self.deadlines(Instant::now())).await?;
        let head = exchange.head().await?;
        let mut body = Vec::new();
        loop {
            let mut sink = |bytes: &[u8]| {
                body.extend_from_slice(bytes);
                Ok(())
            };
            let step = exchange.next(&mut sink).await?;
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
    pub async fn logs(&self, logs: &Logs) -> Result<Vec<String>, Error> {
        self.call(logs).await
    }

    /// Console logs followed (`GET …/logs` with `follow=true`, SSE): each
    /// line goes to `on_line` as it is decoded, on the calling task
    /// (back-pressure: reading waits for it). `on_line` returning `false`
    /// ends the read (the connection is closed). No reconnect and no cursor
    /// (C8.2): the read ends at the body's end, or with the first error —
    /// among them the read's own bounds (10,000 events, the allowance:
    /// `output_limit`; its timeout: `expired`).
    ///
    /// # Errors
    /// As [`call`](Self::call), and the stream's (`output_limit`,
    /// `protocol`, all `dispatch_uncertain`).
    pub async fn logs_follow(
        &self,
        logs: &Logs,
        on_line: &mut (dyn FnMut(String) -> bool + Send),
    ) -> Result<(), Error> {
        let mut exchange = self.send(logs, self.deadlines(Instant::now())).await?;
        let head = exchange.head().await?;
        if !logs.check_head(&head)? {
            let mut body = Vec::new();
            exchange.read_body(&mut body).await?;
            return Err(logs.decode_error(&head, &body));
        }
        let mut stream = logs.stream();
        loop {
            let mut sink = |bytes: &[u8]| stream.handle_input(bytes);
            let step = exchange.next(&mut sink).await;
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
    pub async fn volume_create(&self, call: &VolumeCreate) -> Result<String, Error> {
        self.call(call).await
    }

    /// `DELETE /api/v1/volumes/{id}` (204).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn volume_delete(
        &self,
        call: &VolumeDelete,
    ) -> Result<<VolumeDelete as WorkerCall>::Output, Error> {
        self.call(call).await
    }

    /// The endpoint's connection pool.
    pub(crate) fn pool(&self) -> &Pool {
        &self.inner.pool
    }
}
