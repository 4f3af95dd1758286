//! Helpers of the PostgreSQL test binaries (`postgres.rs`, `postgres_tls.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

/// A partition name no other test (or earlier run) uses: `prefix` and nine
/// base-36 digits of the time and a counter (`[a-z][a-z0-9]{0,9}`).
pub(crate) fn fresh_partition(prefix: char) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut v = (nanos / 1_000 % 36u64.pow(6)) * 1_000 + N.fetch_add(1, Ordering::Relaxed) % 1_000;
    let mut s = String::from(prefix);
    while s.len() < 10 {
        s.extend(char::from_digit((v % 36) as u32, 36));
        v /= 36;
    }
    s
}
