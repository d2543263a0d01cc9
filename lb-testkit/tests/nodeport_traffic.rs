//! The north-south path under real traffic, in the two-node namespace
//! cluster with GRO on the node devices (as a real NIC has it): bulk TCP
//! both ways with every byte checked, a 32 MiB download, 20 000 sequential
//! short connections to one remote backend (four times the SNAT port range),
//! DNS over UDP, for SNAT, DSR and hybrid, on tc and with XDP.
use std::{
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use lb_testkit::{
    cluster::{Cluster, Node, Options, NODE_A, POD_A, POD_B},
    servers, traffic, unique,
};

/// The same services on every node; `node` decides which backends are local.
pub fn services(node: char) -> String {
    let b = |ip: Ipv4Addr| {
        let local = (node == 'a' && ip == POD_A) || (node == 'b' && POD_B.contains(&ip));
        format!("{{address: {ip}, local: {local}}}")
    };
    format!(
        r#"
services:
  - name: names
    type: NodePort
    clusterIPs: [10.96.0.2]
    ports: [{{port: 80, targetPort: 8080, nodePort: 30081}}]
    backends: [{pb0}]
  - name: bulk
    type: NodePort
    clusterIPs: [10.96.0.3]
    ports: [{{port: 80, targetPort: 9000, nodePort: 30090}}]
    backends: [{pb0}]
  - name: bulk-local
    type: NodePort
    clusterIPs: [10.96.0.4]
    ports: [{{port: 80, targetPort: 9000, nodePort: 30091}}]
    backends: [{pa}]
  - name: dns
    type: LoadBalancer
    algorithm: maglev
    clusterIPs: [10.96.0.53]
    loadBalancerIPs: [203.0.113.40]
    ports: [{{port: 53, protocol: UDP, targetPort: 5353}}]
    backends: [{pb0}, {pb1}, {pb2}]
"#,
        pb0 = b(POD_B[0]),
        pb1 = b(POD_B[1]),
        pb2 = b(POD_B[2]),
        pa = b(POD_A),
    )
}

pub struct Backends {
    _servers: Vec<servers::Server>,
}

pub fn backends(c: &Cluster) -> Backends {
    let mut s = vec![
        servers::tcp(&c.pod_b.name, SocketAddr::from((POD_B[0], 8080)), "b0"),
        traffic::bulk_server(&c.pod_b.name, SocketAddr::from((POD_B[0], 9000))),
        traffic::bulk_server(&c.pod_a.name, SocketAddr::from((POD_A, 9000))),
    ];
    for (i, ip) in POD_B.iter().enumerate() {
        s.push(servers::udp(
            &c.pod_b.name,
            SocketAddr::from((*ip, 5353)),
            &format!("b{i}"),
        ));
    }
    Backends { _servers: s }
}

fn drops(node: &Node) -> String {
    node.agent.as_ref().unwrap().lbctl(&["drops"])
}

fn real_traffic(tag: &str, mode: &str, xdp: bool) {
    let opts = Options {
        gro: true,
        full_checksums: xdp,
        xdp_ready: xdp,
        ..Default::default()
    };
    let mut c = Cluster::with(&unique(tag), &opts);
    let _b = backends(&c);
    let mut args = vec!["--lb-mode", mode];
    if xdp {
        args.extend(["--acceleration", "native"]);
    }
    Cluster::start(&mut c.a, &services('a'), &args);
    Cluster::start(&mut c.b, &services('b'), &args);
    let client = c.client.name.clone();
    let report = |what: &str, c: &Cluster| {
        format!(
            "{what} ({mode}, xdp {xdp})\nnode A drops:\n{}\nnode B drops:\n{}",
            drops(&c.a),
            drops(&c.b)
        )
    };

    // Bulk both ways for 2 s, every byte checked, remote and local backend.
    for port in [30090, 30091] {
        let target = SocketAddr::from((NODE_A, port));
        let (up, down) = traffic::both_ways(&client, target, 2000);
        let up = up.unwrap_or_else(|e| panic!("{}: {e}", report("upload", &c)));
        let down = down.unwrap_or_else(|e| panic!("{}: {e}", report("download", &c)));
        eprintln!(
            "{mode} xdp={xdp} :{port}: up {:.0} Mbit/s, down {:.0} Mbit/s",
            up.mbit_per_s(),
            down.mbit_per_s()
        );
    }
    // 32 MiB, byte for byte.
    let big = traffic::download(
        &client,
        SocketAddr::from((NODE_A, 30090)),
        7,
        Some(32 << 20),
        None,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", report("32 MiB download", &c)));
    assert_eq!(big.bytes, 32 << 20);

    // 20 000 sequential short connections to the one remote backend.
    let churn = traffic::churn(&client, SocketAddr::from((NODE_A, 30081)), 20_000);
    eprintln!(
        "{mode} xdp={xdp}: {} connections in {:.1?}",
        churn.ok, churn.elapsed
    );
    assert_eq!(
        churn.failed,
        0,
        "{:?}\n{}",
        churn.errors,
        report("churn", &c)
    );
    assert_eq!(churn.backends.get("b0"), Some(&20_000));

    // DNS over UDP through the LoadBalancer address.
    let answers = traffic::udp_from_one_socket(
        &client,
        "203.0.113.40:53".parse().unwrap(),
        20,
    );
    assert!(
        answers.iter().all(Option::is_some),
        "{answers:?}\n{}",
        report("dns", &c)
    );
    let _ = Duration::ZERO;
}

#[test]
fn snat_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("np_real_snat", "snat", false);
}

#[test]
fn dsr_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("np_real_dsr", "dsr", false);
}

#[test]
fn hybrid_carries_bulk_tcp_a_32_mib_download_and_20000_connections_with_gro() {
    real_traffic("np_real_hybrid", "hybrid", false);
}

#[test]
#[ignore]
fn debug_churn() {
    let opts = Options {
        gro: true,
        ..Default::default()
    };
    let mut c = Cluster::with(&unique("dbgchurn"), &opts);
    let _b = backends(&c);
    Cluster::start(&mut c.a, &services('a'), &[]);
    Cluster::start(&mut c.b, &services('b'), &[]);
    let client = c.client.name.clone();
    let t = std::time::Instant::now();
    let churn = traffic::churn(&client, SocketAddr::from((NODE_A, 30081)), 8000);
    eprintln!("{} ok {} failed in {:?}", churn.ok, churn.failed, t.elapsed());
    for ns in [&c.pod_b.name, &c.client.name] {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns, "nstat", "-az"])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        for l in s.lines() {
            let v: Vec<&str> = l.split_whitespace().collect();
            if v.len() >= 2 && v[1] != "0" && (l.contains("Tcp") || l.contains("TW") || l.contains("PAWS") || l.contains("Syn") || l.contains("Reset") || l.contains("Retrans")) {
                eprintln!("{ns}: {l}");
            }
        }
    }
    eprintln!("{}", c.a.agent.as_ref().unwrap().lbctl(&["drops"]));
    eprintln!("{}", c.a.agent.as_ref().unwrap().lbctl(&["status"]));
}
