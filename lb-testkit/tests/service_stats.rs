//! Per-frontend counters (LB_SVC_STATS) against what really crossed the
//! data path, on the real kernel: exact connect counts on the socket path
//! (TCP, unconnected and connected UDP), flows, packets and bytes of real
//! bulk traffic (GRO-merged on tc, frame by frame on XDP) on the packet
//! path, `lbctl top` during traffic, the opt-in lb_service_* metrics, and
//! `--service-stats off`.
use std::net::{IpAddr, SocketAddr};

use lb_testkit::{
    agent::Agent,
    cluster::{Cluster, Options, NODE_A, POD_B},
    servers, traffic, unique,
    world::World,
};
use serde_json::Value;

/// The `lbctl service list --stats` row of the frontend at `address:port`.
fn stats_of(agent: &Agent, address: &str, port: u16) -> Value {
    let rows = agent.lbctl_json(&["service", "list", "--stats"]);
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["frontend"]["address"] == address && r["frontend"]["port"] == port)
        .unwrap_or_else(|| panic!("no frontend {address}:{port} in {rows:#}"))
        .clone()
}

fn count(row: &Value, field: &str) -> u64 {
    row["stats"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no stats.{field} in {row:#}"))
}

const SOCKET_SERVICES: &str = "services:
  - name: web
    metrics: true
    clusterIPs: [10.96.0.10]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: 10.250.0.11}, {address: 10.250.0.12}, {address: 10.250.0.13}]
  - name: edge
    type: LoadBalancer
    metrics: true
    externalTrafficPolicy: Local
    clusterIPs: [10.96.0.70]
    loadBalancerIPs: [203.0.113.70]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: 10.250.0.99, local: true}]
  - name: dns
    clusterIPs: [10.96.0.53]
    ports: [{port: 53, protocol: UDP, targetPort: 5353}]
    backends: [{address: 10.250.0.11}, {address: 10.250.0.12}, {address: 10.250.0.13}]
";

#[test]
fn socket_path_counts_each_translated_connect_and_unconnected_send_per_frontend_exactly() {
    let w = World::new("stats_sock", 3);
    let _tcp = w.tcp_servers(8080, false);
    let _udp = w.udp_servers(5353, false);
    w.write_services(SOCKET_SERVICES);
    let agent = w.start_agent();

    let ok = |mode: &str, target: &str, n: usize| {
        let attempts = w.probe(mode, target, n);
        assert!(attempts.iter().all(|a| a.ok), "{mode}: {attempts:?}");
    };
    ok("tcp", "10.96.0.10:80", 2000);
    // Unconnected UDP: every sendto() is translated (and counted); a
    // connected socket once, at connect().
    ok("udp", "10.96.0.53:53", 300);
    ok("udp-connected", "10.96.0.53:53", 200);

    let web = stats_of(&agent, "10.96.0.10", 80);
    let dns = stats_of(&agent, "10.96.0.53", 53);
    assert_eq!(count(&web, "connects"), 2000, "{web:#}");
    assert_eq!(count(&dns, "connects"), 500, "{dns:#}");
    // No packet of theirs met the packet path (no device here).
    for row in [&web, &dns] {
        assert_eq!(
            count(row, "flows") + count(row, "packets") + count(row, "bytes"),
            0,
            "{row:#}"
        );
    }

    // lbctl top during traffic: two refreshes of 1.5 s while connects keep
    // coming; each names the busy frontend only, over an interval of about
    // 1.5 s, and the connects its rates account for are at most those made.
    let pins = w.pins.path.clone();
    let top = std::thread::spawn(move || {
        let out = std::process::Command::new(lb_testkit::sibling_bin("lbctl"))
            .args([
                "top",
                "-n",
                "2",
                "--interval",
                "1500ms",
                "-o",
                "json",
                "--pin-dir",
            ])
            .arg(&pins)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    });
    let mut made = 0u64;
    while !top.is_finished() {
        ok("tcp", "10.96.0.10:80", 50);
        made += 50;
    }
    let lines = top.join().unwrap();
    let mut seen = 0.0;
    for line in lines.lines() {
        let sample: Value = serde_json::from_str(line).expect("a JSON line per refresh");
        let secs = sample["interval_s"].as_f64().unwrap();
        assert!(
            (1.4..3.0).contains(&secs),
            "an interval of {secs} s: {sample:#}"
        );
        let frontends = sample["frontends"].as_array().unwrap();
        assert!(frontends.len() <= 1, "only web had traffic: {sample:#}");
        if let Some(f) = frontends.first() {
            assert_eq!(f["frontend"], "10.96.0.10:80/TCP");
            seen += f["connects_per_s"].as_f64().unwrap() * secs;
        }
    }
    assert_eq!(lines.lines().count(), 2, "{lines}");
    assert!(
        seen >= 1.0 && seen <= made as f64 + 0.5,
        "top's rates account for {seen} connects, of {made} made: {lines}"
    );
    let total = 2000 + made;
    assert_eq!(
        count(&stats_of(&agent, "10.96.0.10", 80), "connects"),
        total
    );

    // The metrics: web opted in (metrics: true), dns did not.
    let (status, body) = agent.http_get("/metrics");
    assert_eq!(status, 200);
    let labels =
        r#"{namespace="default",service="web",frontend="10.96.0.10:80/TCP",type="ClusterIP"}"#;
    for (name, value) in [
        ("connects", total),
        ("flows", 0),
        ("packets", 0),
        ("bytes", 0),
    ] {
        let series = format!("lb_service_{name}_total{labels} {value}");
        assert!(body.contains(&series), "no {series} in\n{body}");
    }
    assert!(
        !body.contains(r#"service="dns""#),
        "dns did not opt in:\n{body}"
    );
    // edge's LoadBalancer frontend has two views (externalTrafficPolicy:
    // Local): one series, not a label set twice (a scrape would refuse it).
    let edge = r#"lb_service_connects_total{namespace="default",service="edge",frontend="203.0.113.70:80/TCP",type="LoadBalancer"}"#;
    assert_eq!(body.matches(edge).count(), 1, "{body}");
}

#[test]
fn with_service_stats_off_frontends_have_no_counters_and_translation_still_works() {
    let w = World::new("stats_off", 3);
    let _tcp = w.tcp_servers(8080, false);
    w.write_services(SOCKET_SERVICES);
    let agent = Agent::start_with(
        &w.services,
        &w.cgroup.path,
        &w.pins.path,
        &["--service-stats", "off"],
    );
    let attempts = w.probe("tcp", "10.96.0.10:80", 50);
    assert!(attempts.iter().all(|a| a.ok), "{attempts:?}");
    // No entry at all: no memory, and lbctl says "not counted" ("-").
    let web = stats_of(&agent, "10.96.0.10", 80);
    assert!(web["stats"].is_null(), "{web:#}");
    let table = agent.lbctl(&["service", "list", "--stats"]);
    let line = table
        .lines()
        .find(|l| l.contains("10.96.0.10:80/TCP"))
        .unwrap();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[cells.len() - 4..], ["-"; 4], "{table}");
    // web opted into the metrics, but nothing is counted: no series.
    let (_, body) = agent.http_get("/metrics");
    assert!(!body.contains("lb_service_connects_total{"), "{body}");
}

fn packet_services() -> String {
    let pb = POD_B[0];
    format!(
        r#"
services:
  - name: names
    type: NodePort
    clusterIPs: ["10.96.0.2"]
    ports: [{{port: 80, targetPort: 8080, nodePort: 30081}}]
    backends: [{{address: "{pb}"}}]
  - name: bulk
    type: NodePort
    clusterIPs: ["10.96.0.3"]
    ports: [{{port: 80, targetPort: 9000, nodePort: 30090}}]
    backends: [{{address: "{pb}"}}]
"#
    )
}

/// Through node A (SNAT to node B's pod): 2 000 connections are 2 000
/// flows, and a 2 s bulk upload's packets and bytes are what was on the
/// wire: every byte the client sent, each segment's headers once.
fn packets_and_bytes_are_what_the_wire_carried(tag: &str, xdp: bool) {
    let opts = Options {
        gro: true,
        full_checksums: xdp,
        xdp_ready: xdp,
        ..Default::default()
    };
    let mut c = Cluster::with(&unique(tag), &opts);
    let pb = POD_B[0];
    let _servers = [
        servers::tcp(&c.pod_b.name, SocketAddr::from((pb, 8080)), "b0"),
        traffic::bulk_server(&c.pod_b.name, SocketAddr::from((pb, 9000))),
    ];
    let mut args = vec!["--lb-mode", "snat"];
    if xdp {
        args.extend(["--acceleration", "native"]);
    }
    let services = packet_services();
    Cluster::start(&mut c.a, &services, &args);
    Cluster::start(&mut c.b, &services, &args);
    let client = c.client.name.clone();
    let node = IpAddr::V4(NODE_A);
    let a = c.a.agent.as_ref().unwrap();
    let na = NODE_A.to_string();

    let churn = traffic::churn(&client, SocketAddr::from((node, 30081)), 2000);
    assert_eq!(churn.failed, 0, "{:?}", churn.errors);
    let names = stats_of(a, &na, 30081);
    assert_eq!(count(&names, "flows"), 2000, "xdp {xdp}: {names:#}");
    // Each connection: at least the SYN, the handshake's ACK and the FIN's,
    // and at most five of the client's own (SYN, ACK, the answer's ACK,
    // FIN, the last ACK): the backend's replies are not counted.
    let packets = count(&names, "packets");
    assert!((3 * 2000..=5 * 2000 + 100).contains(&packets), "{names:#}");
    assert_eq!(
        count(&names, "connects"),
        0,
        "the client is not on the node"
    );

    let up = traffic::upload(&client, SocketAddr::from((node, 30090)), 5, 2000).unwrap();
    let bulk = stats_of(a, &na, 30090);
    let (packets, bytes) = (count(&bulk, "packets"), count(&bulk, "bytes"));
    assert_eq!(count(&bulk, "flows"), 1, "{bulk:#}");
    // IPv4 20 + TCP 32 (timestamps) per segment: what is left is payload
    // (the SYN's 8 bytes of options more, and retransmissions).
    let payload = bytes.saturating_sub(packets * 52);
    eprintln!(
        "xdp {xdp}: upload of {} bytes counted as {packets} packets, {bytes} bytes ({payload} payload)",
        up.bytes
    );
    assert!(
        payload >= up.bytes && payload <= up.bytes + up.bytes / 50 + 65_536,
        "xdp {xdp}: {payload} payload bytes counted for an upload of {}: {bulk:#}",
        up.bytes
    );
    // Segments, not merged packets: at most one MSS (1448 at MTU 1500) each.
    let mss = 1448;
    assert!(
        packets >= up.bytes / mss && packets <= up.bytes / mss * 13 / 10 + 2000,
        "xdp {xdp}: {packets} packets for {} bytes: {bulk:#}",
        up.bytes
    );
}

#[test]
fn tc_counts_flows_and_each_gro_segment_with_its_bytes_under_bulk_traffic() {
    packets_and_bytes_are_what_the_wire_carried("stats_tc", false);
}

#[test]
fn xdp_counts_flows_packets_and_bytes_under_bulk_traffic() {
    packets_and_bytes_are_what_the_wire_carried("stats_xdp", true);
}
