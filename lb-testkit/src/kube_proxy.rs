//! The real kube-proxy on a node of the test bed, where the agent would
//! run: `cmd/kube-proxy` of the same k8s.io/kubernetes module and version
//! as the control plane (`cargo xtask testbed` builds it), run as kubeadm
//! configures it: its own ServiceAccount bound to `system:node-proxier`,
//! the node's name and the cluster's pod CIDR, one process per node in the
//! node's namespaces. Its rules live in the node's network namespace only.
//! The control runs of the conformance suite and the side-by-side
//! benchmarks use it.
use std::{path::PathBuf, time::Duration};

use crate::{k8s::ControlPlane, node::Node};

/// kube-proxy's `--proxy-mode`, and for iptables mode which iptables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// iptables mode with the machine's `iptables`: Debian 12's default is
    /// iptables-nft (the nf_tables kernel API behind iptables' syntax).
    Iptables,
    /// iptables mode with iptables-legacy (the x_tables kernel API), as the
    /// upstream kube-proxy image's iptables-wrapper picks on a host whose
    /// kubelet wrote legacy rules. Not a `--proxy-mode` of its own: the
    /// same proxier with other binaries first in its PATH (`legacy_path`).
    IptablesLegacy,
    Nftables,
    /// Needs the kernel's IPVS (CONFIG_IP_VS); this machine's kernel has
    /// none (docs/testbed.md), so kube-proxy refuses to start in it here.
    Ipvs,
}

impl Mode {
    /// kube-proxy's own modes (`--proxy-mode`), what the conformance
    /// control runs take.
    pub const ALL: [Mode; 3] = [Mode::Iptables, Mode::Nftables, Mode::Ipvs];

    /// How reports and logs name it: the `--proxy-mode` value, but
    /// "iptables-legacy" for that backend.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
        }
    }

    /// The value of `--proxy-mode`.
    pub fn proxy_mode(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "iptables",
            m => m.name(),
        }
    }

    /// Whether its rules are iptables rules (either backend).
    pub fn is_iptables(self) -> bool {
        matches!(self, Mode::Iptables | Mode::IptablesLegacy)
    }

    /// The `iptables` it runs (and the bench's rule readers must run to see
    /// its rules: the two backends keep separate tables).
    pub fn iptables(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "iptables-legacy",
            _ => "iptables",
        }
    }

    /// Sets up `cmd` to run with this mode's binaries: for IptablesLegacy a
    /// PATH whose `iptables*` and `ip6tables*` are iptables-legacy's, as
    /// kube-proxy runs them by name (k8s.io/kubernetes pkg/util/iptables).
    pub fn configure(self, cmd: &mut std::process::Command) {
        if self == Mode::IptablesLegacy {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut dirs = vec![legacy_path()];
            dirs.extend(std::env::split_paths(&path));
            cmd.env("PATH", std::env::join_paths(dirs).unwrap());
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// A directory of `iptables`, `iptables-save`, `iptables-restore` and their
/// ip6tables siblings, each a link to xtables-legacy-multi (which acts by
/// the name it was called with), made once per process.
fn legacy_path() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let multi = [
            "/usr/sbin/xtables-legacy-multi",
            "/sbin/xtables-legacy-multi",
        ]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("xtables-legacy-multi is missing: Debian's iptables package has it");
        let dir = std::env::temp_dir().join(format!("lb-iptables-legacy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for family in ["iptables", "ip6tables"] {
            for suffix in ["", "-save", "-restore"] {
                let link = dir.join(format!("{family}{suffix}"));
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(&multi, &link).unwrap();
            }
        }
        dir
    })
    .clone()
}

/// Where `cargo xtask testbed` builds kube-proxy.
pub fn bin() -> PathBuf {
    let p = crate::sibling_bin_dir().join("../testbed/kube-proxy");
    assert!(
        p.exists(),
        "{} is not built: `cargo xtask testbed` builds it (cmd/kube-proxy of testbed/go.mod's k8s.io/kubernetes)",
        p.display()
    );
    p
}

/// kubeadm's identity for kube-proxy: ServiceAccount kube-system/kube-proxy
/// bound to the apiserver's bootstrap role `system:node-proxier` (read
/// Services, EndpointSlices and Nodes; write Events).
const IDENTITY: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-proxy, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubeadm:node-proxier"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node-proxier"}
subjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]
"#;

/// kube-proxy's flags for `mode` on node `node_name`, credentials in
/// `kubeconfig`: what kubeadm's configuration sets, and what this shared
/// machine needs.
pub fn args(kubeconfig: &std::path::Path, mode: Mode, node_name: &str) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--proxy-mode={}", mode.proxy_mode()),
        format!("--hostname-override={node_name}"),
        format!("--cluster-cidr={}", crate::node::CLUSTER_CIDR),
        // nf_conntrack_max is the machine's (writable only from the
        // initial network namespace): leave it alone. The conntrack
        // timeouts kube-proxy sets are the namespace's own.
        "--conntrack-max-per-core=0".to_string(),
        // Its defaults, said here because `metrics` reads them.
        format!("--metrics-bind-address={METRICS}"),
        "--healthz-bind-address=0.0.0.0:10256".to_string(),
        "--v=2".to_string(),
    ]
}

/// Where kube-proxy serves /metrics, in its network namespace.
pub const METRICS: &str = "127.0.0.1:10249";

/// A token kubeconfig for kubeadm's kube-proxy identity (`IDENTITY`),
/// naming the apiserver as the control plane's namespace reaches it
/// (`https://127.0.0.1:<port>`).
pub fn kubeconfig(cp: &ControlPlane) -> std::path::PathBuf {
    cp.apply(IDENTITY);
    cp.service_account_kubeconfig("kube-system", "kube-proxy")
}

/// Whether kube-proxy has programmed its first full sync, from its log (the
/// families it runs: "running in dual-stack mode" or "single-stack mode"
/// with the family) and its /metrics: every family it runs has a
/// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`, which a proxier
/// sets only after a sync that succeeded, and it syncs only once its
/// Service and EndpointSlice informers have synced. (/healthz is no such
/// signal: it answers 200 while kube-proxy is starting up,
/// pkg/proxy/healthcheck/proxy_health.go.)
pub fn synced(log: &str, metrics: &str) -> bool {
    let families: &[&str] = if log.contains("running in dual-stack mode") {
        &["IPv4", "IPv6"]
    } else if let Some(line) = log
        .lines()
        .find(|l| l.contains("running in single-stack mode"))
    {
        if line.contains("IPv6") {
            &["IPv6"]
        } else {
            &["IPv4"]
        }
    } else {
        return false;
    };
    families.iter().all(|f| {
        let key =
            format!("kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"{f}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .is_some_and(|v| v > 0.0)
    })
}

/// Starts kube-proxy in `mode` on each of `nodes` and waits until every one
/// has programmed its first full sync (`synced`). Panics with its log when
/// one exits or never syncs.
pub fn start_on(cp: &ControlPlane, nodes: &mut [Node], mode: Mode) {
    // A node's process gets the node's environment (`Node::run`), not
    // `Mode::configure`'s PATH.
    assert!(
        mode != Mode::IptablesLegacy,
        "kube-proxy on a node runs the machine's iptables; iptables-legacy is for `KubeProxy::start_in`"
    );
    let token_kubeconfig = kubeconfig(cp);
    let text = std::fs::read_to_string(&token_kubeconfig).unwrap();
    let bin = bin().display().to_string();
    for node in nodes.iter_mut() {
        route_services_to_a_sink(node);
        // The token's kubeconfig names the apiserver as the control plane's
        // namespace reaches it; the node reaches it as its kubelet does.
        let local = format!("https://127.0.0.1:{}", cp.api_port);
        assert!(text.contains(&local), "{text}");
        let kubeconfig = node.dir.join("kube-proxy.kubeconfig");
        std::fs::write(&kubeconfig, text.replace(&local, &node.api_server)).unwrap();
        let args = args(&kubeconfig, mode, &node.name);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        node.run("kube-proxy", &bin, &args);
    }
    for node in nodes.iter_mut() {
        let what = format!("kube-proxy ({}) to program its first sync", mode.name());
        let log = node.dir.join("kube-proxy.log");
        node.wait(cp, &what, Duration::from_secs(120), |n| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            synced(&log, &metrics(&n.netns_name))
        });
    }
}

/// The node's route for the service CIDRs made one kube-proxy can work
/// with. The bed blackholes them on every node (`fabric`: an untranslated
/// service address must go nowhere), which the agent never meets: it
/// translates in connect() and in tc before any route lookup. kube-proxy
/// translates in netfilter after one: a blackhole fails a host process's
/// connect() with EINVAL before nat OUTPUT's DNAT, and drops a pod's packet
/// before FORWARD, where kube-proxy's REJECT for a Service without
/// endpoints sits. A real node routes them somewhere (its default route);
/// here they go to a device that drops what it sends, as kube-proxy's ipvs
/// mode routes them to its dummy kube-ipvs0: the lookup succeeds, and what
/// stays untranslated goes nowhere all the same. This kernel has no dummy
/// driver (docs/testbed.md); an ifb device drops every packet that tc did
/// not redirect to it (drivers/net/ifb.c, ifb_xmit), which is that.
fn route_services_to_a_sink(node: &Node) {
    let ns = node.netns_name.as_str();
    crate::run("ip", &["-n", ns, "link", "add", "kube-svc0", "type", "ifb"]);
    crate::run("ip", &["-n", ns, "link", "set", "kube-svc0", "up"]);
    for cidr in crate::k8s::SERVICE_CIDRS.split(',') {
        let mut args = vec!["-n", ns, "route", "replace", cidr, "dev", "kube-svc0"];
        if !cidr.contains(':') {
            args.extend(["src", node.ip.as_str()]);
        }
        crate::run("ip", &args);
    }
}

/// kube-proxy started in a network namespace of the caller's (the
/// benchmarks' control plane), not on a node: killed on drop.
pub struct KubeProxy {
    child: std::process::Child,
    netns: String,
    pub mode: Mode,
    pub log: PathBuf,
}

impl KubeProxy {
    /// Starts kube-proxy in `mode` in `netns` as node `node_name`, output
    /// to `log`. `kubeconfig` must name the apiserver as `netns` reaches it.
    pub fn start_in(
        netns: &str,
        kubeconfig: &std::path::Path,
        mode: Mode,
        node_name: &str,
        log: PathBuf,
    ) -> Self {
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = std::process::Command::new(bin());
        mode.configure(&mut cmd);
        // A group of its own, so that stopping it stops the iptables-restore
        // or nft it may be waiting for too: those outlive a killed parent
        // (they get no PDEATHSIG), and one still restoring 10 000 Services
        // would take a core from whatever the bench measures next.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.args(args(kubeconfig, mode, node_name))
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        crate::netns::exec_in(&mut cmd, netns).unwrap();
        Self {
            child: crate::k8s::spawn(cmd),
            netns: netns.to_string(),
            mode,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its first full sync is programmed (`synced`); panics with its log
    /// when it exited.
    pub fn synced(&mut self) -> bool {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "kube-proxy ({}) exited with {status}:\n{}",
                self.mode.name(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        synced(&log, &metrics(&self.netns))
    }

    /// Waits up to `timeout` for its first full sync (`synced`), looking
    /// `every` so often: at 10 000 Services each look reads a long log and
    /// forks a curl, which a tight loop would take from kube-proxy's own CPU
    /// on a small machine. Not syncing in time is a result, not a failure
    /// (iptables-nft at 10 000 Services, docs/testbed.md): Err then carries
    /// the log's last lines for the caller to show.
    pub fn wait_synced(&mut self, timeout: Duration, every: Duration) -> Result<(), String> {
        let deadline = std::time::Instant::now() + timeout;
        while !self.synced() {
            if std::time::Instant::now() >= deadline {
                return Err(format!(
                    "kube-proxy ({}) did not program its first sync within {timeout:?}:\n{}",
                    self.mode.name(),
                    crate::k8s::log_tail("kube-proxy", &self.log, 30)
                ));
            }
            std::thread::sleep(every);
        }
        Ok(())
    }

    /// Stops it and removes its rules as an operator switching modes would
    /// (`kube-proxy --cleanup`, which exits when done).
    pub fn stop_and_clean_up(mut self) {
        self.kill();
        let mut cmd = std::process::Command::new(bin());
        self.mode.configure(&mut cmd);
        cmd.args([
            "--cleanup",
            &format!("--proxy-mode={}", self.mode.proxy_mode()),
        ]);
        crate::netns::exec_in(&mut cmd, &self.netns).unwrap();
        let out = cmd.output().expect("kube-proxy --cleanup");
        assert!(
            out.status.success(),
            "kube-proxy --cleanup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl KubeProxy {
    /// SIGKILL to its process group (it and the rule loaders it runs),
    /// then reaps it.
    fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) with a negative pid signals that process
            // group; the group is the child's own (`process_group(0)`) and
            // lives while the child is unreaped.
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        self.kill();
    }
}

/// kube-proxy's /metrics in network namespace `netns` ("" when it does not
/// answer).
pub fn metrics(netns: &str) -> String {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-s", "-m", "2", &format!("http://{METRICS}/metrics")]);
    crate::netns::exec_in(&mut cmd, netns).unwrap();
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::synced;

    const DUAL: &str =
        r#"I1205 server.go:264] "kube-proxy running in dual-stack mode" primary ipFamily="IPv4""#;
    const SINGLE6: &str =
        r#"I1205 server.go:266] "kube-proxy running in single-stack mode" ipFamily="IPv6""#;
    const V4: &str =
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7649e+09\n";
    const V6: &str =
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1.7649e+09\n";

    #[test]
    fn kube_proxy_counts_as_synced_only_when_every_family_it_runs_has_synced() {
        assert!(!synced("", &format!("{V4}{V6}")), "no mode logged yet");
        assert!(!synced(DUAL, ""), "no metrics yet");
        assert!(!synced(DUAL, V4), "the IPv6 proxier has not synced");
        assert!(synced(DUAL, &format!("{V4}{V6}")));
        assert!(!synced(
            DUAL,
            &format!(
                "{V4}kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"IPv6\"}} 0\n"
            )
        ));
        assert!(!synced(SINGLE6, V4));
        assert!(synced(SINGLE6, V6));
    }
}
