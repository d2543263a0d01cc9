//! IPv6 and dual-stack socket load balancing on the real kernel: connect6,
//! sendmsg6, recvmsg6, getpeername6, and v4-mapped addresses from IPv6
//! sockets translated through the IPv4 maps.
use std::collections::BTreeSet;

use lb_testkit::{
    topology::{Topology, CLIENT_IP, CLIENT_IP6},
    world::World,
};

const VIP6: &str = "fd00:96::10";

fn dual_stack_yaml(backends: &[usize], proto: &str, target: u16) -> String {
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
        "services:\n  - name: web\n    clusterIPs: ['{VIP6}', 10.96.0.10]\n    ports: [{{port: 80, protocol: {proto}, targetPort: {target}}}]\n    backends: [{}]\n",
        list.join(", ")
    )
}

#[test]
fn tcp6_connect_to_ipv6_vip_reaches_ipv6_backends_with_client_address_kept() {
    let w = World::new("tcp6_vip", 2);
    let _servers = w.tcp_servers(8080, true);
    w.write_services(&dual_stack_yaml(&[0, 1], "TCP", 8080));
    let _agent = w.start_agent();

    let attempts = w.probe("tcp", &format!("[{VIP6}]:80"), 40);
    let mut seen = BTreeSet::new();
    for a in &attempts {
        assert!(a.ok, "{a:?}");
        seen.insert(a.backend().unwrap().to_string());
        assert_eq!(
            a.peer.as_deref(),
            Some("[fd00:96::10]:80"),
            "getpeername6: {a:?}"
        );
        assert!(
            a.seen_client()
                .unwrap()
                .starts_with(&format!("[{CLIENT_IP6}]:")),
            "no SNAT: {a:?}"
        );
    }
    assert_eq!(seen.len(), 2, "both IPv6 backends used: {seen:?}");
    // getpeername6 read each translation from LB_SOCK_TCP while the socket
    // was open; sock_release freed its slot at close, and none reached the
    // LRU.
    assert_eq!(tcp_table_entries(&w), 0);
    assert_eq!(sock_revnat_entries(&w, "LB6_SOCK_REVNAT"), 0);
}

fn tcp_table_entries(w: &World) -> usize {
    lb::maps::bpf::count_tcp_table(&w.pins.path).unwrap()
}

fn sock_revnat_entries(w: &World, map: &str) -> usize {
    lb::maps::bpf::count_entries(&w.pins.path, map)
        .unwrap()
        .unwrap()
}

#[test]
fn udp6_unconnected_reply_source_is_the_ipv6_vip_and_connected_getpeername_too() {
    let w = World::new("udp6_vip", 2);
    let _servers = w.udp_servers(5353, true);
    w.write_services(&dual_stack_yaml(&[0, 1], "UDP", 5353));
    let _agent = w.start_agent();

    for a in w.probe("udp", &format!("[{VIP6}]:80"), 10) {
        assert!(a.ok, "{a:?}");
        assert_eq!(
            a.reply_from.as_deref(),
            Some("[fd00:96::10]:80"),
            "recvmsg6: {a:?}"
        );
    }
    for a in w.probe("udp-connected", &format!("[{VIP6}]:80"), 5) {
        assert!(a.ok, "{a:?}");
        assert_eq!(
            a.peer.as_deref(),
            Some("[fd00:96::10]:80"),
            "getpeername6: {a:?}"
        );
    }
}

#[test]
fn dual_stack_socket_dialing_v4_mapped_vip_is_translated_through_ipv4_maps() {
    let w = World::new("v4mapped_vip", 1);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&dual_stack_yaml(&[0], "TCP", 8080));
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
    assert_eq!(sock_revnat_entries(&w, "LB4_SOCK_REVNAT"), 0);
}

#[test]
fn ipv6_service_without_backends_refuses_with_econnrefused() {
    let w = World::new("v6_no_backend", 1);
    w.write_services(&dual_stack_yaml(&[], "TCP", 8080));
    let agent = w.start_agent();
    for a in w.probe("tcp", &format!("[{VIP6}]:80"), 2) {
        assert_eq!(a.errno, Some(111), "{a:?}");
    }
    for a in w.probe("tcp", &format!("[{VIP6}]:81"), 1) {
        assert_eq!(a.errno, Some(111), "{a:?}");
    }
    assert_eq!(agent.drops("no-backend"), 2);
    assert_eq!(agent.drops("no-service-port"), 1);
    let list = agent.lbctl(&["service", "list"]);
    assert!(list.contains("[fd00:96::10]:80/TCP"), "{list}");
}
