//! Fuzz target: the SSE exec stream decoder under arbitrary input and
//! arbitrary chunking (body: `smolbox_core::exec::fuzz_exec_stream`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    smolbox_core::exec::fuzz_exec_stream(data);
});
