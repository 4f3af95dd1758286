//! What a stored command spec names and how it maps to and from a
//! [`Command`]: the run target (artifact and profile), the spec of a
//! command on a caller-named machine, and the command a stored spec
//! dispatches.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::exec::Command;
use crate::managed::spec::{
    Action, ArtifactKind, ArtifactRef, CommandSpec, DEFAULT_QUEUE_BUDGET_MS, DEFAULT_RETENTION_MS,
    ExecutionSpec, ProfileBudgets, ProfileRef, WorkerMachine,
};
use crate::{Error, Operation, Reason};

/// The artifact and profile a spec names (C12.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunTarget {
    /// The artifact the machine was booted from.
    pub artifact: ArtifactRef,
    /// The profile revision and its budgets.
    pub profile: ProfileRef,
}

impl RunTarget {
    /// A target for a machine this runtime did not create and whose artifact
    /// it did not verify (the `smolbox run` case): artifact id `unverified`,
    /// an all-zero digest, this host's architecture, the default budgets.
    pub fn unverified() -> Self {
        let arch = if cfg!(target_arch = "aarch64") {
            "aarch64"
        } else {
            "x86_64"
        };
        Self {
            artifact: ArtifactRef {
                kind: ArtifactKind::Image,
                id: "unverified".to_owned(),
                sha256: "0".repeat(64),
                architecture: arch.to_owned(),
            },
            profile: ProfileRef {
                id: "default".to_owned(),
                budgets: ProfileBudgets::DEFAULT,
                per_file_max: crate::managed::spec::MAX_BASE_PER_FILE,
            },
        }
    }

    /// The same target with an execution budget that fits `command`'s
    /// timeout (timeout × 1,000 ≤ budget, C12.4): the larger of the current
    /// budget and the timeout plus 5 s, at most 86,460,000 ms.
    #[must_use]
    pub fn fitting(mut self, command: &Command) -> Self {
        if let Some(t) = command.effective_timeout_secs() {
            let need = u64::from(t) * 1_000 + 5_000;
            let b = &mut self.profile.budgets;
            b.execution_ms = b.execution_ms.max(need).min(86_460_000);
        }
        self
    }
}

/// The stored spec of `command` on the caller's machine `machine` of
/// worker `worker_id` (argv, env, workdir, stdin, timeout and user; the
/// store seals them).
///
/// # Errors
/// `validation` when the spec breaks a stored-shape rule.
pub fn spec_for(
    command: &Command,
    target: &RunTarget,
    worker_id: &str,
    machine: &str,
) -> Result<ExecutionSpec, Error> {
    let env = command.env_pairs().iter().cloned().collect();
    let spec = ExecutionSpec {
        artifact: target.artifact.clone(),
        profile: target.profile.clone(),
        action: Action::Command(CommandSpec {
            argv: command.argv().to_vec(),
            env,
            workdir: Some(command.working_dir().to_owned()),
            stdin_b64: command
                .stdin_text()
                .map(|s| base64::engine::general_purpose::STANDARD.encode(s)),
            timeout_s: command.effective_timeout_secs().map(u64::from),
            background: command.is_background(),
            user: command.user_name().map(str::to_owned),
        }),
        machine: None,
        worker_machine: Some(WorkerMachine {
            worker_id: worker_id.to_owned(),
            name: machine.to_owned(),
        }),
        inputs: Vec::new(),
        outputs: Vec::new(),
        queue_budget_ms: DEFAULT_QUEUE_BUDGET_MS,
        retention_ms: DEFAULT_RETENTION_MS,
        metadata: BTreeMap::new(),
        network: None,
        guest_paths: None,
    };
    spec.validate()?;
    Ok(spec)
}

/// The [`Command`] a stored spec describes (the inverse of [`spec_for`]):
/// what a resumed record dispatches, never the caller's memory.
///
/// # Errors
/// `validation` (operation `command_spec`) when the spec is not a command,
/// its stdin is not base64 UTF-8, or its timeout is out of range.
pub fn command_of(spec: &ExecutionSpec) -> Result<Command, Error> {
    let Action::Command(c) = &spec.action else {
        return Err(Error::validation(
            Operation::CommandSpec,
            Reason::NotACommand,
        ));
    };
    let mut cmd = Command::new(c.argv.iter().cloned());
    for (k, v) in &c.env {
        cmd = cmd.env(k.clone(), v.clone());
    }
    if let Some(w) = &c.workdir {
        cmd = cmd.workdir(w.clone());
    }
    if let Some(s) = &c.stdin_b64 {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|_| Error::validation(Operation::CommandSpec, Reason::StdinEncoding))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::validation(Operation::CommandSpec, Reason::StdinEncoding))?;
        cmd = cmd.stdin(text);
    }
    if let Some(t) = c.timeout_s {
        let t = u32::try_from(t)
            .map_err(|_| Error::validation(Operation::CommandSpec, Reason::TimeoutRange))?;
        cmd = cmd.timeout_secs(t);
    }
    if let Some(u) = &c.user {
        cmd = cmd.user(u.clone());
    }
    Ok(cmd.background(c.background))
}
