//! Low-level exec on the tokio shell: create a machine, run a buffered
//! command, then stream one event by event. Nothing is recorded durably
//! here (see `managed_tokio`).
//!
//! `cargo run -p smolbox-examples --example exec_tokio`
#![allow(clippy::print_stdout)] // an example prints what it shows

use smolbox_core::exec::{Command, ExecOutcome};
use smolbox_core::worker::{Endpoint, MachineName, MachineSpec};
use smolbox_examples::{Failure, local_worker};
use smolbox_tokio::{Client, ExecEvent};

fn main() -> Result<(), Failure> {
    // The devworker has a runtime of its own; start it before ours.
    let (_worker, endpoint) = local_worker()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(endpoint))
}

async fn run(endpoint: Endpoint) -> Result<(), Failure> {
    let client = Client::new(endpoint)?;
    let profile = client.admit(&[]).await?;
    client
        .create(&profile, MachineName::new("demo")?, &MachineSpec::default())
        .await?;

    let cmd = Command::new(["sh", "-c", "echo hello; echo oops >&2; exit 3"]).timeout_secs(30);
    match client.exec("demo", &cmd).await? {
        ExecOutcome::Exited(out) => println!(
            "buffered: exit {} stdout {:?} stderr {:?}",
            out.exit_code,
            String::from_utf8_lossy(&out.stdout).trim_end(),
            String::from_utf8_lossy(&out.stderr).trim_end(),
        ),
        ExecOutcome::Launched(l) => println!("launched in the background: {l:?}"),
    }

    // Streamed over SSE: events arrive as the worker sends them; dropping
    // the stream ends observation only (the command may still run).
    let cmd = Command::new(["sh", "-c", "for i in 1 2 3; do echo line-$i; done"]);
    let mut stream = client.exec_stream("demo", &cmd).await?;
    let mut text = String::new();
    let mut events = 0;
    while let Some(event) = stream.next().await {
        events += 1;
        match event? {
            ExecEvent::Stdout(s) => text.push_str(&s),
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exit(code) => {
                println!(
                    "streamed: exit {code} after {events} event(s): {:?}",
                    text.trim_end()
                );
            }
            // A kind of event this example does not know.
            _ => {}
        }
    }

    client.delete(MachineName::new("demo")?).await?;
    println!("machine demo deleted");
    Ok(())
}
