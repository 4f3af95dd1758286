//! Node endpoints: health, readiness, capacity, metrics (features C2.1–C2.3),
//! and the machine measurements read from a machine reply (C2.4).

use crate::Reason;
use serde::Deserialize;

use super::WorkerCall;
use super::json::decode_json;
use super::status::{check_media_type, check_status};
use crate::error::{Error, Operation};
use crate::http1::{Method, Request, ResponseHead};

/// The longest health `version` text in bytes.
pub const MAX_VERSION_LEN: usize = 64;
/// The largest machine count a health reply may report.
pub const MAX_HEALTH_MACHINES: u64 = 1_000_000;

/// `GET /health` (C2.1).
#[derive(Clone, Copy, Debug, Default)]
pub struct Health;

impl Health {
    /// The health read.
    pub const fn new() -> Self {
        Self
    }
}

/// A validated health reply. Counts the worker did not report stay `None`
/// (never zero).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReply {
    /// The exact version text (semver, ≤64 bytes). Admit with [`super::Profile::admit`].
    pub version: String,
    /// Machine records, when reported (0–1,000,000).
    pub total: Option<u64>,
    /// Running machines, when reported (≤ `total`).
    pub running: Option<u64>,
    /// Seconds since the worker started, when reported.
    pub uptime_seconds: Option<u64>,
}

#[derive(Deserialize)]
struct HealthWire {
    status: String,
    version: String,
    machines: Option<MachinesWire>,
    uptime_seconds: Option<u64>,
}

#[derive(Deserialize)]
struct MachinesWire {
    total: u64,
    running: u64,
}

impl WorkerCall for Health {
    type Output = HealthReply;

    fn operation(&self) -> Operation {
        Operation::Health
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(
            Request::new(Operation::Health, Method::Get, "/health".into())
                .accept(super::APPLICATION_JSON),
        )
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<HealthReply, Error> {
        let op = Operation::Health;
        let w: HealthWire = decode_json(op, head, body)?;
        if w.status != "ok" {
            return Err(Error::protocol(op, Reason::HealthStatusNotOk));
        }
        if !is_semver(&w.version) {
            return Err(Error::protocol(op, Reason::HealthVersionInvalid));
        }
        let (total, running) = match w.machines {
            None => (None, None),
            Some(m) => {
                if m.total > MAX_HEALTH_MACHINES {
                    return Err(Error::protocol(op, Reason::HealthTotalOutOfRange)
                        .with_limit(m.total, MAX_HEALTH_MACHINES));
                }
                if m.running > m.total {
                    return Err(Error::protocol(op, Reason::HealthRunningExceedsTotal)
                        .with_limit(m.running, m.total));
                }
                (Some(m.total), Some(m.running))
            }
        };
        Ok(HealthReply {
            version: w.version,
            total,
            running,
            uptime_seconds: w.uptime_seconds,
        })
    }
}

/// True for semver-shaped text of at most 64 bytes:
/// `MAJOR.MINOR.PATCH` (no leading zeros) with optional `-pre` and `+build`
/// of `[0-9A-Za-z.-]`.
pub fn is_semver(v: &str) -> bool {
    if v.is_empty() || v.len() > MAX_VERSION_LEN {
        return false;
    }
    let (core, build) = v.split_once('+').map_or((v, None), |(c, b)| (c, Some(b)));
    let (core, pre) = core
        .split_once('-')
        .map_or((core, None), |(c, p)| (c, Some(p)));
    let ident_ok = |s: &str| {
        !s.is_empty()
            && s.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    let nums: Vec<&str> = core.split('.').collect();
    nums.len() == 3
        && nums.iter().all(|n| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && (n.len() == 1 || !n.starts_with('0'))
        })
        && pre.is_none_or(ident_ok)
        && build.is_none_or(ident_ok)
}

/// `GET /readyz` (C2.2): exactly 200 with an empty body; the content type
/// is ignored.
#[derive(Clone, Copy, Debug, Default)]
pub struct Readyz;

impl WorkerCall for Readyz {
    type Output = ();

    fn operation(&self) -> Operation {
        Operation::Readyz
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(Request::new(
            Operation::Readyz,
            Method::Get,
            "/readyz".into(),
        ))
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<(), Error> {
        check_status(Operation::Readyz, head, body, 200)?;
        if body.is_empty() {
            Ok(())
        } else {
            Err(Error::protocol(Operation::Readyz, Reason::ReadyzBodyNotEmpty).with_status(200))
        }
    }

    fn max_response_bytes(&self) -> Option<u64> {
        // Room to classify a non-empty reply as `protocol` rather than a cap hit.
        Some(4_096)
    }
}

/// `GET /capacity` (C2.3).
#[derive(Clone, Copy, Debug, Default)]
pub struct Capacity;

/// The longest `boot_id` kept, in bytes.
pub const MAX_BOOT_ID_LEN: usize = 256;

/// Typed worker usage. A failed read is an error, never zero usage; a
/// changed `boot_id` proves nothing about guests or reservations.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityReply {
    /// CPUs allocated to machines.
    pub allocated_cpus: u32,
    /// Memory allocated to machines, MiB.
    pub allocated_memory_mb: u64,
    /// CPUs in use (fractional, finite, ≥ 0).
    pub used_cpus: f64,
    /// Memory in use, MiB.
    pub used_memory_mb: u64,
    /// Disk in use, GiB.
    pub used_disk_gb: u64,
    /// Host memory total, MiB (later versions only).
    pub host_memory_total_mb: Option<u64>,
    /// Host memory available, MiB (later versions only).
    pub host_memory_available_mb: Option<u64>,
    /// The serve process boot id (`<pid>-<unix nanos>`), when reported.
    pub boot_id: Option<String>,
}

#[derive(Deserialize)]
struct CapacityWire {
    allocated_cpus: u32,
    allocated_memory_mb: u64,
    used_cpus: f64,
    used_memory_mb: u64,
    used_disk_gb: u64,
    host_memory_total_mb: Option<u64>,
    host_memory_available_mb: Option<u64>,
    boot_id: Option<String>,
}

impl WorkerCall for Capacity {
    type Output = CapacityReply;

    fn operation(&self) -> Operation {
        Operation::Capacity
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(
            Request::new(Operation::Capacity, Method::Get, "/capacity".into())
                .accept(super::APPLICATION_JSON),
        )
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<CapacityReply, Error> {
        let op = Operation::Capacity;
        let w: CapacityWire = decode_json(op, head, body)?;
        if !w.used_cpus.is_finite() || w.used_cpus < 0.0 {
            return Err(Error::protocol(op, Reason::CapacityUsedCpusInvalid));
        }
        if w.boot_id
            .as_ref()
            .is_some_and(|b| b.len() > MAX_BOOT_ID_LEN)
        {
            return Err(Error::protocol(op, Reason::CapacityBootIdTooLong));
        }
        Ok(CapacityReply {
            allocated_cpus: w.allocated_cpus,
            allocated_memory_mb: w.allocated_memory_mb,
            used_cpus: w.used_cpus,
            used_memory_mb: w.used_memory_mb,
            used_disk_gb: w.used_disk_gb,
            host_memory_total_mb: w.host_memory_total_mb,
            host_memory_available_mb: w.host_memory_available_mb,
            boot_id: w.boot_id,
        })
    }
}

/// `GET /metrics` (C2.3): UTF-8 `text/plain`, bounded by the endpoint's
/// max response bytes, returned uninterpreted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics;

impl WorkerCall for Metrics {
    type Output = String;

    fn operation(&self) -> Operation {
        Operation::Metrics
    }

    fn request(&self) -> Result<Request, Error> {
        Ok(
            Request::new(Operation::Metrics, Method::Get, "/metrics".into())
                .accept(super::TEXT_PLAIN),
        )
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<String, Error> {
        let op = Operation::Metrics;
        check_status(op, head, body, 200)?;
        check_media_type(op, head, super::TEXT_PLAIN)?;
        match std::str::from_utf8(body) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(Error::protocol(op, Reason::MetricsNotUtf8)),
        }
    }
}

/// Machine measurements from one machine reply (C2.4). `None` means the
/// worker did not report it (unknown); zero is a real zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measurements {
    /// CPU seconds of the current VMM process.
    pub cpu_seconds: Option<u64>,
    /// The same sample in milliseconds.
    pub cpu_millis: Option<u64>,
    /// VMM resident set, MiB.
    pub rss_mb: Option<u64>,
    /// Proportional set size, MiB (later versions).
    pub pss_mb: Option<u64>,
    /// Private memory, MiB (later versions).
    pub private_memory_mb: Option<u64>,
    /// Shared mapped memory, MiB (later versions).
    pub shared_memory_mapped_mb: Option<u64>,
    /// Allocated blocks of the machine's data dir, MiB.
    pub disk_used_mb: Option<u64>,
    /// Cumulative guest egress bytes (virtio-net only).
    pub egress_bytes: Option<u64>,
}
