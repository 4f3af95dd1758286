//! Shared reply plumbing: status, media type and JSON decoding.

use crate::Reason;
use serde::de::DeserializeOwned;

use super::status::{check_media_type, check_status};
use crate::error::{Error, Operation};
use crate::http1::ResponseHead;

/// Requires status 200 and `application/json`, then decodes `T`.
pub(crate) fn decode_json<T: DeserializeOwned>(
    operation: Operation,
    head: &ResponseHead,
    body: &[u8],
) -> Result<T, Error> {
    check_status(operation, head, body, 200)?;
    check_media_type(operation, head, super::APPLICATION_JSON)?;
    serde_json::from_slice(body).map_err(|_| Error::protocol(operation, Reason::InvalidJsonReply))
}
