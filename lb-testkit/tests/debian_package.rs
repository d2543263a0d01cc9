//! The Debian package for standalone mode (`cargo xtask deb`, cargo-deb),
//! installed for real with `dpkg -i`: its files and conffiles, the systemd
//! unit checked by `systemd-analyze verify`, the unit's ExecStart run as
//! systemd would run it (systemd is not PID 1 on the test machines) with its
//! EnvironmentFile and capability bounding set, real traffic through a service address, then
//! `dpkg --purge`, whose remove script takes the data path down (pins gone,
//! programs detached). Needs root; the package must not be installed
//! already (the test installs and purges it).
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use lb_testkit::{topology::Topology, world::World};

const VIP: &str = "10.96.0.10";
const UNIT: &str = "/lib/systemd/system/lb-agent.service";

fn package() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debian");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: `cargo xtask deb` builds the package",
                dir.display()
            )
        })
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| panic!("no .deb in {}: run `cargo xtask deb`", dir.display()))
}

fn run(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program).args(args).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn installed() -> bool {
    run("dpkg-query", &["-W", "-f", "${Status}", "lb-agent"])
        .1
        .contains("install ok installed")
}

/// Purges the package when the test ends, however it ends.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        if installed() {
            let (_, out) = run("dpkg", &["--purge", "lb-agent"]);
            eprintln!("cleanup: dpkg --purge lb-agent: {out}");
        }
    }
}

/// KEY=VALUE lines of an EnvironmentFile (comments and blanks skipped), as
/// systemd reads them.
fn environment_file(path: &str) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

#[test]
fn debian_package_installs_a_unit_whose_execstart_serves_traffic_and_purge_takes_the_data_path_down(
) {
    let deb = package();
    assert!(
        !installed(),
        "the lb-agent package is installed on this machine already; this test installs and purges it"
    );

    // What the package holds, before installing it.
    let (ok, contents) = run("dpkg-deb", &["--contents", deb.to_str().unwrap()]);
    assert!(ok, "{contents}");
    for file in [
        "./usr/bin/lb-agent",
        "./usr/bin/lbctl",
        "./lib/systemd/system/lb-agent.service",
        "./etc/lb/services.yaml",
        "./etc/default/lb-agent",
        "./usr/share/bash-completion/completions/lbctl",
        "./usr/share/bash-completion/completions/lb-agent",
        "./usr/share/zsh/vendor-completions/_lbctl",
        "./usr/share/fish/vendor_completions.d/lbctl.fish",
        "./usr/share/doc/lb-agent/README.md",
    ] {
        assert!(
            contents.contains(file),
            "{file} is not in the package:\n{contents}"
        );
    }
    let (_, conffiles) = run("dpkg-deb", &["--info", deb.to_str().unwrap(), "conffiles"]);
    assert!(conffiles.contains("/etc/lb/services.yaml"), "{conffiles}");
    assert!(conffiles.contains("/etc/default/lb-agent"), "{conffiles}");
    let (_, depends) = run("dpkg-deb", &["--field", deb.to_str().unwrap(), "Depends"]);
    assert!(depends.contains("libc6"), "Depends: {depends}");

    let _purge = Purge;
    let (ok, out) = run("dpkg", &["-i", deb.to_str().unwrap()]);
    assert!(ok, "dpkg -i: {out}");
    assert!(installed());
    let (ok, out) = run("systemd-analyze", &["verify", UNIT]);
    assert!(ok, "systemd-analyze verify {UNIT}: {out}");
    let (ok, version) = run("/usr/bin/lbctl", &["version"]);
    assert!(
        version.contains(env!("CARGO_PKG_VERSION")),
        "{ok} {version}"
    );
    // The completions are the binaries' own (clap's generator).
    let completion =
        std::fs::read_to_string("/usr/share/bash-completion/completions/lbctl").unwrap();
    assert!(
        completion.contains("complete -F") && completion.contains("service"),
        "{completion}"
    );

    // The operator's part: backends, a services file, settings. The
    // settings keep the test in a cgroup and pin directory of its own.
    let w = World::new("deb", 2);
    let _servers = w.tcp_servers(8080, false);
    std::fs::write(
        "/etc/lb/services.yaml",
        format!(
            "services:\n  - name: web\n    clusterIPs: [{VIP}]\n    ports: [{{port: 80, targetPort: 8080}}]\n    backends: [{{address: {}}}, {{address: {}}}]\n",
            Topology::backend_ip(0),
            Topology::backend_ip(1)
        ),
    )
    .unwrap();
    let metrics_port = lb_testkit::agent::free_port();
    std::fs::write(
        "/etc/default/lb-agent",
        format!(
            "# written by the test\nLB_CGROUP={}\nLB_PIN_DIR={}\nLB_METRICS_ADDRESS=127.0.0.1:{metrics_port}\nLB_HEALTHZ_ADDRESS=off\n",
            w.cgroup.path.display(),
            w.pins.path.display()
        ),
    )
    .unwrap();

    // Run the unit's ExecStart with its EnvironmentFile, as systemd would.
    let unit = std::fs::read_to_string(UNIT).unwrap();
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in {UNIT}"))
            .to_string()
    };
    let exec = value("ExecStart");
    let env_file = value("EnvironmentFile");
    let env = environment_file(env_file.trim_start_matches('-'));
    assert_eq!(env["LB_PIN_DIR"], w.pins.path.display().to_string());
    let mut argv = exec.split_whitespace();
    let log = std::env::temp_dir().join(format!("lb-deb-{}.log", w.tag));
    // With the unit's capability bounding set, as systemd applies it.
    let caps: Vec<String> = value("CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect();
    let program = std::path::PathBuf::from(argv.next().unwrap());
    let mut agent = lb_testkit::agent::with_only_capabilities(&program, &caps)
        .args(argv)
        .envs(&env)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let reconciled = lb_testkit::wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("reconciled"))
    });
    if !reconciled {
        let _ = agent.kill();
        panic!(
            "the unit's agent did not start:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    // Real connections through the service address reach both backends.
    let attempts = w.probe("tcp", &format!("{VIP}:80"), 200);
    let mut seen = BTreeMap::<String, usize>::new();
    for a in &attempts {
        assert!(a.ok, "{a:?}");
        *seen.entry(a.backend().unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    let (ok, list) = Command::new("/usr/bin/lbctl")
        .args(["service", "list"])
        .env("LB_PIN_DIR", &w.pins.path)
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
            )
        })
        .unwrap();
    assert!(ok && list.contains(&format!("{VIP}:80/TCP")), "{list}");

    // The agent stops (as `systemctl stop` would); the data path stays.
    // SAFETY: kill(2) on our own child, which has not been waited for.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let _ = agent.wait();
    assert!(lb::datapath::pins::has_state(&w.pins.path));
    assert!(w.probe("tcp", &format!("{VIP}:80"), 5).iter().all(|a| a.ok));

    // Purge: the remove script reads /etc/default/lb-agent and uninstalls
    // the data path; dpkg removes the files and conffiles.
    let (ok, out) = run("dpkg", &["--purge", "lb-agent"]);
    assert!(ok, "dpkg --purge: {out}");
    assert!(!installed());
    assert!(
        !w.pins.path.exists(),
        "pins outlived the package: {}",
        w.pins.path.display()
    );
    let (_, hooks) = run(
        "bpftool",
        &["cgroup", "show", w.cgroup.path.to_str().unwrap()],
    );
    assert!(
        !hooks.contains("connect4"),
        "programs outlived the package:\n{hooks}"
    );
    for gone in [
        "/usr/bin/lb-agent",
        "/usr/bin/lbctl",
        UNIT,
        "/etc/lb/services.yaml",
        "/etc/default/lb-agent",
        "/etc/lb",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} outlived dpkg --purge");
    }
    // Nothing translates now: the service address is just an address.
    assert!(w
        .probe("tcp", &format!("{VIP}:80"), 3)
        .iter()
        .all(|a| !a.ok));
}
