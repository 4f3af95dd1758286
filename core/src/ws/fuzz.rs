//! Fuzz entry point for the frame decoder (`fuzz/fuzz_targets/ws_frame.rs`).

use std::time::{Duration, Instant};

use super::{CloseCode, MAX_CLOSE_REASON, WsClient, WsConfig, WsEvent, handshake};

/// Most bytes the send buffer may hold while the socket takes nothing: the
/// upgrade request, one application frame of the harness (at most 256
/// bytes), one pong and one close. A ping flood must not grow it.
const SLOW_READER_TX_CAP: usize = 4_096;

/// Feeds `data` to an open client as server frames and drains everything.
///
/// The first byte picks the read chunk size (1–256 bytes) and whether the
/// client sends and closes (with a reason) along the way; its bit 2 makes
/// the socket take nothing (a peer that does not read: the send buffer must
/// stay bounded) and bit 3 turns on the idle and write bounds, whose timers
/// fire between reads. The rest is the byte stream after a valid 101 reply. It
/// must never panic: every outcome is an event or one of our typed errors.
///
/// # Panics
/// When the send buffer of a non-reading peer grows past 4 KiB, or a
/// reported close reason passes 123 bytes (fuzzing findings).
pub fn fuzz_ws_frames(data: &[u8]) {
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    let now = fuzz_epoch();
    let key = [7u8; 16];
    let slow_reader = ctl & 0x04 != 0;
    let timers = ctl & 0x08 != 0;
    let mut config = WsConfig::new("localhost", "/fuzz");
    config.max_message_len = 4_096 + usize::from(ctl & 0x0f) * 1_024;
    if timers {
        config.idle_timeout = Some(Duration::from_millis(1_000));
        config.write_wait = Some(Duration::from_millis(700));
    }
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
    let mut t = now;
    for (i, piece) in stream.chunks(chunk).enumerate() {
        if ws.handle_input(t, piece).is_err() {
            break;
        }
        drain(&mut ws, &mut out, slow_reader);
        if ctl & 0x01 != 0 && i == 1 {
            let _ = ws.send_binary(t, piece);
        }
        if ctl & 0x02 != 0 && i == 3 {
            let _ = ws.close_with_reason(t, CloseCode::NORMAL, "fuzz");
        }
        // Like a shell: top the masking pool up whenever it asks.
        let wanted = ws.entropy_wanted();
        ws.handle_entropy(&vec![0xa5; wanted]);
        if timers {
            // Time passes between reads: keepalive, idle and write timers.
            t += Duration::from_millis(u64::from(piece[0]) * 4);
            ws.handle_timeout(t);
            drain(&mut ws, &mut out, slow_reader);
        }
    }
    ws.handle_eof(t);
    drain(&mut ws, &mut out, slow_reader);
    ws.handle_timeout(t + Duration::from_secs(60));
    drain(&mut ws, &mut out, false);
}

fn drain(ws: &mut WsClient, out: &mut Vec<u8>, slow_reader: bool) {
    // Bounded: every event consumes input or ends the connection.
    for _ in 0..100_000 {
        match ws.poll_event() {
            None => break,
            Some(WsEvent::Closed(info)) => {
                // The reported reason is the peer's, within the RFC bound.
                assert!(info.reason.len() <= MAX_CLOSE_REASON);
                let _ = info.reason.as_str();
            }
            Some(_) => {}
        }
    }
    if slow_reader {
        assert!(
            ws.pending_transmit() <= SLOW_READER_TX_CAP,
            "send buffer grew to {} for a peer that does not read",
            ws.pending_transmit()
        );
        return;
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
