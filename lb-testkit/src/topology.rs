//! The standard test world:
//!
//! ```text
//!   [client ns] 10.250.0.1 ── br0 in [hub ns] ── 10.250.0.11 [backend ns 1]
//!   blackhole 10.96.0.0/12          │          ── 10.250.0.12 [backend ns 2] ...
//! ```
//!
//! Nothing is created in the root namespace. Service addresses (10.96.0.0/12)
//! are unroutable in the client namespace, so only a translated connect can
//! reach anything.
use std::net::Ipv4Addr;

use crate::netns::Netns;

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
pub const SERVICE_RANGE: &str = "10.96.0.0/12";

pub struct Topology {
    pub client: Netns,
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
        plug(&hub, &client, "c0", CLIENT_IP);
        client.ip(&["route", "add", "blackhole", SERVICE_RANGE]);
        let backends = (0..backends)
            .map(|i| {
                let ns = Netns::create(&format!("lbt-{tag}-b{}", i + 1));
                plug(&hub, &ns, &format!("b{}", i + 1), Self::backend_ip(i));
                ns
            })
            .collect();
        Self { client, backends, hub }
    }

    /// Address of backend `i` (0-based): 10.250.0.11, .12, ...
    pub fn backend_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 250, 0, 11 + i as u8)
    }

    /// Adds one more backend namespace (for tests that add backends later).
    pub fn add_backend(&mut self, tag: &str) -> usize {
        let i = self.backends.len();
        let ns = Netns::create(&format!("lbt-{tag}-b{}", i + 1));
        plug(&self.hub, &ns, &format!("b{}", i + 1), Self::backend_ip(i));
        self.backends.push(ns);
        i
    }
}

fn plug(hub: &Netns, ns: &Netns, port: &str, ip: Ipv4Addr) {
    hub.ip(&["link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name]);
    hub.ip(&["link", "set", port, "master", "br0", "up"]);
    ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    ns.ip(&["link", "set", "eth0", "up"]);
}
