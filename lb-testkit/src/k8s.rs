//! A real Kubernetes control plane for the tests: etcd, kube-apiserver (TLS,
//! RBAC, ServiceAccount tokens, dual-stack service CIDRs) and
//! kube-controller-manager (EndpointSlice, mirroring, ServiceAccount
//! controllers), built from the upstream Go modules (`testbed/`, one
//! multi-call binary, `lbtestbed`), in a network namespace of its own.
//!
//! The apiserver advertises an address on the loopback device of that namespace
//! (the `kubernetes` Service's endpoint must not be loopback) and listens
//! on all of its addresses; whatever must talk to it runs in the namespace
//! (the agent does: `Agent::start_kubernetes_in`).
//!
//! Every process is started from one long-lived thread with PR_SET_PDEATHSIG,
//! so they die with the test process even when a control plane is shared by
//! the tests of a binary (`shared()`).
use std::{
    io,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use crate::netns::Netns;

/// The address the apiserver advertises (on the `lo` of its namespace: this
/// kernel has no dummy devices).
pub const ADVERTISE: &str = "10.255.0.1";
pub const SERVICE_CIDRS: &str = "10.96.0.0/16,fd00:96::/112";

/// Where `cargo xtask` builds the test bed (`testbed/`).
/// Helm, built from its Go module (testbed/helm) by `cargo xtask testbed`.
pub fn helm_bin() -> PathBuf {
    let p = crate::sibling_bin_dir().join("../testbed/helm");
    assert!(
        p.exists(),
        "{} is not built: run `cargo xtask testbed` (testbed/helm)",
        p.display()
    );
    p
}

/// `kubectl ARGS` with `kubeconfig`, run in the network namespace `netns`:
/// what `ControlPlane::kubectl_cmd` runs, for a thread that cannot borrow
/// the control plane (one that keeps writing while a test kills parts of it).
pub fn kubectl_command(kubeconfig: &Path, netns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(testbed_bin());
    cmd.arg("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args);
    crate::netns::exec_in(&mut cmd, netns).unwrap();
    cmd
}

pub fn testbed_bin() -> PathBuf {
    let p = crate::sibling_bin_dir().join("../testbed/lbtestbed");
    assert!(
        p.exists(),
        "{} is not built: `cargo xtask test` builds testbed/ (Go) first; or run `cargo xtask testbed`",
        p.display()
    );
    p
}

/// Spawns processes from one thread that lives as long as the test
/// process: PR_SET_PDEATHSIG fires when the *thread* that forked a child
/// exits, and a test thread ends long before a shared control plane.
/// A command to spawn and where to send the child.
type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static S: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    S.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(Command, mpsc::Sender<io::Result<Child>>)>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        });
        Mutex::new(tx)
    })
}

pub(crate) fn spawn(mut cmd: Command) -> Child {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl is async-signal-safe; run between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner().lock().unwrap().send((cmd, tx)).unwrap();
    rx.recv().unwrap().expect("starting a test-bed process")
}

pub struct ControlPlane {
    pub dir: PathBuf,
    pub api_port: u16,
    /// The apiserver kubectl talks to (`use_apiserver`).
    admin_port: u16,
    /// etcd's client URL (in the control plane's namespace).
    pub etcd_url: String,
    procs: Vec<(&'static str, Child)>,
    /// Each process's arguments, to restart it.
    args: Vec<(&'static str, Vec<String>)>,
    // Last: the processes live in it.
    pub netns: Netns,
}

/// What runs beside etcd and the apiserver.
#[derive(Default, Clone)]
pub struct Options {
    /// Node names to write kubelet client certificates and kubeconfigs for
    /// (`pki/kubelet-<node>.kubeconfig`).
    pub nodes: Vec<String>,
    /// Run a real node's worth of control plane: every default controller
    /// (DaemonSets, Deployments, node lifecycle, ...) and kube-scheduler.
    /// Without it only the controllers Services need run, and pods must name
    /// their node.
    pub workloads: bool,
}

/// The controllers Service tests need (no scheduler, no workload controllers).
const SERVICE_CONTROLLERS: &str = "serviceaccount-controller,serviceaccount-token-controller,\
     endpointslice-controller,endpointslice-mirroring-controller,endpoints-controller,\
     namespace-controller,garbage-collector-controller,\
     root-ca-certificate-publisher-controller,service-cidr-controller";

impl ControlPlane {
    /// Starts etcd, the apiserver and the controller manager; returns once
    /// the apiserver is ready and the default ServiceAccount exists.
    pub fn start(tag: &str) -> Self {
        Self::start_with(tag, &Options::default())
    }

    /// Like `start`, with a scheduler, more controllers and node credentials
    /// as `opts` asks.
    pub fn start_with(tag: &str, opts: &Options) -> Self {
        let bin = testbed_bin();
        let netns = Netns::create(&format!("lbt-{tag}-cp"));
        // On lo: this kernel has no dummy devices; the apiserver only asks
        // that the address is not in 127.0.0.0/8.
        netns.ip(&["addr", "add", &format!("{ADVERTISE}/32"), "dev", "lo"]);
        netns.ip(&["addr", "add", "fd00:255::1/128", "dev", "lo", "nodad"]);
        let dir = std::env::temp_dir().join(format!("lb-k8s-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The well-known ports: the namespace is this control plane's alone,
        // and they lie below the ephemeral range (32768-60999). A port
        // picked free in the host namespace could be the one the
        // apiserver's next connection to etcd takes as its source port in
        // this namespace, and etcd then fails to bind it (seen once).
        let (etcd_c, etcd_p, api, kcm) = (2379, 2380, 6443, 10257);
        let mut cp = Self {
            dir: dir.clone(),
            api_port: api,
            admin_port: api,
            etcd_url: format!("http://127.0.0.1:{etcd_c}"),
            procs: Vec::new(),
            args: Vec::new(),
            netns,
        };
        let pki = dir.join("pki");
        let out = Command::new(&bin)
            .args(["certs", "--dir"])
            .arg(&pki)
            .args([
                "--server",
                &format!("https://127.0.0.1:{api}"),
                "--extra-ips",
                ADVERTISE,
                "--service-ips",
                "10.96.0.1,fd00:96::1",
                "--nodes",
                &opts.nodes.join(","),
            ])
            .output()
            .expect("lbtestbed certs");
        assert!(
            out.status.success(),
            "certs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p = |f: &str| pki.join(f).display().to_string();
        cp.run(
            "etcd",
            &[
                "etcd",
                "--data-dir",
                &dir.join("etcd").display().to_string(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_c}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{etcd_p}"),
                "--unsafe-no-fsync",
            ],
        );
        cp.run(
            "apiserver",
            &[
                "kube-apiserver",
                &format!("--etcd-servers=http://127.0.0.1:{etcd_c}"),
                "--bind-address=0.0.0.0",
                &format!("--secure-port={api}"),
                &format!("--advertise-address={ADVERTISE}"),
                &format!("--cert-dir={}", dir.join("apiserver").display()),
                &format!("--tls-cert-file={}", p("apiserver.crt")),
                &format!("--tls-private-key-file={}", p("apiserver.key")),
                &format!("--client-ca-file={}", p("ca.crt")),
                &format!(
                    "--kubelet-client-certificate={}",
                    p("apiserver-kubelet-client.crt")
                ),
                &format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,NodeRestriction",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                &format!("--service-account-key-file={}", p("sa.pub")),
                &format!("--service-account-signing-key-file={}", p("sa.key")),
                &format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
                "--allow-privileged=true",
                // Node names do not resolve here: exec/logs go to the InternalIP.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                // Watch caches on (the default); bookmarks are sent to
                // clients that ask for them.
            ],
        );
        cp.wait(
            "the apiserver to be ready",
            Duration::from_secs(180),
            |cp| cp.kubectl_ok(&["get", "--raw", "/readyz"]),
        );
        let kc = p("controller-manager.kubeconfig");
        // Nodes get their pod CIDRs from the node IPAM controller (a /24
        // each of the cluster's range), as on kubeadm's clusters.
        let node_ipam = [
            "--allocate-node-cidrs=true".to_string(),
            format!("--cluster-cidr={}", crate::node::CLUSTER_CIDR),
            "--node-cidr-mask-size=24".to_string(),
        ];
        let node_ipam: Vec<&str> = if opts.workloads {
            node_ipam.iter().map(String::as_str).collect()
        } else {
            Vec::new()
        };
        cp.run(
            "controller-manager",
            &[
                &[
                    "kube-controller-manager",
                    &format!("--kubeconfig={kc}"),
                    &format!("--authentication-kubeconfig={kc}"),
                    &format!("--authorization-kubeconfig={kc}"),
                    "--bind-address=127.0.0.1",
                    &format!("--secure-port={kcm}"),
                    &format!("--cert-dir={}", dir.join("kcm").display()),
                    "--leader-elect=false",
                    "--use-service-account-credentials",
                    &format!("--service-account-private-key-file={}", p("sa.key")),
                    &format!("--root-ca-file={}", p("ca.crt")),
                    &format!(
                        "--controllers={}",
                        if opts.workloads {
                            "*"
                        } else {
                            SERVICE_CONTROLLERS
                        }
                    ),
                ][..],
                &node_ipam,
            ]
            .concat(),
        );
        if opts.workloads {
            let kc = p("scheduler.kubeconfig");
            let port = 10259;
            cp.run(
                "scheduler",
                &[
                    "kube-scheduler",
                    &format!("--kubeconfig={kc}"),
                    &format!("--authentication-kubeconfig={kc}"),
                    &format!("--authorization-kubeconfig={kc}"),
                    "--bind-address=127.0.0.1",
                    &format!("--secure-port={port}"),
                    "--leader-elect=false",
                ],
            );
        }
        cp.wait(
            "the default ServiceAccount",
            Duration::from_secs(120),
            |cp| cp.kubectl_ok(&["-n", "default", "get", "serviceaccount", "default"]),
        );
        cp
    }

    fn run(&mut self, name: &'static str, args: &[&str]) {
        self.args.retain(|(n, _)| *n != name);
        self.args.push((
            name,
            args.iter().map(std::string::ToString::to_string).collect(),
        ));
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let mut cmd = Command::new(testbed_bin());
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        crate::netns::exec_in(&mut cmd, &self.netns.name).unwrap();
        self.procs.push((name, spawn(cmd)));
    }

    /// Waits for `cond`, panicking with the processes' logs on timeout or
    /// when one of them exited.
    pub fn wait(&mut self, what: &str, timeout: Duration, cond: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return;
            }
            if let Some((name, status)) = exited(&mut self.procs) {
                panic!(
                    "{name} exited with {status} waiting for {what}:\n{}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The tail of every process's log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (name, _) in &self.procs {
            out.push_str(&log_tail(name, &self.dir.join(format!("{name}.log")), 30));
        }
        out
    }

    /// The cluster admin's kubeconfig, for the apiserver in use (`use_apiserver`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        if self.admin_port == self.api_port {
            self.dir.join("pki/admin.kubeconfig")
        } else {
            self.dir
                .join(format!("pki/admin-{}.kubeconfig", self.admin_port))
        }
    }

    /// A second kube-apiserver over the same etcd, listening on `port`
    /// (process name "apiserver-2"), as an HA control plane has; returns
    /// once it is ready.
    pub fn start_second_apiserver(&mut self, port: u16) {
        let args: Vec<String> = self
            .args
            .iter()
            .find(|(n, _)| *n == "apiserver")
            .map(|(_, a)| a.clone())
            .unwrap()
            .into_iter()
            .map(|a| {
                if a.starts_with("--secure-port=") {
                    format!("--secure-port={port}")
                } else if a.starts_with("--cert-dir=") {
                    format!("--cert-dir={}", self.dir.join("apiserver-2").display())
                } else {
                    a
                }
            })
            .collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run("apiserver-2", &refs);
        let server = format!("--server=https://127.0.0.1:{port}");
        self.wait(
            "the second apiserver to be ready",
            Duration::from_secs(180),
            |cp| cp.kubectl_ok(&[&server, "get", "--raw", "/readyz"]),
        );
    }

    /// SIGKILLs the control-plane process `name` ("apiserver", "etcd", ...)
    /// and forgets it (a test that kills one means it).
    pub fn kill(&mut self, name: &str) {
        let i = self
            .procs
            .iter()
            .position(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no control-plane process {name}"));
        let (_, mut child) = self.procs.remove(i);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the killed process `name` again with the arguments it had;
    /// an apiserver is waited for until it is ready.
    pub fn start_again(&mut self, name: &'static str) {
        let args = self
            .args
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(|| panic!("{name} never ran"), |(_, a)| a.clone());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(name, &refs);
        if let Some(port) = args.iter().find_map(|a| a.strip_prefix("--secure-port=")) {
            let server = format!("--server=https://127.0.0.1:{port}");
            self.wait(
                &format!("{name} to be ready again"),
                Duration::from_secs(180),
                |cp| cp.kubectl_ok(&[&server, "get", "--raw", "/readyz"]),
            );
        }
    }

    /// From now on kubectl (and everything here that uses it) talks to the
    /// apiserver on `port`: after the first one was killed.
    pub fn use_apiserver(&mut self, port: u16) {
        let text = std::fs::read_to_string(self.dir.join("pki/admin.kubeconfig")).unwrap();
        let other = self.dir.join(format!("pki/admin-{port}.kubeconfig"));
        std::fs::write(
            &other,
            text.replace(
                &format!("https://127.0.0.1:{}", self.api_port),
                &format!("https://127.0.0.1:{port}"),
            ),
        )
        .unwrap();
        self.admin_port = port;
    }

    /// The `kubectl ARGS` command as the cluster admin, not yet started (for
    /// one that runs beside the test, in a thread of its own).
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        kubectl_command(&self.admin_kubeconfig(), &self.netns.name, args)
    }

    /// `helm ARGS` (built from helm.sh/helm/v3 by `cargo xtask testbed`) as
    /// the cluster admin, its cache and config in this control plane's
    /// directory: stdout, or stdout and stderr when it failed.
    pub fn helm(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(helm_bin());
        cmd.arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args)
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"));
        crate::netns::exec_in(&mut cmd, &self.netns.name).unwrap();
        let out = cmd.output().expect("helm");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    fn kubectl_ok(&self, args: &[&str]) -> bool {
        self.kubectl_cmd(args)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// `kubectl ARGS` as the cluster admin: stdout, or None when it failed.
    pub fn kubectl_try(&self, args: &[&str]) -> Option<String> {
        let out = self.kubectl_cmd(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl ARGS` as the cluster admin; panics with stderr on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_cmd(args).output().expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` with `yaml` on stdin.
    pub fn apply(&self, yaml: &str) -> String {
        use std::io::Write as _;
        let mut child = self
            .kubectl_cmd(&["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl apply");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(yaml.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A kubeconfig for ServiceAccount `ns/name`, with a token from the
    /// TokenRequest API (what a pod of that account gets), over TLS.
    pub fn service_account_kubeconfig(&self, ns: &str, name: &str) -> PathBuf {
        let token = self.kubectl(&["-n", ns, "create", "token", name, "--duration=2h"]);
        let ca = std::fs::read(self.dir.join("pki/ca.crt")).unwrap();
        let b64 = base64(&ca);
        let path = self.dir.join(format!("{ns}-{name}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {b64}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: {name}}}\ncurrent-context: test\n",
                port = self.api_port,
                token = token.trim()
            ),
        )
        .unwrap();
        path
    }

    /// Stops and starts the apiserver (same flags, same etcd).
    /// Compacts etcd's history to its current revision (what the
    /// apiserver's periodic compaction does); returns the revision.
    pub fn compact_etcd(&self) -> u64 {
        let mut cmd = Command::new(testbed_bin());
        crate::netns::exec_in(&mut cmd, &self.netns.name).unwrap();
        let out = cmd
            .args(["etcd-compact", "--endpoint", &self.etcd_url])
            .output()
            .expect("lbtestbed etcd-compact");
        assert!(
            out.status.success(),
            "etcd-compact: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    pub fn restart_apiserver(&mut self) {
        let i = self
            .procs
            .iter()
            .position(|(n, _)| *n == "apiserver")
            .unwrap();
        let (_, mut old) = self.procs.remove(i);
        let args = self
            .args
            .iter()
            .find(|(n, _)| *n == "apiserver")
            .map(|(_, a)| a.clone())
            .unwrap();
        let _ = old.kill();
        let _ = old.wait();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run("apiserver", &refs);
        self.wait("the restarted apiserver", Duration::from_secs(120), |cp| {
            cp.kubectl_ok(&["get", "--raw", "/readyz"])
        });
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for (_, c) in self.procs.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            // Killed processes may still be flushing: retry for a moment.
            crate::wait_until(Duration::from_secs(10), || {
                std::fs::remove_dir_all(&self.dir).is_ok() || !self.dir.exists()
            });
        }
    }
}

/// The first of `procs` that has exited, with its status.
pub(crate) fn exited(
    procs: &mut [(&'static str, Child)],
) -> Option<(&'static str, std::process::ExitStatus)> {
    procs
        .iter_mut()
        .find_map(|(name, c)| c.try_wait().ok().flatten().map(|s| (*name, s)))
}

/// `--- name ---` and the last `lines` lines of the log at `path`.
pub(crate) fn log_tail(name: &str, path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut tail: Vec<&str> = text.lines().rev().take(lines).collect();
    tail.reverse();
    format!("--- {name} ---\n{}\n", tail.join("\n"))
}

/// Standard base64 (RFC 4648) for a kubeconfig's CA data.
fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The control plane the tests of one binary share (each test uses its own
/// Kubernetes namespace and node name). Started on first use; its processes
/// die with the test process.
pub fn shared() -> &'static Mutex<ControlPlane> {
    static CP: OnceLock<Mutex<ControlPlane>> = OnceLock::new();
    static NETNS: OnceLock<String> = OnceLock::new();
    extern "C" fn remove_netns() {
        if let Some(ns) = NETNS.get() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
    CP.get_or_init(|| {
        let cp = ControlPlane::start(&crate::unique("k8s"));
        let _ = NETNS.set(cp.netns.name.clone());
        // Statics are never dropped: the namespace goes at exit.
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(remove_netns) };
        Mutex::new(cp)
    })
}

/// The deploy manifests (`deploy/kubernetes`), as `kubectl kustomize` would
/// render them, applied to the cluster: what docs/install.md tells users.
pub fn install_manifests(cp: &ControlPlane) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    cp.kubectl(&["apply", "--server-side", "-k", &dir.display().to_string()])
}

/// A Deployment `web` of `replicas` busybox httpd pods (each answers its
/// pod name on 8080), a Service `web` of `service_type` on port 80 for
/// them, and a pod `client` to fetch from: the node tests' workload.
pub fn web_backends(replicas: usize, service_type: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
        - name: httpd
          image: {image}
          command: [sh, -c, "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]
          readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: {service_type}
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080, protocol: TCP}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: default}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
    - {{name: client, image: {image}, command: [sleep, "100000"]}}
"#,
        image = crate::node::BUSYBOX_IMAGE
    )
}
