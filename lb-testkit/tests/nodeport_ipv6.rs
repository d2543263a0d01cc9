//! IPv6 north-south on crafted packets (BPF_PROG_TEST_RUN): the same
//! programs as IPv4 (one body over the address family), with IPv6 frontends
//! from the services file. Checksums are verified independently
//! (etherparse computes them from scratch, pseudo-header included).
use std::net::{IpAddr, Ipv6Addr};

use lb::maps::convert::ip6_to_words;
use lb_common::{
    config::{CFG_LB_MODE, CNT_CT_CREATED},
    conntrack::{Ct6Key, CT_F_SNAT, CT_REVERSE, CT_SERVICE},
    nodeport::{flow_hash6, MODE_DSR, MODE_HYBRID},
};
use lb_testkit::{
    dataplane::*,
    packets::{self, inspect6, ACK, SYN},
    unique,
};

const SERVICES6: &str = r#"
services:
  - name: local6
    type: NodePort
    clusterIPs: ["fd00:96::1"]
    ports: [{port: 80, targetPort: 8080, nodePort: 31001}]
    backends: [{address: "fd00:244:1::10", local: true}]
  - name: remote6
    type: NodePort
    clusterIPs: ["fd00:96::2"]
    ports: [{port: 80, targetPort: 8080, nodePort: 31002}]
    backends: [{address: "fd00:244:2::10"}]
  - name: dns6
    type: LoadBalancer
    clusterIPs: ["fd00:96::3"]
    loadBalancerIPs: ["2001:db8:113::10"]
    ports: [{port: 53, protocol: UDP, targetPort: 5353}]
    backends: [{address: "fd00:244:2::20"}]
  - name: web6
    type: LoadBalancer
    algorithm: maglev
    clusterIPs: ["fd00:96::5"]
    loadBalancerIPs: ["2001:db8:113::20"]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: "fd00:244:2::31"}, {address: "fd00:244:2::32"}, {address: "fd00:244:2::33"}]
  - name: ranged6
    type: LoadBalancer
    clusterIPs: ["fd00:96::6"]
    loadBalancerIPs: ["2001:db8:113::30"]
    loadBalancerSourceRanges: ["fd00:50::/64"]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: "fd00:244:2::40"}]
  - name: empty6
    type: NodePort
    clusterIPs: ["fd00:96::7"]
    ports: [{port: 80, nodePort: 31007}]
  - name: narrow6
    type: NodePort
    clusterIPs: ["fd00:96::8"]
    ports: [{port: 80, targetPort: 8080, nodePort: 31008}]
    backends: [{address: "fd00:244:3::10"}]
  - name: v4only
    type: NodePort
    clusterIPs: [10.96.0.9]
    ports: [{port: 80, targetPort: 8080, nodePort: 31009}]
    backends: [{address: 10.244.2.10}]
"#;

fn dataplane(test: &str) -> Dataplane {
    Dataplane::with_services(&unique(test), SERVICES6)
}

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn syn6(daddr: Ipv6Addr, dport: u16, sport: u16, payload: &[u8]) -> Vec<u8> {
    packets::tcp6(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP6, daddr, sport, dport, SYN, payload,
    )
}

#[test]
fn ipv6_nodeport_to_a_local_backend_is_dnatted_with_valid_checksums_and_the_reply_reverse_natted() {
    let dp = dataplane("np6_local");
    let (rc, out) = dp.tc_ingress(&syn6(NODE_IP6, 31001, 40000, b"hello"));
    assert_eq!(rc, TC_ACT_OK, "delivered by the stack");
    let v = inspect6(&out);
    assert_eq!((v.saddr, v.sport), (CLIENT_IP6, 40000), "client kept");
    assert_eq!((v.daddr, v.dport), (ip6("fd00:244:1::10"), 8080));
    assert_eq!(v.payload, b"hello");
    assert_eq!(v.hop_limit, 64, "delivered here, not routed: no decrement");

    let reply = packets::tcp6(
        [0; 6],
        CLIENT_MAC,
        ip6("fd00:244:1::10"),
        CLIENT_IP6,
        8080,
        40000,
        SYN | ACK,
        b"",
    );
    let (rc, out) = dp.tc_egress(&reply);
    assert_eq!(rc, TC_ACT_OK);
    let v = inspect6(&out);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport),
        (NODE_IP6, 31001, CLIENT_IP6, 40000),
        "the reply leaves from the NodePort"
    );
}

#[test]
fn ipv6_nodeport_to_a_remote_backend_is_snatted_to_the_nodes_ipv6_address_and_the_reply_comes_back()
{
    let dp = dataplane("np6_snat");
    let created = dp.counter(CNT_CT_CREATED);
    let (rc, out) = dp.tc_ingress(&syn6(NODE_IP6, 31002, 40001, b"hello"));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect6(&out);
    assert_eq!((v.daddr, v.dport), (ip6("fd00:244:2::10"), 8080));
    assert_eq!(v.saddr, NODE_IP6, "SNAT to ext0's IPv6 address");
    assert!((61000..=65535).contains(&v.sport), "{}", v.sport);
    assert_eq!(
        (v.eth_dst, v.eth_src),
        (NODE_B_MAC, EXT0_MAC),
        "FIB next hop"
    );
    assert_eq!(v.hop_limit, 63, "routed: hop limit decremented");
    assert_eq!(v.payload, b"hello");
    let port = v.sport;
    assert_eq!(dp.counter(CNT_CT_CREATED), created + 1);

    // Both conntrack entries are in LB6_CT, in network byte order.
    let fwd = Ct6Key::new(
        ip6_to_words(CLIENT_IP6),
        ip6_to_words(NODE_IP6),
        40001u16.to_be(),
        31002u16.to_be(),
        6,
        CT_SERVICE,
    );
    let e = dp.ct6(&fwd).expect("forward entry");
    assert_eq!(e.addr, ip6_to_words(ip6("fd00:244:2::10")));
    assert_eq!(
        (e.nat_addr, u16::from_be(e.nat_port)),
        (ip6_to_words(NODE_IP6), port)
    );
    assert_ne!(e.flags & CT_F_SNAT, 0);
    let rev = Ct6Key::new(
        ip6_to_words(ip6("fd00:244:2::10")),
        ip6_to_words(NODE_IP6),
        8080u16.to_be(),
        port.to_be(),
        6,
        CT_REVERSE,
    );
    let r = dp.ct6(&rev).expect("reverse entry under the SNAT port");
    assert_eq!(r.nat_addr, ip6_to_words(CLIENT_IP6));

    // The backend's reply to our port goes back to the client from the NodePort.
    let reply = packets::tcp6(
        NODE_B_MAC,
        EXT0_MAC,
        ip6("fd00:244:2::10"),
        NODE_IP6,
        8080,
        port,
        SYN | ACK,
        b"",
    );
    let (rc, out) = dp.tc_ingress(&reply);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect6(&out);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport),
        (NODE_IP6, 31002, CLIENT_IP6, 40001)
    );
    assert_eq!(v.eth_dst, CLIENT_MAC);

    // Later packets keep the port; a second client flow gets another one.
    let (_, out) = dp.tc_ingress(&packets::tcp6(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP6, NODE_IP6, 40001, 31002, ACK, b"more",
    ));
    assert_eq!(inspect6(&out).sport, port);
    let (_, out) = dp.tc_ingress(&syn6(NODE_IP6, 31002, 40002, b""));
    assert_ne!(inspect6(&out).sport, port);
}

/// A NIC that hands frames over as CHECKSUM_COMPLETE: the DNAT to a local
/// backend must leave skb->csum matching the packet, or the stack logs "hw
/// csum failure" and sums every such packet again. IPv6 needs its own care
/// here (no header checksum to cancel the helper's skb->csum update); IPv4
/// is checked too, as the reference.
#[test]
fn ipv6_and_ipv4_rewrites_keep_skb_csum_right_on_checksum_complete_packets() {
    let dp = dataplane("np6_complete");
    let run = |what: &str, pkt: &[u8]| {
        dp.tc_ingress_checksum_complete(pkt).unwrap_or_else(|e| {
            panic!(
                "{what}: BPF_PROG_TEST_RUN with BPF_F_TEST_SKB_CHECKSUM_COMPLETE: {e} \
                 (EBADMSG: skb->csum no longer matches the packet; EINVAL: the \
                 kernel predates the flag, Linux 6.17)"
            )
        })
    };
    // IPv6: TCP and UDP to a local backend (the stack gets the packet).
    let (rc, out) = run("IPv6 local", &syn6(NODE_IP6, 31001, 40100, b"payload"));
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(inspect6(&out).daddr, ip6("fd00:244:1::10"));
    // And the remote path's rewrite (SNAT + DNAT), redirected.
    let (rc, out) = run("IPv6 remote", &syn6(NODE_IP6, 31002, 40101, b"payload"));
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(inspect6(&out).saddr, NODE_IP6);
    // IPv4, the reference: the same node's IPv4 NodePort of a dual-stack view.
    let v4 = packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40102, 31009, SYN, b"payload",
    );
    let (rc, _) = run("IPv4 remote", &v4);
    assert_eq!(rc, TC_ACT_REDIRECT);
}

#[test]
fn ipv6_udp_load_balancer_through_xdp_is_forwarded_with_a_valid_udp_checksum_and_answered_back() {
    let dp = dataplane("np6_xdp");
    let lb = ip6("2001:db8:113::10");
    let req = packets::udp6(CLIENT_MAC, EXT0_MAC, CLIENT_IP6, lb, 5000, 53, b"query");
    let (rc, out) = dp.xdp(&req);
    assert_eq!(rc, XDP_TX, "out of the device it came in on");
    let v = inspect6(&out);
    assert_eq!((v.daddr, v.dport), (ip6("fd00:244:2::20"), 5353));
    assert_eq!(v.saddr, NODE_IP6);
    let port = v.sport;
    let answer = packets::udp6(
        NODE_B_MAC,
        EXT0_MAC,
        ip6("fd00:244:2::20"),
        NODE_IP6,
        5353,
        port,
        b"answer",
    );
    let (rc, out) = dp.xdp(&answer);
    assert_eq!(rc, XDP_TX);
    let v = inspect6(&out);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport),
        (lb, 53, CLIENT_IP6, 5000)
    );
    assert_eq!(v.payload, b"answer");
}

#[test]
fn ipv6_maglev_picks_the_slot_of_flow_hash6_in_the_agents_table() {
    let dp = dataplane("np6_maglev");
    let vip = ip6("2001:db8:113::20");
    let mut seen = std::collections::BTreeSet::new();
    let svc_id = dp
        .reconciler
        .state()
        .frontends()
        .find(|(k, _)| k.address == IpAddr::V6(vip))
        .unwrap()
        .1
        .service_id;
    let table = dp.reconciler.state().maglev[&svc_id].clone();
    for sport in 41000..41060u16 {
        let (rc, out) = dp.tc_ingress(&syn6(vip, 80, sport, b""));
        assert_eq!(rc, TC_ACT_REDIRECT);
        let got = inspect6(&out).daddr;
        let slot = flow_hash6(
            ip6_to_words(CLIENT_IP6),
            ip6_to_words(vip),
            sport.to_be(),
            80u16.to_be(),
            6,
        ) % table.len() as u32;
        let want = dp.reconciler.state().backends[&table[slot as usize]].address;
        assert_eq!(IpAddr::V6(got), want, "flow from port {sport}");
        seen.insert(got);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

/// An ICMPv6 error as it left the program: Ethernet and IPv6 headers
/// swapped back toward the sender, the ICMPv6 checksum verified from
/// scratch over the pseudo-header (RFC 8200 §8.1) and the message, and the
/// quote compared with the packet it answers.
fn icmp6_error(out: &[u8], answered: &[u8]) -> (u8, u8, u32) {
    assert_eq!(&out[12..14], &[0x86, 0xdd], "IPv6");
    assert_eq!(&out[0..6], &answered[6..12], "back to the sender's MAC");
    let ip = &out[14..54];
    assert_eq!(ip[6], 58, "next header ICMPv6 (no extension header)");
    let src: [u8; 16] = ip[8..24].try_into().unwrap();
    let dst: [u8; 16] = ip[24..40].try_into().unwrap();
    assert_eq!(
        src,
        answered[14 + 24..14 + 40],
        "from the address it was sent to"
    );
    assert_eq!(dst, answered[14 + 8..14 + 24], "to its sender");
    let msg = &out[54..];
    assert_eq!(u16::from_be_bytes([ip[4], ip[5]]) as usize, msg.len());
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src);
    pseudo.extend_from_slice(&dst);
    pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(msg);
    assert_eq!(packets::internet_checksum(&pseudo), 0, "ICMPv6 checksum");
    assert_eq!(
        &msg[8..56],
        &answered[14..62],
        "quotes the IPv6 header and 8 bytes"
    );
    (
        msg[0],
        msg[1],
        u32::from_be_bytes(msg[4..8].try_into().unwrap()),
    )
}

#[test]
fn ipv6_packet_too_big_answers_a_packet_that_does_not_fit_the_path_with_its_mtu() {
    let dp = dataplane("np6_ptb");
    let before = dp.drops("frag-needed");
    let big = packets::tcp6(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP6,
        NODE_IP6,
        40050,
        31008,
        ACK,
        &[7u8; 1400],
    );
    let (rc, out) = dp.tc_ingress(&big);
    assert_eq!(rc, TC_ACT_REDIRECT, "bounced back out of ext0");
    assert_eq!(
        icmp6_error(&out, &big),
        (2, 0, 1400),
        "packet too big, MTU 1400"
    );
    assert_eq!(dp.drops("frag-needed"), before + 1);
    // XDP leaves it to tc.
    let (rc, out) = dp.xdp(&big);
    assert_eq!((rc, out), (XDP_PASS, big));
    // A packet that fits goes on.
    let (rc, _) = dp.tc_ingress(&packets::tcp6(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP6,
        NODE_IP6,
        40051,
        31008,
        ACK,
        &[7u8; 1300],
    ));
    assert_eq!(rc, TC_ACT_REDIRECT);
}

#[test]
fn ipv6_hop_limit_running_out_gets_time_exceeded_and_counts_it() {
    let dp = dataplane("np6_hop");
    let before = dp.drops("ttl-exceeded");
    let last_hop = packets::tcp6_hop(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP6, NODE_IP6, 40010, 31002, SYN, b"", 1,
    );
    let (rc, out) = dp.tc_ingress(&last_hop);
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(icmp6_error(&out, &last_hop), (3, 0, 0), "time exceeded");
    assert_eq!(dp.drops("ttl-exceeded"), before + 1);
}

#[test]
fn ipv6_load_balancer_source_ranges_admit_only_their_networks() {
    let dp = dataplane("np6_ranges");
    let lb = ip6("2001:db8:113::30");
    // fd00:50::1 lies in fd00:50::/64.
    let (rc, out) = dp.tc_ingress(&syn6(lb, 80, 40020, b""));
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(inspect6(&out).daddr, ip6("fd00:244:2::40"));
    // 2001:db8:99::1 does not.
    let before = dp.drops("source-range");
    let outsider = packets::tcp6(
        CLIENT_MAC,
        EXT0_MAC,
        ip6("2001:db8:99::1"),
        lb,
        40021,
        80,
        SYN,
        b"",
    );
    let (rc, _) = dp.tc_ingress(&outsider);
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(dp.drops("source-range"), before + 1);
    let (rc, _) = dp.xdp(&outsider);
    assert_eq!(rc, XDP_DROP);
}

/// A source range cannot be passed by writing an IPv4 client as an
/// IPv4-mapped IPv6 source (`::ffff:192.168.50.1`): a dual-stack
/// LoadBalancer whose IPv4 range holds that client admits it on its IPv4
/// address, not on its IPv6 one (the IPv6 trie holds only IPv6 networks),
/// on tc and XDP; the IPv6 range still admits its own clients.
#[test]
fn ipv6_a_v4_mapped_source_does_not_pass_the_ipv4_range_of_a_dual_stack_load_balancer() {
    let mut dp = dataplane("np6_mapped");
    dp.apply_with_extra(
        r#"
services:
  - name: dual
    type: LoadBalancer
    clusterIPs: [10.96.0.40, "fd00:96::40"]
    loadBalancerIPs: [203.0.113.40, "2001:db8:113::40"]
    loadBalancerSourceRanges: [192.168.50.0/24, "fd00:50::/64"]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: 10.244.1.40, local: true}, {address: "fd00:244:1::40", local: true}]
"#,
    );
    let lb4: std::net::Ipv4Addr = "203.0.113.40".parse().unwrap();
    let lb6 = ip6("2001:db8:113::40");
    let (rc, out) = dp.tc_ingress(&packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, lb4, 40040, 80, SYN, b"",
    ));
    assert_eq!(rc, TC_ACT_OK, "the IPv4 client in the IPv4 range");
    assert_eq!(
        packets::inspect(&out).daddr,
        "10.244.1.40".parse::<std::net::Ipv4Addr>().unwrap()
    );
    let (rc, out) = dp.tc_ingress(&syn6(lb6, 80, 40041, b""));
    assert_eq!(rc, TC_ACT_OK, "the IPv6 client in the IPv6 range");
    assert_eq!(inspect6(&out).daddr, ip6("fd00:244:1::40"));

    let mapped = packets::tcp6(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP.to_ipv6_mapped(),
        lb6,
        40042,
        80,
        SYN,
        b"",
    );
    let before = dp.drops("source-range");
    let (rc, _) = dp.tc_ingress(&mapped);
    assert_eq!(
        rc, TC_ACT_SHOT,
        "the IPv4 client written as IPv4-mapped IPv6"
    );
    assert_eq!(dp.drops("source-range"), before + 1);
    let (rc, _) = dp.xdp(&mapped);
    assert_eq!(rc, XDP_DROP);
    assert_eq!(dp.drops("source-range"), before + 2);
}

/// As kube-proxy's REJECT: a frontend without endpoints answers "port
/// unreachable" (ICMPv6 destination unreachable, code 4), counted.
#[test]
fn ipv6_frontend_without_endpoints_answers_port_unreachable() {
    let dp = dataplane("np6_empty");
    let before = dp.drops("no-backend");
    let syn = syn6(NODE_IP6, 31007, 40030, b"");
    let (rc, out) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(icmp6_error(&out, &syn), (1, 4, 0), "port unreachable");
    assert_eq!(dp.drops("no-backend"), before + 1);
}

#[test]
fn ipv6_traffic_that_is_not_for_a_service_and_ipv4_only_nodeports_pass_untouched() {
    let dp = dataplane("np6_other");
    // Not a service port on the node's address.
    let pkt = syn6(NODE_IP6, 22, 40040, b"ssh");
    let (rc, out) = dp.tc_ingress(&pkt);
    assert_eq!((rc, out), (TC_ACT_OK, pkt.clone()));
    let (rc, out) = dp.xdp(&pkt);
    assert_eq!((rc, out), (XDP_PASS, pkt));
    // A single-stack IPv4 service has no IPv6 NodePort (as in Kubernetes).
    let pkt = syn6(NODE_IP6, 31009, 40041, b"");
    let (rc, out) = dp.tc_ingress(&pkt);
    assert_eq!((rc, out), (TC_ACT_OK, pkt));
    assert!(!dp
        .reconciler
        .state()
        .frontends()
        .any(|(k, _)| k.port == 31009 && k.address.is_ipv6()));
}

/// IPv6 makes the UDP checksum mandatory (RFC 8200 §8.1): a zero one to a
/// frontend is a broken datagram, dropped and counted, with no conntrack
/// entry or SNAT port spent on it.
#[test]
fn ipv6_udp_without_a_checksum_to_a_frontend_is_dropped_as_invalid() {
    let dp = dataplane("np6_udp0");
    let mut pkt = packets::udp6(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP6,
        ip6("2001:db8:113::10"),
        5001,
        53,
        b"query",
    );
    pkt[14 + 40 + 6..14 + 40 + 8].copy_from_slice(&[0, 0]);
    let before = dp.drops("invalid-packet");
    let created = dp.counter(CNT_CT_CREATED);
    let (rc, _) = dp.tc_ingress(&pkt);
    assert_eq!(rc, TC_ACT_SHOT);
    let (rc, _) = dp.xdp(&pkt);
    assert_eq!(rc, XDP_DROP);
    assert_eq!(dp.drops("invalid-packet"), before + 2);
    assert_eq!(dp.counter(CNT_CT_CREATED), created);
}

/// A router's "packet too big" about a SNATed flow comes to the node's
/// SNAT address quoting the packet as the node sent it; it goes on to the
/// client quoting the client's own packet to the NodePort (RFC 5508 §4.2),
/// every checksum right (the ICMPv6 one covers the new outer addresses).
#[test]
fn ipv6_a_routers_packet_too_big_for_a_snat_flow_reaches_the_client_translated() {
    let dp = dataplane("np6_icmp_snat");
    let (rc, sent) = dp.tc_ingress(&syn6(NODE_IP6, 31002, 42100, b""));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let err = packets::icmp6_error(
        NODE_B_MAC,
        EXT0_MAC,
        NODE_B_IP6,
        NODE_IP6,
        2,
        0,
        1300u32.to_be_bytes(),
        &sent[14..],
    );
    let (rc, out) = dp.tc_ingress(&err);
    assert_eq!(rc, TC_ACT_REDIRECT, "toward the client");
    let v = packets::inspect_icmp6(&out);
    assert_eq!((v.saddr, v.daddr), (NODE_B_IP6, CLIENT_IP6));
    assert_eq!(v.eth_dst, CLIENT_MAC);
    assert_eq!(
        (
            v.quoted_saddr,
            v.quoted_sport,
            v.quoted_daddr,
            v.quoted_dport
        ),
        (CLIENT_IP6, 42100, NODE_IP6, 31002),
        "quotes what the client sent"
    );
    assert_eq!((v.ty, v.code, v.rest), (2, 0, 1300u32.to_be_bytes()));
    assert_eq!(dp.counter(lb_common::config::CNT_ICMP_TRANSLATED), 1);

    // The same error about a port nobody allocated: the stack's, untouched.
    let mut stray_quote = sent[14..].to_vec();
    stray_quote[40..42].copy_from_slice(&1u16.to_be_bytes());
    let stray = packets::icmp6_error(
        NODE_B_MAC,
        EXT0_MAC,
        NODE_B_IP6,
        NODE_IP6,
        2,
        0,
        1300u32.to_be_bytes(),
        &stray_quote,
    );
    let (rc, out) = dp.tc_ingress(&stray);
    assert_eq!((rc, out), (TC_ACT_OK, stray));
    // Neighbour discovery is never touched.
    let ns = packets::icmp6_error(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP6, NODE_IP6, 135, 0, [0; 4], &[0u8; 20],
    );
    let (rc, out) = dp.tc_ingress(&ns);
    assert_eq!((rc, out), (TC_ACT_OK, ns.clone()));
    let (rc, out) = dp.xdp(&ns);
    assert_eq!((rc, out), (XDP_PASS, ns));
}

/// A local backend's ICMPv6 error about a flow it got through the NodePort
/// leaves quoting the NodePort, from the node's address.
#[test]
fn ipv6_a_local_backends_icmp_error_leaves_quoting_the_frontend() {
    let dp = dataplane("np6_icmp_local");
    let (rc, got) = dp.tc_ingress(&syn6(NODE_IP6, 31001, 42200, b""));
    assert_eq!(rc, TC_ACT_OK);
    let err = packets::icmp6_error(
        [0; 6],
        CLIENT_MAC,
        ip6("fd00:244:1::10"),
        CLIENT_IP6,
        1,
        4,
        [0; 4],
        &got[14..],
    );
    let (rc, out) = dp.tc_egress(&err);
    assert_eq!(rc, TC_ACT_OK);
    let v = packets::inspect_icmp6(&out);
    assert_eq!(
        (v.saddr, v.daddr),
        (NODE_IP6, CLIENT_IP6),
        "from the frontend"
    );
    assert_eq!((v.quoted_daddr, v.quoted_dport), (NODE_IP6, 31001));
    assert_eq!((v.quoted_saddr, v.quoted_sport), (CLIENT_IP6, 42200));
}

/// DSR over IPv6 (as Cilium): the SYN to a remote backend keeps the
/// client's address and carries the frontend in a Destination Options
/// header; the backend's node learns it, strips the header, and the pod's
/// reply leaves from the NodePort straight to the client. Only the SYN
/// carries it. XDP leaves the insert to tc.
#[test]
fn ipv6_dsr_carries_the_frontend_in_a_destination_options_header_and_the_backend_node_answers_from_it(
) {
    let dp = dataplane("np6_dsr");
    dp.config(CFG_LB_MODE, MODE_DSR);
    let syn = syn6(NODE_IP6, 31002, 40200, b"");
    let (rc, out) = dp.xdp(&syn);
    assert_eq!((rc, &out), (XDP_PASS, &syn), "punted to tc untouched");
    let (rc, out) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (v, dsr) = packets::inspect6_dsr(&out);
    assert_eq!(
        (v.saddr, v.sport),
        (CLIENT_IP6, 40200),
        "DSR keeps the client"
    );
    assert_eq!((v.daddr, v.dport), (ip6("fd00:244:2::10"), 8080));
    assert_eq!(dsr, Some((NODE_IP6, 31002)), "the frontend in the header");
    assert_eq!(v.hop_limit, 63);

    // On the backend's node (the same programs), with a NIC that sums
    // frames (CHECKSUM_COMPLETE): learned, stripped, skb->csum still right.
    let (rc, stripped) = dp
        .tc_ingress_checksum_complete(&out)
        .expect("BPF_PROG_TEST_RUN");
    assert_eq!(rc, TC_ACT_OK, "delivered to the local pod");
    let (s, dsr) = packets::inspect6_dsr(&stripped);
    assert_eq!(dsr, None, "the header is gone");
    assert_eq!(
        (s.saddr, s.daddr, s.dport),
        (CLIENT_IP6, ip6("fd00:244:2::10"), 8080)
    );
    let reply = packets::tcp6(
        [0; 6],
        CLIENT_MAC,
        ip6("fd00:244:2::10"),
        CLIENT_IP6,
        8080,
        40200,
        SYN | ACK,
        b"",
    );
    let (rc, out) = dp.tc_egress(&reply);
    assert_eq!(rc, TC_ACT_OK);
    let r = inspect6(&out);
    assert_eq!(
        (r.saddr, r.sport, r.daddr, r.dport),
        (NODE_IP6, 31002, CLIENT_IP6, 40200),
        "the reply leaves from the NodePort"
    );

    let (_, out) = dp.tc_ingress(&packets::tcp6(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP6, NODE_IP6, 40200, 31002, ACK, b"x",
    ));
    assert_eq!(
        packets::inspect6_dsr(&out).1,
        None,
        "only the SYN carries it"
    );
}

/// The IPv4 option's removal on a CHECKSUM_COMPLETE packet: the kernel
/// takes the removed bytes out of skb->csum, and the recomputed header
/// checksum keeps the header's own sum, so nothing more is needed there.
#[test]
fn ipv4_dsr_option_removal_keeps_skb_csum_right_on_checksum_complete_packets() {
    let dp = dataplane("np4_dsr_complete");
    dp.config(CFG_LB_MODE, MODE_DSR);
    let syn = packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40300, 31009, SYN, b"",
    );
    let (rc, out) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(
        packets::inspect(&out).options.len(),
        8,
        "carries the option"
    );
    let (rc, stripped) = dp
        .tc_ingress_checksum_complete(&out)
        .expect("BPF_PROG_TEST_RUN (EBADMSG: skb->csum no longer matches)");
    assert_eq!(rc, TC_ACT_OK);
    assert!(packets::inspect(&stripped).options.is_empty());
}

#[test]
fn ipv6_hybrid_mode_uses_dsr_for_tcp_and_snat_for_udp() {
    let dp = dataplane("np6_hybrid");
    dp.config(CFG_LB_MODE, MODE_HYBRID);
    let (_, out) = dp.tc_ingress(&syn6(NODE_IP6, 31002, 40210, b""));
    let (v, dsr) = packets::inspect6_dsr(&out);
    assert_eq!((v.saddr, dsr.is_some()), (CLIENT_IP6, true), "TCP: DSR");
    let (rc, out) = dp.tc_ingress(&packets::udp6(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP6,
        ip6("2001:db8:113::10"),
        5010,
        53,
        b"query",
    ));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (v, dsr) = packets::inspect6_dsr(&out);
    assert_eq!((v.saddr, dsr), (NODE_IP6, None), "UDP: SNAT");
}

/// A DSR header naming a frontend this node does not serve is not learned:
/// otherwise any outside host could plant entries that rewrite a pod's
/// replies.
#[test]
fn ipv6_a_dsr_header_naming_an_unknown_frontend_is_rejected() {
    let dp = dataplane("np6_dsr_reject");
    let plain = packets::tcp6(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP6,
        ip6("fd00:244:1::10"),
        42500,
        8080,
        SYN,
        b"",
    );
    let mut p = plain[..54].to_vec();
    p[20] = 60;
    let payload = u16::from_be_bytes([p[18], p[19]]) + 24;
    p[18..20].copy_from_slice(&payload.to_be_bytes());
    p.extend_from_slice(&[6, 2, 0x1b, 20, 0, 80, 0, 0]);
    p.extend_from_slice(&ip6("2001:db8:99::1").octets());
    p.extend_from_slice(&plain[54..]);
    let (rc, _) = dp.tc_ingress(&p);
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(dp.drops("dsr-rejected"), 1);
}

/// IPv6 frontends have their bits in the frontend filter too (the address
/// folded to 32 bits): a packet whose bits are clear leaves before any
/// lookup, on tc and XDP, while the filter is trusted. Clearing an IPv6
/// NodePort's bit by hand lets its packets go untranslated; distrusting
/// the filter serves them again.
#[test]
fn ipv6_a_nodeport_whose_filter_bit_is_clear_is_let_go_only_while_the_filter_is_trusted() {
    use aya::maps::{Array, MapData};
    use lb_common::{
        config::CFG_FRONTEND_FILTER,
        filter::{filter_bit, fold6, word_and_mask},
    };
    let dp = dataplane("np6_filter");
    let (rc, out) = dp.tc_ingress(&syn6(NODE_IP6, 31001, 40400, b""));
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(inspect6(&out).daddr, ip6("fd00:244:1::10"), "served");

    let (word, mask) = word_and_mask(filter_bit(fold6(ip6_to_words(NODE_IP6)), 31001u16.to_be()));
    let mut filter: Array<MapData, u64> = Array::try_from(aya::maps::Map::Array(
        MapData::from_pin(dp.pins.path.join(lb_common::maps::LB4_FE_FILTER)).unwrap(),
    ))
    .unwrap();
    let was = filter.get(&word, 0).unwrap();
    assert_ne!(was & mask, 0, "the agent set the IPv6 NodePort's bit");
    filter.set(word, was & !mask, 0).unwrap();
    let syn = syn6(NODE_IP6, 31001, 40401, b"");
    assert_eq!(
        dp.tc_ingress(&syn),
        (TC_ACT_OK, syn.clone()),
        "tc lets it go"
    );
    assert_eq!(dp.xdp(&syn), (XDP_PASS, syn.clone()), "so does XDP");

    dp.config(CFG_FRONTEND_FILTER, 0);
    let (rc, out) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(
        inspect6(&out).daddr,
        ip6("fd00:244:1::10"),
        "an untrusted filter is not used"
    );
}

/// IPv6 fragments are not followed (IPv4's are): one addressed to a
/// NodePort is left to the stack untouched, and counted, so an operator
/// sees what was not translated.
#[test]
fn ipv6_fragments_are_left_to_the_stack_and_counted() {
    use lb_common::config::CNT_IPV6_FRAGMENTS_PASSED;
    let dp = dataplane("np6_frag");
    let whole = syn6(NODE_IP6, 31001, 40500, b"");
    // The same packet with a fragment header (first fragment, more to come).
    let mut frag = whole[..54].to_vec();
    frag[20] = 44;
    let payload = u16::from_be_bytes([frag[18], frag[19]]) + 8;
    frag[18..20].copy_from_slice(&payload.to_be_bytes());
    frag.extend_from_slice(&[6, 0, 0, 1, 0, 0, 0x12, 0x34]);
    frag.extend_from_slice(&whole[54..]);
    let before = dp.counter(CNT_IPV6_FRAGMENTS_PASSED);
    assert_eq!(dp.tc_ingress(&frag), (TC_ACT_OK, frag.clone()), "untouched");
    assert_eq!(dp.xdp(&frag), (XDP_PASS, frag.clone()));
    assert_eq!(dp.counter(CNT_IPV6_FRAGMENTS_PASSED), before + 2);
}
