//! Exec, SSE, files, listeners, bearer check, restart: real child processes.
#![allow(clippy::unwrap_used)] // tests

mod common;

use std::time::Duration;

use common::*;
use smolbox_devworker::{DevWorker, Limits};
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn exec_maps_env_stdin_and_workdir() {
    let w = worker().await;
    create(&w, "m").await;
    let r = exec(
        &w,
        "m",
        r#"{"command":["sh","-c","cat; echo $FOO; pwd; test -z \"$SECRET_HOST_VAR\" && echo clean"],"env":[{"name":"FOO","value":"bar"}],"stdin":"in\n","workdir":"/workspace"}"#,
    )
    .await;
    let root = w.guest_root("m");
    assert_eq!(
        r.json()["stdout"],
        format!("in\nbar\n{}/workspace\nclean\n", root.display())
    );
    // The implicit start made the machine run.
    assert_eq!(
        get(&w, "/api/v1/machines/m").await.json()["state"],
        "running"
    );
    // argv paths under /workspace are the machine's directory.
    std::fs::write(root.join("workspace/f.txt"), "content").unwrap();
    assert_eq!(
        exec(&w, "m", r#"{"command":["cat","/workspace/f.txt"]}"#)
            .await
            .json()["stdout"],
        "content"
    );
    let r = exec(
        &w,
        "m",
        r#"{"command":["true"],"env":[{"name":"1BAD","value":"x"}]}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (400, Some("BAD_REQUEST"))
    );
    let r = exec(&w, "m", r#"{"command":["true"],"workdir":"/nowhere"}"#).await;
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (500, Some("INTERNAL_ERROR"))
    );
    w.shutdown().await;
}

#[tokio::test]
async fn exec_timeout_is_124_and_kills_the_child() {
    let w = worker().await;
    create(&w, "m").await;
    let r = exec(
        &w,
        "m",
        r#"{"command":["sh","-c","echo $$ > /workspace/pid; exec sleep 30"],"timeoutSecs":1}"#,
    )
    .await;
    assert_eq!(r.json()["exitCode"], 124);
    let pid: u32 = std::fs::read_to_string(w.guest_root("m").join("workspace/pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!pid_alive(pid), "timed-out child {pid} still alive");
    w.shutdown().await;
}

#[tokio::test]
async fn buffered_output_cap_at_n_and_n_plus_one() {
    let w = start(DevWorker::builder().limits(Limits {
        exec_output_max: 1000,
        ..Default::default()
    }))
    .await;
    create(&w, "m").await;
    let r = exec(&w, "m", r#"{"command":["head","-c","1000","/dev/zero"]}"#).await;
    assert_eq!(
        (r.status, r.json()["stdoutB64"].as_str().unwrap().len()),
        (200, 1336)
    );
    let r = exec(&w, "m", r#"{"command":["head","-c","1001","/dev/zero"]}"#).await;
    assert_eq!(r.status, 500);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("command output exceeded 1000 bytes and was truncated")
    );
    w.shutdown().await;
}

#[tokio::test]
async fn body_caps_at_n_and_n_plus_one() {
    let w = start(DevWorker::builder().limits(Limits {
        json_body_max: 100,
        file_body_max: 1000,
        ..Default::default()
    }))
    .await;
    create(&w, "m").await;
    let body = |n: usize| {
        let base = r#"{"command":["true",""]}"#;
        format!(r#"{{"command":["true","{}"]}}"#, "a".repeat(n - base.len()))
    };
    assert_eq!(exec(&w, "m", &body(100)).await.status, 200);
    assert_eq!(exec(&w, "m", &body(101)).await.status, 413);
    let put = |n: usize| {
        request(
            "PUT",
            "/api/v1/machines/m/files/workspace/blob",
            &[],
            &vec![7u8; n],
        )
    };
    send(&w, &put(1000)).await.assert(
        200,
        Some("application/json"),
        r#"{"path":"/workspace/blob","size":1000}"#,
    );
    send(&w, &put(1001)).await.assert(
        413,
        Some("text/plain; charset=utf-8"),
        "Failed to buffer the request body: length limit exceeded",
    );
    w.shutdown().await;
}

#[tokio::test]
async fn request_timeout_408_while_the_command_keeps_running() {
    let w = start(DevWorker::builder().request_timeout(Duration::from_millis(300))).await;
    create(&w, "m").await;
    post(&w, "/api/v1/machines/m/start", "{}").await;
    let r = exec(
        &w,
        "m",
        r#"{"command":["sh","-c","sleep 1; echo done > /workspace/done"]}"#,
    )
    .await;
    r.assert(408, None, "");
    let marker = w.guest_root("m").join("workspace/done");
    eventually("the command to finish after the 408", || marker.exists()).await;
    // Logs are not under the request timeout.
    w.shutdown().await;
}

#[tokio::test]
async fn sse_keepalive_and_disconnect_keeps_the_command() {
    let w = start(DevWorker::builder().keepalive(Duration::from_millis(100))).await;
    create(&w, "m").await;
    let r = post(
        &w,
        "/api/v1/machines/m/exec/stream",
        r#"{"command":["sh","-c","sleep 0.5; echo x"]}"#,
    )
    .await;
    assert!(r.text().starts_with(":\n\n"), "{}", r.text());
    assert!(
        r.text()
            .ends_with("event: stdout\ndata: x\ndata: \n\nevent: exit\ndata: {\"exitCode\":0}\n\n")
    );

    let mut s = connect(&w).await;
    s.write_all(&json_req(
        "POST",
        "/api/v1/machines/m/exec/stream",
        r#"{"command":["sh","-c","sleep 0.3; echo x > /workspace/after"]}"#,
    ))
    .await
    .unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| contains(b, b"\r\n\r\n")).await;
    drop(s);
    let marker = w.guest_root("m").join("workspace/after");
    eventually("the command to outlive its client", || marker.exists()).await;
    w.shutdown().await;
}

#[tokio::test]
async fn background_commands_die_with_stop() {
    let w = worker().await;
    create(&w, "m").await;
    let r = exec(&w, "m", r#"{"command":["sleep","30"],"background":true}"#).await;
    let pid: u32 = r.json()["stdout"].as_str().unwrap()[4..]
        .trim()
        .parse()
        .unwrap();
    let vmm = w.machine_pid("m").unwrap();
    assert!(pid_alive(pid) && pid_alive(vmm));
    let r = post(&w, "/api/v1/machines/m/stop", "").await;
    assert_eq!(r.json()["state"], "stopped");
    eventually("the background command to be killed", || !pid_alive(pid)).await;
    eventually("the VMM process to be killed", || !pid_alive(vmm)).await;
    w.shutdown().await;
}

#[tokio::test]
async fn unix_socket_listener() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("smolvm.sock");
    std::fs::write(&sock, b"stale").unwrap();
    let w = start(DevWorker::builder().unix_socket(Some(sock.clone()))).await;
    assert_eq!(w.unix_path(), Some(sock.clone()));
    let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let r = exchange(s, &request("GET", "/health", &[], b"")).await;
    assert_eq!(r.status, 200);
    let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let r = exchange(s, &json_req("POST", "/api/v1/machines", r#"{"name":"u1"}"#)).await;
    assert_eq!(r.json()["name"], "u1");
    w.shutdown().await;
    assert!(!sock.exists());
}

#[tokio::test]
async fn mutual_tls_listener() {
    let w = start(DevWorker::builder().tls(true)).await;
    let files = w.tls_files().unwrap();
    assert!(w.base_url().starts_with("https://127.0.0.1:"));
    let name = rustls_pki_types::ServerName::try_from(files.server_name.clone()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(tls_client(&files, true));
    let tls = connector
        .connect(name.clone(), connect(&w).await)
        .await
        .unwrap();
    let r = exchange(tls, &request("GET", "/health", &[], b"")).await;
    assert_eq!(r.status, 200);
    // Without a client certificate the worker refuses the connection.
    let connector = tokio_rustls::TlsConnector::from(tls_client(&files, false));
    let refused = async {
        let mut tls = connector.connect(name, connect(&w).await).await?;
        tls.write_all(&request("GET", "/health", &[], b"")).await?;
        let mut out = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut tls, &mut out).await?;
        Ok::<_, std::io::Error>(out)
    }
    .await;
    assert!(
        refused.is_err() || refused.as_ref().is_ok_and(Vec::is_empty),
        "{refused:?}"
    );
    // The plain loopback door serves only the node endpoints.
    let door = w.local_door().unwrap();
    assert!(door.ip().is_loopback());
    let plain = |req: Vec<u8>| async move {
        exchange(tokio::net::TcpStream::connect(door).await.unwrap(), &req).await
    };
    assert_eq!(plain(request("GET", "/health", &[], b"")).await.status, 200);
    assert_eq!(
        plain(request("GET", "/metrics", &[], b"")).await.status,
        200
    );
    plain(request("GET", "/api/v1/machines", &[], b""))
        .await
        .assert(404, None, "");
    assert!(worker().await.local_door().is_none());
    w.shutdown().await;
}

#[tokio::test]
async fn bearer_token_check() {
    let w = start(DevWorker::builder().token(Some("s3cret"))).await;
    let r = get(&w, "/health").await;
    r.assert(
        401,
        Some("application/json"),
        r#"{"error":"missing or invalid bearer token","code":"UNAUTHORIZED"}"#,
    );
    let r = send(
        &w,
        &request("GET", "/health", &[("authorization", "Bearer wrong")], b""),
    )
    .await;
    assert_eq!(r.status, 401);
    let r = send(
        &w,
        &request("GET", "/health", &[("authorization", "Bearer s3cret")], b""),
    )
    .await;
    assert_eq!(r.status, 200);
    w.shutdown().await;
}

#[tokio::test]
async fn restart_forgets_commands_and_deletes_dead_machines() {
    let w = worker().await;
    create(&w, "dies").await;
    create(&w, "lives").await;
    create(&w, "never").await;
    post(&w, "/api/v1/machines/dies/start", "{}").await;
    post(&w, "/api/v1/machines/lives/start", "{}").await;
    let boot = get(&w, "/capacity").await.json()["boot_id"].clone();
    // A live SSE command on "lives".
    let mut s = connect(&w).await;
    s.write_all(&json_req(
        "POST",
        "/api/v1/machines/lives/exec/stream",
        r#"{"command":["sh","-c","echo started; exec sleep 30"]}"#,
    ))
    .await
    .unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| contains(b, b"data: started")).await;
    let vmm = w.machine_pid("dies").unwrap();
    w.kill_machine_process("dies");
    eventually("the VMM to die", || !pid_alive(vmm)).await;
    eventually("the machine to read stopped", || {
        w.machine_pid("dies").is_none()
    })
    .await;
    w.restart().await;
    // The stream was dropped without an exit event.
    let eof = read_until(&mut s, &mut buf, |_| false).await;
    assert!(eof && !contains(&buf, b"event: exit"));
    get(&w, "/api/v1/machines/dies").await.assert(
        404,
        Some("application/json"),
        r#"{"error":"machine 'dies' not found","code":"NOT_FOUND"}"#,
    );
    assert_eq!(
        get(&w, "/api/v1/machines/lives").await.json()["state"],
        "running"
    );
    assert_eq!(
        get(&w, "/api/v1/machines/never").await.json()["state"],
        "created"
    );
    assert_ne!(get(&w, "/capacity").await.json()["boot_id"], boot);
    assert!(!w.guest_root("dies").exists());
    w.shutdown().await;
}

#[test]
fn blocking_handle_without_tokio() {
    use std::io::{Read, Write};
    let w = DevWorker::start_blocking(DevWorker::builder().quiet(true)).unwrap();
    let mut s = std::net::TcpStream::connect(w.addr()).unwrap();
    s.write_all(&request("GET", "/health", &[], b"")).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    assert_eq!(parse(raw).status, 200);
    assert!(w.base_url().starts_with("http://127.0.0.1:"));
    w.shutdown();
}

#[tokio::test]
async fn sse_setup_failure_is_an_in_band_error_and_metrics_count_execs() {
    let w = worker().await;
    create(&w, "m").await;
    let r = post(
        &w,
        "/api/v1/machines/m/exec/stream",
        r#"{"command":["/no/such/program"]}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    let t = r.text();
    assert!(t.starts_with("event: error\ndata: {\"message\":\"Agent { operation: \"run\", message: \"failed to spawn command: "), "{t}");
    assert!(!t.contains("event: exit"));
    let r = exec(&w, "m", r#"{"command":["/no/such/program"]}"#).await;
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (500, Some("INTERNAL_ERROR"))
    );
    exec(&w, "m", r#"{"command":["true"]}"#).await;
    let m = get(&w, "/metrics").await.text();
    assert!(m.contains("# TYPE smolvm_exec_seconds histogram\n"));
    assert!(m.contains("smolvm_exec_seconds_count 1\n"));
    assert!(m.contains("smolvm_api_requests_total{method=\"POST\",status=\"500\",path=\"/api/v1/machines/:id/exec\"} 1\n"));
    w.shutdown().await;
}

#[tokio::test]
async fn binary_starts_warns_and_serves() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_smolbox-devworker"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--tls",
            "--impersonate",
            "1.22.0",
            "--state-dir",
        ])
        .arg(dir.path())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let url = tokio::time::timeout(PATIENCE, async {
        while let Some(l) = lines.next_line().await.unwrap() {
            seen.push(l.clone());
            if let Some(u) = l.strip_prefix("smolbox-devworker: listening on ") {
                return u.to_owned();
            }
        }
        panic!("no listening line in {seen:?}")
    })
    .await
    .unwrap();
    let all = seen.join("\n");
    assert!(all.contains("WITHOUT isolation"), "{all}");
    assert!(
        all.contains(&dir.path().join("tls/ca.pem").display().to_string()),
        "{all}"
    );
    let addr: std::net::SocketAddr = url.strip_prefix("https://").unwrap().parse().unwrap();
    let files = smolbox_devworker::TlsFiles {
        ca_pem: dir.path().join("tls/ca.pem"),
        client_cert_pem: dir.path().join("tls/client.pem"),
        client_key_pem: dir.path().join("tls/client-key.pem"),
        server_name: "localhost".into(),
    };
    let connector = tokio_rustls::TlsConnector::from(tls_client(&files, true));
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector
        .connect(name, tokio::net::TcpStream::connect(addr).await.unwrap())
        .await
        .unwrap();
    // A token was generated (the binary requires one by default), printed
    // and written 0600 to the state directory.
    let token = std::fs::read_to_string(dir.path().join("token")).unwrap();
    assert!(all.contains(&token), "the generated token is printed");
    let bearer = format!("Bearer {token}");
    let r = exchange(
        tls,
        &request("GET", "/health", &[("authorization", &bearer)], b""),
    )
    .await;
    assert!(r.text().contains("\"version\":\"1.22.0\""), "{}", r.text());
    // SIGTERM stops it cleanly (machines drained, exit status 0).
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn a_new_devworker_on_the_same_state_dir_is_a_restarted_worker() {
    let dir = tempfile::tempdir().unwrap();
    let b = || DevWorker::builder().state_dir(Some(dir.path().to_path_buf()));
    let w1 = start(b().keep_machines_running(true)).await;
    for m in ["crashed", "alive", "idle", "stopped"] {
        create(&w1, m).await;
    }
    for m in ["crashed", "alive", "stopped"] {
        post(&w1, &format!("/api/v1/machines/{m}/start"), "{}").await;
    }
    post(&w1, "/api/v1/machines/stopped/stop", "").await;
    let alive_pid = w1.machine_pid("alive").unwrap();
    let crashed_pid = w1.machine_pid("crashed").unwrap();
    w1.shutdown().await;
    // The VMMs survived the worker; one of them now dies while it is down.
    assert!(pid_alive(alive_pid) && pid_alive(crashed_pid));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(crashed_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    eventually("the crashed VMM to go", || !pid_alive(crashed_pid)).await;

    let w2 = start(b()).await;
    assert_eq!(get(&w2, "/api/v1/machines/crashed").await.status, 404);
    assert!(!dir.path().join("machines/crashed").exists());
    let r = get(&w2, "/api/v1/machines/alive").await.json();
    assert_eq!(
        (r["state"].as_str(), r["pid"].as_u64()),
        (Some("running"), Some(u64::from(alive_pid)))
    );
    assert_eq!(
        get(&w2, "/api/v1/machines/idle").await.json()["state"],
        "created"
    );
    assert_eq!(
        get(&w2, "/api/v1/machines/stopped").await.json()["state"],
        "stopped"
    );
    let names: Vec<String> = get(&w2, "/api/v1/machines").await.json()["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["alive", "idle", "stopped"]);
    // Default shutdown drains: the reconnected VMM is stopped.
    w2.shutdown().await;
    eventually("the drained VMM to go", || !pid_alive(alive_pid)).await;
    let w3 = start(b()).await;
    assert_eq!(
        get(&w3, "/api/v1/machines/alive").await.json()["state"],
        "stopped"
    );
    w3.shutdown().await;
}

#[tokio::test]
async fn limits_at_n_and_n_plus_one() {
    let w = start(DevWorker::builder().limits(Limits {
        max_log_followers: 1,
        ..Default::default()
    }))
    .await;
    let n128 = format!("a{}", "b".repeat(127));
    assert_eq!(
        post(&w, "/api/v1/machines", &format!(r#"{{"name":"{n128}"}}"#))
            .await
            .status,
        200
    );
    let n129 = format!("a{}", "b".repeat(128));
    assert_eq!(
        post(&w, "/api/v1/machines", &format!(r#"{{"name":"{n129}"}}"#))
            .await
            .status,
        400
    );
    assert_eq!(
        post(&w, "/api/v1/machines", r#"{"name":"mem64","memoryMb":64}"#)
            .await
            .status,
        200
    );
    assert_eq!(
        post(&w, "/api/v1/machines", r#"{"name":"mem63","memoryMb":63}"#)
            .await
            .status,
        400
    );
    assert_eq!(
        post(&w, "/api/v1/machines", r#"{"name":"cpu1","cpus":1}"#)
            .await
            .status,
        200
    );
    assert_eq!(
        post(&w, "/api/v1/machines", r#"{"name":"cpu256","cpus":256}"#)
            .await
            .status,
        422
    );
    for bad in ["-a", "a-", "a--b", "a/b", "a.b"] {
        assert_eq!(
            post(&w, "/api/v1/machines", &format!(r#"{{"name":"{bad}"}}"#))
                .await
                .status,
            400,
            "{bad}"
        );
    }
    let v128 = "v".repeat(128);
    assert_eq!(
        post(&w, "/api/v1/volumes", &format!(r#"{{"id":"{v128}"}}"#))
            .await
            .status,
        200
    );
    assert_eq!(
        post(&w, "/api/v1/volumes", &format!(r#"{{"id":"{v128}v"}}"#))
            .await
            .status,
        400
    );
    // Log followers: N allowed, N+1 refused with 409 while the first follows.
    create(&w, "m").await;
    post(&w, "/api/v1/machines/m/start", "{}").await;
    let mut first = connect(&w).await;
    first
        .write_all(&request(
            "GET",
            "/api/v1/machines/m/logs?follow=true",
            &[],
            b"",
        ))
        .await
        .unwrap();
    let mut buf = Vec::new();
    read_until(&mut first, &mut buf, |b| contains(b, b"data: boot")).await;
    get(&w, "/api/v1/machines/m/logs?follow=true").await.assert(
        409,
        Some("application/json"),
        r#"{"error":"too many concurrent log followers","code":"CONFLICT"}"#,
    );
    // Non-following reads are not limited.
    assert_eq!(get(&w, "/api/v1/machines/m/logs").await.status, 200);
    drop(first);
    eventually_async_ok(&w).await;
    w.shutdown().await;
}

/// After the first follower disconnects, a new follower is admitted.
async fn eventually_async_ok(w: &DevWorker) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut s = connect(w).await;
        s.write_all(&request(
            "GET",
            "/api/v1/machines/m/logs?follow=true",
            &[],
            b"",
        ))
        .await
        .unwrap();
        let mut buf = Vec::new();
        read_until(&mut s, &mut buf, |b| contains(b, b"\r\n\r\n")).await;
        if buf.starts_with(b"HTTP/1.1 200") {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "follower slot never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn dropping_the_worker_kills_its_commands() {
    let w = worker().await;
    create(&w, "m").await;
    let r = exec(&w, "m", r#"{"command":["sleep","30"],"background":true}"#).await;
    let bg: u32 = r.json()["stdout"].as_str().unwrap()[4..]
        .trim()
        .parse()
        .unwrap();
    let mut s = connect(&w).await;
    s.write_all(&json_req(
        "POST",
        "/api/v1/machines/m/exec/stream",
        r#"{"command":["sh","-c","echo pid=$$; exec sleep 30"]}"#,
    ))
    .await
    .unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, |b| contains(b, b"data: \n\n")).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let fg: u32 = text
        .split("pid=")
        .nth(1)
        .unwrap()
        .split('\n')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pid_alive(bg) && pid_alive(fg));
    drop(w);
    eventually("commands to die with the worker", || {
        !pid_alive(bg) && !pid_alive(fg)
    })
    .await;
}
