//! Worker selection over each transport: a Unix socket, and mutual TLS
//! with `--ca`, `--cert`, `--key` and a token, on both shells.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::{SHELLS, code, smolbox, stderr, stdout};
use smolbox_devworker::DevWorker;

#[test]
fn run_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("w.sock");
    let w = DevWorker::start_blocking(
        DevWorker::builder()
            .version("1.22.0")
            .unix_socket(Some(sock.clone()))
            .quiet(true),
    )
    .unwrap();
    let worker = format!("unix:{}", w.unix_path().unwrap().display());
    for shell in SHELLS {
        let o = smolbox()
            .env("SMOLBOX_WORKER", &worker)
            .args(["--shell", shell, "run", "--", "echo", "via-unix"])
            .output()
            .unwrap();
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert_eq!(stdout(&o), "via-unix\n", "{shell}");
        assert!(
            !stderr(&o).contains("devworker"),
            "{shell}: no in-process devworker"
        );
    }
}

#[test]
fn run_over_mutual_tls_and_refusal_without_the_client_certificate() {
    const TOKEN: &str = "sentinel-tls-token-93ab";
    let w = DevWorker::start_blocking(
        DevWorker::builder()
            .version("1.22.0")
            .tls(true)
            .token(Some(TOKEN))
            .quiet(true),
    )
    .unwrap();
    let files = w.tls_files().unwrap();
    for shell in SHELLS {
        let o = smolbox()
            .env("SMOLBOX_TOKEN", TOKEN)
            .args(["--worker", &w.base_url(), "--shell", shell])
            .args(["--ca", files.ca_pem.to_str().unwrap()])
            .args(["--cert", files.client_cert_pem.to_str().unwrap()])
            .args(["--key", files.client_key_pem.to_str().unwrap()])
            .args(["run", "--", "echo", "via-tls"])
            .output()
            .unwrap();
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert_eq!(stdout(&o), "via-tls\n", "{shell}");

        // Without the client certificate the worker refuses the handshake.
        let o = smolbox()
            .env("SMOLBOX_TOKEN", TOKEN)
            .args(["--worker", &w.base_url(), "--shell", shell])
            .args(["--ca", files.ca_pem.to_str().unwrap()])
            .args(["health"])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_ne!(code(&o), 0, "{shell}");
        assert!(err.contains("category="), "{shell}: {err}");
        assert!(!err.contains(TOKEN), "{shell}: token leaked");
    }
}
