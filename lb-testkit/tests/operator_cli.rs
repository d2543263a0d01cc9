//! What an operator meets first: a mistyped services file on a fresh node,
//! log lines in files and shippers, `lbctl version` across an upgrade, and
//! shell completions. Real agent, real pins (needs root).
use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use lb_testkit::{
    agent::{free_port, Agent, PinDir},
    cgroup::ChildCgroup,
    sibling_bin, unique,
    world::World,
};

const SERVICES: &str = "services:\n  - name: web\n    clusterIPs: [10.96.0.10]\n    ports: [{port: 80, targetPort: 8080}]\n    backends: [{address: 10.250.0.11}]\n";

/// lb-agent with `args` (plus a private cgroup, pins, ports and no devices),
/// run to its exit or killed after `limit`; stderr is a file, not a terminal.
fn agent_exit(args: &[&str], cgroup: &Path, pins: &Path, limit: Duration) -> (Option<i32>, String) {
    // One log per call: tests run in parallel in one process.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = std::env::temp_dir().join(format!("{}-{n}.log", unique("agent_exit")));
    let mut child = Command::new(sibling_bin("lb-agent"))
        .args(args)
        .arg("--cgroup")
        .arg(cgroup)
        .arg("--pin-dir")
        .arg(pins)
        .args(["--metrics-address", &format!("127.0.0.1:{}", free_port())])
        .args(["--healthz-address", "off", "--devices", "none"])
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (code, text)
}

fn lbctl(args: &[&str]) -> Output {
    Command::new(sibling_bin("lbctl"))
        .args(args)
        .output()
        .unwrap()
}

/// "Keep the last good state" needs one. On a node with nothing pinned, a
/// missing or invalid services file stops the agent with the error (and
/// installs nothing); once a state is pinned, the same mistake keeps it.
#[test]
fn with_nothing_pinned_a_missing_or_invalid_services_file_exits_non_zero_and_installs_nothing() {
    let tag = unique("cli_missing");
    let cgroup = ChildCgroup::create(&tag);
    let pins = PinDir::create(&tag);
    let missing = std::env::temp_dir().join(format!("{tag}-nope.yaml"));

    let (code, log) = agent_exit(
        &["--services", missing.to_str().unwrap()],
        &cgroup.path,
        &pins.path,
        Duration::from_secs(20),
    );
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}; log:\n{log}");
    assert!(
        log.contains("cannot read services file") && log.contains(missing.to_str().unwrap()),
        "{log}"
    );
    assert!(log.contains("no load-balancer state is pinned"), "{log}");
    assert!(
        !lb::datapath::pins::has_state(&pins.path),
        "nothing installed"
    );

    let invalid = std::env::temp_dir().join(format!("{tag}-bad.yaml"));
    std::fs::write(
        &invalid,
        "services:\n  - name: web\n    clusterIPs: [10.96.0.10]\n    ports: [{port: 70000}]\n",
    )
    .unwrap();
    let (code, log) = agent_exit(
        &["--services", invalid.to_str().unwrap()],
        &cgroup.path,
        &pins.path,
        Duration::from_secs(20),
    );
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}; log:\n{log}");
    assert!(
        log.contains("services[0].ports[0].port"),
        "names the field: {log}"
    );

    // A good start pins a state; a restart with the file gone keeps serving it.
    let good = std::env::temp_dir().join(format!("{tag}-good.yaml"));
    std::fs::write(&good, SERVICES).unwrap();
    let mut agent = Agent::start(&good, &cgroup.path, &pins.path);
    agent.terminate(Duration::from_secs(5));
    std::fs::remove_file(&good).unwrap();
    let (code, log) = agent_exit(
        &["--services", good.to_str().unwrap()],
        &cgroup.path,
        &pins.path,
        Duration::from_secs(5),
    );
    assert_eq!(
        code, None,
        "still running after 5 s with its pinned state; log:\n{log}"
    );
    assert!(
        log.contains("cannot read services file"),
        "and loud about the file: {log}"
    );
    let list = lbctl(&["service", "list", "--pin-dir", pins.path.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("10.96.0.10:80"));
    let _ = std::fs::remove_file(&invalid);
}

/// Off a terminal the log is plain text (no colour codes in files and
/// pipes); `--log-format json` gives one JSON object per line.
#[test]
fn logs_are_plain_text_off_a_terminal_and_json_lines_with_log_format_json() {
    let w = World::new("cli_logs", 1);
    w.write_services(SERVICES);
    let services = w.services.to_str().unwrap();
    let (_, text) = agent_exit(
        &["--services", services],
        &w.cgroup.path,
        &w.pins.path,
        Duration::from_secs(4),
    );
    assert!(text.contains("reconciled"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "colour codes in a log file:\n{text:?}"
    );

    let (_, json) = agent_exit(
        &["--services", services, "--log-format", "json"],
        &w.cgroup.path,
        &w.pins.path,
        Duration::from_secs(4),
    );
    let lines: Vec<serde_json::Value> = json
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.len() > 3, "{json}");
    assert!(lines
        .iter()
        .all(|l| l["level"].is_string() && l["timestamp"].is_string()));
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "reconciled" && l["fields"]["services"] == 1),
        "{json}"
    );
}

/// `lbctl version` agrees with the running agent, and says plainly when the
/// data path is pinned under another layout (an upgrade half done).
#[test]
fn lbctl_version_matches_the_running_agent_and_fails_on_a_half_done_upgrade() {
    let w = World::new("cli_version", 1);
    w.write_services(SERVICES);
    let _agent = w.start_agent();
    let layout = lb_common::maps::LAYOUT_VERSION;
    let out = lbctl(&["version", "--pin-dir", w.pins.path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "map layout v{layout} at {}",
            w.pins.path.display()
        )),
        "{text}"
    );
    let agent_line = text.lines().find(|l| l.starts_with("agent")).unwrap();
    assert!(
        agent_line.contains(&format!(
            "{} (map layout v{layout})",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );

    // An older layout pinned where this release looks beside its own.
    let tag = unique("cli_upgrade");
    let root = PinDir::create(&tag);
    let old = root.path.join(format!("v{}", layout - 1));
    let new = root.path.join(format!("v{layout}"));
    let cgroup = ChildCgroup::create(&tag);
    let services = std::env::temp_dir().join(format!("{tag}.yaml"));
    std::fs::write(&services, SERVICES).unwrap();
    let mut old_agent = Agent::start(&services, &cgroup.path, &old);
    old_agent.terminate(Duration::from_secs(5));
    let out = lbctl(&["version", "--pin-dir", new.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("pinned with map layout v{}", layout - 1)),
        "{text}"
    );
    assert!(
        text.contains(&format!("lb-agent uninstall --pin-dir {}", old.display())),
        "{text}"
    );
    drop(old_agent); // uninstalls v{layout-1}
    let _ = std::fs::remove_file(&services);
}

/// Completion scripts for both programs, valid bash that completes the
/// subcommands.
#[test]
fn shell_completions_are_valid_bash_for_lbctl_and_lb_agent() {
    for (bin, word) in [("lbctl", "maglev"), ("lb-agent", "cleanup-kube-proxy")] {
        let out = Command::new(sibling_bin(bin))
            .args(["completion", "bash"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{bin}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains(word), "{bin}: {script}");
        let path = std::env::temp_dir().join(format!("{}.bash", unique(bin)));
        std::fs::write(&path, &script).unwrap();
        let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
        assert!(
            check.status.success(),
            "{bin}: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let _ = std::fs::remove_file(&path);
    }
}
