//! Shell completions and the man page, generated from the clap definitions.

// Tests may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::{code, smolbox, stderr, stdout};

/// The visible top-level subcommands (hidden `dev serve` is not one).
const SUBCOMMANDS: [&str; 15] = [
    "health",
    "machine",
    "exec",
    "shell",
    "cp",
    "logs",
    "run",
    "records",
    "wait",
    "cancel",
    "recover",
    "dev",
    "completions",
    "man",
    "help",
];

#[test]
fn completions_for_each_shell_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let o = smolbox().args(["completions", shell]).output().unwrap();
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        let text = stdout(&o);
        assert!(!text.is_empty(), "{shell}");
        for sub in SUBCOMMANDS {
            assert!(text.contains(sub), "{shell}: no {sub}");
        }
        // Nested subcommands and options (fish writes `-l json`) too.
        for word in ["create", "status", "worker", "json", "raw", "no-start"] {
            assert!(text.contains(word), "{shell}: no {word}");
        }
        // As a word ("server" in a help text is not the subcommand).
        assert!(
            !text
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| w == "serve"),
            "{shell}: the hidden `dev serve` is listed"
        );
        assert!(
            !text.contains("--managed") && !text.contains("-l managed"),
            "{shell}: a removed or hidden option is listed"
        );
    }
    // Needs no worker: nothing was started or contacted.
    let o = smolbox().args(["completions", "bash"]).output().unwrap();
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let o = smolbox()
        .args(["completions", "powershell"])
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "an unknown shell is a usage error");
}

#[test]
fn the_man_page_documents_every_subcommand() {
    let o = smolbox().arg("man").output().unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(
        page.starts_with(".ie") || page.contains(".TH smolbox"),
        "{page}"
    );
    assert!(page.contains(".SH NAME"), "{page}");
    for sub in SUBCOMMANDS.iter().filter(|s| **s != "help") {
        let section = format!(".SH \"SMOLBOX {}\"", sub.to_uppercase());
        let bare = format!(".SH SMOLBOX\\ {}", sub.to_uppercase());
        assert!(
            page.contains(&section)
                || page.contains(&bare)
                || page.contains(&format!("SMOLBOX {}", sub.to_uppercase())),
            "no section for {sub}"
        );
    }
    for nested in [
        "SMOLBOX MACHINE CREATE",
        "SMOLBOX DEV UP",
        "SMOLBOX DEV DOWN",
    ] {
        assert!(page.contains(nested), "no section for {nested}");
    }
    assert!(page.contains("Exit codes"), "the exit table is in the page");
    assert!(
        !page.contains("SMOLBOX DEV SERVE"),
        "hidden `dev serve` documented"
    );
}
