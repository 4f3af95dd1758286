//! worker-api.md §14 test vectors that need no VM, replayed byte for byte
//! where the vector is exact (status, content type, body).
#![allow(clippy::unwrap_used)] // tests

mod common;

use common::*;
use smolbox_devworker::DevWorker;

const JSON: Option<&str> = Some("application/json");
const TEXT: Option<&str> = Some("text/plain; charset=utf-8");
const SSE: Option<&str> = Some("text/event-stream");

#[tokio::test]
async fn tv1_tv2_tv3_tv4_node_endpoints() {
    let w = worker().await;
    let r = get(&w, "/readyz").await;
    r.assert(200, None, "");
    assert_eq!(r.header("content-length"), Some("0"));
    assert_eq!(
        r.header("vary"),
        Some("origin, access-control-request-method, access-control-request-headers")
    );

    let r = get(&w, "/health").await;
    assert_eq!(r.header("content-type"), JSON);
    let text = r.text();
    let prefix =
        r#"{"status":"ok","version":"1.9.2","machines":{"total":0,"running":0},"uptime_seconds":"#;
    assert!(text.starts_with(prefix) && text.ends_with('}'), "{text}");
    assert!(
        text[prefix.len()..text.len() - 1]
            .bytes()
            .all(|b| b.is_ascii_digit())
    );

    let r = get(&w, "/capacity").await;
    let text = r.text();
    let prefix = format!(
        r#"{{"allocated_cpus":0,"allocated_memory_mb":0,"used_cpus":0.0,"used_memory_mb":0,"used_disk_gb":0,"boot_id":"{}-"#,
        std::process::id()
    );
    assert!(text.starts_with(&prefix) && text.ends_with("\"}"), "{text}");

    let r = get(&w, "/metrics").await;
    r.assert(
        200,
        TEXT,
        "# TYPE smolvm_api_requests_total counter\n\
smolvm_api_requests_total{method=\"GET\",status=\"200\",path=\"/readyz\"} 1\n\
smolvm_api_requests_total{method=\"GET\",status=\"200\",path=\"/health\"} 1\n\
smolvm_api_requests_total{method=\"GET\",status=\"200\",path=\"/capacity\"} 1\n\
\n# TYPE smolvm_machines_total gauge\nsmolvm_machines_total 0\n\
\n# TYPE smolvm_machines_running gauge\nsmolvm_machines_running 0\n\n",
    );
    w.shutdown().await;
}

#[tokio::test]
async fn tv1_later_version_reports_itself() {
    let w = start(DevWorker::builder().version("1.22.0")).await;
    let t = get(&w, "/health").await.text();
    assert!(t.starts_with(
        r#"{"status":"ok","version":"1.22.0","machines":{"total":0,"running":0},"uptime_seconds":"#
    ));
    assert!(
        DevWorker::builder()
            .version("2.0.0")
            .quiet(true)
            .start()
            .await
            .is_err()
    );
}

#[tokio::test]
async fn tv5_tv6_tv7_create_shapes() {
    let w = worker().await;
    let r = post(
        &w,
        "/api/v1/machines",
        r#"{"name":"wire-test","cpus":1,"memoryMb":256,"storageGb":1,"overlayGb":1,"network":false}"#,
    )
    .await;
    assert_eq!(r.header("content-length"), Some("231"));
    assert_eq!(
        zero_created_at(&r.text()),
        r#"{"name":"wire-test","state":"created","cpus":1,"memoryMb":256,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"forkable":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":0}"#
    );
    let r = post(&w, "/api/v1/machines", "{}").await;
    let t = zero_created_at(&r.text());
    let name = r.json()["name"].as_str().unwrap().to_owned();
    assert!(
        name.len() == 11
            && name.starts_with("vm-")
            && name[3..].bytes().all(|b| b.is_ascii_hexdigit())
    );
    assert_eq!(
        t,
        format!(
            r#"{{"name":"{name}","state":"created","cpus":4,"memoryMb":8192,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":20,"overlayGb":10,"forkable":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":0}}"#
        )
    );
    let r = post(
        &w,
        "/api/v1/machines",
        r#"{"name":"net-test","cpus":2,"memoryMb":512,"network":true,"networkBackend":"virtio-net","allowedHosts":["api.example.com"],"allowedCidrs":["203.0.113.7","198.51.100.0/24"],"ports":[{"host":18090,"guest":80}],"restart":{"policy":"never"},"entrypoint":[],"cmd":[]}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        zero_created_at(&r.text()),
        r#"{"name":"net-test","state":"created","cpus":2,"memoryMb":512,"mounts":[],"ports":[{"host":18090,"guest":80}],"network":true,"gpu":false,"cuda":false,"networkBackend":"virtio-net","allowedCidrs":["203.0.113.7/32","198.51.100.0/24"],"allowedHosts":["api.example.com"],"storageGb":20,"overlayGb":10,"forkable":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":0}"#
    );
    // A body of `[]` creates a machine with defaults (§15).
    assert_eq!(post(&w, "/api/v1/machines", "[]").await.status, 200);
    w.shutdown().await;
}

#[tokio::test]
async fn tv8_create_validation_errors() {
    let w = worker().await;
    let cases = [
        (
            r#"{"name":""}"#,
            r#"{"error":"machine name cannot be empty","code":"BAD_REQUEST"}"#,
        ),
        (
            r#"{"name":"tsi-test","networkBackend":"tsi","ports":[{"host":18091,"guest":80}]}"#,
            r#"{"error":"published ports require networkBackend 'virtio-net' (TSI is outbound-only); omit networkBackend or set it to 'virtio-net'","code":"BAD_REQUEST"}"#,
        ),
        (
            r#"{"name":"p0","ports":[{"host":0,"guest":80}]}"#,
            r#"{"error":"port 0 is not valid for VM port forwarding","code":"BAD_REQUEST"}"#,
        ),
        (
            r#"{"name":"c0","allowedCidrs":["nope"]}"#,
            r#"{"error":"invalid CIDR 'nope': expected format like 10.0.0.0/8 or 1.1.1.1","code":"BAD_REQUEST"}"#,
        ),
        (
            r#"{"name":"c1","cmd":["/bin/true"]}"#,
            r#"{"error":"cmd/entrypoint require an image, from, or registryRef; an imageless machine has no workload to launch them in (use exec instead)","code":"BAD_REQUEST"}"#,
        ),
        (
            r#"{"name":"c2","memoryMb":32}"#,
            r#"{"error":"config operation failed: validate resources: memory must be at least 64 MiB (got 32 MiB)","code":"BAD_REQUEST"}"#,
        ),
        (
            r#"{"name":"c3","cpus":0}"#,
            r#"{"error":"config operation failed: validate resources: CPU count must be at least 1","code":"BAD_REQUEST"}"#,
        ),
        (
            r#"{"name":"c4","from":"/nonexistent/x.smolmachine"}"#,
            r#"{"error":"sidecar file not found: /nonexistent/x.smolmachine","code":"BAD_REQUEST"}"#,
        ),
        (
            r#"{"name":"c5","secrets":{"TOKEN":{"from_env":"HOME"}}}"#,
            r#"{"error":"secret 'TOKEN': source kind 'env' is not allowed in scope Untrusted; secret refs may only be resolved on the trusted local host","code":"BAD_REQUEST"}"#,
        ),
    ];
    for (req, want) in cases {
        post(&w, "/api/v1/machines", req)
            .await
            .assert(400, JSON, want);
    }
    // None of them created a record.
    get(&w, "/api/v1/machines")
        .await
        .assert(200, JSON, r#"{"machines":[]}"#);
    w.shutdown().await;
}

#[tokio::test]
async fn tv9_tv11_tv12_tv14_duplicates_not_found_stop_delete() {
    let w = worker().await;
    get(&w, "/api/v1/machines")
        .await
        .assert(200, JSON, r#"{"machines":[]}"#);
    create(&w, "wire-test").await;
    post(
        &w,
        "/api/v1/machines",
        r#"{"name":"wire-test","cpus":1,"memoryMb":256}"#,
    )
    .await
    .assert(
        409,
        JSON,
        r#"{"error":"machine 'wire-test' already exists","code":"CONFLICT"}"#,
    );
    let nf = r#"{"error":"machine 'nope' not found","code":"NOT_FOUND"}"#;
    get(&w, "/api/v1/machines/nope").await.assert(404, JSON, nf);
    exec(&w, "nope", r#"{"command":["true"]}"#)
        .await
        .assert(404, JSON, nf);
    exec(&w, "wire-test", r#"{"command":[]}"#).await.assert(
        400,
        JSON,
        r#"{"error":"command cannot be empty","code":"BAD_REQUEST"}"#,
    );
    // Stop on a never-started machine returns the stored record (§15).
    let r = post(&w, "/api/v1/machines/wire-test/stop", "").await;
    assert_eq!(
        zero_created_at(&r.text()),
        r#"{"name":"wire-test","state":"created","cpus":1,"memoryMb":256,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":20,"overlayGb":10,"forkable":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":0}"#
    );
    let r = send(
        &w,
        &request("DELETE", "/api/v1/machines/wire-test", &[], b""),
    )
    .await;
    r.assert(200, JSON, r#"{"deleted":"wire-test"}"#);
    assert_eq!(r.header("content-length"), Some("23"));
    send(
        &w,
        &request("DELETE", "/api/v1/machines/wire-test", &[], b""),
    )
    .await
    .assert(
        404,
        JSON,
        r#"{"error":"machine 'wire-test' not found","code":"NOT_FOUND"}"#,
    );
    create(&w, "net-test").await;
    send(
        &w,
        &request("DELETE", "/api/v1/machines/net-test?force=true", &[], b""),
    )
    .await
    .assert(200, JSON, r#"{"deleted":"net-test"}"#);
    w.shutdown().await;
}

#[tokio::test]
async fn tv10_framework_rejections() {
    let w = worker().await;
    create(&w, "wire-test").await;
    create(&w, "s1").await;
    post(&w, "/api/v1/machines", r#"{"name":"#).await.assert(
        400,
        TEXT,
        "Failed to parse the request body as JSON: name: EOF while parsing a value at line 1 column 8",
    );
    send(
        &w,
        &request("POST", "/api/v1/machines", &[], br#"{"name":"x"}"#),
    )
    .await
    .assert(
        415,
        TEXT,
        "Expected request with `Content-Type: application/json`",
    );
    post(&w, "/api/v1/machines", r#"{"name":"x1","cpus":"two"}"#).await.assert(
        422,
        TEXT,
        r#"Failed to deserialize the JSON body into the target type: cpus: invalid type: string "two", expected u8 at line 1 column 25"#,
    );
    exec(&w, "wire-test", r#"{"command":["echo","hi"],"user":"1000"}"#).await.assert(
        422,
        TEXT,
        "Failed to deserialize the JSON body into the target type: user: unknown field `user`, expected one of `command`, `env`, `secrets`, `workdir`, `timeoutSecs`, `stdin`, `background` at line 1 column 31",
    );
    exec(&w, "wire-test", r#"{"command":["echo","hi"],"timeout_secs":5}"#).await.assert(
        422,
        TEXT,
        "Failed to deserialize the JSON body into the target type: timeout_secs: unknown field `timeout_secs`, expected one of `command`, `env`, `secrets`, `workdir`, `timeoutSecs`, `stdin`, `background` at line 1 column 39",
    );
    let big = format!(
        r#"{{"command":["echo","{}"]}}"#,
        "a".repeat(3 * 1024 * 1024)
    );
    exec(&w, "wire-test", &big).await.assert(
        413,
        TEXT,
        "Failed to buffer the request body: length limit exceeded",
    );
    send(
        &w,
        &request(
            "POST",
            "/api/v1/machines/s1/start",
            &[("content-type", "application/json")],
            b"",
        ),
    )
    .await
    .assert(
        400,
        TEXT,
        "Failed to parse the request body as JSON: EOF while parsing a value at line 1 column 0",
    );
    send(
        &w,
        &request("POST", "/api/v1/machines/s1/start?forkable=maybe", &[], b""),
    )
    .await
    .assert(
        400,
        TEXT,
        "Failed to deserialize query string: forkable: provided string was not `true` or `false`",
    );
    get(
        &w,
        "/api/v1/machines/wire-test/exec/interactive?cmd=/bin/sh&cols=80&rows=24",
    )
    .await
    .assert(400, TEXT, "Connection header did not include 'upgrade'");
    // Unknown machine without upgrade headers: 400 text, not 404 (§15).
    assert_eq!(
        get(&w, "/api/v1/machines/ghost/exec/interactive")
            .await
            .status,
        400
    );
    let r = get(&w, "/api/v2/x").await;
    r.assert(404, None, "");
    let r = send(&w, &request("PUT", "/api/v1/machines", &[], b"")).await;
    r.assert(405, None, "");
    assert_eq!(r.header("allow"), Some("POST,GET,HEAD"));
    w.shutdown().await;
}

#[tokio::test]
async fn tv13_tv29_start_variants() {
    let w = worker().await;
    create(&w, "s1").await;
    send(
        &w,
        &request(
            "POST",
            "/api/v1/machines/s1/start",
            &[("content-type", "text/plain")],
            b"x",
        ),
    )
    .await
    .assert(
        415,
        TEXT,
        "Expected request with `Content-Type: application/json`",
    );
    let r = post(&w, "/api/v1/machines/s1/start", "{}").await;
    assert_eq!(r.status, 200);
    let pid = w.machine_pid("s1").unwrap();
    assert_eq!(
        zero_created_at(&r.text()),
        format!(
            r#"{{"name":"s1","state":"running","cpus":1,"memoryMb":256,"pid":{pid},"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":20,"overlayGb":10,"forkable":false,"forkpointHeld":false,"cpuSeconds":0,"cpuMillis":0,"rssMb":1,"diskUsedMb":0,"createdAt":0}}"#
        )
    );
    // Idempotent, and no body without a content type.
    let r = send(&w, &request("POST", "/api/v1/machines/s1/start", &[], b"")).await;
    assert_eq!(r.json()["pid"], pid);
    let r = post(&w, "/api/v1/machines/s1/stop", "").await;
    assert_eq!(r.json()["state"], "stopped");
    assert!(r.json().get("pid").is_none());
    w.shutdown().await;
}

#[tokio::test]
async fn tv13_later_version_shapes() {
    let w = start(DevWorker::builder().version("1.22.0")).await;
    let r = post(&w, "/api/v1/machines", r#"{"name":"wire-a","image":"python:3.12-alpine","cpus":1,"memoryMb":256,"storageGb":1,"overlayGb":1}"#).await;
    assert_eq!(
        zero_created_at(&r.text()),
        r#"{"name":"wire-a","image":"python:3.12-alpine","state":"created","cpus":1,"memoryMb":256,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"storageGb":1,"overlayGb":1,"blockIo":"sync","branchable":false,"forkable":false,"branchpointHeld":false,"forkpointHeld":false,"createdAt":0}"#
    );
    // 1.22.0 accepts an empty JSON start body.
    let r = send(
        &w,
        &request(
            "POST",
            "/api/v1/machines/wire-a/start",
            &[("content-type", "application/json")],
            b"",
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    let pid = w.machine_pid("wire-a").unwrap();
    let t = r.text();
    assert!(
        t.starts_with(&format!(r#"{{"runtime":{{"pid":{pid},"startTime":"#)),
        "{t}"
    );
    assert!(t.contains(r#","name":"wire-a","image":"python:3.12-alpine","state":"running","cpus":1,"memoryMb":256,"pid":"#));
    // `user` is a known exec field in the later contract.
    let r = exec(&w, "wire-a", r#"{"command":["echo","hi"],"user":"1000"}"#).await;
    assert_eq!(r.json()["stdout"], "hi\n");
    w.shutdown().await;
}

#[tokio::test]
async fn tv15_tv16_tv17_buffered_and_background_exec() {
    let w = worker().await;
    create(&w, "fixture").await;
    exec(
        &w,
        "fixture",
        r#"{"command":["sh","-c","printf '\\000\\377\\376'; printf err >&2; exit 7"],"env":[],"workdir":"/workspace","timeoutSecs":30,"background":false,"secrets":{}}"#,
    )
    .await
    .assert(200, JSON, "{\"exitCode\":7,\"stdout\":\"\\u0000\u{fffd}\u{fffd}\",\"stderr\":\"err\",\"stdoutB64\":\"AP/+\",\"stderrB64\":\"ZXJy\"}");
    exec(&w, "fixture", r#"{"command":["echo","api-test-marker"]}"#).await.assert(
        200,
        JSON,
        r#"{"exitCode":0,"stdout":"api-test-marker\n","stderr":"","stdoutB64":"YXBpLXRlc3QtbWFya2VyCg==","stderrB64":""}"#,
    );
    let r = exec(
        &w,
        "fixture",
        r#"{"command":["sleep","30"],"background":true}"#,
    )
    .await;
    let v = r.json();
    let out = v["stdout"].as_str().unwrap();
    let pid: u32 = out
        .strip_prefix("pid=")
        .unwrap()
        .strip_suffix('\n')
        .unwrap()
        .parse()
        .unwrap();
    use base64::Engine;
    assert_eq!(
        v["stdoutB64"],
        base64::engine::general_purpose::STANDARD.encode(out)
    );
    assert_eq!(
        (
            v["exitCode"].as_i64(),
            v["stderr"].as_str(),
            v["stderrB64"].as_str()
        ),
        (Some(0), Some(""), Some(""))
    );
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(r.text().starts_with("{\"exitCode\":0,\"stdout\":\"pid="));
    w.shutdown().await;
}

async fn sse_body(w: &DevWorker, machine: &str, command: &str) -> Resp {
    let r = post(
        w,
        &format!("/api/v1/machines/{machine}/exec/stream"),
        &format!(r#"{{"command":{command}}}"#),
    )
    .await;
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    r
}

#[tokio::test]
async fn tv18_tv19_tv20_tv21_sse_exec_framing() {
    let w = start(DevWorker::builder().limits(smolbox_devworker::Limits {
        stream_output_max: 1000,
        ..Default::default()
    }))
    .await;
    create(&w, "fixture").await;
    sse_body(&w, "fixture", r#"["printf","café\n"]"#)
        .await
        .assert(
            200,
            SSE,
            "event: stdout\ndata: café\ndata: \n\nevent: exit\ndata: {\"exitCode\":0}\n\n",
        );
    let r = sse_body(
        &w,
        "fixture",
        r#"["sh","-c","printf 'hi\\n'; sleep 0.2; printf 'boom\\n' >&2; exit 3"]"#,
    )
    .await;
    r.assert(
        200,
        SSE,
        "event: stdout\ndata: hi\ndata: \n\nevent: stderr\ndata: boom\ndata: \n\nevent: exit\ndata: {\"exitCode\":3}\n\n",
    );
    sse_body(&w, "fixture", r#"["printf","a\r\nb"]"#)
        .await
        .assert(
            200,
            SSE,
            "event: stdout\ndata: a\rdata: \ndata: b\n\nevent: exit\ndata: {\"exitCode\":0}\n\n",
        );
    // Output cap: N bytes end normally, N+1 end with `error` and no `exit`.
    let r = sse_body(&w, "fixture", r#"["head","-c","1000","/dev/zero"]"#).await;
    assert!(
        r.text()
            .ends_with("event: exit\ndata: {\"exitCode\":0}\n\n")
    );
    let r = sse_body(&w, "fixture", r#"["head","-c","1001","/dev/zero"]"#).await;
    let t = r.text();
    assert!(t.ends_with("event: error\ndata: {\"message\":\"streaming output exceeded 1000 byte cap; exec terminated (output truncated)\"}\n\n"), "{t}");
    assert!(!t.contains("event: exit"));
    w.shutdown().await;
}

fn log_worker() -> smolbox_devworker::Builder {
    DevWorker::builder()
}

#[tokio::test]
async fn tv22_tv23_logs() {
    let w = start(log_worker()).await;
    create(&w, "net-test").await;
    get(&w, "/api/v1/machines/net-test/logs").await.assert(
        404,
        JSON,
        "{\"error\":\"machine 'net-test' has no logs yet \u{2014} it may not have been started\",\"code\":\"NOT_FOUND\"}",
    );
    assert_eq!(
        get(&w, "/api/v1/machines/net-test/logs?tail=10001")
            .await
            .status,
        404
    );
    post(&w, "/api/v1/machines/net-test/start", "{}").await;
    let log = w.console_log("net-test");
    write_file(
        &log,
        b"boot: kernel up\n{\"level\":\"info\",\"msg\":\"agent ready\"}\nline with crlf\r\nmulti\x00byte caf\xc3\xa9\npartial-no-newline",
    );
    let r = get(&w, "/api/v1/machines/net-test/logs?tail=2").await;
    r.assert(
        200,
        SSE,
        "data: multi\u{0}byte café\n\ndata: partial-no-newline\n\n",
    );
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    get(&w, "/api/v1/machines/net-test/logs").await.assert(
        200,
        SSE,
        "data: boot: kernel up\n\ndata: {\"level\":\"info\",\"msg\":\"agent ready\"}\n\ndata: line with crlf\n\ndata: multi\u{0}byte café\n\ndata: partial-no-newline\n\n",
    );
    get(&w, "/api/v1/machines/net-test/logs?format=json&tail=100")
        .await
        .assert(
            200,
            SSE,
            "data: {\"level\":\"info\",\"msg\":\"agent ready\"}\n\n",
        );
    get(&w, "/api/v1/machines/net-test/logs?tail=10001")
        .await
        .assert(
            400,
            JSON,
            r#"{"error":"tail value 10001 exceeds maximum of 10000","code":"BAD_REQUEST"}"#,
        );
    get(&w, "/api/v1/machines/net-test/logs?tail=10000").await.assert(
        200,
        SSE,
        "data: boot: kernel up\n\ndata: {\"level\":\"info\",\"msg\":\"agent ready\"}\n\ndata: line with crlf\n\ndata: multi\u{0}byte café\n\ndata: partial-no-newline\n\n",
    );
    write_file(&log, b"a\n\xff\nok\n");
    get(&w, "/api/v1/machines/net-test/logs?tail=3")
        .await
        .assert(
            500,
            JSON,
            r#"{"error":"stream did not contain valid UTF-8","code":"INTERNAL_ERROR"}"#,
        );
    // A full read without tail is lossy and succeeds (§15).
    get(&w, "/api/v1/machines/net-test/logs").await.assert(
        200,
        SSE,
        "data: a\n\ndata: \u{fffd}\n\ndata: ok\n\n",
    );
    w.shutdown().await;
}

#[tokio::test]
async fn tv24_logs_follow_with_keepalive() {
    let w = start(log_worker().keepalive(std::time::Duration::from_secs(1))).await;
    create(&w, "net-test").await;
    post(&w, "/api/v1/machines/net-test/start", "{}").await;
    let log = w.console_log("net-test");
    write_file(&log, b"boot: kernel up\n");
    let mut s = connect(&w).await;
    use tokio::io::AsyncWriteExt;
    s.write_all(&request(
        "GET",
        "/api/v1/machines/net-test/logs?tail=1&follow=true",
        &[],
        b"",
    ))
    .await
    .unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| {
        contains(b, b"data: boot: kernel up\n\n")
    })
    .await;
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"appended line\n").unwrap();
    }
    read_until(&mut s, &mut buf, |b| contains(b, b":\n\n")).await;
    let r = parse(buf);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        b"data: boot: kernel up\n\ndata: appended line\n\n:\n\n"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn tv25_files() {
    let w = worker().await;
    create(&w, "dev").await;
    send(
        &w,
        &request(
            "PUT",
            "/api/v1/machines/dev/files/workspace/hello.txt",
            &[("content-type", "application/octet-stream")],
            b"hello\n",
        ),
    )
    .await
    .assert(200, JSON, r#"{"path":"/workspace/hello.txt","size":6}"#);
    let r = get(&w, "/api/v1/machines/dev/files/workspace/hello.txt").await;
    r.assert(200, Some("application/octet-stream"), "hello\n");
    assert_eq!(r.header("content-length"), Some("6"));
    let r = get(&w, "/api/v1/machines/dev/files/workspace/missing.txt").await;
    assert_eq!((r.status, r.header("content-type")), (500, JSON));
    assert_eq!(r.json()["code"], "INTERNAL_ERROR");
    // `files//workspace/…` is the same path; the file is in the host directory.
    let r = get(&w, "/api/v1/machines/dev/files//workspace/hello.txt").await;
    assert_eq!(r.body, b"hello\n");
    assert_eq!(
        std::fs::read(w.guest_root("dev").join("workspace/hello.txt")).unwrap(),
        b"hello\n"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn tv26_tv27_volumes_and_egress() {
    let w = worker().await;
    let r = post(
        &w,
        "/api/v1/volumes",
        r#"{"id":"vol-abc123","size_gb":2,"backend":"local"}"#,
    )
    .await;
    let path = w.state_dir().join("volumes/vol-abc123");
    r.assert(
        200,
        JSON,
        &format!(r#"{{"node_path":"{}"}}"#, path.display()),
    );
    assert!(path.is_dir());
    post(&w, "/api/v1/volumes", r#"{"id":"../x"}"#)
        .await
        .assert(
            400,
            JSON,
            r#"{"error":"invalid volume id: \"../x\"","code":"BAD_REQUEST"}"#,
        );
    post(&w, "/api/v1/volumes", r#"{"id":"v1","backend":"pd"}"#).await.assert(
        400,
        JSON,
        r#"{"error":"unsupported node volume backend: \"pd\" (pd volumes are driven from the control plane)","code":"BAD_REQUEST"}"#,
    );
    for _ in 0..2 {
        let r = send(
            &w,
            &request("DELETE", "/api/v1/volumes/vol-abc123", &[], b""),
        )
        .await;
        r.assert(204, None, "");
    }
    assert!(!path.exists());
    create(&w, "wire-test").await;
    get(&w, "/api/v1/machines/wire-test/egress-events?limit=5")
        .await
        .assert(200, JSON, r#"{"events":[]}"#);
    w.shutdown().await;
}

#[tokio::test]
async fn tv30_created_turns_stopped_on_supervisor_tick() {
    let w = worker().await;
    create(&w, "s2").await;
    assert_eq!(
        get(&w, "/api/v1/machines/s2").await.json()["state"],
        "created"
    );
    w.tick_supervisor();
    assert_eq!(
        get(&w, "/api/v1/machines/s2").await.json()["state"],
        "stopped"
    );
    let h = get(&w, "/health").await.text();
    assert!(h.contains(r#""machines":{"total":1,"running":0}"#));
    w.shutdown().await;
}

#[tokio::test]
async fn cors_preflight_has_no_trace_id() {
    let w = worker().await;
    let r = send(
        &w,
        &request(
            "OPTIONS",
            "/api/v1/machines",
            &[
                ("origin", "http://localhost:3000"),
                ("access-control-request-method", "POST"),
            ],
            b"",
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET,POST,PUT,DELETE")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("content-type")
    );
    assert!(r.header("x-trace-id").is_none());
    w.shutdown().await;
}

/// smolvm 1.9.2's CORS layer (tower-http 0.6) answers every OPTIONS as a
/// preflight, the route's own methods in `allow`; a simple request from an
/// allowed origin gets `access-control-allow-origin`, a foreign one not.
#[tokio::test]
async fn cors_like_the_real_layer() {
    let w = worker().await;
    let r = send(&w, &request("OPTIONS", "/health", &[], b"")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("allow"), Some("GET,HEAD"));
    assert_eq!(r.header("x-trace-id"), None);
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = send(
        &w,
        &request(
            "OPTIONS",
            "/api/v1/machines",
            &[("origin", "http://127.0.0.1:3000")],
            b"",
        ),
    )
    .await;
    assert_eq!(r.header("allow"), Some("POST,GET,HEAD"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://127.0.0.1:3000")
    );
    let r = send(
        &w,
        &request(
            "GET",
            "/health",
            &[("origin", "http://localhost:3000")],
            b"",
        ),
    )
    .await;
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    let r = send(
        &w,
        &request("GET", "/health", &[("origin", "http://evil.example")], b""),
    )
    .await;
    assert_eq!(r.header("access-control-allow-origin"), None);
    w.shutdown().await;
}

/// The metric `path` label is smolvm 1.9.2's `normalize_metrics_path`: the
/// machine id reads `:id`, the rest (a file path too) stays as sent; volume
/// ids and unknown paths stay raw.
#[tokio::test]
async fn metric_paths_like_the_real_worker() {
    let w = worker().await;
    get(&w, "/api/v1/machines/nope/files/workspace/a.txt").await;
    get(&w, "/api/v2/x").await;
    let m = get(&w, "/metrics").await.text();
    assert!(
        m.contains(r#"path="/api/v1/machines/:id/files/workspace/a.txt""#),
        "{m}"
    );
    assert!(m.contains(r#"path="/api/v2/x""#), "{m}");
    w.shutdown().await;
}
