//! The smolvm worker API as data: endpoint configuration, version profiles,
//! and one module per operation family that builds the request and decodes
//! and validates the reply.
