//! A real Kubernetes node for the tests: containerd, runc and the CNI
//! bridge plugin (Debian's packages) and the kubelet of the test bed
//! (`lbtestbed kubelet`, the same v1.35 release as the control plane), with
//! no kube-proxy.
//!
//! Isolation on a shared machine:
//! * Network: a node either shares the control plane's network namespace
//!   (a one-node cluster) or has one of its own on the fabric
//!   (`crate::fabric`, several nodes); neither has a route out of the
//!   machine, both have a blackhole route for the service ranges. Pods hang
//!   off a `cni0` bridge there, in the pod CIDR the controller manager
//!   allocated to the Node (containerd writes the CNI configuration from a
//!   template when the kubelet hands it the CIDR, as kubenet did).
//! * Host name: each node has a UTS namespace of its own named after the
//!   Node: hostNetwork pods share it and answer with the node's name, as
//!   upstream tests expect.
//! * Cgroups: the kubelet's `cgroupRoot` is `/lbtest-node-<tag>` in every
//!   hierarchy (cgroup v1 controllers and the cgroup2 `unified` one, which
//!   runc joins too in hybrid mode). containerd and the kubelet themselves
//!   run in `<root>/runtime`, so the containers' shims land there as well:
//!   teardown kills every process of the subtree and removes it. The agent
//!   attaches to `/sys/fs/cgroup/unified/lbtest-node-<tag>`, never the root.
//! * Mounts: the node runs in a mount namespace of its own, a copy of the
//!   host's, made shared inside (Bidirectional volume propagation asks for a
//!   shared mount; the host's are private and stay so). Pod volumes, overlay
//!   snapshots and the pods' network namespaces (`/run/netns/cni-*`) exist
//!   only there and vanish with it. bpffs and cgroupfs are the host's own
//!   superblocks, so the agent's pins and attachments are real.
use std::{
    fs::File,
    io::{BufRead as _, BufReader},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

mod cgroups;
mod config;

use crate::{
    fabric::{self, Fabric},
    images::Images,
    k8s::{self, ControlPlane},
    netns::Netns,
};
use cgroups::{cgroup_pids, hierarchies, make_cgroup, remove_cgroup};

/// The cluster's pod range; the controller manager gives each Node a /24
/// of it (the first node gets 10.244.0.0/24).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The cluster DNS address the kubelet writes into pods' resolv.conf.
pub const CLUSTER_DNS: &str = "10.96.0.10";
/// The pod sandbox image (the kubelet's default for v1.35).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";
/// A busybox userland image for test pods (sh, wget, nc, httpd).
pub const BUSYBOX_IMAGE: &str = "lbtest.local/busybox:1";
/// The agent's image, as deploy/kubernetes names it.
pub const AGENT_IMAGE: &str = "ghcr.io/example/lb-agent:0.1.0";
/// The test servers (`lb-pod-server`: name and peer over TCP and UDP, bulk
/// transfers, long-lived echo) for pods.
pub const POD_SERVER_IMAGE: &str = "lbtest.local/pod-server:1";
/// CoreDNS as built in testbed/coredns (kube-dns).
pub const COREDNS_IMAGE: &str = "lbtest.local/coredns:v1.14.7";
/// The upstream e2e suite's test image (test/utils/image/manifest.go of
/// v1.35.8), built from the Kubernetes module, under its upstream name so
/// that the suite finds it without a registry.
pub const AGNHOST_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";
/// The DNS tests' second prober, under its upstream name: the same userland
/// (dig, getent, a shell) as agnhost's.
pub const JESSIE_DNSUTILS_IMAGE: &str = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7";

/// Where a node's network lives.
pub enum Place<'a> {
    /// In the control plane's namespace, at the apiserver's address (a
    /// one-node cluster).
    ControlPlane,
    /// In a namespace of its own, node `index` on the fabric.
    Fabric(&'a Fabric, usize),
}

pub struct Node {
    pub name: String,
    /// `lbtest-node-<tag>`: the kubelet's cgroupRoot (without the slash).
    pub cgroup_root: String,
    pub dir: PathBuf,
    pub containerd_socket: PathBuf,
    /// The Node's InternalIP.
    pub ip: String,
    /// The network namespace the node's processes and hostNetwork pods run in.
    pub netns_name: String,
    /// `spec.podCIDR` as the controller manager allocated it.
    pub pod_cidr: String,
    /// The apiserver's URL as this node reaches it (its kubeconfigs').
    pub api_server: String,
    procs: Vec<(&'static str, Child)>,
    /// The process that holds the node's mount and UTS namespaces.
    holder: Child,
    /// The node's own network namespace (`Place::Fabric`), held until the
    /// node's processes are gone (it drops last).
    _own_netns: Option<Netns>,
}

impl Node {
    /// Starts containerd and the kubelet for node `name` (its kubeconfig must
    /// have been written: `k8s::Options::nodes`) where `place` says, imports
    /// `images` and waits until the Node has its pod CIDR and is Ready.
    pub fn start(cp: &ControlPlane, name: &str, tag: &str, images: &Images, place: Place) -> Self {
        // The kubelet runs in cgroup v1 mode and the agent attaches to the
        // same subtree on the cgroup2 mount beside it: the hybrid layout.
        let unified = Path::new("/sys/fs/cgroup/unified");
        assert!(
            lb::sys::fs::cgroup2_mount().is_ok_and(|m| m == unified),
            "the test node needs the hybrid cgroup layout (v1 controllers under /sys/fs/cgroup, cgroup2 at {}); this machine has another",
            unified.display()
        );
        let cgroup_root = format!("lbtest-node-{tag}");
        let dir = std::env::temp_dir().join(format!("lb-node-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("cni/net.d")).unwrap();
        make_cgroup(&format!("{cgroup_root}/runtime"));
        let (own_netns, ip, api_server) = match place {
            Place::ControlPlane => {
                // Pods reach the node through cni0; the namespace must never
                // send a service address anywhere untranslated.
                fabric::blackhole_service_cidrs(&cp.netns);
                crate::run(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        &cp.netns.name,
                        "sysctl",
                        "-qw",
                        "net.ipv4.ip_forward=1",
                    ],
                );
                (
                    None,
                    k8s::ADVERTISE.to_string(),
                    format!("https://127.0.0.1:{}", cp.api_port),
                )
            }
            Place::Fabric(fabric, index) => {
                let ns = Netns::create(&format!("lbt-{tag}"));
                let ip = fabric::node_ip(index);
                fabric.plug_node(&ns, &format!("n{index}"), ip);
                (
                    Some(ns),
                    ip.to_string(),
                    format!("https://{}:{}", k8s::ADVERTISE, cp.api_port),
                )
            }
        };
        let netns_name = own_netns
            .as_ref()
            .map_or_else(|| cp.netns.name.clone(), |n| n.name.clone());

        // The mount namespace holder: a copy of the host's mounts, shared
        // inside so that Bidirectional propagation works.
        // The kubelet also sets machine-wide sysctls it wants
        // (vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1,
        // ...: pkg/kubelet/cm/container_manager_linux.go setupKernelTunables)
        // and has no setting to leave them alone. In the node's mount
        // namespace those /proc/sys files are shadowed by files that already
        // hold its values, so the machine's own settings are never written.
        let sysctls = dir.join("sysctl");
        std::fs::create_dir_all(&sysctls).unwrap();
        let mut shadow = String::new();
        for (key, value) in [
            ("vm/overcommit_memory", "1"),
            ("vm/panic_on_oom", "0"),
            ("kernel/panic", "10"),
            ("kernel/panic_on_oops", "1"),
            ("kernel/keys/root_maxkeys", "1000000"),
            ("kernel/keys/root_maxbytes", "25000000"),
        ] {
            let file = sysctls.join(key.replace('/', "."));
            std::fs::write(&file, format!("{value}\n")).unwrap();
            shadow.push_str(&format!(
                " && mount --bind {} /proc/sys/{key}",
                file.display()
            ));
        }
        // Places where containerd, libcni and the kubelet write whatever
        // their configuration says (shim sockets, the CNI result cache, log
        // links): directories of the node's own, in its namespace only.
        for (host, own) in [
            ("/run/containerd", "host/run-containerd"),
            ("/var/lib/cni", "host/var-lib-cni"),
            ("/var/log/containers", "host/var-log-containers"),
        ] {
            std::fs::create_dir_all(host).unwrap();
            std::fs::create_dir_all(dir.join(own)).unwrap();
            shadow.push_str(&format!(
                " && mount --bind {} {host}",
                dir.join(own).display()
            ));
        }
        // Private first (the host's mounts may be shared, as under systemd:
        // nothing mounted here may reach them), then shared inside only.
        let mut holder = Command::new("unshare");
        holder
            .args([
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
            ])
            .arg(format!(
                "hostname {name} && mount --make-rshared /{shadow} && echo ready && exec sleep 100000"
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut holder = k8s::spawn(holder);
        let mut line = String::new();
        BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "mount namespace holder failed");

        let run_dir = PathBuf::from(format!("/run/lbtest-node-{tag}"));
        let _ = std::fs::remove_dir_all(&run_dir);
        std::fs::create_dir_all(&run_dir).unwrap();
        let containerd_socket = run_dir.join("containerd.sock");
        let mut node = Self {
            name: name.to_string(),
            cgroup_root: cgroup_root.clone(),
            dir: dir.clone(),
            containerd_socket: containerd_socket.clone(),
            ip,
            netns_name,
            pod_cidr: String::new(),
            api_server: api_server.clone(),
            procs: Vec::new(),
            holder,
            _own_netns: own_netns,
        };

        std::fs::write(
            dir.join("containerd.toml"),
            config::containerd_toml(&dir, &run_dir, &containerd_socket),
        )
        .unwrap();
        std::fs::write(dir.join("cni/bridge.template"), config::cni_template(&dir)).unwrap();
        node.run(
            "containerd",
            "containerd",
            &[
                "--config",
                &dir.join("containerd.toml").display().to_string(),
            ],
        );
        node.wait(cp, "containerd's socket", Duration::from_secs(60), |n| {
            n.containerd_socket.exists()
        });
        for (image, tar) in &images.archives {
            let out = node
                .ctr(&[
                    "images",
                    "import",
                    "--no-unpack=false",
                    &tar.display().to_string(),
                ])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ctr import {image}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }

        let pki = cp.dir.join("pki");
        // The kubelet's credentials, with the apiserver as this node reaches it.
        let kubeconfig = dir.join("kubelet.kubeconfig");
        let written = std::fs::read_to_string(pki.join(format!("kubelet-{name}.kubeconfig")))
            .unwrap_or_else(|e| panic!("kubelet-{name}.kubeconfig (k8s::Options::nodes): {e}"));
        let local = format!("https://127.0.0.1:{}", cp.api_port);
        assert!(written.contains(&local), "{written}");
        std::fs::write(&kubeconfig, written.replace(&local, &api_server)).unwrap();
        std::fs::write(dir.join("resolv.conf"), "nameserver 127.0.0.1\n").unwrap();
        std::fs::write(
            dir.join("kubelet.yaml"),
            config::kubelet_yaml(&dir, &cgroup_root, &containerd_socket, &pki),
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("manifests")).unwrap();
        node.run(
            "kubelet",
            &k8s::testbed_bin().display().to_string(),
            &[
                "kubelet",
                &format!("--config={}", dir.join("kubelet.yaml").display()),
                &format!("--kubeconfig={}", kubeconfig.display()),
                &format!("--root-dir={}", dir.join("kubelet").display()),
                &format!("--cert-dir={}", dir.join("kubelet-pki").display()),
                &format!("--hostname-override={name}"),
                &format!("--node-ip={}", node.ip),
            ],
        );
        // The controller manager allocates the pod CIDR once the Node is
        // registered; the kubelet passes it on to containerd, which writes
        // the CNI configuration, and the node turns Ready.
        let mut pod_cidr = String::new();
        node.wait(cp, "the Node's pod CIDR", Duration::from_secs(120), |n| {
            pod_cidr = cp
                .kubectl_try(&["get", "node", &n.name, "-o", "jsonpath={.spec.podCIDR}"])
                .unwrap_or_default()
                .trim()
                .to_string();
            !pod_cidr.is_empty()
        });
        node.pod_cidr = pod_cidr;
        node.wait(cp, "the node to be Ready", Duration::from_secs(180), |n| {
            cp.kubectl_try(&[
                "get",
                "node",
                &n.name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .is_some_and(|s| s.trim() == "True")
        });
        node
    }

    /// Starts `program` in the node's network, mount and UTS namespaces and
    /// in `<cgroup root>/runtime`, with its output in `<dir>/<name>.log`;
    /// stopped when the node drops.
    pub(crate) fn run(&mut self, name: &'static str, program: &str, args: &[&str]) {
        use std::os::unix::process::CommandExt as _;
        let log = File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let mnt = File::open(format!("/proc/{}/ns/mnt", self.holder.id())).unwrap();
        let uts = File::open(format!("/proc/{}/ns/uts", self.holder.id())).unwrap();
        let net = File::open(format!("/run/netns/{}", self.netns_name)).unwrap();
        // Opened here: between fork and exec only async-signal-safe calls.
        let procs: Vec<File> = hierarchies()
            .iter()
            .map(|h| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(h.join(&self.cgroup_root).join("runtime/cgroup.procs"))
                    .unwrap()
            })
            .collect();
        // SAFETY: setns(2) and write(2) are async-signal-safe; the files stay
        // open in the closure until the spawn.
        unsafe {
            cmd.pre_exec(move || {
                for f in &procs {
                    if libc::write(f.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) != 0
                    || libc::setns(uts.as_raw_fd(), libc::CLONE_NEWUTS) != 0
                    || libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self.procs.push((name, k8s::spawn(cmd)));
    }

    /// `ctr` against this node's containerd, in the `k8s.io` namespace (the
    /// CRI's), inside the node's mount namespace.
    pub fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id()))
            .args(["--", "ctr", "--address"])
            .arg(&self.containerd_socket)
            .args(["-n", "k8s.io"])
            .args(args);
        cmd
    }

    /// Waits until `cond` holds; panics with the logs when a process of
    /// the node exits first or `timeout` passes.
    pub(crate) fn wait(
        &mut self,
        cp: &ControlPlane,
        what: &str,
        timeout: Duration,
        mut cond: impl FnMut(&Self) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return;
            }
            if let Some((name, status)) = k8s::exited(&mut self.procs) {
                panic!(
                    "{name} exited with {status} waiting for {what}:\n{}",
                    self.logs_of(cp)
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                self.logs_of(cp)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The tail of containerd's and the kubelet's logs (and the control plane's).
    pub fn logs_of(&self, cp: &ControlPlane) -> String {
        let mut out = cp.logs();
        out.push_str(&self.own_logs());
        out
    }

    /// The tail of containerd's and the kubelet's logs (and kube-proxy's,
    /// where it runs).
    pub fn own_logs(&self) -> String {
        let mut out = String::new();
        for name in ["containerd", "kubelet", "kube-proxy"] {
            if name == "kube-proxy" && !self.dir.join("kube-proxy.log").exists() {
                continue;
            }
            out.push_str(&k8s::log_tail(
                &format!("{} {name}", self.name),
                &self.dir.join(format!("{name}.log")),
                40,
            ));
        }
        out
    }

    /// The cgroup2 directory of the node's pods (what the agent attaches to).
    pub fn unified_cgroup(&self) -> PathBuf {
        PathBuf::from("/sys/fs/cgroup/unified").join(&self.cgroup_root)
    }

    /// The processes of the node (its cgroup subtree: runtime and pods)
    /// whose command name is `comm`, e.g. its agent's `lb-agent`.
    pub fn pids_named(&self, comm: &str) -> Vec<i32> {
        cgroup_pids(&self.cgroup_root)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
            })
            .collect()
    }

    /// `cmd` runs in the node's network namespace (as a hostNetwork pod
    /// would, without its cgroup).
    pub fn exec_in(&self, cmd: &mut Command) {
        crate::netns::exec_in(cmd, &self.netns_name).unwrap();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The kubelet first (it would restart containers), then every process
        // of the subtree: containerd, shims, pods.
        for (_, c) in self.procs.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // cgroup.kill (5.14) kills the whole subtree at once, no pid reuse race;
        // the pid loop below is for what it cannot reach.
        let _ = std::fs::write(self.unified_cgroup().join("cgroup.kill"), "1");
        crate::wait_until(Duration::from_secs(20), || {
            let pids = cgroup_pids(&self.cgroup_root);
            for pid in &pids {
                // SAFETY: kill(2) on pids read from our own cgroup subtree.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            pids.is_empty()
        });
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        crate::wait_until(Duration::from_secs(10), || {
            remove_cgroup(&self.cgroup_root);
            !hierarchies()
                .iter()
                .any(|h| h.join(&self.cgroup_root).exists())
        });
        let _ = std::fs::remove_dir_all(format!("/run/{}", self.cgroup_root));
        if !std::thread::panicking() {
            // Killed processes may still be flushing: retry for a moment.
            crate::wait_until(Duration::from_secs(10), || {
                std::fs::remove_dir_all(&self.dir).is_ok() || !self.dir.exists()
            });
        }
    }
}
