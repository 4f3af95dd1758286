//! Extension routes: resize, artifact warm-up, images, fork and branches.
#![allow(clippy::unwrap_used)] // tests

mod common;

use common::*;
use smolbox_devworker::DevWorker;

#[tokio::test]
async fn resize_grows_stopped_machines_only() {
    let w = worker().await;
    create(&w, "m").await;
    let r = post(&w, "/api/v1/machines/m/resize", r#"{"storageGb":21}"#).await;
    assert_eq!(
        (
            r.json()["storageGb"].as_u64(),
            r.json()["overlayGb"].as_u64()
        ),
        (Some(21), Some(10))
    );
    // smolvm 1.9.2: the same size is accepted (nothing to grow), a smaller
    // one is 400, nothing at all is 400.
    let r = post(&w, "/api/v1/machines/m/resize", r#"{"overlayGb":10}"#).await;
    assert_eq!(r.status, 200);
    let r = post(&w, "/api/v1/machines/m/resize", r#"{"storageGb":20}"#).await;
    r.assert(
        400,
        Some("application/json"),
        r#"{"error":"storageGb cannot be smaller than current size (21 GiB)","code":"BAD_REQUEST"}"#,
    );
    post(&w, "/api/v1/machines/m/resize", "{}")
        .await
        .assert(
            400,
            Some("application/json"),
            r#"{"error":"at least one of storageGb or overlayGb must be specified","code":"BAD_REQUEST"}"#,
        );
    // The real disk file starts at the default size (20 GiB) even for a
    // `storageGb: 1` machine, so growing it to 2 fails (worker-api.md §5.9).
    post(&w, "/api/v1/machines", r#"{"name":"small","storageGb":1}"#).await;
    post(&w, "/api/v1/machines/small/resize", r#"{"storageGb":2}"#)
        .await
        .assert(
            500,
            Some("application/json"),
            r#"{"error":"failed to expand storage: storage operation failed: expand disk: new size (2 GiB) must be larger than current size (20 GiB). Shrinking is not supported.","code":"INTERNAL_ERROR"}"#,
        );
    let r = post(&w, "/api/v1/machines/small/resize", r#"{"storageGb":20}"#).await;
    assert_eq!(r.json()["storageGb"].as_u64(), Some(20));
    post(&w, "/api/v1/machines/m/start", "{}").await;
    assert_eq!(
        post(&w, "/api/v1/machines/m/resize", r#"{"storageGb":30}"#)
            .await
            .status,
        409
    );
    assert_eq!(
        post(&w, "/api/v1/machines/x/resize", r#"{"storageGb":30}"#)
            .await
            .status,
        404
    );
    w.shutdown().await;
}

#[tokio::test]
async fn warm_and_images() {
    let w = worker().await;
    let r = post(
        &w,
        "/artifacts/warm",
        r#"{"reference":"docker.io/library/alpine:3"}"#,
    )
    .await;
    let v = r.json();
    assert!(
        v["digest"].as_str().unwrap().starts_with("sha256:")
            && v["digest"].as_str().unwrap().len() == 71
    );
    assert_eq!(
        (v["sizeBytes"].as_u64(), v["alreadyCached"].as_bool()),
        (Some(0), Some(false))
    );
    let r = post(
        &w,
        "/artifacts/warm",
        r#"{"reference":"docker.io/library/alpine:3"}"#,
    )
    .await;
    assert_eq!(r.json()["alreadyCached"], true);
    assert_eq!(
        post(&w, "/artifacts/warm", r#"{"reference":""}"#)
            .await
            .status,
        400
    );
    create(&w, "m").await;
    assert_eq!(
        get(&w, "/api/v1/machines/m/images").await.body,
        br#"{"images":[]}"#
    );
    let r = post(
        &w,
        "/api/v1/machines/m/images/pull",
        r#"{"image":"alpine:3"}"#,
    )
    .await;
    assert_eq!(r.json()["image"]["reference"], "alpine:3");
    let list = get(&w, "/api/v1/machines/m/images").await.json();
    assert_eq!(list["images"][0]["reference"], "alpine:3");
    assert_eq!(list["images"][0]["os"], "linux");
    w.shutdown().await;
}

#[tokio::test]
async fn fork_needs_a_running_forkable_source_and_copies_its_files() {
    let w = worker().await;
    create(&w, "golden").await;
    post(&w, "/api/v1/machines/golden/start", "{}").await;
    assert_eq!(
        post(&w, "/api/v1/machines/golden/fork", r#"{"name":"clone"}"#)
            .await
            .status,
        409
    );
    post(&w, "/api/v1/machines/golden/stop", "").await;
    let r = send(
        &w,
        &request(
            "POST",
            "/api/v1/machines/golden/start?forkable=true",
            &[],
            b"",
        ),
    )
    .await;
    assert_eq!(r.json()["forkable"], true);
    exec(
        &w,
        "golden",
        r#"{"command":["sh","-c","echo base > /workspace/f"]}"#,
    )
    .await;
    let r = post(
        &w,
        "/api/v1/machines/golden/fork",
        r#"{"name":"clone","ports":[{"host":18123,"guest":80}]}"#,
    )
    .await;
    let v = r.json();
    assert_eq!(
        (v["name"].as_str(), v["state"].as_str()),
        (Some("clone"), Some("running"))
    );
    assert_eq!(v["ports"][0]["host"], 18123);
    assert_eq!(
        exec(&w, "clone", r#"{"command":["cat","/workspace/f"]}"#)
            .await
            .json()["stdout"],
        "base\n"
    );
    assert_eq!(
        post(&w, "/api/v1/machines/golden/fork", r#"{"name":"clone"}"#)
            .await
            .status,
        409
    );
    w.shutdown().await;
}

#[tokio::test]
async fn branches_in_the_later_contract() {
    let w = start(DevWorker::builder().version("1.22.0")).await;
    create(&w, "src").await;
    let r = send(
        &w,
        &request(
            "POST",
            "/api/v1/machines/src/start?branchable=true",
            &[],
            b"",
        ),
    )
    .await;
    assert_eq!(r.json()["branchable"], true);
    let r = post(
        &w,
        "/api/v1/machines/src/branches",
        r#"{"name":"child","branchable":false}"#,
    )
    .await;
    assert_eq!(
        (r.json()["name"].as_str(), r.json()["branchable"].as_bool()),
        (Some("child"), Some(false))
    );
    // The 1.9.2 spelling does not exist in the later contract.
    assert_eq!(
        post(&w, "/api/v1/machines/src/fork", r#"{"name":"c2"}"#)
            .await
            .status,
        404
    );
    w.shutdown().await;
}

#[tokio::test]
async fn later_contract_lists_directories_and_has_no_exec_timeout() {
    let w = start(
        DevWorker::builder()
            .version("1.22.0")
            .request_timeout(std::time::Duration::from_millis(200)),
    )
    .await;
    create(&w, "m").await;
    send(
        &w,
        &request(
            "PUT",
            "/api/v1/machines/m/files/workspace/d/a.txt",
            &[],
            b"abc",
        ),
    )
    .await;
    let r = get(&w, "/api/v1/machines/m/files/workspace/d").await;
    r.assert(
        200,
        Some("application/json"),
        r#"{"entries":[{"name":"a.txt","kind":"file","size":3}]}"#,
    );
    // Commands longer than the request timeout complete (1.22.0 qualified 305 s).
    let r = exec(&w, "m", r#"{"command":["sh","-c","sleep 0.5; echo late"]}"#).await;
    assert_eq!(r.json()["stdout"], "late\n");
    // Other machine routes keep the timeout; in 1.9.2 a directory read fails.
    w.shutdown().await;
    let w = worker().await;
    create(&w, "m").await;
    send(
        &w,
        &request(
            "PUT",
            "/api/v1/machines/m/files/workspace/d/a.txt",
            &[],
            b"abc",
        ),
    )
    .await;
    assert_eq!(
        get(&w, "/api/v1/machines/m/files/workspace/d").await.status,
        500
    );
    w.shutdown().await;
}
