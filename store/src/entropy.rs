//! The operating system's randomness for core's terminal session, drawn
//! the same way by both shells: the session's 16-byte WebSocket key when
//! it is created, and the masking randomness it asks for
//! ([`TerminalSession::entropy_wanted`]) after every input, command or
//! turn. Core never seeds randomness itself; this is the shells' source.

use std::time::Instant;

use smolbox_core::terminal::{TerminalConfig, TerminalSession, TerminalSpec};
use smolbox_core::{Error, Evidence, Operation, Reason};

/// A new session for `spec` with a random key and its first masking
/// randomness.
///
/// # Errors
/// The session's validation errors; `transport` / `no_randomness`
/// (`not_dispatched`) when the system has no randomness to give.
pub fn terminal_session(
    spec: &TerminalSpec,
    config: TerminalConfig,
    now: Instant,
) -> Result<TerminalSession, Error> {
    let mut key = [0u8; 16];
    random(&mut key)?;
    let mut session = TerminalSession::new(spec, config, key, now)?;
    top_up(&mut session)?;
    Ok(session)
}

/// Tops up the session's masking randomness when it asks for more.
///
/// # Errors
/// `transport` / `no_randomness` when the system has none to give (the
/// session can then send nothing more; the shell tells it so).
pub fn top_up(session: &mut TerminalSession) -> Result<(), Error> {
    let wanted = session.entropy_wanted();
    if wanted > 0 {
        let mut buf = vec![0u8; wanted];
        random(&mut buf)?;
        session.handle_entropy(&buf);
    }
    Ok(())
}

fn random(buf: &mut [u8]) -> Result<(), Error> {
    getrandom::fill(buf).map_err(|_| {
        Error::transport(
            Operation::TerminalOpen,
            Evidence::NotDispatched,
            Reason::NoRandomness,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade_request() -> (Vec<u8>, TerminalSession) {
        let spec = TerminalSpec::default();
        let config = TerminalConfig::new("localhost", "m1");
        let mut session = terminal_session(&spec, config, Instant::now()).unwrap();
        let mut out = Vec::new();
        let _ = session.poll_transmit(&mut out);
        (out, session)
    }

    #[test]
    fn a_new_session_has_a_random_key_and_its_masking_randomness() {
        let (a, session) = upgrade_request();
        let (b, _) = upgrade_request();
        assert!(!a.is_empty());
        // Two sessions' upgrade requests differ only by their random key.
        assert_ne!(a, b);
        assert_eq!(session.entropy_wanted(), 0);
    }
}
