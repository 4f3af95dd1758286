//! Every worker reply decoder on arbitrary bytes (see
//! `smolbox_core::worker::fuzzing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    smolbox_core::worker::fuzzing::fuzz_worker_reply(data);
});
