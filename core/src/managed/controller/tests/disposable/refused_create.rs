//! A create the worker's create handler refused (400 with the JSON error
//! envelope, code `BAD_REQUEST`, worker-api.md §2.1, TV8) made nothing:
//! the one create of the record is never resent, so absence is known and
//! the reservation is released with no operator. A malformed reply, a
//! framework text, a 409 or a 5xx stays uncertain (reservation kept).
//! docs/decisions/runtime.md, "A create the worker refuses (session 9,
//! issue 12)".

use super::super::machines::{mkey, mspec};
use super::*;
use crate::http1::ResponseHead;
use crate::managed::state::{MachineOperation as Op, MachinePhase, MachineRecordState as MS};
use crate::worker::{Create, MachineName, MachineSpec, WorkerCall};

const SIDECAR: &[u8] =
    br#"{"error":"sidecar file not found: /images/missing.smolmachine","code":"BAD_REQUEST"}"#;
const JSON: &str = "application/json";

/// The error core's create call decodes from this reply (the shells hand
/// it to the controller as the create's answer).
fn create_error(status: u16, content_type: &str, body: &[u8]) -> Error {
    let head = ResponseHead {
        status,
        content_type: Some(content_type.to_owned()),
        content_length: Some(body.len() as u64),
        chunked: false,
        keep_alive: true,
    };
    let profile = Profile::admit("1.22.0", &[]).unwrap();
    let name = MachineName::new("sbx-refused").unwrap();
    let create = Create::new(&profile, name, &MachineSpec::default()).unwrap();
    create.decode(&head, body).unwrap_err()
}

#[test]
fn the_create_handlers_refusal_is_recognised_and_nothing_else_is() {
    let e = create_error(400, JSON, SIDECAR);
    // The error keeps what C1.2 says: the request reached the worker.
    assert_eq!(e.category(), Category::Protocol);
    assert_eq!(e.evidence(), Evidence::DispatchUncertain);
    assert!(Create::refused(&e), "{e:?}");
    let not_refusals = [
        create_error(400, JSON, br#"{"error":"sidecar file not found"}"#),
        create_error(400, JSON, b"{not json"),
        create_error(400, JSON, b""),
        create_error(
            400,
            "text/plain; charset=utf-8",
            b"Failed to parse the request body as JSON: EOF",
        ),
        create_error(400, JSON, br#"{"error":"x","code":"INTERNAL_ERROR"}"#),
        create_error(409, JSON, br#"{"error":"x","code":"CONFLICT"}"#),
        create_error(500, JSON, br#"{"error":"x","code":"BAD_REQUEST"}"#),
        create_error(500, JSON, br#"{"error":"x","code":"INTERNAL_ERROR"}"#),
        create_error(408, JSON, b""),
        Error::protocol(Operation::Create, Reason::CreateReplyMismatch),
        // The same refusal of another operation is no create's.
        create_error(400, JSON, SIDECAR).with_operation(Operation::Start),
    ];
    for e in not_refusals {
        assert!(!Create::refused(&e), "{e:?}");
    }
}

#[test]
fn a_create_the_worker_refuses_records_absence_and_releases() {
    let mut s = Sim::new(disposable_config());
    let key = s.submit_disposable("r1", &cmd());
    s.settle();
    assert!(s.record(&key).reservation.is_some());
    s.answer("create", Err(create_error(400, JSON, SIDECAR)));
    let rec = s.record(&key).clone();
    assert_eq!(rec.state, ExecState::Failed);
    assert_eq!(rec.evidence, RecordEvidence::NotDispatched);
    assert!(rec.creation.is_none());
    assert!(rec.absence_at_ms.is_some(), "nothing was created");
    assert_eq!(rec.cleanup, Cleanup::Complete);
    assert_eq!(rec.reservation, None, "released, no operator");
    assert_eq!(rec.next_due_at_ms, None);
    let last = rec.last_error.unwrap();
    assert_eq!(
        (last.operation.as_str(), last.reason.as_str()),
        ("create", "worker_bad_request")
    );
    let f = s.finished(&key).unwrap();
    assert_eq!(
        f.error.as_ref().map(Error::reason),
        Some(Reason::WorkerBadRequest)
    );
    // Absence is written before the release, which is its own step.
    let absence = s
        .store_log
        .iter()
        .position(|op| matches!(op, StoreOp::Write { patch, .. } if patch.absence_at_ms.is_some()))
        .unwrap();
    let release = s
        .store_log
        .iter()
        .position(|op| matches!(op, StoreOp::Release { .. }))
        .unwrap();
    assert!(absence < release);
    // No second create, no inspect, no delete.
    s.advance(2_000);
    assert!(s.worker.is_empty(), "{:?}", s.worker);
}

#[test]
fn a_malformed_or_5xx_create_reply_stays_uncertain_and_keeps_the_reservation() {
    let replies = [
        create_error(400, JSON, br#"{"error":"sidecar file not found"}"#),
        create_error(400, JSON, b"{not json"),
        create_error(500, JSON, br#"{"error":"x","code":"INTERNAL_ERROR"}"#),
        create_error(502, "text/plain", b"bad gateway"),
        create_error(409, JSON, br#"{"error":"x","code":"CONFLICT"}"#),
    ];
    for (i, e) in replies.into_iter().enumerate() {
        let mut s = Sim::new(disposable_config());
        let key = s.submit_disposable(&format!("u{i}"), &cmd());
        s.settle();
        s.answer("create", Err(e));
        let rec = s.record(&key).clone();
        assert_eq!(rec.state, ExecState::Failed);
        assert_eq!(rec.cleanup, Cleanup::Failed, "{i}");
        assert!(rec.absence_at_ms.is_none(), "{i}");
        assert!(rec.reservation.is_some(), "{i}: kept for an operator");
        s.advance(2_000);
        assert!(s.worker.is_empty(), "{i}: no second create");
    }
}

#[test]
fn a_retained_create_the_worker_refuses_is_a_create_that_made_nothing() {
    let run = |e: Error| {
        let mut s = Sim::new(disposable_config());
        s.settle();
        s.request(MachineRequest::Create {
            key: mkey(),
            spec: mspec(),
        })
        .unwrap();
        s.settle();
        s.answer("create", Err(e));
        s.advance(2_000);
        assert!(s.worker.is_empty(), "no second create: {:?}", s.worker);
        s
    };
    let mut s = run(create_error(400, JSON, SIDECAR));
    let m = s.machine().clone();
    assert_eq!(
        (m.state, m.operation, m.phase),
        (MS::Unknown, Op::None, MachinePhase::None)
    );
    assert!(m.absence_at_ms.is_some(), "nothing was created");
    // The owner's delete settles it with no worker call; the reservation
    // goes with it.
    s.request(MachineRequest::Lifecycle {
        key: mkey(),
        action: Op::Delete,
        version: m.version,
    })
    .unwrap();
    s.settle();
    assert!(s.worker.is_empty(), "{:?}", s.worker);
    let m = s.machine().clone();
    assert_eq!(m.state, MS::Deleted);
    assert_eq!(m.reservation, None);
    let s = run(create_error(
        500,
        JSON,
        br#"{"error":"x","code":"INTERNAL_ERROR"}"#,
    ));
    let m = s.machine().clone();
    assert_eq!((m.state, m.phase), (MS::Unknown, MachinePhase::Uncertain));
    assert!(m.absence_at_ms.is_none());
    assert!(m.reservation.is_some());
}
