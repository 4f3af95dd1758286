//! [`Client`]: one verified worker operation per call.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smolbox_core::http1::ExchangeConfig;
use smolbox_core::worker::{Endpoint, Scheme, WorkerCall};
use smolbox_core::{Category, Error, Evidence, Operation};

use crate::http::{Deadlines, Exchange};
use crate::pool::{MAX_CONNECTIONS, Pool};
use crate::tls::TlsFiles;
use crate::transport::Target;

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
        endpoint.check_files(Path::is_file)?;
        let target = target_of(&endpoint)?;
        Ok(Self {
            inner: Arc::new(Inner {
                endpoint,
                pool: Arc::new(Pool::new(target, MAX_CONNECTIONS)),
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
        let request = call.request()?;
        let start = Instant::now();
        let deadlines = self.deadlines(start);
        let config = self.exchange_config(call.max_response_bytes(), deadlines.operation);
        let mut exchange = Exchange::start(&self.inner.pool, &request, &config, deadlines)?;
        let head = exchange.head()?;
        let mut body = Vec::new();
        exchange.read_body(&mut body)?;
        call.decode(&head, &body)
    }

    /// The deadlines of an operation starting at `start`.
    pub(crate) fn deadlines(&self, start: Instant) -> Deadlines {
        let b = self.inner.endpoint.budgets();
        let operation = start + b.operation;
        Deadlines {
            operation,
            checkout: (start + b.pool_checkout).min(operation),
            connect: b.connect,
        }
    }

    /// The exchange settings of one request under the endpoint's budgets.
    pub(crate) fn exchange_config(
        &self,
        max_response: Option<u64>,
        deadline: Instant,
    ) -> ExchangeConfig {
        let e = &self.inner.endpoint;
        let b = e.budgets();
        let mut config = ExchangeConfig::new(e.host_header(), deadline);
        config.bearer = e.token().cloned();
        config.max_request_body = usize::try_from(b.max_request_body).unwrap_or(usize::MAX);
        // An operation that expects an empty body (readyz) asks for 0; the
        // exchange's cap is at least 1 and the decoder checks emptiness.
        config.max_response_body = max_response
            .map_or(b.max_response_bytes, |m| m.min(b.max_response_bytes))
            .max(1);
        config.idle_timeout = Some(b.receive_idle);
        config
    }

    /// The endpoint's pool.
    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }

    /// The endpoint's receive-idle budget.
    pub(crate) fn receive_idle(&self) -> Duration {
        self.inner.endpoint.budgets().receive_idle
    }
}

fn target_of(endpoint: &Endpoint) -> Result<Target, Error> {
    use smolbox_core::worker::Target as Where;
    match (endpoint.target(), endpoint.scheme()) {
        (Where::Unix(path), _) => Ok(Target::unix(path)),
        (Where::Tcp { host, port }, Scheme::Http) => Ok(Target::tcp(host, port)),
        (Where::Tcp { host, port }, Scheme::Https) => {
            let Some(ca_file) = endpoint.ca_file() else {
                return Err(Error::new(
                    Category::UnsupportedCapability,
                    Operation::Config,
                    Evidence::NotDispatched,
                )
                .with_reason("tls_requires_ca_file"));
            };
            let files = TlsFiles {
                ca_file: ca_file.to_path_buf(),
                client_identity: endpoint
                    .client_identity()
                    .map(|(c, k)| (c.to_path_buf(), k.to_path_buf())),
            };
            Target::tls(host, port, &files)
        }
    }
}
