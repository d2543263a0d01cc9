//! Observability on the real kernel: every drop reason produced for real is
//! counted, streamed by `lbctl monitor` and exported as a metric; the
//! metrics endpoint is valid Prometheus exposition; lbctl explains what is
//! missing; the programs' log level changes at run time.
use std::{process::Command, time::Duration};

use lb_testkit::{agent::Agent, sibling_bin, topology::Topology, world::World};

const VIP: &str = "10.96.0.10";

fn services(backends: &[usize]) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|i| format!("{{address: {}}}", Topology::backend_ip(*i)))
        .collect();
    format!(
        "services:\n  - name: web\n    clusterIPs: [{VIP}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{}]\n  - name: empty\n    clusterIPs: [10.96.0.99]\n    ports: [{{port: 80}}]\n",
        list.join(", ")
    )
}

/// Checks that every line is valid exposition text and returns the samples.
fn parse_metrics(body: &str) -> prometheus_parse::Scrape {
    use prometheus_parse::LineInfo;
    for line in body.lines() {
        let ok = match LineInfo::parse(line) {
            LineInfo::Ignored => line == "# EOF" || line.starts_with("# UNIT "),
            _ => true,
        };
        assert!(ok, "not valid exposition text: {line:?}");
    }
    assert!(
        body.trim_end().ends_with("# EOF"),
        "OpenMetrics text must end with # EOF"
    );
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parse")
}

fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

#[test]
fn each_drop_reason_is_counted_streamed_by_monitor_and_exported_as_metric() {
    let w = World::new("drops_counted_streamed", 1);
    w.write_services(&services(&[]));
    let agent = w.start_agent();
    let monitor = agent.monitor(&["--type", "drop", "--count", "2"]);

    // no-backend: the service has no backend. no-service-port: known VIP, unknown port.
    assert_eq!(w.probe("tcp", "10.96.0.99:80", 1)[0].errno, Some(111));
    assert_eq!(w.probe("tcp", "10.96.0.99:81", 1)[0].errno, Some(111));

    let events = monitor.events(Duration::from_secs(10));
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["type"], "drop");
    assert_eq!(events[0]["reason"], "no-backend");
    assert_eq!(events[0]["hook"], "connect4");
    assert_eq!(events[0]["destination"], "10.96.0.99:80");
    assert_eq!(events[0]["comm"], "lb-probe");
    assert!(events[0]["service_id"].as_u64().unwrap() > 0);
    assert_eq!(events[1]["reason"], "no-service-port");
    assert_eq!(events[1]["destination"], "10.96.0.99:81");

    assert_eq!(agent.drops("no-backend"), 1);
    assert_eq!(agent.drops("no-service-port"), 1);
    // The table shows what happened, not every counter at zero.
    let table = agent.lbctl(&["drops"]);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(rows.iter().all(|r| r.ends_with(" 1")), "{table}");
    let all = agent.lbctl(&["drops", "--all"]);
    assert!(all.lines().count() > 10 && all.contains(" 0\n"), "{all}");

    let (code, body) = agent.http_get("/metrics");
    assert_eq!(code, 200);
    let scrape = parse_metrics(&body);
    assert_eq!(
        sample(
            &scrape,
            "lb_drops_total",
            &[("reason", "no-backend"), ("direction", "egress")]
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &scrape,
            "lb_drops_total",
            &[("reason", "no-service-port"), ("direction", "egress")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&scrape, "lb_events_total", &[("result", "sent")]),
        Some(2.0)
    );
}

#[test]
fn monitor_trace_shows_translations_and_switches_tracing_off_afterwards() {
    let w = World::new("monitor_trace", 1);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&services(&[0]));
    let agent = w.start_agent();
    let config = |agent: &Agent| agent.lbctl_json(&["config", "get"]);
    assert_eq!(config(&agent)["trace"], "off");

    let monitor = agent.monitor(&["--type", "trace", "--count", "1"]);
    assert_eq!(
        config(&agent)["trace"],
        "on",
        "tracing on while a trace monitor runs"
    );
    assert!(w.probe("tcp", &format!("{VIP}:80"), 1)[0].ok);
    let events = monitor.events(Duration::from_secs(10));
    assert_eq!(events[0]["type"], "trace");
    assert_eq!(events[0]["destination"], "10.96.0.10:80");
    assert_eq!(events[0]["translated"], "10.250.0.11:8080");
    assert!(events[0]["backend_id"].as_u64().unwrap() > 0);
    assert_eq!(
        config(&agent)["trace"],
        "off",
        "tracing back off after the monitor exits"
    );
}

#[test]
fn metrics_endpoint_is_valid_exposition_with_reconcile_map_fill_and_healthz() {
    let w = World::new("metrics_endpoint", 2);
    w.write_services(&services(&[0, 1]));
    let mut agent = w.start_agent();
    let (code, body) = agent.http_get("/metrics");
    assert_eq!(code, 200);
    let scrape = parse_metrics(&body);
    assert_eq!(sample(&scrape, "lb_services", &[]), Some(2.0), "{body}");
    assert_eq!(sample(&scrape, "lb_frontends", &[]), Some(2.0));
    assert_eq!(sample(&scrape, "lb_backends", &[]), Some(2.0));
    // 2 masters + 2 slots + 1 VIP marker per distinct ClusterIP (2).
    assert_eq!(
        sample(&scrape, "lb_map_entries", &[("map", "LB4_SERVICES")]),
        Some(6.0)
    );
    assert_eq!(
        sample(&scrape, "lb_map_capacity", &[("map", "LB4_SERVICES")]),
        Some(65536.0)
    );
    // Every map a reconcile fills is reported, whichever fills first.
    use lb_common::maps as m;
    for (map, capacity) in [
        (m::LB6_REVNAT, m::DEFAULT_SERVICES_MAX),
        (m::LB_MAGLEV, m::DEFAULT_MAGLEV_MAX),
        (m::LB_AFFINITY_MATCH, m::DEFAULT_SERVICES_MAX),
        (m::LB_AFFINITY_GROUP, m::DEFAULT_SERVICES_MAX),
        (m::LB4_SRC_RANGES, m::DEFAULT_SOURCE_RANGES_MAX),
        (m::LB6_SRC_RANGES, m::DEFAULT_SOURCE_RANGES_MAX),
    ] {
        assert_eq!(
            sample(&scrape, "lb_map_capacity", &[("map", map)]),
            Some(f64::from(capacity)),
            "{map}: {body}"
        );
        assert_eq!(
            sample(&scrape, "lb_map_entries", &[("map", map)]),
            Some(0.0),
            "{map}: these services use none"
        );
    }
    assert_eq!(
        sample(&scrape, "lb_reconciles_total", &[("result", "ok")]),
        Some(1.0)
    );
    assert!(
        body.contains("lb_reconcile_duration_seconds_count 1"),
        "{body}"
    );
    assert!(
        body.contains("lb_propagation_delay_seconds_bucket"),
        "{body}"
    );

    // A change observed by the file watcher shows up as a propagation delay.
    w.write_services(&services(&[0]));
    assert!(agent.wait_for_log("reconciled", 2, Duration::from_secs(10)));
    let (_, body) = agent.http_get("/metrics");
    assert!(
        body.contains("lb_propagation_delay_seconds_count 2"),
        "{body}"
    );

    // An invalid file is counted as a source error; healthz stays ok (the maps are good).
    w.write_services("services: [{name: x, clusterIPs: [nope], ports: [{port: 80}]}]");
    assert!(agent.wait_for_log("keeping the last good state", 1, Duration::from_secs(10)));
    let (_, body) = agent.http_get("/metrics");
    let scrape = parse_metrics(&body);
    assert_eq!(
        sample(
            &scrape,
            "lb_source_errors_total",
            &[("source", "file"), ("reason", "invalid")]
        ),
        Some(1.0)
    );

    let (code, body) = agent.http_get("/healthz");
    assert_eq!(code, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "ok");
    assert!(health["lastUpdated"].as_str().unwrap().ends_with('Z'));
    assert!(
        health["lastError"]
            .as_str()
            .unwrap()
            .contains("clusterIPs[0]"),
        "{health}"
    );
}

/// The Maglev seed is a cluster-wide setting whose value must not leak:
/// nodes are compared by its fingerprint, in the metrics (one series per
/// node, so a dashboard counts the distinct ones) and in `lbctl status`;
/// without a seed both say `built-in`.
#[test]
fn the_maglev_seed_fingerprint_is_exported_and_shown_and_the_seed_is_not() {
    let w = World::new("maglev_seed", 1);
    w.write_services(&services(&[0]));
    let agent = w.start_agent();
    let (_, body) = agent.http_get("/metrics");
    let scrape = parse_metrics(&body);
    assert_eq!(
        sample(
            &scrape,
            "lb_maglev_seed_info",
            &[("fingerprint", "built-in")]
        ),
        Some(1.0),
        "{body}"
    );
    assert!(agent
        .lbctl(&["status"])
        .contains("Maglev:    seed built-in"));
    drop(agent);

    let seed = "Zm9vYmFyYmF6cXV4";
    let fingerprint = lb::desired::maglev::Seed::from_text(seed)
        .fingerprint()
        .to_string();
    let agent = lb_testkit::agent::Agent::start_with(
        &w.services,
        &w.cgroup.path,
        &w.pins.path,
        &["--maglev-hash-seed", seed],
    );
    let (_, body) = agent.http_get("/metrics");
    let scrape = parse_metrics(&body);
    assert_eq!(
        sample(
            &scrape,
            "lb_maglev_seed_info",
            &[("fingerprint", &fingerprint)]
        ),
        Some(1.0),
        "{body}"
    );
    assert!(!body.contains(seed), "the seed itself is not exported");
    let status = agent.lbctl(&["status"]);
    assert!(
        status.contains(&format!("Maglev:    seed {fingerprint}")),
        "{status}"
    );
    assert!(!status.contains(seed));
    assert!(!agent.log_text().contains(seed), "nor logged");
}

#[test]
fn lbctl_status_reports_a_missing_pin_directory_clearly() {
    let out = Command::new(sibling_bin("lbctl"))
        .args(["status", "--pin-dir", "/sys/fs/bpf/lbtest-does-not-exist"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "status must fail when nothing is installed"
    );
    assert!(text.contains("datapath   MISSING"), "{text}");
    assert!(
        text.contains("nothing pinned at /sys/fs/bpf/lbtest-does-not-exist"),
        "{text}"
    );
    assert!(text.contains("cgroup2    ok"), "{text}");

    let out = Command::new(sibling_bin("lbctl"))
        .args([
            "service",
            "list",
            "--pin-dir",
            "/sys/fs/bpf/lbtest-does-not-exist",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("start lb-agent, or pass --pin-dir"));
}

#[test]
fn lbctl_refuses_to_run_without_root_with_a_clear_error() {
    use std::os::unix::{fs::PermissionsExt as _, process::CommandExt as _};
    // The build tree may sit under a directory "nobody" cannot enter (/root):
    // run a copy from a world-readable place.
    let dir = std::env::temp_dir().join(format!("lbtest-nonroot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.join("lbctl");
    std::fs::copy(sibling_bin("lbctl"), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&copy)
        .args(["service", "list"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs root"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn lbctl_status_service_get_and_backend_list_describe_a_running_install() {
    let w = World::new("lbctl_status_running", 2);
    w.write_services(&services(&[0, 1]));
    let agent = w.start_agent();
    let status = agent.lbctl_json(&["status"]);
    let hooks = status["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), lb::datapath::HOOKS.len(), "{hooks:?}");
    assert!(
        hooks.iter().any(|h| h["hook"] == "sock_release"),
        "{hooks:?}"
    );
    for h in hooks {
        assert_eq!(h["attached"], true, "{h}");
        assert_eq!(
            h["cgroup"].as_str().unwrap(),
            w.cgroup.path.to_str().unwrap()
        );
    }
    let maps = status["maps"].as_array().unwrap();
    let services = maps.iter().find(|m| m["map"] == "LB4_SERVICES").unwrap();
    assert_eq!(services["entries"], 6);

    let one = agent.lbctl(&["service", "get", "10.96.0.10:80/TCP"]);
    assert!(
        one.contains("10.96.0.10:80/TCP") && !one.contains("10.96.0.99"),
        "{one}"
    );
    let by_id = agent.lbctl_json(&["service", "get", "1"]);
    assert_eq!(by_id.as_array().unwrap().len(), 1);
    let backends = agent.lbctl_json(&["backend", "list"]);
    assert_eq!(backends.as_array().unwrap().len(), 2);
    assert_eq!(backends[0]["references"], 1);
}

/// The agent started with `--preallocate-maps` serves as usual, and
/// `lbctl status` shows each map's kernel memory: the preallocated
/// services map its whole capacity, a map made as usual far less.
#[test]
fn an_agent_with_preallocated_maps_serves_and_lbctl_status_shows_their_reserved_memory() {
    let w = World::new("prealloc_agent", 1);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&services(&[0]));
    let agent = Agent::start_with(
        &w.services,
        &w.cgroup.path,
        &w.pins.path,
        &["--preallocate-maps"],
    );
    assert!(w.probe("tcp", &format!("{VIP}:80"), 1)[0].ok, "served");
    let status = agent.lbctl_json(&["status"]);
    let maps = status["maps"].as_array().unwrap();
    let of = |name: &str| {
        let m = maps.iter().find(|m| m["map"] == name).unwrap();
        (
            m["memory"].as_u64().expect("memory shown"),
            m["capacity"].as_u64().unwrap(),
        )
    };
    let (services_memory, capacity) = of("LB4_SERVICES");
    let (affinity_memory, _) = of("LB_AFFINITY_MATCH");
    eprintln!("LB4_SERVICES: {services_memory} bytes for {capacity} entries; LB_AFFINITY_MATCH: {affinity_memory}");
    assert!(
        services_memory >= capacity * 64,
        "{services_memory} for {capacity}"
    );
    // Before Linux 6.4 memlock was an estimate from the capacity for either kind.
    if lb::datapath::features::kernel_release().is_some_and(|v| v >= (6, 4)) {
        assert!(
            services_memory > 2 * affinity_memory,
            "{services_memory} against {affinity_memory}"
        );
    }
    let table = agent.lbctl(&["status"]);
    assert!(table.contains("Memory") && table.contains("MiB"), "{table}");
}

#[test]
fn bpf_log_level_changes_at_run_time_and_debug_records_reach_the_agent_log() {
    let w = World::new("bpf_log_level", 1);
    let _servers = w.tcp_servers(8080, false);
    w.write_services(&services(&[0]));
    let mut agent = w.start_agent();
    assert!(w.probe("tcp", &format!("{VIP}:80"), 1)[0].ok);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !agent.log_text().contains("-> backend"),
        "debug logs are off by default"
    );

    agent.lbctl(&["config", "set", "bpf-log-level", "debug"]);
    assert!(w.probe("tcp", &format!("{VIP}:80"), 1)[0].ok);
    assert!(
        agent.wait_for_log("-> backend", 1, Duration::from_secs(5)),
        "debug record from the program not in the agent log:\n{}",
        agent.log_text()
    );
    agent.lbctl(&["config", "set", "bpf-log-level", "warn"]);
    let before = agent.log_text().matches("-> backend").count();
    assert!(w.probe("tcp", &format!("{VIP}:80"), 3).iter().all(|a| a.ok));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(agent.log_text().matches("-> backend").count(), before);
}
