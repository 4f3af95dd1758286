//! Node endpoints: §14 TV1–TV4 and the C2.1–C2.3 acceptance criteria.
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use smolbox_core::Reason;
mod worker_support;

use smolbox_core::worker::{Capacity, Health, Metrics, Readyz, WorkerCall};
use smolbox_core::{Category, Evidence, Operation};
use worker_support::*;

const TV1: &[u8] =
    br#"{"status":"ok","version":"1.9.2","machines":{"total":0,"running":0},"uptime_seconds":8}"#;

#[test]
fn tv1_health_request_and_reply() {
    let call = Health::new();
    let req = call.request().unwrap();
    assert_eq!(req.target, "/health");
    assert_eq!(req.method.as_str(), "GET");
    assert_eq!(req.accept, Some("application/json"));
    assert!(req.body.is_empty());
    assert_eq!(TV1.len(), 87); // content-length in the vector
    let h = call.decode(&json(200, TV1), TV1).unwrap();
    assert_eq!(h.version, "1.9.2");
    assert_eq!(
        (h.total, h.running, h.uptime_seconds),
        (Some(0), Some(0), Some(8))
    );
    let b = br#"{"status":"ok","version":"1.22.0","machines":{"total":0,"running":0},"uptime_seconds":35}"#;
    assert_eq!(call.decode(&json(200, b), b).unwrap().version, "1.22.0");
}

#[test]
fn ac_2_1_1_missing_counts_stay_none() {
    let b = br#"{"status":"ok","version":"1.22.0"}"#;
    let h = Health::new().decode(&json(200, b), b).unwrap();
    assert_eq!((h.total, h.running, h.uptime_seconds), (None, None, None));
}

#[test]
fn ac_2_1_2_running_above_total_is_protocol() {
    let b = br#"{"status":"ok","version":"1.22.0","machines":{"total":1,"running":2}}"#;
    let e = Health::new().decode(&json(200, b), b).unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::Health,
        Evidence::DispatchUncertain,
    );
}

#[test]
fn health_bounds() {
    let call = Health::new();
    let total = |n: u64| {
        format!(r#"{{"status":"ok","version":"1.9.2","machines":{{"total":{n},"running":0}}}}"#)
    };
    let ok = total(1_000_000);
    assert!(
        call.decode(&json(200, ok.as_bytes()), ok.as_bytes())
            .is_ok()
    );
    let bad = total(1_000_001);
    assert!(
        call.decode(&json(200, bad.as_bytes()), bad.as_bytes())
            .is_err()
    );
    let v64 = format!("1.0.0-{}", "a".repeat(58));
    assert_eq!(v64.len(), 64);
    let b = format!(r#"{{"status":"ok","version":"{v64}"}}"#);
    assert!(call.decode(&json(200, b.as_bytes()), b.as_bytes()).is_ok());
    let v65 = format!("1.0.0-{}", "a".repeat(59));
    let b = format!(r#"{{"status":"ok","version":"{v65}"}}"#);
    assert!(call.decode(&json(200, b.as_bytes()), b.as_bytes()).is_err());
    for bad in [
        &br#"{"status":"degraded","version":"1.9.2"}"#[..],
        br#"{"status":"ok","version":"one"}"#,
        br#"{"status":"ok"}"#,
        br#"{"status":"ok","version":"1.9.2""#,
    ] {
        let e = call.decode(&json(200, bad), bad).unwrap_err();
        assert_err(
            &e,
            Category::Protocol,
            Operation::Health,
            Evidence::DispatchUncertain,
        );
    }
    // Wrong media type.
    let e = call
        .decode(&head(200, Some("text/plain"), TV1), TV1)
        .unwrap_err();
    assert_eq!(e.reason(), Reason::UnexpectedMediaType);
}

#[test]
fn tv2_readyz_exactly_200_and_empty() {
    let call = Readyz;
    assert_eq!(call.request().unwrap().target, "/readyz");
    assert!(call.decode(&head(200, None, b""), b"").is_ok());
    // Content type is ignored.
    assert!(
        call.decode(&head(200, Some("text/plain"), b""), b"")
            .is_ok()
    );
    let e = call.decode(&head(200, None, b"x"), b"x").unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::Readyz,
        Evidence::DispatchUncertain,
    );
    let e = call.decode(&head(503, None, b""), b"").unwrap_err();
    assert_eq!(e.status(), Some(503));
    assert!(call.decode(&head(204, None, b""), b"").is_err());
}

#[test]
fn tv3_capacity() {
    let b = br#"{"allocated_cpus":0,"allocated_memory_mb":0,"used_cpus":0.0,"used_memory_mb":0,"used_disk_gb":0,"boot_id":"18826-1795935391197095062"}"#;
    let call = Capacity;
    assert_eq!(call.request().unwrap().target, "/capacity");
    let c = call.decode(&json(200, b), b).unwrap();
    assert_eq!(c.allocated_cpus, 0);
    assert_eq!(c.boot_id.as_deref(), Some("18826-1795935391197095062"));
    assert_eq!(c.host_memory_total_mb, None);
    // A stalled runtime is an error, never zero usage.
    let t = b"main runtime stalled; node unschedulable";
    let e = call.decode(&text(503, t), t).unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::Capacity,
        Evidence::DispatchUncertain,
    );
    assert_eq!(e.reason(), Reason::WorkerRuntimeStalled);
    let missing = br#"{"allocated_cpus":0}"#;
    assert!(call.decode(&json(200, missing), missing).is_err());
}

#[test]
fn tv4_metrics_text() {
    let b = b"# TYPE smolvm_api_requests_total counter\nsmolvm_api_requests_total{method=\"GET\",status=\"200\",path=\"/readyz\"} 1\n\n# TYPE smolvm_machines_total gauge\nsmolvm_machines_total 0\n\n";
    let call = Metrics;
    let req = call.request().unwrap();
    assert_eq!(
        (req.target.as_str(), req.accept),
        ("/metrics", Some("text/plain"))
    );
    let m = call.decode(&text(200, b), b).unwrap();
    assert_eq!(m.as_bytes(), b);
    let e = call.decode(&text(200, b"\xff"), b"\xff").unwrap_err();
    assert_eq!(e.reason(), Reason::MetricsNotUtf8);
    assert!(call.decode(&json(200, b"{}"), b"{}").is_err());
}
