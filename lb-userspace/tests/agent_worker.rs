//! The agent's reconcile worker (`lb::agent::worker`) against the fake
//! maps, in milliseconds and without root: what sources post reaches the
//! maps, refusals are left for `lbctl status`, removed UDP backends reach
//! the socket cleanup, source errors change nothing and are counted, and
//! with `--external-ips-in-cluster owned-only` the node's addresses decide
//! whether sockets may translate an external IP.
use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use lb::{
    agent::{
        mailbox::Pending,
        worker::{AgentStatus, Worker},
    },
    desired::{BuildConfig, ExternalIpsInCluster},
    maps::{fake::FakeMaps, LbMaps as _, MapSizes},
    metrics::Metrics,
    model::Model,
    reconcile::Reconciler,
    source::SourceEvent,
};
use lb_common::service::SVC_FLAG_FOREIGN_EXTERNAL_IP;

fn model(yaml: &str) -> Model {
    lb::source::file::parse::parse(yaml).unwrap()
}

fn full(yaml: &str) -> Pending {
    Pending {
        full: Some(model(yaml)),
        observed: Some(Instant::now()),
        ..Default::default()
    }
}

struct Harness {
    worker: Worker<FakeMaps>,
    removed: Arc<Mutex<Vec<(IpAddr, u16)>>>,
    addresses: Arc<Mutex<Option<BTreeSet<IpAddr>>>>,
    registry: prometheus_client::registry::Registry,
    dir: std::path::PathBuf,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn harness(tag: &str, capacity: MapSizes) -> Harness {
    harness_with(tag, capacity, BuildConfig::default())
}

/// The agent with `--external-ips-in-cluster owned-only`.
fn owned_only() -> BuildConfig {
    BuildConfig {
        external_ips_in_cluster: ExternalIpsInCluster::OwnedOnly,
        ..Default::default()
    }
}

fn harness_with(tag: &str, capacity: MapSizes, cfg: BuildConfig) -> Harness {
    let dir = std::env::temp_dir().join(format!("lb-worker-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (metrics, registry) = Metrics::new(dir.join("pins"));
    let removed = Arc::new(Mutex::new(Vec::new()));
    let addresses: Arc<Mutex<Option<BTreeSet<IpAddr>>>> = Arc::new(Mutex::new(None));
    let (r, a) = (removed.clone(), addresses.clone());
    let worker = Worker::new(
        Reconciler::restore(FakeMaps::with_capacity(capacity))
            .unwrap()
            .with_config(cfg),
        metrics,
        Box::new(move |gone| r.lock().unwrap().extend(gone)),
    )
    .with_status_file(dir.join("status.json"))
    .with_retry_every(Duration::from_millis(10))
    .with_node_addresses(Box::new(move || a.lock().unwrap().clone()));
    Harness {
        worker,
        removed,
        addresses,
        registry,
        dir,
    }
}

fn metrics_text(h: &Harness) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, &h.registry).unwrap();
    s
}

const TWO: &str = "services:
  - {name: web, clusterIPs: [10.96.0.1], ports: [{port: 80}], backends: [{address: 10.0.0.1}, {address: 10.0.0.2}]}
  - {name: dns, clusterIPs: [10.96.0.10], ports: [{port: 53, protocol: UDP}], backends: [{address: 10.0.0.3}, {address: 10.0.0.4}]}
";

#[test]
fn a_full_model_then_changes_reach_the_maps_and_removed_udp_backends_reach_the_socket_cleanup() {
    let mut h = harness("full", MapSizes::default());
    h.worker.step(full(TWO));
    let state = h.worker.reconciler().maps().dump().unwrap();
    assert_eq!(state.frontends().count(), 2);
    assert_eq!(state.backends.len(), 4);

    // The DNS service loses a backend: its connected UDP sockets must fail over.
    let dns = model(&TWO.replace(", {address: 10.0.0.4}", ""))
        .services
        .into_iter()
        .find(|(n, _)| n.to_string().ends_with("/dns"))
        .unwrap();
    h.worker.step(Pending {
        changes: [(dns.0, Some(dns.1))].into_iter().collect(),
        observed: Some(Instant::now()),
        ..Default::default()
    });
    assert_eq!(
        *h.removed.lock().unwrap(),
        vec![("10.0.0.4".parse::<IpAddr>().unwrap(), 53)]
    );
    assert_eq!(
        h.worker.reconciler().maps().dump().unwrap().backends.len(),
        3
    );
    let status: AgentStatus =
        serde_json::from_slice(&std::fs::read(h.dir.join("status.json")).unwrap()).unwrap();
    assert!(status.refused.is_empty());
    assert_eq!(status.layout, lb_common::maps::LAYOUT_VERSION);
}

#[test]
fn a_service_that_does_not_fit_is_left_for_lbctl_status_and_the_rest_is_applied() {
    // Room for one service's entries (marker, master, two slots), not two.
    let mut h = harness(
        "refused",
        MapSizes {
            services: 5,
            ..MapSizes::default()
        },
    );
    h.worker.step(full(TWO));
    let state = h.worker.reconciler().maps().dump().unwrap();
    assert_eq!(state.frontends().count(), 1, "one fits");
    let status: AgentStatus =
        serde_json::from_slice(&std::fs::read(h.dir.join("status.json")).unwrap()).unwrap();
    assert_eq!(status.refused.len(), 1, "{status:?}");
    assert!(
        status.refused[0].error.contains("--map-size-services"),
        "the fix is named: {status:?}"
    );
    let text = metrics_text(&h);
    assert!(
        text.contains("lb_reconciles_total{result=\"error\"} 1"),
        "{text}"
    );
}

#[test]
fn a_source_error_changes_nothing_and_is_counted() {
    let mut h = harness("error", MapSizes::default());
    h.worker.step(full(TWO));
    let before = h.worker.reconciler().maps().dump().unwrap();
    h.worker.step(Pending {
        notes: vec![SourceEvent::Error {
            source: "file",
            reason: "invalid",
            message: "services[0].ports[0].port: 0 is not a port".into(),
        }],
        ..Default::default()
    });
    assert_eq!(h.worker.reconciler().maps().dump().unwrap(), before);
    let text = metrics_text(&h);
    assert!(
        text.contains("lb_source_errors_total{source=\"file\",reason=\"invalid\"} 1"),
        "{text}"
    );
}

/// The default (`translate`): an external IP is translated for sockets
/// whether the node holds it or not, as kube-proxy does, and gaining or
/// losing the address writes nothing.
#[test]
fn by_default_every_external_ip_is_translated_for_sockets_whoever_holds_it() {
    let mut h = harness("extip-default", MapSizes::default());
    h.worker.step(full(
        "services: [{name: ext, clusterIPs: [10.96.0.5], externalIPs: [198.51.100.7], ports: [{port: 80}], backends: [{address: 10.0.0.1}]}]",
    ));
    let ext: IpAddr = "198.51.100.7".parse().unwrap();
    let flags = |h: &Harness| {
        let state = h.worker.reconciler().maps().dump().unwrap();
        let (_, v) = state.frontends().find(|(k, _)| k.address == ext).unwrap();
        v.flags
    };
    assert_eq!(flags(&h) & SVC_FLAG_FOREIGN_EXTERNAL_IP, 0);
    h.worker.reconciler_mut().maps_mut().take_log();
    for held in [Some([ext].into_iter().collect()), Some(BTreeSet::new())] {
        *h.addresses.lock().unwrap() = held;
        h.worker.step(Pending::default());
        assert_eq!(flags(&h) & SVC_FLAG_FOREIGN_EXTERNAL_IP, 0);
    }
    assert!(
        h.worker.reconciler_mut().maps_mut().take_log().is_empty(),
        "the node's addresses changed nothing"
    );
}

#[test]
fn owned_only_the_nodes_addresses_decide_whether_sockets_may_translate_an_external_ip() {
    let mut h = harness_with("extip", MapSizes::default(), owned_only());
    h.worker.step(full(
        "services: [{name: ext, clusterIPs: [10.96.0.5], externalIPs: [198.51.100.7], ports: [{port: 80}], backends: [{address: 10.0.0.1}]}]",
    ));
    let ext: IpAddr = "198.51.100.7".parse().unwrap();
    let foreign = |h: &Harness| {
        let state = h.worker.reconciler().maps().dump().unwrap();
        let (_, v) = state.frontends().find(|(k, _)| k.address == ext).unwrap();
        v.flags & SVC_FLAG_FOREIGN_EXTERNAL_IP != 0
    };
    assert!(foreign(&h), "not the node's: sockets leave it alone");
    // The node gains the address: the next round (an idle one) re-applies.
    *h.addresses.lock().unwrap() = Some([ext].into_iter().collect());
    h.worker.step(Pending::default());
    assert!(!foreign(&h), "the node's own: translated");
    // Addresses unknown this round (None): the last ones stay.
    *h.addresses.lock().unwrap() = None;
    h.worker.step(Pending::default());
    assert!(!foreign(&h));
    // Given up again.
    *h.addresses.lock().unwrap() = Some(BTreeSet::new());
    h.worker.step(Pending::default());
    assert!(foreign(&h));
}

/// A write that fails leaves a full sync due; the worker makes it when idle
/// (no new event needed), and a fresh worker with nothing from a source yet
/// writes nothing when idle (its empty target would sweep the pinned state).
#[test]
fn a_failed_write_is_repaired_by_the_idle_retry_and_nothing_is_written_before_any_input() {
    let mut h = harness("retry", MapSizes::default());
    h.worker.step(Pending::default());
    assert!(
        h.worker.reconciler_mut().maps_mut().take_log().is_empty(),
        "idle before any input: nothing written"
    );
    h.worker.reconciler_mut().maps_mut().fail_after = Some(3);
    h.worker.step(full(TWO));
    assert_ne!(
        h.worker
            .reconciler()
            .maps()
            .dump()
            .unwrap()
            .frontends()
            .count(),
        2,
        "the sync stopped at the failed write"
    );
    h.worker.step(Pending::default());
    let state = h.worker.reconciler().maps().dump().unwrap();
    assert_eq!(state.frontends().count(), 2, "repaired without a new event");
    assert_eq!(state.backends.len(), 4);
    assert_eq!(&state, h.worker.reconciler().state());
}

/// A restarted agent whose node addresses change before its source's first
/// model keeps the pinned state (a run then would sweep it: the target is
/// still empty), and the first model is built with the new addresses.
#[test]
fn node_addresses_changing_before_the_first_model_sweep_nothing_and_reach_the_first_model() {
    const EXT: &str = "services: [{name: ext, clusterIPs: [10.96.0.5], externalIPs: [198.51.100.7], ports: [{port: 80}], backends: [{address: 10.0.0.1}]}]";
    // Pinned by an agent that did not hold the address: marked foreign.
    let mut before = Reconciler::restore(FakeMaps::default())
        .unwrap()
        .with_config(owned_only());
    before.reconcile(&model(EXT)).unwrap();
    let pinned = before.maps().state.clone();
    let mut h = harness_with("extip-restart", MapSizes::default(), owned_only());
    *h.worker.reconciler_mut() = Reconciler::restore(FakeMaps {
        state: pinned.clone(),
        ..Default::default()
    })
    .unwrap()
    .with_config(owned_only());
    let ext: IpAddr = "198.51.100.7".parse().unwrap();
    *h.addresses.lock().unwrap() = Some([ext].into_iter().collect());
    h.worker.step(Pending::default());
    assert_eq!(
        h.worker.reconciler().maps().state,
        pinned,
        "nothing swept before the first model"
    );
    h.worker.step(full(EXT));
    let state = h.worker.reconciler().maps().dump().unwrap();
    let (_, v) = state.frontends().find(|(k, _)| k.address == ext).unwrap();
    assert_eq!(
        v.flags & SVC_FLAG_FOREIGN_EXTERNAL_IP,
        0,
        "the node's own address by the first model"
    );
}
