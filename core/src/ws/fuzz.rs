//! Fuzz entry point for the frame decoder (`fuzz/fuzz_targets/ws_frame.rs`).

use std::time::{Duration, Instant};

use super::{CloseCode, WsClient, WsConfig, WsEvent, handshake};

/// Feeds `data` to an open client as server frames and drains everything.
///
/// The first byte picks the read chunk size (1–256 bytes) and whether the
/// client sends and closes along the way; the rest is the byte stream after a
/// valid 101 reply. It must never panic: every outcome is an event or one of
/// our typed errors.
pub fn fuzz_ws_frames(data: &[u8]) {
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    let now = fuzz_epoch();
    let key = [7u8; 16];
    let mut config = WsConfig::new("localhost", "/fuzz");
    config.max_message_len = 4_096 + usize::from(ctl & 0x0f) * 1_024;
    let Ok(mut ws) = WsClient::new(config, key, now) else {
        return;
    };
    ws.handle_entropy(&[0x5a; 64]);
    let mut out = Vec::new();
    let _ = ws.poll_transmit(&mut out);
    let accept = handshake::accept_for(&handshake::encode_key(&key));
    let reply = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
    );
    let _ = ws.handle_input(now, reply.as_bytes());
    let chunk = usize::from(ctl >> 4) * 16 + 1;
    for (i, piece) in stream.chunks(chunk).enumerate() {
        if ws.handle_input(now, piece).is_err() {
            break;
        }
        drain(&mut ws, &mut out);
        if ctl & 0x01 != 0 && i == 1 {
            let _ = ws.send_binary(now, piece);
        }
        if ctl & 0x02 != 0 && i == 3 {
            let _ = ws.close(now, CloseCode::NORMAL);
        }
        ws.handle_entropy(&[0xa5; 16]);
    }
    ws.handle_eof(now);
    drain(&mut ws, &mut out);
    ws.handle_timeout(now + Duration::from_secs(60));
    drain(&mut ws, &mut out);
}

fn drain(ws: &mut WsClient, out: &mut Vec<u8>) {
    // Bounded: every event consumes input or ends the connection.
    for _ in 0..100_000 {
        match ws.poll_event() {
            None => break,
            Some(WsEvent::Closed(_) | WsEvent::Failed(_)) => {}
            Some(_) => {}
        }
    }
    out.clear();
    let _ = ws.poll_transmit(out);
}

/// The fuzz body needs some `Instant` to start from; every later time is
/// derived from it by addition, so behaviour does not depend on the clock.
#[allow(clippy::disallowed_methods)] // a fuzz harness, not protocol logic
pub(crate) fn fuzz_epoch() -> Instant {
    Instant::now()
}
