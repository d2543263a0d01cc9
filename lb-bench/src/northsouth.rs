//! North-south traffic through a NodePort, side by side with plain routing
//! to the same backend, in one cluster of network namespaces (lb-testkit's
//! `Cluster`): bulk TCP each way and short connections per second, for SNAT
//! and DSR, on tc and with XDP. Ratios to routing are what to read.
//!
//! Every variant runs in the same namespaces: senders put full checksums in
//! their packets and the bridge ports run an XDP_PASS program (what veth
//! needs for XDP to forward, see lb-testkit `xdp_pass`), GRO is on for the
//! node devices. The variants take turns, round after round.
use std::net::SocketAddr;

use lb_testkit::{
    cluster::{Cluster, Options, NODE_A, POD_A, POD_B},
    servers, traffic,
};

use crate::profile::Profile;

#[derive(Clone, Debug)]
pub struct NsResult {
    pub variant: &'static str,
    pub up_mbit: f64,
    pub down_mbit: f64,
    pub conns_per_s: f64,
}

const VARIANTS: [(&str, &[&str]); 5] = [
    ("routing (no load balancer)", &[]),
    ("NodePort, SNAT, tc", &["--lb-mode", "snat"]),
    ("NodePort, DSR, tc", &["--lb-mode", "dsr"]),
    (
        "NodePort, SNAT, XDP",
        &["--lb-mode", "snat", "--acceleration", "native"],
    ),
    (
        "NodePort, DSR, XDP",
        &["--lb-mode", "dsr", "--acceleration", "native"],
    ),
];

fn services(node: char) -> String {
    let local = |ip: std::net::Ipv4Addr| {
        (node == 'b' && POD_B.contains(&ip)) || (node == 'a' && ip == POD_A)
    };
    format!(
        "services:\n  - name: bulk\n    type: NodePort\n    clusterIPs: [10.96.0.3]\n    ports: [{{port: 80, targetPort: 9000, nodePort: 30090}}]\n    backends: [{{address: {b}, local: {l}}}]\n  - name: names\n    type: NodePort\n    clusterIPs: [10.96.0.2]\n    ports: [{{port: 80, targetPort: 8080, nodePort: 30081}}]\n    backends: [{{address: {b}, local: {l}}}]\n",
        b = POD_B[0],
        l = local(POD_B[0])
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub fn run(p: &Profile) -> Vec<NsResult> {
    let opts = Options {
        gro: true,
        full_checksums: true,
        xdp_ready: true,
        ..Default::default()
    };
    let mut c = Cluster::with(&lb_testkit::unique("bench_ns"), &opts);
    let _bulk = traffic::bulk_server(&c.pod_b.name, SocketAddr::from((POD_B[0], 9000)));
    let _names = servers::tcp(&c.pod_b.name, SocketAddr::from((POD_B[0], 8080)), "b0");
    // Routing's connections go to a port of their own: DSR keeps the
    // client's tuple, and a backend still holding TIME_WAIT for it from the
    // routing round would see timestamps of another clock (Linux draws them
    // per destination) and refuse the reuse (PAWS), which would charge DSR
    // for the bench's own ordering.
    let _names_routed = servers::tcp(&c.pod_b.name, SocketAddr::from((POD_B[0], 8081)), "b0");
    // Routing: the client sends to the pod itself, through node A.
    c.client
        .ip(&["route", "add", "10.244.2.0/24", "via", &NODE_A.to_string()]);
    let (rounds, ms) = (p.ns_rounds, p.ns_ms);
    let mut samples: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> =
        vec![(Vec::new(), Vec::new(), Vec::new()); VARIANTS.len()];
    for _ in 0..rounds {
        for (i, (_, args)) in VARIANTS.iter().enumerate() {
            let (bulk, names) = if args.is_empty() {
                for node in [&mut c.a, &mut c.b] {
                    if let Some(mut a) = node.agent.take() {
                        a.kill();
                    }
                    let _ = lb::datapath::uninstall(&node.pins.path);
                }
                (
                    SocketAddr::from((POD_B[0], 9000)),
                    SocketAddr::from((POD_B[0], 8081)),
                )
            } else {
                Cluster::start(&mut c.a, &services('a'), args);
                Cluster::start(&mut c.b, &services('b'), args);
                (
                    SocketAddr::from((NODE_A, 30090)),
                    SocketAddr::from((NODE_A, 30081)),
                )
            };
            let up = traffic::upload(&c.client.name, bulk, 5, ms).map(|t| t.mbit_per_s());
            let down =
                traffic::download(&c.client.name, bulk, 6, None, Some(ms)).map(|t| t.mbit_per_s());
            let churn = traffic::churn_for(&c.client.name, names, ms);
            let s = &mut samples[i];
            s.0.push(up.unwrap_or(0.0));
            s.1.push(down.unwrap_or(0.0));
            s.2.push(churn.ok as f64 / churn.elapsed.as_secs_f64().max(1e-9));
        }
    }
    for node in [&mut c.a, &mut c.b] {
        if let Some(mut a) = node.agent.take() {
            a.kill();
        }
    }
    VARIANTS
        .iter()
        .zip(samples)
        .map(|((name, _), (up, down, conns))| NsResult {
            variant: name,
            up_mbit: median(up),
            down_mbit: median(down),
            conns_per_s: median(conns),
        })
        .collect()
}
