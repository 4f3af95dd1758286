//! Tests of the exec module: worker-api.md §14 vectors (TV12, TV15–TV21),
//! the acceptance criteria of C5.1–C5.4, bounds at N and N+1, and the
//! any-split properties of the stream decoder.

mod buffered;
mod call;
mod command;
mod stream;
