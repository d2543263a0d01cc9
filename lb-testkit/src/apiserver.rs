//! A scripted Kubernetes apiserver for tests: it speaks just enough of the
//! list/watch protocol for Services, EndpointSlices and Nodes (lists with a
//! resourceVersion, watches as JSON lines from a resourceVersion, label and
//! field selectors), and lets a test add, change and delete objects, expire
//! watches (410 Gone, forcing a relist), drop connections, go down (503)
//! and hold a list back (to prove nothing is pruned on a partial view).
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Body,
    extract::{Query, State},
    http::{StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
}

impl Kind {
    fn of(obj: &Value) -> Kind {
        match obj["kind"].as_str() {
            Some("Service") => Kind::Service,
            Some("EndpointSlice") => Kind::EndpointSlice,
            Some("Node") => Kind::Node,
            other => panic!("fake apiserver: unsupported kind {other:?}"),
        }
    }
    fn list_kind(self) -> &'static str {
        match self {
            Kind::Service => "ServiceList",
            Kind::EndpointSlice => "EndpointSliceList",
            Kind::Node => "NodeList",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            _ => "v1",
        }
    }
}

#[derive(Default)]
struct Inner {
    rv: u64,
    objects: BTreeMap<(Kind, String, String), Value>,
    events: Vec<(u64, Kind, &'static str, Value)>,
    /// Watches starting before this resourceVersion get 410 Gone.
    compacted: u64,
    down: bool,
    held: BTreeSet<Kind>,
    /// Bumped to end every open watch stream.
    generation: u64,
    requests: Vec<String>,
}

struct Shared {
    inner: Mutex<Inner>,
    changed: Notify,
}

pub struct FakeApiServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeApiServer {
    pub fn start() -> Self {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                rv: 1,
                ..Default::default()
            }),
            changed: Notify::new(),
        });
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let state = shared.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let app = Router::new()
                    .route("/api/v1/services", get(handle))
                    .route("/apis/discovery.k8s.io/v1/endpointslices", get(handle))
                    .route("/api/v1/nodes", get(handle))
                    .fallback(|uri: Uri| async move {
                        (
                            StatusCode::NOT_FOUND,
                            format!("fake apiserver: no route {uri}"),
                        )
                    })
                    .with_state(state);
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stop.await;
                    })
                    .await;
            });
        });
        let addr = addr_rx.recv().unwrap();
        Self {
            addr,
            shared,
            shutdown: Some(shutdown),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let r = f(&mut self.shared.inner.lock().unwrap());
        self.shared.changed.notify_waiters();
        r
    }

    /// Creates or replaces an object (its `kind` and metadata say which).
    pub fn apply(&self, mut obj: Value) {
        let kind = Kind::of(&obj);
        self.with(|s| {
            s.rv += 1;
            obj["apiVersion"] = json!(kind.api_version());
            obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            let key = (
                kind,
                obj["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                obj["metadata"]["name"].as_str().unwrap().to_string(),
            );
            let ty = if s.objects.contains_key(&key) {
                "MODIFIED"
            } else {
                "ADDED"
            };
            s.objects.insert(key, obj.clone());
            let rv = s.rv;
            s.events.push((rv, kind, ty, obj));
        });
    }

    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        self.with(|s| {
            if let Some(mut obj) =
                s.objects
                    .remove(&(kind, namespace.to_string(), name.to_string()))
            {
                s.rv += 1;
                obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                let rv = s.rv;
                s.events.push((rv, kind, "DELETED", obj));
            }
        });
    }

    /// Deletes an object without telling open watches (as if the event was
    /// compacted away): only a relist can find out. Use with `expire`.
    pub fn delete_silently(&self, kind: Kind, namespace: &str, name: &str) {
        self.with(|s| {
            s.objects
                .remove(&(kind, namespace.to_string(), name.to_string()));
            s.rv += 1;
        });
    }

    /// Compacts history: every watch must relist (410 Gone). Open watches end.
    pub fn expire(&self) {
        self.with(|s| {
            s.compacted = s.rv + 1;
            s.generation += 1;
        });
    }

    /// Drops every open watch connection; clients resume from their resourceVersion.
    pub fn disconnect(&self) {
        self.with(|s| s.generation += 1);
    }

    /// While down, every request fails with 503 and open watches end.
    pub fn set_down(&self, down: bool) {
        self.with(|s| {
            s.down = down;
            s.generation += 1;
        });
    }

    /// Lists of `kind` wait while held.
    pub fn hold_lists(&self, kind: Kind, hold: bool) {
        self.with(|s| {
            if hold {
                s.held.insert(kind);
            } else {
                s.held.remove(&kind);
            }
        });
    }

    /// Every request seen: "list services", "watch endpointslices from 12", ...
    pub fn requests(&self) -> Vec<String> {
        self.shared.inner.lock().unwrap().requests.clone()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.set_down(true);
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
    }
}

/// label selector requirements: "k", "!k", "k=v".
fn labels_match(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector else { return true };
    let labels = &obj["metadata"]["labels"];
    sel.split(',').filter(|r| !r.is_empty()).all(|r| {
        if let Some(k) = r.strip_prefix('!') {
            labels.get(k).is_none()
        } else if let Some((k, v)) = r.split_once('=') {
            labels.get(k).and_then(Value::as_str) == Some(v)
        } else {
            labels.get(r).is_some()
        }
    })
}

fn fields_match(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector else { return true };
    sel.split(',')
        .filter(|r| !r.is_empty())
        .all(|r| match r.split_once('=') {
            Some(("metadata.name", v)) => obj["metadata"]["name"].as_str() == Some(v),
            Some(("metadata.namespace", v)) => obj["metadata"]["namespace"].as_str() == Some(v),
            _ => true,
        })
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let kind = match uri.path() {
        "/api/v1/services" => Kind::Service,
        "/apis/discovery.k8s.io/v1/endpointslices" => Kind::EndpointSlice,
        _ => Kind::Node,
    };
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (labels, fields) = (
        q.get("labelSelector").cloned(),
        q.get("fieldSelector").cloned(),
    );
    let name = format!("{kind:?}").to_lowercase() + "s";
    {
        let mut s = shared.inner.lock().unwrap();
        s.requests.push(if watch {
            format!("watch {name} from {from}")
        } else {
            format!("list {name}")
        });
        if s.down {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(status(503, "ServiceUnavailable", "apiserver is down")),
            )
                .into_response();
        }
    }
    if !watch {
        // A held list waits (the client sees a slow apiserver).
        loop {
            let held = shared.inner.lock().unwrap().held.contains(&kind);
            if !held {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let s = shared.inner.lock().unwrap();
        let items: Vec<Value> = s
            .objects
            .iter()
            .filter(|((k, _, _), o)| {
                *k == kind && labels_match(o, labels.as_ref()) && fields_match(o, fields.as_ref())
            })
            .map(|(_, o)| o.clone())
            .collect();
        let body = json!({"kind": kind.list_kind(), "apiVersion": kind.api_version(),
                          "metadata": {"resourceVersion": s.rv.to_string()}, "items": items});
        return axum::Json(body).into_response();
    }

    // A watch: JSON lines of events after `from`, until the test ends it.
    let generation = shared.inner.lock().unwrap().generation;
    let stream = futures::stream::unfold((shared, from, false), move |(shared, mut next, done)| {
        let (labels, fields) = (labels.clone(), fields.clone());
        async move {
            if done {
                return None;
            }
            loop {
                let notified = shared.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let s = shared.inner.lock().unwrap();
                    if s.down || s.generation != generation {
                        return None;
                    }
                    if next < s.compacted {
                        let line = json!({"type": "ERROR", "object": status(410, "Expired", &format!("too old resource version: {next} ({})", s.compacted))});
                        return Some((
                            Ok::<_, std::io::Error>(format!("{line}\n")),
                            (shared.clone(), next, true),
                        ));
                    }
                    let mut out = String::new();
                    for (rv, k, ty, obj) in &s.events {
                        if *rv > next && *k == kind {
                            next = *rv;
                            if labels_match(obj, labels.as_ref())
                                && fields_match(obj, fields.as_ref())
                            {
                                out.push_str(&json!({"type": ty, "object": obj}).to_string());
                                out.push('\n');
                            }
                        }
                    }
                    if !out.is_empty() {
                        return Some((Ok(out), (shared.clone(), next, false)));
                    }
                }
                let _ = tokio::time::timeout(Duration::from_millis(500), notified).await;
            }
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Objects for tests, shaped as the apiserver returns them.
pub mod objects {
    use serde_json::{json, Value};

    /// A ClusterIP service with one port.
    pub fn service(
        namespace: &str,
        name: &str,
        cluster_ip: &str,
        port: u16,
        target: u16,
        proto: &str,
    ) -> Value {
        json!({"kind": "Service", "metadata": {"name": name, "namespace": namespace},
               "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                        "ports": [{"name": "p", "port": port, "targetPort": target, "protocol": proto}]}})
    }

    /// An EndpointSlice of `service` with ready endpoints on `node`.
    pub fn slice(
        namespace: &str,
        name: &str,
        service: &str,
        ips: &[&str],
        port: u16,
        proto: &str,
        node: &str,
    ) -> Value {
        let family = if ips.first().is_some_and(|ip| ip.contains(':')) {
            "IPv6"
        } else {
            "IPv4"
        };
        json!({"kind": "EndpointSlice",
               "metadata": {"name": name, "namespace": namespace, "labels": {"kubernetes.io/service-name": service}},
               "addressType": family,
               "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": node})).collect::<Vec<_>>(),
               "ports": [{"name": "p", "port": port, "protocol": proto}]})
    }

    pub fn node(name: &str, internal_ip: &str) -> Value {
        json!({"kind": "Node", "metadata": {"name": name},
               "status": {"addresses": [{"type": "InternalIP", "address": internal_ip}]}})
    }
}
