//! Worker endpoint configuration (features C1.1).
//!
//! [`Endpoint::new`] validates an [`EndpointConfig`] without any I/O. The
//! one rule that needs the file system ("the CA file, client certificate
//! and key must exist as regular files") is [`Endpoint::check_files`], which
//! the shell calls with its own file test before connecting.

use crate::Reason;
use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Category, Error, Evidence, Operation};
use crate::http1::ExchangeConfig;
use crate::secret::Secret;

/// A worker id: ≤64 bytes of `^[A-Za-z0-9][A-Za-z0-9._-]*$` (features §0.1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId(Box<str>);

impl WorkerId {
    /// The longest id in bytes.
    pub const MAX_LEN: usize = 64;

    /// Validates a worker id.
    ///
    /// # Errors
    /// `validation`, operation `config`, reason `invalid_worker_id`.
    pub fn new(id: &str) -> Result<Self, Error> {
        let b = id.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= Self::MAX_LEN
            && b[0].is_ascii_alphanumeric()
            && b.iter()
                .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
        if ok {
            Ok(Self(id.into()))
        } else {
            Err(Error::validation(
                Operation::Config,
                Reason::InvalidWorkerId,
            ))
        }
    }

    /// The id text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The URL scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP (loopback or Unix socket only).
    Http,
    /// HTTPS with mutual TLS available; verification cannot be disabled.
    Https,
}

/// The six budgets of an endpoint, each with its default and range (C1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// Connect timeout: default 1,000 ms, 1–900,000 ms.
    pub connect: Duration,
    /// Pool checkout timeout: default 5,000 ms, 1–900,000 ms.
    pub pool_checkout: Duration,
    /// Receive-idle timeout: default 15,000 ms, 1–86,460,000 ms.
    pub receive_idle: Duration,
    /// Operation timeout: default 30,000 ms, 1–86,460,000 ms.
    pub operation: Duration,
    /// Max request body: default 1,048,576 B, 1–16,777,216 B.
    pub max_request_body: u64,
    /// Max response bytes: default 16,777,216 B, 1–33,554,432 B.
    pub max_response_bytes: u64,
}

impl Budgets {
    /// Default connect timeout.
    pub const DEFAULT_CONNECT: Duration = Duration::from_millis(1_000);
    /// Default pool checkout timeout.
    pub const DEFAULT_POOL_CHECKOUT: Duration = Duration::from_millis(5_000);
    /// Default receive-idle timeout.
    pub const DEFAULT_RECEIVE_IDLE: Duration = Duration::from_millis(15_000);
    /// Default operation timeout.
    pub const DEFAULT_OPERATION: Duration = Duration::from_millis(30_000);
    /// Default max request body.
    pub const DEFAULT_MAX_REQUEST_BODY: u64 = 1_048_576;
    /// Default max response bytes.
    pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 16_777_216;
    /// Largest connect and pool checkout timeout, ms.
    pub const MAX_CONNECT_MS: u64 = 900_000;
    /// Largest receive-idle and operation timeout, ms.
    pub const MAX_OPERATION_MS: u64 = 86_460_000;
    /// Largest max request body.
    pub const MAX_REQUEST_BODY: u64 = 16_777_216;
    /// Largest max response bytes.
    pub const MAX_RESPONSE_BYTES: u64 = 33_554_432;

    /// Checks every budget against its range.
    ///
    /// # Errors
    /// `validation`, operation `config`, with the offending value as limit
    /// (durations in ms).
    pub fn validate(&self) -> Result<(), Error> {
        check_ms(
            self.connect,
            Self::MAX_CONNECT_MS,
            Reason::ConnectTimeoutOutOfRange,
        )?;
        check_ms(
            self.pool_checkout,
            Self::MAX_CONNECT_MS,
            Reason::PoolCheckoutOutOfRange,
        )?;
        check_ms(
            self.receive_idle,
            Self::MAX_OPERATION_MS,
            Reason::ReceiveIdleOutOfRange,
        )?;
        check_ms(
            self.operation,
            Self::MAX_OPERATION_MS,
            Reason::OperationTimeoutOutOfRange,
        )?;
        check_range(
            self.max_request_body,
            Self::MAX_REQUEST_BODY,
            Reason::MaxRequestBodyOutOfRange,
        )?;
        check_range(
            self.max_response_bytes,
            Self::MAX_RESPONSE_BYTES,
            Reason::MaxResponseBytesOutOfRange,
        )
    }
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            connect: Self::DEFAULT_CONNECT,
            pool_checkout: Self::DEFAULT_POOL_CHECKOUT,
            receive_idle: Self::DEFAULT_RECEIVE_IDLE,
            operation: Self::DEFAULT_OPERATION,
            max_request_body: Self::DEFAULT_MAX_REQUEST_BODY,
            max_response_bytes: Self::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

fn check_ms(d: Duration, max_ms: u64, reason: Reason) -> Result<(), Error> {
    // Sub-millisecond precision is refused rather than rounded.
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(Error::validation(Operation::Config, reason));
    }
    check_range(ms, max_ms, reason)
}

fn check_range(v: u64, max: u64, reason: Reason) -> Result<(), Error> {
    if (1..=max).contains(&v) {
        Ok(())
    } else {
        Err(Error::validation(Operation::Config, reason).with_limit(v, max))
    }
}

/// The caller's endpoint settings, before validation.
#[derive(Clone, Debug, Default)]
pub struct EndpointConfig {
    /// Worker id (worker id grammar).
    pub id: String,
    /// Base URL: `http(s)://host[:port][/]`.
    pub base_url: String,
    /// Bearer token: 1–4,096 bytes of `0x21–0x7E`; mandatory for HTTPS.
    pub token: Option<Secret>,
    /// PEM CA file to verify the worker with (HTTPS only).
    pub ca_file: Option<PathBuf>,
    /// Also trust the platform's trust store, beside `ca_file` (HTTPS only;
    /// verification stays on: this only adds trust anchors).
    pub system_roots: bool,
    /// PEM client certificate chain for mutual TLS (HTTPS only, with `client_key`).
    pub client_cert: Option<PathBuf>,
    /// PEM client private key for mutual TLS (HTTPS only, with `client_cert`).
    pub client_key: Option<PathBuf>,
    /// Unix socket path (absolute, ≤100 bytes): only with a plain-HTTP loopback URL.
    pub unix_socket: Option<String>,
    /// Allow plain HTTP over TCP to a loopback host (`127.0.0.1`, `localhost`, `::1`).
    pub allow_insecure_loopback: bool,
    /// The six budgets.
    pub budgets: Budgets,
}

/// Where the shell connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// A TCP connection to host (no brackets for IPv6) and port.
    Tcp {
        /// Host name or IP literal.
        host: &'a str,
        /// Port.
        port: u16,
    },
    /// A Unix domain socket.
    Unix(&'a Path),
}

/// How a shell connects to an endpoint: the transport and, for TLS, the
/// files to verify with ([`Endpoint::connect_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectPlan<'a> {
    /// A Unix domain socket.
    Unix(&'a Path),
    /// Plain TCP (loopback only, validated by [`Endpoint::new`]).
    Tcp {
        /// Host name or IP literal (no brackets).
        host: &'a str,
        /// Port.
        port: u16,
    },
    /// TLS over TCP, verified against `ca_file` and, when `system_roots`,
    /// the platform's roots (and the host name); at least one of the two.
    Tls {
        /// Host name or IP literal (no brackets); also the server name.
        host: &'a str,
        /// Port.
        port: u16,
        /// The CA bundle the peer is verified against.
        ca_file: Option<&'a Path>,
        /// Also trust the platform's trust store.
        system_roots: bool,
        /// Client certificate and key for mutual TLS.
        client_identity: Option<(&'a Path, &'a Path)>,
    },
}

/// A validated worker endpoint. Construction performs no I/O (AC-1.1.1);
/// the token never appears in `Debug` (AC-1.1.4).
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    id: WorkerId,
    scheme: Scheme,
    host: Box<str>,
    port: u16,
    explicit_port: bool,
    token: Option<Secret>,
    ca_file: Option<PathBuf>,
    system_roots: bool,
    client_identity: Option<(PathBuf, PathBuf)>,
    unix_socket: Option<PathBuf>,
    budgets: Budgets,
}

/// The longest base URL in bytes.
pub const MAX_BASE_URL_LEN: usize = 2_048;
/// The longest bearer token in bytes.
pub const MAX_TOKEN_LEN: usize = 4_096;
/// The longest Unix socket path in bytes.
pub const MAX_SOCKET_PATH_LEN: usize = 100;

impl Endpoint {
    /// Validates a configuration (every rule of C1.1 except file existence).
    ///
    /// # Errors
    /// `validation`, operation `config`, evidence `not_dispatched`.
    pub fn new(config: EndpointConfig) -> Result<Self, Error> {
        let id = WorkerId::new(&config.id)?;
        let url = parse_base_url(&config.base_url)?;
        config.budgets.validate()?;
        if let Some(token) = &config.token {
            let b = token.expose().as_bytes();
            if b.is_empty()
                || b.len() > MAX_TOKEN_LEN
                || !b.iter().all(|c| (0x21..=0x7e).contains(c))
            {
                return Err(Error::validation(Operation::Config, Reason::InvalidToken));
            }
        }
        let loopback = is_loopback_host(&url.host);
        let client_identity = match (config.client_cert, config.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => {
                return Err(Error::validation(
                    Operation::Config,
                    Reason::ClientCertAndKeyGoTogether,
                ));
            }
        };
        let unix_socket = match config.unix_socket {
            None => None,
            Some(s) => Some(check_socket_path(&s)?),
        };
        match url.scheme {
            Scheme::Https => {
                if config.token.is_none() {
                    return Err(Error::validation(
                        Operation::Config,
                        Reason::HttpsRequiresToken,
                    ));
                }
                if unix_socket.is_some() {
                    return Err(Error::validation(
                        Operation::Config,
                        Reason::SocketRequiresPlainHttp,
                    ));
                }
                if config.allow_insecure_loopback {
                    return Err(Error::validation(
                        Operation::Config,
                        Reason::InsecureWithHttps,
                    ));
                }
            }
            Scheme::Http => {
                if config.ca_file.is_some() || config.system_roots {
                    return Err(Error::validation(
                        Operation::Config,
                        Reason::CaFileRequiresHttps,
                    ));
                }
                if client_identity.is_some() {
                    return Err(Error::validation(
                        Operation::Config,
                        Reason::ClientCertRequiresHttps,
                    ));
                }
                if !loopback {
                    return Err(Error::validation(
                        Operation::Config,
                        Reason::PlainHttpRequiresLoopback,
                    ));
                }
                if unix_socket.is_none() && !config.allow_insecure_loopback {
                    return Err(Error::validation(
                        Operation::Config,
                        Reason::PlainHttpRequiresOptIn,
                    ));
                }
            }
        }
        for p in config
            .ca_file
            .iter()
            .chain(client_identity.iter().flat_map(|(c, k)| [c, k]))
        {
            let s = p.as_os_str();
            if s.is_empty() || s.as_encoded_bytes().contains(&0) {
                return Err(Error::validation(
                    Operation::Config,
                    Reason::InvalidFilePath,
                ));
            }
        }
        Ok(Self {
            id,
            scheme: url.scheme,
            host: url.host.into(),
            port: url.port,
            explicit_port: url.explicit_port,
            token: config.token,
            ca_file: config.ca_file,
            system_roots: config.system_roots,
            client_identity,
            unix_socket,
            budgets: config.budgets,
        })
    }

    /// Checks that the CA file and client certificate/key exist as regular
    /// files, using the shell's file test (the only C1.1 rule needing I/O).
    ///
    /// # Errors
    /// `validation`, operation `config`, reason `file_not_regular`.
    pub fn check_files(&self, is_regular_file: impl Fn(&Path) -> bool) -> Result<(), Error> {
        let mut files = self
            .ca_file
            .iter()
            .map(PathBuf::as_path)
            .collect::<Vec<_>>();
        if let Some((c, k)) = &self.client_identity {
            files.push(c);
            files.push(k);
        }
        if files.into_iter().all(is_regular_file) {
            Ok(())
        } else {
            Err(Error::validation(Operation::Config, Reason::FileNotRegular))
        }
    }

    /// The worker id.
    pub const fn id(&self) -> &WorkerId {
        &self.id
    }

    /// The scheme.
    pub const fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host (lowercase; IPv6 without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port (explicit, or 80/443 by scheme).
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// The `Host` header value: host (IPv6 in brackets) plus `:port` when
    /// the URL named one.
    pub fn host_header(&self) -> String {
        let mut h = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.to_string()
        };
        if self.explicit_port {
            h.push(':');
            h.push_str(&self.port.to_string());
        }
        h
    }

    /// The TLS server name to verify (HTTPS only).
    pub fn tls_server_name(&self) -> Option<&str> {
        match self.scheme {
            Scheme::Https => Some(&self.host),
            Scheme::Http => None,
        }
    }

    /// Where to connect: the Unix socket when configured, else TCP.
    pub fn target(&self) -> Target<'_> {
        match &self.unix_socket {
            Some(p) => Target::Unix(p),
            None => Target::Tcp {
                host: &self.host,
                port: self.port,
            },
        }
    }

    /// How to connect. HTTPS needs a CA file or the system roots (or both);
    /// the platform's roots are consulted only when `system_roots` is set.
    ///
    /// # Errors
    /// `unsupported_capability` (operation `config`, `not_dispatched`,
    /// reason `tls_requires_ca_file`) for HTTPS with neither.
    pub fn connect_plan(&self) -> Result<ConnectPlan<'_>, Error> {
        match (self.target(), self.scheme) {
            (Target::Unix(path), _) => Ok(ConnectPlan::Unix(path)),
            (Target::Tcp { host, port }, Scheme::Http) => Ok(ConnectPlan::Tcp { host, port }),
            (Target::Tcp { host, port }, Scheme::Https) => match self.ca_file() {
                ca_file if ca_file.is_some() || self.system_roots => Ok(ConnectPlan::Tls {
                    host,
                    port,
                    ca_file,
                    system_roots: self.system_roots,
                    client_identity: self.client_identity(),
                }),
                _ => Err(Error::unsupported_capability(
                    Operation::Config,
                    Reason::TlsRequiresCaFile,
                )),
            },
        }
    }

    /// The bearer token, if any (write it only onto the wire).
    pub const fn token(&self) -> Option<&Secret> {
        self.token.as_ref()
    }

    /// The CA file, if any.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// The client certificate and key paths for mutual TLS, if any.
    pub fn client_identity(&self) -> Option<(&Path, &Path)> {
        self.client_identity
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()))
    }

    /// The Unix socket path, if any.
    pub fn unix_socket(&self) -> Option<&Path> {
        self.unix_socket.as_deref()
    }

    /// The budgets.
    pub const fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    /// The deadlines of an operation starting at `start`: the operation
    /// budget from `start`, the checkout budget from `start` capped by it,
    /// and the connect budget.
    pub fn deadlines(&self, start: Instant) -> OperationDeadlines {
        let b = &self.budgets;
        let operation = start + b.operation;
        OperationDeadlines {
            operation,
            checkout: (start + b.pool_checkout).min(operation),
            connect: b.connect,
        }
    }

    /// The [`ExchangeConfig`] of one exchange with this endpoint: its Host
    /// header, bearer token, request-body cap, receive-idle timeout and the
    /// response cap (the endpoint's, or an operation's tighter
    /// [`super::WorkerCall::max_response_bytes`]). `deadline` is the
    /// operation's overall deadline (typically `now + budgets().operation`).
    pub fn exchange_config(&self, deadline: Instant, call_cap: Option<u64>) -> ExchangeConfig {
        let mut c = ExchangeConfig::new(self.host_header(), deadline);
        c.bearer = self.token.clone();
        c.max_request_body = usize::try_from(self.budgets.max_request_body).unwrap_or(usize::MAX);
        c.max_response_body = call_cap.map_or(self.budgets.max_response_bytes, |cap| {
            cap.clamp(1, self.budgets.max_response_bytes)
        });
        c.idle_timeout = Some(self.budgets.receive_idle);
        c
    }

    /// The [`ExchangeConfig`] of `call` (the one place that decides it):
    /// [`Self::exchange_config`] with the call's reply cap (a call that
    /// wants no body, `Some(0)` like readyz, gets the smallest cap the
    /// exchange accepts, 1 byte; its decoder refuses any byte), and without
    /// the receive-idle timeout when the call says so (extended exec, whose
    /// command may stay silent for its whole timeout).
    pub fn exchange_config_for<C: super::WorkerCall + ?Sized>(
        &self,
        call: &C,
        deadline: Instant,
    ) -> ExchangeConfig {
        let mut c = self.exchange_config(deadline, call.max_response_bytes());
        if !call.uses_receive_idle() {
            c.idle_timeout = None;
        }
        c
    }

    /// `call`'s request and its [`ExchangeConfig`]
    /// ([`Self::exchange_config_for`]): what a shell sends, decided here.
    ///
    /// # Errors
    /// The call's request errors (validation; nothing sent).
    pub fn prepare<C: super::WorkerCall + ?Sized>(
        &self,
        call: &C,
        deadline: Instant,
    ) -> Result<(crate::http1::Request, ExchangeConfig), Error> {
        Ok((call.request()?, self.exchange_config_for(call, deadline)))
    }
}

/// The moments one operation must respect, fixed when it starts (C1.3: one
/// overall deadline covers pool checkout, connect and the transfer). Built
/// by [`Endpoint::deadlines`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperationDeadlines {
    /// The overall operation deadline.
    pub operation: Instant,
    /// Pool checkout must end by then (never after `operation`).
    pub checkout: Instant,
    /// Connect budget, counted from the moment the connect starts.
    pub connect: Duration,
}

impl OperationDeadlines {
    /// The moment a connect starting at `now` must end: its budget from
    /// `now`, never after the operation deadline.
    pub fn connect_by(&self, now: Instant) -> Instant {
        (now + self.connect).min(self.operation)
    }

    /// A checkout or connect failure seen at `now`: a `transport` /
    /// `not_dispatched` error gets reason `deadline` when it was the
    /// operation deadline, not the checkout or connect budget, that ran
    /// out; any other error is returned as it is.
    #[must_use]
    pub fn checkout_error(&self, e: Error, now: Instant) -> Error {
        if e.category() == Category::Transport
            && e.evidence() == Evidence::NotDispatched
            && now >= self.operation
        {
            e.with_reason(Reason::Deadline)
        } else {
            e
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id.as_str())
            .field("scheme", &self.scheme)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("has_token", &self.token.is_some())
            .field("ca_file", &self.ca_file)
            .field("system_roots", &self.system_roots)
            .field("client_identity", &self.client_identity)
            .field("unix_socket", &self.unix_socket)
            .field("budgets", &self.budgets)
            .finish()
    }
}

/// True when plain HTTP (no TLS) may connect to `ip`: a loopback address
/// only (127.0.0.0/8, `::1`, or 127.0.0.0/8 mapped into IPv6). A shell
/// resolving `localhost` for plain HTTP connects only to addresses this
/// accepts, so a resolver (or `/etc/hosts`) pointing `localhost` elsewhere
/// cannot send a token in clear over the network.
pub fn plain_http_address_allowed(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// What a shell found out about a Unix socket path before connecting
/// (from `stat`); [`check_unix_socket`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketFileFacts {
    /// The socket file's permission bits (`st_mode & 0o7777`).
    pub socket_mode: u32,
    /// The file is a socket.
    pub is_socket: bool,
    /// The socket file's owner.
    pub socket_uid: u32,
    /// The parent directory's permission bits.
    pub dir_mode: u32,
    /// The parent directory's owner.
    pub dir_uid: u32,
}

/// Whether a Unix socket may carry requests (and the token): refused when
/// the path is not a socket, when other users may write the socket
/// (`o+w`), when the parent directory is writable by its group or by other
/// users (someone else could have put or could replace the socket there),
/// or when the socket's owner is neither the directory's owner nor root.
///
/// # Errors
/// `validation`, operation `config`, evidence `not_dispatched`: reason
/// `socket_not_a_socket`, `socket_writable_by_others`,
/// `socket_dir_writable_by_others` or `socket_owner_mismatch`.
pub fn check_unix_socket(f: SocketFileFacts) -> Result<(), Error> {
    if !f.is_socket {
        return Err(Error::validation(
            Operation::Config,
            Reason::SocketNotASocket,
        ));
    }
    if f.socket_mode & 0o002 != 0 {
        return Err(Error::validation(
            Operation::Config,
            Reason::SocketWritableByOthers,
        ));
    }
    if f.dir_mode & 0o022 != 0 {
        return Err(Error::validation(
            Operation::Config,
            Reason::SocketDirWritableByOthers,
        ));
    }
    if f.socket_uid != f.dir_uid && f.socket_uid != 0 {
        return Err(Error::validation(
            Operation::Config,
            Reason::SocketOwnerMismatch,
        ));
    }
    Ok(())
}

fn is_loopback_host(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "localhost" | "::1")
}

fn check_socket_path(s: &str) -> Result<PathBuf, Error> {
    if !s.starts_with('/') || s.len() > MAX_SOCKET_PATH_LEN || s.contains('\0') {
        return Err(Error::validation(
            Operation::Config,
            Reason::InvalidSocketPath,
        ));
    }
    Ok(PathBuf::from(s))
}

struct BaseUrl {
    scheme: Scheme,
    host: String,
    port: u16,
    explicit_port: bool,
}

fn parse_base_url(url: &str) -> Result<BaseUrl, Error> {
    if url.len() > MAX_BASE_URL_LEN {
        return Err(Error::validation(Operation::Config, Reason::BaseUrlTooLong)
            .with_limit(url.len() as u64, MAX_BASE_URL_LEN as u64));
    }
    let (scheme, rest) = if let Some(r) = strip_prefix_ci(url, "http://") {
        (Scheme::Http, r)
    } else if let Some(r) = strip_prefix_ci(url, "https://") {
        (Scheme::Https, r)
    } else {
        return Err(Error::validation(Operation::Config, Reason::BaseUrlScheme));
    };
    if rest.contains(['?', '#']) {
        return Err(Error::validation(
            Operation::Config,
            Reason::BaseUrlQueryOrFragment,
        ));
    }
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    if !(path.is_empty() || path == "/") {
        return Err(Error::validation(Operation::Config, Reason::BaseUrlPath));
    }
    if authority.contains('@') {
        return Err(Error::validation(
            Operation::Config,
            Reason::BaseUrlUserinfo,
        ));
    }
    let (host, port_text) = if let Some(after) = authority.strip_prefix('[') {
        let end = after
            .find(']')
            .ok_or_else(|| Error::validation(Operation::Config, Reason::BaseUrlHost))?;
        let literal = &after[..end];
        if literal.parse::<Ipv6Addr>().is_err() {
            return Err(Error::validation(Operation::Config, Reason::BaseUrlHost));
        }
        let tail = &after[end + 1..];
        let port = match tail.strip_prefix(':') {
            Some(p) => Some(p),
            None if tail.is_empty() => None,
            None => return Err(Error::validation(Operation::Config, Reason::BaseUrlHost)),
        };
        (literal.to_ascii_lowercase(), port)
    } else {
        let (h, p) = match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        let valid = h.split('.').all(label_ok)
            && (h.parse::<Ipv4Addr>().is_ok()
                || !h.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
        if !valid {
            return Err(Error::validation(Operation::Config, Reason::BaseUrlHost));
        }
        (h.to_ascii_lowercase(), p)
    };
    let (port, explicit_port) = match port_text {
        None => (if scheme == Scheme::Https { 443 } else { 80 }, false),
        Some(p) => {
            let ok = !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
            let n: u32 = if ok { p.parse().unwrap_or(0) } else { 0 };
            match u16::try_from(n) {
                Ok(n) if n >= 1 => (n, true),
                _ => return Err(Error::validation(Operation::Config, Reason::BaseUrlPort)),
            }
        }
    };
    Ok(BaseUrl {
        scheme,
        host,
        port,
        explicit_port,
    })
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod loopback_tests {
    use std::net::IpAddr;

    use super::plain_http_address_allowed;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))
    }

    #[test]
    fn plain_http_goes_to_loopback_addresses_only() {
        for ok in ["127.0.0.1", "127.255.255.254", "::1", "::ffff:127.0.0.1"] {
            assert!(plain_http_address_allowed(ip(ok)), "{ok}");
        }
        for bad in [
            "10.0.0.1",
            "0.0.0.0",
            "::",
            "::ffff:10.0.0.1",
            "fe80::1",
            "128.0.0.1",
        ] {
            assert!(!plain_http_address_allowed(ip(bad)), "{bad}");
        }
    }
}

#[cfg(test)]
mod socket_tests {
    use super::{SocketFileFacts, check_unix_socket};
    use crate::Reason;

    fn facts() -> SocketFileFacts {
        SocketFileFacts {
            socket_mode: 0o755,
            is_socket: true,
            socket_uid: 1000,
            dir_mode: 0o700,
            dir_uid: 1000,
        }
    }

    fn reason(f: SocketFileFacts) -> Reason {
        check_unix_socket(f)
            .err()
            .map_or(Reason::Unspecified, |e| e.reason())
    }

    #[test]
    fn socket_owner_and_modes_are_checked() {
        assert_eq!(reason(facts()), Reason::Unspecified);
        // Group-writable socket (umask 002) in a private directory: fine.
        assert_eq!(
            reason(SocketFileFacts {
                socket_mode: 0o775,
                ..facts()
            }),
            Reason::Unspecified
        );
        // A root-owned socket in a root-owned 0755 directory: fine.
        let root = SocketFileFacts {
            socket_uid: 0,
            dir_uid: 0,
            dir_mode: 0o755,
            ..facts()
        };
        assert_eq!(reason(root), Reason::Unspecified);
        assert_eq!(
            reason(SocketFileFacts {
                socket_mode: 0o777,
                ..facts()
            }),
            Reason::SocketWritableByOthers
        );
        for dir_mode in [0o1777, 0o770, 0o702] {
            assert_eq!(
                reason(SocketFileFacts {
                    dir_mode,
                    ..facts()
                }),
                Reason::SocketDirWritableByOthers,
                "{dir_mode:o}"
            );
        }
        assert_eq!(
            reason(SocketFileFacts {
                socket_uid: 1001,
                ..facts()
            }),
            Reason::SocketOwnerMismatch
        );
        assert_eq!(
            reason(SocketFileFacts {
                is_socket: false,
                ..facts()
            }),
            Reason::SocketNotASocket
        );
    }
}
