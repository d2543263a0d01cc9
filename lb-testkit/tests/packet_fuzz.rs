//! Random and malformed packets through the tc and XDP programs
//! (BPF_PROG_TEST_RUN): valid packets to frontends and to other addresses,
//! cut short, with bytes flipped, with a lying header length, and plain
//! random bytes. Whatever arrives, the programs return a verdict (no test run
//! fails), nothing that does not name a frontend (a sound, unfragmented IPv4
//! header and a destination port) is rewritten or redirected, and a
//! rewritten packet that came in with good checksums goes out with good
//! checksums.
use std::{collections::BTreeSet, net::Ipv4Addr};

use etherparse::{Ipv4Header, TcpHeader, UdpHeader};
use lb_testkit::{
    dataplane::*,
    packets::{self, ACK, SYN},
    unique,
};
use proptest::{
    prelude::*,
    test_runner::{Config, RngAlgorithm, TestRng, TestRunner},
};

/// (address, port, protocol) of every frontend the programs serve.
/// Frontends without any backend (the `empty` service's NodePort): a new
/// flow there is answered with an ICMP port unreachable back to its sender
/// (kube-proxy's REJECT), never forwarded anywhere else.
fn empty_frontends() -> BTreeSet<(Ipv4Addr, u16, u8)> {
    BTreeSet::from([(NODE_IP, 30003, 6)])
}

/// Whether `out` is an ICMP port unreachable from the frontend back to the
/// sender of `p`, with its IPv4 and ICMP checksums right (etherparse).
fn is_port_unreachable_for(p: &[u8], out: &[u8]) -> bool {
    use etherparse::{Icmpv4Type, SlicedPacket, TransportSlice};
    let Ok(sent) = SlicedPacket::from_ethernet(p) else {
        return false;
    };
    let Ok(reply) = SlicedPacket::from_ethernet(out) else {
        return false;
    };
    let (Some(etherparse::NetSlice::Ipv4(sent_ip)), Some(etherparse::NetSlice::Ipv4(ip))) =
        (sent.net, reply.net)
    else {
        return false;
    };
    let Some(TransportSlice::Icmpv4(icmp)) = reply.transport else {
        return false;
    };
    let header = ip.header().to_header();
    header.header_checksum == header.calc_header_checksum()
        && ip.header().destination_addr() == sent_ip.header().source_addr()
        && ip.header().source_addr() == sent_ip.header().destination_addr()
        && matches!(
            icmp.icmp_type(),
            Icmpv4Type::DestinationUnreachable(etherparse::icmpv4::DestUnreachableHeader::Port)
        )
        && icmp.icmp_type().calc_checksum(icmp.payload()) == icmp.checksum()
}

fn frontends() -> BTreeSet<(Ipv4Addr, u16, u8)> {
    BTreeSet::from([
        (NODE_IP, 30001, 6),
        (NODE_IP, 30002, 6),
        ("203.0.113.10".parse().unwrap(), 53, 17),
    ])
}

/// What a packet is, judged here independently of the programs.
struct Judged {
    /// IPv4 (not a fragment, header and total length consistent) and the
    /// destination address and port it names: what decides whether a
    /// frontend is addressed at all. The rest of the L4 header may be
    /// broken: such a packet belongs to the flow it names (the backend's
    /// stack drops it), so forwarding it is not misforwarding.
    tuple: Option<(Ipv4Addr, u16, u8)>,
    /// The whole packet parses (etherparse) and both checksums are right.
    checksums_ok: bool,
    /// Carries an IPv4 option shaped like our DSR option (a backend's node
    /// acts on it): may legitimately be rewritten.
    dsr_option: bool,
}

fn judge(p: &[u8]) -> Judged {
    let mut j = Judged {
        tuple: None,
        checksums_ok: false,
        dsr_option: false,
    };
    if p.len() < 34 || p[12..14] != [0x08, 0x00] || p[14] >> 4 != 4 {
        return j;
    }
    let ihl = (p[14] & 0x0f) as usize * 4;
    let tot = u16::from_be_bytes([p[16], p[17]]) as usize;
    let frag = u16::from_be_bytes([p[20], p[21]]) & 0x3fff; // MF and offset
    let proto = p[23];
    if ihl < 20 || tot < ihl || 14 + tot > p.len() || frag != 0 || !(proto == 6 || proto == 17) {
        return j;
    }
    j.dsr_option = ihl >= 28 && p[34] == 0x9a && p[35] == 8;
    let l4 = 14 + ihl;
    if tot - ihl >= 4 {
        let daddr = Ipv4Addr::new(p[30], p[31], p[32], p[33]);
        j.tuple = Some((daddr, u16::from_be_bytes([p[l4 + 2], p[l4 + 3]]), proto));
    }
    j.checksums_ok = checksums_ok(&p[..14 + tot]);
    j
}

fn checksums_ok(p: &[u8]) -> bool {
    let Ok((iph, rest)) = Ipv4Header::from_slice(&p[14..]) else {
        return false;
    };
    let l4 = &rest[..(iph.total_len as usize)
        .saturating_sub(iph.header_len())
        .min(rest.len())];
    iph.header_checksum == iph.calc_header_checksum()
        && match iph.protocol.0 {
            6 => TcpHeader::from_slice(l4)
                .ok()
                .and_then(|(th, pl)| {
                    th.calc_checksum_ipv4(&iph, pl)
                        .ok()
                        .map(|c| c == th.checksum)
                })
                .unwrap_or(false),
            17 => UdpHeader::from_slice(l4)
                .ok()
                .and_then(|(uh, pl)| {
                    uh.calc_checksum_ipv4(&iph, pl)
                        .ok()
                        .map(|c| uh.checksum == 0 || c == uh.checksum)
                })
                .unwrap_or(false),
            _ => false,
        }
}

fn bases() -> Vec<Vec<u8>> {
    vec![
        packets::tcp(
            CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40000, 30001, SYN, b"hello",
        ),
        packets::tcp(
            CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40001, 30002, SYN, b"",
        ),
        packets::udp(
            CLIENT_MAC,
            EXT0_MAC,
            CLIENT_IP,
            "203.0.113.10".parse().unwrap(),
            40002,
            53,
            b"query",
        ),
        packets::tcp(
            CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40003, 22, ACK, b"ssh",
        ),
        packets::udp(
            CLIENT_MAC,
            EXT0_MAC,
            CLIENT_IP,
            NODE_IP,
            40004,
            30001,
            b"wrong protocol",
        ),
    ]
}

/// A base packet (or random bytes), then damage.
fn packet() -> impl Strategy<Value = Vec<u8>> {
    let mutated = (
        0..bases().len(),
        prop::option::weighted(0.3, 0usize..80),
        prop::collection::vec((0usize..80, any::<u8>()), 0..6),
        prop::option::weighted(0.2, 0u8..16),
        prop::option::weighted(0.2, any::<u16>()),
    )
        .prop_map(|(b, cut, flips, ihl, tot_len)| {
            let mut p = bases()[b].clone();
            if let Some(ihl) = ihl {
                p[14] = 0x40 | ihl;
            }
            if let Some(t) = tot_len {
                p[16..18].copy_from_slice(&t.to_be_bytes());
            }
            for (i, v) in flips {
                if i < p.len() {
                    p[i] = v;
                }
            }
            // BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet
            // header (EINVAL, net/bpf/test_run.c); a device never delivers one.
            if let Some(c) = cut {
                p.truncate(c.max(14));
            }
            p
        });
    prop_oneof![4 => mutated, 1 => prop::collection::vec(any::<u8>(), 14..120)]
}

#[test]
fn random_and_malformed_packets_are_never_misforwarded_and_never_break_a_run() {
    let dp = Dataplane::with_services(&unique("packet_fuzz"), SERVICES);
    let frontends = frontends();
    let empty = empty_frontends();
    // Seeded: the same 3000 packets in every run, so a failure reproduces.
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 3000,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let counts = std::cell::RefCell::new([0usize; 4]); // [to a frontend, other well-formed, malformed, rewritten]
    runner
        .run(&packet(), |p| {
            let j = judge(&p);
            let to_frontend = j.tuple.is_some_and(|t| frontends.contains(&t));
            counts.borrow_mut()[if to_frontend {
                0
            } else if j.checksums_ok {
                1
            } else {
                2
            }] += 1;
            // BPF_PROG_TEST_RUN for tc refuses an IPv4 frame shorter than an
            // IPv4 header (EINVAL from the harness, before the program runs);
            // XDP takes it, so those frames still reach our code there.
            let harness_takes_tc = !(p.len() < 34 && p[12..14] == [0x08, 0x00]);
            let mut runs = vec![("xdp", dp.xdp(&p))];
            if harness_takes_tc {
                runs.push(("tc", dp.tc_ingress(&p)));
            }
            for (hook, (rc, out)) in runs {
                let passed = (hook == "tc" && rc == TC_ACT_OK) || (hook == "xdp" && rc == XDP_PASS);
                let dropped =
                    (hook == "tc" && rc == TC_ACT_SHOT) || (hook == "xdp" && rc == XDP_DROP);
                let forwarded =
                    (hook == "tc" && rc == TC_ACT_REDIRECT) || (hook == "xdp" && rc == XDP_TX);
                prop_assert!(
                    passed || dropped || forwarded,
                    "{hook}: unexpected verdict {rc} for {p:02x?}"
                );
                if j.tuple.is_some_and(|t| empty.contains(&t)) && forwarded {
                    prop_assert!(
                        is_port_unreachable_for(&p, &out),
                        "{hook}: a packet to an empty frontend was forwarded as something \
                         other than a port unreachable to its sender: {p:02x?} -> {out:02x?}"
                    );
                    continue;
                }
                if !to_frontend && !j.dsr_option {
                    prop_assert!(
                        !forwarded,
                        "{hook} forwarded a packet for no frontend: {p:02x?}"
                    );
                    if passed {
                        prop_assert_eq!(&out, &p, "{} rewrote a packet for no frontend", hook);
                    }
                }
                if (passed || forwarded) && out != p {
                    counts.borrow_mut()[3] += 1;
                    if j.checksums_ok {
                        prop_assert!(
                            checksums_ok(&out),
                            "{hook} broke the checksums: {p:02x?} -> {out:02x?}"
                        );
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    let counts = counts.into_inner();
    println!(
        "packet fuzz: 3000 cases, to a frontend {}, other intact {}, damaged {}, rewrites {}",
        counts[0], counts[1], counts[2], counts[3]
    );
    // The mix really exercised every kind.
    assert!(counts.iter().all(|&c| c > 50), "{counts:?}");
}
