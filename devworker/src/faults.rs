//! Fault injection: rules that tests switch on per route and/or per machine,
//! through [`Faults`] (the library handle) or `POST /_devworker/faults`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// A worker API route, as faults and request counters name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Route {
    /// `GET /health`
    Health,
    /// `GET /readyz`
    Readyz,
    /// `GET /capacity`
    Capacity,
    /// `GET /metrics`
    Metrics,
    /// `POST /api/v1/machines`
    MachinesCreate,
    /// `GET /api/v1/machines`
    MachinesList,
    /// `GET /api/v1/machines/{name}`
    MachineGet,
    /// `DELETE /api/v1/machines/{name}`
    MachineDelete,
    /// `POST /api/v1/machines/{name}/start`
    MachineStart,
    /// `POST /api/v1/machines/{name}/stop`
    MachineStop,
    /// `POST /api/v1/machines/{name}/exec`
    Exec,
    /// `POST /api/v1/machines/{name}/exec/stream`
    ExecStream,
    /// `GET /api/v1/machines/{name}/exec/interactive`
    Terminal,
    /// `POST /api/v1/machines/{name}/run`
    Run,
    /// `PUT /api/v1/machines/{name}/files/{*path}`
    FilesPut,
    /// `GET /api/v1/machines/{name}/files/{*path}`
    FilesGet,
    /// `GET /api/v1/machines/{name}/logs`
    Logs,
    /// `GET /api/v1/machines/{name}/egress-events`
    EgressEvents,
    /// `GET /api/v1/machines/{name}/images`
    Images,
    /// `POST /api/v1/machines/{name}/images/pull`
    ImagesPull,
    /// `POST /api/v1/machines/{name}/resize`
    Resize,
    /// `POST /api/v1/machines/{name}/fork` (1.9.2) or `/branches` (1.22.0)
    Fork,
    /// `POST /artifacts/warm`
    ArtifactsWarm,
    /// `POST /api/v1/volumes`
    VolumesCreate,
    /// `DELETE /api/v1/volumes/{id}`
    VolumesDelete,
    /// Anything else (unknown paths, wrong methods).
    Other,
}

impl Route {
    /// Stable snake_case name (the control API's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Health => "health",
            Self::Readyz => "readyz",
            Self::Capacity => "capacity",
            Self::Metrics => "metrics",
            Self::MachinesCreate => "machines_create",
            Self::MachinesList => "machines_list",
            Self::MachineGet => "machine_get",
            Self::MachineDelete => "machine_delete",
            Self::MachineStart => "machine_start",
            Self::MachineStop => "machine_stop",
            Self::Exec => "exec",
            Self::ExecStream => "exec_stream",
            Self::Terminal => "terminal",
            Self::Run => "run",
            Self::FilesPut => "files_put",
            Self::FilesGet => "files_get",
            Self::Logs => "logs",
            Self::EgressEvents => "egress_events",
            Self::Images => "images",
            Self::ImagesPull => "images_pull",
            Self::Resize => "resize",
            Self::Fork => "fork",
            Self::ArtifactsWarm => "artifacts_warm",
            Self::VolumesCreate => "volumes_create",
            Self::VolumesDelete => "volumes_delete",
            Self::Other => "other",
        }
    }

    /// Classifies a request by method and path (no routing needed). Returns
    /// the route and, for machine routes, the machine name segment.
    pub fn classify(method: &str, path: &str) -> (Self, Option<String>) {
        let segs: Vec<&str> = path.split('/').skip(1).collect();
        let route = match (method, segs.as_slice()) {
            ("GET" | "HEAD", ["health"]) => Self::Health,
            ("GET" | "HEAD", ["readyz"]) => Self::Readyz,
            ("GET" | "HEAD", ["capacity"]) => Self::Capacity,
            ("GET" | "HEAD", ["metrics"]) => Self::Metrics,
            ("POST", ["api", "v1", "machines"]) => Self::MachinesCreate,
            ("GET" | "HEAD", ["api", "v1", "machines"]) => Self::MachinesList,
            ("GET" | "HEAD", ["api", "v1", "machines", _]) => Self::MachineGet,
            ("DELETE", ["api", "v1", "machines", _]) => Self::MachineDelete,
            ("POST", ["api", "v1", "machines", _, "start"]) => Self::MachineStart,
            ("POST", ["api", "v1", "machines", _, "stop"]) => Self::MachineStop,
            ("POST", ["api", "v1", "machines", _, "exec"]) => Self::Exec,
            ("POST", ["api", "v1", "machines", _, "exec", "stream"]) => Self::ExecStream,
            ("GET", ["api", "v1", "machines", _, "exec", "interactive"]) => Self::Terminal,
            ("POST", ["api", "v1", "machines", _, "run"]) => Self::Run,
            ("PUT", ["api", "v1", "machines", _, "files", ..]) => Self::FilesPut,
            ("GET" | "HEAD", ["api", "v1", "machines", _, "files", ..]) => Self::FilesGet,
            ("GET" | "HEAD", ["api", "v1", "machines", _, "logs"]) => Self::Logs,
            ("GET" | "HEAD", ["api", "v1", "machines", _, "egress-events"]) => Self::EgressEvents,
            ("GET" | "HEAD", ["api", "v1", "machines", _, "images"]) => Self::Images,
            ("POST", ["api", "v1", "machines", _, "images", "pull"]) => Self::ImagesPull,
            ("POST", ["api", "v1", "machines", _, "resize"]) => Self::Resize,
            ("POST", ["api", "v1", "machines", _, "fork" | "branches"]) => Self::Fork,
            ("POST", ["artifacts", "warm"]) => Self::ArtifactsWarm,
            ("POST", ["api", "v1", "volumes"]) => Self::VolumesCreate,
            ("DELETE", ["api", "v1", "volumes", _]) => Self::VolumesDelete,
            _ => Self::Other,
        };
        let machine = match segs.as_slice() {
            ["api", "v1", "machines", name, ..] if !name.is_empty() => Some((*name).to_owned()),
            _ => None,
        };
        (route, machine)
    }
}

/// Which field a mismatched create reply changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MismatchField {
    /// `name` gets a `-other` suffix.
    Name,
    /// `cpus` + 1.
    Cpus,
    /// `memoryMb` + 64.
    Memory,
    /// `storageGb` and `overlayGb` + 1.
    Disks,
    /// `ports` gets an extra `{host: 1, guest: 1}` entry.
    Ports,
}

/// One injectable fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Fault {
    /// Wait this long before handling (and so before replying).
    Delay {
        /// Milliseconds.
        ms: u64,
    },
    /// Close the connection after this many reply bytes (head included).
    DropAfter {
        /// Bytes of the reply that still go out.
        bytes: u64,
    },
    /// After this many reply bytes (head included), write nothing more and
    /// keep the connection open: a silent stall.
    StallAfter {
        /// Bytes of the reply that still go out.
        bytes: u64,
    },
    /// Replace the whole reply with these raw bytes, then close.
    RawReply {
        /// The bytes written instead of the reply.
        bytes: Vec<u8>,
    },
    /// Answer with this status, content type and body instead of handling
    /// (e.g. a `503` readyz, a `401`, a `200` of the wrong media type).
    Reply {
        /// HTTP status code.
        status: u16,
        /// `content-type` header, if any.
        #[serde(default)]
        content_type: Option<String>,
        /// Body text.
        #[serde(default)]
        body: String,
    },
    /// A buffered JSON reply cut in half (content-length matches the cut body).
    TruncateJson,
    /// A buffered JSON reply made invalid (a stray `,` before its last byte).
    MalformedJson,
    /// A buffered reply sent with `content-encoding: gzip`.
    Gzip,
    /// Answer `307 Temporary Redirect` to `location` without handling.
    Redirect {
        /// The `location` header value.
        location: String,
    },
    /// A create reply that differs from the request.
    CreateMismatch {
        /// The field that differs.
        field: MismatchField,
    },
    /// Shorten the request timeout to this: an empty 408 while the command
    /// keeps running.
    Timeout408 {
        /// Milliseconds.
        ms: u64,
    },
    /// Terminal: close frame without the exit text; SSE exec: end of stream
    /// without an `exit` event.
    CloseBeforeExit,
    /// Terminal and SSE exec: kill the program and report exit code 130.
    Exit130,
    /// Terminal: a binary frame header announcing `len` bytes (then a few
    /// bytes and a close of the connection).
    OversizeFrame {
        /// Announced payload length.
        len: u64,
    },
    /// Terminal: a masked server-to-client frame.
    MaskedFrame,
    /// Terminal and SSE exec: after the first output, send nothing more (no
    /// keep-alive), keeping the connection open.
    StallStream,
}

/// A fault rule: which requests it hits, and how many times.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRule {
    /// Route to hit (`None`: every route).
    #[serde(default)]
    pub route: Option<Route>,
    /// Machine to hit (`None`: any machine or none).
    #[serde(default)]
    pub machine: Option<String>,
    /// The fault.
    pub fault: Fault,
    /// How many requests it hits (`None`: until cleared).
    #[serde(default)]
    pub times: Option<u32>,
}

/// Handle to switch faults on and off; cheap to clone, shared with the server.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    rules: Arc<Mutex<Vec<FaultRule>>>,
    counts: Arc<Mutex<BTreeMap<Route, u64>>>,
}

impl Faults {
    /// Adds a rule.
    pub fn add(&self, rule: FaultRule) {
        self.lock_rules().push(rule);
    }

    /// Adds `fault` on `route` until cleared.
    pub fn on(&self, route: Route, fault: Fault) {
        self.add(FaultRule {
            route: Some(route),
            machine: None,
            fault,
            times: None,
        });
    }

    /// Adds `fault` on `route` for the next request only.
    pub fn once(&self, route: Route, fault: Fault) {
        self.add(FaultRule {
            route: Some(route),
            machine: None,
            fault,
            times: Some(1),
        });
    }

    /// Adds `fault` on `route` for requests naming `machine`, until cleared.
    pub fn on_machine(&self, route: Route, machine: &str, fault: Fault) {
        self.add(FaultRule {
            route: Some(route),
            machine: Some(machine.to_owned()),
            fault,
            times: None,
        });
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.lock_rules().clear();
    }

    /// The rules in force.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.lock_rules().clone()
    }

    /// Requests seen on `route` (counted when the request arrives, before
    /// faults and handlers, so tests can prove "no replay").
    pub fn request_count(&self, route: Route) -> u64 {
        self.lock_counts().get(&route).copied().unwrap_or(0)
    }

    /// Every route's request count.
    pub fn request_counts(&self) -> BTreeMap<Route, u64> {
        self.lock_counts().clone()
    }

    pub(crate) fn count(&self, route: Route) {
        *self.lock_counts().entry(route).or_insert(0) += 1;
    }

    /// Takes the faults that hit this request (consuming one use of each).
    pub(crate) fn take(&self, route: Route, machine: Option<&str>) -> Vec<Fault> {
        let mut rules = self.lock_rules();
        let mut hit = Vec::new();
        rules.retain_mut(|rule| {
            let route_ok = rule.route.is_none_or(|r| r == route);
            let machine_ok = rule.machine.as_deref().is_none_or(|m| Some(m) == machine);
            if !(route_ok && machine_ok) {
                return true;
            }
            hit.push(rule.fault.clone());
            match rule.times.as_mut() {
                None => true,
                Some(n) => {
                    *n = n.saturating_sub(1);
                    *n > 0
                }
            }
        });
        hit
    }

    fn lock_rules(&self) -> std::sync::MutexGuard<'_, Vec<FaultRule>> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_counts(&self) -> std::sync::MutexGuard<'_, BTreeMap<Route, u64>> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The faults that hit one request, handed to handlers in its extensions.
#[derive(Clone, Debug, Default)]
pub(crate) struct ActiveFaults(pub(crate) Vec<Fault>);

impl ActiveFaults {
    pub(crate) fn has(&self, f: impl Fn(&Fault) -> bool) -> bool {
        self.0.iter().any(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_routes() {
        assert_eq!(Route::classify("GET", "/health").0, Route::Health);
        let (r, m) = Route::classify("POST", "/api/v1/machines/a1/exec/stream");
        assert_eq!((r, m.as_deref()), (Route::ExecStream, Some("a1")));
        assert_eq!(
            Route::classify("PUT", "/api/v1/machines/a/files/x/y").0,
            Route::FilesPut
        );
        assert_eq!(Route::classify("PUT", "/api/v1/machines").0, Route::Other);
    }

    #[test]
    fn once_rules_are_consumed() {
        let f = Faults::default();
        f.once(Route::Exec, Fault::Gzip);
        f.on_machine(Route::Exec, "m", Fault::MalformedJson);
        assert_eq!(f.take(Route::Exec, Some("x")), vec![Fault::Gzip]);
        assert!(f.take(Route::Exec, Some("x")).is_empty());
        assert_eq!(f.take(Route::Exec, Some("m")), vec![Fault::MalformedJson]);
        assert_eq!(f.take(Route::Exec, Some("m")), vec![Fault::MalformedJson]);
        f.clear();
        assert!(f.take(Route::Exec, Some("m")).is_empty());
    }
}
