//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::backend::ShellKind;

const ABOUT: &str = "Drive a smolvm worker: machines, commands, files, logs and terminals.

With neither --worker nor SMOLBOX_WORKER, smolbox uses the local devworker
that `smolbox dev up` started, else starts one in-process for the command;
either runs commands on this host WITHOUT isolation.";

/// The escape help, in `shell --help` and after `Ctrl-] ?`.
pub(crate) const ESCAPE_HELP: &str = "Local escapes (typed on this side, never sent): \
Ctrl-] then `.` closes the session from here (the guest's exit is then \
not confirmed: exit code 3, and a managed machine's slot stays held until \
`smolbox resolve`); Ctrl-] then Ctrl-] sends one Ctrl-]; Ctrl-] then `?` \
shows this; Ctrl-] then any other key sends both. There is no detach: a \
managed terminal is never reopened.";

/// `smolbox`: drive a smolvm worker from a shell.
#[derive(Parser, Debug)]
#[command(name = "smolbox", version, about = ABOUT, after_help = crate::report::EXIT_TABLE)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

/// Worker selection and output options.
#[derive(Args, Debug)]
pub(crate) struct Global {
    /// Worker: `http://127.0.0.1:PORT` (loopback only), `https://HOST:PORT`
    /// (needs --ca or --system-roots, and a token), or `unix:PATH`.
    #[arg(long, global = true, env = "SMOLBOX_WORKER")]
    pub(crate) worker: Option<String>,
    /// Bearer token for the worker (never printed).
    #[arg(long, global = true, env = "SMOLBOX_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// OCI image reference the machines smolbox creates (raw and managed)
    /// are made from (1.19.0+ workers). Terminals, commands over 300 s, in
    /// the background or outside /workspace, and files over 1 MiB or
    /// outside /workspace need an image machine. Default: `alpine:3.19` on
    /// the local devworker (which pulls nothing); none (imageless machines)
    /// on a named worker.
    #[arg(long, global = true, env = "SMOLBOX_IMAGE")]
    pub(crate) image: Option<String>,
    /// CA certificate file (PEM) for an https worker.
    #[arg(long, global = true)]
    pub(crate) ca: Option<PathBuf>,
    /// Also trust the system's root certificates for an https worker
    /// (beside --ca; verification stays on).
    #[arg(long, global = true)]
    pub(crate) system_roots: bool,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, global = true, requires = "key")]
    pub(crate) cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS.
    #[arg(long, global = true, requires = "cert")]
    pub(crate) key: Option<PathBuf>,
    /// Which client shell drives the worker.
    #[arg(long, global = true, value_enum, default_value = "tokio")]
    pub(crate) shell: ShellKind,
    /// Print results as JSON (one object, or one per line for streams and
    /// logs); a failure is then one JSON object on stderr.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// The store of the execution records: a SQLite file (default:
    /// `$XDG_DATA_HOME/smolbox/smolbox.db` or `~/.local/share/smolbox/smolbox.db`),
    /// or `postgres://…` for a PostgreSQL database shared by many
    /// controllers (its keys: `$SMOLBOX_STORE_KEYS`, else `postgres.*` in
    /// the data directory; every controller of the store needs the same;
    /// its partition: `$SMOLBOX_STORE_PARTITION`, else `cli`; TLS with the
    /// CA bundle at `$SMOLBOX_STORE_CA`; a server on another host without
    /// TLS only with `$SMOLBOX_STORE_PLAINTEXT_REMOTE=1`).
    #[arg(
        long,
        global = true,
        env = "SMOLBOX_STORE",
        value_name = "PATH|URL",
        hide_env_values = true
    )]
    pub(crate) store: Option<PathBuf>,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// The worker's health and version.
    Health,
    /// Machine lifecycle: managed retained machines, each a record in the
    /// store (`--store`) driven through the managed runtime — created on
    /// the worker under a name of the controller's own, started, stopped
    /// and removed by versioned requests (each waits until the machine
    /// settles, at most 15 min; the version is re-read and tried again on
    /// `stale_version`, at most 20 times), one command at a time in its
    /// slot (`exec ID`, `shell ID`). Create, start, stop and rm need a
    /// worker that outlives the command (`smolbox dev up`, or --worker;
    /// else exit 2). With --raw, the worker's machines directly.
    Machine(MachineArgs),
    /// Stop a managed machine for draining: the worker is asked to stop
    /// the recorded incarnation (ownership verified) and the stop is
    /// recorded; a command in its slot keeps the slot. Uses the record's
    /// current version (re-read and tried again on `stale_version`, at
    /// most 20 times).
    StopForDrain {
        /// Managed machine id (as given to `machine create`).
        machine: String,
    },
    /// Resolve a managed machine whose command's outcome is unknown, once
    /// you know it is quiescent: --stopped (the worker shows the recorded
    /// incarnation stopped) or --deleted (the worker answers 404 for it).
    /// The slot is released; the command stays `unknown`. Without
    /// --quiesced it is refused (exit 2). Uses the record's current
    /// version (re-read and tried again on `stale_version`, at most 20
    /// times).
    #[command(group(clap::ArgGroup::new("disposition").required(true).args(["stopped", "deleted"])))]
    Resolve {
        /// Managed machine id.
        machine: String,
        /// You assert that nothing runs in the machine any more.
        #[arg(long)]
        quiesced: bool,
        /// The machine is stopped.
        #[arg(long)]
        stopped: bool,
        /// The machine is gone from the worker.
        #[arg(long)]
        deleted: bool,
    },
    /// Run a command in a machine (buffered unless --stream); exits with
    /// the command's exit code.
    Exec(ExecArgs),
    /// An interactive terminal in a machine (raw mode, window size and
    /// Ctrl-C to the guest). On a managed machine it is a managed terminal
    /// in the machine's slot (its execution id on stderr; `records show
    /// ID`); exits with the guest's code when its exit is confirmed, else 3
    /// (the execution id on stderr).
    #[command(after_help = ESCAPE_HELP)]
    Shell(ShellArgs),
    /// Copy a file: `LOCAL MACHINE:/path` uploads, `MACHINE:/path LOCAL`
    /// downloads. The SHA-256 is computed and printed (and checked with
    /// --sha256).
    Cp(CpArgs),
    /// A machine's console log.
    Logs(LogsArgs),
    /// Create a fresh machine, run the command in it, print its output,
    /// remove the machine; exits with the command's exit code.
    Run(RunArgs),
    /// Execution records in the store (state, evidence, exit code, times,
    /// worker, machine, last error; never argv, env or stdin).
    #[command(subcommand)]
    Records(RecordsCmd),
    /// Wait for a recorded execution to end, driving it if it is still due
    /// (a detached run is sent by the first `wait` or `recover`); exits
    /// with the guest's code, 3 when its outcome is unknown, 8 when it
    /// ended without running (cancelled, expired, failed).
    Wait {
        /// Execution id.
        id: String,
        /// Longest wait in milliseconds (0–900000); without it, until the
        /// end. A command this process already sent is still followed to
        /// its end (leaving would make its outcome unknown).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=900_000))]
        timeout: Option<u64>,
    },
    /// Cancel a recorded execution: before dispatch it becomes `cancelled`
    /// (nothing is sent); once sent, its observation ends (`unknown`)
    /// unless an exit is seen first.
    Cancel {
        /// Execution id.
        id: String,
    },
    /// Run the recovery scan once over the store for the selected worker
    /// and print what it moved.
    Recover,
    /// The local devworker in the background for this user (commands run
    /// on this host WITHOUT isolation).
    #[command(subcommand)]
    Dev(DevCmd),
    /// Print a shell completion script: `smolbox completions bash >
    /// ~/.local/share/bash-completion/completions/smolbox` (zsh: a `_smolbox`
    /// file on `$fpath`; fish: `~/.config/fish/completions/smolbox.fish`).
    Completions {
        /// The shell: bash, zsh or fish.
        #[arg(value_enum, value_name = "SHELL")]
        target: CompletionShell,
    },
    /// Print the man page (roff): `smolbox man > smolbox.1; man ./smolbox.1`.
    Man,
}

/// Shells `completions` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CompletionShell {
    /// Bash.
    Bash,
    /// Zsh.
    Zsh,
    /// Fish.
    Fish,
}

/// `dev …`.
#[derive(Subcommand, Debug)]
pub(crate) enum DevCmd {
    /// Start the devworker in the background (Unix socket in a 0700
    /// directory under the data directory, random token in a 0600 file);
    /// later commands without --worker use it.
    Up,
    /// Say whether it runs (a stale pid file is reported as such).
    Status,
    /// Stop it (SIGTERM, then SIGKILL after 10 s), wait, clean up.
    Down,
    /// The background devworker itself (started by `dev up`).
    #[command(hide = true)]
    Serve {
        /// Its directory.
        #[arg(long)]
        dir: PathBuf,
    },
}

/// `records …`.
#[derive(Subcommand, Debug)]
pub(crate) enum RecordsCmd {
    /// List execution records (oldest id first).
    Ls {
        /// Only records in this state.
        #[arg(long, value_name = "STATE", value_parser = [
            "accepted", "preparing", "ready", "dispatching", "running", "collecting",
            "completed", "launched", "collection_failed", "failed", "cancelled",
            "expired", "unknown", "cancelling",
        ])]
        state: Option<String>,
        /// Only records of this machine (a worker's machine name, or a
        /// managed machine's id for the commands and terminals in its slot).
        #[arg(long, value_name = "MACHINE")]
        machine: Option<String>,
    },
    /// Show one execution record.
    Show {
        /// Execution id.
        id: String,
    },
}

/// `machine [--raw] …`.
#[derive(Args, Debug)]
pub(crate) struct MachineArgs {
    /// The worker's machines directly, under the worker's own names: no
    /// record, no ownership, no slot (`ls` lists every machine of the
    /// worker, managed ones under their `smb-…` names). Without it,
    /// machines are managed.
    #[arg(long, global = true)]
    pub(crate) raw: bool,
    /// The action.
    #[command(subcommand)]
    pub(crate) cmd: MachineCmd,
}

/// `machine …`.
#[derive(Subcommand, Debug)]
pub(crate) enum MachineCmd {
    /// Create a machine. Managed: the worker profile's size (--cpus and
    /// --memory are refused), started unless --no-start, waited for until
    /// it settles; with --raw, an imageless worker machine (1 CPU, 256 MiB
    /// by default), as the worker creates it.
    Create {
        /// Machine id (lowercase letters, digits, `-`, `_`); with --raw,
        /// the worker's machine name.
        name: String,
        /// CPUs (1–64; default 1; --raw only).
        #[arg(long)]
        cpus: Option<u8>,
        /// Memory in MiB (128–16384; default 256; --raw only).
        #[arg(long)]
        memory: Option<u32>,
        /// Managed only: leave it created, not started (`machine start`
        /// later).
        #[arg(long)]
        no_start: bool,
    },
    /// List machines (managed: the store's records, no worker needed).
    Ls,
    /// Show one machine (managed: its record, no worker needed).
    Get {
        /// Machine id.
        name: String,
    },
    /// Start a machine.
    Start {
        /// Machine id.
        name: String,
    },
    /// Stop a machine (managed: refused while a command holds its slot).
    Stop {
        /// Machine id.
        name: String,
    },
    /// Remove a machine (managed: refused while a command holds its slot).
    Rm {
        /// Machine id.
        name: String,
    },
}

/// Options of a command run in a guest.
#[derive(Args, Debug, Clone)]
pub(crate) struct CommandOpts {
    /// Stream output as it is produced (SSE) instead of buffering it.
    #[arg(long)]
    pub(crate) stream: bool,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub(crate) env: Vec<String>,
    /// Working directory in the guest (default /workspace).
    #[arg(long)]
    pub(crate) workdir: Option<String>,
    /// Command timeout in seconds (1–86400; default 30).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..=86_400))]
    pub(crate) timeout: Option<u32>,
    /// Feed this file as the command's stdin (`-` reads smolbox's stdin;
    /// UTF-8 text, at most 64 KiB; not with --stream).
    #[arg(long, value_name = "FILE")]
    pub(crate) stdin: Option<PathBuf>,
}

/// `exec`.
#[derive(Args, Debug)]
pub(crate) struct ExecArgs {
    /// Machine name.
    pub(crate) machine: String,
    #[command(flatten)]
    pub(crate) opts: CommandOpts,
    /// A local file copied into a managed machine before the command
    /// runs: `LOCAL:GUEST_PATH`, with the limits and checks of `run
    /// --input` (read and hashed before anything is sent, kept in the
    /// artifact directory, uploaded, read back and checked inside the
    /// machine's slot before the command is sent). Only into a managed
    /// machine (`machine create`).
    #[arg(long = "input", value_name = "LOCAL:GUEST_PATH")]
    pub(crate) inputs: Vec<String>,
    /// A guest file collected from a managed machine after the command
    /// exits: `GUEST_PATH[:LOCAL]`, as `run --output` (checked against its
    /// recorded SHA-256, written through a temporary file and a rename).
    /// A failed collection keeps the exit code and keeps the machine's
    /// slot (the machine becomes `unknown`; `resolve` frees it).
    #[arg(long = "output", value_name = "GUEST_PATH[:LOCAL]")]
    pub(crate) outputs: Vec<String>,
    /// Largest size of each --output, bytes, as `run --output-max`.
    #[arg(long, value_name = "BYTES", requires = "outputs")]
    pub(crate) output_max: Option<u64>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "ARGV")]
    pub(crate) argv: Vec<String>,
}

/// `run`.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) opts: CommandOpts,
    /// Keep the machine afterwards (its name is printed on stderr).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Execution id (the idempotency key; letters, digits, `.`, `_`, `-`):
    /// running the same command again under the same id prints the
    /// recorded outcome and does not run it again; a different command
    /// under it is refused (`identity_conflict`). Default: a fresh id.
    /// Every run is recorded, `--stream` ones included (never its output).
    #[arg(long, value_name = "ID")]
    pub(crate) id: Option<String>,
    /// Return once the execution is durably accepted and print its id;
    /// `smolbox wait ID` runs it on a disposable machine the runtime
    /// creates, and deletes that machine once the record settles. Needs a
    /// persistent worker (--worker or `smolbox dev up`).
    #[arg(long, conflicts_with_all = ["stream", "keep"])]
    pub(crate) detach: bool,
    /// A local file copied into the guest before the command runs:
    /// `LOCAL:GUEST_PATH` (split at the last `:`; the guest path absolute,
    /// under /workspace). Repeatable: at most 32, each at most 1 MiB, all
    /// together at most 4 MiB. Every file is read and its SHA-256 taken
    /// before anything is sent (a missing or oversized file is refused
    /// then), kept in the artifact directory beside the store, uploaded,
    /// read back and checked before the command is sent. A run with files
    /// goes on a disposable machine the runtime creates and deletes.
    #[arg(
        long = "input",
        value_name = "LOCAL:GUEST_PATH",
        conflicts_with = "keep"
    )]
    pub(crate) inputs: Vec<String>,
    /// A guest file collected after the command exits: `GUEST_PATH[:LOCAL]`
    /// (split at the first `:`; LOCAL defaults to the guest file's name in
    /// the current directory, or inside LOCAL when it is a directory; an
    /// existing LOCAL is replaced). Repeatable, at most 32. Collected into
    /// the artifact directory with its SHA-256, then written to LOCAL only
    /// after that digest is checked again, through a temporary file and a
    /// rename. With --detach, outputs stay in the artifact directory
    /// (`records show ID`) and a LOCAL is refused.
    #[arg(
        long = "output",
        value_name = "GUEST_PATH[:LOCAL]",
        conflicts_with = "keep"
    )]
    pub(crate) outputs: Vec<String>,
    /// Largest size of each --output, bytes (1–1048576; default 1 MiB,
    /// or an equal share of 4 MiB with more than 4 outputs; all outputs'
    /// maxima together at most 4 MiB). A larger guest file fails the
    /// collection (the exit code is kept and reported).
    #[arg(long, value_name = "BYTES", requires = "outputs")]
    pub(crate) output_max: Option<u64>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "ARGV")]
    pub(crate) argv: Vec<String>,
}

/// `shell`.
#[derive(Args, Debug)]
pub(crate) struct ShellArgs {
    /// Machine name.
    pub(crate) machine: String,
    /// Program to run under the PTY.
    #[arg(long, default_value = "/bin/sh")]
    pub(crate) program: String,
}

/// `cp`.
#[derive(Args, Debug)]
pub(crate) struct CpArgs {
    /// Source: a local path or `MACHINE:/path`.
    pub(crate) src: String,
    /// Destination: `MACHINE:/path` or a local path.
    pub(crate) dst: String,
    /// Expected SHA-256 (hex) of the file; a mismatch fails the copy and,
    /// for a download, nothing is written.
    #[arg(long, value_name = "HEX")]
    pub(crate) sha256: Option<String>,
    /// Largest file accepted, bytes (≤ 16 MiB).
    #[arg(long, default_value_t = 16_777_216)]
    pub(crate) max_bytes: u64,
}

/// `logs`.
#[derive(Args, Debug)]
pub(crate) struct LogsArgs {
    /// Machine name.
    pub(crate) machine: String,
    /// Keep printing new lines until interrupted.
    #[arg(short, long)]
    pub(crate) follow: bool,
    /// History lines (0–10000).
    #[arg(long, default_value_t = 100)]
    pub(crate) tail: u32,
}
