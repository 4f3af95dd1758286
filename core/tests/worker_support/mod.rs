//! Shared helpers for the worker tests: response heads and error checks.
#![allow(dead_code, unreachable_pub)] // each test file uses a subset

use smolbox_core::http1::ResponseHead;
use smolbox_core::worker::{Profile, Version};
use smolbox_core::{Category, Error, Evidence, Operation};

/// A head with `status` and `content_type`.
pub fn head(status: u16, content_type: Option<&str>, body: &[u8]) -> ResponseHead {
    ResponseHead {
        status,
        content_type: content_type.map(str::to_owned),
        content_length: Some(body.len() as u64),
        chunked: false,
        keep_alive: true,
    }
}

/// A JSON head.
pub fn json(status: u16, body: &[u8]) -> ResponseHead {
    head(status, Some("application/json"), body)
}

/// A framework-rejection head (`text/plain; charset=utf-8`).
pub fn text(status: u16, body: &[u8]) -> ResponseHead {
    head(status, Some("text/plain; charset=utf-8"), body)
}

/// Asserts category, operation and evidence of an error.
#[track_caller]
pub fn assert_err(e: &Error, category: Category, operation: Operation, evidence: Evidence) {
    assert_eq!(e.category(), category, "{e:?}");
    assert_eq!(e.operation(), operation, "{e:?}");
    assert_eq!(e.evidence(), evidence, "{e:?}");
}

/// The 1.9.2 profile.
pub fn v192() -> Profile {
    Profile::known(Version::V1_9_2)
}

/// The 1.22.0 profile.
pub fn v122() -> Profile {
    Profile::known(Version::V1_22_0)
}
