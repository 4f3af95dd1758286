//! The devworker impersonating 1.9.2 against what a real `smolvm serve`
//! 1.9.2 answered (issue 17 item 6): `tools/diffworker/diff.py --replay-a`
//! replays the committed recording `tools/diffworker/fixtures/smolvm-1.9.2.json`
//! as side A and compares the standalone binary, request by request.
//!
//! Needs `python3` (standard library only); `scripts/test.sh` installs it
//! when it is missing. Without it these tests fail, they never skip.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The seed the fixture was recorded with (diff.py also reads it from the
/// file; giving it pins the fixture to it).
const SEED: &str = "17";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The standalone devworker, killed on drop.
struct Worker {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `smolbox-devworker --impersonate 1.9.2 --no-token` on a free
/// loopback port (the tool sends no token; the Host and Origin checks stay
/// on) and waits for its "listening on" line.
fn start_worker() -> Worker {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_smolbox-devworker"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--impersonate",
            "1.9.2",
            "--no-token",
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("the devworker exited before listening")
            .unwrap();
        if let Some(url) = line.strip_prefix("smolbox-devworker: listening on ") {
            break url.trim().to_owned();
        }
    };
    // Keep draining stderr so the worker never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Worker { child, url, dir }
}

fn diff(w: &Worker, extra: &[&str]) -> Output {
    let plant = format!(
        "path:{}/machines/{{name}}/agent-console.log",
        w.dir.path().display()
    );
    Command::new("python3")
        .current_dir(repo())
        .args([
            "tools/diffworker/diff.py",
            "--replay-a",
            "tools/diffworker/fixtures/smolvm-1.9.2.json",
            "--seed",
            SEED,
            "--fast",
        ])
        .arg(&w.url)
        .arg("--plant-b")
        .arg(plant)
        .args(extra)
        .output()
        .expect("python3 must be installed (scripts/test.sh installs it)")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn summary(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .rev()
        .find(|l| l.starts_with("diffworker: ") && l.contains(" passed, "))
        .unwrap_or("")
        .to_owned()
}

#[test]
fn devworker_answers_like_the_recorded_real_1_9_2_server() {
    let w = start_worker();
    let o = diff(&w, &[]);
    let out = text(&o);
    let diffs: Vec<&str> = out.lines().filter(|l| l.starts_with("DIFF ")).collect();
    assert!(
        diffs.is_empty(),
        "differences from 1.9.2:\n{}",
        diffs.join("\n")
    );
    assert_eq!(o.status.code(), Some(0), "{out}");
    // Every comparable step was compared (the --fast catalogue: 298 steps,
    // 27 of them never sent); none was skipped for a missing recording.
    assert_eq!(
        summary(&o),
        "diffworker: 271 passed, 0 differ, 27 skipped",
        "{out}"
    );
}

/// The check catches a planted bug: one create reply with a wrong `cpus`
/// (the devworker's own `create_mismatch` fault, switched on over HTTP).
#[test]
fn a_planted_wrong_answer_is_reported() {
    let w = start_worker();
    let fault = br#"{"route":"machines_create","fault":{"kind":"create_mismatch","field":"cpus"},"times":1}"#;
    let addr = w.url.strip_prefix("http://").unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "POST /_devworker/faults HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        fault.len()
    )
    .unwrap();
    s.write_all(fault).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 2"), "fault not taken: {reply}");

    let o = diff(&w, &["--only", "create/variants/*"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let diffs: Vec<&str> = out.lines().filter(|l| l.starts_with("DIFF ")).collect();
    assert_eq!(diffs.len(), 1, "{out}");
    assert!(
        diffs[0].starts_with("DIFF create/variants/empty-object-defaults: json $.cpus: 4 vs 5"),
        "{out}"
    );
    assert!(summary(&o).contains(" 1 differ, "), "{out}");
}
