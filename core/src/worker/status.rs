//! Status mapping (features C1.2) and worker error bodies (worker-api.md §2).
//!
//! A non-success status becomes an [`Error`] with evidence
//! `dispatch_uncertain` and the status attached. The body is classified
//! ([`ErrorBody`]) only to pick a fixed reason code: its text never enters
//! the error.

use crate::Reason;
use serde::Deserialize;

use crate::error::{Category, Error, Evidence, Operation};
use crate::http1::ResponseHead;

/// The upstream `code` of a JSON handler error (worker-api.md §2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// `BAD_REQUEST` (400).
    BadRequest,
    /// `UNAUTHORIZED` (401).
    Unauthorized,
    /// `FORBIDDEN` (403).
    Forbidden,
    /// `NOT_FOUND` (404).
    NotFound,
    /// `TIMEOUT` (408).
    Timeout,
    /// `CONFLICT` (409).
    Conflict,
    /// `PORT_IN_USE` (409): a published host port is taken.
    PortInUse,
    /// `CLONE_IDENTITY_REJUVENATION_FAILED` (500).
    CloneIdentityRejuvenationFailed,
    /// `INTERNAL_ERROR` (500).
    InternalError,
    /// `UNAVAILABLE` (503).
    Unavailable,
    /// Any other code string.
    Other,
}

impl ErrorCode {
    /// Classifies an upstream code string.
    pub fn parse(code: &str) -> Self {
        match code {
            "BAD_REQUEST" => Self::BadRequest,
            "UNAUTHORIZED" => Self::Unauthorized,
            "FORBIDDEN" => Self::Forbidden,
            "NOT_FOUND" => Self::NotFound,
            "TIMEOUT" => Self::Timeout,
            "CONFLICT" => Self::Conflict,
            "PORT_IN_USE" => Self::PortInUse,
            "CLONE_IDENTITY_REJUVENATION_FAILED" => Self::CloneIdentityRejuvenationFailed,
            "INTERNAL_ERROR" => Self::InternalError,
            "UNAVAILABLE" => Self::Unavailable,
            _ => Self::Other,
        }
    }
}

/// A framework-level (axum extractor) rejection: `text/plain` bodies that
/// never reached the handler (worker-api.md §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// 415 ``Expected request with `Content-Type: application/json` ``.
    UnsupportedMediaType,
    /// 400 `Failed to parse the request body as JSON: …`.
    InvalidJson,
    /// 422 `Failed to deserialize the JSON body into the target type: …`.
    Unprocessable,
    /// 400 `Failed to deserialize query string: …`.
    InvalidQuery,
    /// 413 `Failed to buffer the request body: …`.
    BodyTooLarge,
    /// 400 WebSocket handshake rejection (`Connection header did not include 'upgrade'`, …).
    WebSocketHandshake,
    /// 503 `main runtime stalled; node unschedulable` from `/capacity`.
    RuntimeStalled,
    /// Some other text.
    OtherText,
}

/// What an error reply's body was, classified without keeping its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorBody {
    /// No body (404 unknown path, 405, the 300 s 408, `/readyz` 503, volume 204).
    Empty,
    /// A JSON handler error `{"error": …, "code": …}`.
    Handler(ErrorCode),
    /// A `text/plain` framework rejection.
    Framework(Rejection),
    /// Anything else (wrong media type, malformed JSON, …).
    Unrecognized,
}

#[derive(Deserialize)]
struct HandlerError<'a> {
    #[serde(borrow)]
    error: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    code: std::borrow::Cow<'a, str>,
}

/// Classifies an error reply body: JSON `{error, code}` when the media type
/// is JSON, the §2.2 framework texts when it is `text/plain`.
pub fn classify_error_body(head: &ResponseHead, body: &[u8]) -> ErrorBody {
    if body.is_empty() {
        return ErrorBody::Empty;
    }
    if head.media_type_is(super::APPLICATION_JSON) {
        return match serde_json::from_slice::<HandlerError<'_>>(body) {
            Ok(e) => {
                let _ = e.error; // peer text: classified away, never kept
                ErrorBody::Handler(ErrorCode::parse(&e.code))
            }
            Err(_) => ErrorBody::Unrecognized,
        };
    }
    if head.media_type_is(super::TEXT_PLAIN) {
        return ErrorBody::Framework(classify_rejection(body));
    }
    ErrorBody::Unrecognized
}

fn classify_rejection(body: &[u8]) -> Rejection {
    const TABLE: [(&[u8], Rejection); 7] = [
        (
            b"Expected request with `Content-Type: application/json`",
            Rejection::UnsupportedMediaType,
        ),
        (
            b"Failed to parse the request body as JSON",
            Rejection::InvalidJson,
        ),
        (
            b"Failed to deserialize the JSON body into the target type",
            Rejection::Unprocessable,
        ),
        (
            b"Failed to deserialize query string",
            Rejection::InvalidQuery,
        ),
        (
            b"Failed to buffer the request body",
            Rejection::BodyTooLarge,
        ),
        (
            b"Connection header did not include",
            Rejection::WebSocketHandshake,
        ),
        (b"main runtime stalled", Rejection::RuntimeStalled),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| body.starts_with(prefix))
        .map_or(Rejection::OtherText, |&(_, r)| r)
}

/// Maps a reply whose status is not `expected` to an error (features C1.2),
/// refining [`crate::http1::status_error`] for the worker.
///
/// 401/403 → `authentication`; 404 → `not_found`; 409 → `identity_conflict`
/// except a `start` answered with `PORT_IN_USE` → `port_conflict`; 408 (the
/// worker's 300 s request timeout: the work may still be running) →
/// `unknown`; anything else → `protocol`. All with evidence
/// `dispatch_uncertain` and the status attached.
///
/// # Errors
/// The mapped error when `head.status != expected`.
pub fn check_status(
    operation: Operation,
    head: &ResponseHead,
    body: &[u8],
    expected: u16,
) -> Result<(), Error> {
    if head.status == expected {
        return Ok(());
    }
    Err(status_error(operation, head, body))
}

/// The error for a reply with an unexpected status (see [`check_status`]).
pub fn status_error(operation: Operation, head: &ResponseHead, body: &[u8]) -> Error {
    let kind = classify_error_body(head, body);
    let (category, reason) = match head.status {
        409 if operation == Operation::Start
            && kind == ErrorBody::Handler(ErrorCode::PortInUse) =>
        {
            (Category::PortConflict, Reason::PortInUse)
        }
        408 => (Category::Unknown, Reason::WorkerRequestTimeout),
        // The generic mapping of C1.2 (authentication, not_found,
        // identity_conflict, redirects).
        401 | 403 | 404 | 409 | 300..=399 => {
            return crate::http1::status_error(operation, head.status);
        }
        _ => (Category::Protocol, protocol_reason(kind)),
    };
    Error::of(category, operation, Evidence::DispatchUncertain, reason).with_status(head.status)
}

fn protocol_reason(kind: ErrorBody) -> Reason {
    match kind {
        ErrorBody::Handler(ErrorCode::BadRequest) => Reason::WorkerBadRequest,
        ErrorBody::Handler(ErrorCode::InternalError) => Reason::WorkerInternalError,
        ErrorBody::Handler(ErrorCode::Unavailable) => Reason::WorkerUnavailable,
        ErrorBody::Handler(_) => Reason::WorkerError,
        ErrorBody::Framework(Rejection::UnsupportedMediaType) => Reason::RejectedMediaType,
        ErrorBody::Framework(Rejection::InvalidJson) => Reason::RejectedJsonSyntax,
        ErrorBody::Framework(Rejection::Unprocessable) => Reason::RejectedJsonShape,
        ErrorBody::Framework(Rejection::InvalidQuery) => Reason::RejectedQuery,
        ErrorBody::Framework(Rejection::BodyTooLarge) => Reason::RejectedBodyTooLarge,
        ErrorBody::Framework(Rejection::WebSocketHandshake) => Reason::RejectedUpgrade,
        ErrorBody::Framework(Rejection::RuntimeStalled) => Reason::WorkerRuntimeStalled,
        ErrorBody::Framework(Rejection::OtherText) => Reason::WorkerErrorText,
        ErrorBody::Empty => Reason::UnexpectedStatus,
        ErrorBody::Unrecognized => Reason::UnexpectedStatus,
    }
}

/// Requires the reply's single `content-type` to have media type `expected`.
///
/// # Errors
/// `protocol`, `dispatch_uncertain`, reason `unexpected_media_type`.
pub fn check_media_type(
    operation: Operation,
    head: &ResponseHead,
    expected: &str,
) -> Result<(), Error> {
    if head.media_type_is(expected) {
        Ok(())
    } else {
        Err(Error::protocol(operation, Reason::UnexpectedMediaType).with_status(head.status))
    }
}
