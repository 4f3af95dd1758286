//! The command to run (features C5.1) and its wire body (worker-api.md §6.1).

use crate::Reason;
use core::fmt;

use serde::Serialize;

use crate::error::{Error, Operation};

/// Most argv entries.
pub const MAX_ARGV_ENTRIES: usize = 256;
/// Largest argv entry, in bytes.
pub const MAX_ARG_LEN: usize = 16_384;
/// Largest sum of argv entry lengths, in bytes.
pub const MAX_ARGV_TOTAL_LEN: usize = 65_536;
/// Most environment pairs.
pub const MAX_ENV_PAIRS: usize = 64;
/// Largest environment variable name, in bytes.
pub const MAX_ENV_NAME_LEN: usize = 128;
/// Largest environment variable value, in bytes.
pub const MAX_ENV_VALUE_LEN: usize = 8_192;
/// Largest stdin, in bytes.
pub const MAX_STDIN_LEN: usize = 65_536;
/// Largest user, in bytes.
pub const MAX_USER_LEN: usize = 128;
/// Largest working directory path, in bytes (C6.2).
pub const MAX_WORKDIR_LEN: usize = 1_024;
/// The working directory when none is given.
pub const DEFAULT_WORKDIR: &str = "/workspace";
/// The timeout of a foreground command when none is given, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u32 = 30;
/// Smallest timeout, in seconds.
pub const MIN_TIMEOUT_SECS: u32 = 1;
/// Largest timeout, in seconds (24 h).
pub const MAX_TIMEOUT_SECS: u32 = 86_400;
/// Timeouts above this many seconds make a command extended (C5.4).
pub const EXTENDED_TIMEOUT_SECS: u32 = 300;

/// A command for the worker's exec routes (C5.1): argv (no shell is added),
/// environment, optional stdin and user, working directory, timeout, and the
/// background flag.
///
/// Setters do not check; [`Command::validate`] does, and the request builders
/// call it, so an invalid command never produces a request. `Debug` prints
/// only counts and flags: argv, env, stdin, user and workdir can be secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct Command {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Option<String>,
    user: Option<String>,
    workdir: Option<String>,
    timeout_secs: Option<u32>,
    background: bool,
}

impl Command {
    /// A foreground command with these arguments, no environment, the
    /// default working directory and timeout.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            stdin: None,
            user: None,
            workdir: None,
            timeout_secs: None,
            background: false,
        }
    }

    /// Adds an environment variable (names must be unique).
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Sets the text piped to stdin (foreground buffered exec only).
    #[must_use]
    pub fn stdin(mut self, stdin: impl Into<String>) -> Self {
        self.stdin = Some(stdin.into());
        self
    }

    /// Sets the user (`name` or `uid[:gid]`), passed through to the worker.
    #[must_use]
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Sets the working directory (absolute path, C6.2 syntax).
    #[must_use]
    pub fn workdir(mut self, workdir: impl Into<String>) -> Self {
        self.workdir = Some(workdir.into());
        self
    }

    /// Sets the timeout in seconds (1–86,400; not allowed with background).
    #[must_use]
    pub fn timeout_secs(mut self, secs: u32) -> Self {
        self.timeout_secs = Some(secs);
        self
    }

    /// Runs the command detached; the reply is a launch acknowledgement.
    #[must_use]
    pub fn background(mut self, background: bool) -> Self {
        self.background = background;
        self
    }

    /// The arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The environment, in the order given.
    pub fn env_pairs(&self) -> &[(String, String)] {
        &self.env
    }

    /// The stdin text, if any.
    pub fn stdin_text(&self) -> Option<&str> {
        self.stdin.as_deref()
    }

    /// The user, if any.
    pub fn user_name(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The working directory (the default when none was set).
    pub fn working_dir(&self) -> &str {
        self.workdir.as_deref().unwrap_or(DEFAULT_WORKDIR)
    }

    /// True when the command runs detached.
    pub fn is_background(&self) -> bool {
        self.background
    }

    /// Checks that the command may be launched (sent as a background
    /// launch, before anything is sent).
    ///
    /// # Errors
    /// `validation` (`launch_requires_background`) for a foreground
    /// command.
    pub fn check_launch(&self) -> Result<(), Error> {
        if self.background {
            Ok(())
        } else {
            Err(Error::validation(
                Operation::Launch,
                Reason::LaunchRequiresBackground,
            ))
        }
    }

    /// The timeout sent to the worker: `None` for background commands,
    /// otherwise the one set or [`DEFAULT_TIMEOUT_SECS`].
    pub fn effective_timeout_secs(&self) -> Option<u32> {
        if self.background {
            None
        } else {
            Some(self.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS))
        }
    }

    /// True for an extended command (C5.4): timeout over 300 s, background,
    /// or a working directory outside `/workspace`. Extended commands need
    /// the 1.17.0+ preflight and an image machine.
    pub fn is_extended(&self) -> bool {
        self.background
            || self
                .effective_timeout_secs()
                .is_some_and(|t| t > EXTENDED_TIMEOUT_SECS)
            || !is_within(self.working_dir(), DEFAULT_WORKDIR)
    }

    /// Checks every bound of C5.1.
    ///
    /// # Errors
    /// `validation` / `command_spec` / `not_dispatched`, with a fixed reason
    /// and, for size bounds, the observed and allowed amounts.
    pub fn validate(&self) -> Result<(), Error> {
        self.validate_argv()?;
        self.validate_env()?;
        if let Some(stdin) = &self.stdin {
            check_len(stdin.len(), MAX_STDIN_LEN, Reason::StdinTooLong)?;
        }
        if let Some(user) = &self.user {
            if user.is_empty() {
                return Err(Error::validation(Operation::CommandSpec, Reason::UserEmpty));
            }
            check_len(user.len(), MAX_USER_LEN, Reason::UserTooLong)?;
        }
        if let Some(workdir) = &self.workdir {
            validate_abs_path(workdir)?;
        }
        if let Some(t) = self.timeout_secs
            && !(MIN_TIMEOUT_SECS..=MAX_TIMEOUT_SECS).contains(&t)
        {
            return Err(
                Error::validation(Operation::CommandSpec, Reason::TimeoutOutOfRange)
                    .with_limit(u64::from(t), u64::from(MAX_TIMEOUT_SECS)),
            );
        }
        if self.background {
            if self.timeout_secs.is_some() {
                return Err(Error::validation(
                    Operation::CommandSpec,
                    Reason::BackgroundWithTimeout,
                ));
            }
            if self.stdin.is_some() {
                return Err(Error::validation(
                    Operation::CommandSpec,
                    Reason::BackgroundWithStdin,
                ));
            }
        }
        Ok(())
    }

    /// The JSON body of `POST …/exec` and `…/exec/stream` (worker-api.md
    /// §6.1, field order of TV15): `command, env, workdir, [timeoutSecs],
    /// [stdin], [user], background, secrets:{}`.
    ///
    /// # Errors
    /// As [`Self::validate`].
    pub fn wire_body(&self) -> Result<Vec<u8>, Error> {
        self.validate()?;
        let body = WireBody {
            command: &self.argv,
            env: self
                .env
                .iter()
                .map(|(name, value)| WireEnv { name, value })
                .collect(),
            workdir: self.working_dir(),
            timeout_secs: self.effective_timeout_secs(),
            stdin: self.stdin.as_deref(),
            user: self.user.as_deref(),
            background: self.background,
            secrets: WireSecrets {},
        };
        // Serializing strings and integers into a Vec cannot fail.
        serde_json::to_vec(&body)
            .map_err(|_| Error::validation(Operation::CommandSpec, Reason::WireBody))
    }

    fn validate_argv(&self) -> Result<(), Error> {
        if self.argv.is_empty() {
            return Err(Error::validation(Operation::CommandSpec, Reason::ArgvEmpty));
        }
        check_len(self.argv.len(), MAX_ARGV_ENTRIES, Reason::ArgvTooMany)?;
        if self.argv[0].is_empty() {
            return Err(Error::validation(
                Operation::CommandSpec,
                Reason::ArgvFirstEmpty,
            ));
        }
        let mut total = 0usize;
        for arg in &self.argv {
            check_len(arg.len(), MAX_ARG_LEN, Reason::ArgvEntryTooLong)?;
            if arg.as_bytes().contains(&0) {
                return Err(Error::validation(Operation::CommandSpec, Reason::ArgvNul));
            }
            total += arg.len();
        }
        check_len(total, MAX_ARGV_TOTAL_LEN, Reason::ArgvTotalTooLong)
    }

    fn validate_env(&self) -> Result<(), Error> {
        check_len(self.env.len(), MAX_ENV_PAIRS, Reason::EnvTooMany)?;
        let mut names = std::collections::BTreeSet::new();
        for (name, value) in &self.env {
            check_len(name.len(), MAX_ENV_NAME_LEN, Reason::EnvNameTooLong)?;
            if !is_env_name(name) {
                return Err(Error::validation(
                    Operation::CommandSpec,
                    Reason::EnvNameInvalid,
                ));
            }
            if !names.insert(name.as_str()) {
                return Err(Error::validation(
                    Operation::CommandSpec,
                    Reason::EnvNameDuplicate,
                ));
            }
            check_len(value.len(), MAX_ENV_VALUE_LEN, Reason::EnvValueTooLong)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Command")
            .field("argv_len", &self.argv.len())
            .field("env_len", &self.env.len())
            .field("has_stdin", &self.stdin.is_some())
            .field("has_user", &self.user.is_some())
            .field("default_workdir", &self.workdir.is_none())
            .field("timeout_secs", &self.effective_timeout_secs())
            .field("background", &self.background)
            .finish()
    }
}

/// Checks the absolute-path syntax of C6.2: absolute, ≤ 1,024 bytes, no NUL,
/// `%` or `\`, and no empty, `.` or `..` segment (so no repeated or trailing
/// `/`), except the root `/` itself.
///
/// # Errors
/// `validation` / `command_spec` / `not_dispatched`.
pub fn validate_abs_path(path: &str) -> Result<(), Error> {
    check_len(path.len(), MAX_WORKDIR_LEN, Reason::WorkdirTooLong)?;
    let Some(rest) = path.strip_prefix('/') else {
        return Err(Error::validation(
            Operation::CommandSpec,
            Reason::WorkdirNotAbsolute,
        ));
    };
    if path.bytes().any(|b| matches!(b, 0 | b'%' | b'\\')) {
        return Err(Error::validation(
            Operation::CommandSpec,
            Reason::WorkdirForbiddenByte,
        ));
    }
    if rest.is_empty() {
        return Ok(());
    }
    if rest.split('/').any(|seg| matches!(seg, "" | "." | "..")) {
        return Err(Error::validation(
            Operation::CommandSpec,
            Reason::WorkdirBadSegment,
        ));
    }
    Ok(())
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`
fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whole-segment containment: `/app` covers `/app` and `/app/x`, not `/application`.
fn is_within(path: &str, root: &str) -> bool {
    path.strip_prefix(root)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn check_len(actual: usize, max: usize, reason: Reason) -> Result<(), Error> {
    if actual > max {
        let to64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        return Err(
            Error::validation(Operation::CommandSpec, reason).with_limit(to64(actual), to64(max))
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct WireBody<'a> {
    command: &'a [String],
    env: Vec<WireEnv<'a>>,
    workdir: &'a str,
    #[serde(rename = "timeoutSecs", skip_serializing_if = "Option::is_none")]
    timeout_secs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stdin: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    background: bool,
    secrets: WireSecrets,
}

#[derive(Serialize)]
struct WireEnv<'a> {
    name: &'a str,
    value: &'a str,
}

#[derive(Serialize)]
struct WireSecrets {}
