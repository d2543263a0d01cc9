//! The report's opening table: the agent against the real kube-proxy
//! (cmd/kube-proxy v1.35.8 of the test bed) wherever the bench ran both in
//! this run, as ratios; and what is still compared with re-created layouts.
use std::fmt::Write as _;

use super::{ms, Report};
use crate::{bed_traffic::BedResult, propagation::SAMPLE_TIMEOUT};

/// kube-proxy's modes (`Mode::name`), in the table's column order.
const MODES: [&str; 3] = ["iptables", "iptables-legacy", "nftables"];

/// One line of the table: what, the agent's figure, and per mode
/// kube-proxy's figure and how many times better the agent does (none
/// where the figures cannot be set against each other that way).
struct Row {
    what: String,
    agent: String,
    modes: Vec<(&'static str, String, Ratio)>,
}

/// A cell's ×.
enum Ratio {
    /// The figures cannot be set against each other that way.
    None,
    Is(f64),
    /// At least this: kube-proxy's figure is where it stood when the bench
    /// stopped waiting for it.
    AtLeast(f64),
}

impl Row {
    fn new(what: String, agent: String) -> Self {
        Self {
            what,
            agent,
            modes: Vec::new(),
        }
    }

    fn render(&self) -> String {
        let mut line = format!("| {} | {} |", self.what, self.agent);
        for mode in MODES {
            match self.modes.iter().find(|(m, _, _)| *m == mode) {
                Some((_, v, Ratio::Is(x))) => {
                    let _ = write!(line, " {v} | {x:.2}× |");
                }
                Some((_, v, Ratio::AtLeast(x))) => {
                    let _ = write!(line, " {v} | > {x:.0}× |");
                }
                Some((_, v, Ratio::None)) => {
                    let _ = write!(line, " {v} | - |");
                }
                None => line.push_str(" - | - |"),
            }
        }
        line
    }
}

/// The column of a result's mode, named bare ("iptables") or as a proxy
/// ("kube-proxy iptables").
fn mode_of(name: &str) -> &'static str {
    MODES
        .into_iter()
        .find(|m| name == *m || name.strip_suffix(m).is_some_and(|p| p.ends_with(' ')))
        .unwrap_or_else(|| panic!("kube-proxy mode {name:?} has no column (MODES)"))
}

/// Rows of §9 figures where higher is better: `what` of the agent's result
/// `a` against each kube-proxy result in `peers` (same scale), × being the
/// agent's over kube-proxy's.
fn bed_rows(
    a: &BedResult,
    peers: &[&BedResult],
    what: [&str; 4],
    figures: impl Fn(&BedResult) -> [f64; 4],
    show: impl Fn(f64) -> String,
) -> Vec<Row> {
    let ours = figures(a);
    what.iter()
        .zip(ours)
        .enumerate()
        .map(|(i, (what, v))| {
            let mut row = Row::new(
                format!("{what}, {} more services (§9)", a.extra_services),
                show(v),
            );
            for k in peers {
                if !k.served {
                    row.modes.push((
                        mode_of(&k.proxy),
                        format!("not served in {:.0} s", k.sync_s),
                        Ratio::None,
                    ));
                    continue;
                }
                let theirs = figures(k)[i];
                row.modes.push((
                    mode_of(&k.proxy),
                    show(theirs),
                    Ratio::Is(v / theirs.max(1e-9)),
                ));
            }
            row
        })
        .collect()
}

impl Report {
    pub(super) fn versus_kube_proxy(&self, o: &mut String) {
        let mut rows = Vec::new();
        for r in &self.propagation {
            for (i, q) in ["p50", "p99"].iter().enumerate() {
                let mut row = Row::new(
                    format!(
                        "one EndpointSlice change → data path, {q}, {} services (§6)",
                        r.services
                    ),
                    format!("{} ms", ms(r.to_map[i])),
                );
                for k in &r.kube_proxy {
                    row.modes.push(match k.first_sync {
                        Ok(_) => {
                            let ratio =
                                k.to_rules[i].as_secs_f64() / r.to_map[i].as_secs_f64().max(1e-9);
                            // A percentile on a sample kube-proxy missed is
                            // the timeout: a lower bound.
                            if k.to_rules[i] >= SAMPLE_TIMEOUT {
                                (
                                    mode_of(k.mode),
                                    format!("≥ {} ms", ms(k.to_rules[i])),
                                    Ratio::AtLeast(ratio),
                                )
                            } else {
                                (
                                    mode_of(k.mode),
                                    format!("{} ms", ms(k.to_rules[i])),
                                    Ratio::Is(ratio),
                                )
                            }
                        }
                        Err(limit) => (
                            mode_of(k.mode),
                            format!("no first sync in {} s", limit.as_secs()),
                            Ratio::None,
                        ),
                    });
                }
                rows.push(row);
            }
            if let Some(([p50, _], _)) = r.programming {
                let mut row = Row::new(
                    format!(
                        "`kubeproxy_network_programming_duration_seconds` p50 as each exports it (whole-second start times: no ratio), {} services (§6)",
                        r.services
                    ),
                    format!("{:.0} ms", p50 * 1e3),
                );
                for k in &r.kube_proxy {
                    if let Some(([theirs, _], _)) = k.programming {
                        row.modes.push((
                            mode_of(k.mode),
                            format!("{:.0} ms", theirs * 1e3),
                            Ratio::None,
                        ));
                    }
                }
                rows.push(row);
            }
        }
        for k in &self.kube_scale {
            let mut wall = Row::new(
                format!(
                    "full sync after a restart, {} services: wall (§7)",
                    k.services
                ),
                format!("{:.1} s", k.sync_s),
            );
            let mut cpu = Row::new(
                format!(
                    "full sync after a restart, {} services: CPU (§7)",
                    k.services
                ),
                format!("{:.1} s", k.sync_cpu_s),
            );
            let mut rss = Row::new(
                format!("RSS with {} services (§7)", k.services),
                format!("{:.1} MiB", k.second_rss_kib as f64 / 1024.0),
            );
            for kp in &k.kube_proxy {
                let mode = mode_of(&kp.mode);
                if kp.skipped {
                    for row in [&mut wall, &mut cpu, &mut rss] {
                        row.modes.push((
                            mode,
                            "not run: no sync at a smaller scale".into(),
                            Ratio::None,
                        ));
                    }
                    continue;
                }
                if !kp.synced {
                    // Lower bounds: where it stood when the bench gave up.
                    wall.modes.push((
                        mode,
                        format!("no sync in {:.0} s", kp.sync_s),
                        Ratio::AtLeast(kp.sync_s / k.sync_s.max(1e-9)),
                    ));
                    cpu.modes.push((
                        mode,
                        format!("> {:.1} s", kp.sync_cpu_s),
                        Ratio::AtLeast(kp.sync_cpu_s / k.sync_cpu_s.max(1e-9)),
                    ));
                    rss.modes.push((
                        mode,
                        format!("{:.1} MiB, unsynced", kp.rss_kib as f64 / 1024.0),
                        Ratio::None,
                    ));
                    continue;
                }
                wall.modes.push((
                    mode,
                    format!("{:.1} s", kp.sync_s),
                    Ratio::Is(kp.sync_s / k.sync_s.max(1e-9)),
                ));
                cpu.modes.push((
                    mode,
                    format!("{:.1} s", kp.sync_cpu_s),
                    Ratio::Is(kp.sync_cpu_s / k.sync_cpu_s.max(1e-9)),
                ));
                rss.modes.push((
                    mode,
                    format!("{:.1} MiB", kp.rss_kib as f64 / 1024.0),
                    Ratio::Is(kp.rss_kib as f64 / (k.second_rss_kib as f64).max(1.0)),
                ));
            }
            rows.extend([wall, cpu, rss]);
        }
        for a in self.bed.iter().filter(|r| r.proxy == "lb-agent") {
            let peers: Vec<&BedResult> = self
                .bed
                .iter()
                .filter(|k| k.proxy != a.proxy && k.extra_services == a.extra_services)
                .collect();
            rows.extend(bed_rows(
                a,
                &peers,
                [
                    "connects/s through a ClusterIP from a pod, ÷ direct",
                    "NodePort to a pod on another node: upload ÷ routing",
                    "NodePort to a pod on another node: download ÷ routing",
                    "NodePort to a pod on another node: connections/s ÷ routing",
                ],
                |r| {
                    [
                        r.cluster_ip_ratio,
                        r.node_port_ratio.up_mbit,
                        r.node_port_ratio.down_mbit,
                        r.node_port_ratio.conns_per_s,
                    ]
                },
                |v| format!("{v:.2}×"),
            ));
            // The shares above divide by a baseline that carries each
            // proxy's own cost; the rates themselves, measured in clusters
            // run one after the other (noise between them included).
            rows.extend(bed_rows(
                a,
                &peers,
                [
                    "connects/s from a pod straight to the pods (no Service), absolute",
                    "connects/s from a pod through the ClusterIP, absolute",
                    "connections/s from outside routed to a pod (no Service), absolute",
                    "connections/s from outside through the NodePort, absolute",
                ],
                |r| {
                    [
                        r.direct_cps,
                        r.cluster_ip_cps,
                        r.routing.conns_per_s,
                        r.node_port.conns_per_s,
                    ]
                },
                |v| format!("{v:.0}"),
            ));
        }
        if rows.is_empty() {
            return;
        }
        o.push_str(
            "## Against the real kube-proxy\n\n\
             The agent and the real kube-proxy (cmd/kube-proxy v1.35.8, built from the test bed's module)\n\
             in this one run, on the same real control plane and objects (§6, §7) or the same\n\
             manifests on the two-node test bed (§9), one after the other. *×* says how many times\n\
             better the agent does: for times and sizes kube-proxy's figure over the agent's, for\n\
             traffic (each a share of its own baseline) the agent's share over kube-proxy's, and for\n\
             rates the agent's over kube-proxy's. Above 1 the agent is ahead. A share's baseline is\n\
             not free of the proxy (kube-proxy's iptables rules see every new connection through the\n\
             node, Service or not), hence the absolute rows, which compare clusters run one after the\n\
             other. kube-proxy runs with its defaults (`--iptables-min-sync-period` /\n\
             nftables' 1 s), the agent with the DaemonSet's (`--min-sync-period` 100 ms). ipvs mode\n\
             cannot run on this kernel (no CONFIG_IP_VS, docs/testbed.md). iptables mode runs with\n\
             each iptables backend: the machine's (Debian 12: iptables-nft, the nf_tables API) and\n\
             iptables-legacy (x_tables), as the upstream image's iptables-wrapper picks one by the\n\
             rules the host already has; the bed (§9) runs the machine's only. Where kube-proxy did\n\
             not program its first full sync within the run's limit, its cell says so, and a ratio\n\
             set against that limit is a lower bound. §1 (connects at up to\n\
             100 000 services, per-hook costs) and §2 (rule loads) still use re-created iptables and\n\
             nftables layouts (`lb-bench/src/kube_proxy`), where the real kube-proxy would need that\n\
             many objects in a real apiserver.",
        );
        if self.bed.is_empty() {
            o.push_str(" Not in this run: traffic on the test bed (§9, `--only bed`).");
        }
        o.push_str(
            "\n\n| What | lb-agent | kube-proxy iptables (nft) | × | kube-proxy iptables (legacy) | × | kube-proxy nftables | × |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in rows {
            let _ = writeln!(o, "{}", r.render());
        }
        o.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        bed_traffic::{BedResult, Path},
        profile::{Name, Profile},
    };

    fn bed(proxy: &str, cluster_ip: f64, conns: f64) -> BedResult {
        let share = Path {
            up_mbit: 1.0,
            down_mbit: 1.0,
            conns_per_s: conns,
        };
        BedResult {
            proxy: proxy.into(),
            extra_services: 1_000,
            direct_cps: 0.0,
            cluster_ip_cps: 0.0,
            cluster_ip_ratio: cluster_ip,
            cluster_ip_p50: std::time::Duration::ZERO,
            direct_p50: std::time::Duration::ZERO,
            connect_failures: 0,
            routing: Path::default(),
            node_port: Path::default(),
            node_port_ratio: share,
            sync_s: 0.0,
            served: true,
        }
    }

    #[test]
    fn each_kube_proxy_mode_lands_in_its_own_column_with_the_agents_share_over_its_own() {
        let mut r = Report::new(&Profile::new(Name::Smoke), "test".into());
        // nftables first: the columns follow MODES, not the run's order.
        r.bed = vec![
            bed("lb-agent", 0.9, 1.0),
            bed("kube-proxy nftables", 0.45, 0.5),
            bed("kube-proxy iptables", 0.6, 1.0),
        ];
        let mut o = String::new();
        r.versus_kube_proxy(&mut o);
        let row = |what: &str| {
            o.lines()
                .find(|l| l.starts_with(&format!("| {what}")))
                .unwrap_or_else(|| panic!("no row {what:?} in\n{o}"))
                .to_string()
        };
        assert_eq!(
            row("connects/s through a ClusterIP"),
            "| connects/s through a ClusterIP from a pod, ÷ direct, 1000 more services (§9) | 0.90× | 0.60× | 1.50× | - | - | 0.45× | 2.00× |"
        );
        assert_eq!(
            row("NodePort to a pod on another node: connections/s"),
            "| NodePort to a pod on another node: connections/s ÷ routing, 1000 more services (§9) | 1.00× | 1.00× | 1.00× | - | - | 0.50× | 2.00× |"
        );
        assert!(!o.contains("Not in this run"), "{o}");
    }

    #[test]
    fn a_scale_kube_proxy_did_not_serve_in_time_says_so_without_a_ratio() {
        let mut r = Report::new(&Profile::new(Name::Smoke), "test".into());
        r.bed = vec![
            bed("lb-agent", 0.9, 1.0),
            BedResult::unserved("kube-proxy iptables".into(), 1_000, 300.0),
            bed("kube-proxy nftables", 0.45, 0.5),
        ];
        let mut o = String::new();
        r.versus_kube_proxy(&mut o);
        let line = o
            .lines()
            .find(|l| l.starts_with("| connects/s through a ClusterIP"))
            .unwrap_or_else(|| panic!("no ClusterIP row in\n{o}"));
        assert_eq!(
            line,
            "| connects/s through a ClusterIP from a pod, ÷ direct, 1000 more services (§9) | 0.90× | not served in 300 s | - | - | - | 0.45× | 2.00× |"
        );
        let mut section = String::new();
        r.bed_section(&mut section);
        assert!(
            section.contains("| kube-proxy iptables | 1000 | not served in 300 s | not measured"),
            "{section}"
        );
        assert!(
            !section.contains("kube-proxy iptables at 1000"),
            "{section}"
        );
    }

    #[test]
    fn a_propagation_percentile_on_a_sample_kube_proxy_missed_is_a_lower_bound() {
        use crate::propagation::{KubeProxyPropagation, PropagationResult, SAMPLE_TIMEOUT};
        use std::time::Duration;
        let ms = Duration::from_millis;
        let kp = |mode, p99| KubeProxyPropagation {
            mode,
            first_sync: Ok(Duration::from_secs(30)),
            samples: 40,
            missed: usize::from(p99 >= SAMPLE_TIMEOUT),
            to_slice: [ms(5), ms(9)],
            slice_to_rules: [ms(1_000), p99],
            to_rules: [ms(1_000), p99],
            programming: None,
            poll: [ms(20), ms(40)],
        };
        let mut r = Report::new(&Profile::new(Name::Smoke), "test".into());
        r.propagation = vec![PropagationResult {
            services: 10_000,
            samples: 200,
            missed: 0,
            to_slice: [ms(5), ms(9)],
            slice_to_map: [ms(100), ms(200)],
            to_map: [ms(100), ms(200)],
            setup_s: 1.0,
            background_changes: 10,
            poll: [Duration::from_micros(20), Duration::from_micros(90)],
            programming: None,
            kube_proxy: vec![kp("iptables", ms(2_000)), kp("nftables", SAMPLE_TIMEOUT)],
        }];
        let mut o = String::new();
        r.versus_kube_proxy(&mut o);
        let p99 = o
            .lines()
            .find(|l| l.contains(", p99, 10000 services"))
            .unwrap_or_else(|| panic!("no p99 row in\n{o}"));
        assert_eq!(
            p99,
            "| one EndpointSlice change → data path, p99, 10000 services (§6) | 200 ms | 2000 ms | 10.00× | - | - | ≥ 60000 ms | > 300× |"
        );
        let mut section = String::new();
        r.propagation_section(&mut section);
        assert!(
            section.contains("| 10000 | kube-proxy nftables | 40 (1 not shown in 60 s) |"),
            "{section}"
        );
        assert!(
            section.contains("≥ 60000 ms | 10.0 | ≥ 300.0 | - | 20 / 40 ms |"),
            "{section}"
        );
        assert!(section.contains("| 2000 ms | 10.0 | 10.0 |"), "{section}");
    }
}
