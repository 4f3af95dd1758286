//! How [`PostgresStore`](crate::PostgresStore) reaches its server (C18.3):
//! TLS with rustls and a caller-supplied CA, and the rule that a server
//! which is not on this host is never spoken to in plain text unless the
//! caller explicitly allows it.
//!
//! The connection string is parsed once, here. Neither it nor anything in it
//! (the password above all) ever appears in an error or in `Debug` output.

use smolbox_core::Reason;
use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;

use postgres::config::{Host, SslMode};
use postgres::error::SqlState;
use postgres::{Client, Config, NoTls};
use smolbox_core::{Error, Evidence, Operation};
use smolbox_tls::{ClientTlsBuilder, Peer};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Largest CA bundle accepted (PEM bytes): far above any real bundle, small
/// enough that a wrong path (a disk image, a log) is refused, not read.
/// (`smolbox_tls`'s, the one TLS builder's.)
pub const MAX_CA_BYTES: usize = smolbox_tls::MAX_CA_BYTES;

/// Connection options of a [`PostgresStore`](crate::PostgresStore).
///
/// The default is plain TCP (or a Unix socket), which is accepted only when
/// every host of the connection string is on this machine: a Unix socket,
/// `localhost` or a loopback address. With [`PostgresOptions::ca_pem`] (or
/// [`PostgresOptions::ca_file`], or [`PostgresOptions::system_roots`]) the
/// store speaks TLS only (`sslmode` becomes `require` whatever the string
/// says) and verifies the server's certificate and name against those
/// roots; there is no mode that skips verification. The rustls
/// configuration is `smolbox_tls::ClientTlsBuilder`'s, the one both shells'
/// worker connections use.
#[derive(Clone)]
pub struct PostgresOptions {
    tls: ClientTlsBuilder,
    allow_plaintext_remote: bool,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            tls: ClientTlsBuilder::new(Peer::Postgres),
            allow_plaintext_remote: false,
        }
    }
}

impl core::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("tls", &self.tls())
            .field("allow_plaintext_remote", &self.allow_plaintext_remote)
            .finish()
    }
}

impl PostgresOptions {
    /// Plain connections to this host only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Speak TLS, trusting the certificates of this PEM bundle.
    ///
    /// # Errors
    /// `validation` (`postgres_ca`) when the bundle is larger than
    /// [`MAX_CA_BYTES`], holds no certificate, or a certificate is malformed.
    pub fn ca_pem(mut self, pem: &[u8]) -> Result<Self, Error> {
        self.tls = self.tls.ca_pem(pem)?;
        Ok(self)
    }

    /// [`PostgresOptions::ca_pem`] with the bundle read from a file.
    ///
    /// # Errors
    /// `validation` (`postgres_ca_file`) when the file cannot be read or is
    /// larger than [`MAX_CA_BYTES`]; then as [`PostgresOptions::ca_pem`].
    pub fn ca_file(mut self, path: &Path) -> Result<Self, Error> {
        self.tls = self.tls.ca_file(path)?;
        Ok(self)
    }

    /// Speak TLS, trusting the platform's trust store too (beside a CA
    /// bundle, or alone). Verification stays on: this only adds anchors.
    /// The platform store is read when the store is opened
    /// (`validation`/`tls_system_roots` then if it gives no certificate).
    #[must_use]
    pub fn system_roots(mut self, on: bool) -> Self {
        self.tls = self.tls.system_roots(on);
        self
    }

    /// Allow plain text to a server that is not on this host (a trusted
    /// private network). Off by default.
    #[must_use]
    pub fn allow_plaintext_remote(mut self, allow: bool) -> Self {
        self.allow_plaintext_remote = allow;
        self
    }

    /// Whether connections use TLS.
    pub fn tls(&self) -> bool {
        self.tls.has_trust()
    }
}

/// A parsed connection string with its transport, ready to (re)connect.
pub(crate) struct Connector {
    config: Config,
    tls: Option<MakeRustlsConnect>,
}

impl Connector {
    /// Parses `url` and applies the transport rules; nothing is sent.
    pub(crate) fn new(url: &str, options: &PostgresOptions) -> Result<Self, Error> {
        let op = Operation::Config;
        let mut config =
            Config::from_str(url).map_err(|_| Error::validation(op, Reason::PostgresUrl))?;
        if !options.tls() {
            if !options.allow_plaintext_remote && !only_this_host(&config) {
                return Err(Error::validation(op, Reason::PostgresPlaintextRemote));
            }
            return Ok(Self { config, tls: None });
        }
        if config
            .get_hosts()
            .iter()
            .any(|h| !matches!(h, Host::Tcp(_)))
        {
            // TLS over a Unix socket is not a thing PostgreSQL does.
            return Err(Error::validation(op, Reason::PostgresTlsUnixSocket));
        }
        config.ssl_mode(SslMode::Require);
        let client = options.tls.clone().build()?;
        Ok(Self {
            config,
            tls: Some(MakeRustlsConnect::new(client)),
        })
    }

    /// Opens one connection.
    pub(crate) fn connect(&self, op: Operation) -> Result<Client, Error> {
        let result = match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(NoTls),
        };
        result.map_err(|e| connect_error(op, &e))
    }
}

/// Every host of the string is this machine: a Unix socket, `localhost`,
/// or a loopback address (and so is every `hostaddr`).
fn only_this_host(config: &Config) -> bool {
    let hosts = config.get_hosts().iter().all(|h| match h {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .trim_matches(|c| c == '[' || c == ']')
                    .parse::<IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    });
    hosts && config.get_hostaddrs().iter().all(IpAddr::is_loopback)
}

/// A failed connect: `store`, with `postgres_tls` when the TLS layer
/// refused (an untrusted certificate, a name mismatch, a server without
/// TLS), else the usual classification.
fn connect_error(op: Operation, e: &postgres::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<rustls::Error>().is_some() {
            return Error::store(op, Evidence::Unknown, Reason::PostgresTls);
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
        {
            return Error::store(op, Evidence::Unknown, Reason::PostgresTls);
        }
        source = s.source();
    }
    if e.to_string().contains("server does not support TLS") {
        return Error::store(op, Evidence::Unknown, Reason::PostgresTls);
    }
    pg_error(op, e)
}

/// Maps a PostgreSQL failure to a `store` error (never `not_found`).
pub(crate) fn pg_error(op: Operation, e: &postgres::Error) -> Error {
    let reason = match e.code() {
        None if e.is_closed() => Reason::PostgresUnavailable,
        None => Reason::PostgresIo,
        Some(c) if *c == SqlState::UNIQUE_VIOLATION || *c == SqlState::FOREIGN_KEY_VIOLATION => {
            Reason::PostgresConstraint
        }
        Some(c)
            if *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::T_R_SERIALIZATION_FAILURE =>
        {
            Reason::PostgresContention
        }
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CANNOT_CONNECT_NOW => {
            Reason::PostgresUnavailable
        }
        Some(_) => Reason::Postgres,
    };
    Error::store(op, Evidence::Unknown, reason)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is the failure report
    use super::*;
    use smolbox_core::Category;

    fn reason(r: Result<Connector, Error>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(e) => e.reason().as_str(),
        }
    }

    #[test]
    fn plain_text_only_to_this_host() {
        let plain = PostgresOptions::new();
        for ok in [
            "host=127.0.0.1 port=5432 user=x",
            "host=localhost user=x",
            "host=::1 user=x",
            "host=/run/postgresql user=x",
            "postgresql://x@127.0.0.2:5/db",
            "postgresql://x@[::1]:5/db",
        ] {
            assert_eq!(reason(Connector::new(ok, &plain)), "ok", "{ok}");
        }
        for remote in [
            "host=db.example.com user=x",
            "host=192.0.2.1 user=x",
            "host=127.0.0.1,192.0.2.1 user=x",
            "host=localhost hostaddr=192.0.2.1 user=x",
            "postgresql://x:secret@db.example.com/db",
        ] {
            let e = Connector::new(remote, &plain)
                .err()
                .unwrap_or_else(|| panic!("{remote}"));
            assert_eq!(e.reason(), Reason::PostgresPlaintextRemote);
            assert_eq!(e.category(), Category::Validation);
            assert!(!e.may_have_reached_worker());
            assert_eq!(
                reason(Connector::new(
                    remote,
                    &plain.clone().allow_plaintext_remote(true)
                )),
                "ok"
            );
        }
    }

    #[test]
    fn errors_never_show_the_connection_string() {
        let e = Connector::new(
            "postgresql://x:hunter2@db.example.com/db",
            &PostgresOptions::new(),
        )
        .err();
        let shown = format!("{e:?} {}", e.map(|e| e.to_string()).unwrap_or_default());
        assert!(
            !shown.contains("hunter2") && !shown.contains("example"),
            "{shown}"
        );
        let e = Connector::new(
            "host='unterminated password=hunter2",
            &PostgresOptions::new(),
        )
        .err();
        assert_eq!(e.map(|e| e.reason()), Some(Reason::PostgresUrl));
    }

    #[test]
    fn a_ca_bundle_must_hold_certificates_and_stay_under_the_cap() {
        let e = PostgresOptions::new().ca_pem(b"not a certificate").err();
        assert_eq!(e.map(|e| e.reason()), Some(Reason::PostgresCa));
        let e = PostgresOptions::new()
            .ca_pem(&vec![b' '; MAX_CA_BYTES + 1])
            .err();
        assert_eq!(
            e.and_then(|e| e.limit()).map(|l| l.max),
            Some(MAX_CA_BYTES as u64)
        );
        let bad = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(
            PostgresOptions::new().ca_pem(bad).err().map(|e| e.reason()),
            Some(Reason::PostgresCa)
        );
        // A real certificate padded to exactly the cap is accepted; one
        // byte more is refused before parsing.
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["db.test".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        let mut at_cap = cert.clone().into_bytes();
        at_cap.resize(MAX_CA_BYTES, b'\n');
        assert!(PostgresOptions::new().ca_pem(&at_cap).unwrap().tls());
        at_cap.push(b'\n');
        let e = PostgresOptions::new().ca_pem(&at_cap).err();
        assert_eq!(e.map(|e| e.reason()), Some(Reason::PostgresCa));
        let e = PostgresOptions::new()
            .ca_file(Path::new("/nonexistent/ca.pem"))
            .err();
        assert_eq!(e.map(|e| e.reason()), Some(Reason::PostgresCaFile));
    }
}
