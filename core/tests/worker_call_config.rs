//! Decisions that used to live in the shells and are now one place in
//! core: the exchange configuration of each call and the connect plan.
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use smolbox_core::Reason;
mod ws_support;

use std::path::Path;
use std::time::Duration;

use smolbox_core::exec::{Command, ExecCall, ExecStreamCall, OutputAllowance};
use smolbox_core::http1::{Request, ResponseHead};
use smolbox_core::worker::{
    Budgets, ConnectPlan, Endpoint, EndpointConfig, Health, Profile, Readyz, Version, WorkerCall,
};
use smolbox_core::{Category, Error, Evidence, Operation, Secret};
use ws_support::t0;

fn endpoint(url: &str, ca: Option<&str>) -> Endpoint {
    Endpoint::new(EndpointConfig {
        id: "w1".into(),
        base_url: url.into(),
        token: Some(Secret::new("tok")),
        ca_file: ca.map(Into::into),
        allow_insecure_loopback: url.starts_with("http://"),
        budgets: Budgets {
            receive_idle: Duration::from_secs(7),
            ..Budgets::default()
        },
        ..EndpointConfig::default()
    })
    .unwrap()
}

/// A call that wants no reply body at all.
struct NoBody;

impl WorkerCall for NoBody {
    type Output = ();
    fn operation(&self) -> Operation {
        Operation::Readyz
    }
    fn request(&self) -> Result<Request, Error> {
        Readyz.request()
    }
    fn decode(&self, _: &ResponseHead, _: &[u8]) -> Result<(), Error> {
        Ok(())
    }
    fn max_response_bytes(&self) -> Option<u64> {
        Some(0)
    }
}

#[test]
fn each_call_gets_its_cap_and_a_zero_cap_the_smallest_the_exchange_takes() {
    let ep = endpoint("http://127.0.0.1:8080", None);
    let at = t0();
    assert_eq!(ep.exchange_config_for(&Readyz, at).max_response_body, 4_096);
    assert_eq!(ep.exchange_config_for(&NoBody, at).max_response_body, 1);
    let health = ep.exchange_config_for(&Health::new(), at);
    assert_eq!(
        health.max_response_body,
        Budgets::DEFAULT_MAX_RESPONSE_BYTES
    );
    assert_eq!(health.idle_timeout, Some(Duration::from_secs(7)));
    assert_eq!(health.deadline, at);
}

#[test]
fn extended_exec_runs_without_the_receive_idle_timeout() {
    let ep = endpoint("http://127.0.0.1:8080", None);
    let profile = Profile::known(Version::V1_22_0);
    let at = t0();
    let cmd = Command::new(["true"]);
    // 300 s is the longest ordinary timeout; 301 s makes it extended.
    for (secs, idle) in [(300, Some(Duration::from_secs(7))), (301, None)] {
        let c = cmd.clone().timeout_secs(secs);
        let call = ExecCall::new(&profile, "m", c.clone(), OutputAllowance::DEFAULT).unwrap();
        assert_eq!(
            ep.exchange_config_for(&call, at).idle_timeout,
            idle,
            "{secs}"
        );
        let stream = ExecStreamCall::new(&profile, "m", c, OutputAllowance::DEFAULT).unwrap();
        assert_eq!(
            ep.exchange_config_for(&stream, at).idle_timeout,
            idle,
            "{secs}"
        );
    }
}

#[test]
fn https_needs_a_ca_file_to_connect() {
    let e = endpoint("https://worker.example.com", None)
        .connect_plan()
        .unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence(), e.reason()),
        (
            Category::UnsupportedCapability,
            Operation::Config,
            Evidence::NotDispatched,
            Reason::TlsRequiresCaFile
        )
    );
    let ep = endpoint("https://worker.example.com:8443", Some("/etc/ca.pem"));
    assert_eq!(
        ep.connect_plan().unwrap(),
        ConnectPlan::Tls {
            host: "worker.example.com",
            port: 8443,
            ca_file: Some(Path::new("/etc/ca.pem")),
            system_roots: false,
            client_identity: None,
        }
    );
    // System roots alone are trust enough for a plan; beside a CA file
    // they are both in it. They are refused for plain HTTP.
    let with_system = |url: &str, ca: Option<&str>| {
        Endpoint::new(EndpointConfig {
            id: "w1".into(),
            base_url: url.into(),
            token: Some(Secret::new("tok")),
            ca_file: ca.map(Into::into),
            system_roots: true,
            allow_insecure_loopback: url.starts_with("http://"),
            ..EndpointConfig::default()
        })
    };
    let ep = with_system("https://worker.example.com:8443", None).unwrap();
    assert_eq!(
        ep.connect_plan().unwrap(),
        ConnectPlan::Tls {
            host: "worker.example.com",
            port: 8443,
            ca_file: None,
            system_roots: true,
            client_identity: None,
        }
    );
    let ep = with_system("https://worker.example.com:8443", Some("/etc/ca.pem")).unwrap();
    assert!(matches!(
        ep.connect_plan().unwrap(),
        ConnectPlan::Tls {
            ca_file: Some(_),
            system_roots: true,
            ..
        }
    ));
    assert_eq!(
        with_system("http://127.0.0.1:9", None)
            .err()
            .map(|e| e.reason()),
        Some(Reason::CaFileRequiresHttps)
    );
    assert_eq!(
        endpoint("http://127.0.0.1:9", None).connect_plan().unwrap(),
        ConnectPlan::Tcp {
            host: "127.0.0.1",
            port: 9
        }
    );
}

#[test]
fn the_terminal_call_gates_the_version_and_derives_its_config() {
    use smolbox_core::terminal::{MAX_WRITE_WAIT, TerminalCall, TerminalSpec};
    let spec = TerminalSpec::new("/bin/sh");
    let e = TerminalCall::new(&Profile::known(Version::V1_16_1), "m", &spec).unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence()),
        (
            Category::UnsupportedCapability,
            Operation::TerminalOpen,
            Evidence::NotDispatched
        )
    );
    let call = TerminalCall::new(&Profile::known(Version::V1_17_0), "m", &spec).unwrap();
    // Every terminal inspects its machine first (C7.4): a plain image machine.
    let check = call.image_check();
    assert_eq!(check.operation(), Operation::TerminalOpen);
    assert_eq!(
        check.inspect().request().unwrap().target,
        "/api/v1/machines/m"
    );
    let ep = endpoint("http://127.0.0.1:8080", None);
    let config = call.config(&ep);
    // Connect budget 1 s by default: write wait min(connect, 1 s), the
    // handshake min(operation, 30 s, connect).
    assert_eq!(
        config.write_wait,
        MAX_WRITE_WAIT.min(Budgets::DEFAULT_CONNECT)
    );
    assert_eq!(config.handshake_timeout, Budgets::DEFAULT_CONNECT);
    assert_eq!(config.max_request_bytes, Budgets::DEFAULT_MAX_REQUEST_BODY);
}
