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
}
