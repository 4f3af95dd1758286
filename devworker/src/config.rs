//! Start-up configuration: impersonated version, limits and timings.

use std::path::PathBuf;
use std::time::Duration;

/// The worker release the devworker impersonates (`/health.version`, routes
/// and fields follow it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Version {
    /// smolvm 1.9.2: the live contract of worker-api.md §1–§11.
    V1_9_2,
    /// smolvm 1.22.0: the later contract of worker-api.md §12.
    V1_22_0,
}

impl Version {
    /// The version string `/health` reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1_9_2 => "1.9.2",
            Self::V1_22_0 => "1.22.0",
        }
    }

    /// Parses `"1.9.2"` or `"1.22.0"`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "1.9.2" => Some(Self::V1_9_2),
            "1.22.0" => Some(Self::V1_22_0),
            _ => None,
        }
    }

    /// True for the later (1.22.0) contract.
    pub fn is_later(self) -> bool {
        self == Self::V1_22_0
    }
}

/// Limits and timings. The defaults are the real worker's; tests shrink them.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Request timeout of the `/api/v1/machines/...` routes (real: 300 s).
    pub request_timeout: Duration,
    /// SSE keep-alive interval for exec and logs (real: 15 s).
    pub keepalive: Duration,
    /// Supervisor tick that turns never-started `created` machines into
    /// `stopped` (real: 5 s). `None` disables the tick.
    pub supervisor_tick: Option<Duration>,
    /// JSON request body cap (real: 2 MiB).
    pub json_body_max: usize,
    /// File upload body cap (real: 100 MiB).
    pub file_body_max: usize,
    /// Buffered exec cap per stream (real: 11 MiB).
    pub exec_output_max: usize,
    /// SSE exec cumulative output cap (real: 11 MiB).
    pub stream_output_max: usize,
    /// Log follower poll interval (real: 100 ms).
    pub log_poll: Duration,
    /// Maximum concurrent log followers (real: 16).
    pub max_log_followers: usize,
    /// At terminal teardown the PTY's process group gets SIGHUP, then
    /// SIGKILL after this grace.
    pub terminal_hangup_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(300),
            keepalive: Duration::from_secs(15),
            supervisor_tick: Some(Duration::from_secs(5)),
            json_body_max: 2 * 1024 * 1024,
            file_body_max: 100 * 1024 * 1024,
            exec_output_max: 11 * 1024 * 1024,
            stream_output_max: 11 * 1024 * 1024,
            log_poll: Duration::from_millis(100),
            max_log_followers: 16,
            terminal_hangup_grace: Duration::from_secs(2),
        }
    }
}

/// The bearer token: its `Debug` never shows it, and it is compared in
/// constant time.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn new(t: &str) -> Self {
        Self(t.to_owned())
    }

    /// True when `presented` is the token. Both sides are hashed first, so
    /// the comparison takes the same time whatever the lengths and wherever
    /// the first difference is.
    pub(crate) fn matches(&self, presented: &[u8]) -> bool {
        use sha2::{Digest, Sha256};
        let a = Sha256::digest(self.0.as_bytes());
        let b = Sha256::digest(presented);
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Everything the server needs at start.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) version: Version,
    pub(crate) token: Option<Token>,
    /// Refuse a `Host` that is not loopback or the bound address, and a
    /// WebSocket upgrade from a foreign `Origin` (see `Builder::neighbour_checks`).
    pub(crate) neighbour_checks: bool,
    pub(crate) state_dir: PathBuf,
    pub(crate) limits: Limits,
    /// Machine records are written to the state directory (it was given).
    pub(crate) persistent: bool,
    /// At shutdown, leave stand-in VMMs running (the real worker's default)
    /// instead of draining them.
    pub(crate) keep_running: bool,
}
