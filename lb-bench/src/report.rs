//! The Markdown report: what was run, where, the results side by side with
//! ratios, and each target of the benchmark issue, met or missed by how much.
use std::{fmt::Write as _, time::Duration};

use crate::{
    connect::{Scale, Variant},
    control::{ControlResult, ENDPOINTS},
    maglev::MaglevResult,
    packet::{PacketResult, Timing},
    profile::Profile,
    propagation::SAMPLE_TIMEOUT,
};

/// Why the numbers are what they are: measured separately (the figures say
/// how), kept with the report so every run carries them.
const NOTES: &str = include_str!("report/notes.md");

// The longer parts of the report, each in a file of its own: they add
// methods to `Report`.
mod bed;
mod memory;
mod packet;
mod targets;
mod versus;

pub struct Report {
    /// The commit the run's binaries are built from.
    pub commit: String,
    pub profile: &'static str,
    pub command: String,
    pub connect: Vec<Scale>,
    pub control: Vec<ControlResult>,
    pub packet: Vec<PacketResult>,
    pub maglev: Vec<MaglevResult>,
    pub northsouth: Vec<crate::northsouth::NsResult>,
    pub propagation: Vec<crate::propagation::PropagationResult>,
    pub file_edit: Vec<crate::file_edit::FileEditResult>,
    pub map_writes: Vec<crate::map_writes::MapWriteResult>,
    pub breakdown: Vec<crate::memory::Breakdown>,
    pub kube_breakdown: Vec<crate::kube_memory::KubeBreakdown>,
    pub kube_scale: Vec<crate::kube_memory::KubeScale>,
    pub bed: Vec<crate::bed_traffic::BedResult>,
    pub total: Duration,
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.0}")
    }
}

/// A proxy's own network programming latency: p50 / p99 (count).
fn own_metric(m: Option<([f64; 2], f64)>) -> String {
    m.map_or("-".into(), |([p50, p99], n)| {
        format!("{:.0} / {:.0} ms ({n:.0})", p50 * 1e3, p99 * 1e3)
    })
}

fn opt_ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{} ms", ms(d)))
}

/// A kube-proxy measurement, or why there is none.
fn not_run(d: Option<Duration>) -> String {
    d.map_or("not run (too slow to load at this scale)".into(), |d| {
        format!("{} ms", ms(d))
    })
}

fn ratio(a: Option<Duration>, b: Duration) -> String {
    a.map_or("-".into(), |a| {
        format!("{:.1}×", a.as_secs_f64() / b.as_secs_f64().max(1e-9))
    })
}

/// Today in UTC, from the clock (no date crate for one line).
fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        / 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}")
}

/// The first line of `program --version`.
fn version(program: &str) -> String {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("{program}: not found"))
}

fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string());
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    format!(
        "kernel {kernel}, {cpus} CPUs ({})",
        model.unwrap_or_else(|| "unknown model".into())
    )
}

impl Report {
    pub fn new(p: &Profile, command: String) -> Self {
        Self {
            profile: p.label(),
            // The commit the binaries are built from, named when the run
            // starts (edits made during it are not in it).
            commit: lb_testkit::conformance::run_commit(),
            command,
            connect: Vec::new(),
            control: Vec::new(),
            packet: Vec::new(),
            maglev: Vec::new(),
            northsouth: Vec::new(),
            propagation: Vec::new(),
            file_edit: Vec::new(),
            map_writes: Vec::new(),
            breakdown: Vec::new(),
            kube_breakdown: Vec::new(),
            kube_scale: Vec::new(),
            bed: Vec::new(),
            total: Duration::ZERO,
        }
    }

    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# Benchmarks\n");
        let _ = writeln!(
            o,
            "Written by `cargo xtask bench` ({} profile) on {}, on commit `{}`; {}; re-created layouts loaded with {} and {}, the real kube-proxy using {}. Command: `{}`. Whole run: {:.0} s.\n",
            self.profile,
            today(),
            self.commit,
            machine(),
            version("iptables-legacy"),
            version("nft"),
            version("iptables"),
            self.command,
            self.total.as_secs_f64()
        );
        o.push_str(
            "Every number below was measured in this one run, side by side with its peer, in network\n\
             namespaces of the bench's own (see `lb-bench/src/`). The machines here are shared and noisy:\n\
             read the ratios, not the absolute values. Targets are what the benchmark issue asks; they are\n\
             never asserted in tests.\n\n",
        );
        self.versus_kube_proxy(&mut o);
        self.targets(&mut o);
        o.push_str(NOTES);
        self.connect_section(&mut o);
        self.control_section(&mut o);
        self.packet_section(&mut o);
        self.maglev_section(&mut o);
        self.northsouth_section(&mut o);
        self.propagation_section(&mut o);
        self.memory_section(&mut o);
        self.file_edit_section(&mut o);
        self.bed_section(&mut o);
        o
    }

    fn file_edit_section(&self, o: &mut String) {
        if self.file_edit.is_empty() {
            return;
        }
        o.push_str(
            "## 8. Standalone mode: a services-file edit to the maps\n\n\
             One service of an N-service file gets a new endpoint; the file is written beside and\n\
             renamed over (as editors and config management do); the time is from the rename to the\n\
             pinned map showing the new endpoint, with the real agent (inotify, read, parse, reconcile,\n\
             bpf(2); a file renamed into place is read at once, one written in place only once its size\n\
             and time stay the same for 10 ms). In process beside it: the edited file read as the agent\n\
             reads it (only the changed service parsed and checked against what the others claim; the\n\
             answer is that one change, not a whole model) and parsed whole, as every edit was before.\n\n\
             | Services | Edits | rename → map p50 | p99 | read with the cache | parsed whole |\n\
             |---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.file_edit {
            let _ = writeln!(
                o,
                "| {} | {} | {} ms | {} ms | {} ms | {} ms |",
                r.services,
                r.samples,
                ms(r.to_map[0]),
                ms(r.to_map[1]),
                ms(r.parse_cached),
                ms(r.parse_whole)
            );
        }
        o.push('\n');
    }

    fn northsouth_section(&self, o: &mut String) {
        let Some(base) = self.northsouth.first() else {
            return;
        };
        o.push_str(
            "## 5. North-south: through a NodePort vs plain routing\n\n\
             A client outside, node A with the NodePort, the backend on node B (network namespaces, veth, a\n\
             bridge). Routing: the client sends to the pod itself through node A, no program anywhere.\n\
             Bulk: one TCP stream, every byte checked; connections: sequential short connections from one\n\
             client. Medians of the rounds. Targets: bulk ≥ 0.8× routing, connections/s ≥ 0.9×.\n\n\
             | Path | Upload Mbit/s | Download Mbit/s | Connections/s | vs routing: up | down | connections |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        let r = |a: f64, b: f64| format!("{:.2}×", a / b.max(1e-9));
        for n in &self.northsouth {
            let _ = writeln!(
                o,
                "| {} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
                n.variant,
                n.up_mbit,
                n.down_mbit,
                n.conns_per_s,
                r(n.up_mbit, base.up_mbit),
                r(n.down_mbit, base.down_mbit),
                r(n.conns_per_s, base.conns_per_s)
            );
        }
        o.push('\n');
    }

    pub(super) fn propagation_section(&self, o: &mut String) {
        if self.propagation.is_empty() {
            return;
        }
        o.push_str(
            "## 6. Propagation on a real control plane\n\n\
             etcd, kube-apiserver and kube-controller-manager v1.35.8 from the upstream modules\n\
             (`testbed/`), the agent with its shipped RBAC over TLS and the DaemonSet's\n\
             `--min-sync-period` of 100 ms. N selectorless services × 10 endpoints in the cluster; the\n\
             samples flip one Pod's Ready condition (the status subresource, as a kubelet) and time it\n\
             to the ClusterIP's entry in `LB4_SERVICES` changing, one by one, while 20 other pods flip\n\
             readiness ~10 times a second. The split uses the bench's own watch on the EndpointSlices:\n\
             *controller* is write → slice changed (the EndpointSlice controller's part, the same for\n\
             kube-proxy), *agent* is slice seen → map entry (our part: watch delivery, debounce,\n\
             reconcile, bpf(2)). Nearest-rank p50/p99.\n\n\
             For scale: kube-proxy measures the same path as `kubeproxy_network_programming_duration_seconds`\n\
             (from the Pod's Ready transition, carried by the slice's\n\
             `endpoints.kubernetes.io/last-change-trigger-time`, to the end of a successful sync).\n\
             KEP-3453 reports it on the 5 000-node scalability test: p50 about 27 s before partial\n\
             iptables-restore, about 13 s after, about 5 s with `--iptables-min-sync-period 1s`;\n\
             sig-scalability's SLI is its p99 (the SLO's threshold is still unset upstream). Our\n\
             cluster is one node and thousands of services, not 5 000 nodes: compare the agent's\n\
             column, which is what we add to the controller's, not the totals.\n\n\
             The real kube-proxy (cmd/kube-proxy v1.35.8 of the test bed) then runs as the same node\n\
             on the same objects, in iptables mode with iptables-nft (Debian 12's `iptables`), in\n\
             iptables mode with iptables-legacy, and in nftables mode, each from empty rules once the\n\
             agent has stopped, and the same samples poll its rules instead of the map: the Service\n\
             port's chain listed (`iptables -t nat -S KUBE-SVC-…`, `nft list chain ip kube-proxy\n\
             service-…`) until it spreads over the new number of endpoints, a few ms per poll (the\n\
             resolution of its rows). Its own defaults: `--iptables-min-sync-period` 1 s, and so for\n\
             nftables. *× agent* is its write → rules over the agent's write → map. A mode that has\n\
             not programmed its first full sync within the run's limit is not sampled: its row says so.\n\
             Its samples stop at the profile's time limit per mode and scale (fewer samples than the\n\
             agent's then), and a sample whose rules had not changed within 60 s counts as 60 s: a\n\
             percentile that lands on one is shown as ≥, and so is its ratio. *Look* is how long one\n\
             look at the rules took (p50 / max), the resolution of the row: at 10 000 services a look\n\
             dumps a large table (iptables' nat table under the xtables lock, nftables' ruleset), so\n\
             the bench sleeps four times a look's time before the next, keeping its looks to a fifth\n\
             of a core beside kube-proxy.\n\n\
             *Own metric*: `kubeproxy_network_programming_duration_seconds` as each proxy exports it\n\
             (the agent under kube-proxy's name and buckets), the difference of two scrapes around the\n\
             sampling (the samples and the background changes, what the proxy still held 2 s later\n\
             included), p50 / p99 estimated from the buckets as Prometheus' `histogram_quantile` does\n\
             (linear inside a bucket; the bounds are 0.25 s, 0.5 s, then whole seconds, so values\n\
             inside a bucket are interpolation, not measurement), and the count. Both start at the\n\
             Pod's Ready `lastTransitionTime`, which the API keeps in whole seconds: every observation\n\
             gains 0-1 s (about 0.5 s on average) for both proxies, so these figures are much closer\n\
             together than the measured ones and get no ratio. The EndpointSlice controller also\n\
             drops a trigger time not later than the pod's previous one (two flips of a pod within a\n\
             second), so the counts differ from the changes made; and kube-proxy's sampling ran longer\n\
             (its samples are slower), so it saw more background changes.\n\n\
             | Services | proxy | Samples | controller p50 | p99 | proxy p50 | p99 | write → data path p50 | p99 | × agent p50 | p99 | own metric p50 / p99 (count) | look p50 / max | background changes | setup |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.propagation {
            let _ = writeln!(
                o,
                "| {} | lb-agent | {} | {} ms | {} ms | {} ms | {} ms | {} ms | {} ms | 1 | 1 | {} | {} / {} ms | {} | {:.0} s |",
                r.services,
                r.samples,
                ms(r.to_slice[0]),
                ms(r.to_slice[1]),
                ms(r.slice_to_map[0]),
                ms(r.slice_to_map[1]),
                ms(r.to_map[0]),
                ms(r.to_map[1]),
                own_metric(r.programming),
                ms(r.poll[0]),
                ms(r.poll[1]),
                r.background_changes,
                r.setup_s,
            );
            for k in &r.kube_proxy {
                if let Err(limit) = k.first_sync {
                    let _ = writeln!(
                        o,
                        "| {} | kube-proxy {} | 0 | no first full sync within {} s: not sampled | | | | | | | | | | | |",
                        r.services,
                        k.mode,
                        limit.as_secs()
                    );
                    continue;
                }
                // A sample kube-proxy missed counts as the timeout: a
                // write → rules percentile there is a lower bound, and so
                // is its ratio. (Its slice → rules part ends at the same
                // deadline but starts later, so it never reaches the
                // timeout itself: those columns carry no mark.)
                let bound = |d: Duration| if d >= SAMPLE_TIMEOUT { "≥ " } else { "" };
                let ratio = |i: usize| {
                    format!(
                        "{}{:.1}",
                        bound(k.to_rules[i]),
                        k.to_rules[i].as_secs_f64() / r.to_map[i].as_secs_f64().max(1e-9)
                    )
                };
                let samples = if k.missed == 0 {
                    k.samples.to_string()
                } else {
                    format!(
                        "{} ({} not shown in {} s)",
                        k.samples,
                        k.missed,
                        SAMPLE_TIMEOUT.as_secs()
                    )
                };
                let _ = writeln!(
                    o,
                    "| {} | kube-proxy {} | {samples} | {} ms | {} ms | {} ms | {} ms | {}{} ms | {}{} ms | {} | {} | {} | {} / {} ms | | |",
                    r.services,
                    k.mode,
                    ms(k.to_slice[0]),
                    ms(k.to_slice[1]),
                    ms(k.slice_to_rules[0]),
                    ms(k.slice_to_rules[1]),
                    bound(k.to_rules[0]),
                    ms(k.to_rules[0]),
                    bound(k.to_rules[1]),
                    ms(k.to_rules[1]),
                    ratio(0),
                    ratio(1),
                    own_metric(k.programming),
                    ms(k.poll[0]),
                    ms(k.poll[1]),
                );
            }
        }
        o.push('\n');
    }

    fn connect_section(&self, o: &mut String) {
        if self.connect.is_empty() {
            return;
        }
        o.push_str(
            "## 1. Connect through a service address\n\n\
             One client process connects and resets in a loop (TCP handshake timed; RST so no TIME_WAIT),\n\
             to the last of N services with 2 backends each. `direct` dials the backend itself (`hooks\n\
             attached`: from the cgroup with our programs, which find no service there); `lb` the\n\
             service address, translated by our connect4 program; the kube-proxy rows dial it through\n\
             kube-proxy's iptables layout (KUBE-SERVICES → KUBE-SVC-* statistic → KUBE-SEP-* DNAT,\n\
             iptables-legacy) or nftables layout (service-ips verdict map → numgen → endpoint DNAT),\n\
             generated by the bench in the client's namespace. Rate: median over rounds, the variants\n\
             taking turns. Ratio: rate ÷ the direct rate of the same scale. The BPF-stats rows come\n\
             from extra runs with the kernel's statistics on: connect4's time per run, and every one\n\
             of our programs that ran, per direct connect, against that connect's time: direct to a\n\
             backend (as `direct`), and elsewhere (a port no service uses on a backend's host).\n\n\
             | Services | Variant | Connects/s | vs direct | p50 µs | p99 µs | Attempts | Failed |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|\n",
        );
        for s in &self.connect {
            let direct = s.get(Variant::Direct).map_or(1.0, |d| d.rate);
            for r in &s.results {
                let _ = writeln!(
                    o,
                    "| {} | {} | {:.0} | {:.2}× | {} | {} | {} | {} |",
                    s.services,
                    r.variant.name(),
                    r.rate,
                    r.rate / direct,
                    us(r.p50),
                    us(r.p99),
                    r.attempts,
                    r.failed
                );
            }
            if let Some(h) = &s.hooks {
                let _ = writeln!(
                    o,
                    "| {} | connect4 program, per run (BPF stats) | | | {:.0} ns via the VIP | {:.0} ns direct | | |",
                    s.services, h.connect4_vip_ns, h.connect4_direct_ns
                );
                for (to, c) in [("to a backend", &h.to_backend), ("elsewhere", &h.elsewhere)] {
                    let each: Vec<String> = c
                        .programs
                        .iter()
                        .map(|(n, ns)| format!("{n} {ns:.0}"))
                        .collect();
                    let _ = writeln!(
                        o,
                        "| {} | our programs per direct connect {to} (BPF stats) | | | {:.0} ns: {} | {:.2}% of {:.1} µs | | |",
                        s.services,
                        c.total_ns(),
                        each.join(", "),
                        c.share() * 100.0,
                        c.connect_ns / 1e3
                    );
                }
            }
            for v in Variant::ALL.iter().filter(|v| s.get(**v).is_none()) {
                let _ = writeln!(
                    o,
                    "| {} | {} | not run (too slow to load at this scale) | | | | | |",
                    s.services,
                    v.name()
                );
            }
        }
        o.push_str(
            "\nInstalling the services for this test (wall time): our agent from start to its first\n\
             reconcile (services file parsed, programs loaded and attached, maps written), against\n\
             iptables-restore and nft -f of the same services.\n\n\
             | Services | lb agent start | iptables-restore | nft -f |\n|---:|---:|---:|---:|\n",
        );
        for s in &self.connect {
            let _ = writeln!(
                o,
                "| {} | {} ms | {} | {} |",
                s.services,
                ms(s.setup_lb),
                not_run(s.setup_iptables),
                not_run(s.setup_nftables)
            );
        }
        o.push('\n');
    }

    fn control_section(&self, o: &mut String) {
        if self.control.is_empty() {
            return;
        }
        let _ = write!(
            o,
            "## 2. Control plane\n\n\
             N services × {ENDPOINTS} endpoints. Full sync: from nothing to every service in the data path.\n\
             One change: one endpoint of one service replaced (a pod of a rolling update), median of\n\
             several. Ours: the agent's reconciler on real pinned maps (desired state, diff, writes),\n\
             in process. kube-proxy: iptables-legacy-restore (partial sync with `--noflush`, as since\n\
             1.28: KUBE-SERVICES rewritten whole, the service's chains replaced) and one `nft -f`\n\
             transaction, timed from spawn to exit.\n\n\
             What the kube-proxy columns include: starting iptables-legacy-restore or nft, their parse,\n\
             and the kernel's work on the rules. They do not include kube-proxy's own Go computation\n\
             (listing services, building the rule text), which it pays on top. Ours include our whole\n\
             computation (model, desired state, diff) and the bpf(2) writes, in process, with no\n\
             spawn. Ratio (full sync only): kube-proxy's time ÷ ours; both are hundreds of ms there,\n\
             so the spawn (about a millisecond) does not decide it. For one change there is no ratio:\n\
             an in-process call against a process spawn is not like for like; the columns say how\n\
             long each takes to apply the change, and for kube-proxy that is mostly the rewrite of\n\
             its service table (iptables) or one transaction (nft).\n\n\
             `-`: not run at this scale (loading kube-proxy's layout grows faster than linearly); the\n\
             in-memory column is the same full sync writing nowhere: our computation without the bpf(2) calls.\n\n\
             `lb full sync` is the agent's: a writer thread makes the bpf(2) writes, in order, while the\n\
             next services are computed; `serial` is the same on one thread; `preallocated` the agent's\n\
             into maps made with `--preallocate-maps` (their whole capacity reserved at creation).\n\n\
             | Services | lb full sync | serial | preallocated | in memory | writes | iptables | ratio | nftables | ratio | lb one change | writes | iptables | nftables |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        );
        for c in &self.control {
            let _ = writeln!(
                o,
                "| {} | {} ms | {} ms | {} ms | {} ms | {} | {} | {} | {} | {} | {} ms | {} | {} | {} |",
                c.services,
                ms(c.lb_full),
                ms(c.lb_full_serial),
                ms(c.lb_full_preallocated),
                ms(c.lb_full_in_memory),
                c.lb_full_writes,
                opt_ms(c.iptables_full),
                ratio(c.iptables_full, c.lb_full),
                opt_ms(c.nftables_full),
                ratio(c.nftables_full, c.lb_full),
                ms(c.lb_change),
                c.lb_change_writes,
                opt_ms(c.iptables_change),
                opt_ms(c.nftables_change),
            );
        }
        o.push('\n');
        if !self.map_writes.is_empty() {
            o.push_str(
                "What the kernel's part of a full sync costs, by how the maps are made and written: a hash\n\
                 map with LB4_SERVICES' key and value, filled from empty, per element. The agent's maps\n\
                 are not preallocated unless `--preallocate-maps` (memory follows use) and are written\n\
                 from one writer thread, each run of upserts to one map in one BPF_MAP_UPDATE_BATCH: about\n\
                 a dozen elements per batch with 10 endpoints (the batch-16 rows).\n\n\
                 | Elements | Preallocated | Batch | Threads | ns per element |\n|---:|---|---:|---:|---:|\n",
            );
            for w in &self.map_writes {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {:.0} |",
                    w.elements,
                    if w.prealloc {
                        "yes"
                    } else {
                        "no (BPF_F_NO_PREALLOC)"
                    },
                    w.batch,
                    w.threads,
                    w.per_element.as_nanos() as f64
                );
            }
            o.push('\n');
        }
    }

    fn maglev_section(&self, o: &mut String) {
        if self.maglev.is_empty() {
            return;
        }
        o.push_str(
            "## 4. Maglev\n\n\
             Table build (median of 5), balance (the most and the fewest slots a backend owns, ÷ M/N) and\n\
             disruption (share of slots that change owner when one of N backends is removed, the mean of\n\
             5 removals spread over the backends; ideal 1/N). A table costs 4·M bytes of kernel memory\n\
             per service that uses Maglev. M is the service's own (`maglevTableSize`, the\n\
             `lb.dev/maglev-table-size` annotation) or `--maglev-table-size` (default 16381).\n\n\
             | M | Table KiB | Backends | Build ms | Max ÷ ideal | Min ÷ ideal | Disruption | ÷ ideal | Ideal |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for m in &self.maglev {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {:.3} | {:.3} | {:.2}% | {:.2}× | {:.2}% |",
                m.m,
                u64::from(m.m) * 4 / 1024,
                m.backends,
                ms(m.build),
                m.max_over_ideal,
                m.min_over_ideal,
                m.disruption * 100.0,
                m.disruption * m.backends as f64,
                100.0 / m.backends as f64
            );
        }
        o.push('\n');
    }
}
