//! What the flags ask for, decided before anything on the node is read or
//! changed: the source (a file, or the apiserver as which node), how the
//! external devices are found, which pod devices are served. `process`
//! carries the plan out (reads the node's addresses, detects devices,
//! installs); everything here is tested without root.
use std::path::PathBuf;

use anyhow::{bail, Context as _};

use super::flags::{DatapathArgs, SourceArgs};
use crate::{datapath::pods::PodDevices, source::nodeports::NodePortAddresses};

/// Where the services come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourcePlan {
    /// Standalone mode: this services file.
    File(PathBuf),
    /// Kubernetes mode, as this node.
    Kubernetes { node_name: String },
}

impl SourcePlan {
    pub fn from_flags(args: &SourceArgs) -> anyhow::Result<Self> {
        match (&args.services, args.kubernetes) {
            (Some(path), false) => Ok(Self::File(path.clone())),
            (None, true) => {
                let node_name = args.node_name.clone().filter(|n| !n.is_empty()).context(
                    "Kubernetes mode needs this node's name: --node-name or NODE_NAME (downward API spec.nodeName)",
                )?;
                NodePortAddresses::check_flags(&args.nodeport_addresses)
                    .map_err(anyhow::Error::msg)?;
                Ok(Self::Kubernetes { node_name })
            }
            (Some(_), true) => {
                bail!("--services and --kubernetes: choose one source (LB_KUBERNETES may be set)")
            }
            (None, false) => bail!("choose a source: --services FILE (standalone) or --kubernetes"),
        }
    }

    pub fn is_kubernetes(&self) -> bool {
        matches!(self, Self::Kubernetes { .. })
    }
}

/// How the external devices (NodePort, LoadBalancer and external-IP
/// traffic from outside the node) are chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DevicePlan {
    /// `--devices none`, or standalone mode without `--devices`: none.
    None,
    /// These, as given.
    Given(Vec<String>),
    /// `--devices auto`, or Kubernetes mode without `--devices`: the
    /// devices of the default routes and of the Node's InternalIP, as
    /// kube-proxy and Cilium find them.
    Detect,
}

impl DevicePlan {
    pub fn from_flags(devices: &[String], source: &SourcePlan) -> anyhow::Result<Self> {
        let given: Vec<String> = devices
            .iter()
            .map(|d| d.trim())
            .filter(|d| !d.is_empty())
            .map(str::to_string)
            .collect();
        if let Some(word) = given.iter().find(|d| *d == "none" || *d == "auto") {
            if given.len() > 1 {
                bail!(
                    "--devices: '{word}' cannot be listed with devices ({}); give '{word}' alone or only device names",
                    given.join(",")
                );
            }
        }
        Ok(match given.first().map(String::as_str) {
            Some("none") => Self::None,
            Some("auto") => Self::Detect,
            Some(_) => Self::Given(given),
            None if source.is_kubernetes() => Self::Detect,
            None => Self::None,
        })
    }
}

/// The pod devices to serve: `--pod-devices`, or in Kubernetes mode with
/// socket LB for the host namespace only, every pod veth (pods' sockets
/// are then not translated; their packets must be). The second value says
/// the flags leave pods unable to reach services (worth a warning).
pub fn pod_devices(args: &DatapathArgs, source: &SourcePlan) -> (PodDevices, bool) {
    let devices = match (&args.pod_devices, source) {
        (Some(p), _) => p.clone(),
        (None, SourcePlan::Kubernetes { .. }) if args.socket_lb_host_namespace_only => {
            PodDevices::Auto
        }
        (None, _) => PodDevices::None,
    };
    let pods_unserved = args.socket_lb_host_namespace_only && devices.is_none();
    (devices, pods_unserved)
}

/// The apiservers of `--k8s-api-server` as URLs, in order: `host:port`
/// is HTTPS (an apiserver serves nothing else); empty items (a trailing
/// comma, the chart's empty default) are none.
pub fn apiserver_urls(flags: &[String]) -> Vec<String> {
    flags
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.contains("://") {
                s.to_string()
            } else {
                format!("https://{s}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::flags::tests::parse as flags;

    fn source(args: &[&str]) -> anyhow::Result<SourcePlan> {
        SourcePlan::from_flags(&flags(args).unwrap().source)
    }

    fn devices(args: &[&str]) -> anyhow::Result<DevicePlan> {
        let run = flags(args).unwrap();
        DevicePlan::from_flags(&run.datapath.devices, &SourcePlan::from_flags(&run.source)?)
    }

    #[test]
    fn the_source_is_a_file_or_the_apiserver_as_a_named_node() {
        assert_eq!(
            source(&["--services", "s.yaml"]).unwrap(),
            SourcePlan::File("s.yaml".into())
        );
        assert_eq!(
            source(&["--kubernetes", "--node-name", "n1"]).unwrap(),
            SourcePlan::Kubernetes {
                node_name: "n1".into()
            }
        );
        let none = source(&[]).unwrap_err().to_string();
        assert!(
            none.contains("--services FILE") && none.contains("--kubernetes"),
            "{none}"
        );
        for nameless in [&["--kubernetes"][..], &["--kubernetes", "--node-name", ""]] {
            let e = source(nameless).unwrap_err().to_string();
            assert!(e.contains("--node-name") && e.contains("NODE_NAME"), "{e}");
        }
        // clap refuses both on the command line; LB_KUBERNETES cannot be
        // tested here (the environment is the process's), the plan still
        // refuses the pair.
        assert!(flags(&["--services", "s.yaml", "--kubernetes"]).is_err());
        let both = SourceArgs {
            kubernetes: true,
            ..flags(&["--services", "s.yaml"]).unwrap().source
        };
        let e = SourcePlan::from_flags(&both).unwrap_err().to_string();
        assert!(e.contains("choose one source"), "{e}");
    }

    #[test]
    fn nodeport_addresses_primary_with_cidrs_is_refused_before_anything_starts() {
        let e = source(&[
            "--kubernetes",
            "--node-name",
            "n1",
            "--nodeport-addresses",
            "primary,10.0.0.0/8",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("--nodeport-addresses"), "{e}");
    }

    #[test]
    fn devices_are_given_none_or_detected_and_kubernetes_mode_detects_by_default() {
        assert_eq!(devices(&["--services", "s"]).unwrap(), DevicePlan::None);
        assert_eq!(
            devices(&["--kubernetes", "--node-name", "n"]).unwrap(),
            DevicePlan::Detect
        );
        assert_eq!(
            devices(&["--kubernetes", "--node-name", "n", "--devices", "none"]).unwrap(),
            DevicePlan::None
        );
        assert_eq!(
            devices(&["--services", "s", "--devices", "auto"]).unwrap(),
            DevicePlan::Detect
        );
        assert_eq!(
            devices(&["--services", "s", "--devices", "eth0,eth1"]).unwrap(),
            DevicePlan::Given(vec!["eth0".into(), "eth1".into()])
        );
        // LB_DEVICES="" (the chart's default) is no device named.
        assert_eq!(
            devices(&["--kubernetes", "--node-name", "n", "--devices", ""]).unwrap(),
            DevicePlan::Detect
        );
        for word in ["none", "auto"] {
            let e = devices(&["--services", "s", "--devices", &format!("eth0,{word}")])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("'{word}' cannot be listed")) && e.contains("eth0"),
                "{e}"
            );
        }
    }

    #[test]
    fn host_namespace_only_socket_lb_serves_pods_on_their_veths_in_kubernetes_mode() {
        let plan = |args: &[&str]| {
            let run = flags(args).unwrap();
            pod_devices(&run.datapath, &SourcePlan::from_flags(&run.source).unwrap())
        };
        let k8s = ["--kubernetes", "--node-name", "n"];
        assert_eq!(plan(&k8s), (PodDevices::None, false));
        assert_eq!(
            plan(&[&k8s[..], &["--socket-lb-host-namespace-only"]].concat()),
            (PodDevices::Auto, false)
        );
        assert_eq!(
            plan(&[&k8s[..], &["--pod-devices", "lxc*"]].concat()),
            (PodDevices::Patterns(vec!["lxc*".into()]), false)
        );
        // Standalone: nothing serves pods' packets unless asked, and the
        // flag alone leaves pods without services: said.
        assert_eq!(
            plan(&["--services", "s", "--socket-lb-host-namespace-only"]),
            (PodDevices::None, true)
        );
    }

    #[test]
    fn apiservers_are_https_urls_in_the_order_given() {
        let run = flags(&[
            "--kubernetes",
            "--node-name",
            "n",
            "--k8s-api-server",
            "10.0.0.1:6443, http://127.0.0.1:8080,,[fd00::1]:6443",
        ])
        .unwrap();
        assert_eq!(
            apiserver_urls(&run.source.k8s_api_server),
            [
                "https://10.0.0.1:6443",
                "http://127.0.0.1:8080",
                "https://[fd00::1]:6443"
            ]
        );
        assert!(
            apiserver_urls(&flags(&["--services", "s"]).unwrap().source.k8s_api_server).is_empty()
        );
    }
}
