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
mod machines;
mod records;
mod report;
mod run_files;
mod shell;
mod term;
mod worker;

use clap::{CommandFactory, Parser};

use crate::args::{Cli, Cmd, CompletionShell, DevCmd, MachineCmd, RecordsCmd};
use crate::backend::Backend;
use crate::report::Failure;
use smolbox_core::managed::controller::Resolution;

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
    records::lease_ttl_from_env()?;
    match &cli.command {
        Cmd::Completions { target } => return completions(*target),
        Cmd::Man => return man(),
        _ => {}
    }
    if let Cmd::Dev(d) = &cli.command {
        return match d {
            DevCmd::Up => dev::up(json),
            DevCmd::Status => dev::status(json),
            DevCmd::Down => dev::down(json),
            DevCmd::Serve { dir } => dev::serve(dir),
        };
    }
    // Records are read from the store alone: no worker is selected (and
    // no devworker started).
    if let Cmd::Records(r) = &cli.command {
        let store = cli.global.store.as_deref();
        return match r {
            RecordsCmd::Ls { state, machine } => {
                records::ls(store, state.as_deref(), machine.as_deref(), json)
            }
            RecordsCmd::Show { id } => records::show(store, id, json),
        };
    }
    // Managed machines: `ls`/`get` read the store alone; the other actions
    // (and drain, resolve) need a worker that outlives the command, so the
    // in-process devworker is never started for them.
    match &cli.command {
        Cmd::Machine(m) if !m.raw => match &m.cmd {
            MachineCmd::Ls | MachineCmd::Get { .. } => {
                return machines::machine_from_store(cli.global.store.as_deref(), &m.cmd, json);
            }
            _ if !worker::persistent_available(&cli.global)? => {
                return Err(machines::no_persistent_worker());
            }
            _ => {}
        },
        Cmd::StopForDrain { .. } | Cmd::Resolve { .. }
            if !worker::persistent_available(&cli.global)? =>
        {
            return Err(machines::no_persistent_worker());
        }
        _ => {}
    }
    // A run's declared files are read and checked before any worker is
    // selected or started: a refusal there sends nothing.
    let files = match &cli.command {
        Cmd::Run(a) => run_files::prepare(a)?,
        Cmd::Exec(a) => run_files::prepare_exec(a)?,
        _ => run_files::Files::default(),
    };
    let command_secs = match &cli.command {
        Cmd::Exec(a) => a.opts.timeout,
        Cmd::Run(a) => a.opts.timeout,
        _ => None,
    };
    let selected = worker::select(&cli.global, worker::budgets(command_secs))?;
    worker::set_machine_image(cli.global.image.as_deref(), &selected);
    let backend = Backend::new(cli.global.shell, selected.endpoint)?;
    let ctx = machines::Ctx {
        backend: &backend,
        store: cli.global.store.as_deref(),
        worker: &selected.worker_id,
        persistent: selected.dev.is_none(),
    };
    let code = match cli.command {
        Cmd::Health => commands::health(&backend, json),
        Cmd::Machine(m) if !m.raw => machines::machine(&ctx, m.cmd, json),
        Cmd::Machine(m) => commands::machine(&backend, m.cmd, json),
        Cmd::StopForDrain { machine } => machines::stop_for_drain(&ctx, &machine, json),
        Cmd::Resolve {
            machine,
            quiesced,
            deleted,
            ..
        } => {
            let disposition = if deleted {
                Resolution::Deleted
            } else {
                Resolution::Stopped
            };
            machines::resolve(&ctx, &machine, quiesced, disposition, json)
        }
        Cmd::Exec(a) => match machines::lookup(ctx.store, &a.machine) {
            Ok(Some(_)) => commands::command(&a.opts, a.argv).and_then(|cmd| {
                machines::exec(&ctx, &a.machine, &cmd, &files, a.opts.stream, json)
            }),
            // Files go only into a managed machine's slot (issue 12).
            Ok(None) if files.any() => Err(run_files::not_managed()),
            Ok(None) => commands::exec(&backend, &a.machine, &a.opts, a.argv, json),
            Err(f) => Err(f),
        },
        Cmd::Run(a) => commands::run(
            &backend,
            &a,
            &files,
            cli.global.store.as_deref(),
            json,
            &selected.worker_id,
            selected.dev.is_none(),
        ),
        Cmd::Wait { id, timeout } => records::wait(
            &backend,
            cli.global.store.as_deref(),
            &selected.worker_id,
            &id,
            timeout,
            json,
        ),
        Cmd::Cancel { id } => records::cancel(
            &backend,
            cli.global.store.as_deref(),
            &selected.worker_id,
            &id,
            json,
        ),
        Cmd::Recover => records::recover(
            &backend,
            cli.global.store.as_deref(),
            &selected.worker_id,
            json,
        ),
        Cmd::Shell(a) => shell::shell(&ctx, &a),
        Cmd::Cp(a) => files::cp(&ctx, &a, json),
        Cmd::Logs(a) => machines::verified_worker_name(&ctx, &a.machine)
            .and_then(|name| commands::logs(&backend, &name, &a, json)),
        // Answered above, without a worker.
        Cmd::Dev(_) | Cmd::Records(_) | Cmd::Completions { .. } | Cmd::Man => Ok(0),
    };
    // The client (and its runtime) goes before the devworker it talks to.
    drop(backend);
    drop(selected.dev);
    code
}

/// The command line without `dev serve` (hidden from `--help`, but the
/// completion generators list hidden subcommands too).
fn without_hidden() -> clap::Command {
    Cli::command().mut_subcommand("dev", |dev| {
        let kept: Vec<clap::Command> = dev
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .cloned()
            .collect();
        let mut fresh = clap::Command::new("dev").subcommand_required(true);
        if let Some(about) = dev.get_about() {
            fresh = fresh.about(about.clone());
        }
        fresh.subcommands(kept)
    })
}

/// `completions SHELL`: the script, generated from the clap definitions.
fn completions(shell: CompletionShell) -> Result<i32, Failure> {
    let shell = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut without_hidden(), "smolbox", &mut script);
    report::out(&script)?;
    Ok(0)
}

/// `man`: the man page (roff), generated from the clap definitions, with
/// a section per subcommand.
fn man() -> Result<i32, Failure> {
    let cmd = Cli::command();
    let mut page = Vec::new();
    let render = |page: &mut Vec<u8>| -> std::io::Result<()> {
        let m = clap_mangen::Man::new(cmd.clone());
        m.render_title(page)?;
        m.render_name_section(page)?;
        m.render_synopsis_section(page)?;
        m.render_description_section(page)?;
        m.render_options_section(page)?;
        // One section for each visible subcommand, nested ones included.
        let mut stack: Vec<(String, clap::Command)> = cmd
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| (format!("smolbox {}", c.get_name()), c.clone()))
            .collect();
        stack.reverse();
        while let Some((path, sub)) = stack.pop() {
            let sub = sub.bin_name(path.clone());
            clap_mangen::roff::Roff::new()
                .control("SH", [path.to_uppercase().as_str()])
                .to_writer(page)?;
            let sm = clap_mangen::Man::new(sub.clone());
            sm.render_synopsis_section(page)?;
            sm.render_description_section(page)?;
            sm.render_options_section(page)?;
            let mut kids: Vec<(String, clap::Command)> = sub
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(|c| (format!("{path} {}", c.get_name()), c.clone()))
                .collect();
            kids.reverse();
            stack.extend(kids);
        }
        m.render_extra_section(page)?;
        m.render_version_section(page)?;
        m.render_authors_section(page)
    };
    render(&mut page).map_err(|e| Failure::local("render the man page", &e))?;
    report::out(&page)?;
    Ok(0)
}
