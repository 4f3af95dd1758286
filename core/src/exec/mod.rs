//! Command execution: buffered results, the SSE exec stream decoder, and the
//! background launch acknowledgement (features C5).
