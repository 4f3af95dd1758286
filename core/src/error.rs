//! The one error value of smolbox (features C0.2).
//!
//! Every failure is an [`Error`] with a [`Category`], an [`Operation`], an
//! [`Evidence`] and an optional guest exit code. A [`Error::reason`] is one
//! variant of the closed [`Reason`] enum chosen at the failure site (its
//! stable snake_case code is [`Reason::as_str`]), and [`Error::limit`] the
//! numbers a limit failure carries (observed, allowed). Neither can hold peer
//! bytes: a reason is a fieldless enum, a limit is two integers. So no error ever
//! carries a response body, a credential, command text, environment, stdin,
//! file bytes or output (AC-0.2.2), whatever `Display` or `Debug` prints.
//!
//! An error is built one way: by the constructor of its category
//! ([`Error::validation`], [`Error::transport`], [`Error::store`], … one per
//! [`Category`]), which takes the operation, the evidence (except where the
//! category fixes it: `validation`, `unsupported_capability` and
//! `admission_exhausted` are `not_dispatched`, `protocol` is
//! `dispatch_uncertain`) and the reason. The `with_*` methods then add what
//! was observed (a limit, a status, an exit code, stronger evidence).

use core::fmt;

mod reason;
pub use reason::Reason;

/// What kind of failure this is (closed: adding one is a stored-format change).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// The caller's input broke a rule; nothing was sent.
    Validation,
    /// The worker version or transport lacks the feature.
    UnsupportedCapability,
    /// The network policy cannot be expressed or was not honoured.
    UnsupportedNetworkPolicy,
    /// 401/403, or a handle used by the wrong consumer.
    Authentication,
    /// No capacity, queue full, command slot busy.
    AdmissionExhausted,
    /// A budget or deadline ran out.
    Expired,
    /// Connect, read, write or timeout failures of the connection.
    Transport,
    /// The peer broke the protocol or the contract.
    Protocol,
    /// A byte, count or size cap was hit.
    OutputLimit,
    /// The same identity with a different meaning.
    IdentityConflict,
    /// A host port is taken.
    PortConflict,
    /// The peer or store positively reported absence.
    NotFound,
    /// The store failed (unavailable, corrupt, unknown version).
    Store,
    /// A lease or claim is held by someone else or expired.
    StaleClaim,
    /// A compare-and-swap version did not match.
    StaleVersion,
    /// The outcome cannot be known.
    Unknown,
    /// Cleanup could not be completed.
    Cleanup,
}

impl Category {
    /// The snake_case name used in output and stored records.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Validation => "validation",
            Self::UnsupportedCapability => "unsupported_capability",
            Self::UnsupportedNetworkPolicy => "unsupported_network_policy",
            Self::Authentication => "authentication",
            Self::AdmissionExhausted => "admission_exhausted",
            Self::Expired => "expired",
            Self::Transport => "transport",
            Self::Protocol => "protocol",
            Self::OutputLimit => "output_limit",
            Self::IdentityConflict => "identity_conflict",
            Self::PortConflict => "port_conflict",
            Self::NotFound => "not_found",
            Self::Store => "store",
            Self::StaleClaim => "stale_claim",
            Self::StaleVersion => "stale_version",
            Self::Unknown => "unknown",
            Self::Cleanup => "cleanup",
        }
    }

    /// Every category, in declaration order.
    pub const ALL: [Self; 17] = [
        Self::Validation,
        Self::UnsupportedCapability,
        Self::UnsupportedNetworkPolicy,
        Self::Authentication,
        Self::AdmissionExhausted,
        Self::Expired,
        Self::Transport,
        Self::Protocol,
        Self::OutputLimit,
        Self::IdentityConflict,
        Self::PortConflict,
        Self::NotFound,
        Self::Store,
        Self::StaleClaim,
        Self::StaleVersion,
        Self::Unknown,
        Self::Cleanup,
    ];
}

/// What is known about whether a request reached the worker and what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Evidence {
    /// Not one byte of the request could have left the process.
    NotDispatched,
    /// The request may have reached the worker; its effect is unknown.
    DispatchUncertain,
    /// The command was seen running.
    RunningObserved,
    /// The command's exit was observed.
    Exited,
    /// The guest is known to have stopped (no exit status).
    TerminationConfirmed,
    /// Nothing can be said.
    Unknown,
}

impl Evidence {
    /// The snake_case name used in output and stored records.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotDispatched => "not_dispatched",
            Self::DispatchUncertain => "dispatch_uncertain",
            Self::RunningObserved => "running_observed",
            Self::Exited => "exited",
            Self::TerminationConfirmed => "termination_confirmed",
            Self::Unknown => "unknown",
        }
    }

    /// True when the request may have reached the worker (anything but
    /// `not_dispatched`). Such a mutation must never be resent (AC-0.2.3).
    pub const fn may_have_reached_worker(self) -> bool {
        !matches!(self, Self::NotDispatched)
    }
}

/// Which operation failed (closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)] // the names are the documentation
pub enum Operation {
    // Configuration and local validation.
    Config,
    RequestSize,
    MachineSpec,
    CommandSpec,
    TerminalSpec,
    GuestPath,
    Preflight,
    // HTTP and framing (used where no worker operation is known yet).
    Http,
    Sse,
    WebSocket,
    // Node.
    Health,
    Readyz,
    Capacity,
    Metrics,
    Measurements,
    // Machines.
    Create,
    List,
    Get,
    Start,
    Stop,
    Delete,
    // Exec.
    Exec,
    ExecStream,
    Launch,
    // Files, logs, volumes.
    Upload,
    Download,
    Logs,
    VolumeCreate,
    VolumeDelete,
    // Terminals (C7.3 names the timers' operations).
    TerminalOpen,
    TerminalInput,
    TerminalResize,
    TerminalOutput,
    TerminalClose,
    TerminalSession,
    TerminalConsumer,
    TerminalIdle,
    // Managed layer and store.
    Fingerprint,
    Envelope,
    Encryption,
    StoreAccept,
    StoreFetch,
    StoreFind,
    StoreClaim,
    StoreWrite,
    StoreReserve,
    StoreRelease,
    StoreSlot,
    StoreCancel,
    StoreDue,
    StoreUsage,
    StoreMigrate,
    Submit,
    Await,
    Cancel,
    Recover,
    Resolve,
}

impl Operation {
    /// The snake_case name used in output and stored records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::RequestSize => "request_size",
            Self::MachineSpec => "machine_spec",
            Self::CommandSpec => "command_spec",
            Self::TerminalSpec => "terminal_spec",
            Self::GuestPath => "guest_path",
            Self::Preflight => "preflight",
            Self::Http => "http",
            Self::Sse => "sse",
            Self::WebSocket => "websocket",
            Self::Health => "health",
            Self::Readyz => "readyz",
            Self::Capacity => "capacity",
            Self::Metrics => "metrics",
            Self::Measurements => "measurements",
            Self::Create => "create",
            Self::List => "list",
            Self::Get => "get",
            Self::Start => "start",
            Self::Stop => "stop",
            Self::Delete => "delete",
            Self::Exec => "exec",
            Self::ExecStream => "exec_stream",
            Self::Launch => "launch",
            Self::Upload => "upload",
            Self::Download => "download",
            Self::Logs => "logs",
            Self::VolumeCreate => "volume_create",
            Self::VolumeDelete => "volume_delete",
            Self::TerminalOpen => "terminal_open",
            Self::TerminalInput => "terminal_input",
            Self::TerminalResize => "terminal_resize",
            Self::TerminalOutput => "terminal_output",
            Self::TerminalClose => "terminal_close",
            Self::TerminalSession => "terminal_session",
            Self::TerminalConsumer => "terminal_consumer",
            Self::TerminalIdle => "terminal_idle",
            Self::Fingerprint => "fingerprint",
            Self::Envelope => "envelope",
            Self::Encryption => "encryption",
            Self::StoreAccept => "store_accept",
            Self::StoreFetch => "store_fetch",
            Self::StoreFind => "store_find",
            Self::StoreClaim => "store_claim",
            Self::StoreWrite => "store_write",
            Self::StoreReserve => "store_reserve",
            Self::StoreRelease => "store_release",
            Self::StoreSlot => "store_slot",
            Self::StoreCancel => "store_cancel",
            Self::StoreDue => "store_due",
            Self::StoreUsage => "store_usage",
            Self::StoreMigrate => "store_migrate",
            Self::Submit => "submit",
            Self::Await => "await",
            Self::Cancel => "cancel",
            Self::Recover => "recover",
            Self::Resolve => "resolve",
        }
    }
}

/// Numbers a limit failure carries: what was seen and what is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The observed (or declared) amount.
    pub actual: u64,
    /// The largest allowed amount.
    pub max: u64,
}

/// A smolbox failure. See the module docs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Error {
    category: Category,
    operation: Operation,
    evidence: Evidence,
    exit_code: Option<i32>,
    reason: Reason,
    limit: Option<Limit>,
    status: Option<u16>,
    close_code: Option<u16>,
}

impl Error {
    /// The one place an error is put together; every category constructor
    /// below calls it, and code outside this module uses those (one fault,
    /// one spelling). Crate-internal mappings that compute the category from
    /// a peer's answer (an HTTP status, a WebSocket close) use it too.
    pub(crate) const fn of(
        category: Category,
        operation: Operation,
        evidence: Evidence,
        reason: Reason,
    ) -> Self {
        Self {
            category,
            operation,
            evidence,
            exit_code: None,
            reason,
            limit: None,
            status: None,
            close_code: None,
        }
    }

    /// A `validation` error: the caller's input broke a rule; nothing was sent (evidence `not_dispatched`).
    pub const fn validation(operation: Operation, reason: Reason) -> Self {
        Self::of(
            Category::Validation,
            operation,
            Evidence::NotDispatched,
            reason,
        )
    }

    /// A `unsupported_capability` error: the worker version, transport or store lacks the feature; nothing was sent (evidence `not_dispatched`).
    pub const fn unsupported_capability(operation: Operation, reason: Reason) -> Self {
        Self::of(
            Category::UnsupportedCapability,
            operation,
            Evidence::NotDispatched,
            reason,
        )
    }

    /// A `unsupported_network_policy` error: the network policy cannot be expressed or was not honoured.
    pub const fn unsupported_network_policy(
        operation: Operation,
        evidence: Evidence,
        reason: Reason,
    ) -> Self {
        Self::of(
            Category::UnsupportedNetworkPolicy,
            operation,
            evidence,
            reason,
        )
    }

    /// A `authentication` error: 401/403, or a handle used by the wrong consumer.
    pub const fn authentication(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::Authentication, operation, evidence, reason)
    }

    /// A `admission_exhausted` error: no capacity, queue full, command slot busy; nothing was sent (evidence `not_dispatched`).
    pub const fn admission_exhausted(operation: Operation, reason: Reason) -> Self {
        Self::of(
            Category::AdmissionExhausted,
            operation,
            Evidence::NotDispatched,
            reason,
        )
    }

    /// A `expired` error: a budget or deadline ran out.
    pub const fn expired(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::Expired, operation, evidence, reason)
    }

    /// A `transport` error: connect, read, write or timeout failures of the connection.
    pub const fn transport(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::Transport, operation, evidence, reason)
    }

    /// A `protocol` error: the peer broke the protocol or the contract. A peer answered, so the request may have reached the worker (evidence `dispatch_uncertain`; strengthen it with [`Error::with_evidence`] when more is known).
    pub const fn protocol(operation: Operation, reason: Reason) -> Self {
        Self::of(
            Category::Protocol,
            operation,
            Evidence::DispatchUncertain,
            reason,
        )
    }

    /// A `output_limit` error: a byte, count or size cap was hit.
    pub const fn output_limit(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::OutputLimit, operation, evidence, reason)
    }

    /// A `identity_conflict` error: the same identity with a different meaning.
    pub const fn identity_conflict(
        operation: Operation,
        evidence: Evidence,
        reason: Reason,
    ) -> Self {
        Self::of(Category::IdentityConflict, operation, evidence, reason)
    }

    /// A `port_conflict` error: a host port is taken.
    pub const fn port_conflict(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::PortConflict, operation, evidence, reason)
    }

    /// A `not_found` error: the peer or store positively reported absence.
    pub const fn not_found(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::NotFound, operation, evidence, reason)
    }

    /// A `store` error: the store failed (unavailable, corrupt, unknown version). Never read as "not found".
    pub const fn store(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::Store, operation, evidence, reason)
    }

    /// A `stale_claim` error: a lease or claim is held by someone else or expired.
    pub const fn stale_claim(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::StaleClaim, operation, evidence, reason)
    }

    /// A `stale_version` error: a compare-and-swap version did not match.
    pub const fn stale_version(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::StaleVersion, operation, evidence, reason)
    }

    /// A `unknown` error: the outcome cannot be known.
    pub const fn unknown(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::Unknown, operation, evidence, reason)
    }

    /// A `cleanup` error: cleanup could not be completed.
    pub const fn cleanup(operation: Operation, evidence: Evidence, reason: Reason) -> Self {
        Self::of(Category::Cleanup, operation, evidence, reason)
    }

    /// Sets the fixed reason code (snake_case, never peer text).
    #[must_use]
    pub const fn with_reason(mut self, reason: Reason) -> Self {
        self.reason = reason;
        self
    }

    /// Attaches the observed amount and the allowed maximum.
    #[must_use]
    pub const fn with_limit(mut self, actual: u64, max: u64) -> Self {
        self.limit = Some(Limit { actual, max });
        self
    }

    /// Attaches the guest exit code.
    #[must_use]
    pub const fn with_exit_code(mut self, code: i32) -> Self {
        self.exit_code = Some(code);
        self
    }

    /// Attaches the HTTP status the worker answered with.
    #[must_use]
    pub const fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Attaches the WebSocket close code the peer sent (also one the client
    /// refused as invalid), as evidence of how the connection ended.
    #[must_use]
    pub const fn with_close_code(mut self, code: u16) -> Self {
        self.close_code = Some(code);
        self
    }

    /// Replaces the operation (used when a generic layer's error is re-attributed).
    #[must_use]
    pub const fn with_operation(mut self, operation: Operation) -> Self {
        self.operation = operation;
        self
    }

    /// Replaces the evidence. Use only to *strengthen* what is known
    /// (never to downgrade to `not_dispatched` after a byte may have left).
    #[must_use]
    pub const fn with_evidence(mut self, evidence: Evidence) -> Self {
        self.evidence = evidence;
        self
    }

    /// The category.
    pub const fn category(&self) -> Category {
        self.category
    }

    /// The operation that failed.
    pub const fn operation(&self) -> Operation {
        self.operation
    }

    /// What is known about dispatch.
    pub const fn evidence(&self) -> Evidence {
        self.evidence
    }

    /// The guest exit code, when one was observed.
    pub const fn exit_code(&self) -> Option<i32> {
        self.exit_code
    }

    /// The fixed reason ([`Reason::Unspecified`] when none was given).
    pub const fn reason(&self) -> Reason {
        self.reason
    }

    /// Observed amount and allowed maximum, for limit failures.
    pub const fn limit(&self) -> Option<Limit> {
        self.limit
    }

    /// The HTTP status the worker answered with, when the failure is a status.
    pub const fn status(&self) -> Option<u16> {
        self.status
    }

    /// The WebSocket close code the peer sent, when the failure follows a
    /// close frame.
    pub const fn close_code(&self) -> Option<u16> {
        self.close_code
    }

    /// True when the request may have reached the worker.
    pub const fn may_have_reached_worker(&self) -> bool {
        self.evidence.may_have_reached_worker()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({})",
            self.operation.as_str(),
            self.category.as_str(),
            self.evidence.as_str()
        )?;
        if self.reason != Reason::Unspecified {
            write!(f, ": {}", self.reason.as_str())?;
        }
        if let Some(status) = self.status {
            write!(f, ", status {status}")?;
        }
        if let Some(Limit { actual, max }) = self.limit {
            write!(f, ", {actual} > {max}")?;
        }
        if let Some(code) = self.exit_code {
            write!(f, ", exit code {code}")?;
        }
        if let Some(code) = self.close_code {
            write!(f, ", close code {code}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Error");
        s.field("category", &self.category)
            .field("operation", &self.operation)
            .field("evidence", &self.evidence);
        if let Some(code) = self.exit_code {
            s.field("exit_code", &code);
        }
        if self.reason != Reason::Unspecified {
            s.field("reason", &self.reason);
        }
        if let Some(status) = self.status {
            s.field("status", &status);
        }
        if let Some(limit) = self.limit {
            s.field("limit", &limit);
        }
        if let Some(code) = self.close_code {
            s.field("close_code", &code);
        }
        s.finish()
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_debug_carry_only_fixed_text() {
        let e = Error::output_limit(Operation::Exec, Evidence::Exited, Reason::OutputAllowance)
            .with_limit(2_000_000, 1_048_576)
            .with_exit_code(3);
        assert_eq!(
            e.to_string(),
            "exec failed: output_limit (exited): output_allowance, 2000000 > 1048576, exit code 3"
        );
        let d = format!("{e:?}");
        assert!(d.contains("OutputLimit") && d.contains("Exited") && d.contains("1048576"));
    }

    #[test]
    fn only_not_dispatched_is_safe_to_resend() {
        for ev in [
            Evidence::DispatchUncertain,
            Evidence::RunningObserved,
            Evidence::Exited,
            Evidence::TerminationConfirmed,
            Evidence::Unknown,
        ] {
            assert!(ev.may_have_reached_worker(), "{ev:?}");
        }
        assert!(!Evidence::NotDispatched.may_have_reached_worker());
        assert!(!Error::validation(Operation::Create, Reason::ArgvEmpty).may_have_reached_worker());
        assert!(Error::protocol(Operation::Create, Reason::ArgvEmpty).may_have_reached_worker());
    }

    #[test]
    fn each_category_has_one_constructor_with_its_evidence() {
        let (op, ev, r) = (Operation::Exec, Evidence::Unknown, Reason::ArgvEmpty);
        let built = [
            Error::validation(op, r),
            Error::unsupported_capability(op, r),
            Error::unsupported_network_policy(op, ev, r),
            Error::authentication(op, ev, r),
            Error::admission_exhausted(op, r),
            Error::expired(op, ev, r),
            Error::transport(op, ev, r),
            Error::protocol(op, r),
            Error::output_limit(op, ev, r),
            Error::identity_conflict(op, ev, r),
            Error::port_conflict(op, ev, r),
            Error::not_found(op, ev, r),
            Error::store(op, ev, r),
            Error::stale_claim(op, ev, r),
            Error::stale_version(op, ev, r),
            Error::unknown(op, ev, r),
            Error::cleanup(op, ev, r),
        ];
        for (e, category) in built.iter().zip(Category::ALL) {
            assert_eq!(e.category(), category);
            assert_eq!((e.operation(), e.reason()), (op, r));
            let want = match category {
                Category::Validation
                | Category::UnsupportedCapability
                | Category::AdmissionExhausted => Evidence::NotDispatched,
                Category::Protocol => Evidence::DispatchUncertain,
                _ => ev,
            };
            assert_eq!(e.evidence(), want, "{category:?}");
            assert_eq!((e.limit(), e.status(), e.exit_code()), (None, None, None));
        }
    }

    #[test]
    fn category_names_are_unique_snake_case() {
        let mut names: Vec<_> = Category::ALL.iter().map(|c| c.as_str()).collect();
        assert!(
            names
                .iter()
                .all(|n| n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        );
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Category::ALL.len());
    }
}
