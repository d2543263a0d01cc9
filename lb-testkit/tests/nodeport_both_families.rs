//! The north-south behaviours both address families share, on crafted
//! packets (BPF_PROG_TEST_RUN): one body per behaviour, run for IPv4 and
//! for IPv6 (`Family`), as the programs are one body over `family::Ip`. A
//! family differs only in what `Family` says: its addresses, its packet
//! builders and readers, its ICMP numbers, its DSR encoding. Checksums are
//! verified independently (etherparse computes them from scratch).
//!
//! What only one family has stays in nodeport_packets.rs (IPv4: fragments
//! followed, DF and frag-needed, affinity, maintenance, ...) and
//! nodeport_ipv6.rs (IPv6: fragments passed and counted, v4-mapped
//! sources, UDP without a checksum, ...).
use std::{
    fmt::Debug,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use lb::maps::convert::ip6_to_map;
use lb_common::{
    config::{CFG_FRONTEND_FILTER, CFG_LB_MODE, CNT_CT_CREATED, CNT_DSR_LEARNED, CNT_ICMP_SENT},
    conntrack::{CtKey, CtValue, CT_F_DSR, CT_F_SNAT, CT_REVERSE, CT_SERVICE},
    nodeport::{DSR_OPT_LEN, DSR_OPT_TYPE, MODE_DSR, MODE_HYBRID},
};
use lb_testkit::{
    dataplane::*,
    packets::{self, Mac, ACK, SYN},
    unique,
};

/// A packet as it came out of a program, whatever its family.
#[derive(Debug)]
struct Seen<A> {
    eth_dst: Mac,
    eth_src: Mac,
    saddr: A,
    daddr: A,
    sport: u16,
    dport: u16,
    /// TTL or hop limit.
    hops: u8,
    payload: Vec<u8>,
    /// The frontend a DSR option or header carries.
    dsr: Option<(A, u16)>,
}

/// An ICMP or ICMPv6 error as it came out of a program, its checksums
/// checked by the family's reader.
#[derive(Debug)]
struct IcmpSeen<A> {
    eth_dst: Mac,
    eth_src: Mac,
    saddr: A,
    daddr: A,
    ty: u8,
    code: u8,
    rest: [u8; 4],
    quoted: (A, A, u16, u16),
    /// The quoted bytes (after the ICMP header).
    quote: Vec<u8>,
}

/// A LoadBalancer with `loadBalancerSourceRanges` (`RANGES` in `yaml`)
/// and one node-local backend, added to a family's services.
struct Guarded {
    yaml: &'static str,
    lb: &'static str,
    backend: &'static str,
    node_port: u16,
    /// Ranges that hold: neither the client nor its network; its network;
    /// only the client; only another host of its network.
    ranges: [&'static str; 4],
}

/// What a test needs to know of an address family.
trait Family {
    type Addr: Copy + PartialEq + Debug + Into<IpAddr> + std::str::FromStr<Err: Debug>;
    /// The address as the conntrack map keeps it.
    type Words: Copy + PartialEq + Debug + Default;
    /// Tag prefix: the pin directories of the two runs differ.
    const TAG: &'static str;
    const SERVICES: &'static str;
    const NODE: Self::Addr;
    const CLIENT: Self::Addr;
    /// NodePorts: a node-local backend, a remote one, no endpoints.
    const NP_LOCAL: u16;
    const NP_REMOTE: u16;
    const NP_EMPTY: u16;
    const LOCAL_BACKEND: &'static str;
    const REMOTE_BACKEND: &'static str;
    /// The UDP LoadBalancer (port 53) and its backend (port 5353).
    const DNS_LB: &'static str;
    const DNS_BACKEND: &'static str;
    /// A TCP LoadBalancer on port 80 with Maglev, its three remote
    /// backends as `SERVICES` lists them, and an address to add a fourth.
    const WEB_LB: &'static str;
    const WEB_BACKENDS: [&'static str; 3];
    const WEB_EXTRA: &'static str;
    /// A NodePort whose backend sits behind a 1400-byte path.
    const NP_NARROW: u16;
    /// The IP header's length (no options, no extension headers).
    const IP_HEADER: usize;
    /// An address no frontend of `SERVICES` uses.
    const STRANGER: &'static str;
    /// What an error quotes at least: the IP header and 8 bytes.
    const QUOTE_MIN: usize;
    /// Bytes of the quote the program chooses: IPv4's quoted IP id (and so
    /// its header checksum) make a TCP error right even where the skb still
    /// asks for a checksum offload (packet/icmp.rs, `reply`).
    const QUOTE_CHOSEN: &'static [usize];
    /// (type, code) of port unreachable, of time exceeded, and of "too
    /// big" (IPv4's fragmentation needed with DF set, ICMPv6's packet too
    /// big).
    const PORT_UNREACHABLE: (u8, u8);
    const TIME_EXCEEDED: (u8, u8);
    const TOO_BIG: (u8, u8);
    /// The second node, a router on the path to a remote backend.
    const NODE_B: Self::Addr;
    const GUARDED: Guarded;
    /// How much of a packet a router or host quotes in its errors here:
    /// IPv4's traditional header and 8 bytes (RFC 792), IPv6's as much as
    /// fits (RFC 4443 §2.4(c): the whole of these small packets).
    const ERROR_QUOTE: usize;

    #[allow(clippy::too_many_arguments)]
    fn tcp(
        src: Mac,
        dst: Mac,
        saddr: Self::Addr,
        daddr: Self::Addr,
        sport: u16,
        dport: u16,
        flags: u8,
        payload: &[u8],
        hops: u8,
    ) -> Vec<u8>;
    fn udp(
        src: Mac,
        dst: Mac,
        saddr: Self::Addr,
        daddr: Self::Addr,
        sport: u16,
        dport: u16,
        payload: &[u8],
    ) -> Vec<u8>;
    /// `frame` (a TCP packet) with a DSR option or header naming `frontend`.
    fn with_dsr(frame: &[u8], frontend: Self::Addr, port: u16) -> Vec<u8>;
    /// An ICMP or ICMPv6 error message `(type, code)` quoting `quote`.
    #[allow(clippy::too_many_arguments)]
    fn icmp_error(
        src: Mac,
        dst: Mac,
        saddr: Self::Addr,
        daddr: Self::Addr,
        kind: (u8, u8),
        rest: [u8; 4],
        quote: &[u8],
    ) -> Vec<u8>;
    fn seen(frame: &[u8]) -> Seen<Self::Addr>;
    fn icmp(frame: &[u8]) -> IcmpSeen<Self::Addr>;
    fn words(a: Self::Addr) -> Self::Words;
    fn ct(dp: &Dataplane, key: &CtKey<Self::Words>) -> Option<CtValue<Self::Words>>;
    /// The 32 bits the frontend filter hashes for an address.
    fn filter_fold(a: Self::Addr) -> u32;
    /// The flow hash the programs pick a Maglev slot with (TCP; ports in
    /// host order).
    fn flow_hash(saddr: Self::Addr, daddr: Self::Addr, sport: u16, dport: u16) -> u32;
    /// A backend as the services file lists it.
    fn backend_entry(a: &str) -> String;
    /// `frame` marked "don't fragment" where the family has the bit (IPv6
    /// routers never fragment: nothing to mark).
    fn dont_fragment(frame: Vec<u8>) -> Vec<u8>;

    /// The first `QUOTE_MIN` bytes of `quote` equal the IP packet of
    /// `sent` (a frame), but for the bytes the program chooses.
    fn quotes(quote: &[u8], sent: &[u8]) -> bool {
        let mask = |b: &[u8]| -> Vec<u8> {
            let mut b = b[..Self::QUOTE_MIN].to_vec();
            for i in Self::QUOTE_CHOSEN {
                b[*i] = 0;
            }
            b
        };
        mask(quote) == mask(&sent[14..])
    }

    fn addr(s: &str) -> Self::Addr {
        s.parse().unwrap()
    }
    fn dataplane(test: &str) -> Dataplane {
        Dataplane::with_services(&unique(&format!("{}{test}", Self::TAG)), Self::SERVICES)
    }
    /// What an error about `frame` (as sent) quotes: its IP packet, cut
    /// at `ERROR_QUOTE`.
    fn quote_of(frame: &[u8]) -> &[u8] {
        &frame[14..frame.len().min(Self::ERROR_QUOTE.saturating_add(14))]
    }
    /// A client's TCP packet to this node.
    fn to_node(dport: u16, sport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
        Self::tcp(
            CLIENT_MAC,
            EXT0_MAC,
            Self::CLIENT,
            Self::NODE,
            sport,
            dport,
            flags,
            payload,
            64,
        )
    }
}

struct V4;
struct V6;

impl Family for V4 {
    type Addr = Ipv4Addr;
    type Words = u32;
    const TAG: &'static str = "f4";
    const SERVICES: &'static str = SERVICES;
    const NODE: Ipv4Addr = NODE_IP;
    const CLIENT: Ipv4Addr = CLIENT_IP;
    const NP_LOCAL: u16 = 30001;
    const NP_REMOTE: u16 = 30002;
    const NP_EMPTY: u16 = 30003;
    const LOCAL_BACKEND: &'static str = "10.244.1.10";
    const REMOTE_BACKEND: &'static str = "10.244.2.10";
    const DNS_LB: &'static str = "203.0.113.10";
    const DNS_BACKEND: &'static str = "10.244.2.20";
    const WEB_LB: &'static str = "203.0.113.20";
    const WEB_BACKENDS: [&'static str; 3] = ["10.244.2.31", "10.244.2.32", "10.244.2.33"];
    const WEB_EXTRA: &'static str = "10.244.2.34";
    const NP_NARROW: u16 = 30006;
    const IP_HEADER: usize = 20;
    const STRANGER: &'static str = "198.51.100.1";
    const QUOTE_MIN: usize = 28;
    const QUOTE_CHOSEN: &'static [usize] = &[4, 5, 10, 11];
    const PORT_UNREACHABLE: (u8, u8) = (3, 3);
    const TIME_EXCEEDED: (u8, u8) = (11, 0);
    const TOO_BIG: (u8, u8) = (3, 4);
    const NODE_B: Ipv4Addr = NODE_B_IP;
    const ERROR_QUOTE: usize = 28;
    const GUARDED: Guarded = Guarded {
        yaml: r#"
services:
  - name: guarded
    type: LoadBalancer
    clusterIPs: [10.96.0.12]
    loadBalancerIPs: [203.0.113.30]
    loadBalancerSourceRanges: [RANGES]
    ports: [{port: 80, targetPort: 8080, nodePort: 30012}]
    backends: [{address: 10.244.1.50, local: true}]
"#,
        lb: "203.0.113.30",
        backend: "10.244.1.50",
        node_port: 30012,
        // The client is 192.168.50.1.
        ranges: [
            "10.0.0.0/8, 192.168.60.0/24",
            "10.0.0.0/8, 192.168.50.0/24",
            "192.168.50.1/32",
            "192.168.50.2/32",
        ],
    };

    fn tcp(
        src: Mac,
        dst: Mac,
        saddr: Ipv4Addr,
        daddr: Ipv4Addr,
        sport: u16,
        dport: u16,
        flags: u8,
        payload: &[u8],
        hops: u8,
    ) -> Vec<u8> {
        let mut p = packets::tcp(src, dst, saddr, daddr, sport, dport, flags, payload);
        if hops != 64 {
            p[14 + 8] = hops;
            fix_ipv4_checksum(&mut p);
        }
        p
    }

    fn udp(
        src: Mac,
        dst: Mac,
        saddr: Ipv4Addr,
        daddr: Ipv4Addr,
        sport: u16,
        dport: u16,
        payload: &[u8],
    ) -> Vec<u8> {
        packets::udp(src, dst, saddr, daddr, sport, dport, payload)
    }

    fn icmp_error(
        src: Mac,
        dst: Mac,
        saddr: Ipv4Addr,
        daddr: Ipv4Addr,
        (ty, code): (u8, u8),
        rest: [u8; 4],
        quote: &[u8],
    ) -> Vec<u8> {
        packets::icmp_error(src, dst, saddr, daddr, ty, code, rest, quote)
    }

    /// The option after the 20-byte header: IHL 7, total length + 8.
    fn with_dsr(frame: &[u8], frontend: Ipv4Addr, port: u16) -> Vec<u8> {
        let mut p = frame.to_vec();
        let mut opt = vec![DSR_OPT_TYPE, DSR_OPT_LEN];
        opt.extend_from_slice(&port.to_be_bytes());
        opt.extend_from_slice(&frontend.octets());
        p.splice(34..34, opt);
        p[14] = 0x47;
        let total = u16::from_be_bytes([p[16], p[17]]) + 8;
        p[16..18].copy_from_slice(&total.to_be_bytes());
        fix_ipv4_checksum(&mut p);
        p
    }

    fn seen(frame: &[u8]) -> Seen<Ipv4Addr> {
        let v = packets::inspect(frame);
        assert_eq!(
            usize::from(v.ip.total_len),
            frame.len() - 14,
            "the total length follows the packet"
        );
        let dsr = (!v.options.is_empty()).then(|| {
            assert_eq!(v.options.len(), 8, "only the DSR option: {:?}", v.options);
            assert_eq!(&v.options[..2], &[DSR_OPT_TYPE, DSR_OPT_LEN]);
            let port = u16::from_be_bytes([v.options[2], v.options[3]]);
            let addr: [u8; 4] = v.options[4..8].try_into().unwrap();
            (Ipv4Addr::from(addr), port)
        });
        Seen {
            eth_dst: v.eth_dst,
            eth_src: v.eth_src,
            saddr: v.saddr,
            daddr: v.daddr,
            sport: v.sport,
            dport: v.dport,
            hops: v.ip.time_to_live,
            payload: v.payload,
            dsr,
        }
    }

    fn icmp(frame: &[u8]) -> IcmpSeen<Ipv4Addr> {
        let v = packets::inspect_icmp(frame);
        let l4 = v.quoted_l4;
        IcmpSeen {
            eth_dst: v.eth_dst,
            eth_src: v.eth_src,
            saddr: v.saddr,
            daddr: v.daddr,
            ty: v.ty,
            code: v.code,
            rest: v.rest,
            quoted: (
                Ipv4Addr::from(v.quoted.source),
                Ipv4Addr::from(v.quoted.destination),
                u16::from_be_bytes([l4[0], l4[1]]),
                u16::from_be_bytes([l4[2], l4[3]]),
            ),
            quote: frame[v.icmp_offset + 8..].to_vec(),
        }
    }

    fn words(a: Ipv4Addr) -> u32 {
        u32::from_ne_bytes(a.octets())
    }

    fn ct(dp: &Dataplane, key: &CtKey<u32>) -> Option<CtValue<u32>> {
        dp.ct(key)
    }

    fn flow_hash(saddr: Ipv4Addr, daddr: Ipv4Addr, sport: u16, dport: u16) -> u32 {
        lb_common::nodeport::flow_hash(
            u32::from_ne_bytes(saddr.octets()),
            u32::from_ne_bytes(daddr.octets()),
            sport.to_be(),
            dport.to_be(),
            6,
        )
    }
    fn backend_entry(a: &str) -> String {
        format!("{{address: {a}}}")
    }
    fn dont_fragment(mut frame: Vec<u8>) -> Vec<u8> {
        frame[14 + 6] |= 0x40;
        fix_ipv4_checksum(&mut frame);
        frame
    }
    fn filter_fold(a: Ipv4Addr) -> u32 {
        Self::words(a)
    }
}

impl Family for V6 {
    type Addr = Ipv6Addr;
    type Words = [u32; 4];
    const TAG: &'static str = "f6";
    const SERVICES: &'static str = SERVICES6;
    const NODE: Ipv6Addr = NODE_IP6;
    const CLIENT: Ipv6Addr = CLIENT_IP6;
    const NP_LOCAL: u16 = 31001;
    const NP_REMOTE: u16 = 31002;
    const NP_EMPTY: u16 = 31007;
    const LOCAL_BACKEND: &'static str = "fd00:244:1::10";
    const REMOTE_BACKEND: &'static str = "fd00:244:2::10";
    const DNS_LB: &'static str = "2001:db8:113::10";
    const DNS_BACKEND: &'static str = "fd00:244:2::20";
    const WEB_LB: &'static str = "2001:db8:113::20";
    const WEB_BACKENDS: [&'static str; 3] = ["fd00:244:2::31", "fd00:244:2::32", "fd00:244:2::33"];
    const WEB_EXTRA: &'static str = "fd00:244:2::34";
    const NP_NARROW: u16 = 31008;
    const IP_HEADER: usize = 40;
    const STRANGER: &'static str = "2001:db8:99::1";
    const QUOTE_MIN: usize = 48;
    const QUOTE_CHOSEN: &'static [usize] = &[];
    const PORT_UNREACHABLE: (u8, u8) = (1, 4);
    const TIME_EXCEEDED: (u8, u8) = (3, 0);
    const TOO_BIG: (u8, u8) = (2, 0);
    const NODE_B: Ipv6Addr = NODE_B_IP6;
    const ERROR_QUOTE: usize = usize::MAX;
    const GUARDED: Guarded = Guarded {
        yaml: r#"
services:
  - name: guarded-local6
    type: LoadBalancer
    clusterIPs: ["fd00:96::12"]
    loadBalancerIPs: ["2001:db8:113::31"]
    loadBalancerSourceRanges: [RANGES]
    ports: [{port: 80, targetPort: 8080, nodePort: 31012}]
    backends: [{address: "fd00:244:1::50", local: true}]
"#,
        lb: "2001:db8:113::31",
        backend: "fd00:244:1::50",
        node_port: 31012,
        // The client is fd00:50::1.
        ranges: [
            r#""2001:db8::/32", "fd00:60::/64""#,
            r#""2001:db8::/32", "fd00:50::/64""#,
            r#""fd00:50::1/128""#,
            r#""fd00:50::2/128""#,
        ],
    };

    fn tcp(
        src: Mac,
        dst: Mac,
        saddr: Ipv6Addr,
        daddr: Ipv6Addr,
        sport: u16,
        dport: u16,
        flags: u8,
        payload: &[u8],
        hops: u8,
    ) -> Vec<u8> {
        packets::tcp6_hop(src, dst, saddr, daddr, sport, dport, flags, payload, hops)
    }

    fn udp(
        src: Mac,
        dst: Mac,
        saddr: Ipv6Addr,
        daddr: Ipv6Addr,
        sport: u16,
        dport: u16,
        payload: &[u8],
    ) -> Vec<u8> {
        packets::udp6(src, dst, saddr, daddr, sport, dport, payload)
    }

    fn icmp_error(
        src: Mac,
        dst: Mac,
        saddr: Ipv6Addr,
        daddr: Ipv6Addr,
        (ty, code): (u8, u8),
        rest: [u8; 4],
        quote: &[u8],
    ) -> Vec<u8> {
        packets::icmp6_error(src, dst, saddr, daddr, ty, code, rest, quote)
    }

    /// A Destination Options header (next header 60) right after the IPv6
    /// header: type 0x1b, port, two bytes of padding, address.
    fn with_dsr(frame: &[u8], frontend: Ipv6Addr, port: u16) -> Vec<u8> {
        let mut p = frame[..54].to_vec();
        let next = p[20];
        p[20] = 60;
        let payload = u16::from_be_bytes([p[18], p[19]]) + 24;
        p[18..20].copy_from_slice(&payload.to_be_bytes());
        p.extend_from_slice(&[next, 2, 0x1b, 20]);
        p.extend_from_slice(&port.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(&frontend.octets());
        p.extend_from_slice(&frame[54..]);
        p
    }

    fn seen(frame: &[u8]) -> Seen<Ipv6Addr> {
        let (v, dsr) = packets::inspect6_dsr(frame);
        Seen {
            eth_dst: v.eth_dst,
            eth_src: v.eth_src,
            saddr: v.saddr,
            daddr: v.daddr,
            sport: v.sport,
            dport: v.dport,
            hops: v.hop_limit,
            payload: v.payload,
            dsr,
        }
    }

    fn icmp(frame: &[u8]) -> IcmpSeen<Ipv6Addr> {
        let v = packets::inspect_icmp6(frame);
        IcmpSeen {
            eth_dst: v.eth_dst,
            eth_src: frame[6..12].try_into().unwrap(),
            saddr: v.saddr,
            daddr: v.daddr,
            ty: v.ty,
            code: v.code,
            rest: v.rest,
            quoted: (
                v.quoted_saddr,
                v.quoted_daddr,
                v.quoted_sport,
                v.quoted_dport,
            ),
            quote: frame[14 + 40 + 8..].to_vec(),
        }
    }

    fn words(a: Ipv6Addr) -> [u32; 4] {
        ip6_to_map(a)
    }

    fn ct(dp: &Dataplane, key: &CtKey<[u32; 4]>) -> Option<CtValue<[u32; 4]>> {
        dp.ct6(key)
    }

    fn flow_hash(saddr: Ipv6Addr, daddr: Ipv6Addr, sport: u16, dport: u16) -> u32 {
        lb_common::nodeport::flow_hash6(
            ip6_to_map(saddr),
            ip6_to_map(daddr),
            sport.to_be(),
            dport.to_be(),
            6,
        )
    }
    fn backend_entry(a: &str) -> String {
        format!("{{address: \"{a}\"}}")
    }
    fn dont_fragment(frame: Vec<u8>) -> Vec<u8> {
        frame
    }
    fn filter_fold(a: Ipv6Addr) -> u32 {
        lb_common::filter::fold6(ip6_to_map(a))
    }
}

/// The TCP conntrack key of a tuple (ports in host order) and entry kind.
fn tcp_key<F: Family>(
    saddr: F::Addr,
    daddr: F::Addr,
    sport: u16,
    dport: u16,
    kind: u8,
) -> CtKey<F::Words> {
    CtKey::new(
        F::words(saddr),
        F::words(daddr),
        sport.to_be(),
        dport.to_be(),
        6,
        kind,
    )
}

/// A pod's SYN-ACK from `backend` to the client's `client_port`, through
/// tc egress: it must leave from the node's `nodeport`.
fn pod_reply_leaves_from_the_nodeport<F: Family>(
    dp: &Dataplane,
    backend: F::Addr,
    client_port: u16,
    nodeport: u16,
) {
    let reply = F::tcp(
        [0; 6],
        CLIENT_MAC,
        backend,
        F::CLIENT,
        8080,
        client_port,
        SYN | ACK,
        b"",
        64,
    );
    let (rc, out) = dp.tc_egress(&reply);
    assert_eq!(rc, TC_ACT_OK);
    let v = F::seen(&out);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport),
        (F::NODE, nodeport, F::CLIENT, client_port),
        "the reply leaves from the NodePort"
    );
}

/// Recomputes the IPv4 header checksum after a test edited the header
/// (options included).
fn fix_ipv4_checksum(frame: &mut [u8]) {
    let len = usize::from(frame[14] & 0x0f) * 4;
    frame[24..26].copy_from_slice(&[0, 0]);
    let sum = packets::internet_checksum(&frame[14..14 + len]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
}

/// One `#[test]` per family for each generic body.
macro_rules! both_families {
    ($($body:ident),* $(,)?) => { $(
        mod $body {
            #[test]
            fn ipv4() {
                super::$body::<super::V4>();
            }
            #[test]
            fn ipv6() {
                super::$body::<super::V6>();
            }
        }
    )* };
}

both_families!(
    a_nodeport_to_a_local_backend_is_dnatted_to_the_stack_and_the_reply_reverse_natted_on_egress,
    a_nodeport_to_a_remote_backend_is_snatted_redirected_and_the_reply_comes_back_through_us,
    dsr_carries_the_frontend_to_the_backends_node_which_strips_it_and_answers_from_the_frontend,
    hybrid_mode_uses_dsr_for_tcp_and_snat_for_udp,
    a_frontend_without_endpoints_answers_port_unreachable_and_counts_the_reason,
    the_hop_count_is_decremented_and_a_packet_whose_count_runs_out_gets_time_exceeded,
    a_dsr_option_naming_a_frontend_this_node_does_not_serve_is_rejected,
    a_dsr_option_naming_a_guarded_load_balancer_is_learned_only_for_a_client_its_ranges_admit,
    a_spoofed_dsr_option_changes_only_the_reply_source_of_the_senders_own_tuple,
    a_nodeport_whose_filter_bit_is_clear_is_let_go_only_while_the_filter_is_trusted,
    a_routers_too_big_error_for_a_snat_flow_reaches_the_client_translated,
    a_local_backends_icmp_error_leaves_quoting_the_frontend,
    load_balancer_source_ranges_admit_only_their_networks_to_the_load_balancer_address,
    traffic_that_is_not_for_a_service_passes_untouched,
    a_maglev_load_balancer_picks_the_flow_hashs_slot_and_conntrack_keeps_a_flow_across_table_changes,
    a_packet_too_big_for_the_path_to_its_backend_gets_too_big_back_with_the_mtu,
);

fn a_nodeport_to_a_local_backend_is_dnatted_to_the_stack_and_the_reply_reverse_natted_on_egress<
    F: Family,
>() {
    let dp = F::dataplane("local");
    let backend = F::addr(F::LOCAL_BACKEND);
    let (rc, out) = dp.tc_ingress(&F::to_node(F::NP_LOCAL, 40000, SYN, b"hello"));
    assert_eq!(rc, TC_ACT_OK, "delivered by the stack");
    let v = F::seen(&out);
    assert_eq!((v.saddr, v.sport), (F::CLIENT, 40000), "client kept");
    assert_eq!((v.daddr, v.dport), (backend, 8080));
    assert_eq!(v.payload, b"hello");
    assert_eq!(v.hops, 64, "delivered here, not routed: no decrement");

    pod_reply_leaves_from_the_nodeport::<F>(&dp, backend, 40000, F::NP_LOCAL);
}

fn a_nodeport_to_a_remote_backend_is_snatted_redirected_and_the_reply_comes_back_through_us<
    F: Family,
>() {
    let dp = F::dataplane("snat");
    let backend = F::addr(F::REMOTE_BACKEND);
    let created = dp.counter(CNT_CT_CREATED);
    let (rc, out) = dp.tc_ingress(&F::to_node(F::NP_REMOTE, 40001, SYN, b"hello"));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = F::seen(&out);
    assert_eq!((v.daddr, v.dport), (backend, 8080));
    assert_eq!(v.saddr, F::NODE, "SNAT to the egress device's address");
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
    assert_eq!(v.hops, 63, "routed: decremented");
    assert_eq!((v.payload.as_slice(), v.dsr), (&b"hello"[..], None));
    let port = v.sport;
    assert_eq!(dp.counter(CNT_CT_CREATED), created + 1);

    // Both conntrack entries, in network byte order.
    let w = F::words;
    let fwd = tcp_key::<F>(F::CLIENT, F::NODE, 40001, F::NP_REMOTE, CT_SERVICE);
    let e = F::ct(&dp, &fwd).expect("forward entry");
    assert_eq!(e.addr, w(backend));
    assert_eq!((e.nat_addr, u16::from_be(e.nat_port)), (w(F::NODE), port));
    assert_ne!(e.flags & CT_F_SNAT, 0);
    let rev = tcp_key::<F>(backend, F::NODE, 8080, port, CT_REVERSE);
    let r = F::ct(&dp, &rev).expect("reverse entry under the SNAT port");
    assert_eq!(r.nat_addr, w(F::CLIENT));

    // The backend's reply to our port goes back to the client, from the NodePort.
    let reply = F::tcp(
        NODE_B_MAC,
        EXT0_MAC,
        backend,
        F::NODE,
        8080,
        port,
        SYN | ACK,
        b"",
        64,
    );
    let (rc, out) = dp.tc_ingress(&reply);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = F::seen(&out);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport),
        (F::NODE, F::NP_REMOTE, F::CLIENT, 40001)
    );
    assert_eq!(v.eth_dst, CLIENT_MAC);

    // Later packets keep the port; a second client flow gets another one.
    let (_, out) = dp.tc_ingress(&F::to_node(F::NP_REMOTE, 40001, ACK, b"more"));
    assert_eq!(F::seen(&out).sport, port);
    let (_, out) = dp.tc_ingress(&F::to_node(F::NP_REMOTE, 40002, SYN, b""));
    assert_ne!(F::seen(&out).sport, port);
}

/// DSR (as Cilium): the SYN to a remote backend keeps the client's address
/// and carries the frontend (an IPv4 option, an IPv6 Destination Options
/// header); the backend's node learns it, strips it, and the pod's reply
/// leaves from the NodePort straight to the client. Only the SYN carries
/// it. XDP leaves the insert to tc.
fn dsr_carries_the_frontend_to_the_backends_node_which_strips_it_and_answers_from_the_frontend<
    F: Family,
>() {
    let dp = F::dataplane("dsr");
    dp.config(CFG_LB_MODE, MODE_DSR);
    let backend = F::addr(F::REMOTE_BACKEND);
    let syn = F::to_node(F::NP_REMOTE, 40200, SYN, b"");
    let (rc, out) = dp.xdp(&syn);
    assert_eq!((rc, &out), (XDP_PASS, &syn), "punted to tc untouched");
    let (rc, out) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = F::seen(&out);
    assert_eq!(
        (v.saddr, v.sport),
        (F::CLIENT, 40200),
        "DSR keeps the client"
    );
    assert_eq!((v.daddr, v.dport), (backend, 8080));
    assert_eq!(v.dsr, Some((F::NODE, F::NP_REMOTE)), "the frontend carried");
    assert_eq!(v.hops, 63);

    // On the backend's node (the same programs), with a NIC that sums
    // frames (CHECKSUM_COMPLETE): learned, stripped, and skb->csum still
    // right (BPF_PROG_TEST_RUN checks it: EBADMSG otherwise; Linux 6.17+).
    let (rc_plain, stripped_plain) = dp.tc_ingress(&out);
    let (rc, stripped) = dp
        .tc_ingress_checksum_complete(&out)
        .expect("BPF_PROG_TEST_RUN with BPF_F_TEST_SKB_CHECKSUM_COMPLETE");
    assert_eq!(
        (rc_plain, &stripped_plain),
        (rc, &stripped),
        "a plain skb is stripped the same"
    );
    assert_eq!(rc, TC_ACT_OK, "delivered to the local pod");
    let s = F::seen(&stripped);
    assert_eq!(s.dsr, None, "stripped");
    assert_eq!((s.saddr, s.daddr, s.dport), (F::CLIENT, backend, 8080));
    let reverse = tcp_key::<F>(backend, F::CLIENT, 8080, 40200, CT_REVERSE);
    let learned = F::ct(&dp, &reverse).expect("the learned reply entry");
    assert_ne!(learned.flags & CT_F_DSR, 0);
    // ...and the pod's reply leaves from the frontend, straight to the client.
    pod_reply_leaves_from_the_nodeport::<F>(&dp, backend, 40200, F::NP_REMOTE);

    let (_, out) = dp.tc_ingress(&F::to_node(F::NP_REMOTE, 40200, ACK, b"x"));
    assert_eq!(F::seen(&out).dsr, None, "only the SYN carries it");
}

fn hybrid_mode_uses_dsr_for_tcp_and_snat_for_udp<F: Family>() {
    let dp = F::dataplane("hybrid");
    dp.config(CFG_LB_MODE, MODE_HYBRID);
    let (_, out) = dp.tc_ingress(&F::to_node(F::NP_REMOTE, 40210, SYN, b""));
    let v = F::seen(&out);
    assert_eq!(v.saddr, F::CLIENT, "TCP: DSR keeps the client");
    assert_eq!(v.dsr, Some((F::NODE, F::NP_REMOTE)), "TCP: DSR");
    let dns = F::udp(
        CLIENT_MAC,
        EXT0_MAC,
        F::CLIENT,
        F::addr(F::DNS_LB),
        5010,
        53,
        b"query",
    );
    let (rc, out) = dp.tc_ingress(&dns);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = F::seen(&out);
    assert_eq!(
        (v.saddr, v.daddr, v.dport),
        (F::NODE, F::addr(F::DNS_BACKEND), 5353),
        "UDP: SNAT"
    );
    assert_eq!(v.dsr, None);
    assert_eq!(v.payload, b"query");
}

/// kube-proxy's REJECT: a frontend without any endpoint answers "port
/// unreachable" from the address the client dialed, quoting what it sent,
/// back out of the device it came in on; counted as no-backend. XDP leaves
/// it to tc.
fn a_frontend_without_endpoints_answers_port_unreachable_and_counts_the_reason<F: Family>() {
    let dp = F::dataplane("empty");
    let before = dp.drops("no-backend");
    let sent = dp.counter(CNT_ICMP_SENT);
    let syn = F::to_node(F::NP_EMPTY, 40030, SYN, b"");
    let (rc, out) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_REDIRECT, "the error goes back out of ext0");
    let v = F::icmp(&out);
    assert_eq!((v.ty, v.code), F::PORT_UNREACHABLE);
    assert_eq!(v.rest, [0; 4], "unused");
    assert_eq!((v.saddr, v.daddr), (F::NODE, F::CLIENT));
    assert_eq!((v.eth_dst, v.eth_src), (CLIENT_MAC, EXT0_MAC));
    assert_eq!(
        v.quoted,
        (F::CLIENT, F::NODE, 40030, F::NP_EMPTY),
        "quotes what the client sent"
    );
    assert!(
        F::quotes(&v.quote, &syn),
        "byte for byte, the IP header and 8 bytes: {:?} for {:?}",
        &v.quote[..F::QUOTE_MIN],
        &syn[14..14 + F::QUOTE_MIN]
    );
    assert_eq!(dp.drops("no-backend"), before + 1);
    assert_eq!(dp.counter(CNT_ICMP_SENT), sent + 1);
    let (rc, out) = dp.xdp(&syn);
    assert_eq!((rc, out), (XDP_PASS, syn), "XDP hands it to tc");
}

/// RFC 1812 / RFC 8200: a router does not forward a packet whose TTL or hop
/// limit runs out; it answers "time exceeded". The forwarded ones leave
/// with one less.
fn the_hop_count_is_decremented_and_a_packet_whose_count_runs_out_gets_time_exceeded<F: Family>() {
    let dp = F::dataplane("hops");
    let before = dp.drops("ttl-exceeded");
    let (rc, out) = dp.tc_ingress(&F::to_node(F::NP_REMOTE, 41900, SYN, b""));
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(F::seen(&out).hops, 63);

    let last_hop = F::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        F::CLIENT,
        F::NODE,
        41901,
        F::NP_REMOTE,
        SYN,
        b"",
        1,
    );
    let (rc, out) = dp.tc_ingress(&last_hop);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = F::icmp(&out);
    assert_eq!((v.ty, v.code), F::TIME_EXCEEDED);
    assert_eq!((v.saddr, v.daddr), (F::NODE, F::CLIENT));
    assert_eq!(
        (v.eth_dst, v.eth_src),
        (CLIENT_MAC, EXT0_MAC),
        "back to the sender"
    );
    assert_eq!(v.quoted, (F::CLIENT, F::NODE, 41901, F::NP_REMOTE));
    assert!(
        F::quotes(&v.quote, &last_hop),
        "{:?}",
        &v.quote[..F::QUOTE_MIN]
    );
    assert_eq!(dp.drops("ttl-exceeded"), before + 1);
}

/// A DSR option naming a frontend this node does not serve is not learned:
/// otherwise any outside host could plant entries that rewrite a pod's
/// replies (docs/security.md).
fn a_dsr_option_naming_a_frontend_this_node_does_not_serve_is_rejected<F: Family>() {
    let dp = F::dataplane("dsrreject");
    let plain = F::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        F::CLIENT,
        F::addr(F::LOCAL_BACKEND),
        42500,
        8080,
        SYN,
        b"",
        64,
    );
    let with = F::with_dsr(&plain, F::addr(F::STRANGER), 80);
    assert_eq!(
        F::seen(&with).dsr,
        Some((F::addr(F::STRANGER), 80)),
        "the test's packet carries it"
    );
    let before = dp.drops("dsr-rejected");
    let (rc, _) = dp.tc_ingress(&with);
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(dp.drops("dsr-rejected"), before + 1);
    let learned = tcp_key::<F>(
        F::addr(F::LOCAL_BACKEND),
        F::CLIENT,
        8080,
        42500,
        CT_REVERSE,
    );
    assert_eq!(F::ct(&dp, &learned), None, "nothing learned");
}

/// A DSR option naming a LoadBalancer with loadBalancerSourceRanges is
/// learned only for a client those ranges admit. The first node checked
/// the ranges against the same source address, so a real flow passes; a
/// client the ranges refuse cannot send its own option naming the guarded
/// address and have a backend answer it from there (docs/security.md).
fn a_dsr_option_naming_a_guarded_load_balancer_is_learned_only_for_a_client_its_ranges_admit<
    F: Family,
>() {
    let g = F::GUARDED;
    let mut dp = F::dataplane("dsrguard");
    let apply = |dp: &mut Dataplane, ranges: &str| {
        dp.apply_with_extra_to(F::SERVICES, &g.yaml.replace("RANGES", ranges));
    };
    let backend = F::addr(g.backend);
    let with_option = |sport: u16| {
        let plain = F::tcp(
            CLIENT_MAC,
            EXT0_MAC,
            F::CLIENT,
            backend,
            sport,
            8080,
            SYN,
            b"",
            64,
        );
        F::with_dsr(&plain, F::addr(g.lb), 80)
    };
    let learned = |dp: &Dataplane, sport: u16| {
        F::ct(
            dp,
            &tcp_key::<F>(backend, F::CLIENT, 8080, sport, CT_REVERSE),
        )
    };

    apply(&mut dp, g.ranges[0]);
    let (drops, learned_before) = (dp.drops("source-range"), dp.counter(CNT_DSR_LEARNED));
    let (rc, _) = dp.tc_ingress(&with_option(42600));
    assert_eq!(rc, TC_ACT_SHOT, "the client is outside the ranges");
    assert_eq!(
        dp.drops("source-range"),
        drops + 1,
        "counted as source-range"
    );
    assert_eq!(learned(&dp, 42600), None, "nothing learned");
    assert_eq!(dp.counter(CNT_DSR_LEARNED), learned_before);

    apply(&mut dp, g.ranges[1]);
    let (rc, out) = dp.tc_ingress(&with_option(42601));
    assert_eq!(rc, TC_ACT_OK, "an admitted client's flow is delivered");
    let s = F::seen(&out);
    assert_eq!(s.dsr, None, "stripped");
    assert_eq!((s.saddr, s.daddr, s.dport), (F::CLIENT, backend, 8080));
    let entry = learned(&dp, 42601).expect("learned for a client the ranges admit");
    assert_eq!(
        (entry.addr, u16::from_be(entry.port)),
        (F::words(F::addr(g.lb)), 80),
        "the guarded frontend learned"
    );
    assert_ne!(entry.flags & CT_F_DSR, 0);
    assert_eq!(dp.counter(CNT_DSR_LEARNED), learned_before + 1);
    assert_eq!(dp.drops("source-range"), drops + 1, "no further drop");
}

/// What a host outside the cluster can do with a DSR option naming a
/// frontend this node serves: the entry it plants is keyed on its own
/// tuple (the packet's source), so the only effect is that the backend's
/// replies to that sender leave from the named frontend. Replies to any
/// other client or port are untouched, and no reply is sent anywhere but
/// to the sender: the option cannot turn a backend against a third host
/// (docs/security.md).
fn a_spoofed_dsr_option_changes_only_the_reply_source_of_the_senders_own_tuple<F: Family>() {
    let dp = F::dataplane("dsrspoof");
    let backend = F::addr(F::LOCAL_BACKEND);
    let web = F::addr(F::WEB_LB);
    let plain = F::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        F::CLIENT,
        backend,
        42700,
        8080,
        SYN,
        b"",
        64,
    );
    let spoofed = F::with_dsr(&plain, web, 80);
    let learned_before = dp.counter(CNT_DSR_LEARNED);
    let (rc, out) = dp.tc_ingress(&spoofed);
    assert_eq!(rc, TC_ACT_OK, "a served frontend: learned and delivered");
    assert_eq!(F::seen(&out).dsr, None, "stripped");
    assert_eq!(dp.counter(CNT_DSR_LEARNED), learned_before + 1);

    let reply_to = |client: F::Addr, port: u16| {
        F::tcp(
            [0; 6],
            CLIENT_MAC,
            backend,
            client,
            8080,
            port,
            SYN | ACK,
            b"",
            64,
        )
    };
    // The sender's own tuple: its replies now come from the frontend, and
    // still go to the sender.
    let (rc, out) = dp.tc_egress(&reply_to(F::CLIENT, 42700));
    assert_eq!(rc, TC_ACT_OK);
    let v = F::seen(&out);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport),
        (web, 80, F::CLIENT, 42700),
        "only the source changes"
    );
    // Another port of the sender, another host: byte for byte as sent.
    for (client, port) in [(F::CLIENT, 42701), (F::NODE_B, 42700)] {
        let reply = reply_to(client, port);
        let (rc, out) = dp.tc_egress(&reply);
        assert_eq!(
            (rc, &out),
            (TC_ACT_OK, &reply),
            "a reply to {client:?}:{port} is not the sender's tuple"
        );
    }
    let others = tcp_key::<F>(backend, F::NODE_B, 8080, 42700, CT_REVERSE);
    assert_eq!(
        F::ct(&dp, &others),
        None,
        "nothing planted for another host"
    );
}

/// The frontend filter (lb_common::filter) with a NodePort's bit cleared by
/// hand: its packets pass untranslated while the programs trust the filter
/// (tc and XDP), and are served again once they do not. So the early exit
/// is real, and a filter the agent has not vouched for is never used.
fn a_nodeport_whose_filter_bit_is_clear_is_let_go_only_while_the_filter_is_trusted<F: Family>() {
    use aya::maps::{Array, MapData};
    use lb_common::filter::{filter_bit, word_and_mask};
    let dp = F::dataplane("filter");
    let backend = F::addr(F::LOCAL_BACKEND);
    let (rc, out) = dp.tc_ingress(&F::to_node(F::NP_LOCAL, 40400, SYN, b""));
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(
        F::seen(&out).daddr,
        backend,
        "served with the filter as written"
    );

    let (word, mask) = word_and_mask(filter_bit(F::filter_fold(F::NODE), F::NP_LOCAL.to_be()));
    let mut filter: Array<MapData, u64> = Array::try_from(aya::maps::Map::Array(
        MapData::from_pin(dp.pins.path.join(lb_common::maps::LB4_FE_FILTER)).unwrap(),
    ))
    .unwrap();
    let was = filter.get(&word, 0).unwrap();
    assert_ne!(was & mask, 0, "the agent set the NodePort's bit");
    filter.set(word, was & !mask, 0).unwrap();

    let syn = F::to_node(F::NP_LOCAL, 40401, SYN, b"");
    assert_eq!(
        dp.tc_ingress(&syn),
        (TC_ACT_OK, syn.clone()),
        "tc lets it go untouched"
    );
    assert_eq!(dp.xdp(&syn), (XDP_PASS, syn.clone()), "so does XDP");

    dp.config(CFG_FRONTEND_FILTER, 0);
    let (rc, out) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(
        F::seen(&out).daddr,
        backend,
        "an untrusted filter is not used"
    );
}

/// Path MTU discovery through the SNAT (RFC 1191, RFC 8201): a router
/// between this node and a remote backend answers "too big" about a
/// packet the node forwarded (source: the node, its SNAT port). The error
/// is the client's (RFC 5508, NAT behaviour for ICMP): it leaves toward
/// the client with the quote put back to what the client sent, the MTU
/// unchanged, the router's own address kept (as netfilter's NAT does). An error quoting a port no flow holds is the
/// stack's, untouched.
fn a_routers_too_big_error_for_a_snat_flow_reaches_the_client_translated<F: Family>() {
    let dp = F::dataplane("icmp_snat");
    let (rc, sent) = dp.tc_ingress(&F::to_node(F::NP_REMOTE, 42100, SYN, b""));
    assert_eq!(rc, TC_ACT_REDIRECT);
    let mtu_1300 = 1300u32.to_be_bytes();
    let err = F::icmp_error(
        NODE_B_MAC,
        EXT0_MAC,
        F::NODE_B,
        F::NODE,
        F::TOO_BIG,
        mtu_1300,
        F::quote_of(&sent),
    );
    let translated = dp.counter(lb_common::config::CNT_ICMP_TRANSLATED);
    let (rc, out) = dp.tc_ingress(&err);
    assert_eq!(rc, TC_ACT_REDIRECT, "toward the client");
    let v = F::icmp(&out);
    assert_eq!(
        (v.saddr, v.daddr),
        (F::NODE_B, F::CLIENT),
        "the router's address kept"
    );
    assert_eq!(v.eth_dst, CLIENT_MAC);
    assert_eq!(
        v.quoted,
        (F::CLIENT, F::NODE, 42100, F::NP_REMOTE),
        "quotes what the client sent"
    );
    assert_eq!(
        (v.ty, v.code, v.rest),
        (F::TOO_BIG.0, F::TOO_BIG.1, mtu_1300),
        "the MTU passes unchanged"
    );
    assert_eq!(
        dp.counter(lb_common::config::CNT_ICMP_TRANSLATED),
        translated + 1
    );

    // The same error about a source port nobody allocated.
    let mut stray_quote = F::quote_of(&sent).to_vec();
    let sport_at = F::QUOTE_MIN - 8;
    stray_quote[sport_at..sport_at + 2].copy_from_slice(&1u16.to_be_bytes());
    let stray = F::icmp_error(
        NODE_B_MAC,
        EXT0_MAC,
        F::NODE_B,
        F::NODE,
        F::TOO_BIG,
        mtu_1300,
        &stray_quote,
    );
    let (rc, out) = dp.tc_ingress(&stray);
    assert_eq!((rc, out), (TC_ACT_OK, stray), "the stack's");
    assert_eq!(
        dp.counter(lb_common::config::CNT_ICMP_TRANSLATED),
        translated + 1
    );
}

/// A local backend's error about a flow it got through a NodePort (here
/// port unreachable) leaves from the node's address, quoting the NodePort
/// the client dialed, as kube-proxy's conntrack reverses it.
fn a_local_backends_icmp_error_leaves_quoting_the_frontend<F: Family>() {
    let dp = F::dataplane("icmp_local");
    let (rc, got) = dp.tc_ingress(&F::to_node(F::NP_LOCAL, 42200, SYN, b""));
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(
        F::seen(&got).daddr,
        F::addr(F::LOCAL_BACKEND),
        "DNATted to the backend"
    );
    let err = F::icmp_error(
        [0; 6],
        CLIENT_MAC,
        F::addr(F::LOCAL_BACKEND),
        F::CLIENT,
        F::PORT_UNREACHABLE,
        [0; 4],
        F::quote_of(&got),
    );
    let (rc, out) = dp.tc_egress(&err);
    assert_eq!(rc, TC_ACT_OK);
    let v = F::icmp(&out);
    assert_eq!(
        (v.saddr, v.daddr),
        (F::NODE, F::CLIENT),
        "from the frontend"
    );
    assert_eq!((v.ty, v.code), F::PORT_UNREACHABLE);
    assert_eq!(
        v.quoted,
        (F::CLIENT, F::NODE, 42200, F::NP_LOCAL),
        "quotes the NodePort the client dialed"
    );
}

/// loadBalancerSourceRanges (kube-proxy's KUBE-FW chain): the
/// LoadBalancer address admits only clients in its ranges, on tc and XDP
/// alike, counting the others as source-range drops; its NodePort stays
/// open to everyone, as kube-proxy's does; ranges follow the service as it
/// changes, and no ranges open it to all, leaving nothing behind in the
/// family's source-range map.
fn load_balancer_source_ranges_admit_only_their_networks_to_the_load_balancer_address<F: Family>() {
    let g = F::GUARDED;
    let mut dp = F::dataplane("src_ranges");
    let base_entries = dp.reconciler.state().source_range_entries();
    let apply = |dp: &mut Dataplane, ranges: &str| {
        dp.apply_with_extra_to(F::SERVICES, &g.yaml.replace("RANGES", ranges));
    };
    let to_lb = |sport: u16| {
        F::tcp(
            CLIENT_MAC,
            EXT0_MAC,
            F::CLIENT,
            F::addr(g.lb),
            sport,
            80,
            SYN,
            b"",
            64,
        )
    };
    let served = |dp: &Dataplane, sport: u16| {
        let (rc, out) = dp.tc_ingress(&to_lb(sport));
        rc == TC_ACT_OK && F::seen(&out).daddr == F::addr(g.backend)
    };
    let drops = dp.drops("source-range");

    apply(&mut dp, g.ranges[0]);
    let (rc, _) = dp.tc_ingress(&to_lb(40100));
    assert_eq!(rc, TC_ACT_SHOT, "the client is in neither network");
    assert_eq!(dp.drops("source-range"), drops + 1);
    let (rc, _) = dp.xdp(&to_lb(40101));
    assert_eq!(rc, XDP_DROP);
    assert_eq!(dp.drops("source-range"), drops + 2);
    let (rc, out) = dp.tc_ingress(&F::to_node(g.node_port, 40102, SYN, b""));
    assert_eq!(rc, TC_ACT_OK, "the NodePort is open");
    assert_eq!(F::seen(&out).daddr, F::addr(g.backend));

    apply(&mut dp, g.ranges[1]);
    assert!(served(&dp, 40103), "its network admitted");
    apply(&mut dp, g.ranges[2]);
    assert!(served(&dp, 40104), "its host route admitted");
    apply(&mut dp, g.ranges[3]);
    assert!(
        !served(&dp, 40105),
        "another host's route admits only that host"
    );
    assert_eq!(dp.drops("source-range"), drops + 3);

    apply(&mut dp, "");
    assert!(served(&dp, 40106), "no ranges: open to everyone");
    assert_eq!(
        dp.reconciler.state().source_range_entries(),
        base_entries,
        "nothing of its ranges left behind"
    );
}

/// What is not for a service is not ours: a port no service uses on the
/// node's address, a port a LoadBalancer address does not serve (it serves
/// TCP 80), ARP, an
/// empty IPv6 header; tc (both ways) and XDP hand each on byte for byte.
fn traffic_that_is_not_for_a_service_passes_untouched<F: Family>() {
    let dp = F::dataplane("passthrough");
    let ssh = F::to_node(22, 40005, SYN, b"ssh");
    let unknown_lb_port = F::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        F::CLIENT,
        F::addr(F::WEB_LB),
        40005,
        81,
        SYN,
        b"",
        64,
    );
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&CLIENT_MAC);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    let mut bare_ipv6 = vec![0u8; 14 + 40];
    bare_ipv6[12..14].copy_from_slice(&[0x86, 0xdd]);
    bare_ipv6[14] = 0x60;
    for p in [ssh, unknown_lb_port, arp, bare_ipv6] {
        let (rc, out) = dp.tc_ingress(&p);
        assert_eq!((rc, &out), (TC_ACT_OK, &p), "tc must not touch it");
        let (rc, out) = dp.xdp(&p);
        assert_eq!((rc, &out), (XDP_PASS, &p), "XDP must not touch it");
        let (rc, out) = dp.tc_egress(&p);
        assert_eq!((rc, &out), (TC_ACT_OK, &p), "tc egress must not touch it");
    }
}

/// Maglev (as Katran and Cilium): each new flow to the LoadBalancer goes to
/// the backend of the slot its flow hash selects in the table the agent
/// built, and many flows spread over all three backends. When the table
/// changes (a fourth backend) an established flow stays on its backend
/// (conntrack wins over the table); when its backend leaves, its next
/// packet chooses again.
fn a_maglev_load_balancer_picks_the_flow_hashs_slot_and_conntrack_keeps_a_flow_across_table_changes<
    F: Family,
>() {
    use lb::source::file::parse::parse_with;
    let mut dp = F::dataplane("maglev");
    let vip = F::addr(F::WEB_LB);
    let send = |dp: &Dataplane, sport: u16, flags: u8| -> F::Addr {
        let (rc, out) = dp.tc_ingress(&F::tcp(
            CLIENT_MAC,
            EXT0_MAC,
            F::CLIENT,
            vip,
            sport,
            80,
            flags,
            b"",
            64,
        ));
        assert_eq!(rc, TC_ACT_REDIRECT, "to a remote backend");
        F::seen(&out).daddr
    };
    let svc_id = dp
        .reconciler
        .state()
        .frontends()
        .find(|(k, _)| k.address == vip.into())
        .expect("the load balancer's frontend")
        .1
        .service_id;
    let table = dp.reconciler.state().maglev[&svc_id].clone();
    let mut seen = std::collections::BTreeSet::new();
    for sport in 41000..41060u16 {
        let got = send(&dp, sport, SYN);
        let slot = F::flow_hash(F::CLIENT, vip, sport, 80) % table.len() as u32;
        let want = dp.reconciler.state().backends[&table[slot as usize]].address;
        assert_eq!(got.into(), want, "the flow from port {sport}");
        seen.insert(format!("{got:?}"));
    }
    assert_eq!(seen.len(), 3, "{seen:?}");

    let ctx = node_context();
    let first = send(&dp, 42000, SYN);
    let last = F::backend_entry(F::WEB_BACKENDS[2]);
    let more = F::SERVICES.replace(
        &format!("{last}]"),
        &format!("{last}, {}]", F::backend_entry(F::WEB_EXTRA)),
    );
    assert_ne!(more, F::SERVICES, "the fourth backend is added");
    dp.apply(&parse_with(&more, &ctx).unwrap());
    assert_ne!(
        dp.reconciler.state().maglev[&svc_id],
        table,
        "the table changed"
    );
    for _ in 0..5 {
        assert_eq!(
            send(&dp, 42000, ACK),
            first,
            "conntrack wins over the new table"
        );
    }
    let entry = F::backend_entry(&Into::<IpAddr>::into(first).to_string());
    let gone = F::SERVICES
        .replace(&format!("{entry}, "), "")
        .replace(&format!(", {entry}"), "");
    assert_ne!(gone, F::SERVICES, "the flow's backend is removed");
    dp.apply(&parse_with(&gone, &ctx).unwrap());
    assert_ne!(
        send(&dp, 42000, ACK),
        first,
        "its backend left: chosen again"
    );
}

/// A packet that does not fit the path to its backend (1400 bytes) is
/// answered from the address it was sent to with the family's "too big"
/// (IPv4: fragmentation needed, DF set; ICMPv6: packet too big) carrying
/// the MTU and quoting the packet as the client sent it; counted as
/// `frag-needed`. XDP leaves it to tc; a packet that fits goes on. (IPv4's
/// own cases, no DF and the offload-proof checksum, are in
/// nodeport_packets.rs.)
fn a_packet_too_big_for_the_path_to_its_backend_gets_too_big_back_with_the_mtu<F: Family>() {
    let dp = F::dataplane("too_big");
    let (drops, sent) = (dp.drops("frag-needed"), dp.counter(CNT_ICMP_SENT));
    let segment = |payload: usize| {
        F::dont_fragment(F::to_node(F::NP_NARROW, 41700, ACK, &vec![0x5a; payload]))
    };
    let syn = F::to_node(F::NP_NARROW, 41700, SYN, b"");
    assert_eq!(dp.tc_ingress(&syn).0, TC_ACT_REDIRECT, "the handshake fits");
    let fits = segment(1400 - F::IP_HEADER - 20);
    assert_eq!(fits.len(), 14 + 1400);
    assert_eq!(dp.tc_ingress(&fits).0, TC_ACT_REDIRECT, "1400 bytes fit");

    let big = segment(1400 - F::IP_HEADER - 20 + 1);
    let (rc, out) = dp.xdp(&big);
    assert_eq!((rc, &out), (XDP_PASS, &big), "XDP hands it to tc");
    let (rc, out) = dp.tc_ingress(&big);
    assert_eq!(rc, TC_ACT_REDIRECT, "the error goes back out of ext0");
    let v = F::icmp(&out);
    assert_eq!((v.ty, v.code), F::TOO_BIG);
    assert_eq!(u32::from_be_bytes(v.rest), 1400, "the path's MTU");
    assert_eq!((v.saddr, v.daddr), (F::NODE, F::CLIENT));
    assert_eq!((v.eth_dst, v.eth_src), (CLIENT_MAC, EXT0_MAC));
    assert_eq!(
        v.quoted,
        (F::CLIENT, F::NODE, 41700, F::NP_NARROW),
        "it quotes the packet as the client sent it"
    );
    assert!(F::quotes(&v.quote, &big), "the quote is the packet's start");
    assert_eq!(dp.drops("frag-needed"), drops + 1);
    assert_eq!(dp.counter(CNT_ICMP_SENT), sent + 1);
}
