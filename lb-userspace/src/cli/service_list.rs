//! `lbctl service list`, laid out like `cilium-dbg service list`:
//!
//! ```text
//! ID   Frontend            Service Type   Backend
//! 1    10.96.0.10:80/TCP   ClusterIP      1 => 10.244.1.2:8080/TCP (active)
//!                                         2 => 10.244.1.3:8080/TCP (active)
//! ```
use serde::Serialize;

use lb_common::service::{
    SVC_FLAG_CLUSTER_IP, SVC_FLAG_EXTERNAL_IP, SVC_FLAG_LOAD_BALANCER, SVC_FLAG_NODE_PORT,
};

use crate::{maps::MapState, model::Protocol};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceRow {
    pub id: u32,
    pub frontend: Endpoint,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// sessionAffinity: ClientIP, its timeout in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_s: Option<u32>,
    /// The id clients' affinity memory is kept under, shared by the
    /// frontends of one service port (LB_AFFINITY_GROUP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_group: Option<u32>,
    /// "maglev" or "random".
    pub algorithm: &'static str,
    /// The node-local view of an externalTrafficPolicy: Local frontend.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub local_view: bool,
    /// loadBalancerSourceRanges: new flows from outside only from these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source_ranges: Vec<String>,
    /// With `--external-ips-in-cluster owned-only`, an external IP this node
    /// does not own: its sockets and pods reach the real address
    /// (CVE-2020-8554); only traffic from outside is served.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub foreign_external_ip: bool,
    pub backends: Vec<BackendRow>,
    /// `--stats`: what the data path counted for the frontend
    /// (LB_SVC_STATS); None without `--stats`, or for a frontend without
    /// counters (`--service-stats off`, or a data path without them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<StatsRow>,
}

/// A frontend's counts, summed over CPUs (`lb_common::stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatsRow {
    /// Socket path: connect() and unconnected sendmsg() calls translated.
    pub connects: u64,
    /// Packet path: flows started (conntrack entries made).
    pub flows: u64,
    /// Packet path: packets of clients' flows, as on the wire.
    pub packets: u64,
    pub bytes: u64,
}

impl From<lb_common::stats::ServiceStats> for StatsRow {
    fn from(s: lb_common::stats::ServiceStats) -> Self {
        Self {
            connects: s.connects,
            flows: s.flows,
            packets: s.packets,
            bytes: s.bytes,
        }
    }
}

/// Adds each row's counts (by service id); a frontend the map has no
/// entry for keeps None.
pub fn add_stats(
    rows: &mut [ServiceRow],
    stats: &std::collections::BTreeMap<u32, lb_common::stats::ServiceStats>,
) {
    for r in rows {
        r.stats = stats.get(&r.id).map(|s| StatsRow::from(*s));
    }
}

/// `lbctl service list --stats`: one line per frontend with its counts
/// ("-": not counted).
pub fn render_stats_table(rows: &[ServiceRow]) -> String {
    let mut table = vec![[
        "ID".to_string(),
        "Frontend".into(),
        "Service Type".into(),
        "Connects".into(),
        "Flows".into(),
        "Packets".into(),
        "Bytes".into(),
    ]];
    for r in rows {
        let cells = match r.stats {
            Some(s) => [s.connects, s.flows, s.packets, s.bytes].map(|n| n.to_string()),
            None => std::array::from_fn(|_| "-".to_string()),
        };
        let [c, f, p, b] = cells;
        table.push([
            r.id.to_string(),
            r.frontend.to_string(),
            r.kind.to_string(),
            c,
            f,
            p,
            b,
        ]);
    }
    super::align(&table)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    pub address: String,
    pub port: u16,
    pub protocol: String,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.address.contains(':') {
            write!(f, "[{}]:{}/{}", self.address, self.port, self.protocol)
        } else {
            write!(f, "{}:{}/{}", self.address, self.port, self.protocol)
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendRow {
    pub id: u32,
    #[serde(flatten)]
    pub endpoint: Endpoint,
    pub state: &'static str,
}

fn proto_name(p: u8) -> String {
    Protocol::from_number(p).map_or_else(|| format!("proto-{p}"), |p| p.as_str().to_string())
}

/// A frontend as lbctl writes it: `10.96.0.10:80/TCP`, `[fd00::10]:53/UDP`.
pub fn frontend_text(key: &crate::maps::SvcKey) -> String {
    Endpoint {
        address: key.address.to_string(),
        port: key.port,
        protocol: proto_name(key.proto),
    }
    .to_string()
}

pub fn type_name(flags: u16) -> &'static str {
    if flags & SVC_FLAG_CLUSTER_IP != 0 {
        "ClusterIP"
    } else if flags & SVC_FLAG_NODE_PORT != 0 {
        "NodePort"
    } else if flags & SVC_FLAG_LOAD_BALANCER != 0 {
        "LoadBalancer"
    } else if flags & SVC_FLAG_EXTERNAL_IP != 0 {
        "ExternalIP"
    } else {
        "Unknown"
    }
}

/// Rows sorted by service id; backends in slot order.
pub fn rows(state: &MapState) -> Vec<ServiceRow> {
    let mut rows: Vec<ServiceRow> = state
        .frontends()
        .map(|(key, master)| {
            let backends = state
                .slots_of(key)
                .into_iter()
                .enumerate()
                .map(|(i, id)| {
                    let active = i < master.count as usize;
                    let selectable = i < master.count as usize + master.terminating_count as usize;
                    match state.backends.get(&id) {
                        Some(b) => BackendRow {
                            id,
                            endpoint: Endpoint {
                                address: b.address.to_string(),
                                port: b.port,
                                protocol: proto_name(b.proto),
                            },
                            // The slot region is what selection uses.
                            state: if active {
                                "active"
                            } else if selectable {
                                // The slot region decides; the entry's
                                // state byte is shared with other services.
                                "terminating"
                            } else {
                                // Parked after the selectable slots: only
                                // established flows reach it.
                                "maintenance"
                            },
                        },
                        None => BackendRow {
                            id,
                            endpoint: Endpoint {
                                address: "?".into(),
                                port: 0,
                                protocol: "?".into(),
                            },
                            state: "missing",
                        },
                    }
                })
                .collect();
            ServiceRow {
                id: master.service_id,
                frontend: Endpoint {
                    address: key.address.to_string(),
                    port: key.port,
                    protocol: proto_name(key.proto),
                },
                kind: type_name(master.flags),
                affinity_timeout_s: (master.flags & lb_common::service::SVC_FLAG_AFFINITY != 0)
                    .then_some(master.affinity_timeout_s),
                affinity_group: state.affinity_groups.get(&master.service_id).copied(),
                algorithm: if master.algorithm == lb_common::service::ALG_MAGLEV {
                    "maglev"
                } else {
                    "random"
                },
                local_view: key.scope == lb_common::service::SCOPE_LOCAL,
                source_ranges: state
                    .source_ranges
                    .get(&master.service_id)
                    .into_iter()
                    .flatten()
                    .map(std::string::ToString::to_string)
                    .collect(),
                foreign_external_ip: master.flags
                    & lb_common::service::SVC_FLAG_FOREIGN_EXTERNAL_IP
                    != 0,
                backends,
                stats: None,
            }
        })
        .collect();
    rows.sort_by_key(|r| r.id);
    rows
}

/// `lbctl service get`: by service id, or by frontend (`10.96.0.10:80`,
/// `10.96.0.10:80/TCP`, `[fd00::10]:53/UDP`). Without a protocol, every
/// protocol on that address and port matches.
pub fn find<'a>(rows: &'a [ServiceRow], query: &str) -> Vec<&'a ServiceRow> {
    if let Ok(id) = query.parse::<u32>() {
        return rows.iter().filter(|r| r.id == id).collect();
    }
    let (addr_port, proto) = match query.rsplit_once('/') {
        Some((a, p)) => (a, Some(p.to_ascii_uppercase())),
        None => (query, None),
    };
    let Ok(sa) = addr_port.parse::<std::net::SocketAddr>() else {
        return Vec::new();
    };
    rows.iter()
        .filter(|r| {
            r.frontend.port == sa.port()
                && r.frontend.address.parse::<std::net::IpAddr>().ok() == Some(sa.ip())
                && proto.as_ref().is_none_or(|p| *p == r.frontend.protocol)
        })
        .collect()
}

pub fn render_table(rows: &[ServiceRow]) -> String {
    let mut table = vec![[
        "ID".to_string(),
        "Frontend".into(),
        "Service Type".into(),
        "Backend".into(),
    ]];
    for r in rows {
        let backends: Vec<String> = r
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("{} => {} ({})", i + 1, b.endpoint, b.state))
            .collect();
        let first = backends.first().cloned().unwrap_or_default();
        // What changes who the frontend serves, after its type.
        let mut kind = r.kind.to_string();
        if r.local_view {
            kind.push_str(", local");
        }
        if !r.source_ranges.is_empty() {
            kind.push_str(&format!(", from {}", r.source_ranges.join(" ")));
        }
        if r.foreign_external_ip {
            kind.push_str(", not this node's");
        }
        table.push([r.id.to_string(), r.frontend.to_string(), kind, first]);
        for b in backends.iter().skip(1) {
            table.push([String::new(), String::new(), String::new(), b.clone()]);
        }
    }
    super::align(&table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{maps::fake::FakeMaps, reconcile::Reconciler, source::file::parse::parse};

    #[test]
    fn table_matches_golden_output() {
        let model = parse(
            r#"
services:
  - name: web
    clusterIPs: [10.96.0.10]
    ports: [{port: 80, targetPort: 8080}, {port: 53, protocol: UDP}]
    backends: [{address: 10.244.1.2}, {address: 10.244.1.3, state: terminating}]
  - name: empty
    externalIPs: [192.0.2.1]
    ports: [{port: 443}]
  - name: guarded
    type: LoadBalancer
    loadBalancerIPs: [203.0.113.9]
    loadBalancerSourceRanges: [198.51.100.0/24, 10.0.0.0/8]
    ports: [{port: 443}]
    backends: [{address: 10.244.1.4, state: maintenance}]
"#,
        )
        .unwrap();
        // owned-only: the external IP nobody here holds shows as such.
        let mut r = Reconciler::restore(FakeMaps::default())
            .unwrap()
            .with_config(crate::desired::BuildConfig {
                external_ips_in_cluster: crate::desired::ExternalIpsInCluster::OwnedOnly,
                ..Default::default()
            });
        r.reconcile(&model).unwrap();
        let out = render_table(&rows(r.state()));
        let golden = "\
ID   Frontend              Service Type                                    Backend
1    192.0.2.1:443/TCP     ExternalIP, not this node's
2    203.0.113.9:443/TCP   LoadBalancer, from 10.0.0.0/8 198.51.100.0/24   1 => 10.244.1.4:443/TCP (maintenance)
3    10.96.0.10:80/TCP     ClusterIP                                       1 => 10.244.1.2:8080/TCP (active)
                                                                           2 => 10.244.1.3:8080/TCP (terminating)
4    10.96.0.10:53/UDP     ClusterIP                                       1 => 10.244.1.2:53/UDP (active)
                                                                           2 => 10.244.1.3:53/UDP (terminating)
";
        assert_eq!(out, golden, "\n{out}");
        let json = serde_json::to_value(rows(r.state())).unwrap();
        assert_eq!(json[2]["frontend"]["address"], "10.96.0.10");
        assert_eq!(json[2]["backends"][1]["state"], "terminating");
        assert_eq!(json[2]["backends"][0]["port"], 8080);
        assert_eq!(json[0]["foreign_external_ip"], true);
        assert_eq!(
            json[1]["source_ranges"],
            serde_json::json!(["10.0.0.0/8", "198.51.100.0/24"])
        );
        assert!(
            json[2].get("source_ranges").is_none(),
            "left out when empty"
        );
    }
}
