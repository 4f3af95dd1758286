//! Startup workloads in the machine spec (features C8.1).

use crate::Reason;
use crate::error::{Error, Operation};

/// Most entrypoint + cmd arguments together.
pub const MAX_WORKLOAD_ARGS: usize = 255;
/// Longest argument in bytes (C5.1).
pub const MAX_ARG_LEN: usize = 16_384;
/// Largest total argument bytes (C5.1).
pub const MAX_ARGS_TOTAL: usize = 65_536;
/// Most env pairs (C5.1).
pub const MAX_ENV: usize = 64;
/// Longest env name in bytes (C5.1).
pub const MAX_ENV_NAME_LEN: usize = 128;
/// Longest env value in bytes (C5.1).
pub const MAX_ENV_VALUE_LEN: usize = 8_192;
/// Longest workload workdir in bytes.
pub const MAX_WORKDIR_LEN: usize = 4_096;

/// The workload restart policy. Only `Never` is supported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RestartPolicy {
    /// Never restart (the only supported policy).
    #[default]
    Never,
    /// `always` (refused: `unsupported_capability`).
    Always,
    /// `on-failure` (refused).
    OnFailure,
    /// `unless-stopped` (refused).
    UnlessStopped,
}

/// A workload launched at start on an image machine. Both lists empty =
/// inherit the image's; otherwise both replace the image's. Env is kept
/// sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Workload {
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<(String, String)>,
    workdir: Option<String>,
}

impl Workload {
    /// Validates a workload (C8.1 with the argument and env rules of C5.1).
    ///
    /// # Errors
    /// `validation` (operation `machine_spec`) for a broken bound;
    /// `unsupported_capability` for a restart policy other than `never`.
    pub fn new(
        entrypoint: Vec<String>,
        cmd: Vec<String>,
        mut env: Vec<(String, String)>,
        workdir: Option<String>,
        restart: RestartPolicy,
    ) -> Result<Self, Error> {
        let op = Operation::MachineSpec;
        if restart != RestartPolicy::Never {
            return Err(Error::unsupported_capability(
                op,
                Reason::RestartPolicyUnsupported,
            ));
        }
        let n = entrypoint.len() + cmd.len();
        if n > MAX_WORKLOAD_ARGS {
            return Err(Error::validation(op, Reason::TooManyWorkloadArgs)
                .with_limit(n as u64, MAX_WORKLOAD_ARGS as u64));
        }
        let mut total = 0usize;
        for a in entrypoint.iter().chain(&cmd) {
            if a.len() > MAX_ARG_LEN || a.contains('\0') {
                return Err(Error::validation(op, Reason::InvalidWorkloadArg));
            }
            total += a.len();
        }
        if total > MAX_ARGS_TOTAL {
            return Err(Error::validation(op, Reason::WorkloadArgsTooLong)
                .with_limit(total as u64, MAX_ARGS_TOTAL as u64));
        }
        if env.len() > MAX_ENV {
            return Err(Error::validation(op, Reason::TooManyEnv)
                .with_limit(env.len() as u64, MAX_ENV as u64));
        }
        for (name, value) in &env {
            if !is_env_name(name) {
                return Err(Error::validation(op, Reason::InvalidEnvName));
            }
            if value.len() > MAX_ENV_VALUE_LEN {
                return Err(Error::validation(op, Reason::EnvValueTooLong)
                    .with_limit(value.len() as u64, MAX_ENV_VALUE_LEN as u64));
            }
        }
        env.sort();
        if env.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(Error::validation(op, Reason::DuplicateEnvName));
        }
        if let Some(w) = &workdir
            && (!w.starts_with('/') || w.len() > MAX_WORKDIR_LEN || w.contains('\0'))
        {
            return Err(Error::validation(op, Reason::InvalidWorkloadWorkdir));
        }
        Ok(Self {
            entrypoint,
            cmd,
            env,
            workdir,
        })
    }

    /// The entrypoint.
    pub fn entrypoint(&self) -> &[String] {
        &self.entrypoint
    }

    /// The cmd.
    pub fn cmd(&self) -> &[String] {
        &self.cmd
    }

    /// The env pairs, sorted by name.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The working directory, when set.
    pub fn workdir(&self) -> Option<&str> {
        self.workdir.as_deref()
    }
}

/// True for `^[A-Za-z_][A-Za-z0-9_]*$` of at most 128 bytes.
pub fn is_env_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ENV_NAME_LEN
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}
