//! Command execution (features C5): the [`Command`] and its bounds, the
//! buffered and streamed exec requests, buffered result decoding with the
//! output allowance, the background launch acknowledgement, and the SSE exec
//! stream decoder.
//!
//! ```
//! use smolbox_core::exec::{
//!     Command, ExecStreamCall, ExecStreamDecoder, ExecStreamEvent, OutputAllowance,
//! };
//! use smolbox_core::worker::{Profile, Version};
//!
//! let profile = Profile::known(Version::DEFAULT);
//! let cmd = Command::new(["echo", "hi"]);
//! let call = ExecStreamCall::new(&profile, "dev", cmd, OutputAllowance::DEFAULT).unwrap();
//! let req = call.request().unwrap();
//! assert_eq!(req.target, "/api/v1/machines/dev/exec/stream");
//!
//! let mut dec = ExecStreamDecoder::new(OutputAllowance::DEFAULT);
//! dec.handle_input(b"event: stdout\ndata: hi\ndata: \n\nevent: exit\ndata: {\"exitCode\":0}\n\n").unwrap();
//! assert_eq!(dec.poll_event().unwrap(), Some(ExecStreamEvent::Stdout("hi\n")));
//! assert_eq!(dec.poll_event().unwrap(), Some(ExecStreamEvent::Exit(0)));
//! assert_eq!(dec.poll_event().unwrap(), None);
//! assert_eq!(dec.finish().unwrap(), 0);
//! ```
//!
//! A request is built only through the gated calls ([`ExecCall`],
//! [`ExecStreamCall`]): they apply the version gates and carry the image
//! preflight ([`crate::worker::WorkerCall::image_check`]) the shells
//! perform before sending. The request builders themselves are not public:
//!
//! ```compile_fail
//! use smolbox_core::exec::{Command, exec_request};
//! let _ = exec_request("dev", &Command::new(["echo", "hi"]));
//! ```
//!
//! ```compile_fail
//! use smolbox_core::exec::{Command, exec_stream_request};
//! let _ = exec_stream_request("dev", &Command::new(["echo", "hi"]));
//! ```

mod buffered;
mod call;
mod command;
#[cfg(feature = "testkit")]
mod fuzz;
mod reader;
mod request;
mod stream;
#[cfg(test)]
mod tests;

pub use buffered::{
    DEFAULT_MAX_OUTPUT_BYTES, ExecOutcome, ExecOutput, ExecReplyDecoder, Launched,
    MAX_OUTPUT_BYTES, OutputAllowance, OutputEncoding, decode_b64, decode_exec_reply,
    decode_launch_reply, decode_reply_for, launch_from_output,
};
pub use call::{ExecCall, ExecStreamCall};
pub use command::{
    Command, DEFAULT_TIMEOUT_SECS, DEFAULT_WORKDIR, EXTENDED_TIMEOUT_SECS, MAX_ARG_LEN,
    MAX_ARGV_ENTRIES, MAX_ARGV_TOTAL_LEN, MAX_ENV_NAME_LEN, MAX_ENV_PAIRS, MAX_ENV_VALUE_LEN,
    MAX_STDIN_LEN, MAX_TIMEOUT_SECS, MAX_USER_LEN, MAX_WORKDIR_LEN, MIN_TIMEOUT_SECS,
    validate_abs_path,
};
#[cfg(feature = "testkit")]
pub use fuzz::fuzz_exec_stream;
pub use reader::ExecStreamReader;
pub use request::{EVENT_STREAM, JSON};
pub(crate) use request::{exec_request, exec_stream_request};
pub use stream::{
    ExecEvent, ExecStreamDecoder, ExecStreamEvent, MAX_STREAM_CHUNK_LEN, MAX_STREAM_FRAME_LEN,
};
