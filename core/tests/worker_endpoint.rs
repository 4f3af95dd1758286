//! Endpoint configuration (features C1.1): AC-1.1.1–AC-1.1.4 and every
//! bound at N and N+1.
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use smolbox_core::Reason;
use std::path::{Path, PathBuf};
use std::time::Duration;

use smolbox_core::worker::{Budgets, Endpoint, EndpointConfig, Scheme, Target, WorkerId};
use smolbox_core::{Category, Evidence, Operation, Secret};

fn cfg(url: &str) -> EndpointConfig {
    EndpointConfig {
        id: "w1".into(),
        base_url: url.into(),
        ..EndpointConfig::default()
    }
}

fn https(url: &str) -> EndpointConfig {
    EndpointConfig {
        token: Some(Secret::new("SENTINEL-TOKEN-42")),
        ..cfg(url)
    }
}

#[track_caller]
fn refused(c: EndpointConfig) -> Reason {
    let e = Endpoint::new(c).unwrap_err();
    assert_eq!(
        (e.category(), e.operation(), e.evidence()),
        (
            Category::Validation,
            Operation::Config,
            Evidence::NotDispatched
        )
    );
    e.reason()
}

#[test]
fn ac_1_1_1_construction_does_no_io() {
    // A CA file that does not exist is accepted at construction; only the
    // separate file check (the shell's I/O) refuses it.
    let c = EndpointConfig {
        ca_file: Some(PathBuf::from("/nonexistent/ca.pem")),
        ..https("https://worker.example.com")
    };
    let ep = Endpoint::new(c).unwrap();
    assert!(ep.check_files(|_| false).is_err());
    assert!(
        ep.check_files(|p| p == Path::new("/nonexistent/ca.pem"))
            .is_ok()
    );
}

#[test]
fn ac_1_1_2_https_rules() {
    assert_eq!(
        refused(cfg("https://worker.example.com")),
        Reason::HttpsRequiresToken
    );
    let c = EndpointConfig {
        unix_socket: Some("/run/smolvm.sock".into()),
        ..https("https://localhost")
    };
    assert_eq!(refused(c), Reason::SocketRequiresPlainHttp);
    let c = EndpointConfig {
        allow_insecure_loopback: true,
        ..https("https://localhost")
    };
    assert_eq!(refused(c), Reason::InsecureWithHttps);
    let ep = Endpoint::new(https("https://Worker.Example.com:8443/")).unwrap();
    assert_eq!(ep.scheme(), Scheme::Https);
    assert_eq!(ep.tls_server_name(), Some("worker.example.com"));
    assert_eq!(ep.host_header(), "worker.example.com:8443");
    assert_eq!(
        ep.target(),
        Target::Tcp {
            host: "worker.example.com",
            port: 8443
        }
    );
    let ep = Endpoint::new(https("https://worker.example.com")).unwrap();
    assert_eq!(
        (ep.port(), ep.host_header()),
        (443, "worker.example.com".to_string())
    );
}

#[test]
fn ac_1_1_3_plain_http_only_on_loopback() {
    assert_eq!(
        refused(cfg("http://10.0.0.5:80")),
        Reason::PlainHttpRequiresLoopback
    );
    let c = EndpointConfig {
        allow_insecure_loopback: true,
        ..cfg("http://10.0.0.5:80")
    };
    assert_eq!(refused(c), Reason::PlainHttpRequiresLoopback);
    assert_eq!(
        refused(cfg("http://127.0.0.1:19470")),
        Reason::PlainHttpRequiresOptIn
    );
    for host in ["127.0.0.1", "localhost", "[::1]"] {
        let c = EndpointConfig {
            allow_insecure_loopback: true,
            ..cfg(&format!("http://{host}:19470"))
        };
        let ep = Endpoint::new(c).unwrap();
        assert_eq!(ep.tls_server_name(), None);
        assert_eq!(ep.host_header(), format!("{host}:19470"));
    }
    let c = EndpointConfig {
        unix_socket: Some("/run/user/1000/smolvm.sock".into()),
        ..cfg("http://localhost")
    };
    let ep = Endpoint::new(c).unwrap();
    assert_eq!(
        ep.target(),
        Target::Unix(Path::new("/run/user/1000/smolvm.sock"))
    );
    assert_eq!(ep.host_header(), "localhost");
}

#[test]
fn ac_1_1_4_token_never_in_debug() {
    let ep = Endpoint::new(https("https://worker.example.com")).unwrap();
    let d = format!("{ep:?}");
    assert!(!d.contains("SENTINEL"), "{d}");
    assert_eq!(ep.token().unwrap().expose(), "SENTINEL-TOKEN-42");
    let c = https("https://worker.example.com");
    assert!(!format!("{c:?}").contains("SENTINEL"));
}

#[test]
fn base_url_rules() {
    let ok = |u: &str| {
        Endpoint::new(https(u)).unwrap();
    };
    ok("https://a");
    ok("https://a:1");
    ok("https://a:65535");
    ok("HTTPS://a/");
    ok("https://[2001:db8::1]:9");
    for bad in [
        "ftp://a",
        "https://",
        "https://a:0",
        "https://a:65536",
        "https://a:",
        "https://a:x",
        "https://u@a",
        "https://a/path",
        "https://a?x=1",
        "https://a#f",
        "https://a b",
        "https://[zz]",
        "https://999.1.1.1",
        "https://a..b",
        "https://-a.b",
        "https://a-.b",
        "https://a.b.",
    ] {
        assert!(Endpoint::new(https(bad)).is_err(), "{bad}");
    }
    // Length: 2,048 accepted, 2,049 refused.
    let host = "a".repeat(2_048 - "https://".len());
    ok(&format!("https://{host}"));
    let long = format!("https://{host}a");
    assert_eq!(refused(https(&long)), Reason::BaseUrlTooLong);
}

#[test]
fn token_bounds() {
    let with = |t: &str| EndpointConfig {
        token: Some(Secret::new(t)),
        ..cfg("https://a")
    };
    Endpoint::new(with(&"t".repeat(4_096))).unwrap();
    assert_eq!(refused(with(&"t".repeat(4_097))), Reason::InvalidToken);
    assert_eq!(refused(with("")), Reason::InvalidToken);
    assert_eq!(refused(with("has space")), Reason::InvalidToken);
    assert_eq!(refused(with("tab\t")), Reason::InvalidToken);
    Endpoint::new(with("!~")).unwrap();
}

#[test]
fn ca_and_client_identity_rules() {
    let c = EndpointConfig {
        ca_file: Some("/etc/ca.pem".into()),
        allow_insecure_loopback: true,
        ..cfg("http://localhost:1")
    };
    assert_eq!(refused(c), Reason::CaFileRequiresHttps);
    let c = EndpointConfig {
        client_cert: Some("/etc/c.pem".into()),
        ..https("https://a")
    };
    assert_eq!(refused(c), Reason::ClientCertAndKeyGoTogether);
    let c = EndpointConfig {
        client_cert: Some("/etc/c.pem".into()),
        client_key: Some("/etc/k.pem".into()),
        ..https("https://a")
    };
    let ep = Endpoint::new(c).unwrap();
    assert_eq!(
        ep.client_identity(),
        Some((Path::new("/etc/c.pem"), Path::new("/etc/k.pem")))
    );
    assert!(ep.check_files(|p| p != Path::new("/etc/k.pem")).is_err());
    assert!(ep.check_files(|_| true).is_ok());
}

#[test]
fn socket_path_bounds() {
    let with = |s: String| EndpointConfig {
        unix_socket: Some(s),
        ..cfg("http://127.0.0.1")
    };
    Endpoint::new(with(format!("/{}", "s".repeat(99)))).unwrap();
    assert_eq!(
        refused(with(format!("/{}", "s".repeat(100)))),
        Reason::InvalidSocketPath
    );
    assert_eq!(
        refused(with("relative.sock".into())),
        Reason::InvalidSocketPath
    );
    assert_eq!(refused(with("/a\0b".into())), Reason::InvalidSocketPath);
    // Only with a loopback URL.
    let c = EndpointConfig {
        unix_socket: Some("/run/s.sock".into()),
        ..cfg("http://10.0.0.5")
    };
    assert!(Endpoint::new(c).is_err());
}

#[test]
fn worker_id_grammar() {
    WorkerId::new(&"a".repeat(64)).unwrap();
    assert!(WorkerId::new(&"a".repeat(65)).is_err());
    WorkerId::new("w-1.a_b").unwrap();
    for bad in ["", "-w", ".w", "w/1", "w 1", "wé"] {
        assert!(WorkerId::new(bad).is_err(), "{bad}");
    }
}

#[test]
fn budgets_defaults_and_ranges() {
    let d = Budgets::default();
    assert_eq!(d.connect, Duration::from_millis(1_000));
    assert_eq!(d.pool_checkout, Duration::from_millis(5_000));
    assert_eq!(d.receive_idle, Duration::from_millis(15_000));
    assert_eq!(d.operation, Duration::from_millis(30_000));
    assert_eq!(d.max_request_body, 1_048_576);
    assert_eq!(d.max_response_bytes, 16_777_216);
    d.validate().unwrap();
    type Set = fn(&mut Budgets, u64);
    let cases: [(Set, u64); 6] = [
        (|b, v| b.connect = Duration::from_millis(v), 900_000),
        (|b, v| b.pool_checkout = Duration::from_millis(v), 900_000),
        (|b, v| b.receive_idle = Duration::from_millis(v), 86_460_000),
        (|b, v| b.operation = Duration::from_millis(v), 86_460_000),
        (|b, v| b.max_request_body = v, 16_777_216),
        (|b, v| b.max_response_bytes = v, 33_554_432),
    ];
    for (set, max) in cases {
        for (v, ok) in [(0, false), (1, true), (max, true), (max + 1, false)] {
            let mut b = Budgets::default();
            set(&mut b, v);
            assert_eq!(b.validate().is_ok(), ok, "{v} of max {max}");
            let c = EndpointConfig {
                budgets: b,
                ..https("https://a")
            };
            assert_eq!(Endpoint::new(c).is_ok(), ok);
        }
    }
}
