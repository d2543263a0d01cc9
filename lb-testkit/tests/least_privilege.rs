//! The agent with a capability list instead of root's full set, as the
//! chart runs it (`securityContext.capabilities.agent`, not privileged):
//! with exactly the capabilities it lists it does everything, including the
//! one job that reaches into other network namespaces (destroying a pod's
//! connected UDP socket to a removed backend); missing any one of them it
//! refuses at start, names it, and leaves nothing installed.
//!
//! The capabilities are cut with setpriv's bounding set, which is what a
//! container runtime does for a container's capability list.
use std::{os::fd::AsFd, process::Stdio, time::Duration};

use lb::agent::privileges::NEEDS;
use lb_testkit::{
    agent::{free_port, with_only_capabilities, Agent},
    probe::Held,
    topology::Topology,
    world::World,
};

const VIP: &str = "10.96.0.53";

fn dns(backend: usize) -> String {
    format!(
        "services:\n  - name: dns\n    clusterIPs: [{VIP}]\n    ports: [{{port: 53, protocol: UDP, targetPort: 5353}}, {{name: tcp, port: 80, targetPort: 8080}}]\n    backends: [{{address: {}}}]\n",
        Topology::backend_ip(backend)
    )
}

/// setpriv's name of a capability: CAP_NET_ADMIN -> net_admin.
fn setpriv_name(cap: &str) -> String {
    cap.trim_start_matches("CAP_").to_lowercase()
}

fn listed() -> Vec<String> {
    NEEDS.iter().map(|n| setpriv_name(n.name)).collect()
}

#[test]
fn with_only_its_listed_capabilities_the_agent_translates_and_destroys_a_udp_socket_in_another_namespace(
) {
    let w = World::new("least_priv", 2);
    let _udp = w.udp_servers(5353, false);
    let _tcp = w.tcp_servers(8080, false);
    w.write_services(&dns(0));
    let caps = listed();
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    let mut agent =
        Agent::start_with_capabilities(&w.services, &w.cgroup.path, &w.pins.path, &caps);

    // It really runs with those and no others.
    let eff = lb::sys::caps::effective_of(&agent.pid().unwrap().to_string()).unwrap();
    let want: u64 = NEEDS.iter().map(|n| 1u64 << n.cap).sum();
    assert_eq!(eff, want, "the agent's effective capabilities: {eff:#x}");

    for a in w.probe("tcp", &format!("{VIP}:80"), 20) {
        assert!(a.ok && a.backend() == Some("b1"), "{a:?}");
    }
    // A resolver in the client's namespace: reaching it takes CAP_SYS_ADMIN
    // (setns). The namespace is named under /run/netns, so this test does
    // not need CAP_SYS_PTRACE; pods' namespaces, found through /proc, do
    // (kubernetes_node.rs, the chart's list on a real node).
    let mut resolver = Held::start(&w.cgroup.path, &w.topo.client.name, &format!("{VIP}:53"));
    let first = resolver.ask();
    assert!(first.ok && first.backend() == Some("b1"), "{first:?}");
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
    let log = agent.log_text();
    assert!(
        log.contains("destroyed=1"),
        "the resolver's socket destroyed: {log}"
    );
    lb_testkit::agent::assert_no_namespace_refused(&log);
    let after = resolver.ask();
    assert!(!after.ok, "the old socket still talks to b1: {after:?}");
    for a in w.probe("tcp", &format!("{VIP}:80"), 20) {
        assert!(a.ok && a.backend() == Some("b2"), "{a:?}");
    }
}

#[test]
fn missing_any_one_listed_capability_the_agent_refuses_at_start_names_it_and_installs_nothing() {
    let w = World::new("least_priv_refuse", 1);
    w.write_services(&dns(0));
    let all = listed();
    for need in NEEDS {
        let without: Vec<String> = all
            .iter()
            .filter(|c| **c != setpriv_name(need.name))
            .cloned()
            .collect();
        let mut cmd = with_only_capabilities(&lb_testkit::sibling_bin("lb-agent"), &without);
        let child = cmd
            .arg("--services")
            .arg(&w.services)
            .arg("--cgroup")
            .arg(&w.cgroup.path)
            .arg("--pin-dir")
            .arg(&w.pins.path)
            .args(["--devices", "none"])
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--healthz-address")
            .arg(format!("127.0.0.1:{}", free_port()))
            .env("KUBECONFIG", "/nonexistent")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A refusal is immediate; an agent that started would run forever.
        let mut child = child;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && out.status.code().is_some(),
            "without {} the agent must exit with an error: {:?}\n{stderr}",
            need.name,
            out.status
        );
        assert!(
            stderr.contains(&format!("missing capability {}", need.name))
                && stderr.contains("nothing was installed"),
            "the refusal names {}: {stderr}",
            need.name
        );
        // Nothing pinned, nothing attached.
        assert!(
            !lb::datapath::pins::has_state(&w.pins.path),
            "without {} something was pinned",
            need.name
        );
        let cgroup = std::fs::File::open(&w.cgroup.path).unwrap();
        for attach_type in [10u32, 11, 14, 15] {
            // BPF_CGROUP_INET4_CONNECT, INET6_CONNECT, UDP4_SENDMSG, UDP6_SENDMSG
            let ids = lb::sys::bpf::cgroup_prog_ids(cgroup.as_fd(), attach_type).unwrap();
            assert!(ids.is_empty(), "without {}: attached {ids:?}", need.name);
        }
    }
}
