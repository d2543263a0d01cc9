//! Packet rows that a repeated BPF_PROG_TEST_RUN cannot time: every path
//! whose rewrite turns the packet into one the next run would not take the
//! same way. A packet to a remote backend leaves with the node's source
//! address and a SNAT port (the next run would see a packet from the node
//! to a pod, not a client's to a service) and one hop less to live; a reply
//! leaves from the service (the next run would see a packet from the
//! service, not from a backend).
//!
//! These are timed one packet per run, the same packet handed in fresh each
//! time, and the median run taken. One run brackets the program with a
//! clock read pair that `repeat` spreads over a million runs, and the
//! syscall around it leaves colder caches, so the raw numbers are not
//! comparable with the repeated rows. Two rows calibrate them: an empty
//! program timed the same way (the per-run floor), and a conntrack hit to a
//! local backend timed both ways. The report subtracts the per-run floor and
//! adds the repeated floor back (`estimate`), and shows how far that
//! estimate lands from the repeated measurement of the same local path.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use lb::model::{Model, ServiceName};
use lb_common::{
    config::CFG_LB_MODE,
    nodeport::{MODE_DSR, MODE_SNAT},
};
use lb_testkit::{
    dataplane::{
        Dataplane, CLIENT_IP, CLIENT_IP6, CLIENT_MAC, EXT0_MAC, NODE_B_MAC, NODE_IP, NODE_IP6,
        TC_ACT_OK, TC_ACT_REDIRECT, XDP_PASS, XDP_TX,
    },
    packets::{self, ACK},
};

use crate::packet::{median, one_backend, Timing};

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

/// One row: the program, the path, and the median run.
pub type Row = (&'static str, &'static str, Timing, Duration);

/// Times each path `runs` times, one packet per run. Checks first (one
/// run each) that every packet takes the path its row names, so a change
/// in the programs cannot quietly time something else.
pub fn rows(
    dp: &Dataplane,
    e: &Extra,
    runs: usize,
    empty: &[(&'static str, Duration)],
) -> Vec<Row> {
    let median = |f: &dyn Fn() -> Duration| median((0..runs.max(1)).map(|_| f()));
    let mut out: Vec<Row> = empty
        .iter()
        .map(|&(program, t)| (program, EMPTY, Timing::PerRun, t))
        .collect();
    dp.config(CFG_LB_MODE, MODE_SNAT);

    // A local backend: the same work as the repeated "real DNAT" row.
    let near = packets::tcp(
        CLIENT_MAC, EXT0_MAC, CLIENT_IP, e.near, 40_020, 80, ACK, b"",
    );
    let (rc, once) = dp.tc_ingress(&near);
    assert_eq!(rc, TC_ACT_OK, "local backend: the stack delivers");
    assert_eq!(packets::inspect(&once).daddr, NEAR_BACKEND);
    assert_eq!(dp.xdp(&near).0, XDP_PASS);
    // Its reply, on the way out: reverse DNAT on tc egress.
    let near_reply = packets::tcp(
        [0; 6],
        CLIENT_MAC,
        NEAR_BACKEND,
        CLIENT_IP,
        BACKEND_PORT,
        40_020,
        ACK,
        b"",
    );
    let (rc, back) = dp.tc_egress(&near_reply);
    assert_eq!(rc, TC_ACT_OK);
    let v = packets::inspect(&back);
    assert_eq!(
        (v.saddr, v.sport),
        (e.near, 80),
        "the reply leaves from the service"
    );

    // A remote backend, SNAT: FIB lookup, DNAT, SNAT, redirect.
    let far = packets::tcp(CLIENT_MAC, EXT0_MAC, CLIENT_IP, e.far, 40_021, 80, ACK, b"");
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

    for (program, xdp) in [("tc", false), ("XDP", true)] {
        let run = |p: &[u8]| {
            if xdp {
                dp.xdp_timed(p, 1)
            } else {
                dp.tc_ingress_timed(p, 1)
            }
        };
        out.push((program, LOCAL, Timing::PerRun, median(&|| run(&near))));
        out.push((program, SNAT, Timing::PerRun, median(&|| run(&far))));
        out.push((
            program,
            SNAT_REPLY,
            Timing::PerRun,
            median(&|| run(&far_reply)),
        ));
        out.push((program, SNAT6, Timing::PerRun, median(&|| run(&far6))));
        out.push((
            program,
            SNAT6_REPLY,
            Timing::PerRun,
            median(&|| run(&far6_reply)),
        ));
    }
    out.push((
        "tc egress",
        LOCAL_REPLY,
        Timing::PerRun,
        median(&|| dp.tc_egress_timed(&near_reply, 1)),
    ));

    // DSR: the client's address kept, the service named in an IP option on
    // the first packet; later packets follow conntrack. Last: the mode is a
    // node-wide setting.
    dp.config(CFG_LB_MODE, MODE_DSR);
    let syn = packets::tcp(
        CLIENT_MAC,
        EXT0_MAC,
        CLIENT_IP,
        e.far,
        40_023,
        80,
        packets::SYN,
        b"",
    );
    let (rc, with_option) = dp.tc_ingress(&syn);
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(
        packets::inspect(&with_option).options.len(),
        8,
        "DSR option"
    );
    let dsr = packets::tcp(CLIENT_MAC, EXT0_MAC, CLIENT_IP, e.far, 40_023, 80, ACK, b"");
    let (rc, once) = dp.tc_ingress(&dsr);
    assert_eq!(rc, TC_ACT_REDIRECT);
    let v = packets::inspect(&once);
    assert_eq!(
        (v.saddr, v.daddr, v.options.len()),
        (CLIENT_IP, FAR_BACKEND, 0),
        "DSR: client address kept, no option after the first packet"
    );
    // The backend's node (this program again) learns the service from the
    // option; its pod's reply leaves from the service.
    assert_eq!(dp.tc_ingress(&with_option).0, TC_ACT_OK);
    let dsr_reply = packets::tcp(
        [0; 6],
        CLIENT_MAC,
        FAR_BACKEND,
        CLIENT_IP,
        BACKEND_PORT,
        40_023,
        ACK,
        b"",
    );
    let (rc, back) = dp.tc_egress(&dsr_reply);
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(packets::inspect(&back).saddr, e.far);
    let (xdp_rc, _) = dp.xdp(&dsr);
    out.push((
        "tc",
        DSR,
        Timing::PerRun,
        median(&|| dp.tc_ingress_timed(&dsr, 1)),
    ));
    if xdp_rc == XDP_TX {
        out.push((
            "XDP",
            DSR,
            Timing::PerRun,
            median(&|| dp.xdp_timed(&dsr, 1)),
        ));
    } else {
        assert_eq!(xdp_rc, XDP_PASS, "XDP leaves DSR flows to tc");
    }
    out.push((
        "tc egress",
        DSR_REPLY,
        Timing::PerRun,
        median(&|| dp.tc_egress_timed(&dsr_reply, 1)),
    ));
    dp.config(CFG_LB_MODE, MODE_SNAT);
    out
}

pub const EMPTY: &str = "empty program (returns at once)";
pub const LOCAL: &str = "established flow, local backend (conntrack hit, DNAT)";
pub const LOCAL_REPLY: &str = "reply from a local backend (reverse DNAT)";
pub const SNAT: &str = "established flow, remote backend (conntrack hit, DNAT, SNAT, FIB)";
pub const SNAT_REPLY: &str = "reply from a remote backend (reverse SNAT and DNAT, FIB)";
pub const SNAT6: &str = "IPv6 established flow, remote backend (conntrack hit, DNAT, SNAT, FIB)";
pub const SNAT6_REPLY: &str = "IPv6 reply from a remote backend (reverse SNAT and DNAT, FIB)";
pub const DSR: &str = "established flow, remote backend, DSR (conntrack hit, DNAT, FIB)";
pub const DSR_REPLY: &str = "DSR reply on the backend's node (reverse DNAT)";
