//! Execution and machine records, their pure transitions, fingerprints and the
//! record envelope (features C12.5, C13, C14, C15, C19), shared by every store.
