//! The agent with tens of thousands of services: maps too small for the
//! input must not hang it (the refusal is one prompt warning, the services
//! that fit are served), and a long full sync must not make it deaf to
//! SIGTERM, /healthz or /metrics.
use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use lb_testkit::{agent::Agent, topology::Topology, world::World};

/// `n` ClusterIP services with one backend each: 10.100.0.0 onwards, port 80.
fn services(n: usize) -> String {
    let mut s = String::with_capacity(n * 150);
    s.push_str("services:\n");
    let backend = Topology::backend_ip(0);
    for i in 0..n {
        let vip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 100, 0, 0)) + i as u32);
        let _ = writeln!(
            s,
            "  - name: svc-{i:06}\n    clusterIPs: [{vip}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{{address: {backend}}}]"
        );
    }
    s
}

/// 40 000 services, room for about 10 000 (each takes a VIP marker, a
/// master entry and one slot): the refusal of 30 000 arrives as one warning
/// promptly, `lbctl status` names them, the ones that fit are served, and
/// SIGTERM ends the agent at once.
#[test]
fn refusing_30000_of_40000_services_is_one_prompt_warning_and_the_rest_is_served() {
    let w = World::new("scale_refuse", 1);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&services(40_000));
    let started = Instant::now();
    // Before the fix the refusal path scanned every frontend per refused
    // service (n·k): minutes of 100 % CPU with nothing logged.
    let mut agent = Agent::start_until(
        &w.services,
        &w.cgroup.path,
        &w.pins.path,
        &["--map-size-services", "30000"],
        "not applied",
        Duration::from_secs(120),
    );
    eprintln!("refusal after {:.1?}", started.elapsed());
    let log = agent.log_text();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("not applied")).collect();
    assert_eq!(warnings.len(), 1, "one warning, not one per service");
    let line = warnings[0];
    assert!(
        line.contains("LB4_SERVICES is full") && line.contains("raise --map-size-services"),
        "{line}"
    );
    // Every refused service by name in lbctl status.
    let status = agent.lbctl_json(&["status"]);
    let refused = status["refused"].as_array().unwrap();
    assert!(refused.len() >= 29_000, "{} refused listed", refused.len());
    assert!(refused[0]["error"]
        .as_str()
        .unwrap()
        .contains("--map-size-services"));
    // The first services (in name order) fit and are served.
    let first = w.probe("tcp", "10.100.0.0:80", 5);
    assert!(first.iter().all(|a| a.ok), "{first:?}");
    // Quiet between retries; a SIGTERM is answered at once.
    let took = agent.terminate(Duration::from_secs(5));
    assert!(took.is_some_and(|t| t < Duration::from_secs(1)), "{took:?}");
}

/// A full sync of 150 000 services takes a second or more; during it the
/// agent answers /healthz and /metrics and stops within a second of SIGTERM.
#[test]
fn during_a_long_full_sync_the_agent_answers_probes_and_stops_within_a_second_of_sigterm() {
    let w = World::new("scale_sigterm", 1);
    w.write_services(&services(150_000));
    let mut agent = Agent::start_until(
        &w.services,
        &w.cgroup.path,
        &w.pins.path,
        &[
            "--map-size-services",
            "1048576",
            // Progress is logged this often during a reconcile: once it
            // is, the sync is under way.
            "--reconcile-progress-every",
            "100ms",
        ],
        "reconciling",
        Duration::from_secs(180),
    );
    let asked = Instant::now();
    let (code, _) = agent.http_get("/healthz");
    let (mcode, metrics) = agent.http_get("/metrics");
    let answered = asked.elapsed();
    assert!([200, 503].contains(&code), "/healthz answered {code}");
    assert_eq!(mcode, 200);
    assert!(metrics.contains("lb_reconciles_total") || metrics.contains("lb_map_writes_total"));
    assert!(
        answered < Duration::from_secs(2),
        "probes took {answered:?}"
    );
    assert!(
        !agent.log_text().contains("\"reconciled\"") && !agent.log_text().contains(" reconciled "),
        "the sync was still running when probed"
    );
    let took = agent.terminate(Duration::from_secs(10));
    eprintln!("SIGTERM to exit during the full sync: {took:?}");
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(1)),
        "SIGTERM during the sync took {took:?}"
    );
    // The stop came during the sync, not after it.
    assert!(
        agent.log_text().contains("reconcile cancelled after"),
        "{}",
        agent.log_text()
    );
}
