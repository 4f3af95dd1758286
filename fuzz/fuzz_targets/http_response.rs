//! Response decoder: arbitrary bytes in arbitrary splits must never panic
//! and must report the same outcome whatever the split.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    smolbox_core::http1::fuzzing::fuzz_response(data);
});
