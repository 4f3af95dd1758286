//! Fuzz bodies of the store crate's cargo-fuzz targets (`fuzz/`), plain
//! functions like `smolbox_core`'s `fuzzing` entry points, so `cargo test
//! -p smolbox-store` replays the committed seeds on stable
//! (`tests/fuzz_replay.rs`); docs/fuzzing.md lists every target.

mod controller;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod row;

pub use controller::fuzz_controller;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use row::fuzz_row;
