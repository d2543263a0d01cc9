//! Installs what building and testing need, idempotently, saying what it does:
//! Debian packages (the rustc-web toolchain with its prebuilt `core` for
//! bpfel-unknown-none, LLVM 22, iproute2), bpf-linker 0.13 built against that
//! LLVM, and a bpffs mount. See ../shared/TOOLCHAIN.md for why these pieces.
use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _};

const APT_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "rust-web-llvm",
    // `cargo xtask lint`: clippy of the toolchain that builds the eBPF
    // programs, for bpfel-unknown-none; rustfmt where cargo is Debian's.
    "rust-web-clippy",
    "rustfmt-web",
    "llvm-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    "bpftool",
    "iproute2",
    "gcc",
    "libc6-dev",
    // kube-proxy's rule layouts, loaded side by side with ours by `cargo xtask bench`.
    "iptables",
    "nftables",
    // `lb-agent cleanup-kube-proxy` deletes stale conntrack entries with it (tested).
    "conntrack",
    // For kubernetes-validate (the manifest tests), in a venv of its own.
    "python3",
    "python3-venv",
    // The north-south tests turn GRO on for node devices, as a real NIC has it.
    "ethtool",
    // The real node of the Kubernetes tests (lb-testkit `node`): the container
    // runtime, the CNI bridge plugin, and a userland for the test pods' image.
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    // The e2e suite's agnhost image carries their nc (-v -t -w, -u), curl and
    // wget, and with jessie-dnsutils dig for the DNS tests.
    "netcat-openbsd",
    "curl",
    "wget",
    "bind9-dnsutils",
    // The Debian package: cargo-deb's dependency scan (dpkg-shlibdeps), and
    // `systemd-analyze verify` of its unit in the package test.
    "dpkg-dev",
    "systemd",
];

/// Validates deploy/ manifests against the Kubernetes schemas, offline.
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

const BPF_LINKER_VERSION: &str = "0.13.0";

/// Builds the Debian package (`cargo xtask deb`).
const CARGO_DEB_VERSION: &str = "3.8.0";

pub fn run() -> anyhow::Result<()> {
    if super::unsafe_geteuid() != 0 {
        bail!("setup installs packages and mounts bpffs: run as root");
    }
    apt()?;
    bpf_linker()?;
    cargo_deb()?;
    kubernetes_validate()?;
    bpffs()?;
    cgroup2()?;
    eprintln!("xtask: setup complete");
    Ok(())
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo"),
        PathBuf::from,
    )
}

/// PATH with $CARGO_HOME/bin first, where `cargo install` puts bpf-linker.
pub fn path_with_cargo_bin() -> std::ffi::OsString {
    let mut paths = vec![cargo_home().join("bin")];
    if let Some(p) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(paths).expect("PATH")
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn apt() -> anyhow::Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!("xtask: apt packages present ({})", APT_PACKAGES.len());
        return Ok(());
    }
    eprintln!("xtask: installing apt packages: {}", missing.join(" "));
    let mut update = Command::new("apt-get");
    update.arg("update");
    super::run(update)?;
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    super::run(install)
}

/// A tool from crates.io at an exact version, with `cargo install`, unless
/// `probe` (run with $CARGO_HOME/bin on PATH) already prints that version.
fn cargo_tool(
    krate: &str,
    version: &str,
    probe: &[&str],
    install_args: &[&str],
    env: &[(&str, &str)],
    how_long: &str,
) -> anyhow::Result<()> {
    let current = Command::new(probe[0])
        .args(&probe[1..])
        .env("PATH", path_with_cargo_bin())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if current.as_deref().is_some_and(|v| v.contains(version)) {
        eprintln!("xtask: {krate} {version} present");
        return Ok(());
    }
    eprintln!("xtask: installing {krate} {version} ({how_long})");
    let mut args = vec!["install", krate, "--version", version, "--locked"];
    args.extend(install_args);
    let mut c = super::cmd("cargo", &args);
    c.envs(env.iter().copied())
        .current_dir(std::env::temp_dir());
    super::run(c)
}

fn bpf_linker() -> anyhow::Result<()> {
    // Its default feature wants LLVM 23, which Debian does not ship.
    cargo_tool(
        "bpf-linker",
        BPF_LINKER_VERSION,
        &["bpf-linker", "--version"],
        &["--no-default-features", "--features", "llvm-22"],
        &[("LLVM_PREFIX", "/usr/lib/llvm-22")],
        "against Debian's LLVM 22, about a minute",
    )
}

fn cargo_deb() -> anyhow::Result<()> {
    cargo_tool(
        "cargo-deb",
        CARGO_DEB_VERSION,
        &["cargo", "deb", "--version"],
        &[],
        &[],
        "about two minutes",
    )
}

/// Where the test suite finds kubernetes-validate.
pub fn kubernetes_validate_bin() -> PathBuf {
    super::root().join("target/tools/kubernetes-validate/bin/kubernetes-validate")
}

fn kubernetes_validate() -> anyhow::Result<()> {
    let bin = kubernetes_validate_bin();
    if bin.exists() {
        eprintln!("xtask: kubernetes-validate present");
        return Ok(());
    }
    eprintln!("xtask: installing {KUBERNETES_VALIDATE} into target/tools (for the manifest tests)");
    let venv = super::root().join("target/tools/kubernetes-validate");
    let mut c = Command::new("/usr/bin/python3");
    c.args(["-m", "venv"]).arg(&venv);
    super::run(c)?;
    let mut c = Command::new(venv.join("bin/pip"));
    c.args(["install", "--quiet", KUBERNETES_VALIDATE]);
    super::run(c)
}

fn mounted(fstype: &str) -> anyhow::Result<Vec<String>> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    Ok(mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == fstype).then(|| f[1].to_string())
        })
        .collect())
}

fn bpffs() -> anyhow::Result<()> {
    if mounted("bpf")?.iter().any(|m| m == "/sys/fs/bpf") {
        eprintln!("xtask: bpffs mounted at /sys/fs/bpf");
        return Ok(());
    }
    eprintln!("xtask: mounting bpffs at /sys/fs/bpf");
    std::fs::create_dir_all("/sys/fs/bpf").ok();
    let mut c = Command::new("mount");
    c.args(["-t", "bpf", "bpf", "/sys/fs/bpf"]);
    super::run(c)
}

fn cgroup2() -> anyhow::Result<()> {
    match mounted("cgroup2")?.first() {
        Some(m) => {
            eprintln!("xtask: cgroup2 mounted at {m}");
            Ok(())
        }
        None => bail!("no cgroup2 file system is mounted; the socket hooks need cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup)"),
    }
}

/// Whether the process that made a test-kit name still runs: names carry
/// the test process's pid (`lb_testkit::unique`), and the hands-on cluster
/// (`cluster up`) is named `cluster` and owned by the pid in
/// target/cluster/pid. Another session's live run is never swept.
fn owner_alive(name: &str) -> bool {
    let alive = |pid: &str| {
        pid.parse::<u32>().is_ok_and(|p| p > 1)
            && std::path::Path::new(&format!("/proc/{pid}")).exists()
    };
    if name.split('-').any(|t| t == "cluster") {
        let pid =
            std::fs::read_to_string(super::root().join("target/cluster/pid")).unwrap_or_default();
        return alive(pid.trim());
    }
    name.split('-')
        .any(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) && alive(t))
}

/// Removes what a crashed test may have left: network namespaces, child
/// cgroups and pin directories named by the test kit (lbt-*, lbtest-*),
/// unless the process that made them still runs.
pub fn sweep_leftovers() {
    let mut found = Vec::new();
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with("lbt-") && !owner_alive(name) {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
                found.push(format!("netns {name}"));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/fs/bpf") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("lbtest-") && !owner_alive(&name) {
                let _ = std::fs::remove_dir_all(e.path());
                found.push(format!("pins {}", e.path().display()));
            }
        }
    }
    // A test node's cgroup subtree (lb-testkit `node`), in every hierarchy:
    // containers and shims outlive a killed test; kill them, then remove
    // the subtree leaves first.
    let node_trees: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|h| std::fs::read_dir(h.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("lbtest-node-") && !owner_alive(&n)
            })
        })
        .collect();
    for tree in &node_trees {
        kill_cgroup_tree(tree);
    }
    for tree in &node_trees {
        remove_cgroup_tree(tree);
        found.push(format!("node cgroup {}", tree.display()));
    }
    if let Ok(cgroups) = mounted("cgroup2") {
        for root in cgroups {
            if let Ok(entries) = std::fs::read_dir(&root) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with("lbtest-")
                        && !owner_alive(&name)
                        && std::fs::remove_dir(e.path()).is_ok()
                    {
                        found.push(format!("cgroup {}", e.path().display()));
                    }
                }
            }
        }
    }
    // A failed test keeps its control plane's and node's files for the
    // post-mortem (logs, etcd, images: hundreds of MiB); once its process
    // is gone they go.
    for e in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if (name.starts_with("lb-k8s-")
            || name.starts_with("lb-node-")
            || name.starts_with("lb-images-"))
            && !owner_alive(&name)
        {
            let _ = std::fs::remove_dir_all(e.path());
            found.push(format!("files {}", e.path().display()));
        }
    }
    if !found.is_empty() {
        eprintln!(
            "xtask: removed leftovers of failed or finished test runs: {}",
            found.join(", ")
        );
    }
}

/// SIGKILLs every process in the cgroup directory `dir` and below.
fn kill_cgroup_tree(dir: &std::path::Path) {
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter(|l| !l.trim().is_empty()) {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
        }
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            kill_cgroup_tree(&e.path());
        }
    }
}

/// Removes the cgroup directory `dir` and its children, leaves first.
fn remove_cgroup_tree(dir: &std::path::Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    for _ in 0..50 {
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
