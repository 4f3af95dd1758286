//! Node endpoints: health, readyz, capacity, metrics; egress events and images.

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{ApiError, ok_json};
use crate::state::{AppState, Resolved, lock};

#[derive(Serialize)]
struct MachineCounts {
    total: usize,
    running: usize,
}

#[derive(Serialize)]
struct Health<'a> {
    status: &'a str,
    version: &'a str,
    machines: MachineCounts,
    uptime_seconds: u64,
}

fn counts(st: &AppState) -> MachineCounts {
    let ms = lock(&st.machines);
    MachineCounts {
        total: ms.len(),
        running: ms
            .iter()
            .filter(|m| m.resolved() == Resolved::Running)
            .count(),
    }
}

pub(crate) async fn health(State(st): State<AppState>) -> Response {
    let uptime = lock(&st.started).elapsed().as_secs();
    ok_json(&Health {
        status: "ok",
        version: st.config.version.as_str(),
        machines: counts(&st),
        uptime_seconds: uptime,
    })
}

pub(crate) async fn readyz() -> StatusCode {
    StatusCode::OK
}

#[derive(Serialize)]
struct Capacity {
    allocated_cpus: u32,
    allocated_memory_mb: u64,
    used_cpus: f64,
    used_memory_mb: u64,
    used_disk_gb: u64,
    boot_id: String,
}

pub(crate) async fn capacity(State(st): State<AppState>) -> Response {
    let (cpus, mem) = {
        let ms = lock(&st.machines);
        ms.iter()
            .filter(|m| m.resolved() == Resolved::Running)
            .fold((0u32, 0u64), |(c, m2), m| {
                (c + u32::from(m.cpus), m2 + u64::from(m.memory_mb))
            })
    };
    ok_json(&Capacity {
        allocated_cpus: cpus,
        allocated_memory_mb: mem,
        used_cpus: 0.0,
        used_memory_mb: 0,
        used_disk_gb: 0,
        boot_id: lock(&st.boot_id).clone(),
    })
}

pub(crate) async fn metrics(State(st): State<AppState>) -> Response {
    let mut out = String::from("# TYPE smolvm_api_requests_total counter\n");
    for ((method, status, path), n) in lock(&st.metrics).iter() {
        out.push_str(&format!(
            "smolvm_api_requests_total{{method=\"{method}\",status=\"{status}\",path=\"{path}\"}} {n}\n"
        ));
    }
    {
        let h = lock(&st.exec_hist);
        if h.count > 0 {
            out.push_str("\n# TYPE smolvm_exec_seconds histogram\n");
            for (le, n) in crate::state::EXEC_BUCKETS.iter().zip(h.buckets) {
                out.push_str(&format!("smolvm_exec_seconds_bucket{{le=\"{le}\"}} {n}\n"));
            }
            out.push_str(&format!(
                "smolvm_exec_seconds_bucket{{le=\"+Inf\"}} {}\nsmolvm_exec_seconds_sum {}\nsmolvm_exec_seconds_count {}\n",
                h.count, h.sum, h.count
            ));
        }
    }
    let c = counts(&st);
    out.push_str(&format!(
        "\n# TYPE smolvm_machines_total gauge\nsmolvm_machines_total {}\n\n# TYPE smolvm_machines_running gauge\nsmolvm_machines_running {}\n\n",
        c.total, c.running
    ));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        out,
    )
        .into_response()
}

#[derive(Deserialize)]
pub(crate) struct EgressQuery {
    #[serde(default)]
    #[allow(dead_code)]
    limit: Option<usize>,
}

#[derive(Serialize)]
struct Events {
    events: [u8; 0],
}

pub(crate) async fn egress_events(
    State(st): State<AppState>,
    UrlPath(name): UrlPath<String>,
    Query(_q): Query<EgressQuery>,
) -> Response {
    if st.with_machine(&name, |_| ()).is_none() {
        return ApiError::machine_not_found(&name).into_response();
    }
    ok_json(&Events { events: [] })
}
