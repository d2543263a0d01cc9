//! HTTP endpoints: `/metrics` (Prometheus text format) and `/healthz`
//! (kube-proxy style: JSON with lastUpdated and currentTime; 503 when a
//! change has waited longer than the grace period).
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};
use prometheus_client::registry::Registry;

use super::Health;

struct AppState {
    registry: Registry,
    health: Arc<Mutex<Health>>,
    grace: Duration,
}

pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    health: Arc<Mutex<Health>>,
    grace: Duration,
) -> anyhow::Result<()> {
    let state = Arc::new(AppState {
        registry,
        health,
        grace,
    });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on {addr} for metrics: {e} (change --metrics-address)")
    })?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    axum::serve(listener, app).await?;
    Ok(())
}

async fn metrics(State(s): State<Arc<AppState>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            e.to_string(),
        ),
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

async fn healthz(State(s): State<Arc<AppState>>) -> impl IntoResponse {
    let h = s.health.lock().unwrap().clone();
    let healthy = h.healthy(s.grace);
    let body = serde_json::json!({
        "lastUpdated": h.last_updated.map(rfc3339),
        "currentTime": rfc3339(SystemTime::now()),
        "status": if healthy { "ok" } else { "unhealthy" },
        "lastError": h.last_error,
    });
    let code = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
}
