//! A real Kubernetes node for the tests: containerd, runc and the CNI
//! bridge plugin (Debian's packages) and the kubelet of the test bed
//! (`lbtestbed kubelet`, the same v1.35 release as the control plane), with
//! no kube-proxy.
//!
//! Isolation on a shared machine:
//! * Network: the node shares the control plane's network namespace (a
//!   one-node cluster, as kind's), which has no route out of the machine and
//!   a blackhole route for the service ranges. Pods hang off a `cni0`
//!   bridge there (10.244.0.0/24).
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

use crate::k8s::{self, ControlPlane};

/// The pods' address range on the node's bridge.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The cluster DNS address the kubelet writes into pods' resolv.conf.
pub const CLUSTER_DNS: &str = "10.96.0.10";
/// The pod sandbox image (the kubelet's default for v1.35).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";
/// A busybox userland image for test pods (sh, wget, nc, httpd).
pub const BUSYBOX_IMAGE: &str = "lbtest.local/busybox:1";
/// The agent's image, as deploy/kubernetes names it.
pub const AGENT_IMAGE: &str = "ghcr.io/example/lb-agent:0.1.0";
/// CoreDNS as built in testbed/coredns (kube-dns).
pub const COREDNS_IMAGE: &str = "lbtest.local/coredns:v1.14.7";
/// The upstream e2e suite's test image (test/utils/image/manifest.go of
/// v1.35.8), built from the Kubernetes module, under its upstream name so
/// that the suite finds it without a registry.
pub const AGNHOST_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";
/// The DNS tests' second prober, under its upstream name: the same userland
/// (dig, getent, a shell) as agnhost's.
pub const JESSIE_DNSUTILS_IMAGE: &str = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7";

/// kube-dns: CoreDNS answering for cluster.local from the apiserver (which
/// it reaches through the `kubernetes` ClusterIP, that is through the agent),
/// as kubeadm installs it, without `forward` (no upstream resolver here).
pub const KUBE_DNS: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
  - {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      containers:
        - name: coredns
          image: COREDNS_IMAGE
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
          readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
          livenessProbe: {httpGet: {path: /health, port: 8080}, initialDelaySeconds: 30}
          securityContext:
            capabilities: {add: [NET_BIND_SERVICE]}
          volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes:
        - {name: config, configMap: {name: coredns}}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: CLUSTER_DNS
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
"#;

/// `KUBE_DNS` with this node's image and address filled in.
pub fn kube_dns() -> String {
    KUBE_DNS
        .replace("COREDNS_IMAGE", COREDNS_IMAGE)
        .replace("CLUSTER_DNS", CLUSTER_DNS)
}

pub struct Node {
    pub name: String,
    /// `lbtest-node-<tag>`: the kubelet's cgroupRoot (without the slash).
    pub cgroup_root: String,
    pub dir: PathBuf,
    pub containerd_socket: PathBuf,
    procs: Vec<(&'static str, Child)>,
    /// The process that holds the node's mount namespace.
    holder: Child,
}

/// Every cgroup hierarchy mounted under /sys/fs/cgroup (v1 controllers,
/// name=systemd and the unified cgroup2 one).
fn hierarchies() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let p = e.path();
        if p.join("cgroup.procs").exists() {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Makes `rel` (e.g. `lbtest-node-x/runtime`) in every hierarchy; a new v1
/// cpuset is empty and takes no tasks until it has CPUs and memory nodes.
fn make_cgroup(rel: &str) {
    for h in hierarchies() {
        let mut path = h.clone();
        for part in Path::new(rel).components() {
            let parent = path.clone();
            path = path.join(part);
            if !path.exists() {
                std::fs::create_dir(&path)
                    .unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
            }
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if path.join(f).exists()
                    && std::fs::read_to_string(path.join(f))
                        .unwrap_or_default()
                        .trim()
                        .is_empty()
                {
                    let v = std::fs::read_to_string(parent.join(f)).unwrap();
                    std::fs::write(path.join(f), v.trim()).unwrap();
                }
            }
        }
    }
}

/// Every process in the subtree `rel` of the cgroup2 hierarchy.
fn cgroup_pids(rel: &str) -> Vec<i32> {
    fn walk(dir: &Path, out: &mut Vec<i32>) {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
    }
    let mut out = Vec::new();
    for h in hierarchies() {
        walk(&h.join(rel), &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// Removes the subtree `rel` from every hierarchy, leaves first.
fn remove_cgroup(rel: &str) {
    fn rmdirs(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rmdirs(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for h in hierarchies() {
        rmdirs(&h.join(rel));
    }
}

impl Node {
    /// Starts containerd and the kubelet for node `name` (its kubeconfig must
    /// have been written: `k8s::Options::nodes`), imports the images the
    /// tests need and waits until the node is Ready.
    pub fn start(cp: &ControlPlane, name: &str, tag: &str) -> Self {
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
        // Pods reach the node through cni0; the namespace must never send a
        // service address anywhere untranslated.
        for cidr in k8s::SERVICE_CIDRS.split(',') {
            let _ = Command::new("ip")
                .args(["-n", &cp.netns.name, "route", "add", "blackhole", cidr])
                .output();
        }
        let _ = Command::new("ip")
            .args([
                "netns",
                "exec",
                &cp.netns.name,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ])
            .output();

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
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(format!(
                "mount --make-rshared /{shadow} && echo ready && exec sleep 100000"
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
            procs: Vec::new(),
            holder,
        };

        std::fs::write(
            dir.join("containerd.toml"),
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
# Snapshotters and tracing this host cannot or need not run.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  # Sandboxes ask for oom_score_adj -998, and lowering it below our own
  # needs CAP_SYS_RESOURCE, which this machine's root lacks (runc then dies
  # with "can't get final child's PID from pipe: EOF"): clamp to ours.
  restrict_oom_score_adj = true
  # hugetlb is a cgroup2 controller here, not a v1 one: runc cannot apply it.
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
                root = dir.join("containerd").display(),
                state = run_dir.join("containerd").display(),
                sock = containerd_socket.display(),
                cni = dir.join("cni/net.d").display(),
                runc = run_dir.join("runc").display(),
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("cni/net.d/10-bridge.conflist"),
            format!(
                r#"{{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {{"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true,
    "ipMasq": false, "hairpinMode": true,
    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{POD_CIDR}"}}]],
             "dataDir": "{ipam}"}}}},
  {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
]}}
"#,
                ipam = dir.join("ipam").display(),
            ),
        )
        .unwrap();
        node.run(
            "containerd",
            "containerd",
            &[
                "--config",
                &dir.join("containerd.toml").display().to_string(),
            ],
            cp,
        );
        node.wait(cp, "containerd's socket", Duration::from_secs(60), |n| {
            n.containerd_socket.exists()
        });
        for (image, tar) in build_images(&dir) {
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
        std::fs::write(dir.join("resolv.conf"), "nameserver 127.0.0.1\n").unwrap();
        std::fs::write(
            dir.join("kubelet.yaml"),
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# No systemd here, and the machine's cgroup layout is hybrid (v1 controllers).
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: /{cgroup_root}
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
containerRuntimeEndpoint: unix://{sock}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
clusterDNS: [{CLUSTER_DNS}]
clusterDomain: cluster.local
resolvConf: {resolv}
# Images cannot be pulled back once collected: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{}}
protectKernelDefaults: false
serializeImagePulls: false
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
staticPodPath: {static_pods}
podLogsDir: {pod_logs}
"#,
                sock = containerd_socket.display(),
                ca = pki.join("ca.crt").display(),
                resolv = dir.join("resolv.conf").display(),
                static_pods = dir.join("manifests").display(),
                pod_logs = dir.join("pod-logs").display(),
            ),
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("manifests")).unwrap();
        node.run(
            "kubelet",
            &k8s::testbed_bin().display().to_string(),
            &[
                "kubelet",
                &format!("--config={}", dir.join("kubelet.yaml").display()),
                &format!(
                    "--kubeconfig={}",
                    pki.join(format!("kubelet-{name}.kubeconfig")).display()
                ),
                &format!("--root-dir={}", dir.join("kubelet").display()),
                &format!("--cert-dir={}", dir.join("kubelet-pki").display()),
                &format!("--hostname-override={name}"),
                &format!("--node-ip={}", k8s::ADVERTISE),
            ],
            cp,
        );
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

    /// Starts `program` in the node's network and mount namespaces and in
    /// `<cgroup root>/runtime`, with its output in `<dir>/<name>.log`.
    fn run(&mut self, name: &'static str, program: &str, args: &[&str], cp: &ControlPlane) {
        use std::os::unix::process::CommandExt as _;
        let log = File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let mnt = File::open(format!("/proc/{}/ns/mnt", self.holder.id())).unwrap();
        let net = File::open(format!("/run/netns/{}", cp.netns.name)).unwrap();
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

    fn wait(
        &mut self,
        cp: &ControlPlane,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&Self) -> bool,
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
        for name in ["containerd", "kubelet"] {
            out.push_str(&k8s::log_tail(
                name,
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

/// Builds the images the node runs (`lbimage`, go-containerregistry):
/// the pod sandbox, a busybox userland for test pods, CoreDNS, and the agent's image
/// as deploy/Dockerfile would (lb-agent and lbctl with the libraries they
/// link, and a shell for the DaemonSet's bpffs init container).
fn build_images(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let tools = crate::sibling_bin_dir().join("../testbed");
    let lbimage = tools.join("lbimage");
    let pause = tools.join("pause");
    let coredns = tools.join("coredns");
    let agnhost = tools.join("agnhost");
    for tool in [&lbimage, &pause, &coredns, &agnhost] {
        assert!(
            tool.exists(),
            "{} is not built: `cargo xtask testbed` builds it",
            tool.display()
        );
    }
    let busybox = "/bin/busybox";
    assert!(
        Path::new(busybox).exists(),
        "{busybox} missing: apt-get install busybox-static"
    );
    let porter = agnhost_sources().join("porter").display().to_string();
    let agent = crate::sibling_bin("lb-agent");
    let lbctl = crate::sibling_bin("lbctl");
    let specs: Vec<(&'static str, Vec<String>)> = vec![
        (
            PAUSE_IMAGE,
            vec![
                format!("--file={}=/pause", pause.display()),
                "--entrypoint=/pause".into(),
            ],
        ),
        (
            BUSYBOX_IMAGE,
            vec![format!("--busybox={busybox}"), "--cmd=sh".into()],
        ),
        (
            // As upstream's (Alpine with netcat-openbsd, curl, bind-tools):
            // the suite runs `nc -v -t -w 2`, `nc -u`, `curl` and `nslookup`
            // in its pods through `sh -x -c`.
            AGNHOST_IMAGE,
            vec![
                format!("--file={}=/agnhost", agnhost.display()),
                // porter's TLS ports, as upstream's Dockerfile adds them.
                format!("--file={porter}/localhost.crt=/localhost.crt"),
                format!("--file={porter}/localhost.key=/localhost.key"),
                // dash as /bin/sh: busybox's sh runs its own applets before
                // PATH, and its nc lacks -v/-t/-u.
                "--file=/bin/dash=/bin/sh".into(),
                "--file=/bin/nc.openbsd=/usr/bin/nc".into(),
                "--file=/usr/bin/curl=/usr/bin/curl".into(),
                // GNU wget: Debian's static busybox wget crashes (the
                // non-conformance Services tests fetch with `wget -q -O - -T 1`).
                "--file=/usr/bin/wget=/usr/bin/wget".into(),
                "--file=/usr/bin/dig=/usr/bin/dig".into(),
                "--file=/usr/bin/getent=/usr/bin/getent".into(),
                "--with-libs".into(),
                format!("--busybox={busybox}"),
                "--entrypoint=/agnhost".into(),
                "--cmd=pause".into(),
            ],
        ),
        (
            // The DNS tests' probe scripts: dig (+search, +tcp, PTR),
            // getent hosts, test, seq, sleep through `sh -c`.
            JESSIE_DNSUTILS_IMAGE,
            vec![
                "--file=/bin/dash=/bin/sh".into(),
                "--file=/usr/bin/dig=/usr/bin/dig".into(),
                "--file=/usr/bin/getent=/usr/bin/getent".into(),
                "--with-libs".into(),
                format!("--busybox={busybox}"),
            ],
        ),
        (
            COREDNS_IMAGE,
            vec![
                format!("--file={}=/coredns", coredns.display()),
                "--entrypoint=/coredns".into(),
            ],
        ),
        (
            AGENT_IMAGE,
            vec![
                format!("--file={}=/usr/local/bin/lb-agent", agent.display()),
                format!("--file={}=/usr/local/bin/lbctl", lbctl.display()),
                "--with-libs".into(),
                format!("--busybox={busybox}"),
                "--entrypoint=lb-agent".into(),
            ],
        ),
    ];
    let mut out = Vec::new();
    for (image, args) in specs {
        let tar = dir.join(format!("{}.tar", image.replace(['/', ':'], "_")));
        let res = Command::new(&lbimage)
            .arg(format!("--ref={image}"))
            .arg(format!("--out={}", tar.display()))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            res.status.success(),
            "lbimage {image}: {}",
            String::from_utf8_lossy(&res.stderr)
        );
        out.push((image, tar));
    }
    out
}

/// The pin directory of the DaemonSet's agent (bpffs is the host's),
/// removed on drop.
pub struct AgentPins(pub PathBuf);

impl Drop for AgentPins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The two ways docs/install.md installs the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Install {
    /// `kubectl apply -k` of an overlay of deploy/kubernetes.
    Kustomize,
    /// `helm install` of deploy/helm/lb-agent.
    Helm,
}

/// Installs the agent as docs/install.md says, filling in only what the
/// guide asks the user to set (the apiserver's address) and what keeps a
/// test off the machine's own cgroup root and pins (LB_CGROUP, LB_PIN_DIR)
/// and devices. Waits for the DaemonSet's rollout; panics with the pods'
/// state and logs.
pub fn install_agent(cp: &ControlPlane, node: &Node, how: Install) -> AgentPins {
    let pins = AgentPins(PathBuf::from(format!("/sys/fs/bpf/{}", node.cgroup_root)));
    match how {
        Install::Kustomize => apply_overlay(cp, node, &pins),
        Install::Helm => helm_install(cp, node, &pins),
    }
    wait_for_agent(cp, node);
    pins
}

/// `helm install lb-agent deploy/helm/lb-agent` with the test's settings
/// as `--set` values, checked in the rendered objects before the
/// privileged agent is installed.
fn helm_install(cp: &ControlPlane, node: &Node, pins: &AgentPins) {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/lb-agent");
    let chart = chart.display().to_string();
    let sets = [
        format!("k8sServiceHost={}", k8s::ADVERTISE),
        format!("k8sServicePort={}", cp.api_port),
        format!("cgroup.attachTo={}", node.unified_cgroup().display()),
        format!("bpf.pinDir={}", pins.0.display()),
        "devices={none}".to_string(),
    ];
    let mut args = vec!["lb-agent", chart.as_str(), "--namespace", "kube-system"];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    let mut template = vec!["template"];
    template.extend(&args);
    let rendered = cp
        .helm(&template)
        .unwrap_or_else(|e| panic!("helm template: {e}"));
    for want in [
        format!("LB_CGROUP: \"{}\"", node.unified_cgroup().display()),
        format!("LB_PIN_DIR: \"{}\"", pins.0.display()),
        "LB_DEVICES: \"none\"".to_string(),
    ] {
        assert!(
            rendered.contains(&want),
            "the chart lost {want}:\n{rendered}"
        );
    }
    let mut install = vec!["install"];
    install.extend(&args);
    let out = cp
        .helm(&install)
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    assert!(out.contains("STATUS: deployed"), "{out}");
}

/// `kubectl apply -k` of an overlay of deploy/kubernetes.
fn apply_overlay(cp: &ControlPlane, node: &Node, pins: &AgentPins) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = repo.join(format!("target/{}-overlay", node.cgroup_root));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../../deploy/kubernetes]
patches:
  - patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata: {{name: lb-agent, namespace: kube-system}}
      data:
        LB_K8S_API_SERVER: "{api}:{port}"
        LB_CGROUP: "{cgroup}"
        LB_PIN_DIR: "{pins}"
        LB_DEVICES: "none"
"#,
            api = k8s::ADVERTISE,
            port = cp.api_port,
            cgroup = node.unified_cgroup().display(),
            pins = pins.0.display(),
        ),
    )
    .unwrap();
    // The privileged agent sees the host's /sys/fs/cgroup: make sure the
    // overlay took before anything runs.
    let rendered = cp.kubectl(&["kustomize", &dir.display().to_string()]);
    for want in [
        node.unified_cgroup().display().to_string(),
        pins.0.display().to_string(),
        "LB_DEVICES: none".to_string(),
    ] {
        assert!(
            rendered.contains(&want),
            "the overlay lost {want}:\n{rendered}"
        );
    }
    let applied = cp.kubectl(&["apply", "--server-side", "-k", &dir.display().to_string()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(applied.contains("daemonset.apps/lb-agent"), "{applied}");
}

/// Waits for the agent's DaemonSet to roll out.
fn wait_for_agent(cp: &ControlPlane, node: &Node) {
    let rolled = cp.kubectl_try(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "ds/lb-agent",
        "--timeout=240s",
    ]);
    assert!(
        rolled.is_some(),
        "the agent's DaemonSet did not become ready:\n{}\n{}\n{}",
        cp.kubectl_try(&["-n", "kube-system", "describe", "pods"])
            .unwrap_or_default(),
        cp.kubectl_try(&[
            "-n",
            "kube-system",
            "logs",
            "ds/lb-agent",
            "--all-containers"
        ])
        .unwrap_or_default(),
        node.logs_of(cp)
    );
}

/// test/images/agnhost of the k8s.io/kubernetes module the test bed uses,
/// in Go's module cache (`go mod download` put it there for the build).
fn agnhost_sources() -> PathBuf {
    let go = ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| {
            Command::new(g)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("a Go toolchain (go on PATH or /usr/local/go/bin/go)");
    let out = Command::new(go)
        .args(["list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../testbed"))
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("go list -m k8s.io/kubernetes");
    assert!(
        out.status.success(),
        "go list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("test/images/agnhost")
}

/// A one-node cluster without kube-proxy: control plane with the scheduler
/// and every controller, one node, the agent as its DaemonSet pod
/// (`install_agent`), CoreDNS as kube-dns and rolled out. Fields drop in
/// order: the node (and the agent's pins) before the control plane.
pub struct Cluster {
    pub node: Node,
    pub pins: AgentPins,
    pub cp: ControlPlane,
}

impl Cluster {
    /// `node_name` is the Node's name (its kubelet certificate's too).
    pub fn start(tag: &str, node_name: &str) -> Self {
        Self::start_installed(tag, node_name, Install::Kustomize)
    }

    /// Like `start`, the agent installed the way `how` says.
    pub fn start_installed(tag: &str, node_name: &str, how: Install) -> Self {
        let cp = ControlPlane::start_with(
            tag,
            &k8s::Options {
                nodes: vec![node_name.to_string()],
                workloads: true,
            },
        );
        let node = Node::start(&cp, node_name, tag);
        let pins = install_agent(&cp, &node, how);
        cp.apply(&kube_dns());
        cp.kubectl(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deploy/coredns",
            "--timeout=180s",
        ]);
        Self { node, pins, cp }
    }
}
