//! The generic status → error mapping of features C1.2.

use crate::Reason;
use crate::error::{Category, Error, Evidence, Operation};

/// The error for a reply with a status the operation did not expect
/// (C1.2): 401 and 403 → `authentication`, 404 → `not_found`, 409 →
/// `identity_conflict`, anything else (redirects included: they are never
/// followed) → `protocol`. All carry `dispatch_uncertain` and the status.
/// Operation-specific refinements (a start reply's `PORT_IN_USE` →
/// `port_conflict`) belong to the worker module.
pub fn status_error(operation: Operation, status: u16) -> Error {
    let (category, reason) = match status {
        401 => (Category::Authentication, Reason::Unauthorized),
        403 => (Category::Authentication, Reason::Forbidden),
        404 => (Category::NotFound, Reason::NotFound),
        409 => (Category::IdentityConflict, Reason::Conflict),
        300..=399 => (Category::Protocol, Reason::Redirect),
        _ => (Category::Protocol, Reason::UnexpectedStatus),
    };
    Error::of(category, operation, Evidence::DispatchUncertain, reason).with_status(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reason;

    #[test]
    fn mapping() {
        let cases = [
            (401, Category::Authentication),
            (403, Category::Authentication),
            (404, Category::NotFound),
            (409, Category::IdentityConflict),
            (302, Category::Protocol),
            (500, Category::Protocol),
            (201, Category::Protocol),
        ];
        for (status, category) in cases {
            let e = status_error(Operation::Get, status);
            assert_eq!(e.category(), category, "{status}");
            assert_eq!(e.status(), Some(status));
            assert_eq!(e.operation(), Operation::Get);
            assert_eq!(e.evidence(), Evidence::DispatchUncertain);
        }
        assert_eq!(status_error(Operation::Get, 302).reason(), Reason::Redirect);
    }
}
