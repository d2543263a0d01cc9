//! The model: what services exist and where their backends are, independent
//! of where that knowledge came from (services file or apiserver) and of how
//! the data path stores it.
pub mod claims;
pub mod expand;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use serde::{Deserialize, Serialize};

/// Most backends one frontend can have: slots are numbered with a u16.
pub const MAX_BACKENDS_PER_FRONTEND: usize = u16::MAX as usize;

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

    /// Gives back the spare capacity of every service's vectors: a model
    /// is built by pushing (a `Vec` of one frontend holds room for four) and
    /// then kept for as long as it is the target.
    pub fn shrink_to_fit(&mut self) {
        for svc in self.services.values_mut() {
            svc.shrink_to_fit();
        }
    }

    pub fn frontend_count(&self) -> usize {
        self.services.values().map(|s| s.frontends.len()).sum()
    }
}

/// `namespace/name`, in one shared allocation: the reconciler keeps a name
/// per service in several indexes (target, owners, pending), and at 100 000
/// services two `String`s per copy were a third of the agent's memory. A
/// clone is a reference count; the text is `namespace/name` (neither part can
/// hold a `/`: both are DNS labels or subdomains).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ServiceName {
    text: std::sync::Arc<str>,
    /// Where the namespace ends in `text`.
    split: u32,
}

impl ServiceName {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        let (namespace, name) = (namespace.as_ref(), name.as_ref());
        let mut text = String::with_capacity(namespace.len() + 1 + name.len());
        text.push_str(namespace);
        text.push('/');
        text.push_str(name);
        Self {
            text: text.into(),
            split: namespace.len() as u32,
        }
    }

    pub fn namespace(&self) -> &str {
        &self.text[..self.split as usize]
    }

    pub fn name(&self) -> &str {
        &self.text[self.split as usize + 1..]
    }

    /// `namespace/name`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Both hold the one shared copy of the text (the store keeps one per
    /// service).
    #[cfg(test)]
    pub(crate) fn shares_text_with(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.text, &other.text)
    }
}

impl Ord for ServiceName {
    /// By namespace, then name (not by the joined text, where `a-b/x`
    /// would sort before `a/x`).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.namespace(), self.name()).cmp(&(other.namespace(), other.name()))
    }
}

impl PartialOrd for ServiceName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceName")
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .finish()
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Serialized as `{namespace, name}`, as before the names were joined.
#[derive(Serialize, Deserialize)]
struct ServiceNameParts<'a> {
    #[serde(borrow)]
    namespace: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
}

impl Serialize for ServiceName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ServiceNameParts {
            namespace: self.namespace().into(),
            name: self.name().into(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for ServiceName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let p = ServiceNameParts::deserialize(d)?;
        Ok(ServiceName::new(p.namespace, p.name))
    }
}

/// A service is a set of frontends; each frontend has its own backends
/// (a multi-port service has one frontend per address and port).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Service {
    pub frontends: Vec<Frontend>,
    /// A LoadBalancer with externalTrafficPolicy: Local: the port where
    /// this node answers the cloud load balancer's health check (kube-proxy's
    /// service health server): 200 while the service has a ready endpoint
    /// on this node.
    pub health_check_node_port: Option<u16>,
    /// Export its frontends' traffic counters as lb_service_* metrics (the
    /// `lb.dev/metrics: "true"` annotation, `metrics: true` in the services
    /// file): opt-in, so the metrics' cardinality is the operator's choice.
    pub metrics: bool,
}

impl Service {
    pub fn shrink_to_fit(&mut self) {
        self.frontends.shrink_to_fit();
        for fe in &mut self.frontends {
            fe.backends.shrink_to_fit();
        }
    }

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

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frontend {
    pub address: IpAddr,
    pub port: u16,
    /// Which port of its service this frontend serves (the position in the
    /// service's port list): the ClusterIP, NodePort, LoadBalancer and
    /// external-IP frontends of one service port share it, and with it
    /// their clients' sessionAffinity memory, as kube-proxy keeps one per
    /// service port.
    pub port_index: u16,
    pub protocol: Protocol,
    pub kind: FrontendKind,
    pub algorithm: Algorithm,
    /// The size M this service's Maglev table asks for (one of
    /// `MAGLEV_PRIMES`); None: the agent's --maglev-table-size.
    pub maglev_table_size: Option<u32>,
    /// sessionAffinity: ClientIP timeout, when set.
    pub affinity_timeout_s: Option<u32>,
    /// externalTrafficPolicy: Local on an external frontend: traffic from
    /// outside the node may use only node-local backends (published as a
    /// second, node-local view of the frontend). Clients on the node itself
    /// use `backends`, as with kube-proxy.
    pub external_traffic_local: bool,
    /// loadBalancerSourceRanges of a LoadBalancer frontend, of its family:
    /// new flows from outside only from these networks (empty: from anywhere).
    pub source_ranges: Vec<crate::net::Cidr>,
    /// The service's own forwarding to remote backends (NodePort,
    /// LoadBalancer and external-IP frontends); None: the agent's --lb-mode.
    pub forwarding: Option<ForwardingMode>,
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

    /// A Kubernetes protocol name the load balancer handles (`as_str`'s
    /// inverse); SCTP and anything else: None.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            _ => None,
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

/// How a frontend's flows to remote backends are forwarded when the
/// service says so (over the agent's `--lb-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForwardingMode {
    Snat,
    Dsr,
}

/// Whether a service with these addresses has NodePorts on the node
/// address `node`: when the address families of its ClusterIPs (Kubernetes'
/// `spec.ipFamilies`) include `node`'s. A service without ClusterIPs (a
/// services-file service of external addresses only) goes by the families
/// of all its addresses.
pub fn serves_family(addresses: &[(IpAddr, FrontendKind)], node: &IpAddr) -> bool {
    let cluster = addresses.iter().any(|(_, k)| *k == FrontendKind::ClusterIP);
    addresses
        .iter()
        .filter(|(_, k)| !cluster || *k == FrontendKind::ClusterIP)
        .any(|(a, _)| a.is_ipv4() == node.is_ipv4())
}

/// A frontend's share of a Service's loadBalancerSourceRanges: only a
/// LoadBalancer address is restricted (kube-proxy's KUBE-FW chain), and only
/// by networks of its own family; host bits cleared, sorted, no duplicates.
pub fn source_ranges_for(
    kind: FrontendKind,
    address: IpAddr,
    ranges: &[crate::net::Cidr],
) -> Vec<crate::net::Cidr> {
    if kind != FrontendKind::LoadBalancer {
        return Vec::new();
    }
    let mut out: Vec<_> = ranges
        .iter()
        .filter(|c| c.address.is_ipv4() == address.is_ipv4())
        .map(super::net::Cidr::network)
        .collect();
    out.sort();
    out.dedup();
    out
}
