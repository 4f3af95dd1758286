//! The worker's interactive terminal session (features C7), sans-IO.
