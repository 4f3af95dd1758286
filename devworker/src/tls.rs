//! Mutual TLS: a CA, a server certificate (`localhost`, `127.0.0.1`) and a
//! client certificate generated at start and written as PEM files.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Where the generated PEM files are, and the name the server certificate is
/// valid for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate that signed both the server and the client certificate.
    pub ca_pem: PathBuf,
    /// Client certificate the worker accepts.
    pub client_cert_pem: PathBuf,
    /// The client certificate's private key (PKCS#8).
    pub client_key_pem: PathBuf,
    /// Server name to verify (`localhost`; `127.0.0.1` is also in the SANs).
    pub server_name: String,
}

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Writes a private key file readable by its owner only (0600 from the
/// start, also when it replaces an older file).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode on open: force it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Generates the certificates into `dir` and returns the files and the
/// server's rustls configuration (client certificate required).
pub(crate) fn generate(dir: &Path) -> io::Result<(TlsFiles, Arc<rustls::ServerConfig>)> {
    std::fs::create_dir_all(dir)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "smolbox devworker test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(err)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut server_params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .map_err(err)?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().map_err(err)?;
    let server_cert = server_params.signed_by(&server_key, &issuer).map_err(err)?;

    let mut client_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, "smolbox devworker client");
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().map_err(err)?;
    let client_cert = client_params.signed_by(&client_key, &issuer).map_err(err)?;

    let files = TlsFiles {
        ca_pem: dir.join("ca.pem"),
        client_cert_pem: dir.join("client.pem"),
        client_key_pem: dir.join("client-key.pem"),
        server_name: "localhost".to_owned(),
    };
    std::fs::write(&files.ca_pem, ca_cert.pem())?;
    std::fs::write(&files.client_cert_pem, client_cert.pem())?;
    write_private(&files.client_key_pem, client_key.serialize_pem().as_bytes())?;
    std::fs::write(dir.join("server.pem"), server_cert.pem())?;
    write_private(
        &dir.join("server-key.pem"),
        server_key.serialize_pem().as_bytes(),
    )?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(ca_cert.der().clone()).map_err(err)?;
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .build()
            .map_err(err)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let chain: Vec<CertificateDer<'static>> = vec![server_cert.der().clone()];
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(err)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((files, Arc::new(config)))
}
