//! Arbitrary bytes given to the record envelope decoders never panic, and
//! whatever decodes re-encodes to the same payload.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    smolbox_core::managed::envelope::fuzz_envelope(data);
});
