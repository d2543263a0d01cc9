//! Test kit for the load balancer: every test builds its own world and tears
//! it down on success and on failure (guards that clean up in `Drop`).
//!
//! * `topology`: a client namespace and backend namespaces on a bridge that
//!   lives in a hub namespace, never in the root namespace. The client has a
//!   blackhole route for the service range, so an untranslated connect fails
//!   locally instead of leaving the machine.
//! * `cgroup`: a child cgroup v2 per test; only processes moved there see the hooks.
//! * `agent`: lb-agent as a child process with its own pin directory.
//! * `servers`: TCP/UDP servers in backend namespaces that answer with their name
//!   and the peer address they saw.
//! * `probe`: runs `lb-probe` (client inside the cgroup and client namespace).
//! * `traffic`: bulk streams with every byte checked, downloads, connection
//!   churn, many datagrams from one socket.
pub mod agent;
pub mod apiserver;
pub mod cgroup;
pub mod cluster;
pub mod conformance;
pub mod dataplane;
pub mod empty_program;
pub mod fabric;
pub mod images;
pub mod k8s;
pub mod kube_cluster;
pub mod kube_proxy;
pub mod netns;
pub mod node;
pub mod packets;
pub mod pods;
pub mod previous;
pub mod probe;
pub mod relay;
pub mod servers;
pub mod topology;
pub mod traffic;
pub mod world;
pub mod xdp_pass;

use std::time::{Duration, Instant};

/// A short unique tag for names: test name + pid, cut to fit.
pub fn unique(test: &str) -> String {
    let short: String = test
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    format!("{short}-{}", std::process::id())
}

/// Polls `f` until it gives a value or `timeout` passes.
pub fn wait_until_some<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let mut found = None;
    wait_until(timeout, || {
        found = f();
        found.is_some()
    });
    found
}

/// Polls `cond` until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The directory of the binaries built next to the test executable
/// (target/<profile>).
pub fn sibling_bin_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("target dir");
    if dir.ends_with("deps") {
        dir.parent().unwrap().to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// Path of a binary built next to the test executable (target/<profile>/NAME).
pub fn sibling_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(|d| {
            if d.ends_with("deps") {
                d.parent()
            } else {
                Some(d)
            }
        })
        .expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (`cargo xtask test` does)",
        path.display()
    );
    path
}

/// Runs a command, panicking with its output when it fails.
pub fn run(cmd: &str, args: &[&str]) {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A counter of the data path pinned at `pin_dir` (`lb_common::config::CNT_*`),
/// summed over CPUs.
pub fn cluster_counter(pin_dir: &std::path::Path, index: u32) -> u64 {
    use aya::maps::{MapData, PerCpuArray};
    let map: PerCpuArray<MapData, u64> = PerCpuArray::try_from(
        lb::maps::bpf::open_pinned(pin_dir, lb_common::maps::LB_COUNTERS).unwrap(),
    )
    .unwrap();
    map.get(&index, 0).unwrap().iter().sum()
}
