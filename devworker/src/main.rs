//! `smolbox-devworker`: run the stand-in worker until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use smolbox_devworker::DevWorker;

/// A local stand-in for `smolvm serve`. Commands run on this host WITHOUT
/// isolation.
#[derive(Parser, Debug)]
#[command(name = "smolbox-devworker", version)]
struct Args {
    /// TCP listen address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Also listen on this Unix socket path.
    #[arg(long)]
    unix_socket: Option<PathBuf>,
    /// State directory (machines, volumes, certificates); default: a
    /// temporary directory removed on exit.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Impersonated smolvm version: 1.9.2 or 1.22.0.
    #[arg(long, default_value = "1.9.2")]
    impersonate: String,
    /// Require `Authorization: Bearer <TOKEN>`.
    #[arg(long)]
    token: Option<String>,
    /// Serve mutual TLS with generated certificates (written to
    /// `<state-dir>/tls/`).
    #[arg(long)]
    tls: bool,
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let w = DevWorker::builder()
            .version(&args.impersonate)
            .token(args.token.as_deref())
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
