//! The standard test world:
//!
//! ```text
//!   [client ns] 10.250.0.1    ── br0 in [hub ns] ── 10.250.0.11    [backend ns 1]
//!               fd00:250::1            │            fd00:250::11
//!   blackhole 10.96.0.0/12, fd00:96::/64            10.250.0.12 ... [backend ns 2]
//! ```
//!
//! Nothing is created in the root namespace. Service addresses (10.96.0.0/12,
//! fd00:96::/64) are unroutable in the client namespace, so only a translated
//! connect can reach anything.
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::netns::Netns;

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 1);
pub const SERVICE_RANGE: &str = "10.96.0.0/12";
pub const SERVICE_RANGE6: &str = "fd00:96::/64";

pub struct Topology {
    pub client: Netns,
    pub extra_clients: Vec<Netns>,
    pub backends: Vec<Netns>,
    // Dropped last: the hub holds the bridge every veth hangs on.
    pub hub: Netns,
}

impl Topology {
    /// `tag` makes the names unique; `backends` backend namespaces.
    pub fn new(tag: &str, backends: usize) -> Self {
        let hub = Netns::create(&format!("lbt-{tag}-hub"));
        hub.ip(&["link", "add", "br0", "type", "bridge"]);
        hub.ip(&["link", "set", "br0", "up"]);
        let client = Netns::create(&format!("lbt-{tag}-c"));
        plug(&hub, &client, "c0", CLIENT_IP, CLIENT_IP6);
        client.ip(&["route", "add", "blackhole", SERVICE_RANGE]);
        client.ip(&["-6", "route", "add", "blackhole", SERVICE_RANGE6]);
        let backends = (0..backends)
            .map(|i| {
                let ns = Netns::create(&format!("lbt-{tag}-b{}", i + 1));
                plug(
                    &hub,
                    &ns,
                    &format!("b{}", i + 1),
                    Self::backend_ip(i),
                    Self::backend_ip6(i),
                );
                ns
            })
            .collect();
        Self {
            client,
            extra_clients: Vec::new(),
            backends,
            hub,
        }
    }

    /// Address of backend `i` (0-based): 10.250.0.11, .12, ...
    pub fn backend_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, 0, 11 + i as u8)
    }

    /// IPv6 address of backend `i`: fd00:250::11, ::12, ...
    pub fn backend_ip6(i: usize) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 0x11 + i as u16)
    }

    /// Adds another client namespace ("another pod") at 10.250.0.(1+n), with
    /// the same blackhole routes. Returns its name.
    pub fn add_client(&mut self, tag: &str) -> String {
        let n = self.extra_clients.len() + 2;
        let ns = Netns::create(&format!("lbt-{tag}-c{n}"));
        plug(
            &self.hub,
            &ns,
            &format!("c{n}"),
            Ipv4Addr::new(10, 250, 0, n as u8),
            Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, n as u16),
        );
        ns.ip(&["route", "add", "blackhole", SERVICE_RANGE]);
        ns.ip(&["-6", "route", "add", "blackhole", SERVICE_RANGE6]);
        let name = ns.name.clone();
        self.extra_clients.push(ns);
        name
    }

    /// Adds one more backend namespace (for tests that add backends later).
    pub fn add_backend(&mut self, tag: &str) -> usize {
        let i = self.backends.len();
        let ns = Netns::create(&format!("lbt-{tag}-b{}", i + 1));
        plug(
            &self.hub,
            &ns,
            &format!("b{}", i + 1),
            Self::backend_ip(i),
            Self::backend_ip6(i),
        );
        self.backends.push(ns);
        i
    }
}

fn plug(hub: &Netns, ns: &Netns, port: &str, ip: Ipv4Addr, ip6: Ipv6Addr) {
    hub.ip(&[
        "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
    ]);
    hub.ip(&["link", "set", port, "master", "br0", "up"]);
    ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    // nodad: usable at once instead of after duplicate address detection.
    ns.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{ip6}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);
    ns.ip(&["link", "set", "eth0", "up"]);
}
