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
fn daemonset_runs_privileged_on_the_host_network_with_bpffs_cgroup2_and_node_name() {
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
    assert_eq!(agent["securityContext"]["privileged"], true);
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
