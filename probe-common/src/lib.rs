//! The shell-independent half of smolbox's conformance probes: the run
//! itself as a sans-IO machine ([`Probe`]), output lines, error classes,
//! options, URL and hex helpers. Both probes (`io-tokio/src/bin/probe.rs`,
//! `io-blocking/examples/probe.rs`) use it; they only connect and drive
//! [`Probe`] with their shell's one driver.

use smolbox_core::Reason;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod session;

pub use session::{FLOOD_MESSAGE, Probe};

use serde_json::{Value, json};
use smolbox_core::http1::Method;
use smolbox_core::{Category, Error};

/// Prints one JSON object per line.
#[derive(Debug)]
pub struct Out;

impl Out {
    /// Writes `v` as one line.
    pub fn emit(&mut self, v: &Value) {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{v}");
        let _ = stdout.flush();
    }
}

/// The exit code of a run: 0 after success; 1 after a failure, whose
/// `error` line is printed (a run the deadline cut short, or one that
/// never started, gets its line here).
pub fn finish(out: &mut Out, run: Result<Probe, Fail>) -> ExitCode {
    match run.as_ref().map(Probe::outcome) {
        Ok(Some(Ok(()))) => ExitCode::SUCCESS,
        Ok(Some(Err(_))) => ExitCode::from(1),
        Ok(None) => {
            out.emit(&Fail::new("timeout", "deadline").to_json());
            ExitCode::from(1)
        }
        Err(fail) => {
            out.emit(&fail.to_json());
            ExitCode::from(1)
        }
    }
}

/// A failure as the probe reports it.
#[derive(Debug)]
pub struct Fail {
    /// The error class (see the probes' docs).
    pub class: &'static str,
    /// A human-readable detail.
    pub detail: String,
    /// The HTTP status, for `status` failures.
    pub status: Option<u16>,
}

impl Fail {
    /// A failure of `class`.
    pub fn new(class: &'static str, detail: impl Into<String>) -> Self {
        Self {
            class,
            detail: detail.into(),
            status: None,
        }
    }

    /// The failure as the probe's `error` line.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"kind": "error", "error": self.class, "detail": self.detail});
        if let Some(s) = self.status {
            v["status"] = json!(s);
        }
        v
    }
}

/// Maps a library error onto the probe's classes.
pub fn classify(e: &Error, handshake: bool) -> Fail {
    let reason = e.reason();
    let class = match (e.category(), reason) {
        (_, Reason::ConnectFailed | Reason::TlsHandshake | Reason::NoRandomness) => "connect",
        (
            Category::Transport,
            Reason::Deadline
            | Reason::IdleTimeout
            | Reason::ConnectTimeout
            | Reason::HandshakeTimeout
            | Reason::CloseWaitExpired
            | Reason::WriteTimeout,
        ) => "timeout",
        (Category::OutputLimit, _) => "too_large",
        (_, Reason::InvalidUtf8) => "invalid_utf8",
        (_, Reason::ContentEncoding) => "unsupported_encoding",
        (_, Reason::AbnormalClose) => "abnormal_close",
        _ if handshake => "handshake",
        (
            Category::Transport,
            Reason::EarlyClose
            | Reason::Truncated
            | Reason::EofDuringHandshake
            | Reason::ReadFailed
            | Reason::WriteFailed,
        ) => "truncated",
        (_, Reason::ContentType | Reason::DuplicateContentType) => "content_type",
        _ => "protocol",
    };
    Fail {
        class,
        detail: e.to_string(),
        status: None,
    }
}

/// The probe's command line.
#[derive(Debug)]
pub struct Opts {
    /// `http`, `sse`, `ws` or `ws-echo`.
    pub mode: String,
    /// Where to go.
    pub url: Url,
    /// The HTTP method (`http` mode).
    pub method: Method,
    /// A JSON request body (`http` mode).
    pub json: Option<String>,
    /// Messages to send in order (`ws` mode): text or binary.
    pub sends: Vec<(bool, Vec<u8>)>,
    /// Close after this many messages (`ws` mode).
    pub recv: Option<usize>,
    /// Flood this many bytes (`ws` mode).
    pub flood: Option<u64>,
    /// `--max-body`.
    pub max_body: u64,
    /// `--max-header`.
    pub max_header: usize,
    /// `--max-frame`.
    pub max_frame: usize,
    /// `--max-message`.
    pub max_message: usize,
    /// `--max-line`.
    pub max_line: usize,
    /// `--max-event`.
    pub max_event: usize,
    /// `--idle-timeout-ms`.
    pub idle: Duration,
    /// `--deadline-ms`.
    pub deadline: Duration,
    /// `--ca` and the optional `--cert`/`--key`.
    pub tls: Option<TlsPaths>,
}

/// The TLS files named on the command line.
#[derive(Debug)]
pub struct TlsPaths {
    /// The CA bundle.
    pub ca_file: PathBuf,
    /// Client certificate and key.
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

/// A parsed `http(s)://` or `ws(s)://` URL.
#[derive(Debug)]
pub struct Url {
    /// `https` or `wss`.
    pub secure: bool,
    /// Host (no brackets).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Path and query.
    pub target: String,
    /// The `Host` header value.
    pub host_header: String,
}

impl Opts {
    /// Parses the arguments of the probe of shell `shell` (`--shell` must
    /// name it).
    ///
    /// # Errors
    /// A usage message.
    pub fn parse(args: &[String], shell: &str) -> Result<Self, String> {
        Self::parse_args(args, shell)
    }

    /// The options of this process's command line; a usage error is
    /// printed to stderr and is exit code 2.
    ///
    /// # Errors
    /// The exit code of a usage error.
    pub fn from_env(shell: &str) -> Result<Self, ExitCode> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Self::parse(&args, shell).map_err(|msg| {
            let _ = writeln!(std::io::stderr(), "usage error: {msg}");
            ExitCode::from(2)
        })
    }

    fn parse_args(args: &[String], shell: &str) -> Result<Self, String> {
        let mut it = args.iter();
        let mode = it.next().ok_or("missing MODE")?.clone();
        if !matches!(mode.as_str(), "http" | "sse" | "ws" | "ws-echo") {
            return Err(format!("unknown mode {mode}"));
        }
        let url = parse_url(it.next().ok_or("missing URL")?)?;
        let mut o = Self {
            mode,
            url,
            method: Method::Get,
            json: None,
            sends: Vec::new(),
            recv: None,
            flood: None,
            max_body: 16 * 1024 * 1024,
            max_header: 16 * 1024,
            max_frame: 65_536,
            max_message: 1_048_576,
            max_line: 131_072,
            max_event: 131_072,
            idle: Duration::from_secs(15),
            deadline: Duration::from_secs(30),
            tls: None,
        };
        let (mut ca, mut cert, mut key) = (None, None, None);
        while let Some(flag) = it.next() {
            let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value"));
            let num = |v: String| {
                v.parse::<u64>()
                    .map_err(|_| format!("{flag}: not a number"))
            };
            match flag.as_str() {
                "--method" => {
                    o.method = match value()?.as_str() {
                        "GET" => Method::Get,
                        "POST" => Method::Post,
                        m => return Err(format!("unsupported method {m}")),
                    }
                }
                "--json" => o.json = Some(value()?),
                "--send" => {
                    let v = value()?;
                    if let Some(t) = v.strip_prefix("text:") {
                        o.sends.push((true, t.as_bytes().to_vec()));
                    } else if let Some(h) = v.strip_prefix("hex:") {
                        o.sends
                            .push((false, hex_decode(h).ok_or("--send hex: bad hex")?));
                    } else {
                        return Err("--send needs text: or hex:".into());
                    }
                }
                "--recv" => {
                    o.recv = Some(usize::try_from(num(value()?)?).map_err(|e| e.to_string())?)
                }
                "--flood" => o.flood = Some(num(value()?)?),
                "--max-body" => o.max_body = num(value()?)?,
                "--max-header" => o.max_header = to_usize(num(value()?)?),
                "--max-frame" => o.max_frame = to_usize(num(value()?)?),
                "--max-message" => o.max_message = to_usize(num(value()?)?),
                "--max-line" => o.max_line = to_usize(num(value()?)?),
                "--max-event" => o.max_event = to_usize(num(value()?)?),
                "--idle-timeout-ms" => o.idle = Duration::from_millis(num(value()?)?),
                "--deadline-ms" => o.deadline = Duration::from_millis(num(value()?)?),
                "--shell" => {
                    let v = value()?;
                    if v != shell {
                        return Err(format!("this probe is the {shell} shell, not {v}"));
                    }
                }
                "--ca" => ca = Some(PathBuf::from(value()?)),
                "--cert" => cert = Some(PathBuf::from(value()?)),
                "--key" => key = Some(PathBuf::from(value()?)),
                other => return Err(format!("unknown flag {other}")),
            }
        }
        if let Some(ca_file) = ca {
            o.tls = Some(TlsPaths {
                ca_file,
                client_identity: cert.zip(key),
            });
        }
        if o.url.secure && o.tls.is_none() {
            return Err("https/wss needs --ca FILE".into());
        }
        Ok(o)
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn parse_url(s: &str) -> Result<Url, String> {
    let (scheme, rest) = s.split_once("://").ok_or("URL needs a scheme")?;
    let secure = match scheme {
        "http" | "ws" => false,
        "https" | "wss" => true,
        _ => return Err(format!("unsupported scheme {scheme}")),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !p.contains(']') => {
            (h.to_owned(), p.parse::<u16>().map_err(|_| "bad port")?)
        }
        _ => (authority.to_owned(), if secure { 443 } else { 80 }),
    };
    if host.is_empty() {
        return Err("URL needs a host".into());
    }
    Ok(Url {
        secure,
        host_header: authority.to_owned(),
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port,
        target: path.to_owned(),
    })
}

/// Decodes hex text.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
