//! `--store postgres://…` over TLS (`$SMOLBOX_STORE_CA`) against the
//! TLS-only server `scripts/pg.sh` starts, and the refusal of plain text to
//! another host. Under `CI=true` a missing server fails the test.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;

use common::{code, devworker, smolbox, stderr};

/// `postgres://smolbox:PASSWORD@127.0.0.1:PORT/postgres` of the TLS server
/// and its CA, or `None` outside the test command.
fn tls_server(password: &str) -> Option<(String, String)> {
    match (
        std::env::var("SMOLBOX_PG_PORT"),
        std::env::var("SMOLBOX_PG_TLS_CA"),
    ) {
        (Ok(port), Ok(ca)) if !port.is_empty() && !ca.is_empty() => {
            let port: u16 = port.parse().unwrap();
            Some((
                format!(
                    "postgres://smolbox:{password}@127.0.0.1:{}/postgres",
                    port + 1
                ),
                ca,
            ))
        }
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("SMOLBOX_PG_PORT/SMOLBOX_PG_TLS_CA are not set in CI")
        }
        _ => {
            eprintln!("PostgreSQL TLS CLI test SKIPPED: run scripts/test.sh");
            None
        }
    }
}

#[test]
fn a_postgres_store_over_tls_records_runs_and_plain_text_is_refused() {
    const PASSWORD: &str = "PWSENTINEL91c2";
    let Some((url, ca)) = tls_server(PASSWORD) else {
        return;
    };
    let w = devworker(None);
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let partition = common::fresh_partition('s');
    let cli = |ca: Option<&str>, store: &str, args: &[&str]| {
        let mut c = smolbox();
        c.env("SMOLBOX_STORE_KEYS", &keys)
            .env("SMOLBOX_STORE_PARTITION", &partition)
            .env_remove("SMOLBOX_STORE_CA")
            .env_remove("SMOLBOX_STORE_PLAINTEXT_REMOTE")
            .args(["--worker", &w.base_url(), "--store", store])
            .args(args);
        if let Some(ca) = ca {
            c.env("SMOLBOX_STORE_CA", ca);
        }
        c.output().unwrap()
    };
    let id = format!("tls-{}", std::process::id());
    let ran = cli(
        Some(&ca),
        &url,
        &["run", "--id", &id, "--", "sh", "-c", "exit 6"],
    );
    assert_eq!(code(&ran), 6, "{}", stderr(&ran));
    let shown = cli(Some(&ca), &url, &["--json", "records", "show", &id]);
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    // Without the CA the store speaks plain text, which this server refuses.
    let plain = cli(None, &url, &["records", "show", &id]);
    assert_ne!(code(&plain), 0);
    // Plain text to another host is refused before any connection.
    let remote = "postgres://smolbox:PWSENTINEL91c2@db.invalid/postgres";
    let refused = cli(None, remote, &["records", "ls"]);
    assert_ne!(code(&refused), 0);
    assert!(
        stderr(&refused).contains("postgres_plaintext_remote"),
        "{}",
        stderr(&refused)
    );
    for o in [&ran, &shown, &plain, &refused] {
        assert!(
            !stderr(o).contains(PASSWORD) && !String::from_utf8_lossy(&o.stdout).contains(PASSWORD)
        );
    }
}
