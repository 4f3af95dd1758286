//! An interactive terminal on the blocking shell: a shell under a PTY in
//! the machine, typed input, a resize the guest sees, and the guest's
//! confirmed exit code.
//!
//! `cargo run -p smolbox-examples --example terminal_blocking`
#![allow(clippy::print_stdout)] // an example prints what it shows

use std::time::Duration;

use smolbox_blocking::{Client, Terminal, TerminalEvent};
use smolbox_core::terminal::TerminalSpec;
use smolbox_core::worker::{MachineName, MachineSpec, Source};
use smolbox_examples::{Failure, local_worker};

/// Reads output until `needle` appears; the whole wait is bounded.
fn read_until(term: &mut Terminal, needle: &str) -> Result<String, Failure> {
    let mut seen = Vec::new();
    for _ in 0..100 {
        match term.next(Duration::from_secs(5))? {
            TerminalEvent::Output(bytes) => {
                seen.extend_from_slice(&bytes);
                if String::from_utf8_lossy(&seen).contains(needle) {
                    return Ok(String::from_utf8_lossy(&seen).into_owned());
                }
            }
            TerminalEvent::Closed(end) => return Err(format!("closed early: {end:?}").into()),
            // A kind of event this example does not know.
            _ => {}
        }
    }
    Err(format!("{needle:?} never arrived").into())
}

fn main() -> Result<(), Failure> {
    let (_worker, endpoint) = local_worker()?;
    let client = Client::new(endpoint)?;
    let profile = client.admit(&[])?;
    client.create(&profile, MachineName::new("demo")?, &image_machine())?;

    // Every budget of the session is in the spec and checked before
    // anything is sent (session and idle budgets, buffer and input caps).
    let mut spec = TerminalSpec::new("/bin/sh");
    spec.session_budget = Duration::from_secs(60);
    spec.idle_budget = Duration::from_secs(30);
    let mut term = client.terminal("demo", &spec)?;

    term.input(b"echo hi-$((40 + 2))\n")?;
    read_until(&mut term, "hi-42")?;
    println!("terminal: the guest answered hi-42");

    term.resize(100, 30)?;
    term.input(b"stty size\n")?;
    read_until(&mut term, "30 100")?;
    println!("terminal: the guest sees 30 rows x 100 columns");

    term.input(b"exit 7\n")?;
    loop {
        if let TerminalEvent::Closed(end) = term.next(Duration::from_secs(5))? {
            // A confirmed exit; 124, 130 and a close without an exit frame
            // are errors whose evidence says the outcome is uncertain.
            println!("terminal: confirmed exit {}", end?.code);
            break;
        }
    }
    client.delete(MachineName::new("demo")?)?;
    Ok(())
}

/// Terminals need a plain image machine (C7.4): the client inspects the
/// machine before it connects. The devworker reports the reference as the
/// machine's image and pulls nothing; a real worker pulls it at start.
fn image_machine() -> MachineSpec {
    MachineSpec {
        source: Source::Oci {
            reference: "alpine:3.19".into(),
        },
        ..MachineSpec::default()
    }
}
