//! Section 9: traffic on the two-node test bed, the agent and the real
//! kube-proxy serving the same manifests in turn (`bed_traffic`).
use std::fmt::Write as _;

use super::{ms, Report};

impl Report {
    pub(super) fn bed_section(&self, o: &mut String) {
        if self.bed.is_empty() {
            return;
        }
        o.push_str(
            "## 9. On the two-node test bed: the agent and the real kube-proxy\n\n\
             Two nodes with real kubelets, containerd and pods (`lb_testkit::kube_cluster`), served in\n\
             turn by the agent (its Helm chart's defaults: socket LB, SNAT on tc), by kube-proxy in\n\
             iptables mode and by kube-proxy in nftables mode (v1.35.8, its defaults but the bed's\n\
             `--cluster-cidr` and `--conntrack-max-per-core=0`, docs/testbed.md), each a cluster\n\
             of its own built from the same manifests: two `lb-pod-server` pods on node 2 behind a\n\
             NodePort Service, a client pod on node 1, an outside client on the fabric. *More\n\
             services*: selectorless Services whose slices name the same two pods, so the measured\n\
             one is one of N; each measurement starts once every node's proxy has not synced for\n\
             3 s. *Sync*: from the last of them created to the pod reaching the pods through it.\n\
             Each share is a ratio to a baseline measured in the same rounds in the same cluster\n\
             (the variants take turns, ABBA), because the clusters ran one after the other. A\n\
             baseline is not free of the proxy: kube-proxy's iptables rules see every new connection\n\
             through the node, Service or not, so compare the absolute columns too. Baselines: from\n\
             the pod, connects straight to the pods' addresses; from outside, the client\n\
             routed to a pod through node 1 with no Service in the way (node 2 answers through node\n\
             1 too, as SNAT makes it). Connects: the bench's client in the pod's network namespace\n\
             and cgroup, connect() then RST, one at a time; bulk: one TCP stream each way, every byte\n\
             checked; connections: sequential short connections, each answered. kube-proxy's\n\
             iptables mode uses the nodes' iptables (Debian 12's iptables-nft); one that has not\n\
             served the last extra Service within the run's limit is not measured at that scale or\n\
             any larger one (its CPU would starve the rest of the run).\n\n\
             | Proxy | More services | Sync (s) | ClusterIP connects/s | direct | ÷ direct | connect p50 ClusterIP / direct | NodePort up Mbit/s | ÷ routing | down Mbit/s | ÷ routing | connections/s | ÷ routing |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.bed {
            if !r.served {
                let _ = writeln!(
                    o,
                    "| {} | {} | not served in {:.0} s | not measured (nor any larger scale) | | | | | | | | | |",
                    r.proxy, r.extra_services, r.sync_s,
                );
                continue;
            }
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} | {:.0} | {:.0} | {:.2}× | {} / {} ms | {:.0} | {:.2}× | {:.0} | {:.2}× | {:.0} | {:.2}× |",
                r.proxy,
                r.extra_services,
                r.sync_s,
                r.cluster_ip_cps,
                r.direct_cps,
                r.cluster_ip_ratio,
                ms(r.cluster_ip_p50),
                ms(r.direct_p50),
                r.node_port.up_mbit,
                r.node_port_ratio.up_mbit,
                r.node_port.down_mbit,
                r.node_port_ratio.down_mbit,
                r.node_port.conns_per_s,
                r.node_port_ratio.conns_per_s,
            );
        }
        let failures: usize = self.bed.iter().map(|r| r.connect_failures).sum();
        let _ = writeln!(
            o,
            "\nFailed connects from the pod, all proxies and rounds: {failures}. Routing from outside, per cluster (Mbit/s up / down, connections/s): {}.\n",
            self.bed
                .iter()
                .filter(|r| r.served)
                .map(|r| format!(
                    "{} at {}: {:.0} / {:.0}, {:.0}",
                    r.proxy,
                    r.extra_services,
                    r.routing.up_mbit,
                    r.routing.down_mbit,
                    r.routing.conns_per_s
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
}
