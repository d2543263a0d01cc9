//! The report's opening table: the agent against the real kube-proxy
//! (cmd/kube-proxy v1.35.8 of the test bed) wherever the bench ran both in
//! this run, as ratios; and what is still compared with re-created layouts.
use std::fmt::Write as _;

use super::{ms, Report};

impl Report {
    pub(super) fn versus_kube_proxy(&self, o: &mut String) {
        let mut rows = Vec::new();
        for r in &self.propagation {
            for k in &r.kube_proxy {
                for (i, q) in ["p50", "p99"].iter().enumerate() {
                    rows.push(format!(
                        "| one EndpointSlice change → data path, {q}, {} services (§6) | {} ms | {} ms ({}) | {:.1}× |",
                        r.services,
                        ms(r.to_map[i]),
                        ms(k.to_rules[i]),
                        k.mode,
                        k.to_rules[i].as_secs_f64() / r.to_map[i].as_secs_f64().max(1e-9)
                    ));
                }
            }
        }
        for k in &self.kube_scale {
            for kp in &k.kube_proxy {
                rows.push(format!(
                    "| full sync after a restart, {} services: wall (§7) | {:.1} s | {:.1} s ({}) | {:.1}× |",
                    k.services,
                    k.sync_s,
                    kp.sync_s,
                    kp.mode,
                    kp.sync_s / k.sync_s.max(1e-9)
                ));
                rows.push(format!(
                    "| full sync after a restart, {} services: CPU (§7) | {:.1} s | {:.1} s ({}) | {:.1}× |",
                    k.services,
                    k.sync_cpu_s,
                    kp.sync_cpu_s,
                    kp.mode,
                    kp.sync_cpu_s / k.sync_cpu_s.max(1e-9)
                ));
                rows.push(format!(
                    "| RSS with {} services (§7) | {:.1} MiB | {:.1} MiB ({}) | {:.1}× |",
                    k.services,
                    k.second_rss_kib as f64 / 1024.0,
                    kp.rss_kib as f64 / 1024.0,
                    kp.mode,
                    kp.rss_kib as f64 / (k.second_rss_kib as f64).max(1.0)
                ));
            }
        }
        if rows.is_empty() {
            return;
        }
        o.push_str(
            "## Against the real kube-proxy\n\n\
             The agent and the real kube-proxy (cmd/kube-proxy v1.35.8, built from the test bed's module)\n\
             in this one run, on the same real control plane and objects, one after the other. *×* is\n\
             kube-proxy's figure over the agent's: above 1 the agent is faster or smaller. kube-proxy runs\n\
             with its defaults (`--iptables-min-sync-period` / nftables' 1 s), the agent with the\n\
             DaemonSet's (`--min-sync-period` 100 ms). ipvs mode cannot run on this kernel (no\n\
             CONFIG_IP_VS, docs/testbed.md). Not yet against the real kube-proxy: connects through a\n\
             ClusterIP (§1) and the rule loads of §2 still use re-created iptables and nftables\n\
             layouts (`lb-bench/src/kube_proxy`), and NodePort traffic to another node is not\n\
             measured against it.\n\n\
             | What | lb-agent | kube-proxy | × |\n|---|---:|---:|---:|\n",
        );
        for r in rows {
            let _ = writeln!(o, "{r}");
        }
        o.push('\n');
    }
}
