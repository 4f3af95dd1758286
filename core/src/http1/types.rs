//! The request and response-head values shared by the exchange and by the
//! worker operations that build requests and decode replies.

use core::fmt;

use bytes::Bytes;

use crate::error::Operation;

/// The request methods the worker API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// POST
    Post,
    /// PUT
    Put,
    /// DELETE
    Delete,
}

impl Method {
    /// The method token on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
        }
    }
}

/// One HTTP request, as a worker operation builds it. Connection-level
/// headers (Host, Authorization, Content-Length, Connection) are added by the
/// exchange from its configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct Request {
    /// The worker operation this request performs (errors are attributed to it).
    pub operation: Operation,
    /// The method.
    pub method: Method,
    /// Origin-form target: path and optional query, already percent-encoded
    /// (see [`crate::http1::encode`]). Must start with `/`.
    pub target: String,
    /// The `Accept` media type, when a typed reply is expected.
    pub accept: Option<&'static str>,
    /// The body's `Content-Type`, when there is a body.
    pub content_type: Option<&'static str>,
    /// The body (may be empty).
    pub body: Bytes,
}

impl Request {
    /// A request without a body.
    pub fn new(operation: Operation, method: Method, target: String) -> Self {
        Self {
            operation,
            method,
            target,
            accept: None,
            content_type: None,
            body: Bytes::new(),
        }
    }

    /// Sets `Accept`.
    #[must_use]
    pub fn accept(mut self, media_type: &'static str) -> Self {
        self.accept = Some(media_type);
        self
    }

    /// Sets the body and its content type.
    #[must_use]
    pub fn body(mut self, content_type: &'static str, body: impl Into<Bytes>) -> Self {
        self.content_type = Some(content_type);
        self.body = body.into();
        self
    }

    /// The path without the query (safe to log: the query may carry a program).
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("operation", &self.operation)
            .field("method", &self.method)
            .field("path", &self.path())
            .field("has_query", &self.target.contains('?'))
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// The decoded, validated head of a final (non-1xx) response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// The single `content-type` value as received, if present. (Two or
    /// more `content-type` headers are a protocol error at decode time.)
    pub content_type: Option<String>,
    /// `content-length`, when the body is length-delimited.
    pub content_length: Option<u64>,
    /// True when the body is chunked.
    pub chunked: bool,
    /// True when the connection may carry another exchange after this body.
    pub keep_alive: bool,
}

impl ResponseHead {
    /// True when the media type (before `;`, trimmed, compared
    /// case-insensitively) equals `expected` and there was exactly one
    /// `content-type` header.
    pub fn media_type_is(&self, expected: &str) -> bool {
        self.content_type.as_deref().is_some_and(|ct| {
            ct.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case(expected)
        })
    }
}
