//! Console logs (C8.2, TV22–TV24) and volumes (C10.2, TV26).
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use smolbox_core::Reason;
mod worker_support;

use std::time::Duration;

use smolbox_core::worker::{
    Logs, LogsParams, MachineName, Profile, Version, VolumeCreate, VolumeDelete, VolumeId,
    WorkerCall,
};
use smolbox_core::{Category, Evidence, Operation};
use worker_support::*;

fn logs(params: LogsParams) -> Result<Logs, smolbox_core::Error> {
    Logs::new(&v122(), MachineName::new("net-test").unwrap(), params)
}

#[test]
fn tv22_tail_request_and_lines() {
    let l = logs(LogsParams {
        tail: 2,
        ..LogsParams::default()
    })
    .unwrap();
    let req = l.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("GET", "/api/v1/machines/net-test/logs?tail=2&follow=false")
    );
    assert_eq!(req.accept, Some("text/event-stream"));
    assert!(
        l.check_head(&head(200, Some("text/event-stream"), b""))
            .unwrap()
    );
    assert!(
        l.check_head(&head(200, Some("application/json"), b""))
            .is_err()
    );
    // The two data-only events of TV22, as core::sse would deliver them.
    let mut lines = l.lines();
    assert_eq!(
        lines
            .handle_event(None, "multi\0byte café".as_bytes())
            .unwrap(),
        None
    );
    lines
        .handle_event(Some("message"), b"partial-no-newline")
        .unwrap();
    lines.handle_event(Some("other"), b"ignored").unwrap();
    assert_eq!(
        lines.finish(),
        vec![
            "multi\0byte café".to_string(),
            "partial-no-newline".to_string()
        ]
    );
}

#[test]
fn tv23_errors() {
    let l = logs(LogsParams::default()).unwrap();
    let b = br#"{"error":"tail value 10001 exceeds maximum of 10000","code":"BAD_REQUEST"}"#;
    assert!(!l.check_head(&json(400, b)).unwrap());
    let e = l.decode_error(&json(400, b), b);
    assert_err(
        &e,
        Category::Protocol,
        Operation::Logs,
        Evidence::DispatchUncertain,
    );
    let b = r#"{"error":"machine 'wire-test' has no logs yet — it may not have been started","code":"NOT_FOUND"}"#.as_bytes();
    assert_eq!(
        l.decode_error(&json(404, b), b).category(),
        Category::NotFound
    );
    let b = br#"{"error":"stream did not contain valid UTF-8","code":"INTERNAL_ERROR"}"#;
    assert_eq!(
        l.decode_error(&json(500, b), b).category(),
        Category::Protocol
    );
}

#[test]
fn tv24_follow_delivers_each_line() {
    let l = logs(LogsParams {
        tail: 1,
        follow: true,
        ..LogsParams::default()
    })
    .unwrap();
    assert_eq!(
        l.request().unwrap().target,
        "/api/v1/machines/net-test/logs?tail=1&follow=true"
    );
    let mut lines = l.lines();
    assert_eq!(
        lines
            .handle_event(None, b"boot: kernel up")
            .unwrap()
            .as_deref(),
        Some("boot: kernel up")
    );
    assert_eq!(
        lines
            .handle_event(None, b"appended line")
            .unwrap()
            .as_deref(),
        Some("appended line")
    );
    assert!(lines.finish().is_empty());
}

#[test]
fn params_bounds() {
    let ok = |p: LogsParams| logs(p).is_ok();
    let d = LogsParams::default();
    assert_eq!(
        (d.tail, d.follow, d.timeout, d.allowance),
        (100, false, Duration::from_secs(30), 1_048_576)
    );
    assert!(ok(LogsParams { tail: 0, ..d }));
    assert!(ok(LogsParams { tail: 10_000, ..d }));
    assert!(!ok(LogsParams { tail: 10_001, ..d }));
    assert!(!ok(LogsParams {
        timeout: Duration::from_millis(999),
        ..d
    }));
    assert!(ok(LogsParams {
        timeout: Duration::from_millis(1_000),
        ..d
    }));
    assert!(ok(LogsParams {
        timeout: Duration::from_millis(300_000),
        ..d
    }));
    assert!(!ok(LogsParams {
        timeout: Duration::from_millis(300_001),
        ..d
    }));
    assert!(!ok(LogsParams { allowance: 0, ..d }));
    assert!(ok(LogsParams { allowance: 1, ..d }));
    assert!(ok(LogsParams {
        allowance: 8_388_608,
        ..d
    }));
    assert!(!ok(LogsParams {
        allowance: 8_388_609,
        ..d
    }));
    let e = logs(LogsParams { tail: 10_001, ..d }).unwrap_err();
    assert_err(
        &e,
        Category::Validation,
        Operation::Logs,
        Evidence::NotDispatched,
    );
    // Console logs need 1.17.0+ on the later line.
    let e = Logs::new(
        &Profile::known(Version::V1_16_1),
        MachineName::new("a").unwrap(),
        d,
    )
    .unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedCapability,
        Operation::Logs,
        Evidence::NotDispatched,
    );
}

#[test]
fn line_allowance_and_event_cap() {
    // Allowance counts one newline per event: 4 bytes + 1 = 5.
    let l = logs(LogsParams {
        allowance: 10,
        ..LogsParams::default()
    })
    .unwrap();
    let mut lines = l.lines();
    lines.handle_event(None, b"abcd").unwrap();
    lines.handle_event(None, b"efgh").unwrap();
    let e = lines.handle_event(None, b"").unwrap_err();
    assert_err(
        &e,
        Category::OutputLimit,
        Operation::Logs,
        Evidence::DispatchUncertain,
    );
    // 10,000 events accepted, the 10,001st refused.
    let l = logs(LogsParams {
        allowance: 8_388_608,
        ..LogsParams::default()
    })
    .unwrap();
    let mut lines = l.lines();
    for _ in 0..10_000 {
        lines.handle_event(None, b"x").unwrap();
    }
    let e = lines.handle_event(None, b"x").unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::OutputLimit, Reason::LogEventCap)
    );
    // Invalid UTF-8.
    let mut lines = logs(LogsParams::default()).unwrap().lines();
    let e = lines.handle_event(None, b"\xff").unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::Logs,
        Evidence::DispatchUncertain,
    );
}

#[test]
fn tv26_volume_create() {
    let v = VolumeCreate::new(&v122(), VolumeId::new("vol-abc123").unwrap(), 2).unwrap();
    let req = v.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("POST", "/api/v1/volumes")
    );
    assert_eq!(
        &req.body[..],
        br#"{"id":"vol-abc123","size_gb":2,"backend":"local"}"#
    );
    let b = br#"{"node_path":"/var/lib/smolvm/.local/share/smolvm/volumes/vol-abc123"}"#;
    assert_eq!(
        v.decode(&json(200, b), b).unwrap(),
        "/var/lib/smolvm/.local/share/smolvm/volumes/vol-abc123"
    );
    for bad in [
        &br#"{"node_path":"relative/x"}"#[..],
        br#"{"node_path":"/a/../b"}"#,
        br#"{"node_path":"/a/"}"#,
        br#"{}"#,
    ] {
        assert_eq!(
            v.decode(&json(200, bad), bad).unwrap_err().category(),
            Category::Protocol
        );
    }
    let b = br#"{"error":"invalid volume id: \"../x\"","code":"BAD_REQUEST"}"#;
    assert_eq!(
        v.decode(&json(400, b), b).unwrap_err().category(),
        Category::Protocol
    );
    // Bounds.
    let id = || VolumeId::new("v").unwrap();
    assert!(VolumeCreate::new(&v122(), id(), 0).is_err());
    assert!(VolumeCreate::new(&v122(), id(), 1).is_ok());
    assert!(VolumeCreate::new(&v122(), id(), 1_024).is_ok());
    assert!(VolumeCreate::new(&v122(), id(), 1_025).is_err());
    assert!(VolumeId::new(&"a".repeat(128)).is_ok());
    for bad in ["", "../x", "a.b", "a b"] {
        assert!(VolumeId::new(bad).is_err(), "{bad}");
    }
    assert!(VolumeId::new(&"a".repeat(129)).is_err());
    let e = VolumeCreate::new(&Profile::known(Version::V1_19_0), id(), 1).unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedCapability,
        Operation::VolumeCreate,
        Evidence::NotDispatched,
    );
}

#[test]
fn tv26_volume_delete_needs_204_empty() {
    let d = VolumeDelete::new(&v122(), VolumeId::new("vol-abc123").unwrap()).unwrap();
    let req = d.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("DELETE", "/api/v1/volumes/vol-abc123")
    );
    d.decode(&head(204, None, b""), b"").unwrap();
    let e = d.decode(&head(404, None, b""), b"").unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::VolumeDelete,
        Evidence::DispatchUncertain,
    );
    assert_eq!(
        d.decode(&json(200, b"{}"), b"{}").unwrap_err().category(),
        Category::Protocol
    );
    assert_eq!(
        d.decode(&head(204, None, b"x"), b"x")
            .unwrap_err()
            .category(),
        Category::Protocol
    );
    let b = br#"{"error":"volume is mounted","code":"CONFLICT"}"#;
    assert_eq!(
        d.decode(&json(409, b), b).unwrap_err().category(),
        Category::IdentityConflict
    );
}

const TV22: &[u8] = "data: multi\0byte café\n\ndata: partial-no-newline\n\n".as_bytes();
const TV23: &[u8] = "data: boot: kernel up\n\ndata: {\"level\":\"info\",\"msg\":\"agent ready\"}\n\ndata: line with crlf\n\ndata: multi\0byte café\n\ndata: partial-no-newline\n\n".as_bytes();
const TV24: &[u8] = b"data: boot: kernel up\n\ndata: appended line\n\n:\n\n";

#[test]
fn tv22_tv23_stream_bytes_decode_to_lines() {
    let l = logs(LogsParams {
        tail: 2,
        ..LogsParams::default()
    })
    .unwrap();
    let mut s = l.stream();
    s.handle_input(TV22).unwrap();
    assert_eq!(s.poll_line(), None);
    assert_eq!(
        s.finish().unwrap(),
        vec!["multi\0byte café", "partial-no-newline"]
    );
    let mut s = logs(LogsParams::default()).unwrap().stream();
    s.handle_input(TV23).unwrap();
    let lines = s.finish().unwrap();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[1], r#"{"level":"info","msg":"agent ready"}"#);
}

#[test]
fn tv24_follow_with_keepalive() {
    let l = logs(LogsParams {
        tail: 1,
        follow: true,
        ..LogsParams::default()
    })
    .unwrap();
    let mut s = l.stream();
    s.handle_input(&TV24[..23]).unwrap();
    assert_eq!(s.poll_line().as_deref(), Some("boot: kernel up"));
    s.handle_input(&TV24[23..]).unwrap();
    assert_eq!(s.poll_line().as_deref(), Some("appended line"));
    assert_eq!(s.poll_line(), None);
    assert!(s.finish().unwrap().is_empty());
}

#[test]
fn deliver_hands_lines_in_order_and_stops_when_asked() {
    let l = logs(LogsParams {
        tail: 1,
        follow: true,
        ..LogsParams::default()
    })
    .unwrap();
    let mut s = l.stream();
    s.handle_input(b"data: one\n\ndata: two\n\ndata: three\n\n")
        .unwrap();
    let mut seen = Vec::new();
    let mut first_two = |line: String| {
        seen.push(line);
        seen.len() < 2
    };
    assert!(!s.deliver(&mut first_two), "the reader asked to stop");
    assert_eq!(seen, ["one", "two"]);
    let mut all = |line: String| {
        seen.push(line);
        true
    };
    assert!(s.deliver(&mut all));
    assert!(s.deliver(&mut all), "nothing ready: nothing to stop");
    assert_eq!(seen, ["one", "two", "three"]);
}

#[test]
fn log_stream_any_split_gives_the_same_lines() {
    let whole = {
        let mut s = logs(LogsParams::default()).unwrap().stream();
        s.handle_input(TV23).unwrap();
        s.finish().unwrap()
    };
    for cut in 0..=TV23.len() {
        let mut s = logs(LogsParams::default()).unwrap().stream();
        s.handle_input(&TV23[..cut]).unwrap();
        s.handle_input(&TV23[cut..]).unwrap();
        assert_eq!(s.finish().unwrap(), whole, "cut at {cut}");
    }
    let mut s = logs(LogsParams::default()).unwrap().stream();
    for b in TV23 {
        s.handle_input(std::slice::from_ref(b)).unwrap();
    }
    assert_eq!(s.finish().unwrap(), whole);
}

#[test]
fn log_stream_failures() {
    // A partial final frame.
    let mut s = logs(LogsParams::default()).unwrap().stream();
    s.handle_input(b"data: a\n\ndata: b").unwrap();
    let e = s.finish().unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::Logs,
        Evidence::DispatchUncertain,
    );
    // Invalid UTF-8 in a line.
    let mut s = logs(LogsParams::default()).unwrap().stream();
    let e = s.handle_input(b"data: \xff\n\n").unwrap_err();
    assert_eq!(
        (e.category(), e.operation()),
        (Category::Protocol, Operation::Logs)
    );
    // Allowance: "abcd" + newline = 5 bytes; allowance 5 accepts one line, not two.
    let mut s = logs(LogsParams {
        allowance: 5,
        ..LogsParams::default()
    })
    .unwrap()
    .stream();
    s.handle_input(b"data: abcd\n\n").unwrap();
    let e = s.handle_input(b"data: e\n\n").unwrap_err();
    assert_err(
        &e,
        Category::OutputLimit,
        Operation::Logs,
        Evidence::DispatchUncertain,
    );
    // A line longer than the allowance fails in the framing, before buffering it.
    let mut s = logs(LogsParams {
        allowance: 8,
        ..LogsParams::default()
    })
    .unwrap()
    .stream();
    let e = s.handle_input(&[b'x'; 100]).unwrap_err();
    assert_eq!(
        (e.category(), e.operation()),
        (Category::OutputLimit, Operation::Logs)
    );
    // Other event names and comments are ignored.
    let mut s = logs(LogsParams::default()).unwrap().stream();
    s.handle_input(b": hi\n\nevent: other\ndata: x\n\ndata: y\n\n")
        .unwrap();
    assert_eq!(s.finish().unwrap(), vec!["y"]);
}

#[test]
fn logs_as_a_worker_call() {
    let l = logs(LogsParams {
        tail: 2,
        ..LogsParams::default()
    })
    .unwrap();
    assert_eq!(
        WorkerCall::request(&l).unwrap().target,
        l.request().unwrap().target
    );
    let h = head(200, Some("text/event-stream"), TV22);
    assert_eq!(
        l.decode(&h, TV22).unwrap(),
        vec!["multi\0byte café", "partial-no-newline"]
    );
    let f = logs(LogsParams {
        follow: true,
        ..LogsParams::default()
    })
    .unwrap();
    assert_eq!(
        f.decode(&head(200, Some("text/event-stream"), TV24), TV24)
            .unwrap(),
        vec!["boot: kernel up", "appended line"]
    );
    let b = br#"{"error":"machine 'net-test' not found","code":"NOT_FOUND"}"#;
    assert_eq!(
        l.decode(&json(404, b), b).unwrap_err().category(),
        Category::NotFound
    );
    assert!(l.decode(&json(200, b"{}"), b"{}").is_err());
    assert_eq!(l.timeout(Duration::from_secs(10)), Duration::from_secs(10));
    assert_eq!(l.timeout(Duration::from_secs(100)), Duration::from_secs(30));
}
