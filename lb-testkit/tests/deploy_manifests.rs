//! The shipped Kubernetes manifests: every one valid against the Kubernetes
//! schemas (kubernetes-validate, strict, offline), the kustomization lists
//! them all, RBAC is read-only on exactly what the agent watches, the
//! DaemonSet has what a kube-proxy-less node agent needs, and the ConfigMap
//! only sets settings lb-agent knows.
use std::{path::PathBuf, process::Command};

use serde_json::Value;

const K8S_VERSION: &str = "1.35.0";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn validator() -> PathBuf {
    let bin = root().join("target/tools/kubernetes-validate/bin/kubernetes-validate");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask setup` (it installs kubernetes-validate)",
        bin.display()
    );
    bin
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml")
        })
        .collect();
    files.sort();
    files
}

fn docs(path: &PathBuf) -> Vec<Value> {
    serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn find(kind: &str) -> Value {
    manifests()
        .iter()
        .flat_map(docs)
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} shipped"))
}

#[test]
fn every_manifest_is_valid_against_the_kubernetes_schemas() {
    let files = manifests();
    assert!(files.len() >= 4);
    let out = Command::new(validator())
        .args(["--strict", "-k", K8S_VERSION])
        .args(&files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let resources: usize = files.iter().map(|f| docs(f).len()).sum();
    assert_eq!(
        text.matches(" passed for resource ").count(),
        resources,
        "{text}"
    );
}

#[test]
fn the_validator_rejects_a_broken_manifest() {
    // The check above can fail: an unknown field is refused in strict mode.
    let broken = std::env::temp_dir().join(format!("lb-broken-{}.yaml", std::process::id()));
    std::fs::write(&broken, "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\nautomountServiceAccountTokn: false\n").unwrap();
    let out = Command::new(validator())
        .args(["--strict", "-k", K8S_VERSION])
        .arg(&broken)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&broken);
    assert!(!out.status.success());
}

#[test]
fn kustomization_lists_every_manifest() {
    let k: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join("deploy/kubernetes/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let mut listed: Vec<String> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    listed.sort();
    let mut files: Vec<String> = manifests()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(listed, files);
}

#[test]
fn cluster_role_is_read_only_on_services_endpointslices_and_nodes() {
    let role = find("ClusterRole");
    let mut granted = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(verbs, ["get", "list", "watch"], "read-only: {rule}");
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                granted.push(format!("{}/{}", g.as_str().unwrap(), r.as_str().unwrap()));
            }
        }
    }
    granted.sort();
    assert_eq!(
        granted,
        ["/nodes", "/services", "discovery.k8s.io/endpointslices"]
    );
}

#[test]
fn daemonset_runs_on_the_host_network_unprivileged_with_listed_capabilities_bpffs_cgroup2_and_node_name(
) {
    let ds = find("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(
        pod["hostPID"], true,
        "pods' sockets are reached through /proc/<pid>/ns/net"
    );
    assert_eq!(pod["serviceAccountName"], "lb-agent");
    // ClusterFirstWithHostNet would resolve through the kube-dns ClusterIP,
    // which only this agent translates: a fresh node could never start.
    assert_eq!(
        pod["dnsPolicy"], "Default",
        "the node's resolver, not kube-dns"
    );
    let agent = &pod["containers"][0];
    let probe = &agent["livenessProbe"]["httpGet"];
    assert_eq!(
        (probe["path"].as_str(), probe["port"].as_u64()),
        (Some("/livez"), Some(10256))
    );
    // Not privileged: every capability dropped but the ones the agent
    // checks for at start (agent::privileges), read-only root.
    let sc = &agent["securityContext"];
    assert_eq!(sc["privileged"], false, "{sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{sc}");
    assert_eq!(
        sc["capabilities"]["drop"],
        serde_json::json!(["ALL"]),
        "{sc}"
    );
    let added: Vec<String> = sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("CAP_{}", c.as_str().unwrap()))
        .collect();
    let needed: Vec<String> = lb::agent::privileges::NEEDS
        .iter()
        .map(|n| n.name.to_string())
        .collect();
    assert_eq!(added, needed, "the chart adds what the agent checks for");
    // Unprivileged, the runtime's default confinement would refuse pinning
    // and pods' namespaces on SELinux and AppArmor nodes: lifted for the
    // agent container, as privileged would have.
    assert_eq!(
        sc["seLinuxOptions"],
        serde_json::json!({"level": "s0", "type": "spc_t"}),
        "{sc}"
    );
    assert_eq!(
        sc["appArmorProfile"],
        serde_json::json!({"type": "Unconfined"}),
        "{sc}"
    );
    let env = agent["env"].as_array().unwrap();
    assert!(env
        .iter()
        .any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));
    let mounts: Vec<&str> = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert!(
        mounts.contains(&"/sys/fs/bpf") && mounts.contains(&"/sys/fs/cgroup"),
        "{mounts:?}"
    );
    let init = &pod["initContainers"][0];
    assert!(
        init["command"].to_string().contains("mount -t bpf"),
        "init step mounts bpffs: {init}"
    );
    assert_eq!(init["volumeMounts"][0]["mountPropagation"], "Bidirectional");
    assert!(
        mounts.contains(&"/run/lb"),
        "the status file needs a writable /run/lb: {mounts:?}"
    );
    assert_eq!(agent["readinessProbe"]["httpGet"]["path"], "/healthz");
}

#[test]
fn configmap_sets_only_settings_the_agent_knows() {
    let help = Command::new(lb_testkit::sibling_bin("lb-agent"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let cm = find("ConfigMap");
    for key in cm["data"].as_object().unwrap().keys() {
        assert!(
            help.contains(&format!("[env: {key}")),
            "ConfigMap key {key} is not an lb-agent setting"
        );
    }
}

// ---- The Helm chart (deploy/helm/lb-agent) ----

const CHART: &str = "deploy/helm/lb-agent";

/// Value sets a user would install with: the defaults, everything a Cilium
/// user would turn (DSR, Maglev, XDP, devices, map sizes, socket LB for the
/// host only, an IPv6 apiserver), and Prometheus Operator monitoring.
const VALUE_SETS: &[(&str, &[&str])] = &[
    ("defaults", &["k8sServiceHost=10.0.0.10"]),
    (
        "dsr-maglev-xdp",
        &[
            "k8sServiceHost=fd00::10",
            "k8sServicePort=443",
            "k8sAPIServers={[fd00::11]:443,api-2.example:6443}",
            "loadBalancer.mode=dsr",
            "loadBalancer.algorithm=maglev",
            "loadBalancer.acceleration=best-effort",
            "maglev.tableSize=65521",
            "devices={eth0,eth1}",
            "nodePort.addresses={10.0.0.0/8,primary}",
            "socketLB.hostNamespaceOnly=true",
            "podDevices={lxc*,cali*}",
            "bpf.mapSizes.conntrack=1048576",
            "bpf.mapSizes.services=131072",
            "bpf.preallocateMaps=true",
            "bpf.pinDir=/sys/fs/bpf/lb-prod",
            "cgroup.attachTo=/sys/fs/cgroup/unified/kubepods",
            "healthz.address=off",
            "externalIPs.inCluster=owned-only",
            "extraEnv[0].name=LB_CT_TIMEOUT_TCP",
            "extraEnv[0].value=2h",
        ],
    ),
    (
        "monitoring",
        &[
            "k8sServiceHost=api.example.internal",
            "metrics.address=0.0.0.0:9967",
            "metrics.serviceMonitor.enabled=true",
            "metrics.serviceMonitor.labels.release=prometheus",
            "priorityClassName=",
            "image.tag=0.1.0-rc1",
        ],
    ),
];

/// `helm SUBCOMMAND` on the chart with `--set` values: stdout, or the
/// error text. Helm's own directories stay in a temporary directory.
fn helm(subcommand: &str, sets: &[&str]) -> Result<String, String> {
    let home = std::env::temp_dir().join(format!("lb-helm-{}", std::process::id()));
    let mut cmd = Command::new(lb_testkit::k8s::helm_bin());
    cmd.arg(subcommand);
    if subcommand == "template" {
        cmd.args(["lb-agent", "--namespace", "kube-system"]);
    }
    cmd.arg(root().join(CHART))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    if subcommand == "lint" {
        cmd.args(["--strict", "--namespace", "kube-system"]);
    }
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn rendered(sets: &[&str]) -> Vec<Value> {
    let text = helm("template", sets).unwrap_or_else(|e| panic!("helm template {sets:?}: {e}"));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

#[test]
fn helm_lint_strict_passes_for_every_value_set() {
    for (name, sets) in VALUE_SETS {
        let out = helm("lint", sets).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{name}: {out}"
        );
    }
}

#[test]
fn helm_renders_manifests_valid_against_the_kubernetes_schemas_for_every_value_set() {
    for (name, sets) in VALUE_SETS {
        let docs = rendered(sets);
        // kubernetes-validate knows the built-in kinds; the Prometheus
        // Operator's ServiceMonitor is checked below by what it selects.
        let (builtin, custom): (Vec<&Value>, Vec<&Value>) = docs
            .iter()
            .partition(|d| d["apiVersion"] != "monitoring.coreos.com/v1");
        let file = std::env::temp_dir().join(format!("lb-helm-{name}-{}.yaml", std::process::id()));
        let yaml: Vec<String> = builtin
            .iter()
            .map(|d| serde_json::to_string(d).unwrap())
            .collect();
        std::fs::write(&file, yaml.join("\n---\n")).unwrap();
        let out = Command::new(validator())
            .args(["--strict", "-k", K8S_VERSION])
            .arg(&file)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&file);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{name}: {text}");
        assert_eq!(
            text.matches(" passed for resource ").count(),
            builtin.len(),
            "{name}: {text}"
        );
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        for kind in [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
        ] {
            assert!(kinds.contains(&kind), "{name}: no {kind} in {kinds:?}");
        }
        if *name == "monitoring" {
            let monitor = custom
                .iter()
                .find(|d| d["kind"] == "ServiceMonitor")
                .expect("a ServiceMonitor");
            let svc = of_kind(&docs, "Service");
            for (k, v) in monitor["spec"]["selector"]["matchLabels"]
                .as_object()
                .unwrap()
            {
                assert_eq!(
                    &svc["metadata"]["labels"][k], v,
                    "the ServiceMonitor selects the Service"
                );
            }
            assert_eq!(
                monitor["spec"]["endpoints"][0]["port"],
                svc["spec"]["ports"][0]["name"]
            );
            assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
            assert_eq!(svc["spec"]["ports"][0]["port"], 9967);
        } else {
            assert!(custom.is_empty(), "{name}: {custom:?}");
        }
    }
}

#[test]
fn helm_values_reach_the_agent_as_settings_it_knows() {
    let help = Command::new(lb_testkit::sibling_bin("lb-agent"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for (name, sets) in VALUE_SETS {
        let docs = rendered(sets);
        let data = of_kind(&docs, "ConfigMap")["data"]
            .as_object()
            .unwrap()
            .clone();
        for key in data.keys() {
            assert!(
                help.contains(&format!("[env: {key}")),
                "{name}: {key} is not an lb-agent setting"
            );
        }
        let ds = of_kind(&docs, "DaemonSet");
        let agent = &ds["spec"]["template"]["spec"]["containers"][0];
        for e in agent["env"].as_array().unwrap() {
            let key = e["name"].as_str().unwrap();
            assert!(
                key == "NODE_NAME" || help.contains(&format!("[env: {key}")),
                "{name}: env {key}"
            );
        }
        assert_eq!(
            agent["image"],
            if *name == "monitoring" {
                "ghcr.io/example/lb-agent:0.1.0-rc1"
            } else {
                "ghcr.io/example/lb-agent:0.1.0"
            }
        );
    }
    let docs = rendered(VALUE_SETS[1].1);
    let data = &of_kind(&docs, "ConfigMap")["data"];
    for (key, want) in [
        (
            "LB_K8S_API_SERVER",
            "[fd00::10]:443,[fd00::11]:443,api-2.example:6443",
        ),
        ("LB_MODE", "dsr"),
        ("LB_ALGORITHM", "maglev"),
        ("LB_ACCELERATION", "best-effort"),
        ("LB_MAGLEV_TABLE_SIZE", "65521"),
        ("LB_DEVICES", "eth0,eth1"),
        ("LB_NODEPORT_ADDRESSES", "10.0.0.0/8,primary"),
        ("LB_SOCKET_LB_HOST_NAMESPACE_ONLY", "true"),
        ("LB_POD_DEVICES", "lxc*,cali*"),
        ("LB_MAP_SIZE_CT", "1048576"),
        ("LB_MAP_SIZE_SERVICES", "131072"),
        ("LB_PREALLOCATE_MAPS", "true"),
        ("LB_PIN_DIR", "/sys/fs/bpf/lb-prod"),
        ("LB_CGROUP", "/sys/fs/cgroup/unified/kubepods"),
        ("LB_HEALTHZ_ADDRESS", "off"),
        ("LB_EXTERNAL_IPS_IN_CLUSTER", "owned-only"),
    ] {
        assert_eq!(data[key], want, "{key}");
    }
    assert!(
        data.get("LB_MAP_SIZE_BACKENDS").is_none(),
        "unset sizes stay the agent's"
    );
    assert_eq!(
        of_kind(&rendered(VALUE_SETS[0].1), "ConfigMap")["data"]["LB_EXTERNAL_IPS_IN_CLUSTER"],
        "translate",
        "external IPs are translated for pods by default, as with kube-proxy"
    );
    assert!(
        of_kind(&rendered(VALUE_SETS[0].1), "ConfigMap")["data"]
            .get("LB_PREALLOCATE_MAPS")
            .is_none(),
        "maps are not preallocated unless asked"
    );
    let pod = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let agent = &pod["containers"][0];
    assert!(
        agent["livenessProbe"].is_null(),
        "no /livez with healthz off"
    );
    assert_eq!(agent["env"][1]["name"], "LB_CT_TIMEOUT_TCP");
    // The defaults render what deploy/kubernetes has.
    let docs = rendered(VALUE_SETS[0].1);
    let pod = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(
        pod["containers"][0]["livenessProbe"]["httpGet"]["port"],
        10256
    );
    assert_eq!(
        pod["containers"][0]["readinessProbe"]["httpGet"]["port"],
        9967
    );
}

#[test]
fn helm_refuses_bad_values_naming_the_field() {
    for (sets, names) in [
        (&[][..], "k8sServiceHost"),
        (
            &["k8sServiceHost=a", "loadBalancer.mode=roundrobin"][..],
            "mode",
        ),
        (
            &["k8sServiceHost=a", "loadbalancer.mode=dsr"][..],
            "loadbalancer",
        ),
        (
            &["k8sServiceHost=a", "maglev.tableSize=1000"][..],
            "tableSize",
        ),
        (
            &["k8sServiceHost=a", "loadBalancer.acceleration=xdp"][..],
            "acceleration",
        ),
        (
            &["k8sServiceHost=a", "metrics.serviceMonitor.enabled=true"][..],
            "metrics.address",
        ),
        (
            &["k8sServiceHost=a", "nodePort.addresses={eth0}"][..],
            "addresses",
        ),
        (
            &["k8sServiceHost=a", "externalIPs.inCluster=owned"][..],
            "inCluster",
        ),
        (
            &["k8sServiceHost=a", "k8sAPIServers={api-2}"][..],
            "k8sAPIServers",
        ),
        (&["k8sServiceHost=https://api:6443"][..], "k8sServiceHost"),
        (
            &["k8sServiceHost=a", "metrics.address=10.0.0.1:9967"][..],
            "metrics",
        ),
        (
            &["k8sServiceHost=a", "metrics.serviceStats=maybe"][..],
            "serviceStats",
        ),
        (
            &[
                "k8sServiceHost=a",
                "securityContext.capabilities.agent={CAP_BPF}",
            ][..],
            "agent",
        ),
    ] {
        let err = helm("template", sets).expect_err(&format!("{sets:?} was accepted"));
        assert!(
            err.contains(names),
            "{sets:?}: the error does not name {names}: {err}"
        );
    }
}

#[test]
fn chart_version_is_the_workspace_version() {
    let chart: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join(CHART).join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version);
    assert_eq!(chart["appVersion"], version);
}

/// deploy/kubernetes is the chart rendered with
/// deploy/helm/kustomize-values.yaml, one file per template. With
/// LB_UPDATE_MANIFESTS=1 (`cargo xtask manifests`) the files are rewritten.
#[test]
fn kustomize_base_is_the_chart_rendered_with_its_values() {
    let home = std::env::temp_dir().join(format!("lb-helm-{}", std::process::id()));
    let out = Command::new(lb_testkit::k8s::helm_bin())
        .args(["template", "lb-agent", "--namespace", "kube-system"])
        .arg(root().join(CHART))
        .arg("--values")
        .arg(root().join("deploy/helm/kustomize-values.yaml"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // helm template: "---\n# Source: lb-agent/templates/FILE\n<doc>" per object.
    let mut files: Vec<(String, Vec<String>)> = Vec::new();
    for doc in text.split("---\n").filter(|d| !d.trim().is_empty()) {
        let (source, body) = doc.split_once('\n').unwrap();
        let file = source
            .strip_prefix("# Source: lb-agent/templates/")
            .unwrap_or_else(|| panic!("unexpected helm output: {source}"))
            .to_string();
        match files.iter_mut().find(|(f, _)| *f == file) {
            Some((_, docs)) => docs.push(body.to_string()),
            None => files.push((file, vec![body.to_string()])),
        }
    }
    let header = "# Generated from the Helm chart deploy/helm/lb-agent with\n\
                  # deploy/helm/kustomize-values.yaml by `cargo xtask manifests`:\n\
                  # edit the chart, not this file.\n";
    let update = std::env::var_os("LB_UPDATE_MANIFESTS").is_some();
    let mut stale = Vec::new();
    for (file, docs) in &files {
        let want = format!("{header}{}", docs.join("---\n"));
        let path = root().join("deploy/kubernetes").join(file);
        if update {
            std::fs::write(&path, &want).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
            stale.push(file.clone());
        }
    }
    assert!(
        stale.is_empty(),
        "deploy/kubernetes differs from the chart in {stale:?}: run `cargo xtask manifests`"
    );
    let mut rendered: Vec<&str> = files.iter().map(|(f, _)| f.as_str()).collect();
    rendered.sort();
    let on_disk: Vec<String> = manifests()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        rendered, on_disk,
        "a file in deploy/kubernetes the chart does not render"
    );
}
