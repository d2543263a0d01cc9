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

/// kube-proxy's `--proxy-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
    /// Needs the kernel's IPVS (CONFIG_IP_VS); this machine's kernel has
    /// none (docs/testbed.md), so kube-proxy refuses to start in it here.
    Ipvs,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Iptables, Mode::Nftables, Mode::Ipvs];

    /// The value of `--proxy-mode`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }
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

/// Starts kube-proxy in `mode` on each of `nodes` and waits until every one
/// has programmed its first sync (its /healthz answers 200, which it does
/// only after a sync). Panics with its log when one exits or never syncs.
pub fn start_on(cp: &ControlPlane, nodes: &mut [Node], mode: Mode) {
    cp.apply(IDENTITY);
    let token_kubeconfig = cp.service_account_kubeconfig("kube-system", "kube-proxy");
    let text = std::fs::read_to_string(&token_kubeconfig).unwrap();
    let bin = bin().display().to_string();
    for node in nodes.iter_mut() {
        // The token's kubeconfig names the apiserver as the control plane's
        // namespace reaches it; the node reaches it as its kubelet does.
        let local = format!("https://127.0.0.1:{}", cp.api_port);
        assert!(text.contains(&local), "{text}");
        let kubeconfig = node.dir.join("kube-proxy.kubeconfig");
        std::fs::write(&kubeconfig, text.replace(&local, &node.api_server)).unwrap();
        let args = [
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--proxy-mode={}", mode.name()),
            format!("--hostname-override={}", node.name),
            format!("--cluster-cidr={}", crate::node::CLUSTER_CIDR),
            // nf_conntrack_max is the machine's (writable only from the
            // initial network namespace): leave it alone. The conntrack
            // timeouts kube-proxy sets are the node namespace's own.
            "--conntrack-max-per-core=0".to_string(),
            "--v=2".to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        node.run("kube-proxy", &bin, &args);
    }
    for node in nodes.iter_mut() {
        let url = format!("http://{}:10256/healthz", node.ip);
        let what = format!(
            "kube-proxy ({}) to report its first sync at {url}",
            mode.name()
        );
        node.wait(cp, &what, Duration::from_secs(120), |n| {
            healthz(n, &url) == "200"
        });
    }
}

/// The status code kube-proxy's health endpoint answers in the node's
/// network namespace ("" when it does not answer).
fn healthz(node: &Node, url: &str) -> String {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-m",
        "2",
        "-w",
        "%{http_code}",
        url,
    ]);
    node.exec_in(&mut cmd);
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
