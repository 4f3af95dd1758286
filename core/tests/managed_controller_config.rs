//! Every range of the controller's options (`ControllerConfig::validate`),
//! each at its bounds (accepted) and one past them (refused with its own
//! reason, `validation`, operation `config`, nothing sent).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use smolbox_core::managed::controller::{
    ControllerConfig, MAX_ACTIVE, MAX_TELEMETRY_PENDING, MAX_WORKERS, WorkerEntry,
};
use smolbox_core::{Category, Evidence, Operation, Reason};

fn base() -> ControllerConfig {
    ControllerConfig::new("ctl-test")
}

/// `edit` applied to the defaults is accepted.
fn accepted(edit: impl FnOnce(&mut ControllerConfig)) {
    let mut c = base();
    edit(&mut c);
    c.validate().unwrap();
}

/// `edit` applied to the defaults is refused with `reason`.
fn refused(reason: Reason, edit: impl FnOnce(&mut ControllerConfig)) {
    let mut c = base();
    edit(&mut c);
    let e = c.validate().unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence(), e.reason()),
        (
            Category::Validation,
            Operation::Config,
            Evidence::NotDispatched,
            reason
        )
    );
}

#[test]
fn the_defaults_are_valid() {
    accepted(|_| {});
}

#[test]
fn max_pending_is_1_to_10_000() {
    accepted(|c| c.max_pending = 1);
    accepted(|c| c.max_pending = 10_000);
    refused(Reason::MaxPending, |c| c.max_pending = 0);
    refused(Reason::MaxPending, |c| c.max_pending = 10_001);
}

#[test]
fn max_active_is_1_to_64() {
    assert_eq!(MAX_ACTIVE, 64);
    accepted(|c| c.max_active = 1);
    accepted(|c| c.max_active = MAX_ACTIVE);
    refused(Reason::MaxActive, |c| c.max_active = 0);
    refused(Reason::MaxActive, |c| c.max_active = MAX_ACTIVE + 1);
}

#[test]
fn poll_interval_is_10_to_5_000_ms() {
    accepted(|c| c.poll_interval_ms = 10);
    // The TTL must stay at least four polls.
    accepted(|c| c.poll_interval_ms = 5_000);
    refused(Reason::PollInterval, |c| c.poll_interval_ms = 9);
    refused(Reason::PollInterval, |c| c.poll_interval_ms = 5_001);
}

#[test]
fn lease_ttl_is_1_000_to_900_000_ms_and_at_least_four_polls() {
    accepted(|c| c.lease_ttl_ms = 1_000);
    accepted(|c| c.lease_ttl_ms = 900_000);
    refused(Reason::LeaseTtl, |c| c.lease_ttl_ms = 999);
    refused(Reason::LeaseTtl, |c| c.lease_ttl_ms = 900_001);
    accepted(|c| {
        c.poll_interval_ms = 1_000;
        c.lease_ttl_ms = 4_000;
    });
    refused(Reason::LeaseTtl, |c| {
        c.poll_interval_ms = 1_000;
        c.lease_ttl_ms = 3_999;
    });
}

#[test]
fn cleanup_attempts_are_1_to_20() {
    accepted(|c| c.cleanup_attempts = 1);
    accepted(|c| c.cleanup_attempts = 20);
    refused(Reason::CleanupAttempts, |c| c.cleanup_attempts = 0);
    refused(Reason::CleanupAttempts, |c| c.cleanup_attempts = 21);
}

#[test]
fn telemetry_pending_is_1_to_1_024() {
    assert_eq!(MAX_TELEMETRY_PENDING, 1_024);
    accepted(|c| c.telemetry_pending = 1);
    accepted(|c| c.telemetry_pending = MAX_TELEMETRY_PENDING);
    refused(Reason::TelemetryPending, |c| c.telemetry_pending = 0);
    refused(Reason::TelemetryPending, |c| {
        c.telemetry_pending = MAX_TELEMETRY_PENDING + 1;
    });
}

#[test]
fn at_most_64_workers_with_unique_ids() {
    assert_eq!(MAX_WORKERS, 64);
    let workers = |n: usize| -> Vec<WorkerEntry> {
        (0..n).map(|i| WorkerEntry::new(&format!("w{i}"))).collect()
    };
    accepted(|c| c.workers = workers(MAX_WORKERS));
    refused(Reason::TooManyWorkers, |c| {
        c.workers = workers(MAX_WORKERS + 1);
    });
    refused(Reason::DuplicateWorker, |c| {
        c.workers = vec![WorkerEntry::new("w1"), WorkerEntry::new("w1")];
    });
}
