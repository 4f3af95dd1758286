//! Low-level exec on the blocking shell: create a machine, run a buffered
//! command, then a streamed one whose output reaches a callback as it
//! arrives. Nothing is recorded durably here (see `managed_blocking`).
//!
//! `cargo run -p smolbox-examples --example exec_blocking`
#![allow(clippy::print_stdout)] // an example prints what it shows

use std::sync::{Arc, Mutex};

use smolbox_blocking::{Client, ExecEvent};
use smolbox_core::exec::{Command, ExecOutcome};
use smolbox_core::worker::{MachineName, MachineSpec};
use smolbox_examples::{Failure, local_worker};

fn main() -> Result<(), Failure> {
    let (_worker, endpoint) = local_worker()?;
    let client = Client::new(endpoint)?;
    // The worker's version decides the wire profile; an unsupported
    // version is refused here, before any mutation.
    let profile = client.admit(&[])?;
    client.create(&profile, MachineName::new("demo")?, &MachineSpec::default())?;

    // Buffered: one request, the whole output in the reply.
    let cmd = Command::new(["sh", "-c", "echo hello; echo oops >&2; exit 3"]).timeout_secs(30);
    match client.exec("demo", &cmd)? {
        ExecOutcome::Exited(out) => println!(
            "buffered: exit {} stdout {:?} stderr {:?}",
            out.exit_code,
            String::from_utf8_lossy(&out.stdout).trim_end(),
            String::from_utf8_lossy(&out.stderr).trim_end(),
        ),
        ExecOutcome::Launched(l) => println!("launched in the background: {l:?}"),
    }

    // Streamed: each piece of output is handed to the callback as the
    // worker sends it (on a delivery thread; a panicking or blocked
    // callback detaches the stream instead of stalling the connection).
    let lines = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&lines);
    let cmd = Command::new(["sh", "-c", "for i in 1 2 3; do echo line-$i; done"]);
    let out = client.exec_with("demo", &cmd, move |event| {
        if let ExecEvent::Stdout(text) = event
            && let Ok(mut v) = seen.lock()
        {
            v.push(text.clone());
        }
    })?;
    let streamed: String = lines.lock().map(|v| v.concat()).unwrap_or_default();
    println!(
        "streamed: exit {} in {} callback(s): {:?}",
        out.exit_code,
        lines.lock().map(|v| v.len()).unwrap_or_default(),
        streamed.trim_end()
    );

    client.delete(MachineName::new("demo")?)?;
    println!("machine demo deleted");
    Ok(())
}
