//! `lbctl trace` against what the programs then do with the same tuple
//! (BPF_PROG_TEST_RUN on the real tc program): for 300 new flows to a
//! Maglev LoadBalancer, the backend trace names is the one the packet is
//! rewritten to, and afterwards trace names the conntrack entry; the
//! source-range, no-service-port and no-backend verdicts are what the
//! packets get; sessionAffinity's entry sends a new flow of the client to
//! the backend trace names. Trace itself changes nothing.
use std::net::{Ipv4Addr, SocketAddr};

use lb_testkit::{
    dataplane::*,
    packets::{self, inspect, SYN},
    sibling_bin, unique,
};
use serde_json::Value;

const EXTRA: &str = r#"
services:
  - name: guarded
    type: LoadBalancer
    clusterIPs: [10.96.0.40]
    loadBalancerIPs: [203.0.113.40]
    loadBalancerSourceRanges: [198.51.100.0/24]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: 10.244.2.41}]
  - name: sticky
    type: LoadBalancer
    sessionAffinity: ClientIP
    clusterIPs: [10.96.0.50]
    loadBalancerIPs: [203.0.113.50]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: 10.244.2.51}, {address: 10.244.2.52}, {address: 10.244.2.53}]
"#;

fn trace(dp: &Dataplane, src: SocketAddr, dst: SocketAddr) -> Value {
    let out = std::process::Command::new(sibling_bin("lbctl"))
        .args([
            "trace",
            "tcp",
            &src.to_string(),
            &dst.to_string(),
            "-o",
            "json",
            "--pin-dir",
        ])
        .arg(&dp.pins.path)
        .output()
        .expect("running lbctl trace");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("trace json")
}

fn syn(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        unreachable!()
    };
    packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        *s.ip(),
        *d.ip(),
        s.port(),
        d.port(),
        SYN,
        b"",
    )
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// Where the program sent the packet: its destination after the rewrite.
fn sent_to(dp: &Dataplane, packet: &[u8]) -> String {
    let (rc, out) = dp.tc_ingress(packet);
    assert_ne!(
        rc,
        TC_ACT_SHOT,
        "dropped: {}",
        dp.drops("fib-lookup-failed")
    );
    let v = inspect(&out);
    SocketAddr::from((v.daddr, v.dport)).to_string()
}

#[test]
fn trace_names_the_backend_the_packet_path_then_gives_each_of_300_maglev_flows_and_then_their_conntrack_entry(
) {
    let mut dp = Dataplane::with_services(&unique("trace_maglev"), SERVICES);
    let web = at("203.0.113.20", 80);
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..300u32 {
        let src = SocketAddr::from((Ipv4Addr::from(0xc633_6400 + i % 250 + 1), 20_000 + i as u16));
        let before = trace(&dp, src, web);
        assert_eq!(before["verdict"], "forward", "{before:#}");
        assert_eq!(before["because"], "maglev", "{before:#}");
        let slot = &before["maglev_slot"];
        assert!(slot[0].as_u64() < slot[1].as_u64(), "{before:#}");
        assert_eq!(before["forwarding"], "snat", "remote backends: {before:#}");
        let predicted = before["backend"]["address"].as_str().unwrap().to_string();
        // Tracing again finds no conntrack entry: trace wrote nothing.
        let again = trace(&dp, src, web);
        assert_eq!(again["because"], "maglev", "{again:#}");
        assert_eq!(again["backend"], before["backend"]);
        let actual = sent_to(&dp, &syn(src, web));
        assert_eq!(actual, predicted, "flow {i} from {src}: {before:#}");
        seen.insert(actual);
        let after = trace(&dp, src, web);
        assert_eq!(after["because"], "conntrack", "{after:#}");
        assert_eq!(after["backend"], before["backend"]);
    }
    assert_eq!(seen.len(), 3, "300 flows over the 3 backends: {seen:?}");
    let _ = &mut dp;
}

#[test]
fn trace_verdicts_for_source_ranges_unknown_ports_no_backend_and_affinity_are_what_the_packets_get()
{
    let mut dp = Dataplane::with_services(&unique("trace_verdicts"), SERVICES);
    dp.apply_with_extra(EXTRA);

    // loadBalancerSourceRanges: outside the range dropped, inside served.
    let guarded = at("203.0.113.40", 80);
    let outsider = at("192.0.2.7", 41_000);
    let t = trace(&dp, outsider, guarded);
    assert_eq!(
        (t["verdict"].as_str(), t["reason"].as_str()),
        (Some("drop"), Some("source-range")),
        "{t:#}"
    );
    let before = dp.drops("source-range");
    assert_eq!(dp.tc_ingress(&syn(outsider, guarded)).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("source-range"), before + 1);
    let insider = at("198.51.100.9", 41_001);
    let t = trace(&dp, insider, guarded);
    assert_eq!(t["verdict"], "forward", "{t:#}");
    assert_eq!(
        sent_to(&dp, &syn(insider, guarded)),
        t["backend"]["address"].as_str().unwrap()
    );

    // A LoadBalancer address on a port it does not expose is no frontend:
    // the stack's (only ClusterIPs have an address marker).
    let lb_other_port = at("203.0.113.20", 81);
    let t = trace(&dp, insider, lb_other_port);
    assert_eq!(t["verdict"], "pass", "{t:#}");
    let packet = syn(insider, lb_other_port);
    assert_eq!(
        dp.tc_ingress(&packet),
        (TC_ACT_OK, packet.clone()),
        "untouched"
    );
    // A ClusterIP (routed to the node) on a port it does not expose.
    let wrong_port = at("10.96.0.2", 81);
    let t = trace(&dp, insider, wrong_port);
    assert_eq!(t["reason"], "no-service-port", "{t:#}");
    let before = dp.drops("no-service-port");
    assert_eq!(dp.tc_ingress(&syn(insider, wrong_port)).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("no-service-port"), before + 1);

    // No backend at all: rejected with an ICMP error, not forwarded.
    let empty = SocketAddr::from((NODE_IP, 30003));
    let t = trace(&dp, insider, empty);
    assert_eq!(t["verdict"], "reject", "{t:#}");
    let (rc, out) = dp.tc_ingress(&syn(insider, empty));
    assert_ne!(rc, TC_ACT_OK, "not passed on");
    assert_eq!(out[14 + 9], 1, "an ICMP packet went back");

    // Not a frontend at all.
    let t = trace(&dp, insider, SocketAddr::from((NODE_IP, 22)));
    assert_eq!(t["verdict"], "pass", "{t:#}");

    // sessionAffinity: the first flow's choice is random among three; a
    // new flow of the same client goes where trace says its entry points.
    let sticky = at("203.0.113.50", 80);
    let client = at("198.51.100.77", 42_000);
    let t = trace(&dp, client, sticky);
    assert_eq!(t["because"], "random", "{t:#}");
    // Trace remembered nothing for the client.
    assert_eq!(trace(&dp, client, sticky)["because"], "random");
    assert_eq!(t["candidates"].as_array().unwrap().len(), 3, "{t:#}");
    let first = sent_to(&dp, &syn(client, sticky));
    let candidates: Vec<&str> = t["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["address"].as_str().unwrap())
        .collect();
    assert!(
        candidates.contains(&first.as_str()),
        "{first} not among {candidates:?}"
    );
    for port in 42_001..42_011 {
        let again = at("198.51.100.77", port);
        let t = trace(&dp, again, sticky);
        assert_eq!(t["because"], "affinity", "{t:#}");
        assert_eq!(t["backend"]["address"], first.as_str(), "{t:#}");
        assert_eq!(sent_to(&dp, &syn(again, sticky)), first);
    }
}

/// IPv6: the same prediction for 100 Maglev flows (the IPv6 flow hash,
/// keys and maps).
#[test]
fn trace_names_the_backend_the_ipv6_packet_path_gives_each_of_100_maglev_flows() {
    let dp = Dataplane::with_services(&unique("trace_maglev6"), SERVICES6);
    let web = at("2001:db8:113::20", 80);
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..100u16 {
        let src = SocketAddr::new(
            std::net::Ipv6Addr::new(0x2001, 0xdb8, 0x77, 0, 0, 0, 0, 1 + i % 50).into(),
            30_000 + i,
        );
        let t = trace(&dp, src, web);
        assert_eq!(t["because"], "maglev", "{t:#}");
        let (SocketAddr::V6(s), SocketAddr::V6(d)) = (src, web) else {
            unreachable!()
        };
        let packet = packets::tcp6(
            CLIENT_MAC,
            EXT0_MAC,
            *s.ip(),
            *d.ip(),
            s.port(),
            d.port(),
            SYN,
            b"",
        );
        let (rc, out) = dp.tc_ingress(&packet);
        assert_ne!(rc, TC_ACT_SHOT);
        let v = packets::inspect6(&out);
        let actual = SocketAddr::from((v.daddr, v.dport)).to_string();
        assert_eq!(
            actual,
            t["backend"]["address"].as_str().unwrap(),
            "flow {i}: {t:#}"
        );
        seen.insert(actual);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

/// What comes before the frontend: a backend's reply to a SNAT flow is
/// translated back to the client trace names; a SYN on a closing flow's
/// tuple chooses again; a flow whose frontend was removed is left to the
/// stack (the frontend filter's early exit), as trace says.
#[test]
fn trace_follows_snat_replies_closing_flows_and_removed_frontends_as_the_packets_do() {
    let mut dp = Dataplane::with_services(&unique("trace_before"), SERVICES);
    // A SNAT flow to the remote NodePort, and the backend's reply.
    // The client on the node's link (the test's namespace has no route
    // elsewhere for the reply).
    let client = SocketAddr::from((CLIENT_IP, 43_000));
    let nodeport = SocketAddr::from((NODE_IP, 30002));
    let (rc, out) = dp.tc_ingress(&syn(client, nodeport));
    assert_ne!(rc, TC_ACT_SHOT);
    let fwd = inspect(&out);
    let (snat_ip, snat_port) = (fwd.saddr, fwd.sport);
    let backend = SocketAddr::from((fwd.daddr, fwd.dport));
    let reply_to = SocketAddr::from((snat_ip, snat_port));
    let t = trace(&dp, backend, reply_to);
    assert_eq!(t["because"], "snat-reply", "{t:#}");
    let reply = packets::tcp(
        NODE_B_MAC,
        EXT0_MAC,
        fwd.daddr,
        snat_ip,
        fwd.dport,
        snat_port,
        packets::ACK | SYN,
        b"",
    );
    let (rc, back) = dp.tc_ingress(&reply);
    assert_ne!(rc, TC_ACT_SHOT);
    let back = inspect(&back);
    assert_eq!(
        SocketAddr::from((back.daddr, back.dport)),
        client,
        "the reply went to the client"
    );
    assert!(
        t["steps"].to_string().contains(&client.to_string()),
        "trace names the client {client}: {t:#}"
    );

    // A closing flow: its FIN seen, a SYN on the tuple chooses again.
    let web = at("203.0.113.20", 80);
    let src = at("198.51.100.21", 43_001);
    sent_to(&dp, &syn(src, web));
    assert_eq!(trace(&dp, src, web)["because"], "conntrack");
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, web) else {
        unreachable!()
    };
    let fin = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        *s.ip(),
        *d.ip(),
        s.port(),
        d.port(),
        packets::FIN | packets::ACK,
        b"",
    );
    dp.tc_ingress(&fin);
    let t = trace(&dp, src, web);
    assert_eq!(t["because"], "maglev", "a SYN reopens: {t:#}");
    assert_eq!(
        sent_to(&dp, &syn(src, web)),
        t["backend"]["address"].as_str().unwrap()
    );

    // The frontend goes; its flow's next packet is left to the stack.
    let kept = at("198.51.100.22", 43_002);
    sent_to(&dp, &syn(kept, web));
    let without_web: String = SERVICES
        .split("  - name: ")
        .filter(|s| !s.starts_with("web\n"))
        .collect::<Vec<_>>()
        .join("  - name: ");
    dp.apply(&lb::source::file::parse::parse_with(&without_web, &node_context()).unwrap());
    let t = trace(&dp, kept, web);
    assert_eq!(t["verdict"], "pass", "{t:#}");
    let packet = syn(kept, web);
    assert_eq!(
        dp.tc_ingress(&packet),
        (TC_ACT_OK, packet.clone()),
        "untouched"
    );
}
