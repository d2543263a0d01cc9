//! Service health-check servers, kube-proxy's (pkg/proxy/healthcheck/
//! service_health.go): for every LoadBalancer Service with
//! externalTrafficPolicy: Local, an HTTP server on its `healthCheckNodePort`
//! answering any path with
//!
//! * 200 while this node has a ready endpoint of the service and the proxy
//!   is healthy, else 503 (the cloud load balancer then skips this node,
//!   whose traffic would otherwise be dropped: Local means no hop to
//!   another node);
//! * `X-Load-Balancing-Endpoint-Weight: <local endpoints>`;
//! * a JSON body with the service's namespace and name, `localEndpoints`
//!   and `serviceProxyHealthy`, byte for byte as kube-proxy writes it.
//!
//! Listeners follow the model: opened when a service gains a
//! healthCheckNodePort, closed when it loses it or goes away. A port that
//! cannot be opened is logged, counted and retried.
use std::{
    collections::{BTreeMap, HashMap},
    net::{Ipv4Addr, SocketAddr},
    sync::{Arc, RwLock},
    time::Duration,
};

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::IntoResponse,
    Router,
};
use prometheus_client::metrics::counter::Counter;
use tokio::{sync::watch, task::JoinHandle};
use tracing::{error, info};

use super::proxy::ProxyHealth;
use crate::{
    model::{Model, Service, ServiceName},
    source::SourceEvent,
};

/// What a health-check port answers for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub service: ServiceName,
    pub local_endpoints: usize,
}

/// The health-check ports the model asks for, kept up to date from the
/// source's events (before they are applied: the answer depends only on
/// where the endpoints run).
#[derive(Default)]
pub struct Tracker {
    by_service: HashMap<ServiceName, (u16, usize)>,
}

impl Tracker {
    /// Takes in one source event; true when the checks changed.
    pub fn observe(&mut self, ev: &SourceEvent) -> bool {
        let before = self.by_service.clone();
        match ev {
            SourceEvent::Full { model, .. } => self.replace(model),
            SourceEvent::Changes { changes, .. } => {
                for (name, svc) in changes {
                    self.set(name, svc.as_ref());
                }
            }
            SourceEvent::Error { .. } | SourceEvent::Warning { .. } => {}
        }
        before != self.by_service
    }

    fn replace(&mut self, model: &Model) {
        self.by_service.clear();
        for (name, svc) in &model.services {
            self.set(name, Some(svc));
        }
    }

    fn set(&mut self, name: &ServiceName, svc: Option<&Service>) {
        match svc.and_then(|s| Some((s.health_check_node_port?, s.local_ready_endpoints()))) {
            Some(v) => self.by_service.insert(name.clone(), v),
            None => self.by_service.remove(name),
        };
    }

    /// Port → check. Two services on one port cannot happen with an
    /// apiserver (it allocates node ports); should it, the first by name wins.
    pub fn checks(&self) -> BTreeMap<u16, Check> {
        let mut sorted: Vec<_> = self.by_service.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = BTreeMap::new();
        for (name, (port, n)) in sorted {
            out.entry(*port).or_insert(Check {
                service: name.clone(),
                local_endpoints: *n,
            });
        }
        out
    }
}

type Checks = Arc<RwLock<BTreeMap<u16, Check>>>;

#[derive(Clone)]
struct PortState {
    port: u16,
    checks: Checks,
    proxy: ProxyHealth,
}

/// The body kube-proxy writes (a tab-indented, dedented template).
pub fn body(c: &Check, proxy_healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        c.service.namespace(), c.service.name(), c.local_endpoints, proxy_healthy
    )
}

async fn answer(State(s): State<PortState>) -> impl IntoResponse {
    let check = s.checks.read().unwrap().get(&s.port).cloned();
    let Some(c) = check else {
        // Closed between accept and answer.
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            String::new(),
        )
            .into_response();
    };
    let healthy = s.proxy.healthy();
    let code = if c.local_endpoints > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            (
                header::HeaderName::from_static("x-load-balancing-endpoint-weight"),
                c.local_endpoints.to_string(),
            ),
        ],
        body(&c, healthy),
    )
        .into_response()
}

/// Keeps one listener per health-check port in `checks_rx`.
pub async fn run(
    mut checks_rx: watch::Receiver<BTreeMap<u16, Check>>,
    proxy: ProxyHealth,
    listen_errors: Counter,
) {
    let checks: Checks = Arc::default();
    let mut open: HashMap<u16, JoinHandle<()>> = HashMap::new();
    // Ports that failed to open: logged once until they open.
    let mut failing: HashMap<u16, String> = HashMap::new();
    let mut retry = tokio::time::interval(Duration::from_secs(5));
    loop {
        let wanted = checks_rx.borrow_and_update().clone();
        *checks.write().unwrap() = wanted.clone();
        open.retain(|port, task| {
            let keep = wanted.contains_key(port) && !task.is_finished();
            if !keep {
                task.abort();
                info!(port, "closed a service health-check port");
            }
            keep
        });
        failing.retain(|port, _| wanted.contains_key(port));
        for (port, check) in &wanted {
            if open.contains_key(port) {
                continue;
            }
            let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, *port));
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => {
                    failing.remove(port);
                    info!(port, service = %check.service, "serving a service health check");
                    let app = Router::new().fallback(answer).with_state(PortState {
                        port: *port,
                        checks: checks.clone(),
                        proxy: proxy.clone(),
                    });
                    open.insert(
                        *port,
                        tokio::spawn(async move {
                            let _ = axum::serve(listener, app).await;
                        }),
                    );
                }
                Err(e) => {
                    let msg = e.to_string();
                    if failing.get(port) != Some(&msg) {
                        error!(
                            port,
                            service = %check.service,
                            "cannot open healthCheckNodePort {port}: {msg}; the cloud load balancer will see this node as down; retrying every 5s"
                        );
                        listen_errors.inc();
                    }
                    failing.insert(*port, msg);
                }
            }
        }
        tokio::select! {
            changed = checks_rx.changed() => if changed.is_err() { break },
            _ = retry.tick(), if !failing.is_empty() => {}
        }
    }
    for (_, task) in open {
        task.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::model::{Backend, BackendState, Frontend, FrontendKind, Protocol};

    fn svc(hc: Option<u16>, local: &[(u8, BackendState)]) -> Service {
        let backends = local
            .iter()
            .map(|(i, state)| Backend {
                address: std::net::IpAddr::from([10, 244, 0, *i]),
                port: 8080,
                state: *state,
                local: *i < 100,
                weight: 1,
            })
            .collect();
        Service {
            frontends: vec![Frontend {
                address: "10.96.0.1".parse().unwrap(),
                port: 80,
                port_index: 0,
                protocol: Protocol::Tcp,
                kind: FrontendKind::ClusterIP,
                algorithm: Default::default(),
                affinity_timeout_s: None,
                maglev_table_size: None,
                external_traffic_local: false,
                forwarding: None,
                source_ranges: Vec::new(),
                backends,
            }],
            health_check_node_port: hc,
            metrics: false,
        }
    }

    #[test]
    fn tracker_counts_ready_local_endpoints_per_health_check_port_and_forgets_removed_services() {
        let mut t = Tracker::default();
        let a = ServiceName::new("ns", "a");
        let mut model = Model::default();
        model.services.insert(
            a.clone(),
            svc(
                Some(31000),
                // Two local ready, one local terminating, one remote.
                &[
                    (1, BackendState::Active),
                    (2, BackendState::Active),
                    (3, BackendState::Terminating),
                    (200, BackendState::Active),
                ],
            ),
        );
        model.services.insert(
            ServiceName::new("ns", "no-hc"),
            svc(None, &[(4, BackendState::Active)]),
        );
        assert!(t.observe(&SourceEvent::Full {
            model,
            observed: Instant::now(),
            triggers: vec![]
        }));
        assert_eq!(
            t.checks(),
            BTreeMap::from([(
                31000,
                Check {
                    service: a.clone(),
                    local_endpoints: 2
                }
            )])
        );
        let same = SourceEvent::Changes {
            changes: vec![(
                a.clone(),
                Some(svc(
                    Some(31000),
                    &[(1, BackendState::Active), (2, BackendState::Active)],
                )),
            )],
            observed: Instant::now(),
            triggers: vec![],
        };
        assert!(!t.observe(&same), "nothing a health check answers changed");
        let gone = SourceEvent::Changes {
            changes: vec![(a, None)],
            observed: Instant::now(),
            triggers: vec![],
        };
        assert!(t.observe(&gone));
        assert!(t.checks().is_empty());
    }

    #[test]
    fn body_is_kube_proxys_template() {
        let c = Check {
            service: ServiceName::new("default", "web"),
            local_endpoints: 3,
        };
        assert_eq!(
            body(&c, false),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 3,\n\t\"serviceProxyHealthy\": false\n}"
        );
    }
}
