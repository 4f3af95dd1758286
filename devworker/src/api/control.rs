//! The devworker's own control API (not part of the worker API):
//! `POST/DELETE /_devworker/faults`, `GET /_devworker/counts`,
//! `POST /_devworker/restart`.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{json_body, ok_json};
use crate::faults::FaultRule;
use crate::state::AppState;

pub(crate) async fn add_fault(State(st): State<AppState>, req: Request) -> Response {
    match json_body::<FaultRule>(req).await {
        Ok(rule) => {
            st.faults.add(rule);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(r) => r,
    }
}

pub(crate) async fn clear_faults(State(st): State<AppState>) -> StatusCode {
    st.faults.clear();
    StatusCode::NO_CONTENT
}

pub(crate) async fn counts(State(st): State<AppState>) -> Response {
    let map: std::collections::BTreeMap<&'static str, u64> = st
        .faults
        .request_counts()
        .into_iter()
        .map(|(r, n)| (r.as_str(), n))
        .collect();
    ok_json(&map)
}

/// Replies 202, then restarts shortly after (the restart closes every
/// connection, this one included).
pub(crate) async fn restart(State(st): State<AppState>) -> StatusCode {
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        crate::state::restart_state(&st);
    });
    StatusCode::ACCEPTED
}
