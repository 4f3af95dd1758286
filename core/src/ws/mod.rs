//! RFC 6455 WebSocket client connection, sans-IO.
