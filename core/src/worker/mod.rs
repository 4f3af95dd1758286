//! The smolvm worker API as data: endpoint configuration, version profiles,
//! and one module per operation family that builds the request and decodes
//! and *validates* the reply (features C1.1, C1.2, C2–C4, C6, C8–C11;
//! worker-api.md §1–§12).
//!
//! Every operation is a plain value implementing [`WorkerCall`]: it yields
//! one [`Request`] and decodes one complete reply (head + body) into a typed
//! result or an [`Error`]. Nothing here performs I/O. A shell drives any
//! operation the same way:
//!
//! ```
//! use smolbox_core::worker::{Health, WorkerCall};
//! use smolbox_core::http1::ResponseHead;
//!
//! let call = Health::new();
//! let request = call.request().expect("health needs no validation");
//! assert_eq!(request.target, "/health");
//! // … the shell sends `request` through `core::http1` and reads the reply …
//! let head = ResponseHead {
//!     status: 200,
//!     content_type: Some("application/json".into()),
//!     content_length: Some(87),
//!     chunked: false,
//!     keep_alive: true,
//! };
//! let body = br#"{"status":"ok","version":"1.9.2","machines":{"total":0,"running":0},"uptime_seconds":8}"#;
//! let health = call.decode(&head, body).expect("valid health reply");
//! assert_eq!(health.version, "1.9.2");
//! ```
//!
//! Errors produced by `request` (and by the constructors) carry evidence
//! `not_dispatched`: nothing was sent. Errors produced by `decode` carry
//! `dispatch_uncertain`: the request reached the worker.
//!
//! Streaming replies (console logs, file downloads) also expose an
//! incremental decoder so a shell never buffers beyond the cap.

pub mod endpoint;
pub mod files;
#[cfg(feature = "testkit")]
pub mod fuzzing;
pub mod logs;
pub mod machines;
pub mod mounts;
pub mod network;
pub mod node;
pub mod profile;
pub mod status;
pub mod volumes;
pub mod workload;

mod json;

pub use endpoint::{
    Budgets, ConnectPlan, Endpoint, EndpointConfig, OperationDeadlines, Scheme, SocketFileFacts,
    Target, WorkerId, check_unix_socket, plain_http_address_allowed,
};
pub use files::{
    Download, DownloadSink, FileBudget, GuestPath, PathPolicy, Upload, UploadReply,
    check_byte_budgets,
};
pub use logs::{LogLines, LogStream, Logs, LogsParams};
pub use machines::{
    Create, Delete, Get, ImageCheck, Incarnation, List, MachineName, MachineSpec, MachineState,
    Measure, Namespace, Observation, Source, Start, Stop, same_incarnation,
};
pub use mounts::Mount;
pub use network::{Cidr, Hostname, NetworkPolicy, PortMapping};
pub use node::{Capacity, CapacityReply, Health, HealthReply, Measurements, Metrics, Readyz};
pub use profile::{Feature, Profile, Version};
pub use status::{ErrorBody, ErrorCode, Rejection};
pub use volumes::{VolumeCreate, VolumeDelete, VolumeId};
pub use workload::{RestartPolicy, Workload};

use crate::error::{Error, Operation};
use crate::http1::{Request, ResponseHead};

/// One worker operation as a sans-IO value: the request it sends and the
/// decoder of its reply.
pub trait WorkerCall {
    /// The typed, validated result of a successful reply.
    type Output;

    /// The operation errors are attributed to.
    fn operation(&self) -> Operation;

    /// The request to send.
    ///
    /// # Errors
    /// `validation` or `unsupported_capability`, evidence `not_dispatched`,
    /// when the operation cannot be sent (nothing may be transmitted then).
    fn request(&self) -> Result<Request, Error>;

    /// Decodes and validates a complete reply.
    ///
    /// # Errors
    /// Status, media-type and contract failures, each with evidence
    /// `dispatch_uncertain` (the request reached the worker).
    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Self::Output, Error>;

    /// The reply byte cap this operation needs when it is tighter than the
    /// endpoint's `max_response_bytes` (`None`: use the endpoint's).
    fn max_response_bytes(&self) -> Option<u64> {
        None
    }

    /// False when the receive-idle timeout must not apply (only the
    /// operation deadline does): extended exec.
    fn uses_receive_idle(&self) -> bool {
        true
    }

    /// The image-machine preflight this operation needs (C5.4, C6.1): an
    /// extended command, a launch, a large or out-of-root file. A shell
    /// performs [`ImageCheck::inspect`] inside this operation's deadlines
    /// and sends the operation only when [`ImageCheck::admit`] accepts the
    /// inspect's result. `None` (the default): send at once.
    fn image_check(&self) -> Option<&ImageCheck> {
        None
    }
}

/// The JSON media type.
pub const APPLICATION_JSON: &str = "application/json";
/// The raw-bytes media type of file transfers.
pub const APPLICATION_OCTET_STREAM: &str = "application/octet-stream";
/// The SSE media type.
pub const TEXT_EVENT_STREAM: &str = "text/event-stream";
/// The Prometheus text media type (before parameters).
pub const TEXT_PLAIN: &str = "text/plain";

/// The machines collection path.
pub(crate) const MACHINES_PATH: &str = "/api/v1/machines";

/// `/api/v1/machines/<name>` followed by `suffix` (which starts with `/` or is empty).
pub(crate) fn machine_target(name: &str, suffix: &str) -> String {
    let mut target = String::with_capacity(MACHINES_PATH.len() + 1 + name.len() + suffix.len());
    target.push_str(MACHINES_PATH);
    target.push('/');
    crate::http1::encode::push_path_segment(&mut target, name);
    target.push_str(suffix);
    target
}
