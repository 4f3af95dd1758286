//! The managed controller fed arbitrary commands, store answers (true,
//! failed, mutated, decoded from bytes), worker answers and clock steps
//! (see `smolbox_store::fuzzing` for the oracles).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    smolbox_store::fuzzing::fuzz_controller(data);
});
