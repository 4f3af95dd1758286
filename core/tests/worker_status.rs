//! Status mapping (C1.2) and error bodies (worker-api.md §2, TV9–TV11,
//! TV13, TV29).
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use smolbox_core::Reason;
mod worker_support;

use smolbox_core::worker::status::{check_status, classify_error_body};
use smolbox_core::worker::{
    Create, ErrorBody, ErrorCode, Get, MachineName, MachineSpec, Rejection, Start, WorkerCall,
};
use smolbox_core::{Category, Evidence, Operation};
use worker_support::*;

fn name(n: &str) -> MachineName {
    MachineName::new(n).unwrap()
}

#[test]
fn status_table() {
    let cases = [
        (401, Category::Authentication),
        (403, Category::Authentication),
        (404, Category::NotFound),
        (409, Category::IdentityConflict),
        (408, Category::Unknown),
        (302, Category::Protocol),
        (400, Category::Protocol),
        (413, Category::Protocol),
        (500, Category::Protocol),
        (503, Category::Protocol),
        (201, Category::Protocol),
    ];
    for (status, category) in cases {
        let e = check_status(Operation::Get, &head(status, None, b""), b"", 200).unwrap_err();
        assert_err(&e, category, Operation::Get, Evidence::DispatchUncertain);
        assert_eq!(e.status(), Some(status));
    }
    assert!(check_status(Operation::Get, &head(200, None, b""), b"", 200).is_ok());
}

#[test]
fn tv9_duplicate_create_is_identity_conflict() {
    let b = br#"{"error":"machine 'wire-test' already exists","code":"CONFLICT"}"#;
    let c = Create::new(&v192(), name("wire-test"), &MachineSpec::default()).unwrap();
    let e = c.decode(&json(409, b), b).unwrap_err();
    assert_err(
        &e,
        Category::IdentityConflict,
        Operation::Create,
        Evidence::DispatchUncertain,
    );
    assert_eq!(
        classify_error_body(&json(409, b), b),
        ErrorBody::Handler(ErrorCode::Conflict)
    );
}

#[test]
fn start_port_in_use_is_port_conflict() {
    let b = br#"{"error":"host port 18090 is already in use","code":"PORT_IN_USE"}"#;
    let s = Start::new(&v122(), name("s1"));
    let e = s.decode(&json(409, b), b).unwrap_err();
    assert_err(
        &e,
        Category::PortConflict,
        Operation::Start,
        Evidence::DispatchUncertain,
    );
    // Only start maps PORT_IN_USE; a plain CONFLICT on start is identity_conflict.
    let c = br#"{"error":"machine is frozen","code":"CONFLICT"}"#;
    assert_eq!(
        s.decode(&json(409, c), c).unwrap_err().category(),
        Category::IdentityConflict
    );
    let g = Get::new(&v122(), name("s1"));
    assert_eq!(
        g.decode(&json(409, b), b).unwrap_err().category(),
        Category::IdentityConflict
    );
}

#[test]
fn request_timeout_408_is_uncertain_not_protocol() {
    let s = Start::new(&v192(), name("s1"));
    let e = s.decode(&head(408, None, b""), b"").unwrap_err();
    assert_err(
        &e,
        Category::Unknown,
        Operation::Start,
        Evidence::DispatchUncertain,
    );
    assert_eq!(e.reason(), Reason::WorkerRequestTimeout);
}

#[test]
fn tv10_framework_rejections_are_classified() {
    let cases: [(u16, &[u8], Rejection, Reason); 9] = [
        (400, b"Failed to parse the request body as JSON: name: EOF while parsing a value at line 1 column 8", Rejection::InvalidJson, Reason::RejectedJsonSyntax),
        (415, b"Expected request with `Content-Type: application/json`", Rejection::UnsupportedMediaType, Reason::RejectedMediaType),
        (422, b"Failed to deserialize the JSON body into the target type: cpus: invalid type: string \"two\", expected u8 at line 1 column 25", Rejection::Unprocessable, Reason::RejectedJsonShape),
        (422, b"Failed to deserialize the JSON body into the target type: user: unknown field `user`, expected one of `command`, `env`, `secrets`, `workdir`, `timeoutSecs`, `stdin`, `background` at line 1 column 31", Rejection::Unprocessable, Reason::RejectedJsonShape),
        (413, b"Failed to buffer the request body: length limit exceeded", Rejection::BodyTooLarge, Reason::RejectedBodyTooLarge),
        (400, b"Failed to parse the request body as JSON: EOF while parsing a value at line 1 column 0", Rejection::InvalidJson, Reason::RejectedJsonSyntax),
        (400, b"Failed to deserialize query string: forkable: provided string was not `true` or `false`", Rejection::InvalidQuery, Reason::RejectedQuery),
        (400, b"Connection header did not include 'upgrade'", Rejection::WebSocketHandshake, Reason::RejectedUpgrade),
        (400, b"something else", Rejection::OtherText, Reason::WorkerErrorText),
    ];
    let c = Create::new(&v192(), name("x1"), &MachineSpec::default()).unwrap();
    for (status, body, rejection, reason) in cases {
        let h = text(status, body);
        assert_eq!(
            classify_error_body(&h, body),
            ErrorBody::Framework(rejection)
        );
        let e = c.decode(&h, body).unwrap_err();
        assert_err(
            &e,
            Category::Protocol,
            Operation::Create,
            Evidence::DispatchUncertain,
        );
        assert_eq!((e.reason(), e.status()), (reason, Some(status)));
        // AC-0.2.2: peer text never reaches the error.
        let shown = format!("{e} {e:?}");
        assert!(
            !shown.contains("Failed") && !shown.contains("Expected"),
            "{shown}"
        );
    }
    // Unknown path 404 and wrong method 405: empty bodies.
    assert_eq!(
        classify_error_body(&head(404, None, b""), b""),
        ErrorBody::Empty
    );
    let e = c.decode(&head(405, None, b""), b"").unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Protocol, Reason::UnexpectedStatus)
    );
}

#[test]
fn tv11_not_found_and_tv13_internal_error() {
    let b = br#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#;
    let e = Get::new(&v192(), name("nope"))
        .decode(&json(404, b), b)
        .unwrap_err();
    assert_err(
        &e,
        Category::NotFound,
        Operation::Get,
        Evidence::DispatchUncertain,
    );
    assert!(!format!("{e:?}").contains("nope"));
    let b = br#"{"error":"failed to start machine: kvm permission denied: Cannot access /dev/kvm (permission denied).\nAdd your user to the 'kvm' group:\n\nsudo usermod -aG kvm $USER\n\nThen log out and log back in for the change to take effect.","code":"INTERNAL_ERROR"}"#;
    assert_eq!(b.len(), 255); // content-length in the vector
    let e = Start::new(&v192(), name("wire-test"))
        .decode(&json(500, b), b)
        .unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::Start,
        Evidence::DispatchUncertain,
    );
    assert_eq!(e.reason(), Reason::WorkerInternalError);
    assert!(!format!("{e} {e:?}").contains("kvm"));
}

#[test]
fn malformed_error_bodies_are_still_status_errors() {
    for body in [&b"{"[..], b"[]", br#"{"error":1,"code":2}"#, b"\xff\xfe"] {
        assert_eq!(
            classify_error_body(&json(500, body), body),
            ErrorBody::Unrecognized
        );
        let e = check_status(Operation::Get, &json(500, body), body, 200).unwrap_err();
        assert_eq!(e.category(), Category::Protocol);
    }
    let h = head(500, Some("text/html"), b"<html>");
    assert_eq!(classify_error_body(&h, b"<html>"), ErrorBody::Unrecognized);
}

#[test]
fn tv8_create_validation_errors_are_protocol_without_text() {
    let bodies = [
        r#"{"error":"machine name cannot be empty","code":"BAD_REQUEST"}"#,
        r#"{"error":"published ports require networkBackend 'virtio-net' (TSI is outbound-only); omit networkBackend or set it to 'virtio-net'","code":"BAD_REQUEST"}"#,
        r#"{"error":"port 0 is not valid for VM port forwarding","code":"BAD_REQUEST"}"#,
        r#"{"error":"invalid CIDR 'nope': expected format like 10.0.0.0/8 or 1.1.1.1","code":"BAD_REQUEST"}"#,
        r#"{"error":"cmd/entrypoint require an image, from, or registryRef; an imageless machine has no workload to launch them in (use exec instead)","code":"BAD_REQUEST"}"#,
        r#"{"error":"config operation failed: validate resources: memory must be at least 64 MiB (got 32 MiB)","code":"BAD_REQUEST"}"#,
        r#"{"error":"config operation failed: validate resources: CPU count must be at least 1","code":"BAD_REQUEST"}"#,
        r#"{"error":"sidecar file not found: /nonexistent/x.smolmachine","code":"BAD_REQUEST"}"#,
        r#"{"error":"secret 'TOKEN': source kind 'env' is not allowed in scope Untrusted; secret refs may only be resolved on the trusted local host","code":"BAD_REQUEST"}"#,
    ];
    let c = Create::new(&v192(), name("c0"), &MachineSpec::default()).unwrap();
    for b in bodies {
        let b = b.as_bytes();
        assert_eq!(
            classify_error_body(&json(400, b), b),
            ErrorBody::Handler(ErrorCode::BadRequest)
        );
        let e = c.decode(&json(400, b), b).unwrap_err();
        assert_err(
            &e,
            Category::Protocol,
            Operation::Create,
            Evidence::DispatchUncertain,
        );
        assert_eq!(
            (e.reason(), e.status()),
            (Reason::WorkerBadRequest, Some(400))
        );
        let shown = format!("{e} {e:?}");
        assert!(
            !shown.contains("error") || !shown.contains("BAD_REQUEST"),
            "{shown}"
        );
        assert!(
            !shown.contains("CIDR") && !shown.contains("secret"),
            "{shown}"
        );
    }
}

#[test]
fn ac_0_2_2_sentinels_never_reach_errors_or_request_debug() {
    use bytes::Bytes;
    use smolbox_core::worker::{Budgets, FileBudget, GuestPath, PathPolicy, Source, Upload};
    let spec = MachineSpec {
        source: Source::Registry {
            reference: "r.example.com/a:1".into(),
            identity_token: Some(smolbox_core::Secret::new("SENTINEL-TOKEN")),
        },
        ..MachineSpec::default()
    };
    let c = Create::new(&v122(), name("m1"), &spec).unwrap();
    let req = c.request().unwrap();
    assert!(
        std::str::from_utf8(&req.body)
            .unwrap()
            .contains(r#""registryIdentityToken":"SENTINEL-TOKEN""#)
    );
    assert!(!format!("{req:?} {c:?}").contains("SENTINEL"));
    let e = Upload::new(
        &v122(),
        &PathPolicy::default(),
        &FileBudget::new(1_000, &Budgets::default()).unwrap(),
        name("m1"),
        GuestPath::new("/workspace/secret").unwrap(),
        Bytes::from_static(b"SENTINEL-PAYLOAD"),
        &"0".repeat(64),
    )
    .unwrap_err();
    assert!(!format!("{e} {e:?}").contains("SENTINEL"));
    let b = br#"{"error":"SENTINEL-PEER-TEXT","code":"INTERNAL_ERROR"}"#;
    let e = c.decode(&json(500, b), b).unwrap_err();
    assert!(!format!("{e} {e:?}").contains("SENTINEL"));
}
