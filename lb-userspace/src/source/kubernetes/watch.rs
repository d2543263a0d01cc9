//! The watch loop: kube-rs watchers on Services, EndpointSlices (with
//! kube-proxy's label selectors) and this node's Node, feeding the `Store`.
//! Changes are debounced: the first event of a burst starts the clock, and
//! everything that arrives within `debounce` goes out as one batch of
//! changed services. Watch errors (410 Gone, dropped connections, an
//! apiserver that is down) are reported and retried with backoff by
//! kube-runtime; the maps keep their state meanwhile.
//!
//! With more than one apiserver (`--k8s-api-server a,b`, Cilium's
//! `k8s.apiServerURLs`), the one in use is asked `/readyz` every
//! `HEALTH_EVERY`, beside the watches (a probe never holds up an event);
//! when it has not answered for `FAILOVER_AFTER`, the watches move to the
//! next one, which lists everything again: the store keeps its objects
//! until that list is complete, so nothing that still exists is pruned,
//! and what changed meanwhile arrives with the list. `/readyz` is what
//! load balancers ask too, and API Priority and Fairness exempts it, so a
//! busy apiserver still answers it. When every apiserver has been tried
//! without one answering, the next round waits, doubling up to
//! `ROUND_BACKOFF_MAX`.
//!
//! With one apiserver it is asked every `HEALTH_EVERY_ALONE`: when it has
//! not answered for `FAILOVER_AFTER` the outage is reported once
//! (`apiserver-unready`, counted, logged as an error) while the maps keep
//! their state. When it answers again the watches start over at once with
//! a fresh list: one that failed meanwhile would otherwise wait out
//! kube-runtime's backoff (up to half a minute after a long outage), and
//! one on a connection that a silent cut killed (no FIN, no RST: TCP keeps
//! retrying for up to ~15 minutes) would never hear another event. So the
//! agent converges within seconds of the apiserver's return; the price is
//! a list per resource per outage, and nothing is pruned until it is
//! complete.
use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::{
    runtime::{watcher, WatchStreamExt as _},
    Api, Client,
};
use prometheus_client::{metrics::counter::Counter, registry::Registry};
use tokio::sync::mpsc;

use super::{
    slim::{self, Watched},
    store::{Output, Store},
    translate::WATCH_SELECTOR,
};
use crate::source::SourceEvent;

/// How often the apiserver in use is asked whether it answers (with more
/// than one apiserver).
pub const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// How often the only apiserver is asked whether it answers (cheaper: it
/// only says when an outage began and ended).
pub const HEALTH_EVERY_ALONE: Duration = Duration::from_secs(5);
/// How long the apiserver in use may not answer before the watches move to
/// the next one (or, with one apiserver, before the outage is reported).
pub const FAILOVER_AFTER: Duration = Duration::from_secs(3);
/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest wait between rounds over every apiserver when none answers.
pub const ROUND_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Whether `client`'s apiserver answers `/readyz` within `PROBE_TIMEOUT`.
async fn ready(client: Client) -> bool {
    let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    tokio::time::timeout(PROBE_TIMEOUT, client.request_text(req))
        .await
        .is_ok_and(|r| r.is_ok_and(|body| body.trim() == "ok"))
}

/// One apiserver: how the logs name it, and a client for it.
#[derive(Clone)]
pub struct ApiServer {
    pub url: String,
    pub client: Client,
}

#[derive(Clone, Debug)]
pub struct WatchConfig {
    /// This node (downward API spec.nodeName): locality and NodePort addresses.
    pub node_name: String,
    /// --nodeport-addresses: which node addresses serve NodePorts (empty: all).
    pub nodeports: crate::source::nodeports::NodePortAddresses,
    /// How long to gather changes before applying them.
    pub debounce: Duration,
    /// Written from this node's Node: read by the proxy health server.
    pub node_eligibility: std::sync::Arc<crate::health::NodeEligibility>,
    /// --lb-algorithm: for Services without the algorithm annotation.
    pub default_algorithm: crate::model::Algorithm,
    /// Counts the objects the watches deliver.
    pub changes: ObjectChanges,
    /// This node's own addresses as they change (`agent::addresses`):
    /// NodePorts follow them. None: read once at start.
    pub local_addresses: Option<tokio::sync::watch::Receiver<crate::agent::addresses::Addresses>>,
}

/// Services and EndpointSlices the watches delivered, list items included:
/// what kube-proxy's change trackers count on every informer event
/// (`kubeproxy_sync_proxy_rules_{service,endpoint}_changes_total`).
#[derive(Clone, Debug, Default)]
pub struct ObjectChanges {
    pub services: Counter,
    pub endpoint_slices: Counter,
}

impl ObjectChanges {
    /// Registers under kube-proxy's names: `registry` must have no prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            self.services.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            self.endpoint_slices.clone(),
        );
    }

    /// Counts `ev` when it carries an object (an add, update, delete or list
    /// item; not a list's start or end).
    fn count<K>(counter: &Counter, ev: &watcher::Event<K>) {
        use watcher::Event;
        if matches!(ev, Event::Apply(_) | Event::Delete(_) | Event::InitApply(_)) {
            counter.inc();
        }
    }
}

fn watch_error(kind: &str, e: &watcher::Error) -> SourceEvent {
    let reason = match e {
        watcher::Error::InitialListFailed(_) => "list-failed",
        watcher::Error::WatchStartFailed(_) => "watch-start-failed",
        watcher::Error::WatchError(status) if status.code == 410 => "watch-expired",
        watcher::Error::WatchError(_) => "watch-error",
        watcher::Error::WatchFailed(_) => "watch-failed",
        _ => "watch-error",
    };
    SourceEvent::Error {
        source: "kubernetes",
        reason,
        message: format!("watching {kind}: {e}; retrying, the maps keep their state"),
    }
}

/// The slim object of a watch event (its `ObjectMeta` copy was the watcher's).
fn unwrap<T>(ev: watcher::Event<Watched<T>>) -> watcher::Event<T> {
    use watcher::Event;
    match ev {
        Event::Apply(w) => Event::Apply(w.object),
        Event::Delete(w) => Event::Delete(w.object),
        Event::Init => Event::Init,
        Event::InitApply(w) => Event::InitApply(w.object),
        Event::InitDone => Event::InitDone,
    }
}

/// Runs until `tx` is closed, on `servers[0]`, moving to the next when the
/// one in use stops answering.
pub async fn run(servers: Vec<ApiServer>, cfg: WatchConfig, tx: mpsc::Sender<SourceEvent>) {
    assert!(!servers.is_empty(), "at least one apiserver");
    let mut store = Store::new(&cfg.node_name, cfg.nodeports.clone())
        .with_default_algorithm(cfg.default_algorithm);
    let mut addresses = cfg.local_addresses.clone();
    let mut current = 0;
    // Apiservers left in a row without one having answered.
    let mut silent = 0;
    let mut backoff = Duration::from_secs(1);
    loop {
        let server = &servers[current];
        tracing::info!(server = %server.url, "watching the apiserver");
        match watch(
            server,
            servers.len() > 1,
            &cfg,
            &mut store,
            &mut addresses,
            &tx,
        )
        .await
        {
            Ended::Closed => return,
            Ended::Recovered {
                after,
                watch_failed,
            } => {
                let why = if watch_failed {
                    "a watch failed meanwhile"
                } else {
                    "a watch may sit on a connection the outage killed"
                };
                tracing::info!(
                    server = %server.url,
                    "the apiserver answers again after {after:.0?}; {why}: watching anew now (a fresh list; nothing is pruned until it is complete)"
                );
                backoff = Duration::from_secs(1);
                silent = 0;
            }
            Ended::Unhealthy { since, answered } => {
                silent = if answered { 1 } else { silent + 1 };
                if answered {
                    backoff = Duration::from_secs(1);
                }
                if silent >= servers.len() {
                    let message = format!(
                        "no apiserver of {} answers; trying again in {backoff:.0?}, the maps keep their state",
                        servers.len()
                    );
                    tracing::error!("{message}");
                    let ev = SourceEvent::Error {
                        source: "kubernetes",
                        reason: "no-apiserver",
                        message,
                    };
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(ROUND_BACKOFF_MAX);
                    silent = 0;
                }
                let next = (current + 1) % servers.len();
                let message = format!(
                    "the apiserver {} has not answered for {:.0?}; watching {} instead (it lists everything again: nothing is pruned until that list is complete)",
                    server.url,
                    since.elapsed(),
                    servers[next].url
                );
                tracing::warn!("{message}");
                let ev = SourceEvent::Error {
                    source: "kubernetes",
                    reason: "apiserver-failover",
                    message,
                };
                if tx.send(ev).await.is_err() {
                    return;
                }
                current = next;
            }
        }
    }
}

/// Why `watch` returned.
enum Ended {
    /// The agent is stopping.
    Closed,
    /// The apiserver has not answered since `since`; `answered`: it did
    /// before that, while it was watched.
    Unhealthy { since: Instant, answered: bool },
    /// The only apiserver answers again after an outage of `after`
    /// (`watch_failed`: a watch reported an error meanwhile): watch it anew.
    Recovered { after: Duration, watch_failed: bool },
}

/// Watches `server` until the agent stops or, with `failover`, until the
/// server stops answering; alone, until it answers again after an outage.
async fn watch(
    server: &ApiServer,
    failover: bool,
    cfg: &WatchConfig,
    store: &mut Store,
    addresses: &mut Option<tokio::sync::watch::Receiver<crate::agent::addresses::Addresses>>,
    tx: &mpsc::Sender<SourceEvent>,
) -> Ended {
    let client = server.client.clone();
    let selector = watcher::Config::default().labels(WATCH_SELECTOR);
    // Slim types: decoded without managedFields and everything else the
    // translation does not read (`slim`).
    let mut services = watcher(
        Api::<Watched<slim::Service>>::all(client.clone()),
        selector.clone(),
    )
    .default_backoff()
    .boxed();
    let mut slices = watcher(
        Api::<Watched<slim::EndpointSlice>>::all(client.clone()),
        selector,
    )
    .default_backoff()
    .boxed();
    let node_cfg = watcher::Config::default().fields(&format!("metadata.name={}", cfg.node_name));
    let mut nodes = watcher(Api::<Node>::all(client.clone()), node_cfg)
        .default_backoff()
        .boxed();

    // When the first unsent change arrived.
    let mut first_change: Option<Instant> = None;
    // The health probe (with more than one apiserver): one at a time, in
    // flight beside the watches; since when the apiserver has not answered.
    let mut health = tokio::time::interval(if failover {
        HEALTH_EVERY
    } else {
        HEALTH_EVERY_ALONE
    });
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probe: Option<(Instant, futures::future::BoxFuture<'static, bool>)> = None;
    let mut failing_since: Option<Instant> = None;
    let mut answered_once = false;
    // Alone: the outage was reported; a watch failed since the last answer.
    let mut reported = false;
    let mut watch_failed = false;
    loop {
        let deadline = first_change.map(|t| tokio::time::Instant::from_std(t + cfg.debounce));
        tokio::select! {
            _ = health.tick(), if probe.is_none() => {
                probe = Some((Instant::now(), Box::pin(ready(client.clone()))));
                continue;
            }
            answered = async { (&mut probe.as_mut().unwrap().1).await }, if probe.is_some() => {
                let (asked, _) = probe.take().unwrap();
                match (answered, failing_since) {
                    (true, since) => {
                        failing_since = None;
                        answered_once = true;
                        if reported {
                            let after = since.map_or(Duration::ZERO, |t| t.elapsed());
                            return Ended::Recovered { after, watch_failed };
                        }
                        watch_failed = false;
                    }
                    (false, None) => failing_since = Some(asked),
                    (false, Some(t)) if t.elapsed() >= FAILOVER_AFTER => {
                        if failover {
                            return Ended::Unhealthy { since: t, answered: answered_once };
                        }
                        if !reported {
                            reported = true;
                            let message = format!(
                                "the apiserver {} has not answered /readyz for {:.0?}; the maps keep their state, watching on",
                                server.url,
                                t.elapsed()
                            );
                            tracing::error!("{message}");
                            let ev = SourceEvent::Error { source: "kubernetes", reason: "apiserver-unready", message };
                            if tx.send(ev).await.is_err() {
                                return Ended::Closed;
                            }
                        }
                    }
                    (false, Some(_)) => {}
                }
                continue;
            }
            Some(ev) = services.next() => match ev {
                Ok(ev) => {
                    ObjectChanges::count(&cfg.changes.services, &ev);
                    store.on_service(unwrap(ev));
                }
                Err(e) => {
                    watch_failed = true;
                    if tx.send(watch_error("services", &e)).await.is_err() { return Ended::Closed }
                }
            },
            Some(ev) = slices.next() => match ev {
                Ok(ev) => {
                    ObjectChanges::count(&cfg.changes.endpoint_slices, &ev);
                    store.on_slice(unwrap(ev));
                }
                Err(e) => {
                    watch_failed = true;
                    if tx.send(watch_error("endpointslices", &e)).await.is_err() { return Ended::Closed }
                }
            },
            Some(ev) = nodes.next() => match ev {
                Ok(ev) => {
                    store.on_node(ev);
                    cfg.node_eligibility.set(store.node_eligible());
                }
                Err(e) => {
                    watch_failed = true;
                    if tx.send(watch_error("nodes", &e)).await.is_err() { return Ended::Closed }
                }
            },
            changed = async { addresses.as_mut().unwrap().changed().await }, if addresses.is_some() => {
                match changed {
                    Ok(()) => {
                        let local: Vec<IpAddr> = addresses.as_mut().unwrap().borrow_and_update().iter().copied().collect();
                        if store.set_local_addresses(local) {
                            tracing::info!(nodeports = ?store.node().nodeport_addresses, "this node's addresses changed: NodePorts follow");
                        }
                    }
                    // The follower stopped (it said why): read once at start from now on.
                    Err(_) => *addresses = None,
                }
            }
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() => {
                let observed = first_change.take().unwrap_or_else(Instant::now);
                for w in store.take_warnings() {
                    if tx.send(SourceEvent::Warning { source: "kubernetes", reason: w.reason, message: w.message }).await.is_err() { return Ended::Closed }
                }
                let event = match store.take_output() {
                    Some(Output::Full(model)) => SourceEvent::Full { model, observed, triggers: store.take_triggers() },
                    Some(Output::Changes(changes)) => SourceEvent::Changes { changes, observed, triggers: store.take_triggers() },
                    None => continue,
                };
                if tx.send(event).await.is_err() {
                    return Ended::Closed;
                }
                continue;
            }
            else => return Ended::Closed,
        }
        if first_change.is_none() && store.has_output() {
            first_change = Some(Instant::now());
        }
    }
}
