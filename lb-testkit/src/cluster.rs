//! Two nodes and an outside client in network namespaces, for the
//! north-south path with real traffic:
//!
//! ```text
//!   [client] 192.168.60.1 ──┐
//!   [node-a] 192.168.60.2 ──┼── br0 in [hub]        (the "external" segment)
//!   [node-b] 192.168.60.3 ──┘
//!      │ pa0 10.244.1.1           │ pb0 10.244.2.1
//!   [pod-a] 10.244.1.10        [pod-b] 10.244.2.10, .11, .12
//! ```
//!
//! Every link is dual-stack: the external segment is also fd00:60::/64
//! (client ::1, node A ::2, node B ::3), pod A fd00:244:1::10, pod B
//! fd00:244:2::10, ::11, ::12, routed the same way.
//!
//! Each node forwards, routes the other node's pod range via the other
//! node, and runs its own lb-agent (its own pin directory and an empty child
//! cgroup) with `--devices eth0`. Nothing touches the root namespace.
use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use crate::{
    agent::{Agent, PinDir},
    cgroup::ChildCgroup,
    netns::Netns,
    run,
};

pub const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 1);
pub const NODE_A: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 2);
pub const NODE_B: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 3);
pub const POD_A: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 10);
pub const POD_B: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 244, 2, 10),
    Ipv4Addr::new(10, 244, 2, 11),
    Ipv4Addr::new(10, 244, 2, 12),
];
/// LoadBalancer addresses, routed by the client to node A (or B).
pub const LB_RANGE: &str = "203.0.113.0/24";
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x60, 0, 0, 0, 0, 0, 1);
pub const NODE_A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x60, 0, 0, 0, 0, 0, 2);
pub const NODE_B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x60, 0, 0, 0, 0, 0, 3);
pub const POD_A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 0x10);
pub const POD_B6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 0x10),
    Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 0x11),
    Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 0x12),
];
/// IPv6 LoadBalancer addresses, routed by the client to node A.
pub const LB_RANGE6: &str = "2001:db8:40::/64";
/// The router of `Options::router_mtu`, on the external segment.
pub const ROUTER: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 4);
pub const ROUTER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x60, 0, 0, 0, 0, 0, 4);

/// How the cluster's links behave.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// GRO on the nodes' external devices, as a real NIC has it: bulk
    /// traffic then reaches the programs as merged (GSO) packets.
    pub gro: bool,
    /// Node A reaches node B's pods through a router whose link to node B
    /// has this MTU (the rest of the path is 1500): packets that no longer
    /// fit meet a router that answers "fragmentation needed".
    pub router_mtu: Option<u32>,
    /// Node A's own route to node B's pods has this MTU (node A itself must
    /// answer "fragmentation needed").
    pub route_mtu: Option<u32>,
    /// Senders put full checksums in every packet (tx checksum offload off on
    /// the client's and the pods' devices), as frames off a real wire have.
    /// veth otherwise hands on packets whose checksum the receiver never
    /// computes (CHECKSUM_PARTIAL), which XDP cannot tell apart.
    pub full_checksums: bool,
    /// Node A reaches the segment through a Linux bridge `up0` holding its
    /// eth0 (the address on the bridge), a device without native XDP.
    pub bridged_uplink_a: bool,
    /// The bridge ports run an XDP_PASS program so that veth delivers frames
    /// a node sends out with XDP_TX or an XDP redirect (see `xdp_pass`).
    pub xdp_ready: bool,
    /// The segment drops what many clouds' fabrics drop: IPv4 packets with
    /// options and IPv6 packets with a Destination Options header (an
    /// nftables rule on the hub's bridge, counted there: `fabric_drops`).
    pub drop_ip_options: bool,
}

pub struct Node {
    /// The external device the agent serves (`--devices`).
    pub device: String,
    pub ns: Netns,
    pub cgroup: ChildCgroup,
    pub pins: PinDir,
    pub services: PathBuf,
    pub agent: Option<Agent>,
}

pub struct Cluster {
    pub tag: String,
    pub pod_a: Netns,
    pub pod_b: Netns,
    pub a: Node,
    pub b: Node,
    pub client: Netns,
    /// An empty cgroup for the client's probes (no program on it).
    pub client_cgroup: ChildCgroup,
    /// The router of `Options::router_mtu`.
    pub router: Option<Netns>,
    /// XDP_PASS links on the bridge ports (`Options::xdp_ready`).
    pub xdp_links: Vec<std::os::fd::OwnedFd>,
    pub hub: Netns,
}

fn sysctl(ns: &Netns, kv: &str) {
    run("ip", &["netns", "exec", &ns.name, "sysctl", "-qw", kv]);
}

/// `ethtool -K DEV FEATURE on|off` inside a namespace.
pub fn ethtool(ns: &Netns, dev: &str, feature: &str, on: bool) {
    run(
        "ip",
        &[
            "netns",
            "exec",
            &ns.name,
            "ethtool",
            "-K",
            dev,
            feature,
            if on { "on" } else { "off" },
        ],
    );
}

impl Cluster {
    pub fn new(tag: &str) -> Self {
        Self::with(tag, &Options::default())
    }

    pub fn with(tag: &str, opts: &Options) -> Self {
        let hub = Netns::create(&format!("lbt-{tag}-hub"));
        hub.ip(&["link", "add", "br0", "type", "bridge"]);
        hub.ip(&["link", "set", "br0", "up"]);
        if opts.drop_ip_options {
            for rule in [
                "add table bridge fabric",
                "add chain bridge fabric forward { type filter hook forward priority 0; }",
                "add rule bridge fabric forward ip hdrlength != 5 counter drop",
                "add rule bridge fabric forward ip6 nexthdr 60 counter drop",
            ] {
                crate::run("ip", &["netns", "exec", &hub.name, "nft", rule]);
            }
        }
        // `nodad`: IPv6 addresses usable at once (no duplicate address
        // detection to wait for on links we made).
        let plug = |ns: &Netns, port: &str, addr: Ipv4Addr, addr6: Ipv6Addr| {
            hub.ip(&[
                "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
            ]);
            hub.ip(&["link", "set", port, "master", "br0", "up"]);
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ns.ip(&[
                "addr",
                "add",
                &format!("{addr6}/64"),
                "dev",
                "eth0",
                "nodad",
            ]);
            ns.ip(&["link", "set", "eth0", "up"]);
        };
        let client = Netns::create(&format!("lbt-{tag}-c"));
        plug(&client, "c0", CLIENT, CLIENT6);
        client.ip(&["route", "add", LB_RANGE, "via", &NODE_A.to_string()]);
        client.ip(&["-6", "route", "add", LB_RANGE6, "via", &NODE_A6.to_string()]);
        let node = |name: &str, port: &str, addr: Ipv4Addr, addr6: Ipv6Addr| {
            let ns = Netns::create(&format!("lbt-{tag}-{name}"));
            plug(&ns, port, addr, addr6);
            sysctl(&ns, "net.ipv4.conf.all.forwarding=1");
            sysctl(&ns, "net.ipv6.conf.all.forwarding=1");
            ns
        };
        let (a_ns, b_ns) = (
            node("na", "na0", NODE_A, NODE_A6),
            node("nb", "nb0", NODE_B, NODE_B6),
        );
        if opts.bridged_uplink_a {
            a_ns.ip(&["link", "add", "up0", "type", "bridge"]);
            a_ns.ip(&["addr", "del", &format!("{NODE_A}/24"), "dev", "eth0"]);
            a_ns.ip(&["addr", "del", &format!("{NODE_A6}/64"), "dev", "eth0"]);
            a_ns.ip(&["link", "set", "eth0", "master", "up0"]);
            a_ns.ip(&["addr", "add", &format!("{NODE_A}/24"), "dev", "up0"]);
            a_ns.ip(&[
                "addr",
                "add",
                &format!("{NODE_A6}/64"),
                "dev",
                "up0",
                "nodad",
            ]);
            a_ns.ip(&["link", "set", "up0", "up"]);
        }
        if opts.gro {
            ethtool(&a_ns, "eth0", "gro", true);
            ethtool(&b_ns, "eth0", "gro", true);
        }
        if opts.full_checksums {
            ethtool(&client, "eth0", "tx", false);
        }
        let router = opts.router_mtu.map(|mtu| {
            // [node A] ── br0 ── [router] 10.255.0.1 ══ mtu ══ 10.255.0.2 [node B]
            // IPv6 the same way: fd00:255::1 ══ fd00:255::2.
            let r = node("rt", "rt0", ROUTER, ROUTER6);
            r.ip(&[
                "link",
                "add",
                "rb0",
                "mtu",
                &mtu.to_string(),
                "type",
                "veth",
                "peer",
                "name",
                "rb0",
                "netns",
                &b_ns.name,
            ]);
            r.ip(&["addr", "add", "10.255.0.1/30", "dev", "rb0"]);
            r.ip(&["link", "set", "rb0", "up"]);
            b_ns.ip(&["addr", "add", "10.255.0.2/30", "dev", "rb0"]);
            b_ns.ip(&["link", "set", "rb0", "up"]);
            r.ip(&["route", "add", "10.244.2.0/24", "via", "10.255.0.2"]);
            r.ip(&["addr", "add", "fd00:255::1/64", "dev", "rb0", "nodad"]);
            b_ns.ip(&["addr", "add", "fd00:255::2/64", "dev", "rb0", "nodad"]);
            r.ip(&[
                "-6",
                "route",
                "add",
                "fd00:244:2::/64",
                "via",
                "fd00:255::2",
            ]);
            r
        });
        let via_b = if router.is_some() { ROUTER } else { NODE_B };
        let mut route_b = vec!["route", "add", "10.244.2.0/24", "via"];
        let via_b = via_b.to_string();
        route_b.push(&via_b);
        let mtu = opts.route_mtu.map(|m| m.to_string());
        if let Some(m) = &mtu {
            route_b.extend(["mtu", "lock", m.as_str()]);
        }
        a_ns.ip(&route_b);
        b_ns.ip(&["route", "add", "10.244.1.0/24", "via", &NODE_A.to_string()]);
        // IPv6 pods: the same routes (through the router when there is one).
        let via_b6 = if router.is_some() { ROUTER6 } else { NODE_B6 }.to_string();
        let mut route_b6 = vec!["-6", "route", "add", "fd00:244:2::/64", "via", &via_b6];
        if let Some(m) = &mtu {
            route_b6.extend(["mtu", "lock", m.as_str()]);
        }
        a_ns.ip(&route_b6);
        b_ns.ip(&[
            "-6",
            "route",
            "add",
            "fd00:244:1::/64",
            "via",
            &NODE_A6.to_string(),
        ]);
        let pod = |name: &str,
                   node: &Netns,
                   gw: &str,
                   addrs: &[Ipv4Addr],
                   gw6: &str,
                   addrs6: &[Ipv6Addr]| {
            let ns = Netns::create(&format!("lbt-{tag}-{name}"));
            node.ip(&[
                "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
            ]);
            node.ip(&["addr", "add", &format!("{gw}/24"), "dev", "pod0"]);
            node.ip(&["addr", "add", &format!("{gw6}/64"), "dev", "pod0", "nodad"]);
            node.ip(&["link", "set", "pod0", "up"]);
            for a in addrs {
                ns.ip(&["addr", "add", &format!("{a}/24"), "dev", "eth0"]);
            }
            for a in addrs6 {
                ns.ip(&["addr", "add", &format!("{a}/64"), "dev", "eth0", "nodad"]);
            }
            ns.ip(&["link", "set", "eth0", "up"]);
            ns.ip(&["route", "add", "default", "via", gw]);
            ns.ip(&["-6", "route", "add", "default", "via", gw6]);
            if opts.full_checksums {
                ethtool(&ns, "eth0", "tx", false);
            }
            ns
        };
        let pod_a = pod(
            "pa",
            &a_ns,
            "10.244.1.1",
            &[POD_A],
            "fd00:244:1::1",
            &[POD_A6],
        );
        let pod_b = pod("pb", &b_ns, "10.244.2.1", &POD_B, "fd00:244:2::1", &POD_B6);
        let mk_node = |ns: Netns, n: &str| Node {
            device: if n == "a" && opts.bridged_uplink_a {
                "up0".into()
            } else {
                "eth0".into()
            },
            cgroup: ChildCgroup::create(&format!("{tag}-{n}")),
            pins: PinDir::create(&format!("{tag}-{n}")),
            services: std::env::temp_dir().join(format!("lb-services-{tag}-{n}.yaml")),
            agent: None,
            ns,
        };
        let xdp_links = if opts.xdp_ready {
            ["c0", "na0", "nb0"]
                .iter()
                .chain(if router.is_some() {
                    &["rt0"][..]
                } else {
                    &[][..]
                })
                .map(|port| crate::xdp_pass::attach(&hub.name, port))
                .collect()
        } else {
            Vec::new()
        };
        Cluster {
            xdp_links,
            a: mk_node(a_ns, "a"),
            b: mk_node(b_ns, "b"),
            client_cgroup: ChildCgroup::create(&format!("{tag}-client")),
            tag: tag.to_string(),
            pod_a,
            pod_b,
            client,
            router,
            hub,
        }
    }

    /// Starts (or restarts) a node's agent on `services` (YAML), in its namespace.
    pub fn start(node: &mut Node, services: &str, extra: &[&str]) {
        Self::start_as(node, &crate::sibling_bin("lb-agent"), services, extra);
    }

    /// Like `start`, running `binary` (another release's lb-agent).
    pub fn start_as(node: &mut Node, binary: &std::path::Path, services: &str, extra: &[&str]) {
        std::fs::write(&node.services, services).unwrap();
        if let Some(mut a) = node.agent.take() {
            a.kill();
        }
        let device = node.device.clone();
        let mut args = vec!["--devices", device.as_str()];
        args.extend_from_slice(extra);
        node.agent = Some(Agent::start_in_netns_as(
            binary,
            &node.ns.name,
            &node.services,
            &node.cgroup.path,
            &node.pins.path,
            &args,
        ));
    }

    pub fn probe(&self, mode: &str, target: &str, n: usize) -> Vec<crate::probe::Attempt> {
        crate::probe::run(&self.client_cgroup.path, &self.client.name, mode, target, n)
    }

    /// A counter of a node's data path (`lb_common::config::CNT_*`), summed over CPUs.
    pub fn counter(node: &Node, index: u32) -> u64 {
        use aya::maps::{MapData, PerCpuArray};
        let map: PerCpuArray<MapData, u64> = PerCpuArray::try_from(
            lb::maps::bpf::open_pinned(&node.pins.path, lb_common::maps::LB_COUNTERS).unwrap(),
        )
        .unwrap();
        map.get(&index, 0).unwrap().iter().sum()
    }

    /// Packets the segment dropped for their IP options or extension
    /// headers (`Options::drop_ip_options`).
    pub fn fabric_drops(&self) -> u64 {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.hub.name])
            .args(["nft", "list", "table", "bridge", "fabric"])
            .output()
            .expect("nft list");
        String::from_utf8_lossy(&out.stdout)
            .split("packets ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
        let _ = std::fs::remove_file(&self.services);
    }
}
