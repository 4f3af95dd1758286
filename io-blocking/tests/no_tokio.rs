//! The blocking shell has no tokio (nor any async runtime) anywhere in its
//! normal dependency tree (issue 8: "a test checks `cargo tree`").

use std::process::Command;

#[test]
fn dependency_tree_has_no_async_runtime() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-e",
            "normal",
            "-p",
            "smolbox-blocking",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).expect("utf-8");
    let names: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(names.contains(&"mio"), "the tree was not read: {tree}");
    for banned in [
        "tokio",
        "tokio-rustls",
        "tokio-util",
        "async-std",
        "smol",
        "hyper",
        "axum",
        "futures-executor",
    ] {
        assert!(
            !names.contains(&banned),
            "{banned} is in the blocking shell's tree"
        );
    }
}
