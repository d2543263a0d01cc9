//! kube-proxy's own metric names, beside ours, so that the dashboards and
//! alerts of a cluster that ran kube-proxy keep working. Names, help texts,
//! buckets and the `ip_family` label are kube-proxy's
//! (k8s.io/kubernetes v1.35 pkg/proxy/metrics/metrics.go); the meaning is
//! mapped onto the agent:
//!
//! * a *sync* is one reconcile that wrote its changes to the maps: it covers
//!   both families at once, so it is observed under `IPv4` and `IPv6`, as a
//!   dual-stack kube-proxy's two proxiers each observe their own sync;
//! * network programming latency runs from an EndpointSlice's
//!   `endpoints.kubernetes.io/last-change-trigger-time` to the maps holding
//!   the change, under the slice's address family;
//! * the change counters (`ObjectChanges` in the Kubernetes source) count
//!   every Service and EndpointSlice the watches deliver, list items
//!   included, as kube-proxy's change trackers count every informer event.
//!
//! Not kept: the `_pending` gauges, the full/partial sync split, and the
//! iptables/nftables rule counts, which have no meaning here. Three
//! differences a scrape shows: help texts lack component-base's `[ALPHA] `
//! stability prefix and end in a full stop (prometheus-client adds one),
//! and bucket bounds are written `le="1.0"` where Go
//! writes `le="1"` (prometheus-client's float format; Prometheus 3 reads
//! both as the same bound, Prometheus 2 keeps the text).
//!
//! Where the meaning differs from kube-proxy's: a sync is observed only when
//! it succeeded (kube-proxy times failed ones too), and nothing syncs on a
//! timer while nothing changes (kube-proxy resyncs periodically), so the last
//! sync time of a quiet cluster grows old and an alert on its age needs a
//! longer threshold than kube-proxy's.
use std::time::SystemTime;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, linear_buckets, Histogram},
    },
    registry::Registry,
};

use crate::maps::Family as AddrFamily;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IpFamilyLabels {
    /// `IPv4` or `IPv6`, as kube-proxy writes it (v1.IPFamily).
    pub ip_family: &'static str,
}

impl IpFamilyLabels {
    fn of(family: AddrFamily) -> Self {
        Self {
            ip_family: match family {
                AddrFamily::V4 => "IPv4",
                AddrFamily::V6 => "IPv6",
            },
        }
    }
}

type HistogramFamily = Family<IpFamilyLabels, Histogram, fn() -> Histogram>;

#[derive(Clone)]
pub struct KubeProxyMetrics {
    pub sync_duration: HistogramFamily,
    pub last_sync: Family<IpFamilyLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub network_programming: HistogramFamily,
}

/// kube-proxy's `SyncProxyRulesLatency` buckets: 1 ms doubling to ~16 s.
fn sync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// kube-proxy's `NetworkProgrammingLatency` buckets: 0, 0.25 s, 0.5 s,
/// every second to 59 s, every 5 s to 115 s, every 30 s to 5 min (the 0 is
/// component-base's `MergeBuckets`, which starts from one zero bound).
fn programming_buckets() -> Histogram {
    Histogram::new(
        std::iter::once(0.0)
            .chain(linear_buckets(0.25, 0.25, 2))
            .chain(linear_buckets(1.0, 1.0, 59))
            .chain(linear_buckets(60.0, 5.0, 12))
            .chain(linear_buckets(120.0, 30.0, 7)),
    )
}

impl Default for KubeProxyMetrics {
    fn default() -> Self {
        Self {
            sync_duration: Family::new_with_constructor(sync_buckets),
            last_sync: Family::default(),
            network_programming: Family::new_with_constructor(programming_buckets),
        }
    }
}

impl KubeProxyMetrics {
    /// Registers under kube-proxy's names: `registry` must have no prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            self.sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            self.last_sync.clone(),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            self.network_programming.clone(),
        );
    }

    /// A reconcile that took `seconds` wrote its changes at `now`.
    pub fn synced(&self, seconds: f64, now: SystemTime) {
        for family in [AddrFamily::V4, AddrFamily::V6] {
            self.sync_duration
                .get_or_create(&IpFamilyLabels::of(family))
                .observe(seconds);
        }
        self.synced_at(now);
    }

    /// A sync that was not timed (it refused some services and applied
    /// the rest) still moves the last sync time on.
    pub fn synced_at(&self, now: SystemTime) {
        let unix = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        for family in [AddrFamily::V4, AddrFamily::V6] {
            self.last_sync
                .get_or_create(&IpFamilyLabels::of(family))
                .set(unix);
        }
    }

    /// A change to `family`'s endpoints reached the maps `seconds` after it
    /// was made upstream.
    pub fn programmed(&self, family: AddrFamily, seconds: f64) {
        self.network_programming
            .get_or_create(&IpFamilyLabels::of(family))
            .observe(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube-proxy's bucket bounds, as a scrape of it shows them.
    #[test]
    fn buckets_are_kube_proxys() {
        let m = KubeProxyMetrics::default();
        m.synced(0.003, SystemTime::now());
        m.programmed(AddrFamily::V6, 1.5);
        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let bounds = |name: &str, family: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
                .filter(|l| l.contains(&format!("ip_family=\"{family}\"")))
                .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next().map(String::from))
                .collect()
        };
        let sync = bounds("kubeproxy_sync_proxy_rules_duration_seconds", "IPv4");
        assert_eq!(sync.len(), 16, "15 bounds and +Inf: {sync:?}");
        assert_eq!(sync[0], "0.001");
        assert_eq!(sync[14], "16.384");
        let prog = bounds("kubeproxy_network_programming_duration_seconds", "IPv6");
        assert_eq!(prog.len(), 1 + 2 + 59 + 12 + 7 + 1, "{prog:?}");
        for (i, want) in [
            (0, "0.0"),
            (1, "0.25"),
            (2, "0.5"),
            (3, "1.0"),
            (61, "59.0"),
            (62, "60.0"),
            (73, "115.0"),
            (74, "120.0"),
            (80, "300.0"),
            (81, "+Inf"),
        ] {
            assert_eq!(prog[i], want, "bound {i}");
        }
        assert!(
            bounds("kubeproxy_network_programming_duration_seconds", "IPv4").is_empty(),
            "only the family that changed"
        );
        assert!(
            text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"}")
        );
    }
}
