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
//! the median run taken. Remote backends (FIB lookup, SNAT, DSR, redirect)
//! and replies through reverse NAT cannot be repeated either (the rewritten
//! packet is not one the path would take again): `packet_per_run` times
//! them one packet per run, with the rows that calibrate that method.
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
    packet_per_run::{self, Extra},
    profile::Profile,
    workload::{map_size, Workload},
};

#[derive(Clone, Debug)]
pub struct PacketResult {
    pub services: usize,
    pub program: &'static str,
    pub path: &'static str,
    pub timing: Timing,
    pub ns_per_packet: f64,
    /// One-packet-per-run rows: the anchor's median in the same runs (the
    /// local backend's established flow on the same hook).
    pub anchor_ns: Option<f64>,
}

/// How a row was timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// `repeat` runs on one buffer, the kernel's mean.
    Repeated,
    /// One fresh packet per run, the median run (includes a clock read
    /// pair and colder caches: see `packet_per_run`).
    PerRun,
}

pub const ESTABLISHED: &str = "established flow (conntrack hit, DNAT writing nothing)";
pub const REWRITE: &str = "established flow (conntrack hit, real DNAT and checksums)";
pub const MISS: &str = "not a service (passes)";
pub const EMPTY: &str = "empty program (returns at once), same packet";
/// The real-DNAT flow again, in alternating rounds with and without the
/// per-frontend counters (`--service-stats`): what counting costs.
pub const COUNTED: &str = "established flow, real DNAT, frontend counters on (alternating rounds)";
pub const UNCOUNTED: &str =
    "established flow, real DNAT, frontend counters off (alternating rounds)";
pub const REWRITE6: &str = "IPv6 established flow (conntrack hit, real DNAT and checksums)";
pub const MISS6: &str = "IPv6 not a service (passes)";

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
    extra: Extra,
    /// What was applied, and the address pair `ping` goes from and to.
    model: lb::model::Model,
    ping_dst: Ipv4Addr,
    ping_to: Ipv4Addr,
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
        extra,
        model,
        ping_dst,
        ping_to,
    } = prepare(n, new_flows);
    let mut dp = dp;
    // The kernel reports the mean per run.
    let row = |program, path, per_run: Duration| PacketResult {
        services: n,
        program,
        path,
        timing: Timing::Repeated,
        ns_per_packet: per_run.as_nanos() as f64,
        anchor_ns: None,
    };
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
    // What the per-frontend counters cost: the same pair of services, its
    // flows made before (counted: CT_F_COUNTED) and after (not) a restart
    // with --service-stats off, timed in alternating rounds (medians), so
    // drift over the run falls on both alike.
    dp.restart_with_service_stats(false);
    dp.apply(&model);
    let uncounted = packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, ping_dst, 40_003, 80, ACK, b"",
    );
    let (_, once) = dp.tc_ingress(&uncounted);
    assert_eq!(
        packets::inspect(&once).daddr,
        ping_to,
        "the uncounted flow is DNATed too"
    );
    dp.xdp(&uncounted);
    for (program, xdp) in [("tc", false), ("XDP", true)] {
        let time = |pkt: &[u8]| {
            if xdp {
                dp.xdp_timed(pkt, repeat)
            } else {
                dp.tc_ingress_timed(pkt, repeat)
            }
        };
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            on.push(time(&ping));
            off.push(time(&uncounted));
        }
        out.push(row(program, COUNTED, median(on.into_iter())));
        out.push(row(program, UNCOUNTED, median(off.into_iter())));
    }

    // The floor: a program that only returns, on the same packet, timed
    // both ways.
    let mut empty_per_run = Vec::new();
    for (program, xdp) in [("tc", false), ("XDP", true)] {
        let empty = lb_testkit::empty_program::load(xdp).expect("loading an empty program");
        let timed = |repeat| {
            lb_testkit::empty_program::timed(&empty, &miss, repeat)
                .expect("running the empty program")
        };
        out.push(row(program, EMPTY, timed(repeat)));
        empty_per_run.push((program, median((0..new_flows).map(|_| timed(1)))));
    }
    let per_run = |r: packet_per_run::PerRun| PacketResult {
        timing: Timing::PerRun,
        anchor_ns: r.anchor.map(|a| a.as_nanos() as f64),
        ..row(r.program, r.path, r.ns)
    };
    // New flows to a service with two real (other) backends: service lookup,
    // random choice, conntrack insert, DNAT. One run each: the median, and
    // the mean (which the tail of conntrack inserts moves; reports before
    // 2026-12-02 gave only the mean).
    let target = w.services[0].vip;
    for (program, xdp) in [("tc", false), ("XDP", true)] {
        let runs: Vec<Duration> = (0..new_flows)
            .map(|i| {
                let sport = 1024 + (i % 60_000) as u16;
                let src = Ipv4Addr::from(
                    u32::from(CLIENT_IP) + ((i / 60_000) as u32 + if xdp { 100 } else { 0 }),
                );
                let pkt = packets::tcp(CLIENT_MAC, EXT0_MAC, src, target, sport, 80, SYN, b"");
                if xdp {
                    dp.xdp_timed(&pkt, 1)
                } else {
                    dp.tc_ingress_timed(&pkt, 1)
                }
            })
            .collect();
        let mean = runs.iter().sum::<Duration>() / runs.len().max(1) as u32;
        for (path, t) in [(NEW_FLOW, median(runs.into_iter())), (NEW_FLOW_MEAN, mean)] {
            out.push(PacketResult {
                timing: Timing::PerRun,
                ..row(program, path, t)
            });
        }
    }
    // Hold-outs for the per-run estimate: repeated rows' paths.
    let holdouts: [(&'static str, &[u8]); 3] = [
        (ESTABLISHED, &established),
        (REWRITE, &ping),
        (REWRITE6, &ping6),
    ];
    out.extend(
        packet_per_run::rows(&dp, &extra, new_flows, &empty_per_run, &holdouts)
            .into_iter()
            .map(per_run),
    );
    out
}

pub const NEW_FLOW: &str = "new flow (lookup, choice, conntrack insert, DNAT)";
pub const NEW_FLOW_MEAN: &str =
    "new flow (lookup, choice, conntrack insert, DNAT), mean of the runs";

/// The median of some runs' times.
pub fn median(runs: impl Iterator<Item = Duration>) -> Duration {
    let mut v: Vec<Duration> = runs.collect();
    assert!(!v.is_empty(), "no runs to take the median of");
    v.sort_unstable();
    v[v.len() / 2]
}

fn prepare(n: usize, new_flows: usize) -> Prepared {
    let sizes = MapSizes {
        services: map_size(4 * n + 16),
        backends: map_size(2 * n + 16),
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
    model.services.insert(
        ServiceName::new("default", &last.name),
        one_backend(last.vip.into(), last.port, last.vip.into(), last.port, true),
    );
    // The pair that forwards to each other, on two more addresses, and the
    // same pair over IPv6.
    let (a, b) = (lb_ip(n), lb_ip(n + 1));
    let (a6, b6): (Ipv6Addr, Ipv6Addr) = (
        "2001:db8:18::a".parse().unwrap(),
        "2001:db8:18::b".parse().unwrap(),
    );
    for (name, from, from_port, to, to_port) in [
        ("ping", IpAddr::V4(a), 80, IpAddr::V4(b), 8080),
        ("pong", b.into(), 8080, a.into(), 80),
        ("ping6", a6.into(), 80, b6.into(), 8080),
        ("pong6", b6.into(), 8080, a6.into(), 80),
    ] {
        model.services.insert(
            ServiceName::new("default", name),
            one_backend(from, from_port, to, to_port, true),
        );
    }
    let extra = Extra::add(&mut model, lb_ip(n + 2), lb_ip(n + 3));
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
        extra,
        model,
        ping_dst: a,
        ping_to: b,
    }
}

/// A LoadBalancer service `from`:`from_port` with one backend `to`:`to_port`,
/// on this node or not.
pub fn one_backend(from: IpAddr, from_port: u16, to: IpAddr, to_port: u16, local: bool) -> Service {
    Service {
        frontends: vec![Frontend {
            address: from,
            port: from_port,
            port_index: 0,
            protocol: Protocol::Tcp,
            kind: FrontendKind::LoadBalancer,
            algorithm: Default::default(),
            affinity_timeout_s: None,
            maglev_table_size: None,
            external_traffic_local: false,
            forwarding: None,
            source_ranges: Vec::new(),
            backends: vec![Backend {
                address: to,
                port: to_port,
                state: BackendState::Active,
                local,
                weight: 1,
            }],
        }],
        health_check_node_port: None,
        metrics: false,
    }
}

#[cfg(test)]
mod tests {
    use lb_testkit::{
        dataplane::{CLIENT_IP, CLIENT_IP6, CLIENT_MAC, EXT0_MAC},
        packets::{self, ACK},
    };

    /// Not a test: one established-flow row run long enough to profile
    /// (`perf record -a` beside it), at 100 000 services. Root only.
    /// LB_PROFILE_ROW: xdp (default), tc, xdp-same (the backend is the
    /// frontend: nothing rewritten), or far / far6 (XDP, a remote backend
    /// with SNAT, one packet per run) and far-tc / far6-tc (the same in tc).
    #[test]
    #[ignore]
    fn profile_established_flows() {
        let row = std::env::var("LB_PROFILE_ROW").unwrap_or_else(|_| "xdp".into());
        std::thread::spawn(move || {
            let p = super::prepare(100_000, 1);
            if let Some((v6, tc)) = match row.as_str() {
                "far" => Some((false, false)),
                "far6" => Some((true, false)),
                "far-tc" => Some((false, true)),
                "far6-tc" => Some((true, true)),
                _ => None,
            } {
                // One packet per run (the path cannot be repeated), for as
                // many runs as a profile needs.
                let _ = super::packet_per_run::rows(&p.dp, &p.extra, 1, &[], &[]);
                let pkt = if v6 {
                    packets::tcp6(
                        CLIENT_MAC,
                        EXT0_MAC,
                        CLIENT_IP6,
                        p.extra.far6,
                        40_022,
                        80,
                        ACK,
                        b"",
                    )
                } else {
                    packets::tcp(
                        CLIENT_MAC,
                        EXT0_MAC,
                        CLIENT_IP,
                        p.extra.far,
                        40_021,
                        80,
                        ACK,
                        b"",
                    )
                };
                for _ in 0..3 {
                    let t = super::median((0..10_000_000).map(|_| {
                        if tc {
                            p.dp.tc_ingress_timed(&pkt, 1)
                        } else {
                            p.dp.xdp_timed(&pkt, 1)
                        }
                    }));
                    eprintln!("{row}: {t:?} per packet, one per run");
                }
                return;
            }
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
