//! The configuration files a node's containerd, CNI bridge and kubelet
//! read, written into the node's directory.
use std::path::Path;

use super::{CLUSTER_DNS, PAUSE_IMAGE};

/// containerd's config: its state under `run_dir`, the CRI plugin with runc
/// and the CNI template below.
pub(super) fn containerd_toml(dir: &Path, run_dir: &Path, containerd_socket: &Path) -> String {
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
    # The CNI configuration is written from this template when the kubelet
    # passes the Node's spec.podCIDR (CRI UpdateRuntimeConfig), as kubenet
    # and GKE's nodes do: each node's bridge gets the /24 the controller
    # manager allocated it.
    conf_template = "{template}"
"#,
        root = dir.join("containerd").display(),
        state = run_dir.join("containerd").display(),
        sock = containerd_socket.display(),
        cni = dir.join("cni/net.d").display(),
        template = dir.join("cni/bridge.template").display(),
        runc = run_dir.join("runc").display(),
    )
}

/// The CNI bridge configuration as a Go text/template (containerd's
/// cniConfigTemplate: .PodCIDRRanges), filled in when the kubelet hands
/// containerd the Node's pod CIDR.
pub(super) fn cni_template(dir: &Path) -> String {
    format!(
        r#"{{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {{"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true,
    "ipMasq": false, "hairpinMode": true,
    "ipam": {{"type": "host-local",
             "ranges": [{{{{range $i, $r := .PodCIDRRanges}}}}{{{{if $i}}}}, {{{{end}}}}[{{"subnet": "{{{{$r}}}}"}}]{{{{end}}}}],
             "dataDir": "{ipam}"}}}},
  {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
]}}
"#,
        ipam = dir.join("ipam").display(),
    )
}

/// The kubelet's KubeletConfiguration for the hybrid cgroups of this
/// machine, under `cgroup_root`.
pub(super) fn kubelet_yaml(
    dir: &Path,
    cgroup_root: &str,
    containerd_socket: &Path,
    pki: &Path,
) -> String {
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
    )
}
