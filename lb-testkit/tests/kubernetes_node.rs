//! A real node without kube-proxy: the test bed's control plane (with the
//! scheduler and every default controller), containerd, runc, the CNI
//! bridge plugin and the kubelet; the agent installed as docs/install.md
//! says (`kubectl apply -k` over deploy/kubernetes, its image imported into
//! containerd) and running as the DaemonSet's pod. Pods reach Services only
//! through it: the node's namespace has a blackhole route for the service
//! ranges, so a connect nobody translates fails.
//!
//! One node, in the control plane's network namespace (see `lb_testkit::node`).
use std::{
    io::{BufRead as _, Read as _},
    process::Command,
    time::Duration,
};

use lb_testkit::{
    k8s::{ControlPlane, ADVERTISE},
    kube_cluster::{Cluster, Install},
    node::{BUSYBOX_IMAGE, POD_SERVER_IMAGE},
    unique,
};

/// The LoadBalancer address the test writes into the Service's status: in a
/// range of the test's own, with no route anywhere.
const LB_IP: &str = "10.255.1.1";

/// A UDP Service with one backend pod (nothing needs to answer: the
/// client's connect() is what socket LB translates), and its client: a
/// connected socket held open (lb-pod-server --hold-udp).
const UDP_BACKEND: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: udp-back, namespace: default, labels: {app: udp-back}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
    - {name: sleep, image: BUSYBOX, command: [sleep, "100000"]}
---
apiVersion: v1
kind: Service
metadata: {name: udp, namespace: default}
spec:
  selector: {app: udp-back}
  ports: [{port: 9053, targetPort: 9053, protocol: UDP}]
"#;
const UDP_CLIENT: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: udp-client, namespace: default}
spec:
  restartPolicy: Never
  containers:
    - {name: client, image: POD_SERVER, args: [--hold-udp, TARGET]}
"#;

/// `kubectl exec client -- sh -c SCRIPT`.
fn in_client(cp: &ControlPlane, script: &str) -> String {
    cp.kubectl(&["exec", "client", "--", "sh", "-c", script])
}

/// One HTTP/1.0 GET of `/` from HOST PORT in the client pod: the body's
/// last line, or FAILED. (nc, not wget: Debian's static busybox wget
/// crashes in its resolver, even on numeric addresses.)
fn get(host: &str, port: &str) -> String {
    format!(
        "out=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} {port} | tail -n 1); \
         if [ -n \"$out\" ]; then echo \"$out\"; else echo FAILED; fi"
    )
}

/// Fetches from HOST PORT `n` times in the client pod: the answers (each
/// backend answers its pod name) and the number of failed fetches.
fn fetch_many(cp: &ControlPlane, host: &str, port: &str, n: usize) -> (Vec<String>, usize) {
    let out = in_client(
        cp,
        &format!(
            "i=0; while [ $i -lt {n} ]; do {}; i=$((i+1)); done",
            get(host, port)
        ),
    );
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    let failed = lines.iter().filter(|l| *l == "FAILED").count();
    (lines, failed)
}

#[test]
fn pods_reach_clusterip_nodeport_and_loadbalancer_services_through_the_agent_installed_from_deploy_and_a_rolling_update_loses_nothing(
) {
    // The agent installed from deploy/kubernetes, CoreDNS rolled out.
    let cluster = Cluster::start(&unique("node"), "lbtest-node");
    let (cp, node, pins) = (&cluster.cp, cluster.node(), cluster.pins());
    // The DaemonSet's pod attached to the node's pods' cgroup and pinned there.
    assert!(
        lb::datapath::pins::has_state(&pins.0),
        "nothing pinned in {}",
        pins.0.display()
    );
    let attached = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(node.unified_cgroup())
        .output()
        .unwrap();
    let attached = String::from_utf8_lossy(&attached.stdout);
    assert!(
        attached.contains("connect4"),
        "no connect4 hook on the node's cgroup:\n{attached}"
    );

    cp.apply(&lb_testkit::k8s::web_backends(3, "LoadBalancer"));
    cp.kubectl(&["rollout", "status", "deploy/web", "--timeout=180s"]);
    cp.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=120s",
    ]);
    let cluster_ip = cp.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let node_port = cp.kubectl(&[
        "get",
        "svc",
        "web",
        "-o",
        "jsonpath={.spec.ports[0].nodePort}",
    ]);
    let pods = cp.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    let pods: Vec<&str> = pods.split_whitespace().collect();
    assert_eq!(pods.len(), 3);
    // No cloud here: the test is the load balancer controller and writes
    // the Service's status (an address of the test's own range).
    cp.kubectl(&[
        "patch",
        "svc",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"loadBalancer":{{"ingress":[{{"ip":"{LB_IP}"}}]}}}}}}"#),
    ]);

    // The agent has all three in its maps: lbctl in the agent's container
    // (it finds the pins from the ConfigMap's LB_PIN_DIR, as an operator
    // would run it).
    let frontend = format!("{cluster_ip}:80/TCP");
    let lbctl = |args: &[&str]| lbctl_in_agent(cp, args);
    // Waits until `frontend` has the three backends active in the maps.
    let all_backends_in_maps = |frontend: &str| {
        assert!(
            lb_testkit::wait_until(Duration::from_secs(60), || {
                lbctl(&["service", "get", frontend])
                    .matches("(active)")
                    .count()
                    == 3
            }),
            "{frontend}:\n{}",
            lbctl(&["service", "list"])
        );
    };
    all_backends_in_maps(&frontend);
    let lb_frontend = format!("{LB_IP}:80/TCP");
    all_backends_in_maps(&lb_frontend);

    // Nothing but the agent translates: a service-range address that is no
    // Service's goes to the node's blackhole route and fails.
    let (answers, failed) = fetch_many(cp, "10.96.255.254", "80", 1);
    assert_eq!(failed, 1, "an address no Service has answered: {answers:?}");

    // ClusterIP, NodePort (the node's InternalIP) and the LoadBalancer
    // address, each answered by every backend and never failing.
    for (host, port) in [
        (cluster_ip.as_str(), "80"),
        (ADVERTISE, node_port.as_str()),
        (LB_IP, "80"),
    ] {
        let url = format!("{host}:{port}");
        let (answers, failed) = fetch_many(cp, host, port, 60);
        assert_eq!(failed, 0, "{url}: {answers:?}");
        for p in &pods {
            assert!(
                answers.iter().any(|a| a == p),
                "{url}: backend {p} never answered: {answers:?}"
            );
        }
        assert!(
            answers.iter().all(|a| pods.contains(&a.as_str())),
            "{url}: {answers:?}"
        );
    }
    // Names through CoreDNS, itself a pod that watches the apiserver through
    // the `kubernetes` ClusterIP and answers on the kube-dns ClusterIP (UDP):
    // both translated by the agent.
    let resolved = in_client(cp, "nslookup web.default.svc.cluster.local");
    assert!(
        resolved
            .lines()
            .any(|l| l.trim() == format!("Address: {}", cluster_ip.trim())),
        "nslookup: {resolved}"
    );
    let resolved = in_client(cp, "nslookup kubernetes.default.svc.cluster.local");
    assert!(
        resolved.lines().any(|l| l.trim() == "Address: 10.96.0.1"),
        "nslookup: {resolved}"
    );
    // A short name through the pod's search path, then HTTP to its ClusterIP.
    let (answers, failed) = fetch_many(cp, "web", "80", 20);
    assert_eq!(failed, 0, "web:80: {answers:?}");

    // The apiserver through the `kubernetes` Service (10.96.0.1:443): a TCP
    // connection opens (TLS needs a client; the open is the translation).
    let opened = in_client(
        cp,
        "echo | nc -w 2 10.96.0.1 443 >/dev/null 2>&1; echo rc=$?",
    );
    assert!(opened.contains("rc=0"), "kubernetes ClusterIP: {opened}");

    // A connected UDP socket in the client pod, to a UDP Service's one
    // backend, then the backend goes: the agent (not privileged, with the
    // chart's capability list) reaches into the pod's network namespace
    // through /proc/<pid>/ns/net and destroys the socket.
    cp.apply(&UDP_BACKEND.replace("BUSYBOX", BUSYBOX_IMAGE));
    cp.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/udp-back",
        "--timeout=120s",
    ]);
    let udp_ip = cp.kubectl(&["get", "svc", "udp", "-o", "jsonpath={.spec.clusterIP}"]);
    let udp_ip = udp_ip.trim();
    let udp_frontend = format!("{udp_ip}:9053/UDP");
    assert!(
        lb_testkit::wait_until(Duration::from_secs(60), || {
            lbctl(&["service", "get", &udp_frontend]).contains("(active)")
        }),
        "{udp_frontend}:\n{}",
        lbctl(&["service", "list"])
    );
    cp.apply(
        &UDP_CLIENT
            .replace("POD_SERVER", POD_SERVER_IMAGE)
            .replace("TARGET", &format!("{udp_ip}:9053")),
    );
    // Until the container starts, `kubectl logs` fails: no log yet.
    let client_log = || cp.kubectl_try(&["logs", "udp-client"]).unwrap_or_default();
    assert!(
        lb_testkit::wait_until(Duration::from_secs(120), || client_log()
            .contains("connected to")),
        "the UDP client never connected: {}",
        client_log()
    );
    cp.kubectl(&[
        "delete",
        "pod",
        "udp-back",
        "--grace-period=0",
        "--wait=true",
    ]);
    assert!(
        lb_testkit::wait_until(Duration::from_secs(60), || client_log()
            .contains("aborted: ")),
        "the client's socket to the removed backend was not destroyed: {}\nagent:\n{}",
        client_log(),
        cp.kubectl(&["-n", "kube-system", "logs", "ds/lb-agent", "-c", "agent"])
    );
    let agent_log = cp.kubectl(&["-n", "kube-system", "logs", "ds/lb-agent", "-c", "agent"]);
    lb_testkit::agent::assert_no_namespace_refused(&agent_log);

    // A rolling update of the agent under traffic: the kernel keeps
    // translating while the pod is replaced. The load runs from before the
    // restart until the new pod is ready and serving (a stop file ends it);
    // only a backend's answer counts as a success.
    in_client(cp, "rm -f /stop");
    let mut load = Command::new(lb_testkit::k8s::testbed_bin());
    load.args(["kubectl", "--kubeconfig"])
        .arg(cp.admin_kubeconfig())
        .args(["exec", "client", "--", "sh", "-c"])
        .arg(format!(
            "ok=0; failed=0; echo started; while [ ! -e /stop ]; do \
             r=$({}); case \"$r\" in web-*) ok=$((ok+1));; *) failed=$((failed+1));; esac; done; \
             echo ok=$ok failed=$failed",
            get(&cluster_ip, "80")
        ))
        .stdout(std::process::Stdio::piped());
    lb_testkit::netns::exec_in(&mut load, &cp.netns.name).unwrap();
    let mut load = load.spawn().unwrap();
    let mut out = std::io::BufReader::new(load.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "started", "the load did not start");
    std::thread::sleep(Duration::from_secs(2));
    let agent_pods = || agent_pod_uids(cp);
    let before = agent_pods();
    cp.kubectl(&["-n", "kube-system", "rollout", "restart", "ds/lb-agent"]);
    cp.kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "ds/lb-agent",
        "--timeout=120s",
    ]);
    let after = agent_pods();
    assert!(
        !after
            .split_whitespace()
            .any(|u| before.split_whitespace().any(|b| b == u)),
        "the agent's pod was not replaced: {before} -> {after}"
    );
    // The new pod took over the pinned state and follows the apiserver.
    all_backends_in_maps(&frontend);
    std::thread::sleep(Duration::from_secs(2));
    in_client(cp, "touch /stop");
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    let _ = load.wait();
    let count = |k: &str| -> u64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {text:?}"))
    };
    assert!(
        count("ok=") > 50,
        "too little traffic during the update: {text}"
    );
    assert_eq!(
        count("failed="),
        0,
        "requests failed while the agent was replaced: {text}"
    );
}

/// `lbctl ARGS` in the agent's container, as an operator runs it (it finds
/// the pins from the ConfigMap's LB_PIN_DIR); "" when it fails.
fn lbctl_in_agent(cp: &ControlPlane, args: &[&str]) -> String {
    let mut full = vec![
        "-n",
        "kube-system",
        "exec",
        "ds/lb-agent",
        "-c",
        "agent",
        "--",
        "lbctl",
    ];
    full.extend_from_slice(args);
    cp.kubectl_try(&full).unwrap_or_default()
}

/// The agent's pods' uids.
fn agent_pod_uids(cp: &ControlPlane) -> String {
    cp.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=lb-agent",
        "-o",
        "jsonpath={.items[*].metadata.uid}",
    ])
}

#[test]
fn helm_installed_agent_serves_a_cluster_ip_a_helm_upgrade_rolls_it_to_maglev_and_after_helm_uninstall_the_pinned_data_path_keeps_serving(
) {
    let cluster = Cluster::start_installed(&unique("helm"), "lbtest-node", Install::Helm);
    let cp = &cluster.cp;
    cp.apply(&lb_testkit::k8s::web_backends(3, "LoadBalancer"));
    cp.kubectl(&["rollout", "status", "deploy/web", "--timeout=180s"]);
    cp.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=120s",
    ]);
    let cluster_ip = cp.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let frontend = format!("{cluster_ip}:80/TCP");
    let lbctl = |args: &[&str]| lbctl_in_agent(cp, args);
    assert!(
        lb_testkit::wait_until(Duration::from_secs(60), || {
            lbctl(&["service", "get", &frontend])
                .matches("(active)")
                .count()
                == 3
        }),
        "{frontend}:\n{}",
        lbctl(&["service", "list"])
    );
    let serves_every_backend = |when: &str| {
        let pods = cp.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ]);
        let (answers, failed) = fetch_many(cp, &cluster_ip, "80", 40);
        assert_eq!(failed, 0, "{when}: {answers:?}");
        for p in pods.split_whitespace() {
            assert!(
                answers.iter().any(|a| a == p),
                "{when}: backend {p} never answered: {answers:?}"
            );
        }
    };
    serves_every_backend("installed by helm");
    // Random selection: no Maglev table for the service yet.
    assert!(lbctl(&["maglev", "get", &frontend]).is_empty());

    // helm upgrade with one value changed: the ConfigMap's checksum in the
    // pod template rolls the agents, the new one selects by Maglev.
    let before = agent_pod_uids(cp);
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/helm/lb-agent");
    let upgraded = cp
        .helm(&[
            "upgrade",
            "lb-agent",
            chart,
            "--namespace",
            "kube-system",
            "--reuse-values",
            "--set",
            "loadBalancer.algorithm=maglev",
            "--wait",
            "--timeout",
            "180s",
        ])
        .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    assert!(upgraded.contains("REVISION: 2"), "{upgraded}");
    let after = agent_pod_uids(cp);
    assert!(
        !after
            .split_whitespace()
            .any(|u| before.split_whitespace().any(|b| b == u)),
        "the upgrade did not replace the agent: {before} -> {after}"
    );
    assert!(
        lb_testkit::wait_until(Duration::from_secs(60), || lbctl(&[
            "maglev", "get", &frontend
        ])
        .contains("Maglev table of")),
        "no Maglev table after the upgrade:\n{}",
        lbctl(&["service", "get", &frontend])
    );
    serves_every_backend("after helm upgrade to maglev");

    // helm uninstall removes every object of the release; what is pinned
    // keeps forwarding (the agent is gone, the kernel is not).
    cp.helm(&[
        "uninstall",
        "lb-agent",
        "--namespace",
        "kube-system",
        "--wait",
    ])
    .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
    for kind in ["ds", "configmap", "serviceaccount"] {
        assert!(
            cp.kubectl_try(&["-n", "kube-system", "get", kind, "lb-agent"])
                .is_none(),
            "{kind}/lb-agent outlived helm uninstall"
        );
    }
    assert!(cp
        .kubectl_try(&["get", "clusterrole", "lb-agent"])
        .is_none());
    assert!(lb_testkit::wait_until(Duration::from_secs(60), || {
        agent_pod_uids(cp).trim().is_empty()
    }));
    assert!(lb::datapath::pins::has_state(&cluster.pins().0));
    serves_every_backend("after helm uninstall, from the pinned data path");
}
