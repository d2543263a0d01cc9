//! The packet path: ns per packet of the tc ingress and XDP programs, the
//! kernel's own measurement (BPF_PROG_TEST_RUN with `repeat`), at few and at
//! many LoadBalancer services.
//!
//! `repeat` runs the program again and again on the same buffer, and what a
//! run rewrites stays rewritten for the next. Two established-flow rows:
//!
//! * the last service's backend is its own address and port: every run
//!   finds the flow in conntrack and takes the DNAT path, but the rewrite
//!   finds nothing to change and returns before any store or checksum
//!   helper: it times the lookups, not the rewrite;
//! * two services forward to each other (A → B's address and port, B → A's):
//!   each run turns the packet from one into the other, a conntrack hit and
//!   a real DNAT (address and port stored, IP and TCP checksums updated).
//!
//! Not a service: a packet to the node's own port 22, beside an empty
//! program (`return PASS`) timed on the same packet, the floor any program
//! on the hook pays.
//!
//! IPv6 takes the same body (one generic packet path): the same pair of
//! services forwarding to each other, on IPv6 LoadBalancer addresses, and a
//! packet to the node's own IPv6 address, port 22 (the early exit, as for
//! IPv4).
//!
//! A new flow cannot be repeated (the first run creates its conntrack
//! entry): those are timed one packet per run, each with a new source port,
//! so they include the timer's own overhead. Remote backends (FIB lookup,
//! SNAT, redirect) are not timed here: a repeated run would decrement the
//! TTL and allocate a new SNAT port each time; the north-south section
//! measures them with real traffic.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use lb::{
    datapath::MapSizes,
    model::{Backend, BackendState, Frontend, FrontendKind, Protocol, Service, ServiceName},
};
use lb_testkit::{
    dataplane::{
        Dataplane, CLIENT_IP, CLIENT_IP6, CLIENT_MAC, EXT0_MAC, NODE_IP, NODE_IP6, TC_ACT_OK,
        XDP_PASS,
    },
    packets::{self, ACK, SYN},
    unique,
};

use crate::{
    profile::Profile,
    workload::{map_size, service, Svc, Workload},
};

#[derive(Clone, Debug)]
pub struct PacketResult {
    pub services: usize,
    pub program: &'static str,
    pub path: &'static str,
    pub ns_per_packet: f64,
}

/// LoadBalancer addresses 198.18.0.1, ... (the benchmarking range, RFC 2544).
fn lb_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from_be_bytes([198, 18, 0, 0]) + i as u32 + 1)
}

pub fn run(p: &Profile) -> Vec<PacketResult> {
    let p = (p.packet_services.clone(), p.packet_repeat, p.new_flows);
    // The harness enters a namespace of its own on the calling thread.
    std::thread::spawn(move || p.0.iter().flat_map(|&n| one_scale(n, p.1, p.2)).collect())
        .join()
        .expect("packet bench")
}

/// The data path with N services loaded, and the packets the rows time.
struct Prepared {
    dp: Dataplane,
    w: Workload,
    established: Vec<u8>,
    miss: Vec<u8>,
    ping: Vec<u8>,
    ping6: Vec<u8>,
    miss6: Vec<u8>,
}

fn one_scale(n: usize, repeat: u32, new_flows: usize) -> Vec<PacketResult> {
    eprintln!("lb-bench: packet path at {n} services");
    let Prepared {
        dp,
        w,
        established,
        miss,
        ping,
        ping6,
        miss6,
    } = prepare(n, new_flows);
    // The kernel reports the mean per run.
    let row = |program, path, per_run: Duration| PacketResult {
        services: n,
        program,
        path,
        ns_per_packet: per_run.as_nanos() as f64,
    };
    const ESTABLISHED: &str = "established flow (conntrack hit, DNAT writing nothing)";
    const REWRITE: &str = "established flow (conntrack hit, real DNAT and checksums)";
    const MISS: &str = "not a service (passes)";
    const EMPTY: &str = "empty program (returns at once), same packet";
    const REWRITE6: &str = "IPv6 established flow (conntrack hit, real DNAT and checksums)";
    const MISS6: &str = "IPv6 not a service (passes)";

    let mut out = vec![
        row("tc", ESTABLISHED, dp.tc_ingress_timed(&established, repeat)),
        row("XDP", ESTABLISHED, dp.xdp_timed(&established, repeat)),
        row("tc", REWRITE, dp.tc_ingress_timed(&ping, repeat)),
        row("XDP", REWRITE, dp.xdp_timed(&ping, repeat)),
        row("tc", MISS, dp.tc_ingress_timed(&miss, repeat)),
        row("XDP", MISS, dp.xdp_timed(&miss, repeat)),
        row("tc", REWRITE6, dp.tc_ingress_timed(&ping6, repeat)),
        row("XDP", REWRITE6, dp.xdp_timed(&ping6, repeat)),
        row("tc", MISS6, dp.tc_ingress_timed(&miss6, repeat)),
        row("XDP", MISS6, dp.xdp_timed(&miss6, repeat)),
    ];
    // The floor: a program that only returns, on the same packet.
    for (program, xdp) in [("tc", false), ("XDP", true)] {
        let empty = lb_testkit::empty_program::load(xdp).expect("loading an empty program");
        let t = lb_testkit::empty_program::timed(&empty, &miss, repeat)
            .expect("running the empty program");
        out.push(row(program, EMPTY, t));
    }
    // New flows to a service with two real (other) backends: service lookup,
    // random choice, conntrack insert, DNAT. One run each.
    let target = w.services[0].vip;
    for (program, xdp) in [("tc", false), ("XDP", true)] {
        let mut total = Duration::ZERO;
        for i in 0..new_flows {
            let sport = 1024 + (i % 60_000) as u16;
            let src = Ipv4Addr::from(
                u32::from(CLIENT_IP) + ((i / 60_000) as u32 + if xdp { 100 } else { 0 }),
            );
            let pkt = packets::tcp(CLIENT_MAC, EXT0_MAC, src, target, sport, 80, SYN, b"");
            total += if xdp {
                dp.xdp_timed(&pkt, 1)
            } else {
                dp.tc_ingress_timed(&pkt, 1)
            };
        }
        out.push(row(
            program,
            "new flow (lookup, choice, conntrack insert, DNAT)",
            total / new_flows as u32,
        ));
    }
    out
}

fn prepare(n: usize, new_flows: usize) -> Prepared {
    let sizes = MapSizes {
        services: map_size(4 * n + 16),
        backends: map_size(2 * n + 16),
        revnat: map_size(n + 16),
        ct: (new_flows * 4 + 1024).max(262_144).next_power_of_two() as u32,
        ..MapSizes::default()
    };
    let mut dp = Dataplane::with_sizes(&unique(&format!("bench-pkt{n}")), &sizes);
    // N LoadBalancer services with two node-local backends each; the last
    // one's backend is its own address (see the module comment).
    let mut w = Workload::new(n, 2, &[]);
    for (i, s) in w.services.iter_mut().enumerate() {
        s.vip = lb_ip(i);
    }
    let mut model = w.model(FrontendKind::LoadBalancer);
    let last = w.last().clone();
    let mut svc = service(&last, FrontendKind::LoadBalancer);
    svc.frontends[0].backends = vec![Backend {
        address: last.vip.into(),
        port: last.port,
        state: BackendState::Active,
        local: true,
        weight: 1,
    }];
    model
        .services
        .insert(ServiceName::new("default", &last.name), svc);
    // The pair that forwards to each other, on two more addresses.
    let (a, b) = (lb_ip(n), lb_ip(n + 1));
    for (name, from, from_port, to, to_port) in [("ping", a, 80, b, 8080), ("pong", b, 8080, a, 80)]
    {
        let spec = Svc {
            name: name.to_string(),
            vip: from,
            port: from_port,
            endpoints: Vec::new(),
        };
        let mut svc = service(&spec, FrontendKind::LoadBalancer);
        svc.frontends[0].backends = vec![Backend {
            address: to.into(),
            port: to_port,
            state: BackendState::Active,
            local: true,
            weight: 1,
        }];
        model
            .services
            .insert(ServiceName::new("default", name), svc);
    }
    // The same pair over IPv6.
    let (a6, b6): (Ipv6Addr, Ipv6Addr) = (
        "2001:db8:18::a".parse().unwrap(),
        "2001:db8:18::b".parse().unwrap(),
    );
    for (name, from, from_port, to, to_port) in
        [("ping6", a6, 80, b6, 8080), ("pong6", b6, 8080, a6, 80)]
    {
        model.services.insert(
            ServiceName::new("default", name),
            lb6(from, from_port, to, to_port),
        );
    }
    dp.apply(&model);

    let established = packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, last.vip, 40_000, last.port, ACK, b"",
    );
    let miss = packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, NODE_IP, 40_000, 22, ACK, b"",
    );
    // The first run creates the flow; check that later runs take the path we mean to time.
    let (rc, out) = dp.tc_ingress(&established);
    assert_eq!(
        rc, TC_ACT_OK,
        "established flow: tc passes it to the local backend"
    );
    assert_eq!(
        packets::inspect(&out).daddr,
        last.vip,
        "the rewrite is idempotent"
    );
    assert_eq!(dp.xdp(&established).0, XDP_PASS);
    let ping = packets::tcp(CLIENT_MAC, EXT0_MAC, CLIENT_IP, a, 40_001, 80, ACK, b"");
    let (rc, once) = dp.tc_ingress(&ping);
    assert_eq!(rc, TC_ACT_OK);
    let seen = packets::inspect(&once);
    assert_eq!((seen.daddr, seen.dport), (b, 8080), "A's packet goes to B");
    let (_, twice) = dp.tc_ingress(&once);
    let seen = packets::inspect(&twice);
    assert_eq!(
        (seen.daddr, seen.dport),
        (a, 80),
        "and back: every run rewrites"
    );
    assert_eq!(dp.xdp(&ping).0, XDP_PASS);
    assert_eq!(dp.xdp(&once).0, XDP_PASS);
    assert_eq!(
        dp.tc_ingress(&miss),
        (TC_ACT_OK, miss.clone()),
        "non-service traffic passes untouched"
    );

    let ping6 = packets::tcp6(CLIENT_MAC, EXT0_MAC, CLIENT_IP6, a6, 40_002, 80, ACK, b"");
    let (rc, once6) = dp.tc_ingress(&ping6);
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(
        packets::inspect6(&once6).daddr,
        b6,
        "IPv6: A's packet goes to B"
    );
    assert_eq!(dp.xdp(&ping6).0, XDP_PASS);
    assert_eq!(dp.xdp(&once6).0, XDP_PASS);
    let miss6 = packets::tcp6(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP6, NODE_IP6, 40_000, 22, ACK, b"",
    );
    assert_eq!(
        dp.tc_ingress(&miss6),
        (TC_ACT_OK, miss6.clone()),
        "IPv6 non-service traffic passes untouched"
    );
    Prepared {
        dp,
        w,
        established,
        miss,
        ping,
        ping6,
        miss6,
    }
}

/// An IPv6 LoadBalancer service `from`:`from_port` with one node-local
/// backend `to`:`to_port`.
fn lb6(from: Ipv6Addr, from_port: u16, to: Ipv6Addr, to_port: u16) -> Service {
    Service {
        frontends: vec![Frontend {
            address: IpAddr::V6(from),
            port: from_port,
            port_index: 0,
            protocol: Protocol::Tcp,
            kind: FrontendKind::LoadBalancer,
            algorithm: Default::default(),
            affinity_timeout_s: None,
            maglev_table_size: None,
            external_traffic_local: false,
            source_ranges: Vec::new(),
            backends: vec![Backend {
                address: IpAddr::V6(to),
                port: to_port,
                state: BackendState::Active,
                local: true,
                weight: 1,
            }],
        }],
        health_check_node_port: None,
    }
}

#[cfg(test)]
mod tests {
    /// Not a test: one established-flow row run long enough to profile
    /// (`perf record -a` beside it), at 100 000 services. Root only.
    /// LB_PROFILE_ROW: xdp (default), tc, or xdp-same (the backend is the
    /// frontend: nothing rewritten).
    #[test]
    #[ignore]
    fn profile_established_flows() {
        let row = std::env::var("LB_PROFILE_ROW").unwrap_or_else(|_| "xdp".into());
        std::thread::spawn(move || {
            let p = super::prepare(100_000, 1);
            for _ in 0..3 {
                let t = match row.as_str() {
                    "tc" => p.dp.tc_ingress_timed(&p.ping, 20_000_000),
                    "xdp-same" => p.dp.xdp_timed(&p.established, 20_000_000),
                    _ => p.dp.xdp_timed(&p.ping, 20_000_000),
                };
                eprintln!("{row}: {t:?} per packet");
            }
        })
        .join()
        .unwrap();
    }
}
