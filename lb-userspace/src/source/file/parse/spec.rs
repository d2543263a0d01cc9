//! The services file as written: the fields a user may set (unknown ones
//! are refused), and the error that names a field.
use std::{fmt, net::IpAddr};

use serde::Deserialize;

use crate::model::{Algorithm, BackendState};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicesFile {
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceSpec {
    pub name: String,
    /// ClusterIP (default), NodePort or LoadBalancer.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub internal_traffic_policy: Option<String>,
    #[serde(default)]
    pub external_traffic_policy: Option<String>,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default, rename = "clusterIPs")]
    pub cluster_ips: Vec<String>,
    #[serde(default, rename = "externalIPs")]
    pub external_ips: Vec<String>,
    #[serde(default, rename = "loadBalancerIPs")]
    pub load_balancer_ips: Vec<String>,
    /// Networks allowed to reach the loadBalancerIPs (as in a Kubernetes
    /// Service); empty: everyone.
    #[serde(default, rename = "loadBalancerSourceRanges")]
    pub load_balancer_source_ranges: Vec<String>,
    #[serde(default)]
    pub ports: Vec<PortSpec>,
    #[serde(default)]
    pub backends: Vec<BackendSpec>,
    /// Unset: the agent's --lb-algorithm.
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// With `algorithm: maglev`: the size M of this service's table (one of
    /// `MAGLEV_PRIMES`); unset: the agent's --maglev-table-size.
    #[serde(default)]
    pub maglev_table_size: Option<i64>,
    /// `snat` or `dsr`: how this service's NodePort, LoadBalancer and
    /// external-IP traffic reaches remote backends; unset: the agent's
    /// --lb-mode.
    #[serde(default)]
    pub forwarding_mode: Option<crate::model::ForwardingMode>,
    /// Export this service's per-frontend traffic counters as lb_service_*
    /// metrics (the `lb.dev/metrics: "true"` annotation in Kubernetes mode).
    #[serde(default)]
    pub metrics: bool,
    /// `None` or `ClientIP`, as in a Kubernetes Service.
    #[serde(default)]
    pub session_affinity: Option<String>,
    #[serde(default)]
    /// Numbers are read as i64 and range-checked in `to_model`, so a
    /// negative or huge value gets an error naming the field, not a type error.
    pub session_affinity_timeout_seconds: Option<i64>,
}

fn default_namespace() -> String {
    "default".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortSpec {
    #[serde(default)]
    pub name: Option<String>,
    pub port: i64,
    #[serde(default = "default_protocol")]
    pub protocol: String,
    #[serde(default)]
    pub target_port: Option<i64>,
    #[serde(default)]
    pub node_port: Option<i64>,
}

fn default_protocol() -> String {
    "TCP".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendSpec {
    pub address: String,
    #[serde(default)]
    pub state: BackendState,
    /// The backend runs on this node.
    #[serde(default)]
    pub local: bool,
    /// Relative share with Maglev (1-65535, default 1).
    #[serde(default)]
    pub weight: Option<i64>,
}

/// What the file itself cannot say: this node's addresses for NodePorts,
/// and the algorithm of services that do not name one (--lb-algorithm).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileContext {
    pub nodeport_addresses: Vec<IpAddr>,
    pub default_algorithm: Algorithm,
}

/// An invalid services file: which field, what is wrong, how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// Path of the field, e.g. `services[1].ports[0].port`; empty for syntax errors.
    pub field: String,
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for FileError {}

pub(super) fn err(field: impl Into<String>, message: impl Into<String>) -> FileError {
    FileError {
        field: field.into(),
        message: message.into(),
    }
}
