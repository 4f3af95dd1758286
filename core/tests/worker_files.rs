//! Files: TV25 and the C6.1–C6.3 acceptance rules.
#![allow(clippy::unwrap_used)] // tests unwrap known-good values

use smolbox_core::Reason;
mod worker_support;

use bytes::Bytes;
use smolbox_core::worker::{
    Budgets, Download, FileBudget, GuestPath, MachineName, PathPolicy, Profile, Upload, Version,
    WorkerCall,
};
use smolbox_core::{Category, Evidence, Operation};
use worker_support::*;

const HELLO_SHA: &str = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";

fn dev() -> MachineName {
    MachineName::new("dev").unwrap()
}

fn p(s: &str) -> GuestPath {
    GuestPath::new(s).unwrap()
}

fn budget(allowance: u64) -> FileBudget {
    FileBudget::new(allowance, &Budgets::default()).unwrap()
}

fn upload(path: &str, data: &'static [u8], sha: &str) -> Result<Upload, smolbox_core::Error> {
    Upload::new(
        &v192(),
        &PathPolicy::default(),
        &budget(1_048_576),
        dev(),
        p(path),
        Bytes::from_static(data),
        sha,
    )
}

#[test]
fn tv25_upload() {
    let u = upload("/workspace/hello.txt", b"hello\n", HELLO_SHA).unwrap();
    let req = u.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("PUT", "/api/v1/machines/dev/files/workspace/hello.txt")
    );
    assert_eq!(req.content_type, Some("application/octet-stream"));
    assert_eq!(&req.body[..], b"hello\n");
    let ok = br#"{"path":"/workspace/hello.txt","size":6}"#;
    let r = u.decode(&json(200, ok), ok).unwrap();
    assert_eq!((r.path.as_str(), r.size), ("/workspace/hello.txt", 6));
    for bad in [
        &br#"{"path":"/workspace/other.txt","size":6}"#[..],
        br#"{"path":"/workspace/hello.txt","size":7}"#,
        br#"{"path":"/workspace/hello.txt","size":6,"mode":420}"#,
        br#"{"path":"/workspace/hello.txt"}"#,
    ] {
        let e = u.decode(&json(200, bad), bad).unwrap_err();
        assert_err(
            &e,
            Category::Protocol,
            Operation::Upload,
            Evidence::DispatchUncertain,
        );
    }
}

#[test]
fn digest_is_verified_before_any_request() {
    let wrong = HELLO_SHA.replace('5', "6");
    let e = upload("/workspace/hello.txt", b"hello\n", &wrong).unwrap_err();
    assert_err(
        &e,
        Category::Validation,
        Operation::Upload,
        Evidence::NotDispatched,
    );
    assert_eq!(e.reason(), Reason::Sha256Mismatch);
    let upper = HELLO_SHA.to_uppercase();
    assert_eq!(
        upload("/workspace/hello.txt", b"hello\n", &upper)
            .unwrap_err()
            .reason(),
        Reason::InvalidSha256
    );
    assert_eq!(
        upload("/workspace/hello.txt", b"hello\n", &HELLO_SHA[1..])
            .unwrap_err()
            .reason(),
        Reason::InvalidSha256
    );
}

#[test]
fn upload_size_bounds() {
    use sha2::{Digest, Sha256};
    let mk = |n: usize, allowance: u64, budgets: Budgets, profile: &Profile| {
        let data = Bytes::from(vec![b'x'; n]);
        let sha: String = Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Upload::new(
            profile,
            &PathPolicy::default(),
            &FileBudget::new(allowance, &budgets).unwrap(),
            dev(),
            p("/workspace/f"),
            data,
            &sha,
        )
    };
    let d = Budgets::default();
    assert!(mk(100, 100, d, &v192()).is_ok());
    let e = mk(101, 100, d, &v192()).unwrap_err();
    assert_eq!(
        (e.reason(), e.limit().unwrap().max),
        (Reason::FileAllowanceExceeded, 100)
    );
    let small = Budgets {
        max_request_body: 50,
        ..d
    };
    assert!(mk(50, 100, small, &v192()).is_ok());
    let e = mk(51, 100, small, &v192()).unwrap_err();
    assert_err(
        &e,
        Category::Validation,
        Operation::RequestSize,
        Evidence::NotDispatched,
    );
    // > 1 MiB needs the 1.17.0+ large-file feature.
    let big = Budgets {
        max_request_body: 16_777_216,
        ..d
    };
    assert!(mk(1_048_576, 2_000_000, big, &v192()).is_ok());
    let e = mk(1_048_577, 2_000_000, big, &v192()).unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedCapability,
        Operation::Upload,
        Evidence::NotDispatched,
    );
    assert!(mk(1_048_577, 2_000_000, big, &Profile::known(Version::V1_17_0)).is_ok());
    assert!(mk(1_048_577, 2_000_000, big, &Profile::known(Version::V1_16_1)).is_err());
}

#[test]
fn file_allowance_range() {
    let d = Budgets::default();
    assert!(FileBudget::new(1, &d).is_ok());
    assert!(FileBudget::new(16_777_216, &d).is_ok());
    assert!(FileBudget::new(0, &d).is_err());
    assert!(FileBudget::new(16_777_217, &d).is_err());
}

#[test]
fn tv25_download() {
    let d = Download::new(
        &v192(),
        &PathPolicy::default(),
        &budget(1_048_576),
        dev(),
        p("/workspace/hello.txt"),
        6,
    )
    .unwrap();
    let req = d.request().unwrap();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("GET", "/api/v1/machines/dev/files/workspace/hello.txt")
    );
    let h = head(200, Some("application/octet-stream"), b"hello\n");
    assert_eq!(&d.decode(&h, b"hello\n").unwrap()[..], b"hello\n");
    // Missing file: 500 JSON in 1.9.2, not 404.
    let b = br#"{"error":"no such file","code":"INTERNAL_ERROR"}"#;
    let e = d.decode(&json(500, b), b).unwrap_err();
    assert_err(
        &e,
        Category::Protocol,
        Operation::Download,
        Evidence::DispatchUncertain,
    );
    // Wrong media type.
    assert!(
        d.decode(&head(200, Some("text/plain"), b"hello\n"), b"hello\n")
            .is_err()
    );
}

#[test]
fn download_limit_and_cap() {
    let mk = |max: u64, budgets: Budgets| {
        Download::new(
            &v122(),
            &PathPolicy::default(),
            &FileBudget::new(1_000, &budgets).unwrap(),
            dev(),
            p("/workspace/a"),
            max,
        )
    };
    let d = Budgets::default();
    assert!(mk(0, d).is_err());
    assert!(mk(1, d).is_ok());
    assert!(mk(1_000, d).is_ok());
    assert_eq!(
        mk(1_001, d).unwrap_err().reason(),
        Reason::DownloadLimitOutOfRange
    );
    // cap = min(max, max response bytes)
    assert_eq!(
        mk(
            900,
            Budgets {
                max_response_bytes: 500,
                ..d
            }
        )
        .unwrap()
        .cap(),
        500
    );
    let dl = mk(5, d).unwrap();
    assert_eq!(dl.cap(), 5);
    let h = head(200, Some("application/octet-stream"), b"12345");
    assert!(dl.decode(&h, b"12345").is_ok());
    let h6 = head(200, Some("application/octet-stream"), b"123456");
    let e = dl.decode(&h6, b"123456").unwrap_err();
    assert_err(
        &e,
        Category::OutputLimit,
        Operation::Download,
        Evidence::DispatchUncertain,
    );
    // Incremental: refused from the declared length, and per chunk.
    let mut s = dl.sink();
    assert!(s.handle_head(&h6).is_err());
    let mut s = dl.sink();
    let chunked = smolbox_core::http1::ResponseHead {
        content_length: None,
        chunked: true,
        ..h
    };
    s.handle_head(&chunked).unwrap();
    s.handle_body(b"123").unwrap();
    s.handle_body(b"45").unwrap();
    assert!(s.handle_body(b"6").is_err());
}

#[test]
fn path_encoding_c6_1() {
    assert_eq!(
        p("/workspace/a b/ü~x.txt").encoded(),
        "workspace/a%20b/%C3%BC~x.txt"
    );
    let policy = PathPolicy::new(vec![p("/")], vec![p("/")], vec![p("/")]).unwrap();
    let u = Upload::new(
        &v122(),
        &policy,
        &budget(10),
        dev(),
        p("/data/a?b#c"),
        Bytes::from_static(b"hello\n"),
        HELLO_SHA,
    )
    .unwrap();
    assert_eq!(
        u.request().unwrap().target,
        "/api/v1/machines/dev/files/data/a%3Fb%23c"
    );
}

#[test]
fn guest_path_syntax_c6_2() {
    for ok in [
        "/",
        "/workspace",
        "/workspace/a.txt",
        "/a/b/c",
        "/.hidden",
        "/a..b",
    ] {
        assert!(GuestPath::new(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        "workspace",
        "/workspace/",
        "//a",
        "/a//b",
        "/a/./b",
        "/a/../b",
        "/a/%2e",
        "/a\\b",
        "/a\0b",
        "/.",
        "/..",
    ] {
        assert!(GuestPath::new(bad).is_err(), "{bad:?}");
    }
    let max = format!("/{}", "a".repeat(1_023));
    assert!(GuestPath::new(&max).is_ok());
    assert!(GuestPath::new(&format!("{max}a")).is_err());
}

#[test]
fn guest_path_policy_c6_2() {
    let app = p("/app");
    assert!(app.covers(&p("/app")) && app.covers(&p("/app/x")));
    assert!(!app.covers(&p("/application")));
    assert!(p("/").covers(&p("/anything/at/all")));
    let policy = PathPolicy::new(
        vec![p("/"), p("/app"), p("/app")],
        vec![],
        vec![p("/workspace")],
    )
    .unwrap();
    assert_eq!(policy.upload_roots().len(), 2); // sorted + deduped
    assert!(policy.allows_upload(&p("/etc/x")));
    assert!(!policy.allows_upload(&p("/"))); // never a file target
    assert!(!policy.allows_download(&p("/app/x"))); // empty list denies
    assert!(PathPolicy::new(vec![], vec![], vec![]).is_err()); // workdir list non-empty
    let roots = |n: usize| (0..n).map(|i| p(&format!("/r{i}"))).collect::<Vec<_>>();
    assert!(PathPolicy::new(roots(32), roots(32), roots(32)).is_ok());
    assert!(PathPolicy::new(roots(33), vec![], roots(1)).is_err());
    // Superset.
    let wide = PathPolicy::new(vec![p("/")], vec![p("/")], vec![p("/")]).unwrap();
    assert!(wide.is_superset_of(&PathPolicy::default()));
    assert!(!PathPolicy::default().is_superset_of(&wide));
    // Out-of-policy uploads are refused before anything is sent.
    let e = Upload::new(
        &v122(),
        &PathPolicy::default(),
        &budget(10),
        dev(),
        p("/etc/passwd"),
        Bytes::from_static(b"hello\n"),
        HELLO_SHA,
    )
    .unwrap_err();
    assert_err(
        &e,
        Category::Validation,
        Operation::Upload,
        Evidence::NotDispatched,
    );
    // Outside /workspace needs 1.17.0+.
    let e = Upload::new(
        &v192(),
        &wide,
        &budget(10),
        dev(),
        p("/etc/x"),
        Bytes::from_static(b"hello\n"),
        HELLO_SHA,
    )
    .unwrap_err();
    assert_eq!(e.category(), Category::UnsupportedCapability);
    let e = Download::new(&v192(), &wide, &budget(10), dev(), p("/etc/x"), 5).unwrap_err();
    assert_err(
        &e,
        Category::UnsupportedCapability,
        Operation::Download,
        Evidence::NotDispatched,
    );
}

/// C6.1: a file over 1 MiB or outside `/workspace` needs an image machine:
/// on 1.17.0+ the call carries the inspect (attributed to its own
/// operation); a small file under `/workspace` carries none.
#[test]
fn large_or_out_of_root_files_carry_the_image_preflight() {
    let wide = PathPolicy::new(vec![p("/")], vec![p("/")], vec![p("/")]).unwrap();
    let budgets = Budgets {
        max_request_body: 2 * 1_048_576,
        ..Budgets::default()
    };
    let big = FileBudget::new(2 * 1_048_576, &budgets).unwrap();
    let mib = 1_048_576usize;
    let up = |path: &str, data: Bytes| {
        let sha = sha256_hex(&data);
        Upload::new(&v122(), &wide, &big, dev(), p(path), data, &sha).unwrap()
    };
    let small = up("/workspace/a", Bytes::from_static(b"hello\n"));
    assert!(small.image_check().is_none());
    let at_limit = up("/workspace/a", Bytes::from(vec![0u8; mib]));
    assert!(at_limit.image_check().is_none(), "1 MiB is small");
    let over = up("/workspace/a", Bytes::from(vec![0u8; mib + 1]));
    assert_eq!(over.image_check().unwrap().operation(), Operation::Upload);
    let out = up("/etc/a", Bytes::from_static(b"hello\n"));
    assert_eq!(out.image_check().unwrap().operation(), Operation::Upload);
    let down =
        |path: &str, max: u64| Download::new(&v122(), &wide, &big, dev(), p(path), max).unwrap();
    assert!(down("/workspace/a", 1_048_576).image_check().is_none());
    let check = down("/workspace/a", 1_048_577);
    assert_eq!(
        check.image_check().unwrap().operation(),
        Operation::Download
    );
    assert_eq!(
        check
            .image_check()
            .unwrap()
            .inspect()
            .request()
            .unwrap()
            .target,
        "/api/v1/machines/dev"
    );
    assert!(down("/etc/a", 5).image_check().is_some());
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn byte_budgets_c6_3() {
    use smolbox_core::worker::check_byte_budgets;
    let d = Budgets::default();
    let client = |a: u64, b: Budgets| FileBudget::new(a, &b).unwrap();
    let mib = 1_048_576;
    // Defaults: 1 MiB per file, 4 MiB per direction.
    check_byte_budgets(mib, 4 * mib, &client(mib, d)).unwrap();
    // Per-file range 1 B–16 MiB, per-direction 1 B–64 MiB and ≥ per-file.
    let wide = Budgets {
        max_request_body: 16 * mib,
        max_response_bytes: 32 * mib,
        ..d
    };
    check_byte_budgets(16 * mib, 64 * mib, &client(16 * mib, wide)).unwrap();
    assert!(check_byte_budgets(16 * mib + 1, 64 * mib, &client(16 * mib, wide)).is_err());
    assert!(check_byte_budgets(16 * mib, 64 * mib + 1, &client(16 * mib, wide)).is_err());
    assert!(check_byte_budgets(0, 1, &client(1, d)).is_err());
    check_byte_budgets(1, 1, &client(1, d)).unwrap();
    assert_eq!(
        check_byte_budgets(2, 1, &client(2, d))
            .unwrap_err()
            .reason(),
        Reason::PerDirectionBelowPerFile
    );
    // The client allowance must cover the profile's per-file budget.
    assert_eq!(
        check_byte_budgets(mib, 4 * mib, &client(mib - 1, d))
            .unwrap_err()
            .reason(),
        Reason::ClientAllowanceBelowProfile
    );
    // Above 1 MiB the request and response caps must cover per-file.
    let big = 2 * mib;
    assert_eq!(
        check_byte_budgets(big, 4 * mib, &client(big, d))
            .unwrap_err()
            .reason(),
        Reason::RequestCapBelowPerFile
    );
    let req_ok = Budgets {
        max_request_body: big,
        max_response_bytes: big - 1,
        ..d
    };
    assert_eq!(
        check_byte_budgets(big, 4 * mib, &client(big, req_ok))
            .unwrap_err()
            .reason(),
        Reason::ResponseCapBelowPerFile
    );
    let both = Budgets {
        max_request_body: big,
        max_response_bytes: big,
        ..d
    };
    check_byte_budgets(big, 4 * mib, &client(big, both)).unwrap();
}
