//! lb-agent in Kubernetes mode against the scripted apiserver, on the real
//! kernel: Services and EndpointSlices become map entries, a client in a
//! network namespace reaches the backends through the ClusterIP, and the
//! data path keeps working while the apiserver is gone.
use std::{collections::BTreeSet, time::Duration};

use lb_testkit::{
    agent::Agent,
    apiserver::{objects, FakeApiServer, Kind},
    topology::Topology,
    wait_until,
    world::World,
};

fn backends_served(w: &World, target: &str, n: usize) -> BTreeSet<String> {
    w.probe("tcp", target, n)
        .iter()
        .map(|a| {
            assert!(a.ok, "{a:?}");
            a.backend().unwrap().to_string()
        })
        .collect()
}

fn backend_count(agent: &Agent, frontend: &str) -> usize {
    let list = agent.lbctl_json(&["service", "list"]);
    list.as_array()
        .unwrap()
        .iter()
        .find(|s| {
            format!(
                "{}:{}",
                s["frontend"]["address"].as_str().unwrap(),
                s["frontend"]["port"]
            ) == frontend
        })
        .map_or(usize::MAX, |s| s["backends"].as_array().unwrap().len())
}

#[test]
fn kubernetes_mode_clusterip_reaches_endpoints_and_follows_endpointslice_changes() {
    let w = World::new("k8s_e2e_clusterip", 2);
    let _servers = w.tcp_servers(8080, false);
    let (b1, b2) = (
        Topology::backend_ip(0).to_string(),
        Topology::backend_ip(1).to_string(),
    );
    let api = FakeApiServer::start();
    api.apply(objects::node("node-a", "192.168.77.1"));
    api.apply(objects::service(
        "default",
        "web",
        "10.96.0.10",
        80,
        8080,
        "TCP",
    ));
    api.apply(objects::slice(
        "default",
        "web-1",
        "web",
        &[&b1, &b2],
        8080,
        "TCP",
        "node-a",
    ));
    let agent = Agent::start_kubernetes(&api.url(), "node-a", &w.cgroup.path, &w.pins.path, &[]);

    assert_eq!(
        backends_served(&w, "10.96.0.10:80", 60),
        BTreeSet::from(["b1".to_string(), "b2".to_string()])
    );

    // An endpoint goes away: new connections stop going there.
    api.apply(objects::slice(
        "default",
        "web-1",
        "web",
        &[&b2],
        8080,
        "TCP",
        "node-a",
    ));
    assert!(wait_until(Duration::from_secs(10), || backend_count(
        &agent,
        "10.96.0.10:80"
    ) == 1));
    assert_eq!(
        backends_served(&w, "10.96.0.10:80", 30),
        BTreeSet::from(["b2".to_string()])
    );

    // The apiserver goes away: traffic keeps flowing on the last state.
    api.set_down(true);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        backends_served(&w, "10.96.0.10:80", 20),
        BTreeSet::from(["b2".to_string()])
    );
    assert!(
        agent.log_text().contains("keeping the last good state"),
        "the outage is logged:\n{}",
        agent.log_text()
    );
    // ... and the agent converges once it is back.
    api.apply(objects::slice(
        "default",
        "web-1",
        "web",
        &[&b1, &b2],
        8080,
        "TCP",
        "node-a",
    ));
    api.set_down(false);
    assert!(
        wait_until(Duration::from_secs(30), || backend_count(
            &agent,
            "10.96.0.10:80"
        ) == 2),
        "did not converge after the apiserver returned:\n{}",
        agent.log_text()
    );

    // The Service is deleted: its frontend leaves the maps.
    api.delete(Kind::Service, "default", "web");
    assert!(wait_until(Duration::from_secs(10), || agent
        .lbctl_json(&["service", "list"])
        .as_array()
        .unwrap()
        .is_empty()));
}

#[test]
fn kubernetes_mode_serves_ipv6_and_udp_services_like_ipv4() {
    let w = World::new("k8s_e2e_v6_udp", 1);
    let _udp = w.udp_servers(5353, true);
    let b1 = Topology::backend_ip6(0).to_string();
    let api = FakeApiServer::start();
    api.apply(objects::node("node-a", "192.168.77.1"));
    api.apply(objects::service(
        "kube-system",
        "dns6",
        "fd00:96::53",
        53,
        5353,
        "UDP",
    ));
    api.apply(objects::slice(
        "kube-system",
        "dns6-1",
        "dns6",
        &[&b1],
        5353,
        "UDP",
        "node-b",
    ));
    let _agent = Agent::start_kubernetes(&api.url(), "node-a", &w.cgroup.path, &w.pins.path, &[]);
    for a in w.probe("udp", "[fd00:96::53]:53", 5) {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.reply_from.as_deref(), Some("[fd00:96::53]:53"));
    }
}
