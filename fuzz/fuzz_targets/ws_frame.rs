//! WebSocket frame decoder: arbitrary server bytes never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    smolbox_core::ws::fuzz_ws_frames(data);
    // A planted bug (feature `plant`, off by default) shows that a panic
    // is caught: a server close frame with code 4242 anywhere in the
    // stream. See docs/fuzzing.md for the run that found it.
    #[cfg(feature = "plant")]
    if data.windows(4).any(|w| w == [0x88, 0x02, 0x10, 0x92]) {
        panic!("planted: close 4242");
    }
});
