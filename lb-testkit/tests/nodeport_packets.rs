//! The tc and XDP programs on crafted packets (BPF_PROG_TEST_RUN): every
//! path of the north-south data path, packets in, expected packets out,
//! checksums verified independently (etherparse computes them from scratch).
use std::net::Ipv4Addr;

use lb::model::file::parse_with;
use lb_common::{config::CFG_LB_MODE, nodeport::*};
use lb_testkit::{
    dataplane::*,
    packets::{self, inspect, ACK, FIN, SYN},
    unique,
};

fn dataplane(test: &str) -> Dataplane {
    Dataplane::with_services(&unique(test), SERVICES)
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn syn_to(dport: u16, sport: u16) -> Vec<u8> {
    packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, sport, dport, SYN, b"",
    )
}

#[test]
fn nodeport_to_a_local_backend_is_dnatted_to_the_stack_and_the_reply_reverse_natted_on_egress() {
    let dp = dataplane("np_local");
    let (rc, out) = dp.tc_ingress(&syn_to(30001, 40000));
    assert_eq!(rc, TC_ACT_OK, "delivered by the stack");
    let v = inspect(&out);
    assert_eq!(
        (v.saddr, v.sport),
        (CLIENT_IP, 40000),
        "client address kept"
    );
    assert_eq!((v.daddr, v.dport), (ip("10.244.1.10"), 8080));

    let reply = packets::tcp(
        [0; 6],
        CLIENT_MAC,
        ip("10.244.1.10"),
        CLIENT_IP,
        8080,
        40000,
        SYN | ACK,
        b"",
    );
    let (rc, out) = dp.tc_egress(&reply);
    assert_eq!(rc, TC_ACT_OK);
    let v = inspect(&out);
    assert_eq!(
        (v.saddr, v.sport),
        (NODE_IP, 30001),
        "reply leaves from the NodePort"
    );
    assert_eq!((v.daddr, v.dport), (CLIENT_IP, 40000));
}

#[test]
fn nodeport_to_a_remote_backend_in_snat_mode_is_rewritten_redirected_and_the_reply_comes_back_through_us(
) {
    let dp = dataplane("np_snat");
    let (rc, out) = dp.tc_ingress(&packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40001, 30002, SYN, b"hello",
    ));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect(&out);
    assert_eq!((v.daddr, v.dport), (ip("10.244.2.10"), 8080));
    assert_eq!(
        v.saddr, NODE_IP,
        "SNAT to the node's address on the egress device"
    );
    assert!(
        (61000..=65535).contains(&v.sport),
        "SNAT port from the configured range: {}",
        v.sport
    );
    assert_eq!(
        (v.eth_dst, v.eth_src),
        (NODE_B_MAC, EXT0_MAC),
        "next hop from the FIB"
    );
    assert_eq!(v.payload, b"hello");
    let snat_port = v.sport;

    // The backend's reply to our SNAT port goes back to the client, from the NodePort.
    let reply = packets::tcp(
        NODE_B_MAC,
        EXT0_MAC,
        ip("10.244.2.10"),
        NODE_IP,
        8080,
        snat_port,
        SYN | ACK,
        b"",
    );
    let (rc, out) = dp.tc_ingress(&reply);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect(&out);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport),
        (NODE_IP, 30002, CLIENT_IP, 40001)
    );
    assert_eq!(v.eth_dst, CLIENT_MAC);

    // Later packets of the flow reuse the same SNAT port.
    let (_, out) = dp.tc_ingress(&packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40001, 30002, ACK, b"more",
    ));
    assert_eq!(inspect(&out).sport, snat_port);
}

#[test]
fn dsr_request_carries_the_service_in_an_ip_option_and_the_backend_node_answers_from_it() {
    let dp = dataplane("np_dsr");
    dp.config(CFG_LB_MODE, MODE_DSR);
    let (rc, out) = dp.tc_ingress(&syn_to(30002, 40002));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect(&out);
    assert_eq!(
        (v.saddr, v.sport),
        (CLIENT_IP, 40002),
        "DSR keeps the client address"
    );
    assert_eq!((v.daddr, v.dport), (ip("10.244.2.10"), 8080));
    let mut opt = vec![DSR_OPT_TYPE, DSR_OPT_LEN];
    opt.extend_from_slice(&30002u16.to_be_bytes());
    opt.extend_from_slice(&NODE_IP.octets());
    assert_eq!(v.options, opt, "the service address and port in the option");
    assert_eq!(v.ip.total_len as usize, out.len() - 14);

    // On the backend's node: the option is learned and stripped...
    let (rc, stripped) = dp.tc_ingress(&out);
    assert_eq!(rc, TC_ACT_OK, "delivered to the local pod");
    let s = inspect(&stripped);
    assert!(s.options.is_empty());
    assert_eq!(
        (s.saddr, s.daddr, s.dport),
        (CLIENT_IP, ip("10.244.2.10"), 8080)
    );
    // ...and the pod's reply leaves from the service address, straight to the client.
    let reply = packets::tcp(
        [0; 6],
        CLIENT_MAC,
        ip("10.244.2.10"),
        CLIENT_IP,
        8080,
        40002,
        SYN | ACK,
        b"",
    );
    let (rc, out) = dp.tc_egress(&reply);
    assert_eq!(rc, TC_ACT_OK);
    let r = inspect(&out);
    assert_eq!(
        (r.saddr, r.sport, r.daddr, r.dport),
        (NODE_IP, 30002, CLIENT_IP, 40002)
    );

    // Only the SYN carries the option; the rest of the flow follows conntrack.
    let (_, out) = dp.tc_ingress(&packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40002, 30002, ACK, b"x",
    ));
    assert!(inspect(&out).options.is_empty());
}

#[test]
fn hybrid_mode_uses_dsr_for_tcp_and_snat_for_udp() {
    let dp = dataplane("np_hybrid");
    dp.config(CFG_LB_MODE, MODE_HYBRID);
    let (_, out) = dp.tc_ingress(&syn_to(30002, 40003));
    let v = inspect(&out);
    assert_eq!(v.saddr, CLIENT_IP);
    assert_eq!(v.options.len(), 8, "TCP: DSR");
    let dns = packets::udp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        ip("203.0.113.10"),
        5000,
        53,
        b"query",
    );
    let (rc, out) = dp.tc_ingress(&dns);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect(&out);
    assert_eq!(
        (v.saddr, v.daddr, v.dport),
        (NODE_IP, ip("10.244.2.20"), 5353),
        "UDP: SNAT"
    );
    assert!(v.options.is_empty());
    assert_eq!(v.payload, b"query");
}

#[test]
fn service_without_backends_drops_and_counts_the_reason() {
    let dp = dataplane("np_nobackend");
    let before = dp.drops("no-backend");
    let (rc, _) = dp.tc_ingress(&syn_to(30003, 40004));
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(dp.drops("no-backend"), before + 1);
    let (rc, _) = dp.xdp(&syn_to(30003, 40004));
    assert_eq!(rc, XDP_DROP);
}

#[test]
fn traffic_that_is_not_for_a_service_passes_untouched() {
    let dp = dataplane("np_passthrough");
    let ssh = syn_to(22, 40005);
    let cluster_ip = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        ip("10.96.0.2"),
        40005,
        80,
        SYN,
        b"",
    );
    let unknown_vip_port = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        ip("203.0.113.20"),
        40005,
        81,
        SYN,
        b"",
    );
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&CLIENT_MAC);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    let mut ipv6 = vec![0u8; 14 + 40];
    ipv6[12..14].copy_from_slice(&[0x86, 0xdd]);
    ipv6[14] = 0x60;
    for p in [ssh, cluster_ip, unknown_vip_port, arp, ipv6] {
        let (rc, out) = dp.tc_ingress(&p);
        assert_eq!((rc, &out), (TC_ACT_OK, &p), "tc must not touch it");
        let (rc, out) = dp.xdp(&p);
        assert_eq!((rc, &out), (XDP_PASS, &p), "XDP must not touch it");
        let (rc, out) = dp.tc_egress(&p);
        assert_eq!((rc, &out), (TC_ACT_OK, &p), "tc egress must not touch it");
    }
}

#[test]
fn fragments_to_a_service_are_dropped_and_other_fragments_pass() {
    let dp = dataplane("np_fragments");
    // First fragment (MF set, offset 0) to the NodePort: ports are there, the rest would not be.
    let mut first = syn_to(30002, 40006);
    first[14 + 6] = 0x20; // MF
    fix_ip_checksum(&mut first);
    let (rc, _) = dp.tc_ingress(&first);
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(dp.drops("fragment"), 1);
    // A later fragment (offset 8) has no ports: the stack decides (reassembly).
    let mut later = syn_to(30002, 40006);
    later[14 + 6] = 0x00;
    later[14 + 7] = 0x01;
    fix_ip_checksum(&mut later);
    let (rc, out) = dp.tc_ingress(&later);
    assert_eq!((rc, out), (TC_ACT_OK, later));
}

#[test]
fn malformed_headers_to_a_service_are_dropped_and_broken_ip_headers_pass() {
    let dp = dataplane("np_malformed");
    // TCP header cut short (IP length says so too): dropped with a reason.
    let mut short = syn_to(30002, 40007);
    short.truncate(14 + 20 + 8);
    short[14 + 2..14 + 4].copy_from_slice(&28u16.to_be_bytes());
    fix_ip_checksum(&mut short);
    let (rc, _) = dp.tc_ingress(&short);
    assert_eq!(rc, TC_ACT_SHOT);
    // IP total length beyond the frame.
    let mut long = syn_to(30002, 40007);
    long[14 + 2..14 + 4].copy_from_slice(&1400u16.to_be_bytes());
    fix_ip_checksum(&mut long);
    let (rc, _) = dp.tc_ingress(&long);
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(dp.drops("invalid-packet"), 2);
    // IHL below 5, or an IP header with no L4 header at all (no ports to
    // tell the service): not ours to judge, the stack drops them.
    let mut bad_ihl = syn_to(30002, 40007);
    bad_ihl[14] = 0x44;
    let (rc, out) = dp.tc_ingress(&bad_ihl);
    assert_eq!((rc, out), (TC_ACT_OK, bad_ihl));
    let ip_only = syn_to(30002, 40007)[..34].to_vec();
    let (rc, out) = dp.tc_ingress(&ip_only);
    assert_eq!((rc, out), (TC_ACT_OK, ip_only.clone()));
    let (rc, out) = dp.xdp(&ip_only);
    assert_eq!((rc, out), (XDP_PASS, ip_only));
}

#[test]
fn xdp_forwards_snat_and_local_flows_and_punts_what_needs_tc() {
    let dp = dataplane("np_xdp");
    let (rc, out) = dp.xdp(&syn_to(30002, 40008));
    assert_eq!(rc, XDP_TX, "out of the device it came in on");
    let v = inspect(&out);
    assert_eq!(
        (v.saddr, v.daddr, v.dport),
        (NODE_IP, ip("10.244.2.10"), 8080)
    );
    assert_eq!(v.eth_dst, NODE_B_MAC);
    let (rc, out) = dp.xdp(&syn_to(30001, 40008));
    assert_eq!(rc, XDP_PASS);
    assert_eq!(
        inspect(&out).daddr,
        ip("10.244.1.10"),
        "local backend: DNAT, the stack delivers"
    );
    // DSR needs an IP option XDP does not insert: untouched, for tc.
    dp.config(CFG_LB_MODE, MODE_DSR);
    let syn = syn_to(30002, 40009);
    let (rc, out) = dp.xdp(&syn);
    assert_eq!((rc, out), (XDP_PASS, syn.clone()));
    let (_, out) = dp.tc_ingress(&syn);
    assert_eq!(inspect(&out).options.len(), 8);
}

#[test]
fn maglev_service_picks_by_flow_hash_and_conntrack_keeps_a_flow_when_the_table_changes() {
    let mut dp = dataplane("np_maglev");
    let vip = ip("203.0.113.20");
    let send = |dp: &Dataplane, sport: u16, flags: u8| {
        let (rc, out) = dp.tc_ingress(&packets::tcp(
            CLIENT_MAC, EXT0_MAC, CLIENT_IP, vip, sport, 80, flags, b"",
        ));
        assert_eq!(rc, TC_ACT_REDIRECT);
        inspect(&out).daddr
    };
    // Many flows spread over the three backends.
    let mut seen = std::collections::BTreeSet::new();
    for sport in 41000..41060 {
        seen.insert(send(&dp, sport, SYN));
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    // Each flow's backend is what the flow hash selects in the table the agent built.
    let first = send(&dp, 42000, SYN);
    let svc_id = dp
        .reconciler
        .state()
        .frontends()
        .find(|(k, _)| k.address == std::net::IpAddr::V4(vip))
        .unwrap()
        .1
        .service_id;
    let table = dp.reconciler.state().maglev[&svc_id].clone();
    let slot = flow_hash(
        u32::from_ne_bytes(CLIENT_IP.octets()),
        u32::from_ne_bytes(vip.octets()),
        42000u16.to_be(),
        80u16.to_be(),
        6,
    ) % table.len() as u32;
    let expected = dp.reconciler.state().backends[&table[slot as usize]].address;
    assert_eq!(std::net::IpAddr::V4(first), expected);

    // The table changes (a fourth backend): the established flow stays put.
    let ctx = node_context();
    let more = SERVICES.replace(
        "{address: 10.244.2.33}]",
        "{address: 10.244.2.33}, {address: 10.244.2.34}]",
    );
    dp.apply(&parse_with(&more, &ctx).unwrap());
    for _ in 0..5 {
        assert_eq!(
            send(&dp, 42000, ACK),
            first,
            "conntrack wins over the new table"
        );
    }
    // When its backend leaves, the flow moves (FIN-less: the next packet re-selects).
    let gone = SERVICES
        .replace(&format!("{{address: {first}}}, "), "")
        .replace(&format!(", {{address: {first}}}"), "");
    assert_ne!(gone, SERVICES);
    dp.apply(&parse_with(&gone, &ctx).unwrap());
    assert_ne!(send(&dp, 42000, ACK), first);
    let _ = FIN;
}

/// Recomputes the IPv4 header checksum after a test edited the header.
fn fix_ip_checksum(frame: &mut [u8]) {
    frame[24] = 0;
    frame[25] = 0;
    let mut sum: u32 = 0;
    for i in (14..34).step_by(2) {
        sum += u16::from_be_bytes([frame[i], frame[i + 1]]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// The north-south drop reasons that real packets can produce, each counted:
/// the SNAT port range used up, no route to a backend, a Maglev service
/// without its table, a slot naming a backend that does not exist. (ct-full
/// cannot be produced: LB4_CT is an LRU and evicts instead of refusing.)
#[test]
fn snat_exhaustion_no_route_missing_maglev_table_and_missing_backend_are_dropped_and_counted() {
    use lb::maps::{LbMaps as _, MapOp, ServiceValue, SvcKey};
    let mut dp = dataplane("np_drop_reasons");
    let extra = r#"
services:
  - name: unrouted
    type: NodePort
    clusterIPs: [10.96.0.9]
    ports: [{port: 80, targetPort: 8080, nodePort: 30009}]
    backends: [{address: 10.99.0.10}]
"#;
    let ctx = node_context();
    let mut model = parse_with(SERVICES, &ctx).unwrap();
    model
        .services
        .extend(parse_with(extra, &ctx).unwrap().services);
    dp.apply(&model);

    // One SNAT port: the first flow takes it, the second finds none.
    dp.config(lb_common::config::CFG_SNAT_PORT_MIN, 61000);
    dp.config(lb_common::config::CFG_SNAT_PORT_MAX, 61000);
    assert_eq!(dp.tc_ingress(&syn_to(30002, 41000)).0, TC_ACT_REDIRECT);
    assert_eq!(dp.tc_ingress(&syn_to(30002, 41001)).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("snat-ports-exhausted"), 1);

    // A backend the node has no route to.
    assert_eq!(dp.tc_ingress(&syn_to(30009, 41002)).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("fib-lookup-failed"), 1);

    // A Maglev service while the table size is unset (an agent bug or race).
    dp.config(lb_common::config::CFG_MAGLEV_M, 0);
    let to_web = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        ip("203.0.113.20"),
        41003,
        80,
        SYN,
        b"",
    );
    assert_eq!(dp.tc_ingress(&to_web).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("maglev-missing"), 1);

    // A slot that names a backend id nobody wrote.
    let master = SvcKey::new(NODE_IP.into(), 30001, 6, 0);
    let slot = dp.reconciler.state().services[&master.with_slot(1)];
    let broken = ServiceValue {
        backend_id: 999_999,
        ..slot
    };
    dp.reconciler
        .maps_mut()
        .apply(&MapOp::UpsertService(master.with_slot(1), broken))
        .unwrap();
    assert_eq!(dp.tc_ingress(&syn_to(30001, 41004)).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("backend-missing"), 1);
}
