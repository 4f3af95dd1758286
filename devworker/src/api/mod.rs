//! The worker HTTP API on axum: router, the outer middleware (trace ids,
//! `vary`, metrics, bearer check, faults, request timeout) and error replies.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::conn::Listener;
use crate::conn::{ConnCtl, WriteMode};
use crate::faults::{ActiveFaults, Fault, Route};
use crate::state::AppState;

mod control;
mod exec;
mod extensions;
mod files;
mod logs;
mod machines;
mod node;
mod sse;
mod terminal;
mod volumes;

pub(crate) use machines::{kill_pid, stop_machine, supervisor_tick_all as supervisor_tick};

const VARY: &str = "origin, access-control-request-method, access-control-request-headers";

/// A handler error: `{"error": msg, "code": CODE}` with its status.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    code: &'static str,
}

impl ApiError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            code: "BAD_REQUEST",
        }
    }
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            code: "NOT_FOUND",
        }
    }
    pub(crate) fn machine_not_found(name: &str) -> Self {
        Self::not_found(format!("machine '{name}' not found"))
    }
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            message: message.into(),
            code: "CONFLICT",
        }
    }
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            code: "INTERNAL_ERROR",
        }
    }
    pub(crate) fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or invalid bearer token".to_owned(),
            code: "UNAUTHORIZED",
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    code: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_reply(
            self.status,
            &ErrorBody {
                error: &self.message,
                code: self.code,
            },
        )
    }
}

/// A compact JSON reply with `content-type: application/json`.
pub(crate) fn json_reply<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

pub(crate) fn ok_json<T: Serialize>(body: &T) -> Response {
    json_reply(StatusCode::OK, body)
}

/// Extracts a JSON body exactly as axum's `Json` does (same rejections).
pub(crate) async fn json_body<T: DeserializeOwned>(req: Request) -> Result<T, Response> {
    axum::Json::<T>::from_request(req, &())
        .await
        .map(|j| j.0)
        .map_err(IntoResponse::into_response)
}

pub(crate) fn active_faults(req: &Request) -> ActiveFaults {
    req.extensions()
        .get::<ActiveFaults>()
        .cloned()
        .unwrap_or_default()
}

/// Builds the whole router for `state`.
pub(crate) fn router(state: AppState) -> Router {
    let limits = &state.config.limits;
    let json_max = limits.json_body_max;
    let file_max = limits.file_body_max;
    let m = "/api/v1/machines/{name}";
    Router::new()
        .route("/health", get(node::health))
        .route("/readyz", get(node::readyz))
        .route("/capacity", get(node::capacity))
        .route("/metrics", get(node::metrics))
        .route(
            "/api/v1/machines",
            post(machines::create).get(machines::list),
        )
        .route(m, get(machines::get_one).delete(machines::delete_one))
        .route(&format!("{m}/start"), post(machines::start))
        .route(&format!("{m}/stop"), post(machines::stop))
        .route(&format!("{m}/exec"), post(exec::exec))
        .route(&format!("{m}/exec/stream"), post(exec::exec_stream))
        .route(&format!("{m}/run"), post(exec::run))
        .route(&format!("{m}/exec/interactive"), get(terminal::interactive))
        .route(
            &format!("{m}/files/{{*path}}"),
            put(files::upload)
                .get(files::download)
                .layer(DefaultBodyLimit::max(file_max)),
        )
        .route(&format!("{m}/logs"), get(logs::logs))
        .route(&format!("{m}/egress-events"), get(node::egress_events))
        .route(&format!("{m}/images"), get(extensions::images))
        .route(&format!("{m}/images/pull"), post(extensions::pull))
        .route(&format!("{m}/resize"), post(extensions::resize))
        .route(
            &format!(
                "{m}/{}",
                if state.config.version.is_later() {
                    "branches"
                } else {
                    "fork"
                }
            ),
            post(extensions::fork),
        )
        .route("/artifacts/warm", post(extensions::warm))
        .route("/api/v1/volumes", post(volumes::create))
        .route("/api/v1/volumes/{id}", delete(volumes::delete_one))
        .route(
            "/_devworker/faults",
            post(control::add_fault).delete(control::clear_faults),
        )
        .route("/_devworker/counts", get(control::counts))
        .route("/_devworker/restart", post(control::restart))
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(json_max))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            outer,
        ))
        .with_state(state)
}

/// The plain-HTTP loopback door of mTLS mode: only the node endpoints;
/// every other path is 404 (worker-api.md §1.2).
pub(crate) fn door_router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(node::health))
        .route("/readyz", get(node::readyz))
        .route("/capacity", get(node::capacity))
        .route("/metrics", get(node::metrics))
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            outer,
        ))
        .with_state(state)
}

async fn fallback() -> StatusCode {
    StatusCode::NOT_FOUND
}

const ALLOWED_ORIGINS: [&str; 4] = [
    "http://localhost:8080",
    "http://127.0.0.1:8080",
    "http://localhost:3000",
    "http://127.0.0.1:3000",
];

fn preflight(req: &Request) -> Response {
    let mut resp = StatusCode::OK.into_response();
    let h = resp.headers_mut();
    if let Some(origin) = req.headers().get(header::ORIGIN)
        && ALLOWED_ORIGINS
            .iter()
            .any(|o| origin.as_bytes() == o.as_bytes())
    {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET,POST,PUT,DELETE"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("content-type"),
    );
    // No `allow` here: as on the real worker, axum's method router adds
    // the matched route's own methods (`GET,HEAD` for /health), and an
    // unrouted path gets none.
    h.insert(header::VARY, HeaderValue::from_static(VARY));
    resp
}

/// The `path` label of `smolvm_api_requests_total`: smolvm 1.9.2's
/// `normalize_metrics_path`, on the raw request path. The segment after
/// `/api/v1/{machines,pools,rollout-executors}/` reads `:id` and the rest
/// stays as sent (a file path too); anything else is the raw path.
fn metric_path(raw: &str) -> String {
    let parts: Vec<&str> = raw.split('/').collect();
    if parts.len() >= 4
        && parts[1] == "api"
        && matches!(parts[3], "machines" | "pools" | "rollout-executors")
        && parts.get(4).is_some_and(|id| !id.is_empty())
    {
        let mut out = parts[..4].to_vec();
        out.push(":id");
        out.extend_from_slice(&parts[5..]);
        if parts[3] == "rollout-executors" && out.get(5) == Some(&"policies") && out.len() >= 8 {
            out[6] = ":policy";
            out[7] = ":version";
        }
        return out.join("/");
    }
    raw.to_owned()
}

fn token_ok(state: &AppState, req: &Request) -> bool {
    let Some(token) = state.config.token.as_ref() else {
        return true;
    };
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|t| token.matches(t))
}

fn is_timed(state: &AppState, route: Route, path: &str) -> bool {
    match route {
        Route::Logs | Route::Terminal => false,
        Route::Exec | Route::ExecStream => !state.config.version.is_later(),
        _ => path.starts_with("/api/v1/machines") || path.starts_with("/api/v1/pools"),
    }
}

/// True when the request's `Host` names this worker: `localhost`, a
/// loopback address or the bound address (any IP literal when bound to the
/// unspecified address). A host name other than `localhost` is what a DNS
/// rebinding page sends, so it is refused. Requests on the Unix socket, and
/// requests without `Host` (a browser always sends one), pass.
pub(crate) fn host_ok(req: &Request) -> bool {
    let Some(Listener(Some(bound))) = req.extensions().get::<Listener>().copied() else {
        return true;
    };
    let Some(value) = req.headers().get(header::HOST) else {
        return true;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let host = match value.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((inside, after)) if after.is_empty() || after.starts_with(':') => inside,
            _ => return false,
        },
        None => value.rsplit_once(':').map_or(value, |(h, _)| h),
    };
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback() || ip == bound.ip() || bound.ip().is_unspecified(),
        Err(_) => false,
    }
}

/// True unless the request is a WebSocket upgrade whose `Origin` is present
/// and not one of the worker's CORS origins (a web page of another site).
pub(crate) fn origin_ok(req: &Request) -> bool {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    match req.headers().get(header::ORIGIN) {
        Some(origin) if upgrade => ALLOWED_ORIGINS
            .iter()
            .any(|o| origin.as_bytes() == o.as_bytes()),
        _ => true,
    }
}

fn forbidden(message: &str) -> Response {
    json_reply(
        StatusCode::FORBIDDEN,
        &ErrorBody {
            error: message,
            code: "FORBIDDEN",
        },
    )
}

async fn outer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    if state.config.neighbour_checks {
        if !host_ok(&req) {
            let mut resp = forbidden("request Host is not this worker (DNS rebinding refused)");
            resp.headers_mut()
                .insert(header::VARY, HeaderValue::from_static(VARY));
            return resp;
        }
        if !origin_ok(&req) {
            let mut resp = forbidden("WebSocket upgrade from a foreign Origin refused");
            resp.headers_mut()
                .insert(header::VARY, HeaderValue::from_static(VARY));
            return resp;
        }
    }
    // The real worker's CORS layer (tower-http 0.6) answers every OPTIONS
    // as a preflight, before routing, with or without
    // `Access-Control-Request-Method`.
    if method == Method::OPTIONS {
        return preflight(&req);
    }
    let trace = state.next_trace_id();
    // tower-http's CORS layer also answers a simple (non-preflight) request
    // from an allowed origin with `access-control-allow-origin`.
    let cors_origin = req
        .headers()
        .get(header::ORIGIN)
        .filter(|o| ALLOWED_ORIGINS.iter().any(|a| o.as_bytes() == a.as_bytes()))
        .cloned();
    let control = path.starts_with("/_devworker/");
    let (route, machine) = Route::classify(method.as_str(), &path);
    let mpath = metric_path(&path);
    let mut resp = if !token_ok(&state, &req) {
        ApiError::unauthorized().into_response()
    } else if control {
        next.run(req).await
    } else {
        state.faults.count(route);
        let faults = state.faults.take(route, machine.as_deref());
        req.extensions_mut().insert(ActiveFaults(faults.clone()));
        with_faults(&state, route, &path, faults, req, next).await
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&trace) {
        h.insert("x-trace-id", v);
    }
    h.insert(header::VARY, HeaderValue::from_static(VARY));
    if let Some(origin) = cors_origin {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    }
    if !control {
        state.record_metric(method.as_str(), resp.status().as_u16(), &mpath);
    }
    resp
}

async fn with_faults(
    state: &AppState,
    route: Route,
    path: &str,
    faults: Vec<Fault>,
    req: Request,
    next: Next,
) -> Response {
    let ctl = req.extensions().get::<Arc<ConnCtl>>().cloned();
    let mut timeout = is_timed(state, route, path).then_some(state.config.limits.request_timeout);
    let mut transform = None;
    for f in &faults {
        match f {
            Fault::Delay { ms } => tokio::time::sleep(Duration::from_millis(*ms)).await,
            Fault::Redirect { location } => {
                let mut resp = StatusCode::TEMPORARY_REDIRECT.into_response();
                if let Ok(v) = HeaderValue::from_str(location) {
                    resp.headers_mut().insert(header::LOCATION, v);
                }
                return resp;
            }
            Fault::Reply {
                status,
                content_type,
                body,
            } => {
                let mut resp = Response::new(Body::from(body.clone()));
                *resp.status_mut() =
                    StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                if let Some(ct) = content_type
                    && let Ok(v) = HeaderValue::from_str(ct)
                {
                    resp.headers_mut().insert(header::CONTENT_TYPE, v);
                }
                return resp;
            }
            Fault::DropAfter { bytes } => set_mode(ctl.as_ref(), WriteMode::DropAfter(*bytes)),
            Fault::StallAfter { bytes } => set_mode(ctl.as_ref(), WriteMode::StallAfter(*bytes)),
            Fault::RawReply { bytes } => set_mode(ctl.as_ref(), WriteMode::Replace(bytes.clone())),
            Fault::Timeout408 { ms } => timeout = Some(Duration::from_millis(*ms)),
            Fault::TruncateJson | Fault::MalformedJson | Fault::Gzip => transform = Some(f.clone()),
            _ => {}
        }
    }
    let resp = match timeout {
        Some(d) => match tokio::time::timeout(d, next.run(req)).await {
            Ok(r) => r,
            Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
        },
        None => next.run(req).await,
    };
    match transform {
        Some(t) => transform_body(resp, &t).await,
        None => resp,
    }
}

fn set_mode(ctl: Option<&Arc<ConnCtl>>, mode: WriteMode) {
    if let Some(c) = ctl {
        c.set(mode);
    }
}

async fn transform_body(resp: Response, fault: &Fault) -> Response {
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let out: Vec<u8> = match fault {
        Fault::TruncateJson => bytes[..bytes.len() / 2].to_vec(),
        Fault::MalformedJson => {
            let mut v = bytes.to_vec();
            let at = v.len().saturating_sub(1);
            v.insert(at, b',');
            v
        }
        Fault::Gzip => {
            parts
                .headers
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            crate::gzip::gzip_stored(&bytes)
        }
        _ => bytes.to_vec(),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}
