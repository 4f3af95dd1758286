use crate::error::{Category, Evidence, Operation};
use crate::exec::*;
use crate::http1::ResponseHead;
use crate::worker::{Profile, Version, WorkerCall};

fn head(status: u16, content_type: Option<&str>) -> ResponseHead {
    ResponseHead {
        status,
        content_type: content_type.map(str::to_owned),
        content_length: None,
        chunked: false,
        keep_alive: true,
    }
}

fn p(v: Version) -> Profile {
    Profile::known(v)
}

const TV16: &[u8] = br#"{"exitCode":0,"stdout":"api-test-marker\n","stderr":"","stdoutB64":"YXBpLXRlc3QtbWFya2VyCg==","stderrB64":""}"#;
const TV17: &[u8] = br#"{"exitCode":0,"stdout":"pid=4242\n","stderr":"","stdoutB64":"cGlkPTQyNDIK","stderrB64":""}"#;

#[test]
fn buffered_call_decodes_200_and_maps_statuses() {
    let call = ExecCall::new(
        &p(Version::V1_22_0),
        "dev",
        Command::new(["echo", "api-test-marker"]),
        OutputAllowance::DEFAULT,
    )
    .unwrap();
    assert_eq!(call.operation(), Operation::Exec);
    assert_eq!(call.request().unwrap().target, "/api/v1/machines/dev/exec");
    match call
        .decode(&head(200, Some("application/json")), TV16)
        .unwrap()
    {
        ExecOutcome::Exited(out) => assert_eq!(out.stdout, b"api-test-marker\n"),
        ExecOutcome::Launched(_) => panic!("foreground decoded as launch"),
    }
    let e = call
        .decode(&head(200, Some("text/plain")), TV16)
        .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::Protocol, Evidence::DispatchUncertain)
    );
    // TV11: unknown machine.
    let e = call
        .decode(
            &head(404, Some("application/json")),
            br#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#,
        )
        .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::NotFound, Evidence::DispatchUncertain)
    );
    // TV12: the worker's own empty-command refusal (were one ever sent).
    let e = call
        .decode(
            &head(400, Some("application/json")),
            br#"{"error":"command cannot be empty","code":"BAD_REQUEST"}"#,
        )
        .unwrap_err();
    assert_eq!(e.evidence(), Evidence::DispatchUncertain);
    // 408 after the worker's 300 s timeout: the command may still be running.
    let e = call.decode(&head(408, None), b"").unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::Unknown, Evidence::DispatchUncertain)
    );
    assert_eq!(call.max_response_bytes(), Some(8 * 1_048_576 + 4_096));
}

#[test]
fn background_call_is_a_launch() {
    let cmd = Command::new(["python3", "-m", "http.server", "8000"]).background(true);
    let call = ExecCall::new(&p(Version::V1_17_0), "dev", cmd, OutputAllowance::DEFAULT).unwrap();
    assert_eq!(call.operation(), Operation::Launch);
    assert_eq!(
        call.decode(&head(200, Some("application/json")), TV17),
        Ok(ExecOutcome::Launched(Launched { pid: 4242 }))
    );
}

#[test]
fn extended_commands_need_1_17_0_and_user_is_refused_on_1_9_2() {
    for cmd in [
        Command::new(["c"]).timeout_secs(301),
        Command::new(["c"]).background(true),
        Command::new(["c"]).workdir("/tmp"),
    ] {
        for v in [Version::V1_9_2, Version::V1_16_1] {
            let e = ExecCall::new(&p(v), "m", cmd.clone(), OutputAllowance::DEFAULT).unwrap_err();
            assert_eq!(
                (e.category(), e.evidence()),
                (Category::UnsupportedCapability, Evidence::NotDispatched)
            );
        }
        assert!(ExecCall::new(&p(Version::V1_17_0), "m", cmd, OutputAllowance::DEFAULT).is_ok());
    }
    assert!(
        ExecCall::new(
            &p(Version::V1_9_2),
            "m",
            Command::new(["c"]),
            OutputAllowance::DEFAULT
        )
        .is_ok()
    );
    let e = ExecCall::new(
        &p(Version::V1_9_2),
        "m",
        Command::new(["c"]).user("root"),
        OutputAllowance::DEFAULT,
    )
    .unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
    assert!(
        ExecCall::new(
            &p(Version::V1_14_1),
            "m",
            Command::new(["c"]).user("root"),
            OutputAllowance::DEFAULT
        )
        .is_ok()
    );
    let e = ExecCall::new(
        &p(Version::V1_22_0),
        "m",
        Command::new(Vec::<String>::new()),
        OutputAllowance::DEFAULT,
    )
    .unwrap_err();
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::Validation, Evidence::NotDispatched)
    );
}

#[test]
fn stream_call_checks_head_and_decodes_the_body() {
    let tv19 = b"event: stdout\ndata: hi\ndata: \n\n:\n\nevent: stderr\ndata: boom\ndata: \n\nevent: exit\ndata: {\"exitCode\":3}\n\n";
    let call = ExecStreamCall::new(
        &p(Version::V1_9_2),
        "fixture",
        Command::new(["sh"]),
        OutputAllowance::DEFAULT,
    )
    .unwrap();
    assert_eq!(
        call.request().unwrap().target,
        "/api/v1/machines/fixture/exec/stream"
    );
    let ok = head(200, Some("text/event-stream"));
    let out = call.decode(&ok, tv19).unwrap();
    assert_eq!(
        (out.exit_code, &out.stdout[..], &out.stderr[..]),
        (3, &b"hi\n"[..], &b"boom\n"[..])
    );
    assert_eq!(out.encoding, OutputEncoding::LossyUtf8);
    assert_eq!(call.check_head(&ok), Ok(true));
    assert_eq!(
        call.check_head(&head(500, Some("application/json"))),
        Ok(false)
    );
    assert!(
        call.check_head(&head(200, Some("application/json")))
            .is_err()
    );
    let e = call
        .decode(&head(404, Some("application/json")), b"{}")
        .unwrap_err();
    assert_eq!(
        (e.category(), e.operation()),
        (Category::NotFound, Operation::ExecStream)
    );
    // AC-5.4.2: streaming rejects background (and stdin) before any mutation.
    for cmd in [
        Command::new(["c"]).background(true),
        Command::new(["c"]).stdin("x"),
    ] {
        let e = ExecStreamCall::new(&p(Version::V1_22_0), "m", cmd, OutputAllowance::DEFAULT)
            .unwrap_err();
        assert_eq!(
            (e.category(), e.evidence()),
            (Category::UnsupportedCapability, Evidence::NotDispatched)
        );
    }
}

/// C5.4: an extended command (timeout > 300 s, background, workdir outside
/// `/workspace`) carries the image-machine preflight, on the same operation;
/// an ordinary one does not (nothing extra is sent for it).
#[test]
fn extended_commands_carry_the_image_preflight() {
    let profile = p(Version::V1_22_0);
    let plain = Command::new(["true"]);
    let extended = [
        (Command::new(["true"]).timeout_secs(301), Operation::Exec),
        (Command::new(["true"]).background(true), Operation::Launch),
        (Command::new(["true"]).workdir("/tmp"), Operation::Exec),
    ];
    let call = ExecCall::new(&profile, "dev", plain.clone(), OutputAllowance::DEFAULT).unwrap();
    assert!(call.image_check().is_none());
    let call = ExecCall::new(
        &profile,
        "dev",
        Command::new(["true"]).timeout_secs(300),
        OutputAllowance::DEFAULT,
    )
    .unwrap();
    assert!(call.image_check().is_none(), "300 s is not extended");
    let stream = ExecStreamCall::new(&profile, "dev", plain, OutputAllowance::DEFAULT).unwrap();
    assert!(stream.image_check().is_none());
    for (command, op) in extended {
        let call =
            ExecCall::new(&profile, "dev", command.clone(), OutputAllowance::DEFAULT).unwrap();
        let check = call.image_check().expect("extended exec inspects first");
        assert_eq!(check.operation(), op);
        assert_eq!(
            check.inspect().request().unwrap().target,
            "/api/v1/machines/dev"
        );
        if !command.is_background() {
            let stream =
                ExecStreamCall::new(&profile, "dev", command, OutputAllowance::DEFAULT).unwrap();
            let check = stream
                .image_check()
                .expect("extended stream inspects first");
            assert_eq!(check.operation(), Operation::ExecStream);
        }
    }
}
