//! Packet rows that a repeated BPF_PROG_TEST_RUN cannot time: every path
//! whose rewrite turns the packet into one the next run would not take the
//! same way. A packet to a remote backend leaves with the node's source
//! address and a SNAT port (the next run would see a packet from the node
//! to a pod, not a client's to a service) and one hop less to live; a reply
//! leaves from the service (the next run would see a packet from the
//! service, not from a backend).
//!
//! These are timed one packet per run, the same packet handed in fresh each
//! time (the kernel copies it in for every run), and the median run taken.
//! One run brackets the program with a clock read pair that `repeat`
//! spreads over a million runs, and the syscall around it leaves colder
//! caches, so the raw numbers are not comparable with the repeated rows.
//! Each row's runs alternate with runs of an anchor: the local backend's
//! established flow on the same hook, which the repeated rows also time
//! (their "real DNAT" row). The report estimates a row as its median less
//! the anchor's median in the same runs plus the anchor's repeated time,
//! and checks the method on hold-outs: repeated rows timed this way too.
//!
//! Every timed run is checked with the programs' counters: each run of a
//! row and of the anchor forwarded (or reverse-translated) one packet, and
//! the route cache answered (or, in the row that times a FIB lookup, did
//! not). All rows time one hot flow again and again: a best case for the
//! caches, as the repeated rows are.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use lb::model::{Model, ServiceName};
use lb_common::{
    config::{CFG_LB_MODE, CNT_FIB_LOOKUPS, CNT_NP_FORWARD, CNT_NP_REVERSE},
    nodeport::{MODE_DSR, MODE_SNAT},
};
use lb_testkit::{
    dataplane::{
        Dataplane, CLIENT_IP, CLIENT_IP6, CLIENT_MAC, EXT0_MAC, NODE_B_MAC, NODE_IP, NODE_IP6,
        TC_ACT_OK, TC_ACT_REDIRECT, XDP_PASS, XDP_TX,
    },
    packets::{self, ACK},
};

use crate::packet::{median, one_backend};

/// The services these rows use, beside the bench's N: a LoadBalancer
/// address with a backend on node B (10.244.2.0/24 and fd00:244:2::/64
/// are routed there) and one with a backend on this node.
pub struct Extra {
    pub far: Ipv4Addr,
    pub far6: Ipv6Addr,
    pub near: Ipv4Addr,
}

const FAR_BACKEND: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 10);
const FAR_BACKEND6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 0x10);
const NEAR_BACKEND: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 10);
const BACKEND_PORT: u16 = 8080;

impl Extra {
    /// Adds the services to `model`, on addresses `far`, `near` and
    /// 2001:db8:18::c (none of the bench's own).
    pub fn add(model: &mut Model, far: Ipv4Addr, near: Ipv4Addr) -> Self {
        let far6: Ipv6Addr = "2001:db8:18::c".parse().unwrap();
        for (name, vip, backend, local) in [
            ("far", IpAddr::V4(far), IpAddr::V4(FAR_BACKEND), false),
            ("far6", far6.into(), FAR_BACKEND6.into(), false),
            ("near", near.into(), NEAR_BACKEND.into(), true),
        ] {
            model.services.insert(
                ServiceName::new("default", name),
                one_backend(vip, 80, backend, BACKEND_PORT, local),
            );
        }
        Self { far, far6, near }
    }
}

/// Times each path `runs` times, one packet per run, and the `holdouts`
/// (repeated rows' paths and packets) the same way. Checks first (one run
/// each) that every packet takes the path its row names, then counts what
/// the timed runs did.
pub fn rows(
    dp: &Dataplane,
    e: &Extra,
    runs: usize,
    empty: &[(&'static str, Duration)],
    holdouts: &[(&'static str, &[u8])],
) -> Vec<PerRun> {
    dp.config(CFG_LB_MODE, MODE_SNAT);

    // A local backend: the same work as the repeated "real DNAT" row.
    let near = from_client(e.near, 40_020, ACK);
    let (rc, once) = dp.tc_ingress(&near);
    assert_eq!(rc, TC_ACT_OK, "local backend: the stack delivers");
    assert_eq!(packets::inspect(&once).daddr, NEAR_BACKEND);
    let (rc, once) = dp.xdp(&near);
    assert_eq!(rc, XDP_PASS);
    assert_eq!(
        packets::inspect(&once).daddr,
        NEAR_BACKEND,
        "XDP: DNAT, the stack delivers"
    );
    // Its reply, on the way out: reverse DNAT on tc egress.
    let near_reply = from_pod(NEAR_BACKEND, 40_020);
    let (rc, back) = dp.tc_egress(&near_reply);
    assert_eq!(rc, TC_ACT_OK);
    let v = packets::inspect(&back);
    assert_eq!(
        (v.saddr, v.sport),
        (e.near, 80),
        "the reply leaves from the service"
    );

    // A remote backend, SNAT: FIB lookup, DNAT, SNAT, redirect.
    let far = from_client(e.far, 40_021, ACK);
    let (rc, once) = dp.tc_ingress(&far);
    assert_eq!(rc, TC_ACT_REDIRECT, "remote backend: redirected");
    let v = packets::inspect(&once);
    assert_eq!(
        (v.saddr, v.daddr, v.eth_dst),
        (NODE_IP, FAR_BACKEND, NODE_B_MAC)
    );
    let snat_port = v.sport;
    let (rc, xdp_once) = dp.xdp(&far);
    assert_eq!(rc, XDP_TX, "XDP sends it back out of the device");
    assert_eq!(
        packets::inspect(&xdp_once).sport,
        snat_port,
        "one flow, one SNAT port"
    );
    // The backend's reply to the SNAT port: reverse SNAT and DNAT, FIB, redirect.
    let far_reply = packets::tcp(
        NODE_B_MAC,
        EXT0_MAC,
        FAR_BACKEND,
        NODE_IP,
        BACKEND_PORT,
        snat_port,
        ACK,
        b"",
    );
    let (rc, back) = dp.tc_ingress(&far_reply);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = packets::inspect(&back);
    assert_eq!(
        (v.saddr, v.sport, v.daddr, v.dport, v.eth_dst),
        (e.far, 80, CLIENT_IP, 40_021, CLIENT_MAC),
        "the reply goes back to the client from the service"
    );
    assert_eq!(dp.xdp(&far_reply).0, XDP_TX);

    // The same over IPv6.
    let far6 = packets::tcp6(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP6, e.far6, 40_022, 80, ACK, b"",
    );
    let (rc, once6) = dp.tc_ingress(&far6);
    assert_eq!(rc, TC_ACT_REDIRECT, "IPv6 remote backend: redirected");
    let v6 = packets::inspect6(&once6);
    assert_eq!((v6.saddr, v6.daddr), (NODE_IP6, FAR_BACKEND6));
    let far6_reply = packets::tcp6(
        NODE_B_MAC,
        EXT0_MAC,
        FAR_BACKEND6,
        NODE_IP6,
        BACKEND_PORT,
        v6.sport,
        ACK,
        b"",
    );
    let (rc, back6) = dp.tc_ingress(&far6_reply);
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(packets::inspect6(&back6).saddr, e.far6);
    assert_eq!(dp.xdp(&far6).0, XDP_TX);
    assert_eq!(dp.xdp(&far6_reply).0, XDP_TX);

    let t = Timer {
        dp,
        runs: runs.max(1),
        anchor: &near,
    };
    let mut out: Vec<PerRun> = empty
        .iter()
        .map(|&(program, ns)| PerRun {
            program,
            path: EMPTY,
            ns,
            anchor: None,
        })
        .collect();
    for hook in [Hook::Tc, Hook::Xdp] {
        // The anchor alone.
        let (ns, _) = t.paired(hook, &near, Kind::Anchor, Route::None);
        out.push(PerRun {
            program: hook.name(),
            path: LOCAL,
            ns,
            anchor: None,
        });
        for (path, packet, kind, route) in [
            (SNAT, &far, Kind::Forward, Route::Cached),
            (SNAT, &far, Kind::Forward, Route::Looked),
            (SNAT_REPLY, &far_reply, Kind::Reverse, Route::Cached),
            (SNAT6, &far6, Kind::Forward, Route::Cached),
            (SNAT6_REPLY, &far6_reply, Kind::Reverse, Route::Cached),
        ] {
            let path = if route == Route::Looked {
                SNAT_FIB
            } else {
                path
            };
            out.push(t.row(hook, path, packet, kind, route));
        }
        // Hold-outs: paths the repeated rows measure, timed this way too.
        for &(path, packet) in holdouts {
            out.push(t.row(hook, path, packet, Kind::Forward, Route::None));
        }
    }
    out.push(t.row(
        Hook::TcEgress,
        LOCAL_REPLY,
        &near_reply,
        Kind::Reverse,
        Route::None,
    ));

    // DSR: the client's address kept, the service named in an IP option on
    // the first packet; later packets follow conntrack. Last: the mode is a
    // node-wide setting.
    dp.config(CFG_LB_MODE, MODE_DSR);
    let syn = from_client(e.far, 40_023, packets::SYN);
    let (rc, with_option) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(
        packets::inspect(&with_option).options.len(),
        8,
        "DSR option"
    );
    let dsr = from_client(e.far, 40_023, ACK);
    let (rc, once) = dp.tc_ingress(&dsr);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = packets::inspect(&once);
    assert_eq!(
        (v.saddr, v.daddr, v.options.len()),
        (CLIENT_IP, FAR_BACKEND, 0),
        "DSR: client address kept, no option after the first packet"
    );
    let (rc, once) = dp.xdp(&dsr);
    assert_eq!(rc, XDP_TX, "XDP forwards an established DSR flow");
    assert_eq!(packets::inspect(&once).saddr, CLIENT_IP);
    // The backend's node (this program again) learns the service from the
    // option; its pod's reply leaves from the service.
    assert_eq!(dp.tc_ingress(&with_option).0, TC_ACT_OK);
    let dsr_reply = from_pod(FAR_BACKEND, 40_023);
    let (rc, back) = dp.tc_egress(&dsr_reply);
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(packets::inspect(&back).saddr, e.far);
    for hook in [Hook::Tc, Hook::Xdp] {
        out.push(t.row(hook, DSR, &dsr, Kind::Forward, Route::Cached));
    }
    out.push(t.row(
        Hook::TcEgress,
        DSR_REPLY,
        &dsr_reply,
        Kind::Reverse,
        Route::None,
    ));
    dp.config(CFG_LB_MODE, MODE_SNAT);
    out
}

/// A client's TCP packet to `vip`, port 80.
fn from_client(vip: Ipv4Addr, sport: u16, flags: u8) -> Vec<u8> {
    packets::tcp(CLIENT_MAC, EXT0_MAC, CLIENT_IP, vip, sport, 80, flags, b"")
}

/// A pod's reply on this node (`backend`:8080 to the client's `cport`), as
/// it leaves for the client: what tc egress sees.
fn from_pod(backend: Ipv4Addr, cport: u16) -> Vec<u8> {
    packets::tcp(
        [0; 6],
        CLIENT_MAC,
        backend,
        CLIENT_IP,
        BACKEND_PORT,
        cport,
        ACK,
        b"",
    )
}

/// A one-packet-per-run row: the median run, and the median run of the
/// anchor in the same runs (None for the anchor and the empty program).
pub struct PerRun {
    pub program: &'static str,
    pub path: &'static str,
    pub ns: Duration,
    pub anchor: Option<Duration>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    Tc,
    Xdp,
    TcEgress,
}

impl Hook {
    fn name(self) -> &'static str {
        match self {
            Hook::Tc => "tc",
            Hook::Xdp => "XDP",
            Hook::TcEgress => "tc egress",
        }
    }
}

/// What one run of a row does, as the counters see it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The anchor itself: one packet forwarded.
    Anchor,
    /// One packet forwarded (to a backend).
    Forward,
    /// One packet translated back (a reply).
    Reverse,
}

/// What the route cache must have done across a row's runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Not a routed path: no FIB lookup at all.
    None,
    /// Answered from the cache: a lookup at most when the clock's epoch
    /// turns.
    Cached,
    /// A FIB lookup every run: the runs alternate the ingress device
    /// between ext0 and its veth peer, and the cache answers only for the
    /// device it looked up for.
    Looked,
}

struct Timer<'a> {
    dp: &'a Dataplane,
    runs: usize,
    /// The local backend's established flow.
    anchor: &'a [u8],
}

impl Timer<'_> {
    fn row(
        &self,
        hook: Hook,
        path: &'static str,
        packet: &[u8],
        kind: Kind,
        route: Route,
    ) -> PerRun {
        let (ns, anchor) = self.paired(hook, packet, kind, route);
        PerRun {
            program: hook.name(),
            path,
            ns,
            anchor: Some(anchor),
        }
    }

    /// `runs` runs of `packet` on `hook`, each followed by one of the
    /// anchor on the same program type (tc ingress for both tc hooks): the
    /// medians of both. Panics when the counters say a run took another
    /// path.
    fn paired(&self, hook: Hook, packet: &[u8], kind: Kind, route: Route) -> (Duration, Duration) {
        let dp = self.dp;
        let peer = lb::sys::netdev::ifindex("ext0p").expect("ext0p");
        let counters = || {
            (
                dp.counter(CNT_NP_FORWARD),
                dp.counter(CNT_NP_REVERSE),
                dp.counter(CNT_FIB_LOOKUPS),
            )
        };
        let before = counters();
        let mut row = Vec::with_capacity(self.runs);
        let mut anchor = Vec::with_capacity(self.runs);
        for i in 0..self.runs {
            let ingress = if route == Route::Looked && i % 2 == 1 {
                peer
            } else {
                dp.ifindex
            };
            row.push(match hook {
                Hook::Tc => dp.tc_ingress_timed_on(ingress, packet, 1),
                Hook::Xdp => dp.xdp_timed_on(ingress, packet, 1),
                Hook::TcEgress => dp.tc_egress_timed(packet, 1),
            });
            if kind != Kind::Anchor {
                anchor.push(if hook == Hook::Xdp {
                    dp.xdp_timed(self.anchor, 1)
                } else {
                    dp.tc_ingress_timed(self.anchor, 1)
                });
            }
        }
        let after = counters();
        let runs = self.runs as u64;
        let (forward, reverse) = match kind {
            Kind::Anchor => (runs, 0),
            Kind::Forward => (2 * runs, 0),
            Kind::Reverse => (runs, runs),
        };
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (forward, reverse),
            "{}: every run (and the anchor's) forwarded or translated back one packet",
            hook.name()
        );
        let lookups = after.2 - before.2;
        match route {
            Route::None => assert_eq!(lookups, 0, "{}: no FIB lookup", hook.name()),
            Route::Cached => assert!(
                lookups <= 3 + runs / 1000,
                "{}: {lookups} FIB lookups in {runs} runs of a cached route",
                hook.name()
            ),
            // (The first run may still find the previous row's answer.)
            Route::Looked => assert!(
                lookups + 1 >= runs,
                "{}: {lookups} FIB lookups in {runs} runs that should each look up",
                hook.name()
            ),
        }
        let anchor = if anchor.is_empty() {
            Duration::ZERO
        } else {
            median(anchor.into_iter())
        };
        (median(row.into_iter()), anchor)
    }
}

pub const EMPTY: &str = "empty program (returns at once)";
pub const LOCAL: &str = "established flow, local backend (conntrack hit, DNAT)";
pub const LOCAL_REPLY: &str = "reply from a local backend (reverse DNAT)";
pub const SNAT: &str = "established flow, remote backend (conntrack hit, DNAT, SNAT, cached route)";
pub const SNAT_FIB: &str =
    "established flow, remote backend, route cache missed (conntrack hit, DNAT, SNAT, FIB lookup)";
pub const SNAT_REPLY: &str = "reply from a remote backend (reverse SNAT and DNAT, cached route)";
pub const SNAT6: &str =
    "IPv6 established flow, remote backend (conntrack hit, DNAT, SNAT, cached route)";
pub const SNAT6_REPLY: &str =
    "IPv6 reply from a remote backend (reverse SNAT and DNAT, cached route)";
pub const DSR: &str = "established flow, remote backend, DSR (conntrack hit, DNAT, cached route)";
pub const DSR_REPLY: &str = "DSR reply on the backend's node (reverse DNAT)";
