use crate::Reason;
use crate::error::{Category, Evidence, Operation};
use crate::exec::*;
use crate::http1::Method;

fn reason(c: &Command) -> Reason {
    let e = c.validate().unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence()),
        (
            Category::Validation,
            Operation::CommandSpec,
            Evidence::NotDispatched
        )
    );
    e.reason()
}

fn body(c: &Command) -> String {
    String::from_utf8(c.wire_body().unwrap()).unwrap()
}

#[test]
fn tv15_request_body_is_byte_exact() {
    let c = Command::new([
        "sh",
        "-c",
        "printf '\\000\\377\\376'; printf err >&2; exit 7",
    ]);
    assert_eq!(
        body(&c),
        r#"{"command":["sh","-c","printf '\\000\\377\\376'; printf err >&2; exit 7"],"env":[],"workdir":"/workspace","timeoutSecs":30,"background":false,"secrets":{}}"#
    );
    let req = exec_request("fixture", &c).unwrap();
    assert_eq!(req.method, Method::Post);
    assert_eq!(req.target, "/api/v1/machines/fixture/exec");
    assert_eq!(req.content_type, Some("application/json"));
    assert_eq!(req.accept, Some("application/json"));
    assert_eq!(req.operation, Operation::Exec);
    assert_eq!(&req.body[..], c.wire_body().unwrap().as_slice());
}

#[test]
fn optional_fields_in_order() {
    let c = Command::new(["cat"])
        .env("A", "1")
        .env("_b", "x\"y")
        .stdin("in")
        .user("1000:1000")
        .workdir("/tmp")
        .timeout_secs(301);
    assert_eq!(
        body(&c),
        r#"{"command":["cat"],"env":[{"name":"A","value":"1"},{"name":"_b","value":"x\"y"}],"workdir":"/tmp","timeoutSecs":301,"stdin":"in","user":"1000:1000","background":false,"secrets":{}}"#
    );
    // TV17: background has no timeout and no stdin.
    let c = Command::new(["python3", "-m", "http.server", "8000"]).background(true);
    assert_eq!(
        body(&c),
        r#"{"command":["python3","-m","http.server","8000"],"env":[],"workdir":"/workspace","background":true,"secrets":{}}"#
    );
    assert_eq!(exec_request("m", &c).unwrap().operation, Operation::Launch);
}

#[test]
fn tv12_empty_command_is_refused_before_sending() {
    let c = Command::new(Vec::<String>::new());
    assert_eq!(reason(&c), Reason::ArgvEmpty);
    let e = exec_request("wire-test", &c).unwrap_err();
    assert_eq!(e.evidence(), Evidence::NotDispatched);
    assert_eq!(reason(&Command::new([""])), Reason::ArgvFirstEmpty);
    assert!(Command::new(["a", ""]).validate().is_ok());
}

#[test]
fn argv_bounds_at_n_and_n_plus_one() {
    assert!(Command::new(vec!["x"; MAX_ARGV_ENTRIES]).validate().is_ok());
    assert_eq!(
        reason(&Command::new(vec!["x"; MAX_ARGV_ENTRIES + 1])),
        Reason::ArgvTooMany
    );
    assert!(Command::new(["a".repeat(MAX_ARG_LEN)]).validate().is_ok());
    let e = Command::new(["a".repeat(MAX_ARG_LEN + 1)])
        .validate()
        .unwrap_err();
    assert_eq!(e.reason(), Reason::ArgvEntryTooLong);
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((16_385, 16_384)));
    // Total: four full entries are exactly 64 KiB; one more byte is over.
    let full = vec!["a".repeat(MAX_ARG_LEN); 4];
    assert!(Command::new(full.clone()).validate().is_ok());
    let mut over = full;
    over.push("b".into());
    assert_eq!(reason(&Command::new(over)), Reason::ArgvTotalTooLong);
    assert_eq!(reason(&Command::new(["a", "b\0c"])), Reason::ArgvNul);
}

#[test]
fn env_bounds_at_n_and_n_plus_one() {
    let with_env =
        |n: usize| (0..n).fold(Command::new(["env"]), |c, i| c.env(format!("V{i}"), "x"));
    assert!(with_env(MAX_ENV_PAIRS).validate().is_ok());
    assert_eq!(reason(&with_env(MAX_ENV_PAIRS + 1)), Reason::EnvTooMany);
    let name = |n: usize| format!("A{}", "_".repeat(n - 1));
    assert!(Command::new(["e"]).env(name(128), "").validate().is_ok());
    assert_eq!(
        reason(&Command::new(["e"]).env(name(129), "")),
        Reason::EnvNameTooLong
    );
    assert!(
        Command::new(["e"])
            .env("A", "v".repeat(8_192))
            .validate()
            .is_ok()
    );
    assert_eq!(
        reason(&Command::new(["e"]).env("A", "v".repeat(8_193))),
        Reason::EnvValueTooLong
    );
    for bad in ["", "1A", "A-B", "A B", "É", "A="] {
        assert_eq!(
            reason(&Command::new(["e"]).env(bad, "")),
            Reason::EnvNameInvalid,
            "{bad:?}"
        );
    }
    for good in ["_", "a", "A_1", "_9z"] {
        assert!(
            Command::new(["e"]).env(good, "").validate().is_ok(),
            "{good:?}"
        );
    }
    assert_eq!(
        reason(&Command::new(["e"]).env("A", "1").env("A", "2")),
        Reason::EnvNameDuplicate
    );
}

#[test]
fn stdin_user_and_timeout_bounds() {
    assert!(
        Command::new(["c"])
            .stdin("s".repeat(65_536))
            .validate()
            .is_ok()
    );
    assert_eq!(
        reason(&Command::new(["c"]).stdin("s".repeat(65_537))),
        Reason::StdinTooLong
    );
    assert!(Command::new(["c"]).user("u".repeat(128)).validate().is_ok());
    assert_eq!(
        reason(&Command::new(["c"]).user("u".repeat(129))),
        Reason::UserTooLong
    );
    assert_eq!(reason(&Command::new(["c"]).user("")), Reason::UserEmpty);
    assert!(Command::new(["c"]).timeout_secs(1).validate().is_ok());
    assert!(Command::new(["c"]).timeout_secs(86_400).validate().is_ok());
    assert_eq!(
        reason(&Command::new(["c"]).timeout_secs(0)),
        Reason::TimeoutOutOfRange
    );
    assert_eq!(
        reason(&Command::new(["c"]).timeout_secs(86_401)),
        Reason::TimeoutOutOfRange
    );
    let bg = Command::new(["c"]).background(true);
    assert!(bg.validate().is_ok());
    assert_eq!(bg.effective_timeout_secs(), None);
    assert_eq!(
        reason(&bg.clone().timeout_secs(30)),
        Reason::BackgroundWithTimeout
    );
    assert_eq!(reason(&bg.stdin("x")), Reason::BackgroundWithStdin);
}

#[test]
fn workdir_uses_the_absolute_path_syntax() {
    for good in ["/", "/workspace", "/a/b.c/..d/...", "/ü"] {
        assert!(validate_abs_path(good).is_ok(), "{good:?}");
    }
    for bad in [
        "", "rel", "/a/", "//a", "/a//b", "/a/./b", "/a/../b", "/.", "/..", "/a%20", "/a\\b",
        "/a\0",
    ] {
        let e = validate_abs_path(bad).unwrap_err();
        assert_eq!(e.category(), Category::Validation, "{bad:?}");
    }
    let path = |n: usize| format!("/{}", "a".repeat(n - 1));
    assert!(validate_abs_path(&path(1_024)).is_ok());
    assert_eq!(
        validate_abs_path(&path(1_025)).unwrap_err().reason(),
        Reason::WorkdirTooLong
    );
    assert_eq!(
        reason(&Command::new(["c"]).workdir("x/y")),
        Reason::WorkdirNotAbsolute
    );
}

#[test]
fn extended_commands() {
    assert!(!Command::new(["c"]).is_extended());
    assert!(!Command::new(["c"]).timeout_secs(300).is_extended());
    assert!(Command::new(["c"]).timeout_secs(301).is_extended());
    assert!(Command::new(["c"]).background(true).is_extended());
    assert!(!Command::new(["c"]).workdir("/workspace/sub").is_extended());
    assert!(Command::new(["c"]).workdir("/workspaces").is_extended());
    assert!(Command::new(["c"]).workdir("/").is_extended());
}

#[test]
fn stream_request_rejects_stdin_and_background() {
    let c = Command::new(["echo", "café"]);
    let req = exec_stream_request("fixture", &c).unwrap();
    assert_eq!(req.target, "/api/v1/machines/fixture/exec/stream");
    assert_eq!(req.accept, Some("text/event-stream"));
    assert_eq!(req.operation, Operation::ExecStream);
    for c in [c.clone().stdin("x"), c.background(true)] {
        let e = exec_stream_request("fixture", &c).unwrap_err();
        assert_eq!(
            (e.category(), e.operation(), e.evidence()),
            (
                Category::UnsupportedCapability,
                Operation::ExecStream,
                Evidence::NotDispatched
            )
        );
    }
}

#[test]
fn machine_name_follows_the_one_rule_and_is_one_segment() {
    let req = exec_request("dev-1_a", &Command::new(["x"])).unwrap();
    assert_eq!(req.target, "/api/v1/machines/dev-1_a/exec");
    assert!(exec_request(&"a".repeat(31), &Command::new(["x"])).is_ok());
    for bad in ["", "a/b?c%d", "Dev", &"a".repeat(32)] {
        let e = exec_request(bad, &Command::new(["x"])).unwrap_err();
        assert_eq!(
            (e.category(), e.evidence(), e.reason(), e.operation()),
            (
                Category::Validation,
                Evidence::NotDispatched,
                Reason::InvalidMachineName,
                Operation::Exec
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn debug_redacts_argv_env_stdin_user_and_workdir() {
    let c = Command::new(["SENTINEL-ARGV"])
        .env("SENTINEL_NAME", "SENTINEL-VALUE")
        .stdin("SENTINEL-STDIN")
        .user("SENTINEL-USER")
        .workdir("/SENTINEL-DIR");
    let d = format!("{c:?}");
    assert!(!d.contains("SENTINEL"), "{d}");
    let req = exec_request("m", &c).unwrap();
    assert!(!format!("{req:?}").contains("SENTINEL"));
    // Errors about a command never carry its text either.
    let e = Command::new(["SENTINEL\0"]).validate().unwrap_err();
    assert!(!format!("{e} {e:?}").contains("SENTINEL"));
}
