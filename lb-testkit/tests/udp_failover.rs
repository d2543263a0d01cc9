//! Connected UDP sockets and removed backends (the "DNS stops working after
//! CoreDNS restarts" complaint): socket LB pins a connected UDP socket to one
//! backend at connect(); when that backend is removed the agent destroys the
//! socket (SOCK_DESTROY), the application's next call fails, and a new
//! socket reaches a live backend. Sockets that
//! dialed a backend's own address are left alone.
use std::time::Duration;

use lb_testkit::{probe::Held, topology::Topology, world::World};

const VIP: &str = "10.96.0.53";
const ECONNABORTED: i32 = 103;
const EDESTADDRREQ: i32 = 89;

fn dns(backend: usize) -> String {
    format!(
        "services:\n  - name: dns\n    clusterIPs: [{VIP}]\n    ports: [{{port: 53, protocol: UDP, targetPort: 5353}}]\n    backends: [{{address: {}}}]\n",
        Topology::backend_ip(backend)
    )
}

#[test]
fn connected_udp_socket_to_a_removed_backend_is_destroyed_and_a_new_socket_fails_over() {
    let w = World::new("udp_failover", 2);
    let _servers = w.udp_servers(5353, false);
    w.write_services(&dns(0));
    let mut agent = w.start_agent();

    // A resolver's socket, connected once through the service address, and
    // an application that dialed backend b1's own address.
    let mut resolver = Held::start(&w.cgroup.path, &w.topo.client.name, &format!("{VIP}:53"));
    let direct_target = format!("{}:5353", Topology::backend_ip(0));
    let mut direct = Held::start(&w.cgroup.path, &w.topo.client.name, &direct_target);
    let first = resolver.ask();
    assert!(first.ok, "{first:?}");
    assert_eq!(first.backend(), Some("b1"));
    assert_eq!(
        first.peer.as_deref(),
        Some("10.96.0.53:53"),
        "getpeername shows the service"
    );
    assert!(direct.ask().ok);

    // CoreDNS moves: b1 is no longer a backend (its server still answers,
    // so only the destroy can make the old socket fail).
    w.write_services(&dns(1));
    assert!(
        agent.wait_for_log(
            "destroyed connected UDP sockets",
            1,
            Duration::from_secs(10)
        ),
        "{}",
        agent.log_text()
    );
    assert!(
        agent.log_text().contains("destroyed=1"),
        "exactly the resolver's socket: {}",
        agent.log_text()
    );

    let after = resolver.ask();
    assert!(
        !after.ok,
        "the old socket must not keep talking to the removed backend: {after:?}"
    );
    // udp_abort() (net/ipv4/udp.c) records ECONNABORTED and disconnects the
    // socket: a recv() gets ECONNABORTED, a send() on the now unconnected
    // socket EDESTADDRREQ. Either way the resolver learns and reopens.
    assert!(
        matches!(after.errno, Some(ECONNABORTED | EDESTADDRREQ)),
        "{after:?}"
    );
    // The resolver opens a new socket, which reaches the live backend.
    let retry = w.probe("udp-connected", &format!("{VIP}:53"), 1);
    assert!(retry[0].ok, "{retry:?}");
    assert_eq!(retry[0].backend(), Some("b2"));
    // The socket that dialed b1 itself was not ours to touch.
    let d = direct.ask();
    assert!(d.ok && d.backend() == Some("b1"), "{d:?}");

    let (_, metrics) = agent.http_get("/metrics");
    assert!(
        metrics.lines().any(|l| l == "lb_sockets_destroyed_total 1"),
        "{metrics}"
    );

    // The destroyed socket's destination was cleared by udp_abort; its
    // entry in the shared reverse LRU still goes when it closes (through
    // its own storage), as the retry's did.
    let before = lb::maps::bpf::count_entries(&w.pins.path, "LB4_SOCK_REVNAT")
        .unwrap()
        .unwrap();
    assert_eq!(before, 1, "the destroyed resolver's entry, until it closes");
    drop(resolver);
    drop(direct);
    let left = lb::maps::bpf::count_entries(&w.pins.path, "LB4_SOCK_REVNAT")
        .unwrap()
        .unwrap();
    assert_eq!(left, 0, "closed sockets' entries left in LB4_SOCK_REVNAT");
}

/// An unconnected UDP socket (sendto for every datagram, like a QUIC client
/// or a resolver) keeps one backend for the service: 100 datagrams, one
/// backend, and each reply shows the service address. When that backend is
/// removed, the same socket's next datagrams reach a live one.
#[test]
fn an_unconnected_udp_socket_keeps_one_backend_until_it_is_removed() {
    let w = World::new("udp_sendto_keep", 3);
    let _servers = w.udp_servers(5353, false);
    let all = |backends: &[usize]| {
        let list: Vec<String> = backends
            .iter()
            .map(|b| format!("{{address: {}}}", Topology::backend_ip(*b)))
            .collect();
        format!(
            "services:\n  - name: dns\n    clusterIPs: [{VIP}]\n    ports: [{{port: 53, protocol: UDP, targetPort: 5353}}]\n    backends: [{}]\n",
            list.join(", ")
        )
    };
    w.write_services(&all(&[0, 1, 2]));
    let mut agent = w.start_agent();
    let mut sock = Held::udp_sendto(&w.cgroup.path, &w.topo.client.name, &format!("{VIP}:53"));
    let answers: Vec<_> = (0..100).map(|_| sock.ask()).collect();
    let first = answers[0].backend().unwrap().to_string();
    for a in &answers {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.backend(), Some(first.as_str()), "one backend per socket");
        assert_eq!(a.reply_from.as_deref(), Some("10.96.0.53:53"));
    }
    // A second socket chooses on its own (among three, 30 tries: some differ).
    let others: std::collections::BTreeSet<String> = (0..30)
        .map(|_| {
            let mut s = Held::udp_sendto(&w.cgroup.path, &w.topo.client.name, &format!("{VIP}:53"));
            s.ask().backend().unwrap().to_string()
        })
        .collect();
    assert!(others.len() >= 2, "sockets spread: {others:?}");

    // Its backend goes: the same socket moves to a live one and stays there.
    let chosen: usize = first.trim_start_matches('b').parse::<usize>().unwrap() - 1;
    let rest: Vec<usize> = (0..3).filter(|b| *b != chosen).collect();
    w.write_services(&all(&rest));
    assert!(agent.wait_for_log("reconciled", 2, Duration::from_secs(10)));
    let after: Vec<_> = (0..20).map(|_| sock.ask()).collect();
    let moved = after[0].backend().unwrap().to_string();
    assert_ne!(moved, first);
    for a in &after {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.backend(), Some(moved.as_str()));
    }
}
