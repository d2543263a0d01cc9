//! A node with pods, in network namespaces, for the pods' packet path:
//!
//! ```text
//!  routed (Calico-like)                    bridged (the CNI bridge plugin)
//!  [node] pv1 ── eth0 [pod1] 10.244.7.11   [node] cbr0 10.244.8.1/24
//!         pv2 ── eth0 [pod2] 10.244.7.12           ├─ pv1 ── eth0 [pod1] 10.244.8.11
//!   /32 routes to each pod; each pod's              └─ pv2 ── eth0 [pod2] 10.244.8.12
//!   gateway 169.254.1.1 is its veth's host
//!   end (a static neighbour entry)
//! ```
//!
//! The node namespace has no route out: a packet to a service address that
//! nothing translates goes nowhere. The agent runs in the node namespace
//! (it is the "host"); pods' processes join the test's cgroup and their
//! own namespace.
use std::net::Ipv4Addr;

use crate::{agent::PinDir, cgroup::ChildCgroup, netns::Netns, run};

/// The node's own address.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 70, 1);

pub struct PodNode {
    pub routed: bool,
    pub pods: Vec<Netns>,
    pub cgroup: ChildCgroup,
    pub pins: PinDir,
    pub services: std::path::PathBuf,
    // Last: everything above lives in it.
    pub node: Netns,
}

fn sysctl(ns: &str, kv: &str) {
    run("ip", &["netns", "exec", ns, "sysctl", "-qw", kv]);
}

/// The MAC address of `dev` in namespace `ns`.
fn mac(ns: &str, dev: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-o", "link", "show", dev])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC for {dev}: {text}"))
        .to_string()
}

/// A pod routed through its veth's host end (Calico's layout).
fn route_pod(node: &Netns, pod: &Netns, host_end: &str, addr: Ipv4Addr) {
    node.ip(&["link", "set", host_end, "up"]);
    node.ip(&["route", "add", &format!("{addr}/32"), "dev", host_end]);
    pod.ip(&["addr", "add", &format!("{addr}/32"), "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&[
        "route",
        "add",
        "169.254.1.1",
        "dev",
        "eth0",
        "scope",
        "link",
    ]);
    pod.ip(&[
        "neigh",
        "add",
        "169.254.1.1",
        "lladdr",
        &mac(&node.name, host_end),
        "dev",
        "eth0",
        "nud",
        "permanent",
    ]);
    pod.ip(&[
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
    ]);
}

impl PodNode {
    /// `pods` pods, routed (`true`) or on a bridge.
    pub fn new(tag: &str, pods: usize, routed: bool) -> Self {
        let node = Netns::create(&format!("lbt-{tag}-node"));
        sysctl(&node.name, "net.ipv4.conf.all.forwarding=1");
        // The node's own address (a node IP), the source of its own sockets.
        node.ip(&["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"]);
        if !routed {
            node.ip(&["link", "add", "cbr0", "type", "bridge"]);
            node.ip(&["addr", "add", "10.244.8.1/24", "dev", "cbr0"]);
            node.ip(&["link", "set", "cbr0", "up"]);
        }
        let pods = (0..pods)
            .map(|i| {
                let ns = Netns::create(&format!("lbt-{tag}-p{}", i + 1));
                let host_end = format!("pv{}", i + 1);
                node.ip(&[
                    "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns",
                    &ns.name,
                ]);
                let addr = Self::pod_ip(routed, i);
                if routed {
                    route_pod(&node, &ns, &host_end, addr);
                } else {
                    node.ip(&["link", "set", &host_end, "master", "cbr0", "up"]);
                    ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
                    ns.ip(&["link", "set", "eth0", "up"]);
                    ns.ip(&["route", "add", "default", "via", "10.244.8.1"]);
                }
                ns
            })
            .collect();
        let cgroup = ChildCgroup::create(tag);
        let pins = PinDir::create(tag);
        Self {
            routed,
            pods,
            cgroup,
            pins,
            services: std::env::temp_dir().join(format!("lb-services-{tag}.yaml")),
            node,
        }
    }

    /// Address of pod `i` (0-based).
    pub fn pod_ip(routed: bool, i: usize) -> Ipv4Addr {
        if routed {
            Ipv4Addr::new(10, 244, 7, 11 + i as u8)
        } else {
            Ipv4Addr::new(10, 244, 8, 11 + i as u8)
        }
    }

    pub fn ip_of(&self, i: usize) -> Ipv4Addr {
        Self::pod_ip(self.routed, i)
    }

    /// A pod made after the agent started (its device appears later).
    pub fn add_pod(&mut self, tag: &str) -> usize {
        let i = self.pods.len();
        let ns = Netns::create(&format!("lbt-{tag}-p{}", i + 1));
        let host_end = format!("pv{}", i + 1);
        self.node.ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ]);
        let addr = self.ip_of(i);
        if self.routed {
            route_pod(&self.node, &ns, &host_end, addr);
        } else {
            self.node
                .ip(&["link", "set", &host_end, "master", "cbr0", "up"]);
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ns.ip(&["link", "set", "eth0", "up"]);
            ns.ip(&["route", "add", "default", "via", "10.244.8.1"]);
        }
        self.pods.push(ns);
        i
    }
}

impl Drop for PodNode {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.services);
    }
}
