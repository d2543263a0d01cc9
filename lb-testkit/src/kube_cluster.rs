//! A Kubernetes cluster of the test bed without kube-proxy: the control
//! plane (`k8s`), one node in its namespace or several nodes on a fabric
//! (`node`, `fabric`), the agent installed as docs/install.md says (its
//! DaemonSet on every node), CoreDNS as kube-dns. For a control run the
//! real kube-proxy serves the Services instead (`Proxy`, `kube_proxy`).
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    fabric::{self, Fabric},
    images::Images,
    k8s::{self, ControlPlane},
    kube_proxy,
    netns::Netns,
    node::{Node, Place, CLUSTER_DNS, COREDNS_IMAGE},
};

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

/// What serves the cluster's Services.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proxy {
    /// lb-agent, its DaemonSet installed with Helm (no kube-proxy).
    Agent,
    /// The real kube-proxy in this mode, a process per node (`kube_proxy`),
    /// and no agent: the control runs.
    KubeProxy(kube_proxy::Mode),
}

impl Proxy {
    /// `agent`, or `kube-proxy-<mode>` (lb-conformance's `--proxy`).
    pub fn name(self) -> String {
        match self {
            Proxy::Agent => "agent".into(),
            Proxy::KubeProxy(m) => format!("kube-proxy-{}", m.name()),
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        if s == "agent" {
            return Some(Proxy::Agent);
        }
        s.strip_prefix("kube-proxy-")
            .and_then(kube_proxy::Mode::parse)
            .map(Proxy::KubeProxy)
    }
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

/// The agent's pin directory on `node` (on the host's bpffs).
fn pins_of(node: &Node) -> AgentPins {
    AgentPins(PathBuf::from(format!("/sys/fs/bpf/{}", node.cgroup_root)))
}

/// Installs the agent on a one-node cluster as docs/install.md says,
/// filling in only what the guide asks the user to set (the apiserver's
/// address) and what keeps a test off the machine's own cgroup root and pins
/// (LB_CGROUP, LB_PIN_DIR) and devices. Waits for the DaemonSet's rollout;
/// panics with the pods' state and logs.
pub fn install_agent(cp: &ControlPlane, node: &Node, how: Install) -> AgentPins {
    let pins = pins_of(node);
    match how {
        Install::Kustomize => apply_overlay(cp, node, &pins),
        Install::Helm => helm_install(cp, node, &pins),
    }
    wait_for_agent(cp, std::slice::from_ref(node));
    pins
}

/// `helm install` of deploy/helm/lb-agent on a cluster of several nodes,
/// one agent per node. The nodes share one kernel, so each agent attaches
/// to its own node's pod cgroup and pins under its own directory: both are
/// named after the Node (`Node::start` with the node's name as its tag),
/// given as `extraEnv` values that Kubernetes expands from the pod's
/// NODE_NAME (`$(NODE_NAME)`, dependent environment variables). Devices
/// are detected as on a real node: the one holding the Node's InternalIP,
/// the fabric.
pub fn install_agent_on_nodes(cp: &ControlPlane, nodes: &[Node]) -> Vec<AgentPins> {
    for n in nodes {
        assert_eq!(
            n.cgroup_root,
            format!("lbtest-node-{}", n.name),
            "each node's cgroup root must be named after it"
        );
    }
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/lb-agent");
    let chart = chart.display().to_string();
    let sets = [
        format!("k8sServiceHost={}", k8s::ADVERTISE),
        format!("k8sServicePort={}", cp.api_port),
        "extraEnv[0].name=LB_CGROUP".to_string(),
        "extraEnv[0].value=/sys/fs/cgroup/unified/lbtest-node-$(NODE_NAME)".to_string(),
        "extraEnv[1].name=LB_PIN_DIR".to_string(),
        "extraEnv[1].value=/sys/fs/bpf/lbtest-node-$(NODE_NAME)".to_string(),
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
    // The env list must come after NODE_NAME for $(NODE_NAME) to expand.
    let node_name = rendered.find("- name: NODE_NAME");
    let cgroup = rendered.find("value: /sys/fs/cgroup/unified/lbtest-node-$(NODE_NAME)");
    assert!(
        node_name.is_some() && cgroup.is_some() && node_name < cgroup,
        "the chart does not set LB_CGROUP after NODE_NAME:\n{rendered}"
    );
    let mut install = vec!["install"];
    install.extend(&args);
    let out = cp
        .helm(&install)
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    assert!(out.contains("STATUS: deployed"), "{out}");
    wait_for_agent(cp, nodes);
    nodes.iter().map(pins_of).collect()
}

/// `helm install lb-agent deploy/helm/lb-agent` with the test's settings
/// as `--set` values, checked in the rendered objects before the
/// agent is installed.
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
    // The agent sees the host's /sys/fs/cgroup: make sure the
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
pub fn wait_for_agent(cp: &ControlPlane, nodes: &[Node]) {
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
        nodes.iter().map(|n| n.logs_of(cp)).collect::<String>()
    );
}

/// A cluster without kube-proxy: control plane with the scheduler and every
/// controller, one node sharing its namespace (`start`) or several on a
/// fabric with an outside client (`start_nodes`), the agent as its
/// DaemonSet's pod on every node, CoreDNS as kube-dns and rolled out.
/// Fields drop in order: the nodes (and the agents' pins) before the
/// control plane, the fabric last.
pub struct Cluster {
    /// What names are made of (node names: `<tag>-n<i>`).
    pub tag: String,
    pub nodes: Vec<Node>,
    pub pins: Vec<AgentPins>,
    /// A client outside the cluster, on the fabric (`start_nodes`), with
    /// `fabric::LB_RANGE` routed via the first node.
    pub client: Option<Netns>,
    pub images: Images,
    pub cp: ControlPlane,
    pub fabric: Option<Fabric>,
}

impl Cluster {
    /// One node named `node_name` (its kubelet certificate's too), the agent
    /// installed with `kubectl apply -k`.
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
        let images = Images::build(tag);
        let node = Node::start(&cp, node_name, tag, &images, Place::ControlPlane);
        let pins = install_agent(&cp, &node, how);
        let cluster = Self {
            tag: tag.to_string(),
            nodes: vec![node],
            pins: vec![pins],
            client: None,
            images,
            cp,
            fabric: None,
        };
        cluster.start_dns();
        cluster
    }

    /// `count` nodes, each in a network namespace of its own on the fabric
    /// (`fabric`), named `<tag>-n1` ... (lower case), pod routes between
    /// them; the agent installed with `helm install` on every node; an
    /// outside client on the fabric.
    pub fn start_nodes(tag: &str, count: usize) -> Self {
        Self::start_nodes_with(tag, count, Proxy::Agent)
    }

    /// Like `start_nodes`, with `proxy` serving the Services: the agent,
    /// or the real kube-proxy for a control run.
    pub fn start_nodes_with(tag: &str, count: usize, proxy: Proxy) -> Self {
        assert!(count >= 1);
        let tag = tag.to_ascii_lowercase();
        let names: Vec<String> = (1..=count).map(|i| format!("{tag}-n{i}")).collect();
        let fabric = Fabric::new(&tag);
        let cp = ControlPlane::start_with(
            &tag,
            &k8s::Options {
                nodes: names.clone(),
                workloads: true,
            },
        );
        fabric.plug(&cp.netns, "cp", fabric::CONTROL_PLANE);
        let images = Images::build(&tag);
        let mut cluster = Self {
            tag: tag.clone(),
            nodes: Vec::new(),
            pins: Vec::new(),
            client: None,
            images,
            cp,
            fabric: Some(fabric),
        };
        for i in 0..count {
            cluster.add_node(i);
        }
        let client = Netns::create(&format!("lbt-{tag}-client"));
        cluster
            .fabric
            .as_ref()
            .unwrap()
            .plug_client(&client, fabric::node_ip(0));
        cluster.client = Some(client);
        match proxy {
            Proxy::Agent => cluster.pins = install_agent_on_nodes(&cluster.cp, &cluster.nodes),
            Proxy::KubeProxy(mode) => kube_proxy::start_on(&cluster.cp, &mut cluster.nodes, mode),
        }
        cluster.start_dns();
        cluster
    }

    /// Starts node `index` of the fabric (its name and certificate made by
    /// `start_nodes`) and routes pods between it and every other node and
    /// the control plane.
    pub fn add_node(&mut self, index: usize) {
        let fabric = self.fabric.as_ref().expect("a cluster on a fabric");
        let name = format!("{}-n{}", self.tag, index + 1);
        let node = Node::start(
            &self.cp,
            &name,
            &name,
            &self.images,
            Place::Fabric(fabric, index),
        );
        let ip: Ipv4Addr = node.ip.parse().unwrap();
        fabric::route_pods(&self.cp.netns.name, &node.pod_cidr, ip);
        for other in &self.nodes {
            let other_ip: Ipv4Addr = other.ip.parse().unwrap();
            fabric::route_pods(&node.netns_name, &other.pod_cidr, other_ip);
            fabric::route_pods(&other.netns_name, &node.pod_cidr, ip);
        }
        self.nodes.push(node);
    }

    /// Takes node `name` out of the cluster as an operator retiring a
    /// machine would, after draining it: deletes the Node, stops its
    /// kubelet, containerd and pods, removes its namespace, its agent's pins
    /// and the routes to its pods. Returns its index on the fabric (for
    /// `add_node`).
    pub fn remove_node(&mut self, name: &str) -> usize {
        let i = self
            .nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"));
        self.cp.kubectl(&["delete", "node", name, "--wait=true"]);
        let node = self.nodes.remove(i);
        let pins = self.pins.remove(i);
        let index = fabric::index_of(node.ip.parse().unwrap());
        for other in self.nodes.iter().map(|n| n.netns_name.as_str()).chain([self
            .cp
            .netns
            .name
            .as_str()])
        {
            let _ = std::process::Command::new("ip")
                .args(["-n", other, "route", "del", &node.pod_cidr])
                .output();
        }
        drop(node);
        drop(pins);
        index
    }

    /// Starts node `index` again after `remove_node` and waits until the
    /// agent's DaemonSet runs on it.
    pub fn add_node_back(&mut self, index: usize) {
        self.add_node(index);
        let node = self.nodes.last().unwrap();
        self.pins.push(pins_of(node));
        let ok = crate::wait_until(Duration::from_secs(120), || {
            let pod = self.agent_pod(node);
            !pod.is_empty()
                && self
                    .cp
                    .kubectl_try(&[
                        "-n",
                        "kube-system",
                        "get",
                        "pod",
                        &pod,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ])
                    .is_some_and(|s| s.trim() == "True")
        });
        assert!(
            ok,
            "no ready agent on the node added back:\n{}",
            self.logs()
        );
    }

    /// The outside client (`start_nodes`).
    pub fn client(&self) -> &Netns {
        self.client
            .as_ref()
            .expect("a cluster on a fabric has a client")
    }

    /// The node named `name`.
    pub fn node_named(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// The name of the agent's pod on `node` ("" while there is none).
    pub fn agent_pod(&self, node: &Node) -> String {
        self.cp
            .kubectl_try(&[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=lb-agent",
                "--field-selector",
                &format!("spec.nodeName={}", node.name),
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ])
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// `lbctl ARGS` in the agent's container on `node`, as an operator runs
    /// it; "" when it fails.
    pub fn lbctl(&self, node: &Node, args: &[&str]) -> String {
        let pod = self.agent_pod(node);
        let mut full = vec![
            "-n",
            "kube-system",
            "exec",
            &pod,
            "-c",
            "agent",
            "--",
            "lbctl",
        ];
        full.extend_from_slice(args);
        self.cp.kubectl_try(&full).unwrap_or_default()
    }

    /// `helm upgrade` of the agent keeping every value `start_nodes` set and
    /// changing `sets`; waits until the agent rolled over every node.
    pub fn helm_upgrade(&self, sets: &[&str]) {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/lb-agent");
        let chart = chart.display().to_string();
        let mut args = vec![
            "upgrade",
            "lb-agent",
            chart.as_str(),
            "--namespace",
            "kube-system",
            "--reuse-values",
        ];
        for s in sets {
            args.extend(["--set", s]);
        }
        let out = self
            .cp
            .helm(&args)
            .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
        assert!(out.contains("STATUS: deployed"), "{out}");
        wait_for_agent(&self.cp, &self.nodes);
    }

    /// The first node (the only one of `start`).
    pub fn node(&self) -> &Node {
        &self.nodes[0]
    }

    /// The first node's agent pins.
    pub fn pins(&self) -> &AgentPins {
        &self.pins[0]
    }

    /// The tail of every node's and the control plane's logs.
    pub fn logs(&self) -> String {
        let mut out = self.cp.logs();
        for n in &self.nodes {
            out.push_str(&n.own_logs());
        }
        out
    }

    fn start_dns(&self) {
        self.cp.apply(&kube_dns());
        self.cp.kubectl(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deploy/coredns",
            "--timeout=180s",
        ]);
    }
}
