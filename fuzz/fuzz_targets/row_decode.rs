//! A durable adapter's row (clear columns + sealed payload) from arbitrary
//! bytes: a typed `store` error or the row's own record, never a panic
//! (see `smolbox_store::fuzzing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    smolbox_store::fuzzing::fuzz_row(data);
});
