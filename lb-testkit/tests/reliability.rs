//! Nothing lost while the agent dies, restarts or reconfigures: load keeps
//! connecting through several service addresses the whole time, and every
//! attempt is counted. The figures these tests print are the ones
//! docs/reliability.md quotes.
use std::{
    collections::BTreeSet,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use lb_testkit::{
    probe::{self, Attempt, Held},
    servers,
    topology::Topology,
    world::World,
};

const VIPS: [&str; 3] = ["10.96.0.10", "10.96.0.11", "10.96.0.12"];

/// Keeps connecting to each VIP:80 from the client namespace (one process of
/// 20 connects after another, per VIP) until stopped; returns every attempt.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Attempt>>>,
}

impl Load {
    fn start(w: &World, targets: &[String]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = targets
            .iter()
            .map(|t| {
                let (cg, ns, t, stop) = (
                    w.cgroup.path.clone(),
                    w.topo.client.name.clone(),
                    t.clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || {
                    let mut all = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        all.extend(probe::run(&cg, &ns, "tcp", &t, 20));
                    }
                    all
                })
            })
            .collect();
        Self { stop, threads }
    }

    fn finish(self) -> Vec<Attempt> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    }
}

fn three_services(backends: &[usize]) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|i| format!("{{address: {}}}", Topology::backend_ip(*i)))
        .collect();
    let mut y = String::from("services:\n");
    for (i, vip) in VIPS.iter().enumerate() {
        y.push_str(&format!(
            "  - name: s{i}\n    clusterIPs: [{vip}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{}]\n",
            list.join(", ")
        ));
    }
    y
}

#[test]
fn twenty_sigkill_and_restart_rounds_under_load_lose_no_connect_and_rewrite_nothing() {
    let w = World::new("restart_loop", 2);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&three_services(&[0, 1]));
    let mut agent = w.start_agent();
    let before = agent.lbctl_json(&["service", "list"]);

    let load = Load::start(
        &w,
        &VIPS.iter().map(|v| format!("{v}:80")).collect::<Vec<_>>(),
    );
    for round in 0..20 {
        agent.kill();
        std::thread::sleep(Duration::from_millis(100)); // traffic with no agent at all
        agent.restart();
        // The restart read the pinned state back and found nothing to change.
        assert!(
            agent.log_text().contains("writes=0"),
            "round {round}: {}",
            agent.log_text()
        );
    }
    let attempts = load.finish();
    let failed: Vec<_> = attempts.iter().filter(|a| !a.ok).collect();
    println!(
        "restart loop: 20 rounds, {} connects, {} failed",
        attempts.len(),
        failed.len()
    );
    assert!(
        attempts.len() >= 300,
        "the load kept running: {} connects",
        attempts.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} connects failed, first: {:?}",
        failed.len(),
        attempts.len(),
        failed.first()
    );

    // Same ids and slots; one program per hook (every restart swapped the
    // program inside the pinned link: the upgrade path, too).
    assert_eq!(agent.lbctl_json(&["service", "list"]), before);
    for (hook, progs) in lb::datapath::attached_programs(&w.cgroup.path).unwrap() {
        assert_eq!(progs.len(), 1, "hook {hook} has programs {progs:?}");
    }
}

/// web:80 → 8080 (answers its name and closes: the load) and web:81 → 9090
/// (echoes lines: the long-lived connection), on the given backends.
fn web(active: &[usize], terminating: &[usize]) -> String {
    let mut list: Vec<String> = active
        .iter()
        .map(|i| format!("{{address: {}}}", Topology::backend_ip(*i)))
        .collect();
    list.extend(terminating.iter().map(|i| {
        format!(
            "{{address: {}, state: terminating}}",
            Topology::backend_ip(*i)
        )
    }));
    format!(
        "services:\n  - name: web\n    clusterIPs: [{}]\n    ports: [{{name: http, port: 80, targetPort: 8080}}, {{name: stream, port: 81, targetPort: 9090}}]\n    backends: [{}]\n",
        VIPS[0],
        list.join(", ")
    )
}

#[test]
fn rolling_replacement_of_every_backend_under_load_fails_no_new_connect_and_keeps_established_ones()
{
    let w = World::new("rolling_update", 4);
    let _web = w.tcp_servers(8080, false);
    let _echo: Vec<_> = (0..4)
        .map(|i| {
            servers::tcp_echo(
                &w.topo.backends[i].name,
                (Topology::backend_ip(i), 9090).into(),
                &format!("b{}", i + 1),
            )
        })
        .collect();
    w.write_services(&web(&[0, 1], &[]));
    let mut agent = w.start_agent();

    // Long-lived connections, one to each old backend (the VIP picks; keep
    // opening until both old backends hold one).
    let mut streams: Vec<(String, Held)> = Vec::new();
    for _ in 0..40 {
        let mut h = Held::tcp(
            &w.cgroup.path,
            &w.topo.client.name,
            &format!("{}:81", VIPS[0]),
        );
        let a = h.ask();
        assert!(a.ok, "{a:?}");
        let b = a.backend().unwrap().to_string();
        if !streams.iter().any(|(n, _)| *n == b) {
            streams.push((b, h));
        }
        if streams.len() == 2 {
            break;
        }
    }
    assert_eq!(streams.len(), 2, "a stream to each of b1 and b2");

    let load = Load::start(&w, &[format!("{}:80", VIPS[0])]);
    // The rollout: a new pod comes up, an old one terminates, then goes.
    let steps: [(&[usize], &[usize]); 4] = [
        (&[1, 2], &[0]),
        (&[1, 2], &[]),
        (&[2, 3], &[1]),
        (&[2, 3], &[]),
    ];
    for (n, (active, terminating)) in steps.iter().enumerate() {
        w.write_services(&web(active, terminating));
        assert!(
            agent.wait_for_log("reconciled", n + 2, Duration::from_secs(10)),
            "{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(300)); // load on this state
        for (name, s) in &mut streams {
            let a = s.ask();
            assert!(
                a.ok && a.backend() == Some(name.as_str()),
                "step {n}: stream to {name} broke: {a:?}"
            );
        }
    }
    let attempts = load.finish();
    let failed: Vec<_> = attempts.iter().filter(|a| !a.ok).collect();
    println!(
        "rolling update: 4 steps, {} connects, {} failed",
        attempts.len(),
        failed.len()
    );
    assert!(attempts.len() >= 100, "{}", attempts.len());
    assert!(
        failed.is_empty(),
        "{} failed, first: {:?}",
        failed.len(),
        failed.first()
    );
    // After the rollout only the new backends take new connections.
    let after = w.probe("tcp", &format!("{}:80", VIPS[0]), 30);
    let names: BTreeSet<String> = after
        .iter()
        .map(|a| a.backend().unwrap_or("failed").to_string())
        .collect();
    assert_eq!(names, BTreeSet::from(["b3".to_string(), "b4".to_string()]));
}

#[test]
fn a_service_that_does_not_fit_the_maps_is_refused_by_name_and_the_rest_keeps_working_and_healthy()
{
    let w = World::new("capacity", 3);
    let _servers = w.tcp_servers(8080, false);
    let one = |name: &str, vip: &str, backends: &[usize]| {
        let list: Vec<String> = backends
            .iter()
            .map(|i| format!("{{address: {}}}", Topology::backend_ip(*i)))
            .collect();
        format!("  - name: {name}\n    clusterIPs: [{vip}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{}]\n", list.join(", "))
    };
    // Room for 6 service entries: "a" takes 3 (marker, master, one slot).
    w.write_services(&format!("services:\n{}", one("a", VIPS[0], &[0])));
    let mut agent = lb_testkit::agent::Agent::start_with(
        &w.services,
        &w.cgroup.path,
        &w.pins.path,
        &["--map-size-services", "6", "--healthz-grace", "1s"],
    );
    let last_sync = |agent: &lb_testkit::agent::Agent| {
        let (_, metrics) = agent.http_get("/metrics");
        metrics
            .lines()
            .find(|l| {
                l.starts_with(
                    "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}",
                )
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{metrics}"))
    };
    let synced_before = last_sync(&agent);
    std::thread::sleep(Duration::from_millis(1100));
    // "b" would need 5 more (marker, master, three slots): refused, whole;
    // "c", in the same edit, takes the last 3 and is served.
    w.write_services(&format!(
        "services:\n{}{}{}",
        one("a", VIPS[0], &[0]),
        one("b", VIPS[1], &[0, 1, 2]),
        one("c", VIPS[2], &[1])
    ));
    assert!(
        agent.wait_for_log("not applied", 1, Duration::from_secs(10)),
        "{}",
        agent.log_text()
    );
    let log = agent.log_text();
    assert!(
        log.contains("1 service(s) not applied (default/b); 1: LB4_SERVICES is full (would need 8, holds 6): raise --map-size-services"),
        "{log}"
    );
    // lbctl status names it, with the map and the flag.
    let status = agent.lbctl_json(&["status"]);
    assert_eq!(status["refused"][0]["service"], "default/b", "{status}");
    assert!(status["refused"][0]["error"].as_str().unwrap().contains(
        "LB4_SERVICES would need 8 entries but holds at most 6: raise --map-size-services"
    ));
    // Nothing of b was written; a works as before.
    let list = agent.lbctl(&["service", "list"]);
    assert!(!list.contains(VIPS[1]), "{list}");
    assert!(w
        .probe("tcp", &format!("{}:80", VIPS[0]), 20)
        .iter()
        .all(|a| a.ok));
    let (_, metrics) = agent.http_get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lb_reconciles_total{result=\"error\"}") && !l.ends_with(" 0")),
        "{metrics}"
    );
    // The map that is full shows it, next to its capacity.
    assert!(
        metrics.contains("lb_map_entries{map=\"LB4_SERVICES\"} 6")
            && metrics.contains("lb_map_capacity{map=\"LB4_SERVICES\"} 6"),
        "the full map shows it: {metrics}"
    );
    assert!(
        w.probe("tcp", &format!("{}:80", VIPS[2]), 10)
            .iter()
            .all(|a| a.ok),
        "c, applied in the same reconcile as the refusal, is served"
    );
    // Everything else is in the maps: past the grace period the node stays
    // healthy (one oversized service must not take every node out of the
    // load balancers), and kube-proxy's last sync time moved on.
    std::thread::sleep(Duration::from_millis(1500));
    let (code, body) = agent.healthz_get("/healthz");
    assert_eq!(code, 200, "{body}");
    let synced_after = last_sync(&agent);
    assert!(
        synced_after > synced_before + 1.0,
        "the refusing reconcile moved the last sync time on: {synced_before} → {synced_after}"
    );
}

#[test]
fn pins_are_root_only_and_metrics_listen_on_loopback_by_default() {
    use std::os::unix::fs::PermissionsExt as _;
    let w = World::new("security_defaults", 1);
    w.write_services(&three_services(&[0]));
    let _agent = w.start_agent();
    for dir in [w.pins.path.clone(), w.pins.path.join("links")] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", dir.display());
    }
    for e in std::fs::read_dir(&w.pins.path)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
    {
        let mode = e.metadata().unwrap().permissions().mode() & 0o077;
        assert_eq!(mode, 0, "{} is readable by others", e.path().display());
    }
    drop(_agent);

    // An agent started without --metrics-address: what it actually binds
    // (the kit always passes a free port, so 9967 is this test's alone).
    let log = std::env::temp_dir().join(format!("{}-default-metrics.log", w.tag));
    let mut child = std::process::Command::new(lb_testkit::sibling_bin("lb-agent"))
        .args(["--services", w.services.to_str().unwrap()])
        .arg("--cgroup")
        .arg(&w.cgroup.path)
        .arg("--pin-dir")
        .arg(&w.pins.path)
        .args(["--healthz-address", "off", "--devices", "none"])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let listening = || {
        let out = std::process::Command::new("ss")
            .args(["-Hltn"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let bound = lb_testkit::wait_until(Duration::from_secs(20), || listening().contains(":9967 "));
    let sockets = listening();
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(bound, "nothing listens on :9967\n{sockets}\n{text}");
    let on_9967: Vec<&str> = sockets.lines().filter(|l| l.contains(":9967 ")).collect();
    assert!(
        on_9967.iter().all(|l| l.contains("127.0.0.1:9967 ")),
        "metrics reachable beyond loopback: {on_9967:?}"
    );
}
