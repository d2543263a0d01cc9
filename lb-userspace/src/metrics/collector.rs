//! Scrape-time collector for the counters the programs keep in per-CPU maps.
use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use aya::maps::{MapData, PerCpuArray};
use lb_common::{config::*, maps as names};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, MetricType},
};

use crate::{
    maps::{
        bpf::{open_pinned, read_drops},
        stats::StatsMap,
    },
    reconcile::MetricFrontend,
};
use lb_common::stats::ServiceStats;

/// The frontends whose counters are exported, with their labels: replaced
/// whole by the worker, read at each scrape.
pub type ServiceFrontends = Arc<Mutex<Arc<Vec<MetricFrontend>>>>;

#[derive(Debug)]
pub struct BpfCollector {
    pub pin_dir: PathBuf,
    pub service_frontends: ServiceFrontends,
}

/// The lb_service_* counters: one series per exported frontend and counter,
/// read by key (a lookup per frontend, whatever the number of services).
fn encode_service_stats(
    encoder: &mut DescriptorEncoder,
    pin_dir: &std::path::Path,
    frontends: &[MetricFrontend],
) -> Result<(), std::fmt::Error> {
    if frontends.is_empty() {
        return Ok(());
    }
    let Ok(Some(map)) = StatsMap::open(pin_dir) else {
        return Ok(());
    };
    // One series per frontend: an externalTrafficPolicy: Local frontend's
    // node-local view (an id of its own, the same address and port) is
    // summed into it, or the exposition would repeat a label set.
    let mut counts: Vec<(&MetricFrontend, ServiceStats)> = Vec::new();
    for f in frontends {
        let Ok(Some(s)) = map.get(f.service_id) else {
            continue;
        };
        match counts.iter_mut().find(|(g, _)| {
            (&g.namespace, &g.name, &g.frontend) == (&f.namespace, &f.name, &f.frontend)
        }) {
            Some((_, sum)) => sum.add(&s),
            None => counts.push((f, s)),
        }
    }
    type Field = fn(&ServiceStats) -> u64;
    let metrics: [(&str, &str, Field); 4] = [
        (
            "service_connects",
            "Connects and unconnected sends the socket hooks sent to a backend of the frontend (services with lb.dev/metrics: \"true\")",
            |s| s.connects,
        ),
        (
            "service_flows",
            "Flows the frontend started on the packet path (tc, XDP)",
            |s| s.flows,
        ),
        (
            "service_packets",
            "Packets of clients' flows to the frontend on the packet path, as on the wire",
            |s| s.packets,
        ),
        (
            "service_bytes",
            "Bytes (IP header included) of clients' flows to the frontend on the packet path",
            |s| s.bytes,
        ),
    ];
    for (name, help, field) in metrics {
        let mut e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (f, s) in &counts {
            let labels = [
                ("namespace", f.namespace.as_str()),
                ("service", f.name.as_str()),
                ("frontend", f.frontend.as_str()),
                ("type", f.kind),
            ];
            ConstCounter::new(field(s)).encode(e.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn read_counters(pin_dir: &std::path::Path) -> anyhow::Result<Vec<(u32, u64)>> {
    let map: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(open_pinned(pin_dir, names::LB_COUNTERS)?)?;
    COUNTER_NAMES
        .iter()
        .map(|(i, _)| Ok((*i, map.get(i, 0)?.iter().sum())))
        .collect()
}

impl Collector for BpfCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let frontends = self
            .service_frontends
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        encode_service_stats(&mut encoder, &self.pin_dir, &frontends)?;
        // A scrape while the maps are missing (uninstalled) shows no BPF
        // counters rather than failing the whole scrape.
        if let Ok(drops) = read_drops(&self.pin_dir) {
            let mut e = encoder.encode_descriptor(
                "drops",
                "Connections or packets dropped by the data path, by reason and direction",
                None,
                MetricType::Counter,
            )?;
            for d in drops {
                let labels = [("reason", d.reason), ("direction", d.direction)];
                ConstCounter::new(d.packets).encode(e.encode_family(&labels)?)?;
            }
        }
        if let Ok(counters) = read_counters(&self.pin_dir) {
            let get = |i: u32| {
                counters
                    .iter()
                    .find(|(k, _)| *k == i)
                    .map_or(0, |(_, v)| *v)
            };
            let mut e = encoder.encode_descriptor(
                "events",
                "Drop and trace events, by what happened to them (sent, rate_limited, lost: ring buffer full)",
                None,
                MetricType::Counter,
            )?;
            for (label, i) in [
                ("sent", CNT_EVENTS_SENT),
                ("rate_limited", CNT_EVENTS_RATE_LIMITED),
                ("lost", CNT_EVENTS_LOST),
            ] {
                ConstCounter::new(get(i)).encode(e.encode_family(&[("result", label)])?)?;
            }
            let mut e = encoder.encode_descriptor(
                "socket_translations",
                "Socket-level translations: forward (connect/sendmsg to a backend) and reverse (recvmsg/getpeername back to the service)",
                None,
                MetricType::Counter,
            )?;
            for (label, i) in [
                ("forward", CNT_SOCK_TRANSLATIONS),
                ("reverse", CNT_SOCK_REVERSE),
            ] {
                ConstCounter::new(get(i)).encode(e.encode_family(&[("direction", label)])?)?;
            }
            let mut e = encoder.encode_descriptor(
                "nodeport_packets",
                "Packets translated by the tc/XDP programs: forward (client to backend) and reverse (replies back to the service address)",
                None,
                MetricType::Counter,
            )?;
            for (label, i) in [("forward", CNT_NP_FORWARD), ("reverse", CNT_NP_REVERSE)] {
                ConstCounter::new(get(i)).encode(e.encode_family(&[("direction", label)])?)?;
            }
            for (name, help, i) in [
                (
                    "conntrack_entries_created",
                    "North-south flows entered into conntrack (LB4_CT, LB6_CT)",
                    CNT_CT_CREATED,
                ),
                (
                    "dsr_requests_learned",
                    "DSR requests received on this node (service address taken from the IP option)",
                    CNT_DSR_LEARNED,
                ),
                (
                    "ipv6_fragments_passed",
                    "IPv6 fragments left to the stack untranslated (IPv6 fragments are not followed)",
                    CNT_IPV6_FRAGMENTS_PASSED,
                ),
                (
                    "fib_lookups",
                    "FIB lookups for packets to and from remote backends (the others were answered by the per-CPU route cache)",
                    CNT_FIB_LOOKUPS,
                ),
                (
                    "host_port_clashes",
                    "Host connections whose tuple a SNAT flow held, given another source port on their way out",
                    CNT_HOST_PORT_CLASHES,
                ),
            ] {
                let e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                ConstCounter::new(get(i)).encode(e)?;
            }
        }
        Ok(())
    }
}
