//! A plain HTTP/1.1 client over raw sockets for the devworker tests: exact
//! bytes in, exact bytes out.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use smolbox_devworker::{Builder, DevWorker};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Generous bound for anything a test waits for (never reached when green).
pub const PATIENCE: Duration = Duration::from_secs(20);

pub async fn start(b: Builder) -> DevWorker {
    b.quiet(true).supervisor_tick(None).start().await.unwrap()
}

pub async fn worker() -> DevWorker {
    start(DevWorker::builder()).await
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub raw: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    /// Asserts status, content type and body exactly.
    pub fn assert(&self, status: u16, ct: Option<&str>, body: &str) {
        assert_eq!(
            self.status,
            status,
            "status; body {:?}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(self.header("content-type"), ct, "content-type");
        assert_eq!(String::from_utf8_lossy(&self.body), body, "body");
        let trace = self.header("x-trace-id").expect("x-trace-id");
        assert!(
            trace.len() == 16
                && trace
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
}

/// Builds a request; `connection: close` so the reply ends at EOF.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || matches!(method, "POST" | "PUT") {
        r.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    r.push_str("\r\n");
    let mut out = r.into_bytes();
    out.extend_from_slice(body);
    out
}

pub fn json_req(method: &str, path: &str, body: &str) -> Vec<u8> {
    request(
        method,
        path,
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
}

pub fn parse(raw: Vec<u8>) -> Resp {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("complete head");
    let head = std::str::from_utf8(&raw[..end]).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Resp {
        status,
        headers,
        body,
        raw,
    }
}

pub fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = data.windows(2).position(|w| w == b"\r\n") {
        let size_str = std::str::from_utf8(&data[..nl]).unwrap();
        let size = usize::from_str_radix(size_str.split(';').next().unwrap().trim(), 16).unwrap();
        data = &data[nl + 2..];
        if size == 0 || data.len() < size {
            out.extend_from_slice(&data[..size.min(data.len())]);
            break;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[(size + 2).min(data.len())..];
    }
    out
}

pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, req: &[u8]) -> Resp {
    s.write_all(req).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut raw))
        .await
        .expect("reply in time")
        .unwrap();
    parse(raw)
}

pub async fn connect(w: &DevWorker) -> TcpStream {
    TcpStream::connect(w.addr()).await.unwrap()
}

/// One request on a fresh TCP connection.
pub async fn send(w: &DevWorker, req: &[u8]) -> Resp {
    exchange(connect(w).await, req).await
}

pub async fn get(w: &DevWorker, path: &str) -> Resp {
    send(w, &request("GET", path, &[], b"")).await
}

pub async fn post(w: &DevWorker, path: &str, body: &str) -> Resp {
    send(w, &json_req("POST", path, body)).await
}

pub async fn create(w: &DevWorker, name: &str) -> Resp {
    let r = post(
        w,
        "/api/v1/machines",
        &format!(r#"{{"name":"{name}","cpus":1,"memoryMb":256}}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

pub async fn exec(w: &DevWorker, name: &str, body: &str) -> Resp {
    post(w, &format!("/api/v1/machines/{name}/exec"), body).await
}

/// Reads from `s` until `buf` satisfies `done` or EOF; returns true on EOF.
pub async fn read_until<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    done: impl Fn(&[u8]) -> bool,
) -> bool {
    let fut = async {
        let mut chunk = [0u8; 8192];
        while !done(buf) {
            let n = s.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return true;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        false
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .expect("condition in time")
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A rustls client config trusting the worker's CA, presenting its client
/// certificate (or none).
pub fn tls_client(
    files: &smolbox_devworker::TlsFiles,
    with_cert: bool,
) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&files.ca_pem).unwrap())
        .unwrap();
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let cfg = if with_cert {
        let cert = CertificateDer::from_pem_file(&files.client_cert_pem).unwrap();
        let key = PrivateKeyDer::from_pem_file(&files.client_key_pem).unwrap();
        b.with_client_auth_cert(vec![cert], key).unwrap()
    } else {
        b.with_no_client_auth()
    };
    Arc::new(cfg)
}

pub fn write_file(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Replaces `"createdAt":<digits>` with `"createdAt":0` for exact comparison.
pub fn zero_created_at(s: &str) -> String {
    let Some(i) = s.find("\"createdAt\":") else {
        return s.to_owned();
    };
    let start = i + "\"createdAt\":".len();
    let end = start + s[start..].bytes().take_while(u8::is_ascii_digit).count();
    format!("{}0{}", &s[..start], &s[end..])
}

/// Waits (bounded by [`PATIENCE`]) for a condition outside the HTTP exchange,
/// such as a host process disappearing.
pub async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// True while `/proc/<pid>` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}
