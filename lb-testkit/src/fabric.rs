//! The network of a Kubernetes test cluster with several nodes: one bridge,
//! the "fabric", that the control plane, every node and an outside client
//! hang on, a flat L2 underlay as in a rack. No overlay: each node routes
//! every other node's pod CIDR via that node's address (what kubenet and
//! cloud route controllers set up), and so does the control plane (the
//! apiserver's proxy dials pods).
//!
//! ```text
//!  [control plane] eth0 192.168.80.2     lo 10.255.0.1 (the apiserver)
//!  [node 1]        eth0 192.168.80.11    cni0 10.244.0.1/24 ── pods
//!  [node 2]        eth0 192.168.80.12    cni0 10.244.1.1/24 ── pods
//!  [node 3]        eth0 192.168.80.13    cni0 10.244.2.1/24 ── pods
//!  [client]        eth0 192.168.80.100   LoadBalancer range via node 1
//!       └──────────── fab0, a bridge in [fabric] ────────────┘
//! ```
//!
//! Everything lives in network namespaces made here: nothing is created in
//! the root namespace, and no namespace has a route out of the machine.
//! Every namespace has a blackhole route for the service CIDRs, so a service
//! address nothing translates goes nowhere.
use std::net::Ipv4Addr;

use crate::{k8s, netns::Netns};

/// The fabric's subnet.
pub const SUBNET: &str = "192.168.80.0/24";
/// The control plane's address on the fabric (the apiserver's own,
/// `k8s::ADVERTISE`, is routed via it).
pub const CONTROL_PLANE: Ipv4Addr = Ipv4Addr::new(192, 168, 80, 2);
/// The outside client's address on the fabric.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 168, 80, 100);
/// Addresses an outside client reaches through the nodes, as a cloud load
/// balancer's VIPs (LoadBalancer ingress IPs, external IPs), routed by the
/// client via a node (`Fabric::route_client`).
pub const LB_RANGE: &str = "203.0.113.0/24";

/// The address of node `i` (0-based) on the fabric.
pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        192,
        168,
        80,
        11 + u8::try_from(i).expect("at most 89 nodes"),
    )
}

/// The index of the node at `ip` (`node_ip`'s inverse).
pub fn index_of(ip: Ipv4Addr) -> usize {
    usize::from(ip.octets()[3] - 11)
}

/// The bridge, in a namespace of its own; removed (with every veth on it)
/// on drop.
pub struct Fabric {
    pub hub: Netns,
}

impl Fabric {
    pub fn new(tag: &str) -> Self {
        let hub = Netns::create(&format!("lbt-{tag}-fab"));
        hub.ip(&["link", "add", "fab0", "type", "bridge"]);
        hub.ip(&["link", "set", "fab0", "up"]);
        Self { hub }
    }

    /// Plugs `ns` into the fabric: a veth named `port` on the bridge, `eth0`
    /// with `addr` in `ns`; the service CIDRs blackholed there.
    pub fn plug(&self, ns: &Netns, port: &str, addr: Ipv4Addr) {
        self.hub.ip(&[
            "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ]);
        self.hub.ip(&["link", "set", port, "master", "fab0", "up"]);
        ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        ns.ip(&["link", "set", "eth0", "up"]);
        blackhole_service_cidrs(ns);
    }

    /// A node's namespace: on the fabric at `addr`, forwarding, the
    /// apiserver's address routed via the control plane, GRO on its device
    /// as a real NIC has it (bulk traffic reaches the programs as merged
    /// packets).
    pub fn plug_node(&self, ns: &Netns, port: &str, addr: Ipv4Addr) {
        self.plug(ns, port, addr);
        crate::cluster::ethtool(ns, "eth0", "gro", true);
        ns.ip(&[
            "route",
            "add",
            &format!("{}/32", k8s::ADVERTISE),
            "via",
            &CONTROL_PLANE.to_string(),
        ]);
        crate::run(
            "ip",
            &[
                "netns",
                "exec",
                &ns.name,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        );
    }

    /// The outside client: on the fabric, with `LB_RANGE` routed via `node`.
    pub fn plug_client(&self, ns: &Netns, node: Ipv4Addr) {
        self.plug(ns, "client", CLIENT);
        route_client(ns, node);
    }
}

/// The outside client sends `LB_RANGE` to `node` (a cloud load balancer
/// choosing that node).
pub fn route_client(client: &Netns, node: Ipv4Addr) {
    client.ip(&["route", "replace", LB_RANGE, "via", &node.to_string()]);
}

/// Routes `pod_cidr` via `node` in the namespace `ns` (replacing an older
/// route: a node deleted and added back may get another CIDR).
pub fn route_pods(ns: &str, pod_cidr: &str, node: Ipv4Addr) {
    crate::run(
        "ip",
        &[
            "-n",
            ns,
            "route",
            "replace",
            pod_cidr,
            "via",
            &node.to_string(),
        ],
    );
}

/// The service CIDRs go nowhere from `ns`: only a translated connect
/// reaches anything.
pub fn blackhole_service_cidrs(ns: &Netns) {
    for cidr in k8s::SERVICE_CIDRS.split(',') {
        let _ = std::process::Command::new("ip")
            .args(["-n", &ns.name, "route", "add", "blackhole", cidr])
            .output();
    }
}
