//! Worker operations driven through `core::http1`: the request bytes on the
//! wire and vector replies decoded end to end (TV1, TV5, TV25).
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use std::time::{Duration, Instant};

use bytes::Bytes;
use smolbox_core::http1::{HttpEvent, HttpExchange, ResponseHead};
use smolbox_core::worker::{
    Budgets, Create, Endpoint, EndpointConfig, FileBudget, GuestPath, Health, MachineName,
    MachineSpec, PathPolicy, Profile, Readyz, Upload, Version, WorkerCall,
};
use smolbox_core::{Category, Secret};

#[allow(clippy::disallowed_methods)] // an arbitrary origin; time never advances here
fn origin() -> Instant {
    Instant::now()
}

fn endpoint() -> Endpoint {
    Endpoint::new(EndpointConfig {
        id: "w1".into(),
        base_url: "http://127.0.0.1:19470".into(),
        allow_insecure_loopback: true,
        token: Some(Secret::new("tok")),
        ..EndpointConfig::default()
    })
    .unwrap()
}

/// Runs one call over an exchange fed `reply`; returns the wire bytes and the result.
fn run<C: WorkerCall>(call: &C, reply: &[u8]) -> (Vec<u8>, Result<C::Output, smolbox_core::Error>) {
    let now = origin();
    let ep = endpoint();
    let config = ep.exchange_config(now + ep.budgets().operation, call.max_response_bytes());
    let request = call.request().unwrap();
    let mut ex = HttpExchange::new(&request, &config, now).unwrap();
    let mut wire = Vec::new();
    while ex.poll_transmit(&mut wire) {}
    let mut head: Option<ResponseHead> = None;
    let mut body = Vec::new();
    for piece in reply.chunks(7) {
        if let Err(e) = ex.handle_input(now, piece) {
            return (wire, Err(e));
        }
        while let Some(ev) = ex.poll_event() {
            match ev {
                HttpEvent::Head(h) => head = Some(h.clone()),
                HttpEvent::Data(d) => body.extend_from_slice(d),
                HttpEvent::Failed(e) => return (wire, Err(e)),
                _ => {}
            }
        }
    }
    let head = head.unwrap();
    (wire, call.decode(&head, &body))
}

#[test]
fn exchange_config_from_endpoint() {
    let ep = endpoint();
    let now = origin();
    let c = ep.exchange_config(now + Duration::from_secs(1), None);
    assert_eq!(c.host, "127.0.0.1:19470");
    assert_eq!(c.max_response_body, Budgets::DEFAULT_MAX_RESPONSE_BYTES);
    assert_eq!(c.max_request_body, 1_048_576);
    assert_eq!(c.idle_timeout, Some(Duration::from_secs(15)));
    c.validate().unwrap();
    assert_eq!(ep.exchange_config(now, Some(10)).max_response_body, 10);
    assert_eq!(
        ep.exchange_config(now, Some(u64::MAX)).max_response_body,
        Budgets::DEFAULT_MAX_RESPONSE_BYTES
    );
}

#[test]
fn tv1_health_over_the_exchange() {
    let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-trace-id: 000000000000498a\r\nvary: origin, access-control-request-method, access-control-request-headers\r\ncontent-length: 87\r\n\r\n{\"status\":\"ok\",\"version\":\"1.9.2\",\"machines\":{\"total\":0,\"running\":0},\"uptime_seconds\":8}";
    let (wire, out) = run(&Health::new(), reply);
    assert!(
        wire.starts_with(b"GET /health HTTP/1.1\r\n"),
        "{}",
        String::from_utf8_lossy(&wire)
    );
    let h = out.unwrap();
    assert_eq!(
        Profile::admit(&h.version, &[]).unwrap().base(),
        Version::V1_9_2
    );
}

#[test]
fn tv2_readyz_over_the_exchange() {
    let reply = b"HTTP/1.1 200 OK\r\nx-trace-id: 000000010000498a\r\ncontent-length: 0\r\n\r\n";
    run(&Readyz, reply).1.unwrap();
    let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    assert_eq!(
        run(&Readyz, reply).1.unwrap_err().category(),
        Category::Protocol
    );
}

#[test]
fn tv5_create_over_the_exchange() {
    let p = Profile::known(Version::V1_9_2);
    let c = Create::new(
        &p,
        MachineName::new("wire-test").unwrap(),
        &MachineSpec::default(),
    )
    .unwrap();
    let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 231\r\n\r\n{\"name\":\"wire-test\",\"state\":\"created\",\"cpus\":1,\"memoryMb\":256,\"mounts\":[],\"ports\":[],\"network\":false,\"gpu\":false,\"cuda\":false,\"storageGb\":1,\"overlayGb\":1,\"forkable\":false,\"forkpointHeld\":false,\"diskUsedMb\":0,\"createdAt\":1795935394}";
    let (wire, out) = run(&c, reply);
    let text = String::from_utf8(wire).unwrap();
    assert!(text.starts_with("POST /api/v1/machines HTTP/1.1\r\n"));
    assert!(
        text.to_ascii_lowercase()
            .contains("content-type: application/json\r\n")
    );
    assert!(text.ends_with("\r\n\r\n{\"name\":\"wire-test\",\"cpus\":1,\"memoryMb\":256,\"storageGb\":1,\"overlayGb\":1,\"network\":false,\"gpu\":false,\"cuda\":false,\"dockerSocket\":false,\"mounts\":[],\"ports\":[],\"restart\":{\"policy\":\"never\"}}"));
    assert_eq!(out.unwrap().incarnation.name, "wire-test");
}

#[test]
fn tv25_upload_request_bytes() {
    let budget = FileBudget::new(1_048_576, &Budgets::default()).unwrap();
    let u = Upload::new(
        &Profile::known(Version::V1_9_2),
        &PathPolicy::default(),
        &budget,
        MachineName::new("dev").unwrap(),
        GuestPath::new("/workspace/hello.txt").unwrap(),
        Bytes::from_static(b"hello\n"),
        "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",
    )
    .unwrap();
    let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 41\r\n\r\n{\"path\":\"/workspace/hello.txt\",\"size\":6}";
    let (wire, out) = run(&u, reply);
    let text = String::from_utf8(wire).unwrap();
    let lower = text.to_ascii_lowercase();
    assert!(text.starts_with("PUT /api/v1/machines/dev/files/workspace/hello.txt HTTP/1.1\r\n"));
    assert!(lower.contains("content-type: application/octet-stream\r\n"));
    assert!(lower.contains("content-length: 6\r\n"));
    assert!(text.ends_with("\r\n\r\nhello\n"));
    assert_eq!(out.unwrap().size, 6);
}
