//! sessionAffinity: ClientIP in the socket load balancer, on the real kernel:
//! a client (network namespace) sticks to one backend, moves when that
//! backend leaves the service, and is free again after the timeout.
use std::{collections::BTreeSet, time::Duration};

use lb_testkit::{probe, topology::Topology, world::World};

fn yaml(backends: &[usize], timeout: u32) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|i| format!("{{address: {}}}", Topology::backend_ip(*i)))
        .collect();
    format!(
        "services:\n  - name: web\n    clusterIPs: [10.96.0.10]\n    ports: [{{port: 80, targetPort: 8080}}]\n    sessionAffinity: ClientIP\n    sessionAffinityTimeoutSeconds: {timeout}\n    backends: [{}]\n",
        list.join(", ")
    )
}

fn served(w: &World, netns: &str, n: usize) -> BTreeSet<String> {
    probe::run(&w.cgroup.path, netns, "tcp", "10.96.0.10:80", n)
        .iter()
        .map(|a| {
            assert!(a.ok, "{a:?}");
            a.backend().unwrap().to_string()
        })
        .collect()
}

#[test]
fn each_client_namespace_sticks_to_one_backend_and_moves_when_it_leaves() {
    let mut w = World::new("affinity_sticks", 3);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&yaml(&[0, 1, 2], 3600));
    let mut agent = w.start_agent();
    let client = w.topo.client.name.clone();

    let first = served(&w, &client, 40);
    assert_eq!(first.len(), 1, "one client, one backend: {first:?}");
    // Other clients are balanced independently: over 6 more namespaces, at
    // least two backends are used (all six on one: p = 3 * (1/3)^6 < 0.5%).
    let tag = w.tag.clone();
    let mut seen = first.clone();
    for _ in 0..6 {
        let other = w.topo.add_client(&tag);
        let got = served(&w, &other, 10);
        assert_eq!(got.len(), 1, "{got:?}");
        seen.extend(got);
    }
    assert!(
        seen.len() >= 2,
        "affinity must not pin every client to one backend: {seen:?}"
    );

    // The sticky backend leaves the service: the client moves and sticks again.
    let sticky: usize = first.iter().next().unwrap()[1..].parse::<usize>().unwrap() - 1;
    let rest: Vec<usize> = (0..3).filter(|i| *i != sticky).collect();
    w.write_services(&yaml(&rest, 3600));
    assert!(agent.wait_for_log("reconciled", 2, Duration::from_secs(10)));
    let after = served(&w, &client, 30);
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(
        !after.contains(first.iter().next().unwrap()),
        "still sent to the removed backend: {after:?}"
    );
}

#[test]
fn affinity_expires_after_the_timeout_without_use() {
    let w = World::new("affinity_expires", 3);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&yaml(&[0, 1, 2], 1));
    let _agent = w.start_agent();
    let client = w.topo.client.name.clone();
    // Within the timeout: sticky.
    assert_eq!(served(&w, &client, 20).len(), 1);
    // After each expiry the choice is fresh: over 10 rounds at least two
    // backends show up (the same one 10 times: p = 3 * (1/3)^10 < 0.01%).
    let mut seen = BTreeSet::new();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(1100));
        seen.extend(served(&w, &client, 1));
    }
    assert!(seen.len() >= 2, "affinity never expired: {seen:?}");
}
