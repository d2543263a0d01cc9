//! The model: what services exist and where their backends are, independent
//! of where that knowledge came from (services file or apiserver) and of how
//! the data path stores it.
pub mod file;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    pub services: BTreeMap<ServiceName, Service>,
}

impl Model {
    /// Services that differ between `self` and `next` (added, removed or changed).
    pub fn changed_services(&self, next: &Model) -> BTreeSet<ServiceName> {
        let mut changed = BTreeSet::new();
        for (name, svc) in &next.services {
            if self.services.get(name) != Some(svc) {
                changed.insert(name.clone());
            }
        }
        for name in self.services.keys() {
            if !next.services.contains_key(name) {
                changed.insert(name.clone());
            }
        }
        changed
    }

    pub fn frontend_count(&self) -> usize {
        self.services.values().map(|s| s.frontends.len()).sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl ServiceName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A service is a set of frontends; each frontend has its own backends
/// (a multi-port service has one frontend per address and port).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Service {
    pub frontends: Vec<Frontend>,
    /// A LoadBalancer with externalTrafficPolicy: Local: the port where
    /// this node answers the cloud load balancer's health check (kube-proxy's
    /// service health server): 200 while the service has a ready endpoint
    /// on this node.
    pub health_check_node_port: Option<u16>,
}

impl Service {
    /// Distinct addresses of this node's ready endpoints, over every
    /// frontend (what kube-proxy's health check counts).
    pub fn local_ready_endpoints(&self) -> usize {
        let mut ips: Vec<std::net::IpAddr> = self
            .frontends
            .iter()
            .flat_map(|f| f.backends.iter())
            .filter(|b| b.local && b.state == BackendState::Active)
            .map(|b| b.address)
            .collect();
        ips.sort();
        ips.dedup();
        ips.len()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    pub address: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub kind: FrontendKind,
    pub port_name: Option<String>,
    pub algorithm: Algorithm,
    /// sessionAffinity: ClientIP timeout, when set.
    pub affinity_timeout_s: Option<u32>,
    /// externalTrafficPolicy: Local on an external frontend: traffic from
    /// outside the node may use only node-local backends (published as a
    /// second, node-local view of the frontend). Clients on the node itself
    /// use `backends`, as with kube-proxy.
    pub external_traffic_local: bool,
    /// The backends clients on this node use (already filtered to local ones
    /// for internalTrafficPolicy: Local).
    pub backends: Vec<Backend>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    pub address: IpAddr,
    pub port: u16,
    pub state: BackendState,
    /// Runs on this node (used by `Local` traffic policies).
    pub local: bool,
    /// Relative share for Maglev (at least 1).
    pub weight: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Tcp => lb_common::proto::TCP,
            Protocol::Udp => lb_common::proto::UDP,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            lb_common::proto::TCP => Some(Protocol::Tcp),
            lb_common::proto::UDP => Some(Protocol::Udp),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum FrontendKind {
    ClusterIP,
    NodePort,
    LoadBalancer,
    ExternalIP,
}

impl FrontendKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            FrontendKind::ClusterIP => "ClusterIP",
            FrontendKind::NodePort => "NodePort",
            FrontendKind::LoadBalancer => "LoadBalancer",
            FrontendKind::ExternalIP => "ExternalIP",
        }
    }
}

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum BackendState {
    #[default]
    Active,
    /// Serving but terminating: used only while no backend is active (KEP-1669).
    Terminating,
    /// Kept but never selected.
    Maintenance,
}

impl BackendState {
    pub const fn as_str(self) -> &'static str {
        match self {
            BackendState::Active => "active",
            BackendState::Terminating => "terminating",
            BackendState::Maintenance => "maintenance",
        }
    }
}

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    #[default]
    Random,
    Maglev,
}
