//! The node's proxy health server, kube-proxy's (pkg/proxy/healthcheck/
//! proxy_health.go): `/healthz` and `/livez` answering JSON with
//! `lastUpdated` and `currentTime`; `/healthz` adds `nodeEligible` and
//! answers 503 when the node is being deleted or drained by the cluster
//! autoscaler, so cloud load balancers stop sending it new connections.
//! Both answer 503 when a change has waited longer than the grace period to
//! reach the maps.
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::IntoResponse,
    routing::get,
    Router,
};

use super::NodeEligibility;
use crate::metrics::Health;

#[derive(Clone)]
pub struct ProxyHealth {
    pub health: Arc<Mutex<Health>>,
    pub node: Arc<NodeEligibility>,
    pub grace: Duration,
}

impl ProxyHealth {
    /// Whether changes reach the maps in time.
    pub fn healthy(&self) -> bool {
        self.health.lock().unwrap().healthy(self.grace)
    }

    fn last_updated(&self) -> Option<SystemTime> {
        self.health.lock().unwrap().last_updated
    }
}

pub fn router(state: ProxyHealth) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .with_state(state)
}

/// Serves `/healthz` and `/livez` on `addr` until the runtime stops.
pub async fn serve(addr: SocketAddr, state: ProxyHealth) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {addr} for the proxy health server: {e} (change --healthz-address, or 'off')"
        )
    })?;
    tracing::info!(%addr, "serving the proxy health server (/healthz, /livez)");
    axum::serve(listener, router(state)).await?;
    Ok(())
}

fn rfc3339(t: Option<SystemTime>) -> String {
    // kube-proxy prints Go's zero time before the first update.
    t.map_or_else(
        || "0001-01-01T00:00:00Z".into(),
        |t| humantime::format_rfc3339_nanos(t).to_string(),
    )
}

fn json(code: StatusCode, body: String) -> impl IntoResponse {
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

fn code(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn healthz(State(s): State<ProxyHealth>) -> impl IntoResponse {
    let eligible = s.node.eligible();
    let healthy = s.healthy() && eligible;
    let body = serde_json::json!({
        "lastUpdated": rfc3339(s.last_updated()),
        "currentTime": rfc3339(Some(SystemTime::now())),
        "nodeEligible": eligible,
    });
    json(code(healthy), body.to_string())
}

async fn livez(State(s): State<ProxyHealth>) -> impl IntoResponse {
    let body = serde_json::json!({
        "lastUpdated": rfc3339(s.last_updated()),
        "currentTime": rfc3339(Some(SystemTime::now())),
    });
    json(code(s.healthy()), body.to_string())
}
