//! IPv6 north-south on crafted packets (BPF_PROG_TEST_RUN): what only IPv6
//! has, or tests in its own way (the behaviours both families share run
//! for each from one body in nodeport_both_families.rs), with IPv6
//! frontends from the services file (`dataplane::SERVICES6`). Checksums are verified independently
//! (etherparse computes them from scratch, pseudo-header included).
use std::net::Ipv6Addr;

use lb_common::config::CNT_CT_CREATED;
use lb_testkit::{
    dataplane::*,
    packets::{self, inspect6, SYN},
    unique,
};

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

/// Source ranges in front of a remote backend (the shared body in
/// nodeport_both_families.rs uses a local one): a client inside
/// fd00:50::/64 is SNATted and redirected to the backend, one outside is
/// dropped and counted on tc and XDP.
#[test]
fn ipv6_a_source_range_guards_a_load_balancer_whose_backend_is_remote() {
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
    assert_eq!(dp.drops("source-range"), before + 2);
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

/// A single-stack IPv4 service has no IPv6 NodePort (as in Kubernetes):
/// its port on the node's IPv6 address is not a frontend and passes
/// untouched.
#[test]
fn ipv6_an_ipv4_only_nodeport_is_not_served_on_the_nodes_ipv6_address() {
    let dp = dataplane("np6_other");
    let pkt = syn6(NODE_IP6, 31009, 40041, b"");
    let (rc, out) = dp.tc_ingress(&pkt);
    assert_eq!((rc, out), (TC_ACT_OK, pkt.clone()));
    let (rc, out) = dp.xdp(&pkt);
    assert_eq!((rc, out), (XDP_PASS, pkt));
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

/// Neighbour discovery (ICMPv6 types 133-137) is the stack's, never an
/// error about a flow: left untouched on tc and XDP.
#[test]
fn ipv6_neighbour_discovery_is_never_touched() {
    let dp = dataplane("np6_nd");
    let ns = packets::icmp6_error(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP6, NODE_IP6, 135, 0, [0; 4], &[0u8; 20],
    );
    let (rc, out) = dp.tc_ingress(&ns);
    assert_eq!((rc, out), (TC_ACT_OK, ns.clone()));
    let (rc, out) = dp.xdp(&ns);
    assert_eq!((rc, out), (XDP_PASS, ns));
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
