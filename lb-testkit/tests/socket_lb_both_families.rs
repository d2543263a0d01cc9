//! Socket load balancing for both families on the real kernel, one body
//! per behaviour run for IPv4 (connect4, sendmsg4, recvmsg4, getpeername4)
//! and IPv6 (the *6 hooks), as the programs are one body over the family;
//! and v4-mapped addresses from IPv6 sockets translated through the IPv4
//! maps. Every test uses one dual-stack service (both ClusterIPs, each
//! family's backends), as a cluster gives it.
use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

use lb_testkit::{
    topology::{Topology, CLIENT_IP, CLIENT_IP6},
    world::World,
};

const VIP: &str = "10.96.0.10";
const VIP6: &str = "fd00:96::10";

/// What one family's run dials and expects.
struct Family {
    v6: bool,
    vip: &'static str,
    client: IpAddr,
    /// The socket path's reverse-translation LRU of this family.
    revnat: &'static str,
}

const V4: Family = Family {
    v6: false,
    vip: VIP,
    client: IpAddr::V4(CLIENT_IP),
    revnat: lb_common::maps::LB4_SOCK_REVNAT,
};

const V6: Family = Family {
    v6: true,
    vip: VIP6,
    client: IpAddr::V6(CLIENT_IP6),
    revnat: lb_common::maps::LB6_SOCK_REVNAT,
};

impl Family {
    /// The service's address and `port` as a socket address prints it.
    fn vip_port(&self, port: u16) -> String {
        SocketAddr::new(self.vip.parse().unwrap(), port).to_string()
    }
}

/// web: both ClusterIPs, port 80 (`proto`) → `target` on the backends
/// `backends` (by index), each with its IPv4 and its IPv6 address; `extra`
/// ports after it.
fn dual_stack_yaml(backends: &[usize], proto: &str, target: u16, extra: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .flat_map(|i| {
            [
                format!("{{address: '{}'}}", Topology::backend_ip6(*i)),
                format!("{{address: {}}}", Topology::backend_ip(*i)),
            ]
        })
        .collect();
    format!(
        "services:\n  - name: web\n    clusterIPs: ['{VIP6}', {VIP}]\n    ports: [{{port: 80, protocol: {proto}, targetPort: {target}}}{extra}]\n    backends: [{}]\n",
        list.join(", ")
    )
}

fn tcp_table_entries(w: &World) -> usize {
    lb::maps::bpf::count_tcp_table(&w.pins.path).unwrap()
}

fn sock_revnat_entries(w: &World, map: &str) -> usize {
    lb::maps::bpf::count_entries(&w.pins.path, map)
        .unwrap()
        .unwrap()
}

/// Connects reach both backends; the backend sees the client's own address
/// and port (no SNAT), getpeername() the service's. getpeername read each
/// translation from LB_SOCK_TCP while the socket was open; sock_release
/// freed its slot at close, and none reached the LRU.
fn tcp_connects_reach_both_backends_with_the_client_address_kept(f: &Family, tag: &str) {
    let w = World::new(tag, 2);
    let _servers = w.tcp_servers(8080, f.v6);
    w.write_services(&dual_stack_yaml(&[0, 1], "TCP", 8080, ""));
    let _agent = w.start_agent();

    let mut seen = BTreeSet::new();
    for a in &w.probe("tcp", &f.vip_port(80), 40) {
        assert!(a.ok, "{a:?}");
        seen.insert(a.backend().unwrap().to_string());
        assert_eq!(
            a.peer.as_deref(),
            Some(f.vip_port(80).as_str()),
            "getpeername: {a:?}"
        );
        assert_eq!(a.seen_client(), a.local.as_deref(), "no SNAT: {a:?}");
        let client: SocketAddr = a.seen_client().unwrap().parse().unwrap();
        assert_eq!(client.ip(), f.client, "{a:?}");
    }
    assert_eq!(seen.len(), 2, "both backends used: {seen:?}");
    assert_eq!(tcp_table_entries(&w), 0);
    assert_eq!(sock_revnat_entries(&w, f.revnat), 0);
}

#[test]
fn ipv4_tcp_connects_reach_both_backends_with_the_client_address_kept() {
    tcp_connects_reach_both_backends_with_the_client_address_kept(&V4, "tcp4_vip");
}

#[test]
fn ipv6_tcp_connects_reach_both_backends_with_the_client_address_kept() {
    tcp_connects_reach_both_backends_with_the_client_address_kept(&V6, "tcp6_vip");
}

/// An unconnected socket's recvfrom() reports the service as the reply's
/// source (recvmsg), and the backend saw the client's address; a connected
/// socket's getpeername() and replies name the service too.
fn udp_replies_come_from_the_service_address(f: &Family, tag: &str) {
    let w = World::new(tag, 2);
    let _servers = w.udp_servers(5353, f.v6);
    w.write_services(&dual_stack_yaml(&[0, 1], "UDP", 5353, ""));
    let _agent = w.start_agent();

    let vip = f.vip_port(80);
    let attempts = w.probe("udp", &vip, 20);
    for a in &attempts {
        assert!(a.ok, "{a:?}");
        assert_eq!(
            a.reply_from.as_deref(),
            Some(vip.as_str()),
            "recvmsg: {a:?}"
        );
        // The unconnected socket is bound to the wildcard address: compare
        // the address the backend saw and the port apart.
        let port: u16 = a
            .local
            .as_deref()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let seen: SocketAddr = a.seen_client().unwrap().parse().unwrap();
        assert_eq!(seen, SocketAddr::new(f.client, port), "no SNAT: {a:?}");
    }
    let names: BTreeSet<_> = attempts.iter().filter_map(|a| a.backend()).collect();
    assert_eq!(names.len(), 2, "both backends over 20 sockets: {names:?}");
    for a in w.probe("udp-connected", &vip, 5) {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.peer.as_deref(), Some(vip.as_str()), "getpeername: {a:?}");
        assert_eq!(a.reply_from.as_deref(), Some(vip.as_str()), "{a:?}");
    }
}

#[test]
fn ipv4_udp_replies_come_from_the_service_address_connected_or_not() {
    udp_replies_come_from_the_service_address(&V4, "udp4_vip");
}

#[test]
fn ipv6_udp_replies_come_from_the_service_address_connected_or_not() {
    udp_replies_come_from_the_service_address(&V6, "udp6_vip");
}

/// A service without backends refuses connect() and sendto() with
/// ECONNREFUSED, counted as `no-backend`; a port it does not expose as
/// `no-service-port`.
fn a_service_without_backends_refuses_with_econnrefused_and_counts_why(f: &Family, tag: &str) {
    const ECONNREFUSED: i32 = 111;
    let w = World::new(tag, 1);
    w.write_services(&dual_stack_yaml(&[], "TCP", 8080, ""));
    let mut agent = w.start_agent();
    assert_eq!(agent.drops("no-backend"), 0);
    for a in w.probe("tcp", &f.vip_port(80), 3) {
        assert!(!a.ok);
        assert_eq!(a.errno, Some(ECONNREFUSED), "{a:?}");
    }
    assert_eq!(agent.drops("no-backend"), 3);
    for a in w.probe("tcp", &f.vip_port(81), 2) {
        assert_eq!(a.errno, Some(ECONNREFUSED), "{a:?}");
    }
    assert_eq!(agent.drops("no-service-port"), 2);
    // A UDP port added later, still without backends: sendto() fails the
    // same way.
    w.write_services(&dual_stack_yaml(
        &[],
        "TCP",
        8080,
        ", {port: 53, protocol: UDP}",
    ));
    assert!(
        agent.wait_for_log("reconciled", 2, std::time::Duration::from_secs(10)),
        "{}",
        agent.log_text()
    );
    let a = &w.probe("udp", &f.vip_port(53), 1)[0];
    assert_eq!(a.errno, Some(ECONNREFUSED), "sendto: {a:?}");
    assert_eq!(agent.drops("no-backend"), 4);
    let list = agent.lbctl(&["service", "list"]);
    assert!(list.contains(&format!("{}/TCP", f.vip_port(80))), "{list}");
}

#[test]
fn ipv4_a_service_without_backends_refuses_with_econnrefused_and_counts_why() {
    a_service_without_backends_refuses_with_econnrefused_and_counts_why(&V4, "v4_no_backend");
}

#[test]
fn ipv6_a_service_without_backends_refuses_with_econnrefused_and_counts_why() {
    a_service_without_backends_refuses_with_econnrefused_and_counts_why(&V6, "v6_no_backend");
}

#[test]
fn dual_stack_socket_dialing_v4_mapped_vip_is_translated_through_ipv4_maps() {
    let w = World::new("v4mapped_vip", 1);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&dual_stack_yaml(&[0], "TCP", 8080, ""));
    let _agent = w.start_agent();

    // An AF_INET6 socket connecting to ::ffff:10.96.0.10: connect6 sees the
    // mapped address and must use the IPv4 service.
    for a in w.probe("tcp", "[::ffff:10.96.0.10]:80", 5) {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.backend(), Some("b1"));
        assert_eq!(a.peer.as_deref(), Some("[::ffff:10.96.0.10]:80"), "{a:?}");
        assert!(
            a.seen_client()
                .unwrap()
                .starts_with(&format!("{CLIENT_IP}:")),
            "{a:?}"
        );
    }
    // Kept as IPv4 (getpeername6 found it: the peer above), and freed at
    // close.
    assert_eq!(tcp_table_entries(&w), 0);
    assert_eq!(sock_revnat_entries(&w, lb_common::maps::LB4_SOCK_REVNAT), 0);
}
