//! The memory section: the agent's RSS, the maps' memlock, and where the
//! heap goes in standalone and Kubernetes mode.
use std::fmt::Write as _;

use super::*;

impl Report {
    pub(super) fn memory_section(&self, o: &mut String) {
        let mem: Vec<_> = self
            .connect
            .iter()
            .filter_map(|s| s.memory.as_ref())
            .collect();
        if mem.is_empty()
            && self.breakdown.is_empty()
            && self.kube_breakdown.is_empty()
            && self.kube_scale.is_empty()
        {
            return;
        }
        o.push_str("## 7. Memory\n\n");
        if !mem.is_empty() {
            o.push_str(
            "The agent's resident memory after its first reconcile (the connect workload: a services\n\
             file, one port, 2 endpoints per service, every endpoint a distinct pod), and the kernel's\n\
             accounting of every pinned map (`memlock` in fdinfo). The LRU maps (socket reverse NAT,\n\
             conntrack, affinity) are preallocated, so they cost their configured capacity whatever the\n\
             fill; the service, backend and reverse-NAT maps are not (BPF_F_NO_PREALLOC) and grow with\n\
             the services.\n\n\
             | Services | Backends | Agent RSS MiB | RSS per service | Maps MiB | Largest maps |\n|---:|---:|---:|---:|---:|---|\n",
        );
            for m in mem {
                let biggest: Vec<String> = m
                    .biggest
                    .iter()
                    .map(|(n, b, e)| {
                        format!("{n} {:.1} MiB ({e} entries)", *b as f64 / 1_048_576.0)
                    })
                    .collect();
                let _ = writeln!(
                    o,
                    "| {} | {} | {:.1} | {:.0} B | {:.1} | {} |",
                    m.services,
                    m.services * 2,
                    m.agent_rss_kib as f64 / 1024.0,
                    m.agent_rss_kib as f64 * 1024.0 / m.services as f64,
                    m.maps_bytes as f64 / 1_048_576.0,
                    biggest.join(", ")
                );
            }
            o.push('\n');
        }
        self.breakdown_table(o);
        self.kube_breakdown_table(o);
        self.kube_scale_table(o);
    }

    /// Kubernetes mode on the real control plane.
    pub(super) fn kube_scale_table(&self, o: &mut String) {
        if self.kube_scale.is_empty() {
            return;
        }
        o.push_str(
            "Kubernetes mode on the test bed's real apiserver: the agent (lb-agent in Kubernetes\n\
             mode, as the DaemonSet runs it) started with an empty cluster, then N selectorless\n\
             Services with one EndpointSlice of 2 endpoints each created by a parallel client (32\n\
             requests at a time); its RSS before and after, its CPU at rest over 30 s once every\n\
             service is in its maps, and a second agent started with every service already there:\n\
             seconds from its start to every service in its maps, and its RSS then.\n\n\
             | Services | created in | RSS empty MiB | RSS with all MiB | RSS per service | CPU at rest | second agent: start → all in maps | its RSS MiB |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for k in &self.kube_scale {
            let _ = writeln!(
                o,
                "| {} | {:.0} s | {:.1} | {:.1} | {:.0} B | {:.2} % | {:.1} s | {:.1} |",
                k.services,
                k.create_s,
                k.rss_before_kib as f64 / 1024.0,
                k.rss_after_kib as f64 / 1024.0,
                (k.rss_after_kib.saturating_sub(k.rss_before_kib)) as f64 * 1024.0
                    / k.services as f64,
                k.idle_cpu_percent,
                k.sync_s,
                k.second_rss_kib as f64 / 1024.0
            );
        }
        o.push('\n');
        if self.kube_scale.iter().all(|k| k.kube_proxy.is_empty()) {
            return;
        }
        o.push_str(
            "The same restart with the real kube-proxy (cmd/kube-proxy v1.35.8 of the test bed, as the\n\
             same node, in the same run, started after the agents stopped, with every service already\n\
             in the apiserver; iptables mode with iptables-nft and with iptables-legacy, then nftables\n\
             mode): seconds from its start to its first full sync programmed (every family's\n\
             `kubeproxy_sync_proxy_rules_last_timestamp_seconds` set), its CPU seconds until then with\n\
             the iptables-restore / nft runs it waited for, and its RSS then; beside the second agent's.\n\
             Ratios are kube-proxy's over the agent's (above 1: the agent is faster or smaller). A mode\n\
             that had not synced when the run stopped waiting shows where it stood then (lower bounds),\n\
             and is not started again at a larger scale.\n\n\
             | Services | proxy | start → synced | × agent | CPU s | × agent | RSS MiB | × agent |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|\n",
        );
        for k in &self.kube_scale {
            let _ = writeln!(
                o,
                "| {} | lb-agent | {:.1} s | 1 | {:.1} | 1 | {:.1} | 1 |",
                k.services,
                k.sync_s,
                k.sync_cpu_s,
                k.second_rss_kib as f64 / 1024.0
            );
            for kp in &k.kube_proxy {
                if kp.skipped {
                    let _ = writeln!(
                        o,
                        "| {} | kube-proxy {} | not run: no first sync at a smaller scale | | | | | |",
                        k.services, kp.mode
                    );
                    continue;
                }
                if !kp.synced {
                    let _ = writeln!(
                        o,
                        "| {} | kube-proxy {} | no sync in {:.0} s | > {:.0} | > {:.1} | > {:.0} | {:.1} (unsynced) | |",
                        k.services,
                        kp.mode,
                        kp.sync_s,
                        kp.sync_s / k.sync_s.max(1e-9),
                        kp.sync_cpu_s,
                        kp.sync_cpu_s / k.sync_cpu_s.max(1e-9),
                        kp.rss_kib as f64 / 1024.0,
                    );
                    continue;
                }
                let _ = writeln!(
                    o,
                    "| {} | kube-proxy {} | {:.1} s | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} |",
                    k.services,
                    kp.mode,
                    kp.sync_s,
                    kp.sync_s / k.sync_s.max(1e-9),
                    kp.sync_cpu_s,
                    kp.sync_cpu_s / k.sync_cpu_s.max(1e-9),
                    kp.rss_kib as f64 / 1024.0,
                    kp.rss_kib as f64 / (k.second_rss_kib as f64).max(1.0)
                );
            }
        }
        o.push('\n');
    }

    /// Kubernetes mode: the store and the reconciler, per service and per
    /// endpoint, against the 2 KB per service.
    pub(super) fn kube_breakdown_table(&self, o: &mut String) {
        if self.kube_breakdown.is_empty() {
            return;
        }
        o.push_str(
            "Kubernetes mode: a Service applied with kubectl and its EndpointSlice, as the test bed's\n\
             apiserver listed them (`lb-bench/fixtures`, managedFields and kubectl's last-applied\n\
             annotation included), multiplied into N services with their own names and addresses,\n\
             decoded from JSON text as the watches decode them (`source/kubernetes/slim.rs`) and fed\n\
             to the agent's store as a list; its model reconciled into maps that keep nothing. Live\n\
             heap: the *store* (slim objects, frontend claims, fingerprints of what was output) and\n\
             the *reconciler* (model, mirror of the maps, ids). *k8s-openapi* is what the same\n\
             objects take decoded whole, as the store kept them before (measured at up to 10 000).\n\n\
             *RSS per service* is how much the bench's resident memory grew while it did this, after\n\
             giving free pages back as the agent does after a full model (`malloc_trim`): the heap\n\
             plus the allocator's own overhead, about 16 B per *block* (live allocation) and what\n\
             small free holes between live blocks keep.\n\n\
             | Services | Endpoints each | JSON per service | store MiB | reconciler MiB | total MiB | heap per service | blocks per service (store + reconciler) | RSS per service | k8s-openapi per service | feed s |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let mib = |b: u64| b as f64 / 1_048_576.0;
        for b in &self.kube_breakdown {
            let _ = writeln!(
                o,
                "| {} | {} | {} B | {:.1} | {:.1} | {:.1} | {:.0} B | {:.1} + {:.1} | {:.0} B | {} B | {:.1} |",
                b.services,
                b.endpoints,
                b.wire_bytes_per_service,
                mib(b.store),
                mib(b.reconciler),
                mib(b.total),
                b.total as f64 / b.services as f64,
                b.blocks.saturating_sub(b.reconciler_blocks) as f64 / b.services as f64,
                b.reconciler_blocks as f64 / b.services as f64,
                b.rss_kib as f64 * 1024.0 / b.services as f64,
                b.openapi_per_service,
                b.feed_s
            );
        }
        for a in &self.kube_breakdown {
            for b in &self.kube_breakdown {
                if a.services == b.services && b.endpoints > a.endpoints {
                    let per_endpoint = (b.total as f64 - a.total as f64)
                        / ((b.endpoints - a.endpoints) * a.services) as f64;
                    let _ = writeln!(
                        o,
                        "\nAt {} services: **{:.0} B of heap per service** with {} endpoints (target: at most 2 KB of RSS), \
                         **{per_endpoint:.0} B per further endpoint** (from the {} and {} endpoint rows).",
                        a.services,
                        a.total as f64 / a.services as f64,
                        a.endpoints,
                        a.endpoints,
                        b.endpoints
                    );
                }
            }
        }
        o.push('\n');
    }

    /// Where the heap goes, and what a service and a backend cost apart.
    pub(super) fn breakdown_table(&self, o: &mut String) {
        if self.breakdown.is_empty() {
            return;
        }
        o.push_str(
            "Where the bytes go: the same services file parsed and reconciled inside the bench\n\
             (maps that keep nothing), live heap counted by a counting allocator. *Model* is the\n\
             target the reconciler converges to (names, frontends, backends), *mirror* what it knows\n\
             the maps hold (service slots, backends, reverse NAT and their indexes), *indexes* the\n\
             stable ids and which service owns which frontend. Not in the heap: ~12 MiB of binary,\n\
             libraries and runtime that the RSS above includes.\n\n\
             | Services | Backends | parse peak MiB | model MiB | mirror MiB | indexes MiB | total MiB | per service + backends |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let mib = |b: u64| b as f64 / 1_048_576.0;
        for b in &self.breakdown {
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} B |",
                b.services,
                b.backends,
                mib(b.parse_peak),
                mib(b.model),
                mib(b.mirror),
                mib(b.indexes),
                mib(b.total),
                b.total as f64 / b.services as f64
            );
        }
        // Two rows with the same services and different endpoints give the
        // cost of a backend, and with it the cost of a service alone.
        let mut pairs = Vec::new();
        for a in &self.breakdown {
            for b in &self.breakdown {
                if a.services == b.services && b.backends > a.backends {
                    pairs.push((a, b));
                }
            }
        }
        for (a, b) in pairs {
            let per_backend = (b.total as f64 - a.total as f64) / (b.backends - a.backends) as f64;
            let per_service =
                (a.total as f64 - per_backend * a.backends as f64) / a.services as f64;
            let _ = writeln!(
                o,
                "\nAt {} services: **{per_service:.0} B per service** and **{per_backend:.0} B per backend** of heap \
                 (from the {} and {} backend rows).",
                a.services, a.backends, b.backends
            );
        }
        o.push('\n');
    }
}
