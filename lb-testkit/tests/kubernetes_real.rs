//! lb-agent in Kubernetes mode against a real control plane (etcd,
//! kube-apiserver, kube-controller-manager built from the upstream Go
//! modules, `testbed/`): over TLS, with the ServiceAccount token and the
//! RBAC that deploy/kubernetes ships, and with EndpointSlices written by the
//! real EndpointSlice controller from Pods whose readiness the tests set.
//!
//! The control plane is shared by the tests of this file (each uses a
//! Kubernetes namespace and a node name of its own); tests that restart the
//! apiserver start their own.
use std::{
    collections::BTreeSet,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use lb_testkit::{
    agent::Agent,
    k8s::{self, ControlPlane},
    topology::Topology,
    unique, wait_until,
    world::World,
};

fn shared_cp() -> MutexGuard<'static, ControlPlane> {
    k8s::shared()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// deploy/kubernetes applied once (server-side apply is idempotent), and
/// a kubeconfig with the agent's ServiceAccount token.
fn agent_kubeconfig(cp: &ControlPlane) -> std::path::PathBuf {
    static DONE: Mutex<Option<std::path::PathBuf>> = Mutex::new(None);
    let mut d = DONE.lock().unwrap();
    if d.is_none() {
        k8s::install_manifests(cp);
        *d = Some(cp.service_account_kubeconfig("kube-system", "lb-agent"));
    }
    d.clone().unwrap()
}

/// A namespace and a Node of this test's own.
fn setup(cp: &ControlPlane, ns: &str, node: &str, node_ip: &str) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels: {{topology.kubernetes.io/zone: zone-a}}\n"
    ));
    // Node addresses are status: the kubelet writes them.
    cp.kubectl(&[
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"addresses":[{{"type":"InternalIP","address":"{node_ip}"}}]}}}}"#),
    ]);
    wait(cp, "the namespace's default ServiceAccount", || {
        cp.kubectl(&["-n", ns, "get", "sa"]).contains("default")
    });
}

fn wait(cp: &ControlPlane, what: &str, cond: impl FnMut() -> bool) {
    assert!(
        wait_until(Duration::from_secs(60), cond),
        "timed out waiting for {what}\n{}",
        cp.logs()
    );
}

/// A Pod on `node` with `labels`, then Running and Ready at `ip` (the
/// status subresource, as a kubelet would write it).
fn ready_pod(cp: &ControlPlane, ns: &str, name: &str, node: &str, app: &str, ips: &[&str]) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{app: {app}}}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: registry.k8s.io/pause:3.10\n    ports: [{{name: http, containerPort: 8080}}, {{name: dns, containerPort: 5353, protocol: UDP}}]\n"
    ));
    set_ready(cp, ns, name, ips, true);
}

fn set_ready(cp: &ControlPlane, ns: &str, name: &str, ips: &[&str], ready: bool) {
    let pod_ips: Vec<String> = ips.iter().map(|ip| format!(r#"{{"ip":"{ip}"}}"#)).collect();
    let status = if ready { "True" } else { "False" };
    cp.kubectl(&[
        "-n",
        ns,
        "patch",
        "pod",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(
            r#"{{"status":{{"phase":"Running","podIP":"{}","podIPs":[{}],"conditions":[{{"type":"Ready","status":"{status}","lastTransitionTime":"{}"}}]}}}}"#,
            ips[0],
            pod_ips.join(","),
            // As a kubelet writes it: the EndpointSlice controller stamps
            // slices with it (last-change-trigger-time).
            humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        ),
    ]);
}

fn service(cp: &ControlPlane, ns: &str, name: &str, extra_spec: &str) -> String {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 80, targetPort: http}}]\n{extra_spec}"
    ));
    cluster_ip(cp, ns, name)
}

/// A Service's ClusterIP, as the apiserver assigned it.
fn cluster_ip(cp: &ControlPlane, ns: &str, name: &str) -> String {
    cp.kubectl(&[
        "-n",
        ns,
        "get",
        "svc",
        name,
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
}

/// The frontends of `lbctl service list`, as "address:port" → backends.
/// Waits (30 s) until the agent lists `target` with one backend; fails
/// with what it lists and its log.
fn wait_for_one_backend(agent: &Agent, target: &str) {
    assert!(
        wait_until(Duration::from_secs(30), || frontends(agent)
            .iter()
            .any(|(f, _, n)| f == target && *n == 1)),
        "{:?}\n{}",
        frontends(agent),
        agent.log_text()
    );
}

fn frontends(agent: &Agent) -> Vec<(String, String, usize)> {
    agent
        .lbctl_json(&["service", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let fe = &s["frontend"];
            let addr = fe["address"].as_str().unwrap();
            let addr = if addr.contains(':') {
                format!("[{addr}]")
            } else {
                addr.to_string()
            };
            (
                format!("{addr}:{}", fe["port"]),
                s["type"].as_str().unwrap_or("").to_string(),
                // Selectable backends: a maintenance one (not ready, kept
                // for its established flows) takes no new connection.
                s["backends"].as_array().map_or(0, |b| {
                    b.iter().filter(|b| b["state"] != "maintenance").count()
                }),
            )
        })
        .collect()
}

fn served(w: &World, target: &str, n: usize) -> BTreeSet<String> {
    w.probe("tcp", target, n)
        .iter()
        .map(|a| {
            assert!(a.ok, "{target}: {a:?}");
            a.backend().unwrap().to_string()
        })
        .collect()
}

fn start_agent(cp: &ControlPlane, w: &World, node: &str, extra: &[&str]) -> Agent {
    let kubeconfig = agent_kubeconfig(cp);
    Agent::start_kubernetes_in(
        &cp.netns.name,
        &kubeconfig,
        node,
        &w.cgroup.path,
        &w.pins.path,
        extra,
    )
}

/// The agent gets nothing but what deploy/kubernetes gives it: a
/// ServiceAccount token over TLS and the ClusterRole's get/list/watch on
/// Services, EndpointSlices and Nodes; the real EndpointSlice controller
/// turns a ready Pod into the backend a client reaches.
#[test]
fn with_only_its_shipped_rbac_over_tls_the_agent_serves_a_clusterip_from_real_endpointslices() {
    let w = World::new("k8sreal_rbac", 2);
    let _servers = w.tcp_servers(8080, false);
    let (ns, node) = (
        unique("rbac").to_lowercase().replace('_', "-"),
        unique("node-rbac"),
    );
    let ip = {
        let cp = shared_cp();
        setup(&cp, &ns, &node, "192.168.77.1");
        let ip = service(&cp, &ns, "web", "");
        ready_pod(
            &cp,
            &ns,
            "web-1",
            &node,
            "web",
            &[&Topology::backend_ip(0).to_string()],
        );
        ip
    };
    let agent = {
        let cp = shared_cp();
        // Nothing more than the shipped role: what the agent may do is
        // exactly get/list/watch of the three kinds.
        let can = cp.kubectl(&[
            "auth",
            "can-i",
            "--list",
            "--as=system:serviceaccount:kube-system:lb-agent",
        ]);
        for (res, verbs) in [
            ("services", "[get list watch]"),
            ("endpointslices.discovery.k8s.io", "[get list watch]"),
            ("nodes", "[get list watch]"),
        ] {
            assert!(
                can.lines()
                    .any(|l| l.starts_with(res) && l.trim_end().ends_with(verbs)),
                "{res} {verbs}:\n{can}"
            );
        }
        assert!(!can.contains("secrets") && !can.contains("pods "), "{can}");
        start_agent(&cp, &w, &node, &[])
    };
    let target = format!("{ip}:80");
    wait_for_one_backend(&agent, &target);
    assert_eq!(served(&w, &target, 10), BTreeSet::from(["b1".to_string()]));
    assert!(
        !agent.log_text().contains("Forbidden"),
        "{}",
        agent.log_text()
    );
}

/// Readiness from the status subresource drives the maps through the real
/// EndpointSlice controller: ready → not ready → deleted (terminating) →
/// gone; and a rolling replacement of every pod under load fails no connect.
#[test]
fn pod_readiness_and_a_rolling_update_under_load_reach_the_maps_with_no_failed_connect_timed_under_ours_and_kube_proxys_metric_names(
) {
    let w = World::new("k8sreal_roll", 3);
    let _servers = w.tcp_servers(8080, false);
    let ns = unique("roll").to_lowercase().replace('_', "-");
    let node = unique("node-roll");
    let b = |i: usize| Topology::backend_ip(i).to_string();
    let ip = {
        let cp = shared_cp();
        setup(&cp, &ns, &node, "192.168.77.2");
        let ip = service(&cp, &ns, "web", "");
        ready_pod(&cp, &ns, "web-1", &node, "web", &[&b(0)]);
        ready_pod(&cp, &ns, "web-2", &node, "web", &[&b(1)]);
        ip
    };
    let agent = start_agent(&shared_cp(), &w, &node, &[]);
    let target = format!("{ip}:80");
    let backends_in_maps = |want: usize| {
        wait_until(Duration::from_secs(30), || {
            frontends(&agent)
                .iter()
                .any(|(f, _, n)| *f == target && *n == want)
        })
    };
    assert!(backends_in_maps(2), "{}", agent.log_text());
    assert_eq!(served(&w, &target, 40).len(), 2);

    // Not ready: no new connection goes there (it stays in the maps as a
    // maintenance backend for the flows it has; no terminating state for a
    // live pod).
    // (A second apart: a Ready condition's lastTransitionTime, which the
    // controller's trigger stamp comes from, has whole seconds.)
    std::thread::sleep(Duration::from_millis(1100));
    set_ready(&shared_cp(), &ns, "web-2", &[&b(1)], false);
    assert!(backends_in_maps(1));
    assert_eq!(served(&w, &target, 20), BTreeSet::from(["b1".to_string()]));
    std::thread::sleep(Duration::from_millis(1100));
    set_ready(&shared_cp(), &ns, "web-2", &[&b(1)], true);
    assert!(backends_in_maps(2));
    // Both flips were timed from the EndpointSlice controller's trigger
    // stamp (the Pod write) to the maps, as kube-proxy's
    // network_programming_duration_seconds; the stamps from before the
    // agent started are not.
    let programmed = |what: &str| -> f64 {
        let (_, metrics) = agent.http_get("/metrics");
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("lb_network_programming_duration_seconds_{what} "))
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no network programming {what}:\n{metrics}"))
    };
    assert!(
        wait_until(Duration::from_secs(10), || programmed("count") >= 2.0),
        "count {}; slices:\n{}",
        programmed("count"),
        shared_cp().kubectl(&["-n", &ns, "get", "endpointslices", "-o", "yaml"])
    );
    // No upper bound on the count: the agent watches every namespace of the
    // control plane the tests share, so other tests' slice changes made
    // after it started are timed too. (That stamps from before the start are
    // not is the store's unit test.)
    let (count, sum) = (programmed("count"), programmed("sum"));
    assert!(
        sum > 0.0 && sum / count < 10.0,
        "mean {} s over {count}",
        sum / count
    );
    // The same under kube-proxy's names, so its dashboards keep working:
    // every latency ours has, under the slice's family; every reconcile as
    // a sync of both families, its time as the last one; every Service and
    // EndpointSlice the watches brought as a change.
    // (One scrape can fall between our observation and kube-proxy's: the
    // check is asked again of a new scrape, for up to 5 s.)
    let kube_proxys_names = || -> Result<(), String> {
        let (_, metrics) = agent.http_get("/metrics");
        let value = |line_start: &str| -> Result<f64, String> {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(line_start)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| format!("no {line_start}:\n{metrics}"))
        };
        let ours = value("lb_network_programming_duration_seconds_count")?;
        let family = |f: &str| {
            value(&format!(
                "kubeproxy_network_programming_duration_seconds_count{{ip_family=\"{f}\"}}"
            ))
        };
        let v4 = family("IPv4")?;
        let theirs = v4 + family("IPv6").unwrap_or(0.0);
        if !(v4 >= 2.0 && theirs == ours) {
            return Err(format!("network programming: kube-proxy's {theirs} ({v4} IPv4, this test's family), ours {ours}"));
        }
        let reconciles = value("lb_reconcile_duration_seconds_count")?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        for f in ["IPv4", "IPv6"] {
            let syncs = value(&format!(
                "kubeproxy_sync_proxy_rules_duration_seconds_count{{ip_family=\"{f}\"}}"
            ))?;
            let last = value(&format!(
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"{f}\"}}"
            ))?;
            if !(syncs >= 1.0 && syncs == reconciles && (0.0..60.0).contains(&(now - last))) {
                return Err(format!(
                    "{f}: {syncs} syncs, {reconciles} reconciles, last sync {last}, now {now}"
                ));
            }
        }
        // At least this test's service, and its slice as listed and its two
        // flips (other tests' objects come on top: one control plane).
        let services = value("kubeproxy_sync_proxy_rules_service_changes_total")?;
        let slices = value("kubeproxy_sync_proxy_rules_endpoint_changes_total")?;
        if !(services >= 1.0 && slices >= 3.0) {
            return Err(format!(
                "{services} service changes, {slices} endpoint changes"
            ));
        }
        Ok(())
    };
    let mut last = kube_proxys_names();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while last.is_err() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        last = kube_proxys_names();
    }
    if let Err(e) = last {
        panic!("kube-proxy's metric names: {e}");
    }

    // A rolling replacement under load: web-3 comes up, then each old pod
    // is deleted (terminating while no kubelet confirms it, then gone).
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        let (cg, client, target) = (
            w.cgroup.path.clone(),
            w.topo.client.name.clone(),
            target.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for a in lb_testkit::probe::run(&cg, &client, "tcp", &target, 50) {
                    if a.ok {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    {
        let cp = shared_cp();
        ready_pod(&cp, &ns, "web-3", &node, "web", &[&b(2)]);
    }
    assert!(backends_in_maps(3));
    for old in ["web-1", "web-2"] {
        let cp = shared_cp();
        cp.kubectl(&["-n", &ns, "delete", "pod", old, "--wait=false"]);
        drop(cp);
        std::thread::sleep(Duration::from_millis(500));
        let cp = shared_cp();
        cp.kubectl(&[
            "-n",
            &ns,
            "delete",
            "pod",
            old,
            "--grace-period=0",
            "--force",
        ]);
    }
    assert!(backends_in_maps(1), "{}", agent.log_text());
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("rolling update: {ok} connects, {failed} failed");
    assert!(ok > 100, "{ok} connects");
    assert_eq!(failed, 0);
    assert_eq!(served(&w, &target, 20), BTreeSet::from(["b3".to_string()]));
}

/// Every kind of Service the README claims, from real objects: NodePort (on
/// the Node's address), LoadBalancer with its status, external IPs, a named
/// target port, dual-stack, ClientIP affinity, traffic policies; headless,
/// ExternalName and service-proxy-name Services skipped; a selectorless
/// Service with a hand-made EndpointSlice.
#[test]
fn every_service_kind_from_real_objects_reaches_the_maps_as_the_readme_says() {
    let w = World::new("k8sreal_kinds", 1);
    let ns = unique("kinds").to_lowercase().replace('_', "-");
    let node = unique("node-kinds");
    let b0 = Topology::backend_ip(0).to_string();
    let b0v6 = Topology::backend_ip6(0).to_string();
    let (cluster_ip, dual) = {
        let cp = shared_cp();
        setup(&cp, &ns, &node, "192.168.77.3");
        let ip = service(
            &cp,
            &ns,
            "np",
            "  type: NodePort\n  externalTrafficPolicy: Local\n  internalTrafficPolicy: Local\n",
        );
        ready_pod(&cp, &ns, "np-1", &node, "np", &[&b0]);
        service(
            &cp,
            &ns,
            "lb",
            "  type: LoadBalancer\n  sessionAffinity: ClientIP\n  externalIPs: [198.51.100.7]\n  loadBalancerSourceRanges: [192.0.2.0/24, 10.1.0.0/16]\n",
        );
        ready_pod(&cp, &ns, "lb-1", &node, "lb", &[&b0]);
        cp.kubectl(&[
            "-n",
            &ns,
            "patch",
            "svc",
            "lb",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.77"}]}}}"#,
        ]);
        service(&cp, &ns, "dual", "  ipFamilyPolicy: RequireDualStack\n");
        ready_pod(&cp, &ns, "dual-1", &node, "dual", &[&b0, &b0v6]);
        let dual = cp.kubectl(&[
            "-n",
            &ns,
            "get",
            "svc",
            "dual",
            "-o",
            "jsonpath={.spec.clusterIPs[1]}",
        ]);
        service(&cp, &ns, "headless", "  clusterIP: None\n");
        cp.apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: ext, namespace: {ns}}}\nspec: {{type: ExternalName, externalName: example.org}}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: other-proxy\n  namespace: {ns}\n  labels: {{service.kubernetes.io/service-proxy-name: someone-else}}\nspec:\n  selector: {{app: np}}\n  ports: [{{port: 81}}]\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: manual, namespace: {ns}}}\nspec:\n  ports: [{{name: http, port: 82, targetPort: 9090}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: manual-1\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: manual}}\naddressType: IPv4\nports: [{{name: http, port: 9090, protocol: TCP}}]\nendpoints: [{{addresses: [\"{b0}\"], conditions: {{ready: true}}}}]\n"
        ));
        (ip, dual)
    };
    // NodePorts on the Node's InternalIP (`primary`), not on every local
    // address of the namespace the agent runs in.
    let agent = start_agent(
        &shared_cp(),
        &w,
        &node,
        &["--nodeport-addresses", "primary"],
    );
    let cp = shared_cp();
    let get = |name: &str, path: &str| {
        cp.kubectl(&[
            "-n",
            &ns,
            "get",
            "svc",
            name,
            "-o",
            &format!("jsonpath={path}"),
        ])
    };
    let np_port = get("np", "{.spec.ports[0].nodePort}");
    let lb_node_port: u16 = get("lb", "{.spec.ports[0].nodePort}").parse().unwrap();
    let lb_ip = get("lb", "{.spec.clusterIP}");
    let manual_ip = get("manual", "{.spec.clusterIP}");
    let headless_missing = get("other-proxy", "{.spec.clusterIP}");
    drop(cp);
    let want = [
        (format!("{cluster_ip}:80"), "ClusterIP"),
        (format!("192.168.77.3:{np_port}"), "NodePort"),
        (format!("{lb_ip}:80"), "ClusterIP"),
        ("203.0.113.77:80".to_string(), "LoadBalancer"),
        ("198.51.100.7:80".to_string(), "ExternalIP"),
        (format!("[{dual}]:80"), "ClusterIP"),
        (format!("{manual_ip}:82"), "ClusterIP"),
    ];
    assert!(
        wait_until(Duration::from_secs(30), || {
            let have = frontends(&agent);
            want.iter()
                .all(|(f, _)| have.iter().any(|(h, _, n)| h == f && *n >= 1))
        }),
        "want {want:?}\nhave {:?}\n{}",
        frontends(&agent),
        agent.log_text()
    );
    let have = frontends(&agent);
    for (f, kind) in &want {
        assert!(
            have.iter().any(|(h, k, _)| h == f && k == kind),
            "{f} as {kind}: {have:?}"
        );
    }
    // Skipped: headless, ExternalName, another proxy's service.
    assert!(
        !have
            .iter()
            .any(|(h, _, _)| h.starts_with(&format!("{headless_missing}:81"))),
        "{have:?}"
    );
    assert!(
        !have.iter().any(|(h, _, _)| h.ends_with(":81")),
        "service-proxy-name: {have:?}"
    );
    // The named target port resolved to the pod's containerPort (8080), and
    // the hand-made slice's port (9090).
    let list = agent.lbctl(&["service", "list"]);
    assert!(
        list.contains(&format!("{b0}:8080")) && list.contains(&format!("{b0}:9090")),
        "{list}"
    );
    // Affinity on the LoadBalancer service's frontends.
    let json = agent.lbctl_json(&["service", "list"]);
    let lb = json
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["frontend"]["address"] == "203.0.113.77")
        .unwrap();
    assert_eq!(
        lb["affinity_timeout_s"], 10800,
        "ClientIP, the default 3 h: {lb}"
    );
    // One affinity memory per service port, as kube-proxy: the
    // LoadBalancer address, the external IP, the ClusterIP and the
    // NodePort of the real Service share one group.
    let group = &lb["affinity_group"];
    assert!(group.is_u64(), "{lb}");
    for (addr, port) in [
        ("198.51.100.7".to_string(), 80),
        (lb_ip.clone(), 80),
        ("192.168.77.3".to_string(), lb_node_port),
    ] {
        let fe = json
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["frontend"]["address"] == addr.as_str() && s["frontend"]["port"] == port)
            .unwrap_or_else(|| panic!("{addr}:{port} in {json}"));
        assert_eq!(&fe["affinity_group"], group, "{addr}:{port}: {fe}");
    }
    // loadBalancerSourceRanges as the apiserver stored them, sorted, on the
    // load balancer's address only.
    assert_eq!(
        lb["source_ranges"],
        serde_json::json!(["10.1.0.0/16", "192.0.2.0/24"]),
        "{lb}"
    );
    let ext = json
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["frontend"]["address"] == "198.51.100.7")
        .unwrap();
    assert!(ext.get("source_ranges").is_none(), "{ext}");
    // Not the agent's address, yet translated for its sockets as kube-proxy
    // does (the default --external-ips-in-cluster translate; owned-only
    // would mark it foreign_external_ip, CVE-2020-8554).
    assert!(ext.get("foreign_external_ip").is_none(), "{ext}");
    // eTP Local: the NodePort has its node-local view too.
    assert!(
        json.as_array()
            .unwrap()
            .iter()
            .any(|s| s["frontend"]["port"] == np_port.parse::<u64>().unwrap()
                && s["local_view"] == true),
        "{json:#}"
    );
}

/// More Services than one page of the agent's initial list: all arrive.
#[test]
fn an_initial_list_of_more_than_one_page_of_services_is_complete() {
    let w = World::new("k8sreal_pages", 1);
    let ns = unique("pages").to_lowercase().replace('_', "-");
    let node = unique("node-pages");
    let n = 1_100; // the watcher lists 500 objects a page
    {
        let cp = shared_cp();
        setup(&cp, &ns, &node, "192.168.77.4");
        let mut yaml = String::new();
        for i in 0..n {
            yaml.push_str(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: {ns}}}\nspec:\n  ports: [{{port: 80}}]\n---\n"
            ));
        }
        cp.apply(&yaml);
    }
    let agent = start_agent(&shared_cp(), &w, &node, &[]);
    let count = || {
        agent
            .lbctl_json(&["service", "list"])
            .as_array()
            .unwrap()
            .len()
    };
    assert!(
        wait_until(Duration::from_secs(60), || count() >= n),
        "{} of {n}\n{}",
        count(),
        agent.log_text()
    );
}

/// The apiserver restarts: the agent keeps the maps (the data path goes on)
/// and, once the apiserver is back, follows changes made after it.
#[test]
fn after_an_apiserver_restart_the_agent_follows_new_changes() {
    let w = World::new("k8sreal_restart", 2);
    let _servers = w.tcp_servers(8080, false);
    let mut cp = ControlPlane::start(&unique("k8srestart"));
    let ns = "restart";
    let node = "node-restart";
    setup(&cp, ns, node, "192.168.77.5");
    let ip = service(&cp, ns, "web", "");
    ready_pod(
        &cp,
        ns,
        "web-1",
        node,
        "web",
        &[&Topology::backend_ip(0).to_string()],
    );
    k8s::install_manifests(&cp);
    let kc = cp.service_account_kubeconfig("kube-system", "lb-agent");
    let agent =
        Agent::start_kubernetes_in(&cp.netns.name, &kc, node, &w.cgroup.path, &w.pins.path, &[]);
    let target = format!("{ip}:80");
    wait_for_one_backend(&agent, &target);
    cp.restart_apiserver();
    // Meanwhile the data path served on: nothing was withdrawn.
    assert_eq!(served(&w, &target, 10), BTreeSet::from(["b1".to_string()]));
    ready_pod(
        &cp,
        ns,
        "web-2",
        node,
        "web",
        &[&Topology::backend_ip(1).to_string()],
    );
    assert!(
        wait_until(Duration::from_secs(60), || frontends(&agent)
            .iter()
            .any(|(f, _, n)| *f == target && *n == 2)),
        "{}",
        agent.log_text()
    );
    assert_eq!(served(&w, &target, 40).len(), 2);
}

/// Whether something listens on `port` at 127.0.0.1 in the agent's namespace.
fn listening(agent: &Agent, port: u16) -> bool {
    let ns = agent.netns.clone().unwrap();
    std::thread::spawn(move || {
        lb_testkit::netns::enter(&ns).unwrap();
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .join()
    .unwrap()
}

/// The health servers kube-proxy users and cloud load balancers depend on,
/// against real objects: the proxy's /healthz turns 503 (nodeEligible:
/// false) when the cluster autoscaler taints the Node and /livez does not;
/// a LoadBalancer Service with externalTrafficPolicy: Local gets its
/// apiserver-allocated healthCheckNodePort served, 503 with no local
/// endpoint, 200 with one (a remote one does not count), closed when the
/// policy goes back to Cluster.
#[test]
fn health_servers_follow_node_eligibility_and_local_endpoints_like_kube_proxy() {
    let w = World::new("k8sreal_health", 1);
    let ns = unique("health").to_lowercase().replace('_', "-");
    let node = unique("node-health");
    let other = format!("{node}-other");
    let b = |i: usize| Topology::backend_ip(i).to_string();
    // A control plane of its own: every agent serves the health-check ports
    // of all services, and the shared control plane's agents share one
    // network namespace (one node's ports), so another test's agent would
    // hold this port.
    let cp = ControlPlane::start(&unique("k8shealth"));
    let hc_port: u16 = {
        setup(&cp, &ns, &node, "192.168.77.6");
        cp.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {other}}}\n"
        ));
        service(
            &cp,
            &ns,
            "web",
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n",
        );
        // The remote endpoint exists from the start: it must not count.
        ready_pod(&cp, &ns, "web-remote", &other, "web", &[&b(1)]);
        cp.kubectl(&[
            "-n",
            &ns,
            "get",
            "svc",
            "web",
            "-o",
            "jsonpath={.spec.healthCheckNodePort}",
        ])
        .parse()
        .expect("the apiserver allocates a healthCheckNodePort")
    };
    k8s::install_manifests(&cp);
    let kc = cp.service_account_kubeconfig("kube-system", "lb-agent");
    let agent = Agent::start_kubernetes_in(
        &cp.netns.name,
        &kc,
        &node,
        &w.cgroup.path,
        &w.pins.path,
        &[],
    );
    let hc: std::net::SocketAddr = ([127, 0, 0, 1], hc_port).into();

    // The proxy health server.
    let (code, body) = agent.healthz_get("/healthz");
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["nodeEligible"], true, "{body}");
    assert!(
        json["lastUpdated"].as_str().unwrap().starts_with("20"),
        "{body}"
    );

    // No local endpoint: 503, weight 0.
    assert!(
        wait_until(Duration::from_secs(30), || listening(&agent, hc_port)),
        "healthCheckNodePort {hc_port} never opened\n{}",
        agent.log_text()
    );
    let r = agent.http_request_at(hc, "/");
    assert_eq!(r.code, 503, "{r:?}");
    assert_eq!(
        r.header("x-load-balancing-endpoint-weight"),
        Some("0"),
        "{r:?}"
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["localEndpoints"], 0);
    assert_eq!(body["serviceProxyHealthy"], true);
    assert_eq!(body["service"]["namespace"], ns.as_str());
    assert_eq!(body["service"]["name"], "web");

    // One local endpoint: 200, kube-proxy's exact body.
    ready_pod(&cp, &ns, "web-1", &node, "web", &[&b(0)]);
    // The port stays open throughout: a load balancer's probe is never
    // refused while the service keeps its healthCheckNodePort.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let r = agent.try_http_request_at(hc, "/healthz");
            assert!(
                r.is_ok(),
                "port {hc_port} refused: {r:?}\n{}",
                agent.log_text()
            );
            r.unwrap().code == 200
        }),
        "{}",
        agent.log_text()
    );
    let r = agent.http_request_at(hc, "/any/path");
    assert_eq!(r.header("x-load-balancing-endpoint-weight"), Some("1"));
    assert_eq!(
        r.body,
        format!("{{\n\t\"service\": {{\n\t\t\"namespace\": \"{ns}\",\n\t\t\"name\": \"web\"\n\t}},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}}")
    );

    // The cluster autoscaler marks the node for deletion: /healthz sends
    // load balancers away, /livez (the agent itself) stays fine.
    cp.kubectl(&[
        "taint",
        "node",
        &node,
        "ToBeDeletedByClusterAutoscaler=1:NoSchedule",
    ]);
    assert!(
        wait_until(Duration::from_secs(30), || agent.healthz_get("/healthz").0
            == 503),
        "{}",
        agent.log_text()
    );
    let (_, body) = agent.healthz_get("/healthz");
    assert!(body.contains("\"nodeEligible\":false"), "{body}");
    assert_eq!(agent.healthz_get("/livez").0, 200);
    cp.kubectl(&["taint", "node", &node, "ToBeDeletedByClusterAutoscaler-"]);
    assert!(wait_until(Duration::from_secs(30), || agent
        .healthz_get("/healthz")
        .0
        == 200));

    // Back to Cluster: no health check any more, the port closes.
    cp.kubectl(&[
        "-n",
        &ns,
        "patch",
        "svc",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"externalTrafficPolicy":"Cluster"}}"#,
    ]);
    assert!(
        wait_until(Duration::from_secs(30), || !listening(&agent, hc_port)),
        "{}",
        agent.log_text()
    );
}

/// trafficDistribution: PreferSameZone through the real EndpointSlice
/// controller, which writes zone hints from the Nodes' zone labels: this
/// node (zone-a) sends cluster traffic only to the zone-a endpoint; when
/// that one goes, the hints no longer cover this zone and every endpoint
/// serves again.
#[test]
fn prefer_same_zone_keeps_cluster_traffic_in_the_nodes_zone_through_real_hints() {
    let w = World::new("k8sreal_zone", 2);
    let _servers = w.tcp_servers(8080, false);
    let ns = unique("zone").to_lowercase().replace('_', "-");
    let node = unique("node-zone");
    let other = format!("{node}-b");
    let b = |i: usize| Topology::backend_ip(i).to_string();
    let ip = {
        let cp = shared_cp();
        setup(&cp, &ns, &node, "192.168.77.7");
        cp.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {other}\n  labels: {{topology.kubernetes.io/zone: zone-b}}\n"
        ));
        let ip = service(&cp, &ns, "web", "  trafficDistribution: PreferSameZone\n");
        ready_pod(&cp, &ns, "web-a", &node, "web", &[&b(0)]);
        ready_pod(&cp, &ns, "web-b", &other, "web", &[&b(1)]);
        ip
    };
    // The controller's hints, as written.
    let cp = shared_cp();
    wait(&cp, "zone hints on the slice", || {
        cp.kubectl(&[
            "-n",
            &ns,
            "get",
            "endpointslices",
            "-o",
            "jsonpath={.items[*].endpoints[*].hints.forZones[*].name}",
        ])
        .split_whitespace()
        .count()
            == 2
    });
    let agent = start_agent(&cp, &w, &node, &[]);
    drop(cp);
    let target = format!("{ip}:80");
    wait_for_one_backend(&agent, &target);
    assert_eq!(served(&w, &target, 30), BTreeSet::from(["b1".to_string()]));

    // The zone-a endpoint goes: no hint is for zone-a, topology is off.
    shared_cp().kubectl(&[
        "-n",
        &ns,
        "delete",
        "pod",
        "web-a",
        "--grace-period=0",
        "--force",
    ]);
    assert!(
        wait_until(Duration::from_secs(30), || frontends(&agent)
            .iter()
            .any(|(f, _, n)| *f == target && *n == 1)
            && served(&w, &target, 1).contains("b2")),
        "{:?}\n{}",
        frontends(&agent),
        agent.log_text()
    );
}

/// Unset devices in Kubernetes mode are detected (as Cilium does): the
/// default route's device and the device holding the Node's InternalIP get
/// the tc programs, and nothing else. The agent runs in a namespace of its
/// own ("the node") whose default route leads to the control plane, starts
/// with empty pins and reaches the apiserver at its advertise address (as
/// LB_K8S_API_SERVER gives it), never through a ClusterIP it has yet to
/// translate.
#[test]
fn devices_unset_in_kubernetes_mode_are_the_default_route_and_internal_ip_devices() {
    let w = World::new("k8sreal_devs", 1);
    let ns = unique("devs").to_lowercase().replace('_', "-");
    let node = unique("node-devs");
    let host = lb_testkit::netns::Netns::create(&format!("lbt-devs-{}", std::process::id()));
    let cp = shared_cp();
    setup(&cp, &ns, &node, "192.168.79.2");
    // The node: uplink x0 (default route) to the control plane's namespace;
    // y0 holds the InternalIP; z0 is a third device nothing points at.
    let (x1, cpns) = (
        format!("lbdx{}", std::process::id() % 100000),
        cp.netns.name.clone(),
    );
    host.ip(&[
        "link", "add", "x0", "type", "veth", "peer", "name", &x1, "netns", &cpns,
    ]);
    host.ip(&["addr", "add", "192.168.78.2/30", "dev", "x0"]);
    host.ip(&["link", "set", "x0", "up"]);
    lb_testkit::run(
        "ip",
        &["-n", &cpns, "addr", "add", "192.168.78.1/30", "dev", &x1],
    );
    lb_testkit::run("ip", &["-n", &cpns, "link", "set", &x1, "up"]);
    host.ip(&["route", "add", "default", "via", "192.168.78.1"]);
    for (a, b, addr) in [
        ("y0", "y1", "192.168.79.2/24"),
        ("z0", "z1", "192.168.80.2/24"),
    ] {
        host.ip(&["link", "add", a, "type", "veth", "peer", "name", b]);
        host.ip(&["addr", "add", addr, "dev", a]);
        host.ip(&["link", "set", a, "up"]);
        host.ip(&["link", "set", b, "up"]);
    }
    let kubeconfig = agent_kubeconfig(&cp);
    let server = format!("https://{}:{}", k8s::ADVERTISE, cp.api_port);
    drop(cp);
    let agent = Agent::start_kubernetes_in(
        &host.name,
        &kubeconfig,
        &node,
        &w.cgroup.path,
        &w.pins.path,
        &["--devices", "auto", "--k8s-api-server", &server],
    );
    let status = agent.lbctl_json(&["status"]);
    let mut tc: Vec<String> = status["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["attached"] == true)
        .filter_map(|h| h["hook"].as_str())
        .filter(|h| h.starts_with("tc-"))
        .map(str::to_string)
        .collect();
    tc.sort();
    assert_eq!(
        tc,
        [
            "tc-egress@x0",
            "tc-egress@y0",
            "tc-ingress@x0",
            "tc-ingress@y0"
        ],
        "{status:#}\n{}",
        agent.log_text()
    );
    assert!(
        agent.log_text().contains("external devices detected"),
        "{}",
        agent.log_text()
    );
}

/// The sum of the samples of `name` whose labels contain `labels`.
fn metric(agent: &Agent, name: &str, labels: &str) -> f64 {
    let (_, text) = agent.http_get("/metrics");
    text.lines()
        .filter(|l| l.split([' ', '{']).next() == Some(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `n` selector-less Services `quiet-<i>` with an EndpointSlice each (one
/// ready endpoint at `backend`:8080), as one manifest for `kubectl create`.
fn quiet_services(ns: &str, n: usize, backend: &str) -> String {
    (0..n)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: quiet-{i}, namespace: {ns}}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
                 apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: quiet-{i}-1\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: quiet-{i}}}\n\
                 addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints: [{{addresses: [\"{backend}\"], conditions: {{ready: true}}}}]\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// A watch that fell behind a compaction: while the agent is frozen, the
/// apiserver it watches dies, a Service is deleted and others created
/// through a second apiserver, etcd is compacted and the first apiserver
/// starts again (its new watch cache starts at the current revision).
/// Resumed, the agent's watches ask for a resourceVersion that no longer
/// exists, get 410 Gone, list again (counted on the wire), and the maps end
/// up exactly right: the deleted Service gone, the new ones in.
/// Beside them 1 000 quiet services: the relist keeps every one of them and
/// writes only what changed (lb_map_writes_total), as the reconciler diffs
/// the relisted model against what the maps hold. Before the freeze, the
/// bookmarks the watches ask for are seen arriving on every watch (about
/// one a minute each): what keeps a quiet watch's resourceVersion recent.
#[test]
fn a_watch_expired_by_etcd_compaction_relists_writes_only_what_changed_and_misses_no_deletion() {
    let w = World::new("k8sreal_410", 2);
    let _servers = w.tcp_servers(8080, false);
    let mut cp = ControlPlane::start(&unique("k8s410"));
    let second = 6444;
    cp.start_second_apiserver(second);
    let (ns, node) = ("expire", "node-expire");
    setup(&cp, ns, node, "192.168.77.9");
    let b = |i: usize| Topology::backend_ip(i).to_string();
    let old_ip = service(&cp, ns, "old", "");
    ready_pod(&cp, ns, "old-1", node, "old", &[&b(0)]);
    k8s::install_manifests(&cp);
    let kc = cp.service_account_kubeconfig("kube-system", "lb-agent");
    let agent =
        Agent::start_kubernetes_in(&cp.netns.name, &kc, node, &w.cgroup.path, &w.pins.path, &[]);
    let old = format!("{old_ip}:80");
    wait_for_one_backend(&agent, &old);
    const QUIET: usize = 1000;
    let manifest = std::env::temp_dir().join(format!("{}-quiet.yaml", unique("k8s410")));
    std::fs::write(&manifest, quiet_services(ns, QUIET, &b(0))).unwrap();
    cp.kubectl(&["create", "-f", manifest.to_str().unwrap()]);
    let _ = std::fs::remove_file(&manifest);
    assert!(
        wait_until(Duration::from_secs(60), || frontends(&agent)
            .iter()
            .filter(|(_, _, n)| *n == 1)
            .count()
            > QUIET),
        "{} frontends\n{}",
        frontends(&agent).len(),
        agent.log_text()
    );
    // The quiet ones, the old one and the apiserver's own `kubernetes`.
    let total_before = frontends(&agent).len();
    let quiet: BTreeSet<String> = frontends(&agent)
        .into_iter()
        .map(|(f, _, _)| f)
        .filter(|f| *f != old)
        .collect();
    // Another node's update: this agent's Node watch (one name) does not
    // see it, but the apiserver's cache of Nodes moves past the watch's
    // resourceVersion. The apiserver sends a watch a bookmark only then
    // (cacher.go dispatchEvents: the cache's last revision, and only when it
    // is newer than the watch's), as after the services and slices created
    // above.
    cp.apply("apiVersion: v1\nkind: Node\nmetadata: {name: node-expire-other}\n");
    // Bookmarks arrive on every watch, counted as they pass on the wire.
    let resources = ["services", "endpointslices", "nodes"];
    let bookmarks = |r: &str| {
        metric(
            &agent,
            "lb_kubernetes_watch_bookmarks_total",
            &format!("resource=\"{r}\""),
        )
    };
    assert!(
        wait_until(Duration::from_secs(90), || resources
            .iter()
            .all(|r| bookmarks(r) >= 1.0)),
        "bookmarks: {:?}\n{}",
        resources.map(|r| (r, bookmarks(r))),
        agent.log_text()
    );
    let lists = |r: &str| {
        metric(
            &agent,
            "lb_kubernetes_lists_total",
            &format!("resource=\"{r}\""),
        )
    };
    let lists_before = resources.map(lists);
    assert_eq!(lists_before, [1.0; 3], "one list each before the relist");
    let writes_before = metric(&agent, "lb_map_writes_total", "");
    // What one service of one backend costs to write, from the first sync.
    let per_service = writes_before / total_before as f64;
    eprintln!("{writes_before} map writes for {total_before} services");

    let pid = agent.pid().unwrap() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // The apiserver the agent watches goes before anything changes, so not
    // one event of what follows can wait in the agent's socket buffers:
    // only a relist can bring it. The changes go through the second one.
    cp.kill("apiserver");
    cp.use_apiserver(second);
    cp.kubectl(&["-n", ns, "delete", "svc", "old"]);
    // Selector-less, so that no controller (it talks to the first
    // apiserver) is needed: a new service with one endpoint, and 20
    // without endpoints.
    cp.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: new, namespace: {ns}}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: new-1\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: new}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints: [{{addresses: [\"{}\"], conditions: {{ready: true}}}}]\n",
        b(1)
    ));
    let new_ip = cluster_ip(&cp, ns, "new");
    for i in 0..20 {
        cp.apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: churn-{i}, namespace: {ns}}}\nspec:\n  ports: [{{name: http, port: 80}}]\n"
        ));
    }
    // Compaction: nothing of the agent's last resourceVersion is left in
    // etcd, and the first apiserver's new watch cache starts at the
    // current revision.
    let rev = cp.compact_etcd();
    eprintln!("etcd compacted at revision {rev}");
    cp.start_again("apiserver");
    let first = cp.api_port;
    cp.use_apiserver(first);
    // SAFETY: kill(2) on the agent this test started and stopped.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // Its watches resume on the first apiserver, get 410 Gone and list
    // everything again.
    assert!(
        wait_until(Duration::from_secs(60), || resources
            .iter()
            .zip(lists_before)
            .all(|(r, b)| lists(r) > b)),
        "lists {lists_before:?} -> {:?}\n{}",
        resources.map(lists),
        agent.log_text()
    );

    let new = format!("{new_ip}:80");
    assert!(
        wait_until(Duration::from_secs(60), || {
            let f = frontends(&agent);
            f.iter().any(|(a, _, n)| *a == new && *n == 1) && !f.iter().any(|(a, _, _)| *a == old)
        }),
        "{:?}\n{}",
        frontends(&agent),
        agent.log_text()
    );
    // It went through 410 and a relist, counted.
    let (_, metrics) = agent.http_get("/metrics");
    let expired: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("lb_source_errors_total") && l.contains("reason=\"watch-expired\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        expired >= 1.0,
        "no 410 counted:\n{metrics}\n{}",
        agent.log_text()
    );
    assert_eq!(served(&w, &new, 10), BTreeSet::from(["b2".to_string()]));
    assert!(
        w.probe("tcp", &old, 3).iter().all(|a| !a.ok),
        "the deleted ClusterIP must not answer"
    );
    // Every list was made again, and the relist wrote what changed only:
    // one service deleted, 21 created (20 without endpoints), against the
    // 1 000 quiet ones a rewrite would write again.
    assert!(
        wait_until(Duration::from_secs(10), || frontends(&agent).len()
            == total_before + 20),
        "{} frontends",
        frontends(&agent).len()
    );
    let writes = metric(&agent, "lb_map_writes_total", "") - writes_before;
    eprintln!(
        "the relist wrote {writes} entries ({per_service:.1} per quiet service at the first sync)"
    );
    assert!(
        writes > 0.0 && writes <= 22.0 * per_service,
        "the relist wrote {writes} entries: more than 22 changed services take ({per_service:.1} each)\n{}",
        agent.log_text()
    );
    let now: BTreeSet<String> = frontends(&agent).into_iter().map(|(f, _, _)| f).collect();
    assert!(
        quiet.is_subset(&now),
        "a quiet service was lost in the relist"
    );
    assert_eq!(
        // One of the quiet services (not the apiserver's `kubernetes`, on 443).
        served(&w, quiet.iter().find(|f| f.ends_with(":80")).unwrap(), 5),
        BTreeSet::from(["b1".to_string()])
    );
}

/// A Maglev table size asked for by annotation, through the real apiserver:
/// the agent builds the table at that size and the service entry names it;
/// an update of the annotation shrinks it, and a client is served
/// throughout.
#[test]
fn a_maglev_table_size_annotation_from_the_apiserver_sizes_the_services_table() {
    let w = World::new("k8sreal_maglevm", 2);
    let _servers = w.tcp_servers(8080, false);
    let (ns, node) = (
        unique("maglevm").to_lowercase().replace('_', "-"),
        unique("node-maglevm"),
    );
    let annotated = |size: u32| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: {ns}\n  annotations:\n    lb.dev/algorithm: maglev\n    lb.dev/maglev-table-size: \"{size}\"\nspec:\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: http}}]\n"
        )
    };
    let ip = {
        let cp = shared_cp();
        setup(&cp, &ns, &node, "192.168.77.9");
        cp.apply(&annotated(131_071));
        ready_pod(
            &cp,
            &ns,
            "web-1",
            &node,
            "web",
            &[&Topology::backend_ip(0).to_string()],
        );
        cluster_ip(&cp, &ns, "web")
    };
    let agent = {
        let cp = shared_cp();
        start_agent(&cp, &w, &node, &[])
    };
    let target = format!("{ip}:80");
    wait_for_one_backend(&agent, &target);
    let table = |agent: &Agent| agent.lbctl_json(&["maglev", "get", &format!("{target}/TCP")]);
    let t = table(&agent);
    assert_eq!(t["size"], 131_071, "{t}");
    assert_eq!(t["master_size"], 131_071, "{t}");
    assert_eq!(served(&w, &target, 10), BTreeSet::from(["b1".to_string()]));

    shared_cp().apply(&annotated(509));
    assert!(
        wait_until(Duration::from_secs(30), || table(&agent)["size"] == 509),
        "{}",
        agent.log_text()
    );
    assert_eq!(table(&agent)["master_size"], 509);
    assert_eq!(served(&w, &target, 10), BTreeSet::from(["b1".to_string()]));
    assert!(
        !agent.log_text().contains("invalid-annotation"),
        "{}",
        agent.log_text()
    );
}

/// Two apiservers over one etcd, as an HA control plane has, and the agent
/// given both (`--k8s-api-server a,b`, Cilium's `k8s.apiServerURLs`). The
/// one it watches is SIGKILLed: within seconds the agent watches the other
/// (counted as `apiserver-failover`), withdraws nothing meanwhile (the
/// frontend keeps its backend in every sample, the data path serves), and
/// converges on what changed while it moved: a new backend and a new
/// service. Then both are down: it says so (counted as `no-apiserver`),
/// keeps every frontend and takes up the first apiserver that is back.
#[test]
fn when_the_apiserver_it_watches_dies_the_agent_moves_to_the_next_prunes_nothing_and_converges() {
    let w = World::new("k8sreal_failover", 2);
    let _servers = w.tcp_servers(8080, false);
    let mut cp = ControlPlane::start(&unique("k8sfailover"));
    let second = 6444;
    cp.start_second_apiserver(second);
    let ns = "failover";
    let node = "node-failover";
    setup(&cp, ns, node, "192.168.77.6");
    let ip = service(&cp, ns, "web", "");
    ready_pod(
        &cp,
        ns,
        "web-1",
        node,
        "web",
        &[&Topology::backend_ip(0).to_string()],
    );
    k8s::install_manifests(&cp);
    let kc = cp.service_account_kubeconfig("kube-system", "lb-agent");
    let servers = format!("127.0.0.1:{},127.0.0.1:{second}", cp.api_port);
    let agent = Agent::start_kubernetes_in(
        &cp.netns.name,
        &kc,
        node,
        &w.cgroup.path,
        &w.pins.path,
        &["--k8s-api-server", &servers],
    );
    let target = format!("{ip}:80");
    wait_for_one_backend(&agent, &target);

    let killed = std::time::Instant::now();
    cp.kill("apiserver");
    cp.use_apiserver(second);
    // Changes made while the agent moves, through the second apiserver.
    // The controller manager talked to the first one and is down with it,
    // so the endpoints are written as another controller would: a second
    // slice for "web", and a selectorless "late" with its own slice.
    let slice = |name: &str, service: &str, ip: std::net::Ipv4Addr| {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {service}, endpointslice.kubernetes.io/managed-by: test}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints: [{{addresses: ['{ip}'], conditions: {{ready: true}}, nodeName: {node}}}]\n"
        )
    };
    cp.apply(&slice("web-extra", "web", Topology::backend_ip(1)));
    cp.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: late, namespace: {ns}}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n"
    ));
    cp.apply(&slice("late-1", "late", Topology::backend_ip(0)));
    let late = cluster_ip(&cp, ns, "late");
    let late = format!("{late}:80");
    // Every sample until it converged lists the frontend with a backend.
    let mut samples = 0;
    let converged = wait_until(Duration::from_secs(60), || {
        let f = frontends(&agent);
        samples += 1;
        assert!(
            f.iter().any(|(t, _, n)| *t == target && *n >= 1),
            "the frontend was withdrawn while the agent moved: {f:?}\n{}",
            agent.log_text()
        );
        f.iter().any(|(t, _, n)| *t == target && *n == 2)
            && f.iter().any(|(t, _, n)| *t == late && *n == 1)
    });
    let took = killed.elapsed();
    assert!(
        converged,
        "the agent did not converge through the second apiserver: {:?}\n{}",
        frontends(&agent),
        agent.log_text()
    );
    eprintln!("failover: converged {took:.1?} after the kill ({samples} samples)");
    assert!(took < Duration::from_secs(30), "{took:?}");
    let (_, metrics) = agent.http_get("/metrics");
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "lb_source_errors_total{source=\"kubernetes\",reason=\"apiserver-failover\"}"
        ) && !l.ends_with(" 0")),
        "the failover is not counted:\n{metrics}"
    );
    assert!(
        agent
            .log_text()
            .contains(&format!("watching https://127.0.0.1:{second} instead")),
        "{}",
        agent.log_text()
    );
    assert_eq!(served(&w, &target, 40).len(), 2);

    // Both apiservers gone: the agent says so (counted), keeps every
    // frontend, tries again with growing pauses, and takes up the first
    // one that is back.
    cp.kill("apiserver-2");
    assert!(
        wait_until(Duration::from_secs(30), || agent
            .log_text()
            .contains("no apiserver of 2 answers")),
        "{}",
        agent.log_text()
    );
    let f = frontends(&agent);
    assert!(
        f.iter().any(|(t, _, n)| *t == target && *n == 2)
            && f.iter().any(|(t, _, n)| *t == late && *n == 1),
        "withdrawn while no apiserver answered: {f:?}"
    );
    assert_eq!(served(&w, &target, 40).len(), 2);
    let (_, metrics) = agent.http_get("/metrics");
    assert!(
        metrics.lines().any(|l| l
            .starts_with("lb_source_errors_total{source=\"kubernetes\",reason=\"no-apiserver\"}")
            && !l.ends_with(" 0")),
        "no apiserver is not counted:\n{metrics}"
    );
    cp.start_again("apiserver-2");
    cp.kubectl(&["-n", ns, "delete", "endpointslice", "web-extra"]);
    assert!(
        wait_until(Duration::from_secs(90), || frontends(&agent)
            .iter()
            .any(|(t, _, n)| *t == target && *n == 1)),
        "the agent did not come back to the restarted apiserver: {:?}\n{}",
        frontends(&agent),
        agent.log_text()
    );
}

/// `kubectl apply -f -` of `yaml` as the cluster admin, giving up after a
/// few seconds (the apiserver may be down): whether it was applied.
fn apply_briefly(kubeconfig: &std::path::Path, netns: &str, yaml: &str) -> bool {
    use std::io::Write as _;
    let mut cmd = k8s::kubectl_command(
        kubeconfig,
        netns,
        &["--request-timeout=3s", "apply", "-f", "-"],
    );
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let Ok(mut child) = cmd.spawn() else {
        return false;
    };
    let _ = child.stdin.take().unwrap().write_all(yaml.as_bytes());
    child.wait().is_ok_and(|s| s.success())
}

/// A selectorless Service `name` on port 80 with a slice of one ready
/// endpoint (written as another controller would: the controller manager
/// dies with the control plane in this test).
fn service_with_slice(ns: &str, name: &str, node: &str, ip: std::net::Ipv4Addr) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {name}, endpointslice.kubernetes.io/managed-by: test}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints: [{{addresses: ['{ip}'], conditions: {{ready: true}}, nodeName: {node}}}]\n"
    )
}

/// The changes the one-apiserver fault tests make while the agent cannot
/// see them (or sees them slowly): web gains a second ready pod (backend
/// 1), and a new Service `name` with it is made; its "ClusterIP:80".
fn second_backend_and_new_service(cp: &ControlPlane, ns: &str, node: &str, name: &str) -> String {
    ready_pod(
        cp,
        ns,
        "web-2",
        node,
        "web",
        &[&Topology::backend_ip(1).to_string()],
    );
    cp.apply(&service_with_slice(ns, name, node, Topology::backend_ip(1)));
    format!("{}:80", cluster_ip(cp, ns, name))
}

/// A control plane of the test's own with one apiserver, a namespace `ns`
/// and Node `node`, the Service "web" with one ready pod on the first
/// backend, and the agent following it straight or, with `through_relay`,
/// through a relay on its path (for faults). Returns them in the order
/// they are dropped in reverse, with the web frontend "ip:80".
fn one_apiserver_bed(
    tag: &str,
    ns: &str,
    node: &str,
    node_ip: &str,
    through_relay: bool,
) -> (
    World,
    Vec<lb_testkit::servers::Server>,
    ControlPlane,
    Option<lb_testkit::relay::Relay>,
    Agent,
    String,
) {
    let w = World::new(&format!("k8sreal_{tag}"), 2);
    let servers = w.tcp_servers(8080, false);
    let cp = ControlPlane::start(&unique(&format!("k8s{tag}")));
    setup(&cp, ns, node, node_ip);
    let ip = service(&cp, ns, "web", "");
    ready_pod(
        &cp,
        ns,
        "web-1",
        node,
        "web",
        &[&Topology::backend_ip(0).to_string()],
    );
    k8s::install_manifests(&cp);
    let kc = cp.service_account_kubeconfig("kube-system", "lb-agent");
    let relay = through_relay.then(|| {
        lb_testkit::relay::Relay::start(
            &cp.netns.name,
            std::net::SocketAddr::from(([127, 0, 0, 1], cp.api_port)),
        )
    });
    let server = relay.as_ref().map(|r| format!("127.0.0.1:{}", r.port));
    let extra: Vec<&str> = server
        .as_deref()
        .map(|s| vec!["--k8s-api-server", s])
        .unwrap_or_default();
    let agent = Agent::start_kubernetes_in(
        &cp.netns.name,
        &kc,
        node,
        &w.cgroup.path,
        &w.pins.path,
        &extra,
    );
    let target = format!("{ip}:80");
    wait_for_one_backend(&agent, &target);
    (w, servers, cp, relay, agent, target)
}

/// The control plane fails under churn, with one apiserver (no failover
/// to lean on): etcd is SIGKILLed, then the apiserver, then both, each for
/// 20 s while a client creates and deletes Services in a loop (a kubectl
/// apply and a delete each round, giving up after 3 s while down).
/// Throughout, the agent keeps its state (the frontend keeps its backend in
/// every sample, 4 a second, and serves); it reports each outage once
/// (`apiserver-unready`, counted: /readyz fails when either is down) and
/// its end; and
/// after each recovery a Service made then is in the maps within 15 s (the
/// watches start anew when one failed, rather than waiting out their
/// backoff). At the end the agent's port-80 frontends are exactly the
/// cluster's Services: nothing was pruned on partial data or missed.
#[test]
fn when_etcd_the_apiserver_or_both_die_under_churn_the_agent_keeps_its_state_says_so_and_converges()
{
    let (ns, node) = ("chaos", "node-chaos");
    let (w, _servers, mut cp, _, agent, target) =
        one_apiserver_bed("chaos", ns, node, "192.168.77.7", false);

    // The churn: services made and deleted in a loop, whatever is down.
    let stop = Arc::new(AtomicBool::new(false));
    let (made, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let churn = {
        let (stop, made, failed) = (stop.clone(), made.clone(), failed.clone());
        let (admin, netns) = (cp.admin_kubeconfig(), cp.netns.name.clone());
        let (ns, node) = (ns.to_string(), node.to_string());
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let yaml =
                    service_with_slice(&ns, &format!("churn-{i}"), &node, Topology::backend_ip(1));
                if apply_briefly(&admin, &netns, &yaml) {
                    made.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                if i >= 2 {
                    let gone = format!("churn-{}", i - 2);
                    let _ = k8s::kubectl_command(
                        &admin,
                        &netns,
                        &[
                            "--request-timeout=3s",
                            "-n",
                            &ns,
                            "delete",
                            "svc",
                            "--ignore-not-found",
                            &gone,
                        ],
                    )
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };

    let unready = |agent: &Agent| {
        metric(
            agent,
            "lb_source_errors_total",
            "reason=\"apiserver-unready\"",
        )
    };
    let mut report = Vec::new();
    for (phase, killed) in [
        ("etcd", &["etcd"][..]),
        ("apiserver", &["apiserver"][..]),
        ("both", &["apiserver", "etcd"][..]),
    ] {
        let unready_before = unready(&agent);
        let answered_before = agent
            .log_text()
            .matches("the apiserver answers again")
            .count();
        for p in killed {
            cp.kill(p);
        }
        let down = std::time::Instant::now();
        let mut samples = 0;
        while down.elapsed() < Duration::from_secs(20) {
            let f = frontends(&agent);
            assert!(
                f.iter().any(|(t, _, n)| *t == target && *n == 1),
                "{phase} down: the frontend lost its backend: {f:?}\n{}",
                agent.log_text()
            );
            samples += 1;
            std::thread::sleep(Duration::from_millis(250));
        }
        assert_eq!(
            served(&w, &target, 20),
            BTreeSet::from(["b1".to_string()]),
            "{phase} down: the data path serves on"
        );
        assert!(
            unready(&agent) > unready_before,
            "{phase} down for 20 s and the agent did not say so (apiserver-unready)\n{}",
            agent.log_text()
        );
        // Back in the order they depend on: etcd, then the apiserver
        // (waited for until /readyz answers).
        for p in killed.iter().rev() {
            cp.start_again(p);
        }
        wait(&cp, "the apiserver to answer /readyz again", || {
            cp.kubectl_try(&["get", "--raw", "/readyz"]).is_some()
        });
        let back = std::time::Instant::now();
        let late = format!("after-{phase}");
        let yaml = service_with_slice(ns, &late, node, Topology::backend_ip(1));
        assert!(
            wait_until(Duration::from_secs(15), || apply_briefly(
                &cp.admin_kubeconfig(),
                &cp.netns.name,
                &yaml
            )),
            "the control plane is back but {late} cannot be applied\n{}",
            cp.logs()
        );
        let late_ip = cluster_ip(&cp, ns, &late);
        let late_target = format!("{late_ip}:80");
        assert!(
            wait_until(Duration::from_secs(15), || frontends(&agent)
                .iter()
                .any(|(t, _, n)| *t == late_target && *n == 1)),
            "{phase}: {late} not in the maps 15 s after the control plane came back\n{}",
            agent.log_text()
        );
        let took = back.elapsed();
        // And it says the outage is over (its probe asks every 5 s), so
        // the next one is reported as an outage of its own.
        assert!(
            wait_until(Duration::from_secs(15), || agent
                .log_text()
                .matches("the apiserver answers again")
                .count()
                > answered_before),
            "{phase}: the agent did not say the apiserver answers again\n{}",
            agent.log_text()
        );
        report.push(format!(
            "{phase}: down 20 s, {samples} samples all kept the frontend, apiserver-unready {} -> {}, a new service in the maps {took:.1?} after recovery",
            unready_before,
            unready(&agent)
        ));
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();

    // Converged: the agent's port-80 frontends are the cluster's services.
    let cluster: BTreeSet<String> = cp
        .kubectl(&[
            "get",
            "svc",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.spec.clusterIP}:{.spec.ports[0].port}{\"\\n\"}{end}",
        ])
        .lines()
        .filter(|l| l.ends_with(":80"))
        .map(str::to_string)
        .collect();
    let mut ours = BTreeSet::new();
    let converged = wait_until(Duration::from_secs(30), || {
        ours = frontends(&agent)
            .into_iter()
            .map(|(t, _, _)| t)
            .filter(|t| t.ends_with(":80"))
            .collect();
        ours == cluster
    });
    assert!(
        converged,
        "the agent's port-80 frontends differ from the cluster's services:\n only the agent: {:?}\n only the cluster: {:?}\n{}",
        ours.difference(&cluster).collect::<Vec<_>>(),
        cluster.difference(&ours).collect::<Vec<_>>(),
        agent.log_text()
    );
    let (made, failed) = (made.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "control-plane chaos: {}\nchurn: {made} services applied, {failed} refused while down; {} services at the end, the agent lists each",
        report.join("\n  "),
        cluster.len()
    );
    // The churn ran through the outages: some of its writes were refused.
    assert!(
        made >= 5 && failed >= 3,
        "the churn applied {made}, {failed} refused"
    );
}

/// The agent's path to its only apiserver is cut silently for a minute (a
/// relay that forwards nothing and closes nothing; when the cut ends, only
/// new connections get through, as after a NAT lost its state). Meanwhile
/// the frontend keeps its backend in every sample and serves, the outage
/// is reported (`apiserver-unready`), and changes made during the cut (a
/// second backend, a new Service) reach the maps within seconds of its
/// end: the watches, stuck on connections that will never carry another
/// byte, are started anew when /readyz answers again.
#[test]
fn a_silent_minute_long_cut_to_the_only_apiserver_is_reported_and_the_agent_converges_soon_after() {
    let (ns, node) = ("cut", "node-cut");
    let (w, _servers, cp, relay, agent, target) =
        one_apiserver_bed("cut", ns, node, "192.168.77.8", true);
    let relay = relay.unwrap();

    relay.cut();
    let cut = std::time::Instant::now();
    // Changes the agent cannot see yet, made straight to the apiserver.
    let late = second_backend_and_new_service(&cp, ns, node, "during-cut");
    let mut samples = 0;
    while cut.elapsed() < Duration::from_secs(60) {
        let f = frontends(&agent);
        assert!(
            f.iter().any(|(t, _, n)| *t == target && *n >= 1),
            "the frontend was withdrawn during the cut: {f:?}\n{}",
            agent.log_text()
        );
        samples += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        served(&w, &target, 20),
        BTreeSet::from(["b1".to_string()]),
        "during the cut the maps hold what the agent last saw, and serve it"
    );
    let unready = metric(
        &agent,
        "lb_source_errors_total",
        "reason=\"apiserver-unready\"",
    );
    assert!(
        unready >= 1.0,
        "a minute without the apiserver and the agent did not say so\n{}",
        agent.log_text()
    );

    relay.restore();
    let restored = std::time::Instant::now();
    assert!(
        wait_until(Duration::from_secs(20), || {
            let f = frontends(&agent);
            f.iter().any(|(t, _, n)| *t == target && *n == 2)
                && f.iter().any(|(t, _, n)| *t == late && *n == 1)
        }),
        "what changed during the cut is not in the maps 20 s after it: {:?}\n{}",
        frontends(&agent),
        agent.log_text()
    );
    let took = restored.elapsed();
    assert_eq!(served(&w, &target, 40).len(), 2);
    assert!(
        agent.log_text().contains("the apiserver answers again"),
        "{}",
        agent.log_text()
    );
    eprintln!(
        "silent cut of 60 s: {samples} samples kept the frontend, apiserver-unready {unready}, converged {took:.1?} after the cut ended"
    );
}

/// A slow apiserver: 400 ms added each way on the agent's path (a relay;
/// no netem here), so every request and its answer take 0.8 s more. The
/// agent is not fooled into an outage (its /readyz probe allows 2 s; no
/// `apiserver-unready`), and what changes meanwhile (a second backend, a
/// new Service) still reaches the maps within seconds.
#[test]
fn a_slow_apiserver_is_followed_without_a_false_outage() {
    let (ns, node) = ("slow", "node-slow");
    let (w, _servers, cp, relay, agent, target) =
        one_apiserver_bed("slow", ns, node, "192.168.77.9", true);
    let relay = relay.unwrap();

    relay.set_delay(Duration::from_millis(400));
    // Long enough for several probes through the slow path.
    std::thread::sleep(Duration::from_secs(12));
    let changed = std::time::Instant::now();
    let late = second_backend_and_new_service(&cp, ns, node, "while-slow");
    assert!(
        wait_until(Duration::from_secs(20), || {
            let f = frontends(&agent);
            f.iter().any(|(t, _, n)| *t == target && *n == 2)
                && f.iter().any(|(t, _, n)| *t == late && *n == 1)
        }),
        "changes through the slow apiserver did not reach the maps in 20 s: {:?}\n{}",
        frontends(&agent),
        agent.log_text()
    );
    let took = changed.elapsed();
    std::thread::sleep(Duration::from_secs(6));
    let unready = metric(
        &agent,
        "lb_source_errors_total",
        "reason=\"apiserver-unready\"",
    );
    assert!(
        unready == 0.0,
        "a slow apiserver was reported as an outage ({unready})\n{}",
        agent.log_text()
    );
    assert_eq!(served(&w, &target, 40).len(), 2);
    eprintln!("slow apiserver (+0.8 s a round trip): changes in the maps {took:.1?} after they were made, no outage reported");
}
