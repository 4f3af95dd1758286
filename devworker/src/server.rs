//! Listeners, the per-connection loop, and the [`DevWorker`] handles.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceExt;

use crate::api;
use crate::config::{Config, Limits, Token, Version};
use crate::conn::Listener;
use crate::conn::{ConnCtl, FaultIo};
use crate::faults::{Faults, Route};
use crate::state::{AppState, Shared, lock, restart_state};
use crate::tls::{self, TlsFiles};

/// Start-up options; see the crate docs for an example.
#[derive(Clone, Debug)]
pub struct Builder {
    version: String,
    token: Option<Token>,
    neighbour_checks: bool,
    tls: bool,
    unix_socket: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    listen: SocketAddr,
    limits: Limits,
    quiet: bool,
    keep_running: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            version: "1.9.2".to_owned(),
            token: None,
            neighbour_checks: true,
            tls: false,
            unix_socket: None,
            state_dir: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            limits: Limits::default(),
            quiet: false,
            keep_running: false,
        }
    }
}

impl Builder {
    /// Impersonated version: `"1.9.2"` (default) or `"1.22.0"`.
    pub fn version(mut self, v: &str) -> Self {
        v.clone_into(&mut self.version);
        self
    }
    /// Require `authorization: Bearer <token>` on every request (compared
    /// in constant time; never shown by `Debug`).
    pub fn token(mut self, t: Option<&str>) -> Self {
        self.token = t.map(Token::new);
        self
    }
    /// The safe-neighbour checks (default on): a TCP request whose `Host`
    /// is neither `localhost`, a loopback address nor the bound address is
    /// refused with 403 (DNS rebinding), as is a WebSocket upgrade whose
    /// `Origin` is present and not one of the worker's CORS origins, and an
    /// exec `timeoutSecs` above 86,400 is refused with 400. The real worker
    /// has none of these; a test that compares the devworker with the real
    /// worker request by request may turn them off.
    pub fn neighbour_checks(mut self, on: bool) -> Self {
        self.neighbour_checks = on;
        self
    }
    /// Serve mutual TLS on the TCP listener (certificates generated at start).
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }
    /// Also listen on this Unix socket (a stale file is replaced).
    pub fn unix_socket(mut self, p: Option<PathBuf>) -> Self {
        self.unix_socket = p;
        self
    }
    /// Where machines, volumes and certificates live (default: a temporary
    /// directory removed at shutdown).
    pub fn state_dir(mut self, p: Option<PathBuf>) -> Self {
        self.state_dir = p;
        self
    }
    /// TCP listen address (default `127.0.0.1:0`, a free port).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }
    /// Limits and timings (defaults are the real worker's).
    pub fn limits(mut self, l: Limits) -> Self {
        self.limits = l;
        self
    }
    /// The 300 s request timeout, shortened for tests.
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.limits.request_timeout = d;
        self
    }
    /// The 15 s SSE keep-alive interval, shortened for tests.
    pub fn keepalive(mut self, d: Duration) -> Self {
        self.limits.keepalive = d;
        self
    }
    /// The 5 s supervisor tick (`created` → `stopped`); `None` disables it.
    pub fn supervisor_tick(mut self, d: Option<Duration>) -> Self {
        self.limits.supervisor_tick = d;
        self
    }
    /// At shutdown (or drop), leave running machines' stand-in VMM processes
    /// alive, as the real worker leaves VMs running across a serve restart;
    /// a later devworker on the same state directory reconnects them.
    /// Default `false`: machines are stopped (drained) at shutdown. Only
    /// meaningful with [`Builder::state_dir`].
    pub fn keep_machines_running(mut self, keep: bool) -> Self {
        self.keep_running = keep;
        self
    }
    /// Do not print the start-up notice.
    pub fn quiet(mut self, q: bool) -> Self {
        self.quiet = q;
        self
    }

    /// Starts the worker on the current tokio runtime.
    pub async fn start(self) -> io::Result<DevWorker> {
        DevWorker::start(self).await
    }
}

/// A running devworker (tokio). Dropping it stops it (without waiting).
#[derive(Debug)]
pub struct DevWorker {
    shared: AppState,
    addr: SocketAddr,
    tls: Option<TlsFiles>,
    door: Option<SocketAddr>,
    unix: Option<PathBuf>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _tmp: Option<tempfile::TempDir>,
}

impl DevWorker {
    /// A builder with the defaults (1.9.2, no token, plain TCP on a free
    /// loopback port, temporary state directory).
    pub fn builder() -> Builder {
        Builder::default()
    }

    async fn start(b: Builder) -> io::Result<Self> {
        let version = Version::parse(&b.version).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unsupported version {:?} (use 1.9.2 or 1.22.0)", b.version),
            )
        })?;
        let persistent = b.state_dir.is_some();
        let (tmp, state_dir) = match b.state_dir {
            Some(d) => (None, d),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("smolbox-devworker-")
                    .tempdir()?;
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        std::fs::create_dir_all(state_dir.join("machines"))?;
        std::fs::create_dir_all(state_dir.join("volumes"))?;
        let config = Config {
            version,
            token: b.token,
            neighbour_checks: b.neighbour_checks,
            state_dir: state_dir.clone(),
            limits: b.limits,
            persistent,
            keep_running: b.keep_running && persistent,
        };
        let shared = Arc::new(Shared::new(config, Faults::default()));
        if persistent {
            *lock(&shared.machines) = crate::persist::load(&shared.machines_dir());
        }
        let router = api::router(Arc::clone(&shared));
        let (shutdown, _) = watch::channel(false);
        let mut tasks = Vec::new();

        let tcp = TcpListener::bind(b.listen).await?;
        let addr = tcp.local_addr()?;
        let (tls_files, acceptor) = if b.tls {
            let (files, cfg) = tls::generate(&state_dir.join("tls"))?;
            (Some(files), Some(tokio_rustls::TlsAcceptor::from(cfg)))
        } else {
            (None, None)
        };
        let tls_on = acceptor.is_some();
        tasks.push(tokio::spawn(accept_tcp(
            tcp,
            acceptor,
            router.clone(),
            Arc::clone(&shared),
            shutdown.subscribe(),
        )));
        let mut door = None;
        if tls_on {
            let next = SocketAddr::from(([127, 0, 0, 1], addr.port().wrapping_add(1)));
            let listener = match TcpListener::bind(next).await {
                Ok(l) => l,
                Err(_) => TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?,
            };
            door = Some(listener.local_addr()?);
            let door_router = api::door_router(Arc::clone(&shared));
            tasks.push(tokio::spawn(accept_tcp(
                listener,
                None,
                door_router,
                Arc::clone(&shared),
                shutdown.subscribe(),
            )));
        }

        if let Some(path) = &b.unix_socket {
            if path.exists() {
                std::fs::remove_file(path)?;
            }
            let ul = UnixListener::bind(path)?;
            tasks.push(tokio::spawn(accept_unix(
                ul,
                router.clone(),
                Arc::clone(&shared),
                shutdown.subscribe(),
            )));
        }

        if let Some(tick) = shared.config.limits.supervisor_tick {
            let st = Arc::clone(&shared);
            let mut stop = shutdown.subscribe();
            tasks.push(tokio::spawn(async move {
                let mut iv = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
                loop {
                    tokio::select! {
                        _ = iv.tick() => api::supervisor_tick(&st),
                        _ = stop.changed() => return,
                    }
                }
            }));
        }

        if !b.quiet {
            eprintln!(
                "smolbox-devworker {}: impersonating smolvm {} on {}{}{} — WARNING: commands run on this host as host processes, WITHOUT isolation; state in {}",
                env!("CARGO_PKG_VERSION"),
                version.as_str(),
                if tls_files.is_some() {
                    "https://"
                } else {
                    "http://"
                },
                addr,
                b.unix_socket
                    .as_ref()
                    .map(|p| format!(" and unix:{}", p.display()))
                    .unwrap_or_default(),
                state_dir.display(),
            );
        }
        Ok(Self {
            shared,
            addr,
            tls: tls_files,
            door,
            unix: b.unix_socket,
            shutdown,
            tasks,
            _tmp: tmp,
        })
    }

    /// Starts a worker on its own runtime, for callers without tokio.
    pub fn start_blocking(builder: Builder) -> io::Result<BlockingDevWorker> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("smolbox-devworker")
            .enable_all()
            .build()?;
        let worker = rt.block_on(builder.start())?;
        Ok(BlockingDevWorker {
            worker: Some(worker),
            rt: Some(rt),
        })
    }

    /// The TCP listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (or `https://…` with TLS).
    pub fn base_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The Unix socket path, if one was asked for.
    pub fn unix_path(&self) -> Option<PathBuf> {
        self.unix.clone()
    }

    /// With TLS: the plain-HTTP loopback door (`127.0.0.1:<port + 1>`, or
    /// another free port if that one is taken) serving only `/health`,
    /// `/readyz`, `/capacity` and `/metrics`.
    pub fn local_door(&self) -> Option<SocketAddr> {
        self.door
    }

    /// The generated certificates, when TLS is on.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        self.tls.clone()
    }

    /// The fault switchboard.
    pub fn faults(&self) -> Faults {
        self.shared.faults.clone()
    }

    /// Requests seen on `route` so far.
    pub fn request_count(&self, route: Route) -> u64 {
        self.shared.faults.request_count(route)
    }

    /// The impersonated version.
    pub fn version(&self) -> Version {
        self.shared.config.version
    }

    /// The state directory.
    pub fn state_dir(&self) -> &Path {
        &self.shared.config.state_dir
    }

    /// The host directory standing for machine `name`'s filesystem root
    /// (`/workspace` is `<this>/workspace`).
    pub fn guest_root(&self, name: &str) -> PathBuf {
        self.shared.machine_dir(name).join("rootfs")
    }

    /// The machine's console log file (what `/logs` serves).
    pub fn console_log(&self, name: &str) -> PathBuf {
        self.shared.machine_dir(name).join("agent-console.log")
    }

    /// The host PID of machine `name`'s stand-in VMM process, while running.
    pub fn machine_pid(&self, name: &str) -> Option<u32> {
        self.shared
            .with_machine(name, |m| {
                m.vmm.as_ref().filter(|v| v.is_alive()).map(|v| v.pid)
            })
            .flatten()
    }

    /// Kills machine `name`'s VMM process (as if the VM crashed).
    pub fn kill_machine_process(&self, name: &str) {
        if let Some(pid) = self
            .shared
            .with_machine(name, |m| m.vmm.as_ref().map(|v| v.pid))
            .flatten()
        {
            api::kill_pid(pid);
        }
    }

    /// Runs the supervisor tick now (never-started `created` machines read
    /// `stopped` afterwards), independent of the configured interval.
    pub fn tick_supervisor(&self) {
        api::supervisor_tick(&self.shared);
    }

    /// Simulates a worker restart: every connection, stream, terminal and
    /// running command is dropped and forgotten; machines whose process died
    /// are deleted with their directories; `boot_id`, uptime and trace ids
    /// start afresh. Machines whose process lives are kept.
    pub async fn restart(&self) {
        // Let the process reaper notice VMM processes killed just before.
        tokio::task::yield_now().await;
        restart_state(&self.shared);
    }

    /// Stops listening, ends every connection and kills every process.
    pub async fn shutdown(mut self) {
        self.stop();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }

    fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        self.shared.generation.send_modify(|g| *g += 1);
        self.shared.commands.kill_all();
        for m in lock(&self.shared.machines).iter_mut() {
            if self.shared.config.keep_running {
                m.kill_commands();
            } else {
                api::stop_machine(m);
            }
        }
        if let Some(p) = &self.unix {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for DevWorker {
    fn drop(&mut self) {
        self.stop();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A devworker on its own runtime, for callers without tokio.
#[derive(Debug)]
pub struct BlockingDevWorker {
    worker: Option<DevWorker>,
    rt: Option<tokio::runtime::Runtime>,
}

impl BlockingDevWorker {
    fn w(&self) -> &DevWorker {
        self.worker.as_ref().expect("worker present until shutdown")
    }
    /// See [`DevWorker::addr`].
    pub fn addr(&self) -> SocketAddr {
        self.w().addr()
    }
    /// See [`DevWorker::base_url`].
    pub fn base_url(&self) -> String {
        self.w().base_url()
    }
    /// See [`DevWorker::unix_path`].
    pub fn unix_path(&self) -> Option<PathBuf> {
        self.w().unix_path()
    }
    /// See [`DevWorker::local_door`].
    pub fn local_door(&self) -> Option<SocketAddr> {
        self.w().local_door()
    }
    /// See [`DevWorker::tls_files`].
    pub fn tls_files(&self) -> Option<TlsFiles> {
        self.w().tls_files()
    }
    /// See [`DevWorker::faults`].
    pub fn faults(&self) -> Faults {
        self.w().faults()
    }
    /// See [`DevWorker::request_count`].
    pub fn request_count(&self, route: Route) -> u64 {
        self.w().request_count(route)
    }
    /// See [`DevWorker::version`].
    pub fn version(&self) -> Version {
        self.w().version()
    }
    /// See [`DevWorker::state_dir`].
    pub fn state_dir(&self) -> PathBuf {
        self.w().state_dir().to_path_buf()
    }
    /// See [`DevWorker::guest_root`].
    pub fn guest_root(&self, name: &str) -> PathBuf {
        self.w().guest_root(name)
    }
    /// See [`DevWorker::console_log`].
    pub fn console_log(&self, name: &str) -> PathBuf {
        self.w().console_log(name)
    }
    /// See [`DevWorker::machine_pid`].
    pub fn machine_pid(&self, name: &str) -> Option<u32> {
        self.w().machine_pid(name)
    }
    /// See [`DevWorker::kill_machine_process`].
    pub fn kill_machine_process(&self, name: &str) {
        self.w().kill_machine_process(name);
    }
    /// See [`DevWorker::tick_supervisor`].
    pub fn tick_supervisor(&self) {
        self.w().tick_supervisor();
    }
    /// See [`DevWorker::restart`].
    pub fn restart(&self) {
        if let (Some(rt), Some(w)) = (&self.rt, &self.worker) {
            rt.block_on(w.restart());
        }
    }
    /// Stops the worker and its runtime.
    pub fn shutdown(mut self) {
        self.finish();
    }
    fn finish(&mut self) {
        if let (Some(rt), Some(w)) = (self.rt.take(), self.worker.take()) {
            rt.block_on(w.shutdown());
            rt.shutdown_background();
        }
    }
}

impl Drop for BlockingDevWorker {
    fn drop(&mut self) {
        self.finish();
    }
}

async fn serve_io<IO>(io: IO, router: Router, st: AppState, listener: Listener)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut generation = st.generation.subscribe();
    let ctl = Arc::new(ConnCtl::default());
    let io = TokioIo::new(FaultIo::new(io, Arc::clone(&ctl)));
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(Arc::clone(&ctl));
        req.extensions_mut().insert(listener);
        let r = router.clone();
        async move { r.oneshot(req.map(Body::new)).await }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, svc)
        .with_upgrades();
    tokio::select! {
        _ = conn => {}
        _ = generation.changed() => {}
    }
}

async fn accept_tcp(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    st: AppState,
    mut stop: watch::Receiver<bool>,
) {
    let bound = Listener(listener.local_addr().ok());
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let (router, st) = (router.clone(), Arc::clone(&st));
        match &tls {
            None => {
                tokio::spawn(serve_io(stream, router, st, bound));
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(s) = acceptor.accept(stream).await {
                        serve_io(s, router, st, bound).await;
                    }
                });
            }
        }
    }
}

async fn accept_unix(
    listener: UnixListener,
    router: Router,
    st: AppState,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        tokio::spawn(serve_io(
            stream,
            router.clone(),
            Arc::clone(&st),
            Listener(None),
        ));
    }
}
