//! Fuzz entry point for the terminal session (`fuzz/fuzz_targets/terminal_session.rs`).

use std::time::Duration;

use super::{Next, TerminalConfig, TerminalSession, TerminalSpec};
use crate::ws::handshake;

/// Drives a session with `data` as the worker's byte stream after a valid
/// 101, interleaving consumer pulls, input, resize, timers and close as the
/// control bytes say. It must never panic, and a confirmed exit must only
/// ever be one the worker sent.
pub fn fuzz_terminal(data: &[u8]) {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let now = crate::ws::fuzz_epoch();
    let key = [3u8; 16];
    let spec = TerminalSpec {
        max_buffer_bytes: 1_024 + usize::from(ctl & 0x07) * 512,
        max_input_bytes: 64,
        ..TerminalSpec::default()
    };
    let mut config = TerminalConfig::new("localhost", "dev");
    config.max_request_bytes = 256;
    let Ok(mut s) = TerminalSession::new(&spec, config, key, now) else {
        return;
    };
    s.handle_entropy(&[0x11; 4_096]);
    let mut out = Vec::new();
    let _ = s.poll_transmit(&mut out);
    let accept = handshake::accept_for(&handshake::encode_key(&key));
    let reply = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
    );
    let _ = s.handle_input(now, reply.as_bytes());
    let chunk = usize::from(ctl >> 3) + 1;
    let mut t = now;
    for (i, piece) in rest.chunks(chunk).enumerate() {
        let _ = s.handle_input(t, piece);
        let op = piece.first().copied().unwrap_or(0);
        match (op >> 5, i % 3) {
            (0, _) => {
                let _ = s.input(t, piece);
            }
            (1, _) => {
                let _ = s.resize(t, u16::from(op), 24);
            }
            (2, 0) => t += Duration::from_millis(u64::from(op) * 100),
            (3, _) => s.close(t),
            _ => {}
        }
        s.handle_timeout(t);
        if s.entropy_wanted() > 0 {
            s.handle_entropy(&[0x22; 4_096]);
        }
        out.clear();
        let _ = s.poll_transmit(&mut out);
        if op & 1 == 0 {
            let _ = s.next(t, t);
        }
    }
    s.handle_eof(t);
    s.handle_timeout(t + Duration::from_secs(100_000));
    for _ in 0..2_000 {
        match s.next(t, t) {
            Next::Output(_) => {}
            Next::Closed(_) | Next::TimedOut(_) | Next::Pending(_) => break,
        }
    }
}
