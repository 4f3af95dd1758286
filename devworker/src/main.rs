//! `smolbox-devworker`: run the stand-in worker until Ctrl-C or SIGTERM.
//!
//! It is a safe neighbour by default: it requires a bearer token (generated
//! unless given, printed once on stderr and written 0600 to
//! `<state-dir>/token`), refuses a non-loopback `--listen` without one,
//! refuses a `Host` that is not loopback or its bound address (DNS
//! rebinding) and WebSocket upgrades from a foreign `Origin`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use smolbox_devworker::DevWorker;

/// A local stand-in for `smolvm serve`. Commands run on this host WITHOUT
/// isolation.
#[derive(Parser)]
#[command(name = "smolbox-devworker", version)]
struct Args {
    /// TCP listen address. Anything but loopback needs a token (given or
    /// generated; not with --no-token).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Also listen on this Unix socket path.
    #[arg(long)]
    unix_socket: Option<PathBuf>,
    /// State directory (machines, volumes, certificates, the token file);
    /// default: a temporary directory removed on exit.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Impersonated smolvm version: 1.9.2 or 1.22.0.
    #[arg(long, default_value = "1.9.2")]
    impersonate: String,
    /// Require `Authorization: Bearer <TOKEN>` with this token (default: a
    /// random one, printed on stderr and written to `<state-dir>/token`).
    #[arg(long, conflicts_with = "no_token")]
    token: Option<String>,
    /// Require no token (loopback --listen only): any local process, and
    /// any web page the Host/Origin checks let through, can drive it.
    #[arg(long)]
    no_token: bool,
    /// Serve mutual TLS with generated certificates (written to
    /// `<state-dir>/tls/`, keys 0600).
    #[arg(long)]
    tls: bool,
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Args")
            .field("listen", &self.listen)
            .field("unix_socket", &self.unix_socket)
            .field("state_dir", &self.state_dir)
            .field("impersonate", &self.impersonate)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("no_token", &self.no_token)
            .field("tls", &self.tls)
            .finish()
    }
}

fn random_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let (token, generated) = match (&args.token, args.no_token) {
        (Some(t), _) if t.is_empty() => {
            eprintln!("smolbox-devworker: --token is empty");
            std::process::exit(2);
        }
        (Some(t), _) => (Some(t.clone()), false),
        (None, true) => (None, false),
        (None, false) => (Some(random_token()?), true),
    };
    if token.is_none() && !args.listen.ip().is_loopback() {
        eprintln!(
            "smolbox-devworker: refusing to listen on {} without a token (drop --no-token, or listen on loopback)",
            args.listen
        );
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let w = DevWorker::builder()
            .version(&args.impersonate)
            .token(token.as_deref())
            .tls(args.tls)
            .unix_socket(args.unix_socket)
            .state_dir(args.state_dir)
            .listen(args.listen)
            .start()
            .await?;
        if let Some(t) = w.tls_files() {
            eprintln!(
                "smolbox-devworker: mTLS on; CA {}, client certificate {}, client key {}, server name {}",
                t.ca_pem.display(),
                t.client_cert_pem.display(),
                t.client_key_pem.display(),
                t.server_name
            );
        }
        match (&token, generated) {
            (Some(t), true) => {
                let file = w.state_dir().join("token");
                smolbox_devworker::write_private_file(&file, t.as_bytes())?;
                eprintln!(
                    "smolbox-devworker: generated token (also in {}, 0600): {t}",
                    file.display()
                );
            }
            (Some(_), false) => eprintln!("smolbox-devworker: token required (the one given)"),
            (None, _) => eprintln!("smolbox-devworker: WARNING: no token required (--no-token)"),
        }
        eprintln!("smolbox-devworker: listening on {}", w.base_url());
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
        eprintln!("smolbox-devworker: shutting down");
        w.shutdown().await;
        Ok(())
    })
}
