//! Terminal session: arbitrary worker bytes and consumer actions never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    smolbox_core::terminal::fuzz_terminal(data);
});
