//! Traffic on the multi-node test bed (`lb_testkit::kube_cluster`): the
//! agent, then the real kube-proxy in iptables mode, then in nftables mode,
//! each serving a cluster of two nodes with real kubelets and pods, the same
//! manifests and the same measurements.
//!
//! ```text
//!  node 1: client pod ──(ClusterIP :80 / pod IPs :8080)──┐
//!                                                         ├─ node 2: web pods (lb-pod-server)
//!  outside client ──(node 1 :NodePort / routed to a pod)─┘
//! ```
//!
//! * connects per second from a pod on node 1 through the ClusterIP of a
//!   Service whose two pods run on node 2, against connects from the same
//!   pod straight to the pods' addresses (the bench's connect client, run in
//!   the pod's network namespace and cgroup, so the agent's socket hooks
//!   apply to it as to the pod's own processes);
//! * bulk TCP each way and short connections per second from the outside
//!   client through node 1's NodePort to the pods on node 2, against the
//!   same client routed to a pod through node 1 (no Service in the way).
//!
//! Each proxy's figures are ratios to its own baseline, measured in the
//! same rounds (they take turns, in ABBA order), because the three clusters
//! run one after the other and machine noise differs between them. A
//! baseline is not free of the proxy: kube-proxy's iptables rules see every
//! new connection through the node, Service or not (nat PREROUTING's
//! KUBE-SERVICES list is walked before the no-Service packet leaves it), so
//! the report also sets the absolute rates side by side. Selectorless
//! Services whose slices name the same two pods are added between scales,
//! so the measured Service is one of N, as in a real cluster; each
//! measurement starts once the proxies' last sync is a few seconds old.
use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::Api;
use lb_testkit::{
    fabric,
    kube_cluster::{Cluster, Proxy},
    kube_proxy::Mode,
    node::{BUSYBOX_IMAGE, POD_SERVER_IMAGE},
    traffic, unique,
};

use crate::{
    apiserver::{client, in_netns, selectorless, Selectorless},
    client as connect_client,
    profile::Profile,
    stats::median_f64,
};

const NS: &str = "bench";
/// The pods' ports: short answers, and the bulk protocol of `traffic`.
const TCP_PORT: u16 = 8080;
const BULK_PORT: u16 = 9000;
/// Connects per round: as many as fit in the round's time.
const UNBOUNDED: usize = 100_000_000;

/// One proxy at one scale.
#[derive(Clone, Debug)]
pub struct BedResult {
    /// "lb-agent", "kube-proxy iptables", "kube-proxy nftables".
    pub proxy: String,
    /// Services in the cluster besides the measured one.
    pub extra_services: usize,
    /// Connects per second from the pod: straight to the pods, and
    /// through the ClusterIP (medians of the rounds).
    pub direct_cps: f64,
    pub cluster_ip_cps: f64,
    /// Median of the round-by-round ratios ClusterIP ÷ direct.
    pub cluster_ip_ratio: f64,
    /// connect() p50 through the ClusterIP and direct, all rounds.
    pub cluster_ip_p50: Duration,
    pub direct_p50: Duration,
    pub connect_failures: usize,
    /// From outside: routed to a pod, and through the NodePort.
    pub routing: Path,
    pub node_port: Path,
    /// Medians of the round-by-round ratios NodePort ÷ routing.
    pub node_port_ratio: Path,
    /// Seconds from the last extra Service created to the proxy serving it;
    /// when `served` is false, the limit it was given.
    pub sync_s: f64,
    /// Whether the proxy served the last extra Service within the limit
    /// (`Profile::kube_proxy_sync_limit_s` for kube-proxy). When not, nothing
    /// was measured at this scale and no larger scale was tried: kube-proxy
    /// in iptables mode on iptables-nft does not program 10,000 Services
    /// here (docs/testbed.md).
    pub served: bool,
}

impl BedResult {
    /// A scale the proxy did not serve within `limit_s`.
    pub(crate) fn unserved(proxy: String, extra_services: usize, limit_s: f64) -> BedResult {
        BedResult {
            proxy,
            extra_services,
            direct_cps: 0.0,
            cluster_ip_cps: 0.0,
            cluster_ip_ratio: 0.0,
            cluster_ip_p50: Duration::ZERO,
            direct_p50: Duration::ZERO,
            connect_failures: 0,
            routing: Path::default(),
            node_port: Path::default(),
            node_port_ratio: Path::default(),
            sync_s: limit_s,
            served: false,
        }
    }
}

/// Outside traffic through one way to the pods.
#[derive(Clone, Debug, Default)]
pub struct Path {
    pub up_mbit: f64,
    pub down_mbit: f64,
    pub conns_per_s: f64,
}

pub fn run(p: &Profile) -> Vec<BedResult> {
    let mut out = Vec::new();
    for proxy in [
        Proxy::Agent,
        Proxy::KubeProxy(Mode::Iptables),
        Proxy::KubeProxy(Mode::Nftables),
    ] {
        eprintln!("lb-bench:   two nodes served by {}", label(proxy));
        out.extend(one_proxy(p, proxy));
    }
    out
}

fn label(proxy: Proxy) -> String {
    match proxy {
        Proxy::Agent => "lb-agent".into(),
        Proxy::KubeProxy(m) => format!("kube-proxy {}", m.name()),
    }
}

fn one_proxy(p: &Profile, proxy: Proxy) -> Vec<BedResult> {
    let tag = unique("benchbed");
    let c = Cluster::start_nodes_with(&tag, 2, proxy);
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    c.cp.apply(&manifests(&n1.name, &n2.name));
    c.cp.kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        "deploy/web",
        "--timeout=180s",
    ]);
    c.cp.kubectl(&[
        "-n",
        NS,
        "wait",
        "pod/client",
        "--for=condition=Ready",
        "--timeout=180s",
    ]);
    let pods: Vec<Ipv4Addr> =
        c.cp.kubectl(&[
            "-n",
            NS,
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].status.podIP}",
        ])
        .split_whitespace()
        .map(|s| s.parse().expect("a pod IP"))
        .collect();
    assert_eq!(pods.len(), 2, "two web pods: {pods:?}");
    let cluster_ip: Ipv4Addr = field(&c, "{.spec.clusterIP}").parse().unwrap();
    let node_port = |name: &str| -> u16 {
        field(
            &c,
            &format!("{{.spec.ports[?(@.name==\"{name}\")].nodePort}}"),
        )
        .parse()
        .unwrap()
    };
    let (np_tcp, np_bulk) = (node_port("tcp"), node_port("bulk"));
    let pod = PodClient::find(&c, "client");

    // The routing baseline: the outside client reaches node 2's pods
    // through node 1, and node 2 answers through node 1 too (symmetric, as
    // SNAT through a NodePort is; kube-proxy's iptables mode drops
    // conntrack-INVALID packets, which a one-sided flow through node 1
    // would be).
    // The client must keep sending through node 1: node 1 forwards out of
    // the fabric port the packet came in by, so it sends an ICMP redirect,
    // and a host that does not forward follows it (accept_redirects is on
    // when either `all` or the device says so). Followed, the flow would
    // skip node 1 one way, and kube-proxy drops such one-sided flows as
    // conntrack INVALID in iptables mode.
    let client = c.client();
    let mut no_redirects = std::process::Command::new("sh");
    no_redirects.args([
        "-c",
        "for f in /proc/sys/net/ipv4/conf/*/accept_redirects; do echo 0 > $f; done",
    ]);
    lb_testkit::netns::exec_in(&mut no_redirects, &client.name).unwrap();
    assert!(no_redirects.status().unwrap().success());
    client.ip(&["route", "add", &n2.pod_cidr, "via", &n1.ip]);
    lb_testkit::run(
        "ip",
        &[
            "-n",
            &n2.netns_name,
            "route",
            "add",
            &format!("{}/32", fabric::CLIENT),
            "via",
            &n1.ip,
        ],
    );

    let node1: Ipv4Addr = n1.ip.parse().unwrap();
    let direct: Vec<SocketAddr> = pods
        .iter()
        .map(|ip| SocketAddr::from((*ip, TCP_PORT)))
        .collect();
    let via_cluster_ip = [SocketAddr::from((cluster_ip, 80))];
    let ways = Ways {
        routed_bulk: SocketAddr::from((pods[0], BULK_PORT)),
        routed_tcp: SocketAddr::from((pods[0], TCP_PORT)),
        node_port_bulk: SocketAddr::from((node1, np_bulk)),
        node_port_tcp: SocketAddr::from((node1, np_tcp)),
    };
    // Every way answers before anything is timed (a broken path must not
    // pass as a slow one), once the proxy has caught up with the Service
    // and its pods (kube-proxy rejects a Service it has no endpoints for).
    for t in [&direct[..], &via_cluster_ip[..]] {
        let ok = lb_testkit::wait_until(Duration::from_secs(120), || {
            let s = pod.connects(t, 20, 5_000);
            s.failed == 0 && s.latencies_ns.len() == 20
        });
        assert!(
            ok,
            "{}: connects from the pod to {t:?} fail:\n{}",
            label(proxy),
            c.logs()
        );
    }
    for t in [ways.routed_tcp, ways.node_port_tcp] {
        let ok = lb_testkit::wait_until(Duration::from_secs(120), || {
            traffic::churn(&client.name, t, 20).failed == 0
        });
        assert!(
            ok,
            "{}: connections from outside to {t} fail:\n{}",
            label(proxy),
            c.logs()
        );
    }

    let mut results = Vec::new();
    let mut created = 0;
    for &extra in &p.bed_services {
        let sync_s = if extra > created {
            let t = Instant::now();
            create_services(&c, created..extra, &pods);
            eprintln!(
                "lb-bench:   {} more services created in {:.0} s",
                extra - created,
                t.elapsed().as_secs_f64()
            );
            let t = Instant::now();
            // The agent must always get there; kube-proxy not getting there
            // in time is a result (and its CPU would starve the rest of the
            // run), so its cluster stops at this scale.
            let limit = match proxy {
                Proxy::Agent => Duration::from_secs(900),
                Proxy::KubeProxy(_) => Duration::from_secs(p.kube_proxy_sync_limit_s),
            };
            if !wait_served(&c, &pod, extra - 1, proxy, limit) {
                eprintln!(
                    "lb-bench:   {} did not serve {extra} more services within {} s: not measured at this scale or above",
                    label(proxy),
                    limit.as_secs()
                );
                results.push(BedResult::unserved(
                    label(proxy),
                    extra,
                    limit.as_secs_f64(),
                ));
                break;
            }
            created = extra;
            t.elapsed().as_secs_f64()
        } else {
            0.0
        };
        wait_quiet(&c, proxy);
        let r = measure(p, &pod, &client.name, &direct, &via_cluster_ip, &ways);
        eprintln!(
            "lb-bench:   {} with {extra} more services: ClusterIP {:.2}× direct, NodePort up {:.2}× down {:.2}× conns {:.2}× routing",
            label(proxy),
            r.cluster_ip_ratio,
            r.node_port_ratio.up_mbit,
            r.node_port_ratio.down_mbit,
            r.node_port_ratio.conns_per_s
        );
        results.push(BedResult {
            proxy: label(proxy),
            extra_services: extra,
            sync_s,
            served: true,
            ..r
        });
    }
    results
}

/// The outside client's targets.
struct Ways {
    routed_bulk: SocketAddr,
    routed_tcp: SocketAddr,
    node_port_bulk: SocketAddr,
    node_port_tcp: SocketAddr,
}

fn measure(
    p: &Profile,
    pod: &PodClient,
    client: &str,
    direct: &[SocketAddr],
    via_cluster_ip: &[SocketAddr],
    ways: &Ways,
) -> BedResult {
    let ms = p.bed_ms;
    let (mut d_rates, mut c_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut d_lat, mut c_lat, mut failures) = (Vec::new(), Vec::new(), 0);
    let mut routed: Vec<[f64; 3]> = Vec::new();
    let mut through: Vec<[f64; 3]> = Vec::new();
    for round in 0..p.bed_rounds {
        // ABBA: the baseline first in even rounds, second in odd ones, so
        // neither always runs on what the other left warm (or cold).
        let baseline_first = round % 2 == 0;
        let (d, v) = if baseline_first {
            let d = pod.connects(direct, UNBOUNDED, ms);
            (d, pod.connects(via_cluster_ip, UNBOUNDED, ms))
        } else {
            let v = pod.connects(via_cluster_ip, UNBOUNDED, ms);
            (pod.connects(direct, UNBOUNDED, ms), v)
        };
        // A path that fails must not pass as a slow one.
        for (what, s) in [("direct", &d), ("through the ClusterIP", &v)] {
            assert_eq!(
                s.failed, 0,
                "connects from the pod {what} failed: {:?}",
                s.first_error
            );
        }
        failures += d.failed + v.failed;
        let (dr, vr) = (rate(&d), rate(&v));
        d_rates.push(dr);
        c_rates.push(vr);
        ratios.push(vr / dr.max(1e-9));
        d_lat.extend(d.latencies_ns);
        c_lat.extend(v.latencies_ns);
        let seed = 100 + round as u64;
        let mut order = [
            (ways.routed_bulk, ways.routed_tcp, &mut routed),
            (ways.node_port_bulk, ways.node_port_tcp, &mut through),
        ];
        if !baseline_first {
            order.reverse();
        }
        for (bulk, tcp, into) in order {
            let up = traffic::upload(client, bulk, seed, ms)
                .unwrap_or_else(|e| panic!("upload to {bulk}: {e}"));
            let down = traffic::download(client, bulk, seed, None, Some(ms))
                .unwrap_or_else(|e| panic!("download from {bulk}: {e}"));
            let churn = traffic::churn_for(client, tcp, ms);
            assert_eq!(churn.failed, 0, "connections to {tcp}: {:?}", churn.errors);
            into.push([
                up.mbit_per_s(),
                down.mbit_per_s(),
                churn.ok as f64 / churn.elapsed.as_secs_f64().max(1e-9),
            ]);
        }
    }
    let column = |v: &[[f64; 3]], i: usize| median_f64(v.iter().map(|r| r[i]).collect());
    let path = |v: &[[f64; 3]]| Path {
        up_mbit: column(v, 0),
        down_mbit: column(v, 1),
        conns_per_s: column(v, 2),
    };
    let ratio = |i: usize| {
        median_f64(
            routed
                .iter()
                .zip(&through)
                .map(|(r, t)| t[i] / r[i].max(1e-9))
                .collect(),
        )
    };
    let p50 = |mut v: Vec<u64>| {
        v.sort_unstable();
        Duration::from_nanos(v.get(v.len() / 2).copied().unwrap_or(0))
    };
    BedResult {
        proxy: String::new(),
        extra_services: 0,
        direct_cps: median_f64(d_rates),
        cluster_ip_cps: median_f64(c_rates),
        cluster_ip_ratio: median_f64(ratios),
        cluster_ip_p50: p50(c_lat),
        direct_p50: p50(d_lat),
        connect_failures: failures,
        routing: path(&routed),
        node_port: path(&through),
        node_port_ratio: Path {
            up_mbit: ratio(0),
            down_mbit: ratio(1),
            conns_per_s: ratio(2),
        },
        sync_s: 0.0,
        served: true,
    }
}

fn rate(s: &connect_client::Sample) -> f64 {
    s.latencies_ns.len() as f64 / (s.elapsed_ns as f64 / 1e9).max(1e-9)
}

/// The namespace, two web pods on node 2 behind a NodePort Service, and a
/// client pod on node 1.
fn manifests(node1: &str, node2: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NS}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      nodeName: {node2}
      containers:
        - name: server
          image: {POD_SERVER_IMAGE}
          args: [--tcp, "{TCP_PORT}", --bulk, "{BULK_PORT}"]
          env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
          readinessProbe: {{tcpSocket: {{port: {TCP_PORT}}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NS}}}
spec:
  type: NodePort
  externalTrafficPolicy: Cluster
  selector: {{app: web}}
  ports:
    - {{name: tcp, port: 80, targetPort: {TCP_PORT}, protocol: TCP}}
    - {{name: bulk, port: {BULK_PORT}, targetPort: {BULK_PORT}, protocol: TCP}}
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: {NS}}}
spec:
  nodeName: {node1}
  terminationGracePeriodSeconds: 0
  containers:
    - {{name: client, image: {BUSYBOX_IMAGE}, command: [sleep, "1000000"]}}
"#
    )
}

/// `jsonpath` of the web Service.
fn field(c: &Cluster, jsonpath: &str) -> String {
    c.cp.kubectl(&[
        "-n",
        NS,
        "get",
        "service",
        "web",
        "-o",
        &format!("jsonpath={jsonpath}"),
    ])
    .trim()
    .to_string()
}

/// Selectorless Services `extra-<i>` for `range`, each with a slice naming
/// the two web pods (so each is as real to the proxy as the measured one),
/// created through the apiserver 16 at a time.
fn create_services(c: &Cluster, range: std::ops::Range<usize>, pods: &[Ipv4Addr]) {
    let kc = c.cp.admin_kubeconfig();
    let pods = pods.to_vec();
    in_netns(&c.cp.netns.name, move || async move {
        let k = client(&kc).await;
        let svcs = Api::<Service>::namespaced(k.clone(), NS);
        let slices = Api::<EndpointSlice>::namespaced(k, NS);
        futures::stream::iter(range)
            .map(|i| {
                let (svcs, slices, pods) = (svcs.clone(), slices.clone(), pods.clone());
                async move {
                    let name = format!("extra-{i}");
                    let s = Selectorless {
                        name: &name,
                        labels: serde_json::Value::Null,
                        port_name: "tcp",
                        target_port: TCP_PORT,
                        endpoints: &pods,
                        node: None,
                    };
                    selectorless(&svcs, &slices, s).await;
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<()>>()
            .await;
    });
}

/// Waits up to `limit` until the pod reaches the pods through Service
/// `extra-<last>`: the proxy has programmed the last one created
/// (kube-proxy syncs whole; the agent's reconcile is a batch of every change
/// since the last). The agent must get there; kube-proxy may not.
fn wait_served(c: &Cluster, pod: &PodClient, last: usize, proxy: Proxy, limit: Duration) -> bool {
    let ip: Ipv4Addr =
        c.cp.kubectl(&[
            "-n",
            NS,
            "get",
            "service",
            &format!("extra-{last}"),
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .trim()
        .parse()
        .unwrap();
    // One connect per poll with a short limit: an address not served yet
    // goes to a route that drops silently, and a long limit would be the
    // resolution of the sync time.
    let target = [SocketAddr::from((ip, 80))];
    let ok = lb_testkit::wait_until(limit, || {
        let s = connect_client::run_with_timeout(
            &pod.cgroup,
            &pod.netns,
            &target,
            1,
            1_000,
            Duration::from_millis(50),
        );
        s.failed == 0 && s.latencies_ns.len() == 1
    });
    assert!(
        ok || proxy != Proxy::Agent,
        "{} never served extra-{last} ({ip}):\n{}",
        label(proxy),
        c.logs()
    );
    ok
}

/// Waits until every node's proxy has not synced for 3 s: what was just
/// created is in, and no full sync of it (kube-proxy's comes up to a
/// `--iptables-min-sync-period` after the last change) overlaps the
/// measurement. Both export `kubeproxy_sync_proxy_rules_last_timestamp_seconds`
/// (the agent under kube-proxy's name), so the check is the same for both.
fn wait_quiet(c: &Cluster, proxy: Proxy) {
    let address = match proxy {
        Proxy::Agent => AGENT_METRICS,
        Proxy::KubeProxy(_) => lb_testkit::kube_proxy::METRICS,
    };
    let last_syncs = || -> Vec<Option<f64>> {
        c.nodes
            .iter()
            .map(|n| last_sync(&n.netns_name, address))
            .collect()
    };
    let mut seen = last_syncs();
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(600);
    while since.elapsed() < Duration::from_secs(3) {
        assert!(
            Instant::now() < deadline,
            "{}: the proxies never stopped syncing ({seen:?})",
            label(proxy)
        );
        std::thread::sleep(Duration::from_millis(250));
        let now = last_syncs();
        assert!(
            now.iter().all(Option::is_some),
            "{}: a node's proxy exports no last sync time at {address}: {now:?}",
            label(proxy)
        );
        if now != seen {
            (seen, since) = (now, Instant::now());
        }
    }
}

/// The agent's /metrics in its node's network namespace (the chart's
/// `metrics.address`).
const AGENT_METRICS: &str = "127.0.0.1:9967";

/// The latest `kubeproxy_sync_proxy_rules_last_timestamp_seconds` of any
/// family at `address` in network namespace `netns`.
fn last_sync(netns: &str, address: &str) -> Option<f64> {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-s", "-m", "2", &format!("http://{address}/metrics")]);
    lb_testkit::netns::exec_in(&mut cmd, netns).ok()?;
    let out = cmd.output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("kubeproxy_sync_proxy_rules_last_timestamp_seconds"))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .reduce(f64::max)
}

/// The client pod's network namespace and cgroup, for the bench's connect
/// client to run in as one of the pod's processes.
struct PodClient {
    netns: String,
    cgroup: PathBuf,
}

impl PodClient {
    /// Pod `name` of the bench namespace: its container's process, found by
    /// the pod's UID in its cgroup path (the kubelet's cgroupfs driver
    /// names the pod's cgroup `pod<uid>`).
    fn find(c: &Cluster, name: &str) -> Self {
        let uid = c.cp.kubectl(&[
            "-n",
            NS,
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        let uid = uid.trim();
        let node = &c.nodes[0];
        let found = node.pids_named("sleep").into_iter().find_map(|pid| {
            let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            let unified = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
            unified.contains(uid).then(|| {
                (
                    pid,
                    PathBuf::from("/sys/fs/cgroup/unified").join(unified.trim_start_matches('/')),
                )
            })
        });
        let (pid, cgroup) =
            found.unwrap_or_else(|| panic!("no process of pod {name} ({uid}) on {}", node.name));
        Self {
            netns: format!("/proc/{pid}/ns/net"),
            cgroup,
        }
    }

    fn connects(
        &self,
        targets: &[SocketAddr],
        count: usize,
        millis: u64,
    ) -> connect_client::Sample {
        connect_client::run(&self.cgroup, &self.netns, targets, count, millis)
    }
}
