//! lb-agent as a child process, with a pin directory of its own; killed and
//! uninstalled on drop.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

pub struct PinDir {
    pub path: PathBuf,
}

impl PinDir {
    pub fn create(tag: &str) -> Self {
        if !Path::new("/sys/fs/bpf").join(".").exists() {
            panic!("/sys/fs/bpf is missing: mount bpffs (cargo xtask test does)");
        }
        let path = PathBuf::from(format!("/sys/fs/bpf/lbtest-{tag}"));
        let _ = lb::datapath::uninstall(&path);
        Self { path }
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(e) = lb::datapath::uninstall(&self.path) {
            eprintln!("cleanup of {}: {e}", self.path.display());
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

pub struct Agent {
    child: Option<Child>,
    /// The lb-agent this runs: this build's (target/<profile>/lb-agent),
    /// or another release's (`previous::agent()`, the upgrade test).
    pub binary: PathBuf,
    pub log: PathBuf,
    /// `--services FILE` or `--kubernetes ...`.
    pub source_args: Vec<String>,
    pub cgroup: PathBuf,
    pub pin_dir: PathBuf,
    /// Where /metrics and /healthz listen (a free loopback port per agent).
    pub metrics: std::net::SocketAddr,
    /// The proxy health server (--healthz-address).
    pub healthz: std::net::SocketAddr,
    pub extra_args: Vec<String>,
    /// Run the agent inside this network namespace (it then is the "host").
    pub netns: Option<String>,
    /// How long a (re)start may take to reach its first reconcile.
    pub startup_timeout: Duration,
    /// The log line that says a start is done ("reconciled" normally).
    pub ready_log: &'static str,
    /// Run with only these capabilities (setpriv's names: bpf, net_admin,
    /// ...), as a container with a capability list would; None: root's.
    pub capabilities: Option<Vec<String>>,
}

/// A command that runs `binary` with only `caps` (setpriv's names): the
/// bounding set is cut to them, so root's exec keeps only them
/// (capabilities(7): P'(permitted) = P(inheritable) & F(inheritable) |
/// F(permitted) & P(bounding), with the inheritable set emptied).
pub fn with_only_capabilities(binary: &Path, caps: &[String]) -> Command {
    let mut bounding = String::from("-all");
    for c in caps {
        bounding.push_str(",+");
        bounding.push_str(c);
    }
    let mut cmd = Command::new("setpriv");
    cmd.arg("--inh-caps=-all")
        .arg(format!("--bounding-set={bounding}"))
        .arg("--")
        .arg(binary);
    cmd
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How long a start may take to reach its first reconcile, normally.
const STARTUP: Duration = Duration::from_secs(20);

fn file_source(services: &Path) -> Vec<String> {
    vec!["--services".to_string(), services.display().to_string()]
}

impl Agent {
    /// Starts the agent and waits for its first reconcile.
    pub fn start(services: &Path, cgroup: &Path, pin_dir: &Path) -> Self {
        Self::start_with(services, cgroup, pin_dir, &[])
    }

    /// Like `start`, with only the capabilities `caps` (setpriv's names).
    pub fn start_with_capabilities(
        services: &Path,
        cgroup: &Path,
        pin_dir: &Path,
        caps: &[&str],
    ) -> Self {
        let mut agent = Self::unspawned(file_source(services), cgroup, pin_dir, &[], None);
        agent.capabilities = Some(caps.iter().map(ToString::to_string).collect());
        agent.spawn();
        agent
    }

    pub fn start_with(services: &Path, cgroup: &Path, pin_dir: &Path, extra_args: &[&str]) -> Self {
        Self::launch(
            file_source(services),
            cgroup,
            pin_dir,
            extra_args,
            None,
            STARTUP,
        )
    }

    /// Kubernetes mode against `api_server` (a URL), as node `node`.
    pub fn start_kubernetes(
        api_server: &str,
        node: &str,
        cgroup: &Path,
        pin_dir: &Path,
        extra_args: &[&str],
    ) -> Self {
        let source = [
            "--kubernetes",
            "--k8s-api-server",
            api_server,
            "--node-name",
            node,
            "--min-sync-period",
            "20ms",
        ];
        let source = source
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        Self::launch(source, cgroup, pin_dir, extra_args, None, STARTUP)
    }

    /// Kubernetes mode against a real apiserver: `kubeconfig` (a
    /// ServiceAccount's token, over TLS), as node `node`, the agent running
    /// in network namespace `netns` (where the apiserver is reachable).
    pub fn start_kubernetes_in(
        netns: &str,
        kubeconfig: &Path,
        node: &str,
        cgroup: &Path,
        pin_dir: &Path,
        extra_args: &[&str],
    ) -> Self {
        Self::start_kubernetes_with(
            netns, kubeconfig, node, cgroup, pin_dir, "20ms", extra_args, STARTUP,
        )
    }

    /// Like `start_kubernetes_in`, with the agent's --min-sync-period and
    /// how long its first reconcile may take (a big cluster's initial list).
    #[allow(clippy::too_many_arguments)]
    pub fn start_kubernetes_with(
        netns: &str,
        kubeconfig: &Path,
        node: &str,
        cgroup: &Path,
        pin_dir: &Path,
        min_sync_period: &str,
        extra_args: &[&str],
        startup: Duration,
    ) -> Self {
        let source = vec![
            "--kubernetes".to_string(),
            "--kubeconfig".to_string(),
            kubeconfig.display().to_string(),
            "--node-name".to_string(),
            node.to_string(),
            "--min-sync-period".to_string(),
            min_sync_period.to_string(),
        ];
        Self::launch(source, cgroup, pin_dir, extra_args, Some(netns), startup)
    }

    /// Like `start_with`, with the agent running inside network namespace `netns`.
    pub fn start_in_netns(
        netns: &str,
        services: &Path,
        cgroup: &Path,
        pin_dir: &Path,
        extra_args: &[&str],
    ) -> Self {
        Self::start_in_netns_as(
            &crate::sibling_bin("lb-agent"),
            netns,
            services,
            cgroup,
            pin_dir,
            extra_args,
        )
    }

    /// Like `start_in_netns`, running `binary` (another release's agent).
    pub fn start_in_netns_as(
        binary: &Path,
        netns: &str,
        services: &Path,
        cgroup: &Path,
        pin_dir: &Path,
        extra_args: &[&str],
    ) -> Self {
        let mut agent = Self::unspawned(
            file_source(services),
            cgroup,
            pin_dir,
            extra_args,
            Some(netns.to_string()),
        );
        agent.binary = binary.to_path_buf();
        agent.spawn();
        agent
    }

    /// Builds the agent, spawns it and waits up to `timeout` for its first reconcile.
    fn launch(
        source_args: Vec<String>,
        cgroup: &Path,
        pin_dir: &Path,
        extra_args: &[&str],
        netns: Option<&str>,
        timeout: Duration,
    ) -> Self {
        let mut agent = Self::unspawned(
            source_args,
            cgroup,
            pin_dir,
            extra_args,
            netns.map(str::to_string),
        );
        agent.startup_timeout = timeout;
        agent.spawn();
        agent
    }

    fn unspawned(
        source_args: Vec<String>,
        cgroup: &Path,
        pin_dir: &Path,
        extra_args: &[&str],
        netns: Option<String>,
    ) -> Self {
        let log = std::env::temp_dir().join(format!(
            "lb-agent-{}.log",
            pin_dir.file_name().unwrap().to_string_lossy()
        ));
        Agent {
            child: None,
            binary: crate::sibling_bin("lb-agent"),
            log,
            source_args,
            cgroup: cgroup.to_path_buf(),
            pin_dir: pin_dir.to_path_buf(),
            metrics: ([127, 0, 0, 1], free_port()).into(),
            healthz: ([127, 0, 0, 1], free_port()).into(),
            extra_args: extra_args
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
            netns,
            startup_timeout: STARTUP,
            ready_log: "reconciled",
            capabilities: None,
        }
    }

    /// GET on the agent's metrics server: (status code, body). An agent in a network namespace listens there: the request is made
    /// from a thread that enters it.
    pub fn http_get(&self, path: &str) -> (u16, String) {
        self.http_get_at(self.metrics, path)
    }

    /// GET on the agent's proxy health server (`/healthz`, `/livez`).
    pub fn healthz_get(&self, path: &str) -> (u16, String) {
        self.http_get_at(self.healthz, path)
    }

    /// GET on any address as seen from the agent's network namespace.
    pub fn http_get_at(&self, addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        let r = self.http_request_at(addr, path);
        (r.code, r.body)
    }

    /// GET with the reply's headers, from the agent's network namespace.
    pub fn http_request_at(&self, addr: std::net::SocketAddr, path: &str) -> HttpReply {
        self.try_http_request_at(addr, path)
            .unwrap_or_else(|e| panic!("connecting to {addr}: {e}\n{}", self.log_text()))
    }

    /// Like `http_request_at`, with a refused connection as an error.
    pub fn try_http_request_at(
        &self,
        addr: std::net::SocketAddr,
        path: &str,
    ) -> std::io::Result<HttpReply> {
        let path = path.to_string();
        match self.netns.clone() {
            None => try_http_request(addr, &path),
            Some(ns) => std::thread::spawn(move || {
                crate::netns::enter(&ns).expect("entering the agent's namespace");
                try_http_request(addr, &path)
            })
            .join()
            .unwrap(),
        }
    }

    fn spawn(&mut self) {
        let _ = std::fs::remove_file(&self.log);
        let log = std::fs::File::create(&self.log).unwrap();
        let mut cmd = match &self.capabilities {
            Some(caps) => with_only_capabilities(&self.binary, caps),
            None => Command::new(&self.binary),
        };
        if let Some(ns) = &self.netns {
            crate::netns::exec_in(&mut cmd, ns).expect("netns");
        }
        let child = cmd
            .args(&self.source_args)
            .env("KUBECONFIG", "/nonexistent")
            .arg("--cgroup")
            .arg(&self.cgroup)
            .arg("--pin-dir")
            .arg(&self.pin_dir)
            .arg("--metrics-address")
            .arg(self.metrics.to_string())
            .arg("--healthz-address")
            .arg(self.healthz.to_string())
            .args(&self.extra_args)
            // Never the machine's own devices: a test names its devices.
            .args(
                (!self.extra_args.iter().any(|a| a.starts_with("--devices")))
                    .then_some(["--devices", "none"])
                    .into_iter()
                    .flatten(),
            )
            .env("LB_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning lb-agent");
        self.child = Some(child);
        let ready = self.ready_log;
        let ok = self.wait_for_log(ready, 1, self.startup_timeout);
        assert!(
            ok,
            "lb-agent did not log {ready:?}; log:\n{}",
            self.log_text()
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `needle` appears at least `times` times in the log.
    pub fn wait_for_log(&mut self, needle: &str, times: usize, timeout: Duration) -> bool {
        crate::wait_until(timeout, || {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("lb-agent exited with {status}; log:\n{}", self.log_text());
                }
            }
            self.log_text().matches(needle).count() >= times
        })
    }

    /// Like `start_with`, for big services files: waits up to `timeout` for the first reconcile.
    pub fn start_slow(
        services: &Path,
        cgroup: &Path,
        pin_dir: &Path,
        extra_args: &[&str],
        timeout: Duration,
    ) -> Self {
        Self::launch(
            file_source(services),
            cgroup,
            pin_dir,
            extra_args,
            None,
            timeout,
        )
    }

    /// Like `start_slow`, done when `ready_log` appears in the log (a start
    /// whose first reconcile refuses services logs no "reconciled").
    pub fn start_until(
        services: &Path,
        cgroup: &Path,
        pin_dir: &Path,
        extra_args: &[&str],
        ready_log: &'static str,
        timeout: Duration,
    ) -> Self {
        let mut agent = Self::unspawned(file_source(services), cgroup, pin_dir, extra_args, None);
        agent.startup_timeout = timeout;
        agent.ready_log = ready_log;
        agent.spawn();
        agent
    }

    /// SIGTERM, then waits up to `limit` for the agent to exit; how long it
    /// took (None: still running at the limit, then SIGKILLed).
    pub fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let mut c = self.child.take()?;
        let started = std::time::Instant::now();
        // SAFETY: a plain signal to our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        // Polled every millisecond: the 20 ms steps of `wait_until` would
        // add up to 20 ms to what is measured.
        let mut exited = false;
        while started.elapsed() < limit {
            if matches!(c.try_wait(), Ok(Some(_))) {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // One last look: it may have exited during the last sleep.
        exited = exited || matches!(c.try_wait(), Ok(Some(_)));
        let took = started.elapsed();
        if !exited {
            let _ = c.kill();
        }
        let _ = c.wait();
        exited.then_some(took)
    }

    /// The agent's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// SIGKILL: no chance to clean anything up.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// What a DaemonSet's rolling update does to a node: SIGTERM (waiting
    /// up to 5 s, as a pod's grace period would), then `binary` started on
    /// the same pin directory, cgroup and flags; returns once it has
    /// reconciled. The log is the new agent's only.
    pub fn replace_with(&mut self, binary: &Path) {
        assert!(
            self.terminate(Duration::from_secs(5)).is_some(),
            "the agent did not exit within 5 s of SIGTERM; log:\n{}",
            self.log_text()
        );
        self.binary = binary.to_path_buf();
        self.spawn();
    }

    /// Starts `lbctl monitor ARGS -o json` and waits until it listens.
    pub fn monitor(&self, args: &[&str]) -> Monitor {
        let mut child = Command::new(crate::sibling_bin("lbctl"))
            .arg("monitor")
            .args(args)
            .args(["-o", "json", "--pin-dir"])
            .arg(&self.pin_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running lbctl monitor");
        // It prints "Listening ..." on stderr once the ring buffer is open.
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        assert!(line.starts_with("Listening"), "lbctl monitor: {line}");
        Monitor { child }
    }

    pub fn lbctl(&self, args: &[&str]) -> String {
        let out = Command::new(crate::sibling_bin("lbctl"))
            .args(args)
            .arg("--pin-dir")
            .arg(&self.pin_dir)
            .output()
            .expect("running lbctl");
        assert!(
            out.status.success(),
            "lbctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn lbctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.lbctl(&all)).expect("lbctl json")
    }

    /// Packets counted for a drop reason (egress), from `lbctl drops`.
    pub fn drops(&self, reason: &str) -> u64 {
        self.lbctl_json(&["drops", "--all"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["reason"] == reason)
            .map(|c| c["packets"].as_u64().unwrap())
            .sum()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        // Keep the log of a failing test for inspection; drop it otherwise.
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// A running `lbctl monitor`; killed on drop.
pub struct Monitor {
    child: Child,
}

impl Monitor {
    /// Waits for the monitor to exit (it was given --count) and returns its
    /// events, failing after `timeout`.
    pub fn events(mut self, timeout: Duration) -> Vec<serde_json::Value> {
        let ok = crate::wait_until(timeout, || matches!(self.child.try_wait(), Ok(Some(_))));
        if !ok {
            let _ = self.child.kill();
        }
        let mut out = String::new();
        std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut out).unwrap();
        assert!(
            ok,
            "lbctl monitor did not see its events in time; got:\n{out}"
        );
        out.lines()
            .map(|l| serde_json::from_str(l).expect("monitor json"))
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP reply: status code, headers (names lowercased), body.
#[derive(Debug)]
pub struct HttpReply {
    pub code: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == &name.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }
}

/// GET over HTTP/1.1 (the agent's servers; they answer with Content-Length).
pub fn http_request(addr: std::net::SocketAddr, path: &str) -> HttpReply {
    try_http_request(addr, path).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"))
}

/// `http_request`, with a failed connect as an error.
pub fn try_http_request(addr: std::net::SocketAddr, path: &str) -> std::io::Result<HttpReply> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    // The servers answer with Content-Length, not chunked: the body is as is.
    Ok(HttpReply {
        code,
        headers,
        body: body.to_string(),
    })
}

/// Asserts that an agent's log reports no network namespace it could not
/// reach when destroying UDP sockets, beyond those root itself cannot open
/// on this machine (the sandbox's PID 1: docs/testbed.md). An agent short
/// of CAP_SYS_ADMIN or CAP_SYS_PTRACE is refused many more.
pub fn assert_no_namespace_refused(log: &str) {
    let refused_to_root = lb::sockets::namespaces().refused;
    for line in log
        .lines()
        .filter(|l| l.contains("connected UDP sockets to removed backends: "))
    {
        let counted = line.split("removed backends: ").nth(1).and_then(|rest| {
            rest.split_once(" processes' network namespaces could not be opened")
                .and_then(|(n, _)| n.trim().parse::<usize>().ok())
        });
        match counted {
            Some(n) if n <= refused_to_root => {}
            _ => panic!(
                "the agent was refused a network namespace (root is refused {refused_to_root} \
                 here):\n{line}\n{log}"
            ),
        }
    }
}
