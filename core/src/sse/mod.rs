//! WHATWG event-stream parser (HTML "Parsing an event stream"), sans-IO.
