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
//! Each node forwards, routes the other node's pod range via the other
//! node, and runs its own lb-agent (its own pin directory and an empty child
//! cgroup) with `--devices eth0`. Nothing touches the root namespace.
use std::{net::Ipv4Addr, path::PathBuf};

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

pub struct Node {
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
    pub hub: Netns,
}

fn sysctl(ns: &Netns, kv: &str) {
    run("ip", &["netns", "exec", &ns.name, "sysctl", "-qw", kv]);
}

impl Cluster {
    pub fn new(tag: &str) -> Self {
        let hub = Netns::create(&format!("lbt-{tag}-hub"));
        hub.ip(&["link", "add", "br0", "type", "bridge"]);
        hub.ip(&["link", "set", "br0", "up"]);
        let plug = |ns: &Netns, port: &str, addr: Ipv4Addr| {
            hub.ip(&[
                "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
            ]);
            hub.ip(&["link", "set", port, "master", "br0", "up"]);
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ns.ip(&["link", "set", "eth0", "up"]);
        };
        let client = Netns::create(&format!("lbt-{tag}-c"));
        plug(&client, "c0", CLIENT);
        client.ip(&["route", "add", LB_RANGE, "via", &NODE_A.to_string()]);
        let node = |name: &str, port: &str, addr: Ipv4Addr| {
            let ns = Netns::create(&format!("lbt-{tag}-{name}"));
            plug(&ns, port, addr);
            sysctl(&ns, "net.ipv4.conf.all.forwarding=1");
            ns
        };
        let (a_ns, b_ns) = (node("na", "na0", NODE_A), node("nb", "nb0", NODE_B));
        a_ns.ip(&["route", "add", "10.244.2.0/24", "via", &NODE_B.to_string()]);
        b_ns.ip(&["route", "add", "10.244.1.0/24", "via", &NODE_A.to_string()]);
        let pod = |name: &str, node: &Netns, gw: &str, addrs: &[Ipv4Addr]| {
            let ns = Netns::create(&format!("lbt-{tag}-{name}"));
            node.ip(&[
                "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
            ]);
            node.ip(&["addr", "add", &format!("{gw}/24"), "dev", "pod0"]);
            node.ip(&["link", "set", "pod0", "up"]);
            for a in addrs {
                ns.ip(&["addr", "add", &format!("{a}/24"), "dev", "eth0"]);
            }
            ns.ip(&["link", "set", "eth0", "up"]);
            ns.ip(&["route", "add", "default", "via", gw]);
            ns
        };
        let pod_a = pod("pa", &a_ns, "10.244.1.1", &[POD_A]);
        let pod_b = pod("pb", &b_ns, "10.244.2.1", &POD_B);
        let mk_node = |ns: Netns, n: &str| Node {
            cgroup: ChildCgroup::create(&format!("{tag}-{n}")),
            pins: PinDir::create(&format!("{tag}-{n}")),
            services: std::env::temp_dir().join(format!("lb-services-{tag}-{n}.yaml")),
            agent: None,
            ns,
        };
        Cluster {
            a: mk_node(a_ns, "a"),
            b: mk_node(b_ns, "b"),
            client_cgroup: ChildCgroup::create(&format!("{tag}-client")),
            tag: tag.to_string(),
            pod_a,
            pod_b,
            client,
            hub,
        }
    }

    /// Starts (or restarts) a node's agent on `services` (YAML), in its namespace.
    pub fn start(node: &mut Node, services: &str, extra: &[&str]) {
        std::fs::write(&node.services, services).unwrap();
        if let Some(mut a) = node.agent.take() {
            a.kill();
        }
        let mut args = vec!["--devices", "eth0"];
        args.extend_from_slice(extra);
        node.agent = Some(Agent::start_in_netns(
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
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
        let _ = std::fs::remove_file(&self.services);
    }
}
