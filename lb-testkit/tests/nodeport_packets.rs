//! The tc and XDP programs on crafted IPv4 packets (BPF_PROG_TEST_RUN):
//! the north-south paths IPv4 has or tests in its own way, packets in,
//! expected packets out, checksums verified independently (etherparse
//! computes them from scratch). The behaviours both families share run
//! for each from one body in nodeport_both_families.rs.
use std::net::Ipv4Addr;

use lb::{
    maps::{LbMaps as _, MapOp, ServiceValue},
    source::file::parse::parse_with,
};
use lb_common::{config::CFG_LB_MODE, conntrack::*, nodeport::*};
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

/// A packet from backend 10.244.2.10:8080 on node B to this node's `dport`
/// (a reply to our SNAT port).
fn from_backend_on_node_b(dport: u16, flags: u8) -> Vec<u8> {
    packets::tcp(
        NODE_B_MAC,
        EXT0_MAC,
        ip("10.244.2.10"),
        NODE_IP,
        8080,
        dport,
        flags,
        b"",
    )
}

/// The service id the agent gave the frontend at `vip`.
fn service_id_at(dp: &Dataplane, vip: Ipv4Addr) -> u32 {
    dp.reconciler
        .state()
        .frontends()
        .find(|(k, _)| k.address == std::net::IpAddr::V4(vip))
        .expect("a frontend at the address")
        .1
        .service_id
}

fn syn_to(dport: u16, sport: u16) -> Vec<u8> {
    packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, sport, dport, SYN, b"",
    )
}

/// kube-proxy's "has no local endpoints" DROP: externalTrafficPolicy: Local
/// with endpoints only on other nodes drops silently (the load balancer's
/// health check steers away from this node), counted apart from a service
/// without any endpoint; with a local endpoint it is served.
#[test]
fn external_policy_local_without_a_local_endpoint_drops_with_its_own_reason() {
    let extra = r#"
services:
  - name: elsewhere
    type: NodePort
    externalTrafficPolicy: Local
    clusterIPs: [10.96.0.8]
    ports: [{port: 80, targetPort: 8080, nodePort: 30008}]
    backends: [{address: 10.244.2.40}]
  - name: here
    type: NodePort
    externalTrafficPolicy: Local
    clusterIPs: [10.96.0.9]
    ports: [{port: 80, targetPort: 8080, nodePort: 30009}]
    backends: [{address: 10.244.1.40, local: true}, {address: 10.244.2.41}]
"#;
    let mut dp = dataplane("np_etp_local");
    dp.apply_with_extra(extra);
    let (rc, _) = dp.tc_ingress(&syn_to(30008, 40010));
    assert_eq!(rc, TC_ACT_SHOT, "no ICMP: kube-proxy drops here");
    assert_eq!(dp.drops("no-local-backend"), 1);
    assert_eq!(dp.drops("no-backend"), 0);
    assert_eq!(dp.counter(lb_common::config::CNT_ICMP_SENT), 0);
    let (rc, _) = dp.xdp(&syn_to(30008, 40011));
    assert_eq!(rc, XDP_DROP);
    assert_eq!(dp.drops("no-local-backend"), 2);
    // A pod on this node is a client on the node: it uses every endpoint
    // (kube-proxy sends pods' traffic to such a service cluster-wide).
    let from_pod = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        ip("10.244.1.77"),
        NODE_IP,
        40012,
        30008,
        SYN,
        b"",
    );
    let (rc, out) = dp.pod_ingress(&from_pod);
    assert_eq!(rc, TC_ACT_OK, "DNAT, the stack routes it");
    assert_eq!(inspect(&out).daddr, ip("10.244.2.40"));
    assert_eq!(dp.drops("no-local-backend"), 2);
    // The node-local endpoint serves its service, only it.
    for port in 40020..40030 {
        let (rc, out) = dp.tc_ingress(&syn_to(30009, port));
        assert_eq!(rc, TC_ACT_OK, "a local backend: DNAT, the stack delivers");
        assert_eq!(inspect(&out).daddr, ip("10.244.1.40"));
    }
}

/// kube-proxy translates a packet to a ClusterIP that reaches the node by
/// routing (a router announcing the service range); so do we.
#[test]
fn a_clusterip_routed_to_the_node_is_translated_like_kube_proxy_does() {
    let dp = dataplane("np_routed_cip");
    let to_cluster_ip = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        ip("10.96.0.2"),
        40015,
        80,
        SYN,
        b"",
    );
    let (rc, out) = dp.tc_ingress(&to_cluster_ip);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect(&out);
    assert_eq!((v.daddr, v.dport), (ip("10.244.2.10"), 8080));
    assert_eq!(v.saddr, NODE_IP, "SNAT to the node");
    // A ClusterIP port the service does not expose: refused, counted.
    let wrong_port = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        ip("10.96.0.2"),
        40015,
        81,
        SYN,
        b"",
    );
    assert_eq!(dp.tc_ingress(&wrong_port).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("no-service-port"), 1);
}

/// A UDP datagram to a frontend, split in two IPv4 fragments: only the
/// first has the ports; the later one follows it to the same backend, with
/// the same addresses rewritten. A later fragment whose first was never seen
/// is left to the stack.
#[test]
fn fragments_of_a_datagram_to_a_service_follow_its_first_fragment() {
    let dp = dataplane("np_fragments");
    let whole = packets::udp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        ip("203.0.113.10"),
        40006,
        53,
        &[7u8; 64],
    );
    // First fragment: IP header + UDP header + 24 bytes, MF set, id 0x1234.
    let mut first = whole[..14 + 20 + 8 + 24].to_vec();
    first[14 + 2..14 + 4].copy_from_slice(&((20 + 32) as u16).to_be_bytes());
    first[14 + 4..14 + 6].copy_from_slice(&0x1234u16.to_be_bytes());
    first[14 + 6] = 0x20; // MF, offset 0
    fix_ip_checksum(&mut first);
    // Later fragment: the remaining 40 bytes at offset 32 (4 units of 8).
    let mut later = whole[..14 + 20].to_vec();
    later.extend_from_slice(&whole[14 + 20 + 32..]);
    later[14 + 2..14 + 4].copy_from_slice(&((20 + 40) as u16).to_be_bytes());
    later[14 + 4..14 + 6].copy_from_slice(&0x1234u16.to_be_bytes());
    later[14 + 6] = 0x00;
    later[14 + 7] = 0x04;
    fix_ip_checksum(&mut later);

    let (rc, out) = dp.tc_ingress(&first);
    assert_eq!(
        rc, TC_ACT_REDIRECT,
        "the first fragment goes to the backend"
    );
    let (ip1, _) = etherparse::Ipv4Header::from_slice(&out[14..]).unwrap();
    assert_eq!(ip1.destination, [10, 244, 2, 20]);
    assert_eq!(ip1.source, NODE_IP.octets(), "SNAT");
    assert_eq!(ip1.header_checksum, ip1.calc_header_checksum());
    let snat_port = u16::from_be_bytes([out[34], out[35]]);
    assert_eq!(u16::from_be_bytes([out[36], out[37]]), 5353);

    let (rc, out) = dp.tc_ingress(&later);
    assert_eq!(rc, TC_ACT_REDIRECT, "the later fragment follows");
    let (ip2, rest) = etherparse::Ipv4Header::from_slice(&out[14..]).unwrap();
    assert_eq!(ip2.destination, [10, 244, 2, 20]);
    assert_eq!(ip2.source, NODE_IP.octets());
    assert_eq!(ip2.header_checksum, ip2.calc_header_checksum());
    assert_eq!(&rest[..40], &whole[14 + 20 + 32..], "payload untouched");
    assert_eq!(dp.counter(lb_common::config::CNT_FRAGMENTS), 1);

    // Reassembled at the backend, the datagram's UDP checksum must hold.
    let mut datagram = out[..14 + 20].to_vec();
    let (rc1, out1) = dp.tc_ingress(&first); // same flow: same rewrite
    assert_eq!(rc1, TC_ACT_REDIRECT);
    datagram.extend_from_slice(&out1[34..34 + 32]);
    datagram.extend_from_slice(&rest[..40]);
    datagram[14 + 2..14 + 4].copy_from_slice(&((20 + 72) as u16).to_be_bytes());
    datagram[14 + 6] = 0;
    datagram[14 + 7] = 0;
    fix_ip_checksum(&mut datagram);
    let v = inspect(&datagram);
    assert_eq!((v.sport, v.dport), (snat_port, 5353));

    // A later fragment of a datagram nobody saw the start of.
    let mut stray = later.clone();
    stray[14 + 4..14 + 6].copy_from_slice(&0x9999u16.to_be_bytes());
    fix_ip_checksum(&mut stray);
    let (rc, out) = dp.tc_ingress(&stray);
    assert_eq!((rc, out), (TC_ACT_OK, stray));
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

/// A known flow skips looking its backend up while no backend has been
/// deleted (the backends' generation, `LB_BACKENDS_GEN`, has not moved).
/// A backend deleted behind the agent's back (an older agent's build kept
/// no generation) is not noticed, and the next load of the object, which
/// every agent start makes, starts a new generation: the flow looks again
/// and finds its backend gone. It then chooses again, and the Maglev slot
/// its hash lands on still names the deleted id (only the backend entry
/// was deleted, by hand): a `backend-missing` drop. (The agent's own
/// deletes move the generation at once:
/// `a_maglev_load_balancer_picks_the_flow_hashs_slot_...` in
/// nodeport_both_families.rs.)
#[test]
fn a_backend_deleted_behind_the_agent_is_noticed_by_known_flows_after_the_next_agent_start() {
    let mut dp = dataplane("np_backend_gen");
    let vip = ip("203.0.113.20");
    let send = |dp: &Dataplane, flags: u8| {
        let (rc, out) = dp.tc_ingress(&packets::tcp(
            CLIENT_MAC, EXT0_MAC, CLIENT_IP, vip, 42_100, 80, flags, b"",
        ));
        (rc == TC_ACT_REDIRECT).then(|| inspect(&out).daddr)
    };
    let first = send(&dp, SYN).expect("a new flow is forwarded");
    assert_eq!(send(&dp, ACK), Some(first));
    let id = dp
        .reconciler
        .state()
        .backends
        .iter()
        .find(|(_, b)| b.address == std::net::IpAddr::V4(first))
        .map(|(id, _)| *id)
        .expect("the flow's backend in the maps");
    let mut backends: aya::maps::HashMap<_, u32, lb_common::backend::Backend4> =
        aya::maps::HashMap::try_from(
            dp.ebpf
                .map_mut(lb_common::maps::LB4_BACKENDS)
                .expect("LB4_BACKENDS"),
        )
        .unwrap();
    backends.remove(&id).expect("deleting the backend by hand");
    let missing = dp.drops("backend-missing");
    assert_eq!(
        send(&dp, ACK),
        Some(first),
        "no generation moved: the entry is trusted as it stands"
    );
    drop(lb::datapath::load(&dp.pins.path, &lb::datapath::MapSizes::default()).unwrap());
    assert_eq!(
        send(&dp, ACK),
        None,
        "a new generation: the flow finds its backend gone"
    );
    assert_eq!(dp.drops("backend-missing"), missing + 1);

    // The agent's own delete after that load still moves the generation
    // (read from the map, not remembered from before the load): a flow to
    // another backend leaves it once it is gone from the service.
    let (sport, second) = (42_101..42_200)
        .find_map(|sport| {
            let (rc, out) = dp.tc_ingress(&packets::tcp(
                CLIENT_MAC, EXT0_MAC, CLIENT_IP, vip, sport, 80, SYN, b"",
            ));
            let to = inspect(&out).daddr;
            (rc == TC_ACT_REDIRECT && to != first).then_some((sport, to))
        })
        .expect("a flow to another backend");
    let ack = packets::tcp(CLIENT_MAC, EXT0_MAC, CLIENT_IP, vip, sport, 80, ACK, b"");
    assert_eq!(inspect(&dp.tc_ingress(&ack).1).daddr, second);
    let without = SERVICES
        .replace(&format!("{{address: {second}}}, "), "")
        .replace(&format!(", {{address: {second}}}"), "");
    assert_ne!(without, SERVICES);
    let missing = dp.drops("backend-missing");
    dp.apply(&parse_with(&without, &node_context()).unwrap());
    // It chooses again in the new table: a live backend, or the slot of the
    // one deleted by hand above (still in the agent's view): dropped.
    let (rc, out) = dp.tc_ingress(&ack);
    if rc == TC_ACT_REDIRECT {
        let to = inspect(&out).daddr;
        assert!(to != second && to != first, "the flow went to {to}");
    } else {
        assert_eq!(rc, TC_ACT_SHOT);
        assert_eq!(dp.drops("backend-missing"), missing + 1);
    }
}

/// Per-service table sizes on the real programs: every new flow takes the
/// slot `flow_hash % M` of its service's table, M being the size its master
/// names (251, then 131071, then 509: a program using the agent-wide 16381
/// would drop most flows to the small tables, slots past their end, and send
/// flows to other backends in the big one), and a master written by an
/// older agent (size 0) indexes with CFG_MAGLEV_M (set to 251 over a table of
/// 509, so "the table's length" and "CFG_MAGLEV_M" pick differently). The
/// write order of a size change is the reconcile tests' (FakeMaps records
/// any moment a master's size passes its table): here packets come after
/// each change.
#[test]
fn a_maglev_service_with_its_own_table_size_picks_flow_hash_mod_that_size_as_it_grows_and_shrinks()
{
    let mut dp = dataplane("np_maglev_m");
    let vip = ip("203.0.113.20");
    let ctx = node_context();
    let mut sport = 43_000u16;
    // 200 new flows; each must reach table[flow_hash % m] of the current
    // table. Returns how many of them another size `other` would have sent
    // elsewhere (or past the table's end).
    let check = |dp: &Dataplane, sport: &mut u16, len: usize, m: u32, other: u32| {
        let svc = service_id_at(dp, vip);
        let table = dp.reconciler.state().maglev[&svc].clone();
        assert_eq!(table.len(), len);
        let mut told_apart = 0;
        for _ in 0..200 {
            *sport += 1;
            let (rc, out) = dp.tc_ingress(&packets::tcp(
                CLIENT_MAC, EXT0_MAC, CLIENT_IP, vip, *sport, 80, SYN, b"",
            ));
            assert_eq!(rc, TC_ACT_REDIRECT, "M = {m}, port {sport}");
            let hash = flow_hash(
                u32::from_ne_bytes(CLIENT_IP.octets()),
                u32::from_ne_bytes(vip.octets()),
                sport.to_be(),
                80u16.to_be(),
                6,
            );
            let address = |slot: u32| {
                table
                    .get(slot as usize)
                    .map(|id| dp.reconciler.state().backends[id].address)
            };
            let expected = address(hash % m).unwrap();
            assert_eq!(
                std::net::IpAddr::V4(inspect(&out).daddr),
                expected,
                "M = {m}, port {sport}"
            );
            if address(hash % other) != Some(expected) {
                told_apart += 1;
            }
        }
        told_apart
    };
    let default = lb_common::maps::DEFAULT_MAGLEV_M; // the fixture's CFG_MAGLEV_M
    for m in [251u32, 131_071, 509] {
        let file = SERVICES.replace(
            "    algorithm: maglev\n",
            &format!("    algorithm: maglev\n    maglevTableSize: {m}\n"),
        );
        assert_ne!(file, SERVICES);
        dp.apply(&parse_with(&file, &ctx).unwrap());
        let apart = check(&dp, &mut sport, m as usize, m, default);
        assert!(
            apart > 0,
            "M = {m}: the flows tell M from the agent-wide size"
        );
    }

    // A master of an older agent: size 0, CFG_MAGLEV_M applies.
    let master = dp
        .reconciler
        .state()
        .frontends()
        .find(|(k, _)| k.address == std::net::IpAddr::V4(vip))
        .map(|(k, v)| (*k, *v))
        .unwrap();
    dp.reconciler
        .maps_mut()
        .apply(&MapOp::UpsertService(
            master.0,
            ServiceValue {
                maglev_size: 0,
                ..master.1
            },
        ))
        .unwrap();
    dp.config(lb_common::config::CFG_MAGLEV_M, 251);
    let apart = check(&dp, &mut sport, 509, 251, 509);
    assert!(
        apart > 0,
        "the flows tell CFG_MAGLEV_M from the table's length"
    );
}

/// Recomputes the IPv4 header checksum after a test edited the header.
fn fix_ip_checksum(frame: &mut [u8]) {
    frame[24] = 0;
    frame[25] = 0;
    let mut sum: u32 = 0;
    for i in (14..34).step_by(2) {
        sum += u32::from(u16::from_be_bytes([frame[i], frame[i + 1]]));
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
    use lb::maps::SvcKey;
    let mut dp = dataplane("np_drop_reasons");
    let extra = r#"
services:
  - name: unrouted
    type: NodePort
    clusterIPs: [10.96.0.9]
    ports: [{port: 80, targetPort: 8080, nodePort: 30009}]
    backends: [{address: 10.99.0.10}]
"#;
    dp.apply_with_extra(extra);

    // One SNAT port: the first flow takes it, the second finds none while
    // the first lives.
    dp.config(lb_common::config::CFG_SNAT_PORT_MIN, 61000);
    dp.config(lb_common::config::CFG_SNAT_PORT_MAX, 61000);
    assert_eq!(dp.tc_ingress(&syn_to(30002, 41000)).0, TC_ACT_REDIRECT);
    assert_eq!(dp.tc_ingress(&syn_to(30002, 41001)).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("snat-ports-exhausted"), 1);

    // A backend the node has no route to.
    assert_eq!(dp.tc_ingress(&syn_to(30009, 41002)).0, TC_ACT_SHOT);
    assert_eq!(dp.drops("fib-lookup-failed"), 1);

    // A Maglev service whose table is missing (an agent bug or race).
    let web = service_id_at(&dp, ip("203.0.113.20"));
    dp.reconciler
        .maps_mut()
        .apply(&MapOp::DeleteMaglev(web))
        .unwrap();
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

/// A TCP segment to the "narrow" NodePort (its backend sits behind a
/// 1400-byte path) carrying `payload` bytes, DF set or not.
fn big_segment(payload: usize, df: bool) -> Vec<u8> {
    let mut p = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        NODE_IP,
        41700,
        30006,
        ACK,
        &vec![0x5a; payload],
    );
    p[14 + 6] = if df { 0x40 } else { 0 };
    fix_ip_checksum(&mut p);
    p
}

/// What a checksum offload would write into `frame` (CHECKSUM_PARTIAL with
/// the original TCP/UDP header's csum_start and csum_offset): the fold of
/// the sum from `start` to the end, as skb_checksum_help computes it.
fn offload_word(frame: &[u8], start: usize) -> u16 {
    packets::internet_checksum(&frame[start..])
}

/// What only IPv4 has of "too big" (the shared part, the error and its
/// quote, runs for both families in nodeport_both_families.rs): the error
/// is right even where the skb still asks for a TCP checksum offload, and
/// a packet without DF, which nobody asked to be told about, is dropped
/// and counted. XDP leaves both to tc.
#[test]
fn an_ipv4_frag_needed_is_offload_proof_and_a_packet_without_df_is_dropped_counted() {
    let dp = dataplane("np_too_big");
    let syn = packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 41700, 30006, SYN, b"",
    );
    assert_eq!(dp.tc_ingress(&syn).0, TC_ACT_REDIRECT);
    let big = big_segment(1361, true);
    let (rc, out) = dp.tc_ingress(&big);
    assert_eq!(rc, TC_ACT_REDIRECT, "the error goes back out of ext0");
    let v = packets::inspect_icmp(&out);
    assert_eq!((v.ty, v.code), (3, 4));
    assert_eq!(
        &v.rest[..2],
        &[0, 0],
        "RFC 1191: the unused half stays zero"
    );
    assert_eq!(
        &v.quoted_l4[4..8],
        &big[38..42],
        "the quoted sequence number"
    );
    // Right even if the skb still asks for a TCP checksum offload: the
    // offload would rewrite the word at csum_start + 16 with itself.
    assert_eq!(
        offload_word(&out, 34),
        u16::from_be_bytes([out[50], out[51]]),
        "offload-proof"
    );
    assert_eq!(dp.drops("frag-needed"), 1);
    assert_eq!(dp.counter(lb_common::config::CNT_ICMP_SENT), 1);

    // Without DF there is nobody to tell: dropped, counted.
    let no_df = big_segment(1361, false);
    assert_eq!(dp.xdp(&no_df).0, XDP_PASS, "XDP hands it to tc");
    let (rc, _) = dp.tc_ingress(&no_df);
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(dp.drops("frag-needed"), 2);
    assert_eq!(dp.counter(lb_common::config::CNT_ICMP_SENT), 1);
}

/// The same for UDP: the offload's word is then the ICMP checksum itself.
#[test]
fn a_udp_datagram_too_big_gets_an_offload_proof_frag_needed() {
    let dp = dataplane("np_too_big_udp");
    let extra = r#"
services:
  - name: narrow-dns
    type: NodePort
    clusterIPs: [10.96.0.7]
    ports: [{port: 53, protocol: UDP, targetPort: 5353, nodePort: 30007}]
    backends: [{address: 10.244.3.20}]
"#;
    let mut dp = dp;
    dp.apply_with_extra(extra);
    let mut dgram = packets::udp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        NODE_IP,
        41800,
        30007,
        &[1u8; 1450],
    );
    dgram[14 + 6] = 0x40;
    fix_ip_checksum(&mut dgram);
    let (rc, out) = dp.tc_ingress(&dgram);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = packets::inspect_icmp(&out);
    assert_eq!((v.ty, v.code), (3, 4));
    assert_eq!(&v.quoted_l4[..4], &dgram[34..38]);
    assert_eq!(
        offload_word(&out, 34),
        u16::from_be_bytes([out[40], out[41]]),
        "offload-proof"
    );
}

/// Spoofed ICMP errors aimed at a translated flow (docs/security.md,
/// "Hostile input on the wire"): an error is translated only when it quotes
/// the flow's whole tuple and is addressed to the quoted source. One that
/// quotes another backend address, another backend port, another
/// protocol, or comes to another address is left to the stack untouched,
/// counted nowhere, and the flow still answers its client. As with
/// netfilter's NAT, the error's own source is not checked: an error from
/// any host that quotes the flow exactly is translated, its source kept.
#[test]
fn a_spoofed_icmp_error_is_translated_only_when_it_quotes_the_flows_whole_tuple() {
    let dp = dataplane("np_icmp_spoof");
    let (rc, sent) = dp.tc_ingress(&syn_to(30002, 42200));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let snat_port = inspect(&sent).sport;
    let quote = |edit: &dyn Fn(&mut Vec<u8>)| {
        // The IP header and 8 bytes of what node A sent to the backend,
        // edited, with the quoted header's checksum made right again.
        let mut frame = sent[..14 + 28].to_vec();
        edit(&mut frame);
        fix_ip_checksum(&mut frame);
        frame[14..].to_vec()
    };
    let error = |from: Ipv4Addr, to: Ipv4Addr, quoted: &[u8]| {
        packets::icmp_error(NODE_B_MAC, EXT0_MAC, from, to, 3, 4, [0, 0, 5, 20], quoted)
    };
    let translated = dp.counter(lb_common::config::CNT_ICMP_TRANSLATED);
    let spoofed: [(&str, Vec<u8>); 5] = [
        (
            "another backend address",
            error(
                NODE_B_IP,
                NODE_IP,
                &quote(&|f| f[30..34].copy_from_slice(&[10, 244, 2, 99])),
            ),
        ),
        (
            "another backend port",
            error(
                NODE_B_IP,
                NODE_IP,
                &quote(&|f| f[36..38].copy_from_slice(&8081u16.to_be_bytes())),
            ),
        ),
        (
            "UDP, not TCP",
            error(NODE_B_IP, NODE_IP, &quote(&|f| f[23] = 17)),
        ),
        (
            "another SNAT port",
            error(
                NODE_B_IP,
                NODE_IP,
                &quote(&|f| f[34..36].copy_from_slice(&snat_port.wrapping_add(1).to_be_bytes())),
            ),
        ),
        (
            "addressed to another host than the quoted source",
            error(NODE_B_IP, ip("192.168.50.99"), &quote(&|_| {})),
        ),
    ];
    for (what, err) in &spoofed {
        let (rc, out) = dp.tc_ingress(err);
        assert_eq!(
            (rc, &out),
            (TC_ACT_OK, err),
            "{what}: left to the stack untouched"
        );
        let (rc, _) = dp.xdp(err);
        assert_eq!(rc, XDP_PASS, "{what}: XDP passes it too");
    }
    assert_eq!(
        dp.counter(lb_common::config::CNT_ICMP_TRANSLATED),
        translated,
        "none was translated"
    );
    // The flow is untouched: the backend's reply still reaches the client.
    let (rc, out) = dp.tc_ingress(&from_backend_on_node_b(snat_port, SYN | ACK));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect(&out);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport),
        (NODE_IP, 30002, CLIENT_IP, 42200)
    );

    // The exact quote from a host that is no router on the path: translated
    // (the source is not checked), its source kept.
    let stranger = ip("198.51.100.7");
    let (rc, out) = dp.tc_ingress(&error(stranger, NODE_IP, &quote(&|_| {})));
    assert_eq!(rc, TC_ACT_REDIRECT, "toward the client");
    let v = packets::inspect_icmp(&out);
    assert_eq!((v.saddr, v.daddr), (stranger, CLIENT_IP));
    assert_eq!(
        dp.counter(lb_common::config::CNT_ICMP_TRANSLATED),
        translated + 1
    );
}

/// Cilium's ct_reset_closing: a SYN on the tuple of a flow that is closing
/// starts a new flow (a new choice, no closing state inherited).
#[test]
fn a_syn_on_a_closing_flows_tuple_starts_a_new_flow() {
    let dp = dataplane("np_reopen");
    let key = Ct4Key::new(
        u32::from_ne_bytes(CLIENT_IP.octets()),
        u32::from_ne_bytes(NODE_IP.octets()),
        42300u16.to_be(),
        30002u16.to_be(),
        6,
        CT_SERVICE,
    );
    assert_eq!(dp.tc_ingress(&syn_to(30002, 42300)).0, TC_ACT_REDIRECT);
    let fin = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        NODE_IP,
        42300,
        30002,
        FIN | ACK,
        b"",
    );
    assert_eq!(dp.tc_ingress(&fin).0, TC_ACT_REDIRECT);
    assert_ne!(dp.ct(&key).unwrap().flags & CT_F_CLOSING, 0, "closing");
    assert_eq!(dp.tc_ingress(&syn_to(30002, 42300)).0, TC_ACT_REDIRECT);
    let entry = dp.ct(&key).unwrap();
    assert_eq!(entry.flags & CT_F_CLOSING, 0, "a new flow, not closing");
    assert_eq!(dp.counter(lb_common::config::CNT_CT_REOPENED), 1);
}

/// With one SNAT port, a second flow finds it taken while the first lives;
/// once the first has closed both ways and gone quiet for a second, the
/// port goes to the new flow.
#[test]
fn a_closed_flows_snat_port_goes_to_a_new_flow_after_a_quiet_second() {
    let dp = dataplane("np_snat_reuse");
    dp.config(lb_common::config::CFG_SNAT_PORT_MIN, 61000);
    dp.config(lb_common::config::CFG_SNAT_PORT_MAX, 61000);
    let (rc, out) = dp.tc_ingress(&syn_to(30002, 42400));
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(inspect(&out).sport, 61000);
    assert_eq!(dp.tc_ingress(&syn_to(30002, 42401)).0, TC_ACT_SHOT);
    // Both sides close: the client's FIN, the backend's FIN to our port.
    let fin = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        NODE_IP,
        42400,
        30002,
        FIN | ACK,
        b"",
    );
    assert_eq!(dp.tc_ingress(&fin).0, TC_ACT_REDIRECT);
    let back_fin = from_backend_on_node_b(61000, FIN | ACK);
    assert_eq!(dp.tc_ingress(&back_fin).0, TC_ACT_REDIRECT);
    assert_eq!(
        dp.tc_ingress(&syn_to(30002, 42401)).0,
        TC_ACT_SHOT,
        "closed, but its last packets may still be in flight"
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (rc, out) = dp.tc_ingress(&syn_to(30002, 42401));
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(inspect(&out).sport, 61000);
    assert_eq!(dp.counter(lb_common::config::CNT_SNAT_REUSED), 1);
}

/// sessionAffinity: ClientIP on the packet path (kube-proxy's per-source-IP
/// "recent" match): every new flow from one client address goes to the
/// backend that client got first, whatever its ports, on tc and XDP alike;
/// other clients are spread over the backends, and without affinity one
/// client's flows are spread too.
#[test]
fn session_affinity_keeps_a_clients_new_flows_on_one_backend_by_source_address() {
    let extra = r#"
services:
  - name: sticky
    type: NodePort
    clusterIPs: [10.96.0.13]
    sessionAffinity: ClientIP
    ports: [{port: 80, targetPort: 8080, nodePort: 30013}]
    backends: [{address: 10.244.1.61, local: true}, {address: 10.244.1.62, local: true}, {address: 10.244.1.63, local: true}]
  - name: loose
    type: NodePort
    clusterIPs: [10.96.0.14]
    ports: [{port: 80, targetPort: 8080, nodePort: 30014}]
    backends: [{address: 10.244.1.71, local: true}, {address: 10.244.1.72, local: true}, {address: 10.244.1.73, local: true}]
"#;
    let mut dp = dataplane("np_affinity");
    dp.apply_with_extra(extra);
    let syn_from = |client: Ipv4Addr, sport: u16, dport: u16| {
        packets::tcp(
            CLIENT_MAC, EXT0_MAC, client, NODE_IP, sport, dport, SYN, b"",
        )
    };
    // Local backends: DNAT, then the stack delivers (tc OK, XDP PASS).
    let backend_of = |delivered: bool, out: &[u8]| -> Ipv4Addr {
        assert!(delivered, "not handed to the stack");
        inspect(out).daddr
    };
    let mut sticky = std::collections::BTreeSet::new();
    for sport in 41000..41030 {
        let (rc, out) = dp.tc_ingress(&syn_from(CLIENT_IP, sport, 30013));
        sticky.insert(backend_of(rc == TC_ACT_OK, &out));
    }
    for sport in 41030..41040 {
        let (rc, out) = dp.xdp(&syn_from(CLIENT_IP, sport, 30013));
        sticky.insert(backend_of(rc == XDP_PASS, &out));
    }
    assert_eq!(sticky.len(), 1, "one client, one backend: {sticky:?}");

    let mut others = std::collections::BTreeSet::new();
    for host in 10..40u8 {
        let (rc, out) = dp.tc_ingress(&syn_from(Ipv4Addr::new(192, 168, 50, host), 42000, 30013));
        others.insert(backend_of(rc == TC_ACT_OK, &out));
    }
    assert!(others.len() >= 2, "other clients are spread: {others:?}");

    let mut loose = std::collections::BTreeSet::new();
    for sport in 43000..43030 {
        let (rc, out) = dp.tc_ingress(&syn_from(CLIENT_IP, sport, 30014));
        loose.insert(backend_of(rc == TC_ACT_OK, &out));
    }
    assert!(
        loose.len() >= 2,
        "without affinity a client's flows spread: {loose:?}"
    );
}

/// Graceful drain: a backend that stops being ready (Kubernetes: not ready,
/// or terminating and not serving; the services file: `state: maintenance`)
/// keeps the flows it has (conntrack) while new flows go elsewhere, and
/// `lbctl service list` shows it as maintenance; once it is gone from the
/// service it leaves the maps.
#[test]
fn a_backend_in_maintenance_keeps_its_established_flows_and_takes_no_new_ones() {
    let drained = |x: &str, y: &str, x_state: Option<&str>| {
        let mut backends = vec![format!("{{address: {y}, local: true}}")];
        if let Some(state) = x_state {
            backends.push(format!("{{address: {x}, local: true, state: {state}}}"));
        }
        format!(
            "services:\n  - name: drain\n    type: NodePort\n    clusterIPs: [10.96.0.15]\n    ports: [{{port: 80, targetPort: 8080, nodePort: 30015}}]\n    backends: [{}]\n",
            backends.join(", ")
        )
    };
    let (a, b) = ("10.244.1.81", "10.244.1.82");
    let mut dp = dataplane("np_drain");
    dp.apply_with_extra(&drained(a, b, Some("active")));
    let syn = syn_to(30015, 44000);
    let (rc, out) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_OK);
    let first = inspect(&out).daddr;
    let (x, y) = if first == ip(a) { (a, b) } else { (b, a) };
    let ack = packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 44000, 30015, ACK, b"data",
    );

    // The flow's backend turns not ready.
    dp.apply_with_extra(&drained(x, y, Some("maintenance")));
    let rows = lb::cli::service_list::rows(dp.reconciler.state());
    let row = rows
        .iter()
        .find(|r| r.frontend.port == 30015)
        .expect("the NodePort frontend");
    let states: Vec<(String, &str)> = row
        .backends
        .iter()
        .map(|b| (b.endpoint.address.clone(), b.state))
        .collect();
    assert!(
        states.contains(&(x.to_string(), "maintenance"))
            && states.contains(&(y.to_string(), "active")),
        "{states:?}"
    );
    for _ in 0..5 {
        let (rc, out) = dp.tc_ingress(&ack);
        assert_eq!(rc, TC_ACT_OK);
        assert_eq!(
            inspect(&out).daddr,
            ip(x),
            "the established flow keeps its backend"
        );
    }
    for sport in 44001..44021 {
        let (rc, out) = dp.tc_ingress(&syn_to(30015, sport));
        assert_eq!(rc, TC_ACT_OK);
        assert_eq!(inspect(&out).daddr, ip(y), "new flows never choose it");
    }

    // Gone from the service: gone from the maps.
    dp.apply_with_extra(&drained(x, y, None));
    assert!(
        !dp.reconciler
            .state()
            .backends
            .values()
            .any(|e| e.address == x.parse::<std::net::IpAddr>().unwrap()),
        "a removed backend stays in LB4_BACKENDS"
    );
}

/// The early exit lets a packet go when its port is outside the SNAT range
/// and no frontend's bit is set; conntrack outlives a restart, so a flow
/// SNATed under an older --snat-port-range must keep its replies: every
/// range used since install counts (CFG_SNAT_PORTS_EVER), and without that
/// record the reply would pass untranslated.
#[test]
fn a_reply_to_a_port_of_the_snat_range_before_a_restart_is_still_translated() {
    use lb_common::config::{
        snat_ports_ever, CFG_SNAT_PORTS_EVER, CFG_SNAT_PORT_MAX, CFG_SNAT_PORT_MIN,
    };
    let dp = dataplane("snat_range_change");
    let (rc, out) = dp.tc_ingress(&packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40011, 30002, SYN, b"",
    ));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let snat_port = inspect(&out).sport;
    assert!((61000..=65535).contains(&snat_port));
    let reply = from_backend_on_node_b(snat_port, SYN | ACK);

    // A restart with another range, as the agent records it.
    dp.config(CFG_SNAT_PORTS_EVER, snat_ports_ever(0, 61000, 65535));
    dp.config(
        CFG_SNAT_PORTS_EVER,
        snat_ports_ever(snat_ports_ever(0, 61000, 65535), 50000, 50999),
    );
    dp.config(CFG_SNAT_PORT_MIN, 50000);
    dp.config(CFG_SNAT_PORT_MAX, 50999);
    let (rc, out) = dp.tc_ingress(&reply);
    assert_eq!(rc, TC_ACT_REDIRECT, "the old flow's reply is still ours");
    let v = inspect(&out);
    assert_eq!((v.daddr, v.dport), (CLIENT_IP, 40011));

    // Without the record the early exit would let it go.
    dp.config(CFG_SNAT_PORTS_EVER, 0);
    assert_eq!(dp.tc_ingress(&reply), (TC_ACT_OK, reply.clone()));
}

/// sessionAffinity is per service port, not per frontend (kube-proxy keeps
/// one "recent" list per service port): a client that reached a backend
/// through the LoadBalancer address reaches the same one through the
/// NodePort, for every one of 30 clients (by chance: (1/3)^30).
#[test]
fn session_affinity_is_shared_by_the_load_balancer_address_and_the_nodeport_of_a_port() {
    let extra = r#"
services:
  - name: sticky-lb
    type: LoadBalancer
    clusterIPs: [10.96.0.15]
    loadBalancerIPs: [203.0.113.50]
    sessionAffinity: ClientIP
    ports: [{port: 80, targetPort: 8080, nodePort: 30015}]
    backends: [{address: 10.244.1.81, local: true}, {address: 10.244.1.82, local: true}, {address: 10.244.1.83, local: true}]
"#;
    let mut dp = dataplane("np_affinity_shared");
    dp.apply_with_extra(extra);
    let mut spread = std::collections::BTreeSet::new();
    for host in 10..40u8 {
        let client = Ipv4Addr::new(192, 168, 50, host);
        let via_lb = packets::tcp(
            CLIENT_MAC,
            EXT0_MAC,
            client,
            ip("203.0.113.50"),
            44000,
            80,
            SYN,
            b"",
        );
        let (rc, out) = dp.tc_ingress(&via_lb);
        assert_eq!(rc, TC_ACT_OK);
        let first = inspect(&out).daddr;
        let via_nodeport = packets::tcp(
            CLIENT_MAC, EXT0_MAC, client, NODE_IP, 44001, 30015, SYN, b"",
        );
        let (rc, out) = dp.tc_ingress(&via_nodeport);
        assert_eq!(rc, TC_ACT_OK);
        assert_eq!(inspect(&out).daddr, first, "client {client}: same backend");
        spread.insert(first);
    }
    assert!(spread.len() >= 2, "clients are still spread: {spread:?}");
}

/// A localhost NodePort (127.0.0.1:<nodePort>, which the node's own
/// processes reach through the socket hooks) is never served to a packet:
/// one arriving from outside for 127.0.0.1 passes tc and XDP untouched, for
/// the stack to drop as a martian (what kube-proxy's route_localnet let
/// through, CVE-2020-8558), while the same NodePort on the node's address
/// is forwarded.
#[test]
fn a_packet_to_a_localhost_nodeport_is_left_to_the_stack_by_tc_and_xdp() {
    let mut dp = Dataplane::new(&unique("np_localhost"));
    let ctx = lb::source::file::parse::FileContext {
        nodeport_addresses: vec![NODE_IP.into(), Ipv4Addr::LOCALHOST.into()],
        ..Default::default()
    };
    dp.apply(&parse_with(SERVICES, &ctx).expect("services file"));
    let flags = dp
        .reconciler
        .state()
        .frontends()
        .find(|(k, _)| k.address == std::net::IpAddr::V4(Ipv4Addr::LOCALHOST) && k.port == 30002)
        .expect("a frontend at 127.0.0.1:30002")
        .1
        .flags;
    assert_ne!(flags & lb_common::service::SVC_FLAG_HOST_LOOPBACK, 0);
    let to_loopback = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        Ipv4Addr::LOCALHOST,
        40100,
        30002,
        SYN,
        b"",
    );
    let (rc, out) = dp.tc_ingress(&to_loopback);
    assert_eq!((rc, &out), (TC_ACT_OK, &to_loopback), "tc");
    let (rc, out) = dp.xdp(&to_loopback);
    assert_eq!((rc, &out), (XDP_PASS, &to_loopback), "XDP");
    assert_eq!(dp.tc_ingress(&syn_to(30002, 40101)).0, TC_ACT_REDIRECT);
}
