//! The per-CPU route cache of the tc and XDP programs (lb-ebpf
//! `packet::route_cache`): an established flow's packets to or from a
//! remote backend skip the FIB lookup, and the cache never sends a packet
//! where a lookup would not. BPF_PROG_TEST_RUN runs on the calling thread's
//! CPU, so each test pins its thread to one CPU: the cache is per CPU.
use std::time::{Duration, Instant};

use lb_common::config::CNT_FIB_LOOKUPS;
use lb_testkit::{
    dataplane::*,
    packets::{self, inspect, ACK, SYN},
    unique,
};

const NODE_C_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x04];

fn dataplane(test: &str) -> Dataplane {
    pin_to_this_cpu();
    Dataplane::with_services(&unique(test), SERVICES)
}

/// Keeps the calling thread on the CPU it runs on now.
fn pin_to_this_cpu() {
    // SAFETY: plain libc calls on a zeroed cpu_set_t of the right size.
    unsafe {
        let cpu = libc::sched_getcpu();
        assert!(cpu >= 0, "sched_getcpu");
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity"
        );
    }
}

/// Node C, 192.168.50.4 (`NODE_C_MAC`), a neighbour on ext0.
fn add_node_c(dp: &Dataplane) {
    dp.netns.ip(&[
        "neigh",
        "add",
        "192.168.50.4",
        "lladdr",
        "02:00:00:00:00:04",
        "dev",
        "ext0",
        "nud",
        "permanent",
    ]);
}

/// A TCP packet from the client to NodePort `dport` with `payload` bytes.
fn to_nodeport(dport: u16, sport: u16, flags: u8, payload: usize) -> Vec<u8> {
    packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        NODE_IP,
        sport,
        dport,
        flags,
        &vec![0x5a; payload],
    )
}

/// The "narrow" NodePort's backend sits behind a route with a 1400-byte
/// MTU. After the flow's first packet, a thousand full-size packets (1400
/// bytes of IP: the MTU the kernel reported with the route, not the first
/// packet's size) take the cached route: at most one more lookup, when the
/// clock's epoch turns during the loop. A packet bigger than the route's
/// MTU still goes to the FIB and gets "fragmentation needed" back.
#[test]
fn a_flows_packets_skip_the_fib_lookup_up_to_the_routes_mtu_and_a_bigger_one_still_gets_frag_needed(
) {
    let dp = dataplane("rc_mtu");
    let before = dp.counter(CNT_FIB_LOOKUPS);
    let (rc, out) = dp.tc_ingress(&to_nodeport(30006, 42000, SYN, 0));
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(inspect(&out).eth_dst, NODE_B_MAC);
    assert_eq!(
        dp.counter(CNT_FIB_LOOKUPS),
        before + 1,
        "the first packet looks the route up"
    );

    let full = to_nodeport(30006, 42000, ACK, 1360);
    assert_eq!(full.len() - 14, 1400);
    // The SYN's lookup kept the route's MTU (1400), not the SYN's own 40
    // bytes: a fresh flow's first full-size packet takes no lookup. (Tried
    // on up to three flows: the clock's epoch may turn between the two.)
    let fits_at_once = (0..3u16).any(|i| {
        let before = dp.counter(CNT_FIB_LOOKUPS);
        dp.tc_ingress(&to_nodeport(30006, 42010 + i, SYN, 0));
        dp.tc_ingress(&to_nodeport(30006, 42010 + i, ACK, 1360));
        dp.counter(CNT_FIB_LOOKUPS) - before == 1
    });
    assert!(
        fits_at_once,
        "a full-size packet after the SYN looked the route up again"
    );
    let after_first = dp.counter(CNT_FIB_LOOKUPS);
    for _ in 0..1000 {
        let (rc, out) = dp.tc_ingress(&full);
        assert_eq!(rc, TC_ACT_REDIRECT);
        let v = inspect(&out);
        assert_eq!((v.eth_dst, v.eth_src), (NODE_B_MAC, EXT0_MAC));
        let (rc, out) = dp.xdp(&full);
        assert_eq!(rc, XDP_TX);
        let v = inspect(&out);
        assert_eq!((v.eth_dst, v.eth_src), (NODE_B_MAC, EXT0_MAC));
    }
    let lookups = dp.counter(CNT_FIB_LOOKUPS) - after_first;
    assert!(
        lookups <= 2,
        "2000 packets of an established flow took {lookups} FIB lookups"
    );

    // One byte more than the route takes: the FIB answers, not the cache.
    let mut big = to_nodeport(30006, 42000, ACK, 1361);
    big[14 + 6] = 0x40; // DF
    let sum = packets::internet_checksum(&{
        let mut h = big[14..34].to_vec();
        h[10] = 0;
        h[11] = 0;
        h
    });
    big[24..26].copy_from_slice(&sum.to_be_bytes());
    let (rc, out) = dp.tc_ingress(&big);
    assert_eq!(rc, TC_ACT_REDIRECT, "the error goes back to the client");
    let v = packets::inspect_icmp(&out);
    assert_eq!((v.ty, v.code), (3, 4), "fragmentation needed");
    assert_eq!(u16::from_be_bytes([v.rest[2], v.rest[3]]), 1400);
}

/// A neighbour that changes its MAC (node B replaced, say) is seen by a
/// flow whose route is cached by the end of the cache's epoch (2^30 ns,
/// 1.07 s): at most that late, even when the change lands just after a
/// lookup.
#[test]
fn a_neighbour_change_reaches_a_cached_flow_within_one_epoch() {
    let dp = dataplane("rc_neigh");
    let (rc, out) = dp.tc_ingress(&to_nodeport(30002, 42100, SYN, 0));
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(inspect(&out).eth_dst, NODE_B_MAC);
    let ack = to_nodeport(30002, 42100, ACK, 100);
    assert_eq!(inspect(&dp.tc_ingress(&ack).1).eth_dst, NODE_B_MAC);

    let new_mac = [0x02, 0, 0, 0, 0, 0x33];
    dp.netns.ip(&[
        "neigh",
        "replace",
        "192.168.50.3",
        "lladdr",
        "02:00:00:00:00:33",
        "dev",
        "ext0",
        "nud",
        "permanent",
    ]);
    let changed = Instant::now();
    let seen = loop {
        let (rc, out) = dp.tc_ingress(&ack);
        assert_eq!(rc, TC_ACT_REDIRECT);
        let mac = inspect(&out).eth_dst;
        if mac == new_mac {
            break changed.elapsed();
        }
        assert_eq!(mac, NODE_B_MAC, "the old MAC or the new one, nothing else");
        assert!(
            changed.elapsed() < Duration::from_secs(4),
            "the flow still goes to the old MAC 4 s after the change"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        seen < Duration::from_millis(1300),
        "the new MAC took {seen:?} to reach the flow"
    );
}

/// The cache is direct-mapped: flows share slots. An entry is used only
/// for the flow it was made for. Replies of 64 SNAT flows (routed to the
/// client) are cached, then 2 000 new flows to node B take slots (each of
/// the 1 024 is hit with a chance of 86%, so some of the replies' own);
/// every reply still goes to the client.
#[test]
fn a_cached_route_is_used_only_by_its_own_flow_when_others_take_its_slot() {
    let dp = dataplane("rc_slots");
    let mut replies = Vec::new();
    for i in 0..64u16 {
        let (rc, out) = dp.tc_ingress(&to_nodeport(30002, 43000 + i, SYN, 0));
        assert_eq!(rc, TC_ACT_REDIRECT);
        let snat_port = inspect(&out).sport;
        let reply = packets::tcp(
            NODE_B_MAC,
            EXT0_MAC,
            "10.244.2.10".parse().unwrap(),
            NODE_IP,
            8080,
            snat_port,
            SYN | ACK,
            b"",
        );
        let (rc, back) = dp.tc_ingress(&reply);
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(inspect(&back).eth_dst, CLIENT_MAC);
        replies.push((i, reply));
    }
    for i in 0..2000u16 {
        let (rc, out) = dp.tc_ingress(&to_nodeport(30002, 50000 + i, SYN, 0));
        assert_eq!(rc, TC_ACT_REDIRECT, "flow {i}");
        assert_eq!(inspect(&out).eth_dst, NODE_B_MAC);
    }
    for (i, reply) in &replies {
        for (program, expected, (rc, back)) in [
            ("tc", TC_ACT_REDIRECT, dp.tc_ingress(reply)),
            ("XDP", XDP_TX, dp.xdp(reply)),
        ] {
            assert_eq!(rc, expected, "{program}: reply {i} forwarded");
            let v = inspect(&back);
            assert_eq!(
                (v.daddr, v.dport, v.eth_dst),
                (CLIENT_IP, 43000 + i, CLIENT_MAC),
                "{program}: reply {i} goes back to the client"
            );
        }
    }
}

/// A flow's tuple bound to another backend within the cache's epoch (here:
/// its backend deleted, the flow picks the one left, on another node) is
/// routed to the new backend's node at once: the cache answers only for
/// the addresses it looked up.
#[test]
fn a_flow_whose_backend_moves_to_another_node_is_routed_there_at_once() {
    let mut dp = dataplane("rc_moved");
    // Node C holds the pods of 10.244.4.0/24.
    add_node_c(&dp);
    dp.netns.ip(&[
        "route",
        "add",
        "10.244.4.0/24",
        "via",
        "192.168.50.4",
        "dev",
        "ext0",
    ]);
    let moving = |backend: &str| {
        format!(
            "services:\n  - name: moving\n    type: NodePort\n    clusterIPs: [10.96.0.40]\n    \
             ports: [{{port: 80, targetPort: 8080, nodePort: 30010}}]\n    backends: [{{address: {backend}}}]\n"
        )
    };
    dp.apply_with_extra(&moving("10.244.2.50"));
    let ack = to_nodeport(30010, 42200, ACK, 100);
    for (rc, out) in [
        dp.tc_ingress(&to_nodeport(30010, 42200, SYN, 0)),
        dp.tc_ingress(&ack),
        dp.xdp(&ack),
    ] {
        assert!(rc == TC_ACT_REDIRECT || rc == XDP_TX, "forwarded: {rc}");
        let v = inspect(&out);
        assert_eq!(
            (v.daddr, v.eth_dst),
            ("10.244.2.50".parse().unwrap(), NODE_B_MAC)
        );
    }

    dp.apply_with_extra(&moving("10.244.4.50"));
    let (rc, out) = dp.tc_ingress(&ack);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = inspect(&out);
    assert_eq!(
        (v.daddr, v.eth_dst),
        ("10.244.4.50".parse().unwrap(), NODE_C_MAC),
        "tc: the new backend, through its own node"
    );
    let (rc, out) = dp.xdp(&ack);
    assert_eq!(rc, XDP_TX);
    let v = inspect(&out);
    assert_eq!(
        (v.daddr, v.eth_dst),
        ("10.244.4.50".parse().unwrap(), NODE_C_MAC),
        "XDP: the same"
    );
}

/// Routing can depend on the device a packet came in on (policy routing:
/// `ip rule add iif ...`). The same flow arriving on another device is
/// routed for that device, not from the answer cached for the first.
#[test]
fn a_cached_route_answers_only_for_the_device_the_packet_came_in_on() {
    let dp = dataplane("rc_iif");
    // Packets that come in on ext0's peer device use table 100, where the
    // pods of node B are reached through node C.
    add_node_c(&dp);
    for args in [
        &[
            "route",
            "add",
            "10.244.2.0/24",
            "via",
            "192.168.50.4",
            "dev",
            "ext0",
            "table",
            "100",
        ][..],
        &["rule", "add", "iif", "ext0p", "lookup", "100"][..],
    ] {
        dp.netns.ip(args);
    }
    let peer = lb::sys::netdev::ifindex("ext0p").expect("ext0p");
    let (rc, out) = dp.tc_ingress(&to_nodeport(30002, 42300, SYN, 0));
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(inspect(&out).eth_dst, NODE_B_MAC);
    let ack = to_nodeport(30002, 42300, ACK, 100);
    assert_eq!(inspect(&dp.tc_ingress(&ack).1).eth_dst, NODE_B_MAC);
    assert_eq!(inspect(&dp.xdp(&ack).1).eth_dst, NODE_B_MAC);

    let (rc, out) = dp.tc_ingress_on(peer, &ack);
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(
        inspect(&out).eth_dst,
        NODE_C_MAC,
        "tc: in on ext0p, routed by table 100"
    );
    let (_, out) = dp.xdp_on(peer, &ack);
    assert_eq!(inspect(&out).eth_dst, NODE_C_MAC, "XDP: the same");
    // And back on ext0: the main table again.
    assert_eq!(inspect(&dp.tc_ingress(&ack).1).eth_dst, NODE_B_MAC);
}
