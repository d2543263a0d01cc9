//! Prometheus metrics of the agent (prometheus-client) and the health state
//! behind `/healthz`. Counters kept by the programs (drops, events,
//! translations) are read from the pinned per-CPU maps at scrape time by
//! `collector::BpfCollector`, so they are exact and cost nothing between scrapes.
pub mod collector;
pub mod kube_proxy;
pub mod server;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};

use crate::{
    maps::{capacity::Bounded, Family as AddrFamily, MapSizes, MapState},
    reconcile::ReconcileStats,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabels {
    pub map: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SeedLabels {
    pub fingerprint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceErrorLabels {
    pub source: String,
    pub reason: String,
}

#[derive(Clone)]
pub struct Metrics {
    pub reconcile_duration: Histogram,
    pub propagation_delay: Histogram,
    pub network_programming: Histogram,
    pub reconciles: Family<ResultLabels, Counter>,
    /// 1 under the Maglev seed's fingerprint: every node should show the same.
    pub maglev_seed: Family<SeedLabels, Gauge>,
    pub map_writes: Counter,
    pub services: Gauge,
    pub frontends: Gauge,
    pub backends: Gauge,
    pub map_entries: Family<MapLabels, Gauge>,
    pub map_capacity: Family<MapLabels, Gauge>,
    pub source_errors: Family<SourceErrorLabels, Counter>,
    pub sockets_destroyed: Counter,
    pub socket_scan_errors: Counter,
    pub conntrack_gc: crate::conntrack::gc::GcMetrics,
    pub health: Arc<Mutex<Health>>,
    pub health_check_listen_errors: Counter,
    /// The same syncs and latencies under kube-proxy's names.
    pub kube_proxy: kube_proxy::KubeProxyMetrics,
    /// The frontends whose counters the lb_service_* metrics export (of
    /// services that opt in), published by the worker after each run.
    pub service_frontends: collector::ServiceFrontends,
}

/// What `/healthz` reports, like kube-proxy's: healthy while every observed
/// change reaches the maps within the grace period.
#[derive(Clone, Debug, Default)]
pub struct Health {
    pub installed: bool,
    pub last_updated: Option<SystemTime>,
    /// A valid change was observed and is not applied yet.
    pub pending_since: Option<Instant>,
    pub last_error: Option<String>,
}

impl Health {
    pub fn healthy(&self, grace: Duration) -> bool {
        self.installed && self.pending_since.is_none_or(|t| t.elapsed() < grace)
    }
}

impl Metrics {
    /// Creates the metrics and registers them (and the BPF collector for
    /// `pin_dir`) in a new registry: ours under `lb_` (the registry's
    /// `lb` sub-registry), kube-proxy's names at its root.
    pub fn new(pin_dir: PathBuf) -> (Self, Registry) {
        let mut root = Registry::default();
        let m = Metrics {
            // 10 µs .. ~5 s
            reconcile_duration: Histogram::new(exponential_buckets(1e-5, 2.0, 20)),
            // 100 µs .. ~50 s
            propagation_delay: Histogram::new(exponential_buckets(1e-4, 2.0, 20)),
            // 1 ms .. ~9 min
            network_programming: Histogram::new(exponential_buckets(1e-3, 2.0, 20)),
            reconciles: Family::default(),
            maglev_seed: Family::default(),
            map_writes: Counter::default(),
            services: Gauge::default(),
            frontends: Gauge::default(),
            backends: Gauge::default(),
            map_entries: Family::default(),
            map_capacity: Family::default(),
            source_errors: Family::default(),
            sockets_destroyed: Counter::default(),
            socket_scan_errors: Counter::default(),
            conntrack_gc: Default::default(),
            health: Arc::new(Mutex::new(Health::default())),
            health_check_listen_errors: Counter::default(),
            kube_proxy: Default::default(),
            service_frontends: Default::default(),
        };
        m.kube_proxy.register(&mut root);
        let registry = root.sub_registry_with_prefix("lb");
        registry.register(
            "maglev_seed_info",
            "1 under the fingerprint of the Maglev tables' seed (built-in: none set); nodes that differ pick different backends for one flow",
            m.maglev_seed.clone(),
        );
        registry.register(
            "health_check_listen_errors",
            "healthCheckNodePorts that could not be opened (each failure streak once)",
            m.health_check_listen_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time to compute and apply one change to the maps",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "propagation_delay_seconds",
            "Time from a change being observed (file event, apiserver event) to the maps being updated",
            m.propagation_delay.clone(),
        );
        registry.register(
            "network_programming_duration_seconds",
            "Time from the change upstream (a Pod or Service write, from the EndpointSlice's \
             endpoints.kubernetes.io/last-change-trigger-time) to the maps holding it: \
             kube-proxy's network programming latency (Kubernetes mode)",
            m.network_programming.clone(),
        );
        registry.register(
            "reconciles",
            "Reconcile attempts by result",
            m.reconciles.clone(),
        );
        registry.register(
            "map_writes",
            "Map element updates and deletes written",
            m.map_writes.clone(),
        );
        registry.register(
            "services",
            "Services in the applied model",
            m.services.clone(),
        );
        registry.register(
            "frontends",
            "Frontends (address, port, protocol) in the maps",
            m.frontends.clone(),
        );
        registry.register(
            "backends",
            "Distinct backends in the maps",
            m.backends.clone(),
        );
        registry.register(
            "map_entries",
            "Entries in each agent-written map",
            m.map_entries.clone(),
        );
        registry.register(
            "map_capacity",
            "Capacity (max_entries) of each agent-written map",
            m.map_capacity.clone(),
        );
        registry.register(
            "source_errors",
            "Inputs refused by a source (invalid or unreadable), the maps kept their state",
            m.source_errors.clone(),
        );
        registry.register(
            "sockets_destroyed",
            "Connected UDP sockets destroyed because the backend socket LB gave them was removed",
            m.sockets_destroyed.clone(),
        );
        registry.register(
            "socket_scan_errors",
            "Network namespaces whose sockets could not be scanned or destroyed",
            m.socket_scan_errors.clone(),
        );
        let gc = &m.conntrack_gc;
        registry.register(
            "conntrack_gc_runs",
            "Sweeps of the north-south conntrack table",
            gc.runs.clone(),
        );
        registry.register(
            "conntrack_gc_deleted",
            "Expired conntrack entries deleted (their SNAT ports free again)",
            gc.deleted.clone(),
        );
        registry.register(
            "conntrack_gc_alive_entries",
            "Live conntrack entries after the last sweep",
            gc.alive.clone(),
        );
        registry.register(
            "conntrack_gc_interval_seconds",
            "Time until the next sweep (adapts to how much the last one deleted)",
            gc.interval_seconds.clone(),
        );
        registry.register(
            "conntrack_gc_last_duration_milliseconds",
            "How long the last sweep took",
            gc.last_duration_ms.clone(),
        );
        registry.register_collector(Box::new(collector::BpfCollector {
            pin_dir,
            service_frontends: m.service_frontends.clone(),
        }));
        (m, root)
    }

    pub fn observed_change(&self) {
        let mut h = self.health.lock().unwrap();
        h.pending_since.get_or_insert_with(Instant::now);
    }

    pub fn source_error(&self, source: &str, reason: &str, message: String) {
        self.source_errors
            .get_or_create(&SourceErrorLabels {
                source: source.into(),
                reason: reason.into(),
            })
            .inc();
        let mut h = self.health.lock().unwrap();
        // The maps keep a good state: nothing is pending for the data path.
        h.pending_since = None;
        h.last_error = Some(message);
    }

    /// Records a successful reconcile. `observed`: when the change that
    /// triggered it was first seen.
    /// Part of an input was skipped; not an error of the whole input.
    pub fn source_warning(&self, source: &str, reason: &str) {
        self.source_errors
            .get_or_create(&SourceErrorLabels {
                source: source.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Changes made upstream at `triggers` are now in the maps.
    pub fn network_programmed(&self, triggers: &[crate::source::Trigger]) {
        let now = std::time::SystemTime::now();
        for t in triggers {
            // A clock behind the controller's counts as zero, not negative.
            let d = now.duration_since(t.at).unwrap_or_default().as_secs_f64();
            self.network_programming.observe(d);
            self.kube_proxy.programmed(t.family, d);
        }
    }

    pub fn reconciled(
        &self,
        stats: &ReconcileStats,
        observed: Option<Instant>,
        state: &MapState,
        services: usize,
        cap: MapSizes,
    ) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: "ok".into(),
            })
            .inc();
        self.reconcile_duration
            .observe(stats.duration.as_secs_f64());
        self.kube_proxy
            .synced(stats.duration.as_secs_f64(), SystemTime::now());
        if let Some(t) = observed {
            self.propagation_delay.observe(t.elapsed().as_secs_f64());
        }
        self.map_writes.inc_by(stats.ops as u64);
        self.state_gauges(state, services, cap);
        self.in_sync(SystemTime::now(), None);
    }

    /// Records a reconcile that applied everything but the services it
    /// refused (input that cannot fit: `ReconcileError::Refused`). Counted
    /// as an error, named in `last_error` and `lbctl status`, but the maps
    /// hold everything else: the sync time moves on and nothing is pending,
    /// so one oversized service does not make every node's /healthz fail
    /// (and take it out of every load balancer).
    pub fn reconciled_but_refused(
        &self,
        message: String,
        state: &MapState,
        services: usize,
        cap: MapSizes,
    ) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: "error".into(),
            })
            .inc();
        self.state_gauges(state, services, cap);
        let now = SystemTime::now();
        self.kube_proxy.synced_at(now);
        self.in_sync(now, Some(message));
    }

    /// The maps hold what the sources said (`error`: what was left out).
    fn in_sync(&self, now: SystemTime, error: Option<String>) {
        let mut h = self.health.lock().unwrap();
        h.last_updated = Some(now);
        h.pending_since = None;
        h.last_error = error;
    }

    /// What the maps hold after a reconcile: services, frontends, backends,
    /// and every map's fill.
    fn state_gauges(&self, state: &MapState, services: usize, cap: MapSizes) {
        self.services.set(services as i64);
        self.frontends.set(state.frontends().count() as i64);
        self.backends.set(state.backends.len() as i64);
        self.map_fill(state, cap);
    }

    /// Entries and capacity of every map a reconcile fills.
    fn map_fill(&self, state: &MapState, cap: MapSizes) {
        // Every map a reconcile can fill (`Bounded`), so an alert on
        // entries / capacity covers whichever fills first.
        for m in Bounded::ALL {
            let max = i64::from(m.max(&cap));
            let per_map: Vec<(&str, usize)> = if m == Bounded::SourceRanges {
                // Counted together by the checks; each family has its map.
                vec![
                    (
                        lb_common::maps::LB4_SRC_RANGES,
                        state.source_range_entries_of(AddrFamily::V4),
                    ),
                    (
                        lb_common::maps::LB6_SRC_RANGES,
                        state.source_range_entries_of(AddrFamily::V6),
                    ),
                ]
            } else {
                vec![(m.map(), m.len(state))]
            };
            for (map, n) in per_map {
                let labels = MapLabels { map: map.into() };
                self.map_entries.get_or_create(&labels).set(n as i64);
                self.map_capacity.get_or_create(&labels).set(max);
            }
        }
    }

    pub fn reconcile_failed(&self, message: String) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: "error".into(),
            })
            .inc();
        self.health.lock().unwrap().last_error = Some(message);
    }
}
