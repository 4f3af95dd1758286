use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use crate::error::{Category, Evidence, Operation};
use crate::exec::*;

fn reply(code: i32, stdout: &[u8], stderr: &[u8]) -> Vec<u8> {
    format!(
        r#"{{"exitCode":{code},"stdout":{},"stderr":{},"stdoutB64":"{}","stderrB64":"{}"}}"#,
        serde_json::to_string(&String::from_utf8_lossy(stdout)).unwrap(),
        serde_json::to_string(&String::from_utf8_lossy(stderr)).unwrap(),
        B64.encode(stdout),
        B64.encode(stderr)
    )
    .into_bytes()
}

fn protocol(e: &crate::Error) {
    assert_eq!(
        (e.category(), e.evidence()),
        (Category::Protocol, Evidence::DispatchUncertain),
        "{e:?}"
    );
}

#[test]
fn tv15_binary_output_and_nonzero_exit() {
    let body = "{\"exitCode\":7,\"stdout\":\"\\u0000\u{fffd}\u{fffd}\",\"stderr\":\"err\",\"stdoutB64\":\"AP/+\",\"stderrB64\":\"ZXJy\"}";
    let out = decode_exec_reply(body.as_bytes(), OutputAllowance::DEFAULT).unwrap();
    assert_eq!(out.exit_code, 7);
    assert_eq!(out.stdout, b"\x00\xff\xfe");
    assert_eq!(out.stderr, b"err");
    assert_eq!(out.encoding, OutputEncoding::Bytes);
    assert_eq!(out.encoding.as_str(), "bytes");
}

#[test]
fn tv16_text_output() {
    let body = br#"{"exitCode":0,"stdout":"api-test-marker\n","stderr":"","stdoutB64":"YXBpLXRlc3QtbWFya2VyCg==","stderrB64":""}"#;
    let out = decode_exec_reply(body, OutputAllowance::DEFAULT).unwrap();
    assert_eq!(
        (out.exit_code, &out.stdout[..], &out.stderr[..]),
        (0, &b"api-test-marker\n"[..], &b""[..])
    );
}

#[test]
fn tv17_background_launch() {
    let body = br#"{"exitCode":0,"stdout":"pid=4242\n","stderr":"","stdoutB64":"cGlkPTQyNDIK","stderrB64":""}"#;
    assert_eq!(decode_launch_reply(body), Ok(Launched { pid: 4242 }));
    let bg = Command::new(["python3", "-m", "http.server", "8000"]).background(true);
    assert_eq!(
        decode_reply_for(&bg, body, OutputAllowance::DEFAULT),
        Ok(ExecOutcome::Launched(Launched { pid: 4242 }))
    );
}

#[test]
fn ac_5_4_1_foreground_pid_output_is_never_a_launch() {
    let body = reply(0, b"pid=12\n", b"");
    let fg = Command::new(["sh", "-c", "echo pid=12"]);
    match decode_reply_for(&fg, &body, OutputAllowance::DEFAULT).unwrap() {
        ExecOutcome::Exited(out) => assert_eq!(out.stdout, b"pid=12\n"),
        ExecOutcome::Launched(_) => panic!("foreground output taken as a launch"),
    }
}

#[test]
fn ac_5_2_3_exit_3_is_a_successful_observation() {
    let out = decode_exec_reply(&reply(3, b"", b"x"), OutputAllowance::DEFAULT).unwrap();
    assert_eq!(out.exit_code, 3);
    let out = decode_exec_reply(&reply(-1, b"", b""), OutputAllowance::DEFAULT).unwrap();
    assert_eq!(out.exit_code, -1);
}

#[test]
fn ac_5_2_2_invalid_base64_or_missing_fields_are_protocol() {
    let cases: [&[u8]; 10] = [
        br#"{"exitCode":0,"stdout":"","stderr":"","stdoutB64":"AP/","stderrB64":""}"#,
        br#"{"exitCode":0,"stdout":"","stderr":"","stdoutB64":"AP/+","stderrB64":"Z!Jy"}"#,
        br#"{"exitCode":0,"stdout":"","stderr":"","stdoutB64":"YQ","stderrB64":""}"#,
        br#"{"exitCode":0,"stdout":"","stderr":"","stdoutB64":"YQ==\n","stderrB64":""}"#,
        br#"{"exitCode":0,"stdout":"","stderr":"","stdoutB64":""}"#,
        br#"{"exitCode":0,"stdout":"","stdoutB64":"","stderrB64":""}"#,
        br#"{"stdout":"","stderr":"","stdoutB64":"","stderrB64":""}"#,
        br#"{"exitCode":2147483648,"stdout":"","stderr":"","stdoutB64":"","stderrB64":""}"#,
        br#"{"exitCode":0,"stdout":"","stderr":"","stdoutB64":"","stderrB64":"","extra":1}"#,
        br#"{"exitCode":0,"stdout":"","stderr":"","stdoutB64":"","stderrB64":"","stderrB64":""}"#,
    ];
    for body in cases {
        let e = decode_exec_reply(body, OutputAllowance::DEFAULT).unwrap_err();
        protocol(&e);
        assert_eq!(e.operation(), Operation::Exec);
    }
    for body in [&b""[..], b"null", b"[]", b"{", br#"{"exitCode":"0"}"#] {
        protocol(&decode_exec_reply(body, OutputAllowance::DEFAULT).unwrap_err());
    }
    // The lossy fields are only type-checked.
    let body = br#"{"exitCode":0,"stdout":1,"stderr":"","stdoutB64":"","stderrB64":""}"#;
    protocol(&decode_exec_reply(body, OutputAllowance::DEFAULT).unwrap_err());
}

#[test]
fn allowance_bounds() {
    assert!(OutputAllowance::new(1).is_ok());
    assert!(OutputAllowance::new(8_388_608).is_ok());
    for bad in [0, 8_388_609] {
        let e = OutputAllowance::new(bad).unwrap_err();
        assert_eq!(
            (e.category(), e.evidence()),
            (Category::Validation, Evidence::NotDispatched)
        );
    }
    assert_eq!(OutputAllowance::default().bytes(), 1_048_576);
    assert_eq!(OutputAllowance::new(3).unwrap().max_encoded_bytes(), 12);
    assert_eq!(OutputAllowance::new(4).unwrap().max_encoded_bytes(), 16);
}

#[test]
fn ac_5_2_1_output_over_the_allowance_after_decoding() {
    let max = OutputAllowance::new(5).unwrap();
    let out = decode_exec_reply(&reply(9, b"abc", b"de"), max).unwrap();
    assert_eq!((out.stdout.len() + out.stderr.len(), out.exit_code), (5, 9));
    let e = decode_exec_reply(&reply(9, b"abc", b"def"), max).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.exit_code(), e.operation()),
        (
            Category::OutputLimit,
            Evidence::Exited,
            Some(9),
            Operation::Exec
        )
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((6, 5)));
}

#[test]
fn output_over_the_allowance_before_decoding() {
    // Allowance 3 → at most 12 base64 characters in both fields together.
    let max = OutputAllowance::new(3).unwrap();
    let body = |out: &str, err: &str| {
        format!(
            r#"{{"exitCode":4,"stdout":"","stderr":"","stdoutB64":"{out}","stderrB64":"{err}"}}"#
        )
    };
    // 12 characters pass the length check and then fail decoding (not valid
    // base64 here, so the verdict shows which check ran).
    protocol(&decode_exec_reply(body("!!!!!!!!", "!!!!").as_bytes(), max).unwrap_err());
    // 13 are refused before decoding, with the exit code.
    let e = decode_exec_reply(body("!!!!!!!!", "!!!!!").as_bytes(), max).unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.exit_code()),
        (Category::OutputLimit, Evidence::Exited, Some(4))
    );
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((13, 12)));
}

#[test]
fn reused_output_buffers_are_replaced_not_appended() {
    let dec = ExecReplyDecoder::new(OutputAllowance::DEFAULT);
    let mut out = ExecOutput::empty(OutputEncoding::Bytes);
    dec.decode_into(&reply(0, b"first output", b"e1"), &mut out)
        .unwrap();
    let cap = out.stdout.capacity();
    dec.decode_into(&reply(1, b"second", b""), &mut out)
        .unwrap();
    assert_eq!(
        (out.exit_code, &out.stdout[..], &out.stderr[..]),
        (1, &b"second"[..], &b""[..])
    );
    assert_eq!(out.stdout.capacity(), cap);
}

#[test]
fn launch_ack_is_exact() {
    let ok = |stdout: &[u8]| decode_launch_reply(&reply(0, stdout, b""));
    assert_eq!(ok(b"pid=1\n"), Ok(Launched { pid: 1 }));
    assert_eq!(ok(b"pid=4294967295\n"), Ok(Launched { pid: 4_294_967_295 }));
    for bad in [
        &b"pid=4294967296\n"[..],
        b"pid=9999999999\n",
        b"pid=12345678901\n",
        b"pid=0\n",
        b"pid=012\n",
        b"pid=12",
        b"pid=12\n\n",
        b" pid=12\n",
        b"pid=12\r\n",
        b"pid=+12\n",
        b"pid=\n",
        b"PID=12\n",
        b"",
    ] {
        let e = ok(bad).unwrap_err();
        protocol(&e);
        assert_eq!(e.operation(), Operation::Launch, "{bad:?}");
    }
    protocol(&decode_launch_reply(&reply(1, b"pid=12\n", b"")).unwrap_err());
    protocol(&decode_launch_reply(&reply(0, b"pid=12\n", b"warn")).unwrap_err());
    // Output too large for an acknowledgement is protocol, not output_limit.
    let e = decode_launch_reply(&reply(0, &[b'9'; 100], b"")).unwrap_err();
    protocol(&e);
    protocol(&decode_launch_reply(b"{}").unwrap_err());
}

#[test]
fn output_debug_prints_no_bytes() {
    let out = decode_exec_reply(
        &reply(0, b"SENTINEL-OUT", b"SENTINEL-ERR"),
        OutputAllowance::DEFAULT,
    )
    .unwrap();
    assert!(!format!("{out:?}").contains("SENTINEL"));
}

/// The SIMD decoder agrees with the scalar reference engine on every verdict:
/// valid text of every length around the vector widths, and text broken by a
/// bad byte at each position, a missing pad or non-canonical trailing bits.
#[test]
fn decode_b64_agrees_with_the_scalar_engine() {
    let mut out = Vec::new();
    for len in 0..200usize {
        let raw: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
        let text = B64.encode(&raw);
        assert!(decode_b64(text.as_bytes(), &mut out), "{len}");
        assert_eq!(out, raw, "{len}");
        for at in 0..text.len() {
            for bad in [b'*', b' ', b'\n', 0xff] {
                let mut t = text.clone().into_bytes();
                t[at] = bad;
                assert!(!decode_b64(&t, &mut out), "{len} {at} {bad}");
            }
        }
        if text.ends_with('=') {
            let unpadded = text.trim_end_matches('=');
            assert!(!decode_b64(unpadded.as_bytes(), &mut out), "{len}");
        }
    }
    // "QQ==" is canonical for "A"; "QR==" has trailing bits set.
    assert!(decode_b64(b"QQ==", &mut out) && out == b"A");
    assert!(!decode_b64(b"QR==", &mut out));
    assert!(!decode_b64(b"QQ=", &mut out));
    assert!(!decode_b64(b"Q===", &mut out));
}

proptest::proptest! {
    #[test]
    fn decode_b64_matches_the_reference(text in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
        let mut out = Vec::new();
        let ok = decode_b64(&text, &mut out);
        let reference = B64.decode(&text);
        proptest::prop_assert_eq!(ok, reference.is_ok());
        if let Ok(r) = reference {
            proptest::prop_assert_eq!(out, r);
        }
    }
}

#[test]
fn a_launch_needs_a_background_command_and_an_acknowledgement() {
    let fg = Command::new(["sleep", "1"]);
    let e = fg.check_launch().unwrap_err();
    assert_eq!(
        (e.category(), e.evidence(), e.reason()),
        (
            Category::Validation,
            Evidence::NotDispatched,
            crate::Reason::LaunchRequiresBackground
        )
    );
    assert!(fg.clone().background(true).check_launch().is_ok());
    let launched = Launched { pid: 7 };
    assert_eq!(
        ExecOutcome::Launched(launched).into_launched(),
        Ok(launched)
    );
    let exited = ExecOutcome::Exited(ExecOutput::empty(OutputEncoding::Bytes));
    let e = exited.into_launched().unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::Protocol, crate::Reason::LaunchWithoutAck)
    );
}
