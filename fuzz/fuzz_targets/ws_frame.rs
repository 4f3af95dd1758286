//! WebSocket frame decoder: arbitrary server bytes never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    smolbox_core::ws::fuzz_ws_frames(data);
});
