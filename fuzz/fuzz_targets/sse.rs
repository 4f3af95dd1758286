//! Fuzz target: the WHATWG event-stream parser under arbitrary input and
//! arbitrary chunking (body: `smolbox_core::sse::fuzz_sse`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    smolbox_core::sse::fuzz_sse(data);
});
