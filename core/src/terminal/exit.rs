//! The worker's exit text frame and what an exit code proves (features
//! C7.2, C7.3; worker-api.md §8.3).

use crate::Reason;
use serde::Deserialize;

use crate::error::{Error, Evidence, Operation};

/// Longest text frame the worker may send (the exit frame).
pub const MAX_EXIT_FRAME_BYTES: usize = 128;

/// A confirmed exit: the program ended with this code, and the code is not
/// one the worker also uses as a sentinel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminalExit {
    /// The exit code, 0–255 except 124 and 130.
    pub code: i32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExitFrame {
    #[serde(rename = "type")]
    kind: String,
    code: i64,
}

/// Decodes a text frame that must be exactly `{"type":"exit","code":N}`.
///
/// # Errors
/// `protocol` (evidence `unknown`) for a frame over 128 bytes, any other
/// JSON shape or type, extra or missing keys, or a code outside `i32`.
pub(crate) fn parse_exit_frame(text: &str) -> Result<i32, Error> {
    let bad = |reason| {
        Error::protocol(Operation::TerminalOutput, reason).with_evidence(Evidence::Unknown)
    };
    if text.len() > MAX_EXIT_FRAME_BYTES {
        return Err(bad(Reason::TextFrameTooLong)
            .with_limit(text.len() as u64, MAX_EXIT_FRAME_BYTES as u64));
    }
    let frame: ExitFrame =
        serde_json::from_str(text).map_err(|_| bad(Reason::UnexpectedTextFrame))?;
    if frame.kind != "exit" {
        return Err(bad(Reason::UnexpectedTextFrame));
    }
    i32::try_from(frame.code).map_err(|_| bad(Reason::ExitCodeOutOfRange))
}

/// What an exit code proves: 0–255 except 124 (the agent's timeout code)
/// and 130 (the worker's "client went away") is confirmed; 124, 130 and -1
/// (internal error) are uncertain; anything else breaks the contract.
///
/// # Errors
/// `unknown` (evidence `unknown`, the code attached) for 124/130/-1;
/// `protocol` (evidence `unknown`) for codes outside -1..=255.
pub(crate) fn classify_exit(code: i32) -> Result<TerminalExit, Error> {
    let op = Operation::TerminalSession;
    match code {
        124 | 130 | -1 => Err(
            Error::unknown(op, Evidence::Unknown, Reason::AmbiguousExitCode).with_exit_code(code),
        ),
        0..=255 => Ok(TerminalExit { code }),
        _ => Err(Error::protocol(op, Reason::ExitCodeOutOfRange).with_evidence(Evidence::Unknown)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Category;
    use crate::Reason;

    #[test]
    fn exit_frame_is_exact() {
        assert_eq!(parse_exit_frame(r#"{"type":"exit","code":7}"#), Ok(7));
        assert_eq!(parse_exit_frame(r#"{"code":-1,"type":"exit"}"#), Ok(-1));
        for bad in [
            r#"{"type":"exit"}"#,
            r#"{"type":"exit","code":7,"x":1}"#,
            r#"{"type":"exit","code":7,"code":8}"#,
            r#"{"type":"resize","code":7}"#,
            r#"{"type":"exit","code":7.5}"#,
            r#"{"type":"exit","code":"7"}"#,
            r#"{"type":"exit","code":4294967296}"#,
            "exit 7",
        ] {
            assert!(parse_exit_frame(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exit_frame_length_at_128_and_129() {
        // Pad with JSON whitespace to reach exactly N bytes.
        let base = r#"{"type":"exit","code":7}"#;
        let at = |n: usize| format!("{}{}", " ".repeat(n - base.len()), base);
        assert_eq!(parse_exit_frame(&at(128)), Ok(7));
        let e = parse_exit_frame(&at(129)).unwrap_err();
        assert_eq!(e.reason(), Reason::TextFrameTooLong);
    }

    #[test]
    fn sentinel_codes_are_uncertain() {
        for code in [0, 1, 7, 123, 125, 129, 131, 255] {
            assert_eq!(classify_exit(code), Ok(TerminalExit { code }));
        }
        for code in [124, 130, -1] {
            let e = classify_exit(code).unwrap_err();
            assert_eq!(
                (e.category(), e.exit_code()),
                (Category::Unknown, Some(code))
            );
            assert_eq!(e.evidence(), Evidence::Unknown);
        }
        for code in [256, -2, i32::MAX] {
            assert_eq!(
                classify_exit(code).unwrap_err().category(),
                Category::Protocol
            );
        }
    }
}
