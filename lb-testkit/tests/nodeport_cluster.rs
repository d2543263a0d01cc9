//! The north-south path with real traffic between network namespaces: an
//! outside client, node A with the tc programs on its device, node B with
//! the backends (and a local backend on A). SNAT round trip, DSR with the
//! client's address kept and the reply going straight from B, conntrack
//! keeping an established flow on its backend when a new Maglev table no
//! longer names it, and two nodes choosing the same backend for the same
//! flow (Maglev's cross-node consistency).
use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use lb_common::config::{CNT_DSR_LEARNED, CNT_NP_FORWARD, CNT_NP_REVERSE};
use lb_testkit::{
    cluster::{Cluster, CLIENT, NODE_A, NODE_B, POD_A, POD_B},
    servers, unique,
};

/// The same services on every node; `node` decides which backends are local.
fn services(node: char) -> String {
    let b = |ip: Ipv4Addr| {
        let local = (node == 'a' && ip == POD_A) || (node == 'b' && POD_B.contains(&ip));
        format!("{{address: {ip}, local: {local}}}")
    };
    format!(
        r#"
services:
  - name: remote
    type: NodePort
    clusterIPs: [10.96.0.2]
    ports: [{{port: 80, targetPort: 8080, nodePort: 30081}}]
    backends: [{pb0}]
  - name: local
    type: NodePort
    clusterIPs: [10.96.0.1]
    ports: [{{port: 80, targetPort: 8080, nodePort: 30083}}]
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

fn tcp_servers(c: &Cluster) -> Vec<servers::Server> {
    let mut s = vec![servers::tcp(
        &c.pod_a.name,
        SocketAddr::from((POD_A, 8080)),
        "a0",
    )];
    for (i, ip) in POD_B.iter().enumerate() {
        s.push(servers::tcp(
            &c.pod_b.name,
            SocketAddr::from((*ip, 8080)),
            &format!("b{i}"),
        ));
    }
    s
}

#[test]
fn snat_round_trip_through_node_a_to_a_backend_on_node_b_and_a_local_backend_on_a() {
    let mut c = Cluster::new(&unique("np_snat_cluster"));
    let _servers = tcp_servers(&c);
    Cluster::start(&mut c.a, &services('a'), &[]);
    Cluster::start(&mut c.b, &services('b'), &[]);

    for a in c.probe("tcp", &format!("{NODE_A}:30081"), 5) {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.backend(), Some("b0"));
        assert!(
            a.seen_client().unwrap().starts_with(&format!("{NODE_A}:")),
            "SNAT: the backend sees node A: {a:?}"
        );
        // The replies came from the NodePort: the client's socket has no
        // program (getpeername would show what it dialed whatever happened),
        // but its kernel answers a SYN-ACK from any other address with a
        // reset, so the connection (a.ok) is the proof.
    }
    for a in c.probe("tcp", &format!("{NODE_A}:30083"), 5) {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.backend(), Some("a0"));
        assert!(
            a.seen_client().unwrap().starts_with(&format!("{CLIENT}:")),
            "local backend sees the client: {a:?}"
        );
    }
    assert!(
        Cluster::counter(&c.a, CNT_NP_REVERSE) > 0,
        "replies came back through node A"
    );

    // lbctl shows the tracked flows: SNAT to b0 through node A's address.
    let ct = c.a.agent.as_ref().unwrap().lbctl_json(&["ct", "list"]);
    let rows = ct.as_array().unwrap();
    let snat: Vec<_> = rows
        .iter()
        .filter(|r| r["kind"] == "service" && r["target"] == format!("{}:8080", POD_B[0]))
        .collect();
    assert_eq!(snat.len(), 5, "one entry per connection: {ct:#}");
    for r in &snat {
        assert!(
            r["flags"].as_array().unwrap().contains(&"snat".into()),
            "{r}"
        );
        assert!(
            r["nat"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{NODE_A}:")),
            "{r}"
        );
    }
    assert!(
        rows.iter().filter(|r| r["kind"] == "reverse").count() >= 5,
        "{ct:#}"
    );
}

#[test]
fn dsr_backend_sees_the_client_and_its_reply_skips_node_a() {
    let mut c = Cluster::new(&unique("np_dsr_cluster"));
    let _servers = tcp_servers(&c);
    Cluster::start(&mut c.a, &services('a'), &["--lb-mode", "dsr"]);
    Cluster::start(&mut c.b, &services('b'), &["--lb-mode", "dsr"]);

    for a in c.probe("tcp", &format!("{NODE_A}:30081"), 5) {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.backend(), Some("b0"));
        assert!(
            a.seen_client().unwrap().starts_with(&format!("{CLIENT}:")),
            "DSR keeps the client's address: {a:?}"
        );
        // The reply came straight from node B, from the service address:
        // a SYN-ACK from anywhere else would have been reset by the client's
        // kernel, and node A saw no reply at all (below).
    }
    assert!(Cluster::counter(&c.a, CNT_NP_FORWARD) >= 5);
    assert!(
        Cluster::counter(&c.b, CNT_DSR_LEARNED) >= 5,
        "node B learned the service from the option"
    );
    assert!(
        Cluster::counter(&c.b, CNT_NP_REVERSE) >= 5,
        "node B rewrote the replies"
    );
    assert_eq!(
        Cluster::counter(&c.a, CNT_NP_REVERSE),
        0,
        "no reply passed through node A"
    );
    // The same counters reach Prometheus.
    assert!(metric(&c.b, "lb_dsr_requests_learned_total") >= 5.0);
    assert!(metric(&c.a, "lb_nodeport_packets_total{direction=\"forward\"}") >= 5.0);
    assert_eq!(
        metric(&c.a, "lb_nodeport_packets_total{direction=\"reverse\"}"),
        0.0
    );
    // Node A routed the requests to node B: at least the first packet of
    // a flow took a FIB lookup (later ones mostly the route cache).
    assert!(metric(&c.a, "lb_fib_lookups_total") >= 1.0);
}

/// One sample from a node agent's /metrics, by its exact name and labels.
fn metric(node: &lb_testkit::cluster::Node, series: &str) -> f64 {
    let (code, body) = node.agent.as_ref().unwrap().http_get("/metrics");
    assert_eq!(code, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {series} in\n{body}"))
        .parse()
        .unwrap()
}

#[test]
fn an_established_flow_stays_on_its_backend_when_a_new_maglev_table_no_longer_has_it() {
    let mut c = Cluster::new(&unique("np_flow_survives"));
    let _echo: Vec<_> = POD_B
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            servers::tcp_echo(
                &c.pod_b.name,
                SocketAddr::from((*ip, 8080)),
                &format!("b{i}"),
            )
        })
        .collect();
    let yaml = |backend: Ipv4Addr| {
        format!(
            "services:\n  - name: web\n    type: LoadBalancer\n    algorithm: maglev\n    clusterIPs: [10.96.0.80]\n    loadBalancerIPs: [203.0.113.30]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{{address: {backend}}}]\n  - name: keep\n    clusterIPs: [10.96.0.81]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{{address: {}}}]\n",
            POD_B[0]
        )
    };
    Cluster::start(&mut c.a, &yaml(POD_B[0]), &[]);

    // A long-lived connection from the client.
    let client_ns = c.client.name.clone();
    let (to_client, commands) = std::sync::mpsc::channel::<String>();
    let (answers, from_client) = std::sync::mpsc::channel::<String>();
    let t = std::thread::spawn(move || {
        lb_testkit::netns::enter(&client_ns).unwrap();
        let s =
            TcpStream::connect_timeout(&"203.0.113.30:80".parse().unwrap(), Duration::from_secs(3))
                .expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        for cmd in commands {
            w.write_all(format!("{cmd}\n").as_bytes()).unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            answers.send(line.trim().to_string()).unwrap();
        }
    });
    to_client.send("one".into()).unwrap();
    assert_eq!(
        from_client.recv_timeout(Duration::from_secs(5)).unwrap(),
        "b0 one"
    );

    // The service now has another backend (a new Maglev table); b0 stays a
    // backend of another service, so only the table changed for this flow.
    let agent = c.a.agent.as_mut().unwrap();
    std::fs::write(&c.a.services, yaml(POD_B[1])).unwrap();
    assert!(
        agent.wait_for_log("reconciled", 2, Duration::from_secs(10)),
        "{}",
        agent.log_text()
    );
    for _ in 0..3 {
        assert_eq!(
            ask_once(&c.client.name, "203.0.113.30:80", "new"),
            "b1 new",
            "new flows use the new table"
        );
    }
    to_client.send("two".into()).unwrap();
    assert_eq!(
        from_client.recv_timeout(Duration::from_secs(5)).unwrap(),
        "b0 two",
        "the old flow stays on its backend"
    );
    drop(to_client);
    t.join().unwrap();
}

#[test]
fn two_nodes_with_the_same_config_pick_the_same_backend_for_the_same_flow() {
    let mut c = Cluster::new(&unique("np_same_choice"));
    let _udp: Vec<_> = POD_B
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            servers::udp(
                &c.pod_b.name,
                SocketAddr::from((*ip, 5353)),
                &format!("b{i}"),
            )
        })
        .collect();
    Cluster::start(&mut c.a, &services('a'), &[]);
    Cluster::start(&mut c.b, &services('b'), &[]);

    // 24 flows (fixed source ports) to the LoadBalancer address, through one node.
    let ask = |c: &Cluster| -> Vec<String> {
        let ns = c.client.name.clone();
        std::thread::spawn(move || {
            lb_testkit::netns::enter(&ns).unwrap();
            (45000..45024)
                .map(|port| {
                    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                    s.send_to(b"q", "203.0.113.40:53").unwrap();
                    let mut buf = [0u8; 128];
                    let (n, _) = s.recv_from(&mut buf).expect("reply");
                    String::from_utf8_lossy(&buf[..n])
                        .split_whitespace()
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect()
        })
        .join()
        .unwrap()
    };
    let via_a = ask(&c);
    assert!(
        via_a.iter().collect::<BTreeSet<_>>().len() >= 2,
        "flows spread over the backends: {via_a:?}"
    );
    // Both agents built the same table, slot for slot (lbctl reads it back).
    let table = |n: &lb_testkit::cluster::Node| {
        n.agent
            .as_ref()
            .unwrap()
            .lbctl_json(&["maglev", "get", "203.0.113.40:53/UDP"])
    };
    let (ta, tb) = (table(&c.a), table(&c.b));
    assert_eq!(ta["size"], 16381, "{ta}");
    assert_eq!(
        ta["backends"], tb["backends"],
        "same slots per backend on both nodes"
    );
    c.client.ip(&[
        "route",
        "replace",
        "203.0.113.0/24",
        "via",
        &NODE_B.to_string(),
    ]);
    // Node B serves them locally; the choice must not depend on the node.
    let via_b = ask(&c);
    assert_eq!(
        via_a, via_b,
        "the same flow, the same backend, whichever node it reaches"
    );
}

/// One line over a new TCP connection from the client namespace; the answer.
fn ask_once(client_ns: &str, target: &str, line: &str) -> String {
    let (ns, target, line) = (client_ns.to_string(), target.to_string(), line.to_string());
    std::thread::spawn(move || {
        lb_testkit::netns::enter(&ns).unwrap();
        let s = TcpStream::connect_timeout(&target.parse().unwrap(), Duration::from_secs(3))
            .expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        (&s).write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).unwrap();
        answer.trim().to_string()
    })
    .join()
    .unwrap()
}
