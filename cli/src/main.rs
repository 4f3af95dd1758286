//! The `smolbox` command: machines, commands, files, logs and interactive
//! terminals on a smolvm worker (or the in-process devworker), on either
//! client shell (`--shell tokio|blocking`).
//!
//! Results go to stdout, diagnostics to stderr. Every failure prints its
//! category, operation, evidence and reason and maps to an exit code (the
//! table is in `smolbox --help` and in [`report::EXIT_TABLE`]); `exec`,
//! `run` and `shell` exit with the guest command's code.

mod args;
mod backend;
mod backend_tokio_term;
mod commands;
mod dev;
mod files;
mod records;
mod report;
mod shell;
mod term;
mod worker;

use clap::Parser;

use crate::args::{Cli, Cmd, DevCmd};
use crate::backend::Backend;
use crate::report::Failure;

fn main() {
    let cli = Cli::parse();
    let json = cli.global.json;
    let code = match run(cli) {
        Ok(code) => code,
        Err(failure) => {
            if json {
                failure.print_json();
            } else {
                failure.print();
            }
            failure.exit_code()
        }
    };
    std::process::exit(code);
}

/// Runs the command; `Ok` is the exit code to leave with.
fn run(cli: Cli) -> Result<i32, Failure> {
    let json = cli.global.json;
    if let Cmd::Dev(d) = &cli.command {
        return match d {
            DevCmd::Up => dev::up(json),
            DevCmd::Status => dev::status(json),
            DevCmd::Down => dev::down(json),
            DevCmd::Serve { dir } => dev::serve(dir),
        };
    }
    let command_secs = match &cli.command {
        Cmd::Exec(a) => a.opts.timeout,
        Cmd::Run(a) => a.opts.timeout,
        _ => None,
    };
    let selected = worker::select(&cli.global, worker::budgets(command_secs))?;
    let backend = Backend::new(cli.global.shell, selected.endpoint)?;
    let code = match cli.command {
        Cmd::Health => commands::health(&backend, json),
        Cmd::Machine(m) => commands::machine(&backend, m, json),
        Cmd::Exec(a) => commands::exec(&backend, &a.machine, &a.opts, a.argv, json),
        Cmd::Run(a) => commands::run(&backend, &a, json),
        Cmd::Shell(a) => shell::shell(&backend, &a),
        Cmd::Cp(a) => files::cp(&backend, &a, json),
        Cmd::Logs(a) => commands::logs(&backend, &a, json),
        Cmd::Dev(_) => Ok(0), // answered above
    };
    // The client (and its runtime) goes before the devworker it talks to.
    drop(backend);
    drop(selected.dev);
    code
}
