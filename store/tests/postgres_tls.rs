//! `PostgresStore` over TLS (C18.3): the whole conformance suite against a
//! server that refuses plain connections, plus the refusals: a plain
//! connection, an untrusted certificate, a bundle that is not a CA.
//! Reads `SMOLBOX_PG_TLS_URL` and `SMOLBOX_PG_TLS_CA` (set by
//! `scripts/pg.sh`, which starts that server with a generated certificate);
//! in CI a missing URL fails the run instead of skipping.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use smolbox_core::Reason;
mod conformance;
mod pg_common;

use pg_common::fresh_partition;

use std::path::PathBuf;
use std::sync::Arc;

use smolbox_core::Category;
use smolbox_core::managed::testkit::fingerprint_key;
use smolbox_store::{EncryptionKey, PostgresOptions, PostgresStore, Sealer, Store};

fn server() -> Option<(String, PathBuf)> {
    match (
        std::env::var("SMOLBOX_PG_TLS_URL"),
        std::env::var("SMOLBOX_PG_TLS_CA"),
    ) {
        (Ok(u), Ok(ca)) if !u.is_empty() && !ca.is_empty() => Some((u, PathBuf::from(ca))),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("SMOLBOX_PG_TLS_URL/CA are not set in CI: scripts/pg.sh starts a TLS server")
        }
        _ => {
            eprintln!(
                "PostgreSQL TLS suite SKIPPED: SMOLBOX_PG_TLS_URL is not set (run scripts/test.sh)"
            );
            None
        }
    }
}

fn sealer(partition: &str) -> Sealer {
    let k = EncryptionKey::new([7; 32], &fingerprint_key()).unwrap();
    Sealer::new(&k, partition).unwrap()
}

struct Tls {
    url: String,
    options: PostgresOptions,
    partition: String,
    first: Arc<PostgresStore>,
}

impl conformance::Harness for Tls {
    fn store(&self) -> Arc<dyn Store> {
        self.first.clone()
    }
    fn another(&self) -> Arc<dyn Store> {
        Arc::new(
            PostgresStore::connect_with(&self.url, sealer(&self.partition), &self.options).unwrap(),
        )
    }
}

fn make() -> Option<Tls> {
    let (url, ca) = server()?;
    let options = PostgresOptions::new().ca_file(&ca).unwrap();
    let partition = fresh_partition('t');
    let first = Arc::new(PostgresStore::connect_with(&url, sealer(&partition), &options).unwrap());
    Some(Tls {
        url,
        options,
        partition,
        first,
    })
}

conformance_tests!(make);

#[test]
fn the_store_speaks_tls_to_the_server() {
    let Some((url, ca)) = server() else { return };
    let options = PostgresOptions::new().ca_file(&ca).unwrap();
    let store = PostgresStore::connect_with(&url, sealer(&fresh_partition('t')), &options).unwrap();
    assert!(store.info().durable);
    // pg_hba accepts only `hostssl` on this server, so the open above
    // proves TLS; check that the server does reject a plain session.
    let plain = postgres::Client::connect(&url, postgres::NoTls);
    assert!(
        plain.is_err(),
        "the test server must refuse plain connections"
    );
}

#[test]
fn a_plain_connection_to_a_tls_only_server_is_a_store_error() {
    let Some((url, _)) = server() else { return };
    let e = PostgresStore::connect(&url, sealer(&fresh_partition('t'))).unwrap_err();
    assert_eq!(e.category(), Category::Store, "{e}");
}

#[test]
fn an_untrusted_server_certificate_is_refused_as_tls() {
    let Some((url, _)) = server() else { return };
    let key = rcgen::KeyPair::generate().unwrap();
    let other_ca = rcgen::CertificateParams::new(vec!["127.0.0.1".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem();
    let options = PostgresOptions::new().ca_pem(other_ca.as_bytes()).unwrap();
    let e = PostgresStore::connect_with(&url, sealer(&fresh_partition('t')), &options).unwrap_err();
    assert_eq!(e.category(), Category::Store, "{e}");
    assert_eq!(e.reason(), Reason::PostgresTls, "{e}");
}

#[test]
fn a_name_the_certificate_does_not_cover_is_refused_as_tls() {
    let Some((url, ca)) = server() else { return };
    // The certificate covers 127.0.0.1 and localhost, not db.invalid;
    // `hostaddr` still reaches the server, `host` is the name verified.
    let url = url.replace("host=127.0.0.1", "host=db.invalid hostaddr=127.0.0.1");
    assert!(
        url.contains("db.invalid"),
        "scripts/pg.sh's URL names host=127.0.0.1"
    );
    let options = PostgresOptions::new().ca_file(&ca).unwrap();
    let e = PostgresStore::connect_with(&url, sealer(&fresh_partition('t')), &options).unwrap_err();
    assert_eq!(e.reason(), Reason::PostgresTls, "{e}");
}

#[test]
fn system_roots_add_trust_and_never_replace_verification() {
    let Some((url, ca)) = server() else { return };
    // The test server's CA is in the file only: with the platform's roots
    // alone the server is refused (or, on a machine with an empty trust
    // store, the options are refused before any connection).
    let options = PostgresOptions::new().system_roots(true);
    assert!(options.tls());
    let e = PostgresStore::connect_with(&url, sealer(&fresh_partition('t')), &options).unwrap_err();
    assert!(
        matches!(
            (e.category(), e.reason()),
            (Category::Store, Reason::PostgresTls) | (Category::Validation, Reason::TlsSystemRoots)
        ),
        "{e}"
    );
    // Beside the file, the same server is accepted.
    let options = PostgresOptions::new()
        .ca_file(&ca)
        .unwrap()
        .system_roots(true);
    match PostgresStore::connect_with(&url, sealer(&fresh_partition('t')), &options) {
        Ok(store) => assert!(store.info().durable),
        Err(e) => assert_eq!(e.reason(), Reason::TlsSystemRoots, "{e}"),
    }
}
