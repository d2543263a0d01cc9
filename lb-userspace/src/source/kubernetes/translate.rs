//! Kubernetes Service + EndpointSlices → model, with kube-proxy's semantics.
//!
//! * frontends: every clusterIP, nodePort on the node's addresses,
//!   status.loadBalancer.ingress IPs, externalIPs; one per address and port;
//! * backends: EndpointSlice endpoints whose port has the service port's name
//!   (that is how a named targetPort resolves: the EndpointSlice controller
//!   writes the resolved number under the service port's name);
//! * conditions (KEP-1669): ready serves; serving and terminating serves only
//!   while no endpoint is ready; anything else never;
//! * topology (kube-proxy's pkg/proxy/topology.go): when every ready
//!   endpoint carries node hints and one is for this node, cluster traffic
//!   stays on the endpoints hinted for this node (PreferSameNode); else the
//!   same with zone hints and this node's zone (PreferSameZone); else no
//!   topology. The EndpointSlice controller writes the hints from
//!   `trafficDistribution` or the topology-mode annotation; kube-proxy, and
//!   this, read only the hints;
//! * internalTrafficPolicy: Local keeps only this node's endpoints for
//!   ClusterIPs; externalTrafficPolicy: Local publishes a node-local view for
//!   traffic from outside (clients on the node keep every endpoint, as with
//!   kube-proxy);
//! * skipped, with a warning: headless and ExternalName services, services
//!   owned by another proxy (`service.kubernetes.io/service-proxy-name`),
//!   SCTP ports, addresses that do not parse.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use super::port_names::PortNames;
use super::slim::{EndpointSlice, Service as K8sService};

use crate::model::{
    expand::{port_frontends, Port, Shape},
    Algorithm, Backend, BackendState, ForwardingMode, FrontendKind, Protocol, Service, ServiceName,
};

pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
pub const LABEL_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label selector of the watches, as kube-proxy's informers.
pub const WATCH_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
/// Per-service backend selection: `random` (default) or `maglev`.
pub const ANNOTATION_ALGORITHM: &str = "lb.dev/algorithm";
/// A Maglev service's table size M, one of `MAGLEV_PRIMES` (unset: the
/// agent's --maglev-table-size). Larger tables move fewer flows when a
/// backend goes (docs/benchmarks.md, section 4), at 4·M bytes each.
pub const ANNOTATION_MAGLEV_TABLE_SIZE: &str = "lb.dev/maglev-table-size";

/// `snat` or `dsr`: how the service's NodePort, LoadBalancer and external-IP
/// traffic reaches remote backends, over the agent's --lb-mode (Cilium's
/// `service.cilium.io/forwarding-mode`): a service whose clients must see
/// replies from the node they reached opts out of DSR, one that needs the
/// client's address opts in.
pub const ANNOTATION_FORWARDING_MODE: &str = "lb.dev/forwarding-mode";

/// `"true"`: the service's frontends' traffic counters are exported as
/// lb_service_* metrics (opt-in: one series per frontend and counter).
pub const ANNOTATION_METRICS: &str = "lb.dev/metrics";

/// Kubernetes' default sessionAffinity timeout: 3 hours.
const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// What the translation needs to know about this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeContext {
    pub name: String,
    /// Addresses that serve NodePorts (the node's addresses, filtered by --nodeport-addresses).
    pub nodeport_addresses: Vec<IpAddr>,
    /// The node's `topology.kubernetes.io/zone` label ("" when unset).
    pub zone: String,
    /// Algorithm of Services without the algorithm annotation (--lb-algorithm,
    /// Cilium's loadBalancer.algorithm).
    pub default_algorithm: Algorithm,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Short stable code, used as a metric label.
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// None: nothing of this service is for us (headless, ExternalName, other proxy).
    pub service: Option<Service>,
    pub warnings: Vec<Warning>,
}

pub fn service_name(svc: &K8sService) -> ServiceName {
    ServiceName::new(
        svc.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        svc.metadata.name.clone().unwrap_or_default(),
    )
}

/// The service an EndpointSlice belongs to, from its label.
pub fn slice_service(slice: &EndpointSlice) -> Option<ServiceName> {
    let labels = slice.metadata.labels.as_ref()?;
    if labels.contains_key(LABEL_HEADLESS) {
        return None;
    }
    let name = labels.get(LABEL_SERVICE_NAME)?;
    Some(ServiceName::new(
        slice
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name.clone(),
    ))
}

fn warn(warnings: &mut Vec<Warning>, reason: &'static str, message: String) {
    warnings.push(Warning { reason, message });
}

fn parse_ip(text: &str) -> Option<IpAddr> {
    let ip: IpAddr = text.trim().parse().ok()?;
    (!ip.is_unspecified() && !ip.is_multicast()).then_some(ip)
}

/// What the store keeps of a Service: what the translation reads, parsed
/// and checked once (addresses, ports, policies, annotations), with the
/// warnings that parsing gave, which every translation repeats as it did
/// when it parsed the object itself. Kept per service as long as it exists:
/// a few hundred bytes instead of the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRecord {
    load_balancer: bool,
    /// ClusterIPs, external IPs and (LoadBalancer) ingress IPs, with their
    /// kinds, first of each address kept.
    addresses: Box<[(IpAddr, FrontendKind)]>,
    ports: Box<[PortRecord]>,
    affinity_timeout_s: Option<u32>,
    internal_local: bool,
    external_local: bool,
    /// The algorithm annotation when it names one we know; None: the
    /// node's default (absent, or not one we know: see `Rare`).
    algorithm: Option<Algorithm>,
    health_check_node_port: Option<u16>,
    /// The metrics annotation says "true".
    metrics: bool,
    /// What few services have, behind one pointer: the record of a plain
    /// service stays small (56 B instead of 120 B, kept per service).
    rare: Option<Box<Rare>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rare {
    source_ranges: Box<[crate::net::Cidr]>,
    /// The maglev-table-size annotation, as written.
    maglev_table_size: Option<Box<str>>,
    /// An algorithm annotation that is not one we know, as written (warned
    /// about at every translation, with the node's default used).
    unknown_algorithm: Option<Box<str>>,
    /// The forwarding-mode annotation when it names one we know (here: few
    /// services have it, and the record stays 56 B).
    forwarding: Option<ForwardingMode>,
    /// The same annotation when it names none (the agent's mode used).
    unknown_forwarding: Option<Box<str>>,
    /// A metrics annotation that is neither "true" nor "false", as written
    /// (warned about; not exported).
    unknown_metrics: Option<Box<str>>,
    warnings: Box<[Warning]>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct PortRecord {
    index: u16,
    /// Shared with every port of that name (`PortNames`).
    name: Arc<str>,
    port: u16,
    protocol: Protocol,
    node_port: Option<u16>,
}

/// What the store keeps of an EndpointSlice: its ports and its endpoints'
/// first addresses, conditions, locality and hints, parsed once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceRecord {
    ports: Box<[SlicePort]>,
    endpoints: Box<[EndpointRecord]>,
    /// Endpoint addresses that are not IP addresses, warned about at each
    /// translation of a port the slice serves.
    invalid: Option<Box<[Box<str>]>>,
    /// `endpoints.kubernetes.io/last-change-trigger-time` (RFC 3339 in UTC,
    /// as the controller writes it: time.RFC3339Nano); None when absent or
    /// unreadable.
    pub trigger: Option<std::time::SystemTime>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct SlicePort {
    /// Shared with every port of that name (`PortNames`).
    name: Arc<str>,
    /// None: a protocol the load balancer does not serve.
    protocol: Option<Protocol>,
    /// None: no port, or 0 or out of range.
    port: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct EndpointRecord {
    address: IpAddr,
    state: BackendState,
    /// On this node (the agent's node: its name does not change).
    local: bool,
    hints: Option<Box<Hints>>,
}

impl SliceRecord {
    /// The record of `slice` for the agent on node `node_name`.
    pub fn new(slice: &EndpointSlice, node_name: &str, names: &mut PortNames) -> Self {
        let trigger = slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(super::store::ANNOTATION_TRIGGER_TIME))
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            // FQDN slices are not load-balanced.
            return Self {
                trigger,
                ..Default::default()
            };
        }
        let ports = slice
            .ports
            .iter()
            .flatten()
            .map(|p| SlicePort {
                name: names.get(p.name.as_deref().unwrap_or("")),
                protocol: Protocol::from_name(p.protocol.as_deref().unwrap_or("TCP")),
                port: p
                    .port
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p != 0),
            })
            .collect();
        let mut invalid = Vec::new();
        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        for ep in &slice.endpoints {
            let c = ep.conditions.as_ref();
            // API semantics: nil ready means ready; nil serving means as ready; nil terminating means false.
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            // Neither: not ready, or terminating and no longer serving. No
            // new flow goes there, but the flows it has keep it until the
            // endpoint leaves the slice (graceful drain; kube-proxy's
            // conntrack entries do the same).
            let state = if ready {
                BackendState::Active
            } else if serving && terminating {
                BackendState::Terminating
            } else {
                BackendState::Maintenance
            };
            // Consumers use the first address (EndpointSlice API).
            let Some(text) = ep.addresses.first() else {
                continue;
            };
            let Some(address) = parse_ip(text) else {
                invalid.push(text.as_str().into());
                continue;
            };
            let hints = ep.hints.as_ref().map(|h| {
                Box::new(Hints {
                    zones: h
                        .for_zones
                        .iter()
                        .flatten()
                        .map(|z| z.name.clone())
                        .collect(),
                    nodes: h
                        .for_nodes
                        .iter()
                        .flatten()
                        .map(|n| n.name.clone())
                        .collect(),
                })
            });
            endpoints.push(EndpointRecord {
                address,
                state,
                local: !node_name.is_empty() && ep.node_name.as_deref() == Some(node_name),
                hints,
            });
        }
        Self {
            ports,
            endpoints: endpoints.into_boxed_slice(),
            invalid: (!invalid.is_empty()).then(|| invalid.into_boxed_slice()),
            trigger,
        }
    }
}

impl ServiceRecord {
    /// The record of `svc`; None when nothing of it is for us (headless,
    /// ExternalName, another proxy's, no spec).
    pub fn new(svc: &K8sService, names: &mut PortNames) -> Option<Self> {
        let name = service_name(svc);
        let mut warnings = Vec::new();
        let spec = svc.spec.as_ref()?;
        if svc
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_PROXY_NAME))
        {
            return None;
        }
        let svc_type = spec.type_.as_deref().unwrap_or("ClusterIP");
        if svc_type == "ExternalName" {
            return None;
        }
        if spec.cluster_ip.as_deref() == Some("None") {
            return None;
        }
        let load_balancer = svc_type == "LoadBalancer";

        // Frontend addresses by kind.
        let mut addresses: Vec<(IpAddr, FrontendKind)> = Vec::new();
        let cluster_ips: Vec<&String> = match &spec.cluster_ips {
            Some(ips) if !ips.is_empty() => ips.iter().collect(),
            _ => spec.cluster_ip.iter().collect(),
        };
        let mut add = |text: &str, kind: FrontendKind, field: &str, warnings: &mut Vec<Warning>| {
            match parse_ip(text) {
                Some(ip) if !addresses.iter().any(|(a, _)| *a == ip) => addresses.push((ip, kind)),
                Some(_) => {}
                None => warn(
                    warnings,
                    "invalid-address",
                    format!("{name}: {field} {text:?} is not a usable IP address; skipped"),
                ),
            }
        };
        for ip in cluster_ips {
            add(
                ip,
                FrontendKind::ClusterIP,
                "spec.clusterIPs",
                &mut warnings,
            );
        }
        for ip in spec.external_ips.iter().flatten() {
            add(
                ip,
                FrontendKind::ExternalIP,
                "spec.externalIPs",
                &mut warnings,
            );
        }
        if load_balancer {
            let ingress = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref());
            for ing in ingress.into_iter().flatten() {
                // ipMode Proxy (KEP-1860): the load balancer proxies; do not short-circuit its IP.
                if ing.ip_mode.as_deref() == Some("Proxy") {
                    continue;
                }
                if let Some(ip) = &ing.ip {
                    add(
                        ip,
                        FrontendKind::LoadBalancer,
                        "status.loadBalancer.ingress.ip",
                        &mut warnings,
                    );
                }
            }
        }

        let affinity_timeout_s =
            (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
                spec.session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds)
                    .map_or(DEFAULT_AFFINITY_TIMEOUT, |t| t.clamp(1, 86_400) as u32)
            });
        // The apiserver validates them; one that does not parse anyway is
        // skipped loudly, as kube-proxy does.
        let mut source_ranges = Vec::new();
        for text in spec.load_balancer_source_ranges.iter().flatten() {
            match text.trim().parse::<crate::net::Cidr>() {
                Ok(c) => source_ranges.push(c),
                Err(e) => warn(
                    &mut warnings,
                    "invalid-source-range",
                    format!("{name}: spec.loadBalancerSourceRanges: {e}; skipped"),
                ),
            }
        }
        let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
        let external_local = spec.external_traffic_policy.as_deref() == Some("Local");
        let annotation = |key: &str| {
            svc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(String::as_str)
        };
        let (algorithm, unknown_algorithm) = match annotation(ANNOTATION_ALGORITHM) {
            None => (None, None),
            Some("random") => (Some(Algorithm::Random), None),
            Some("maglev") => (Some(Algorithm::Maglev), None),
            Some(other) => (None, Some(other.into())),
        };
        let maglev_table_size = annotation(ANNOTATION_MAGLEV_TABLE_SIZE).map(|v| v.trim().into());
        let (forwarding, unknown_forwarding) =
            match annotation(ANNOTATION_FORWARDING_MODE).map(str::trim) {
                None => (None, None),
                Some("snat") => (Some(ForwardingMode::Snat), None),
                Some("dsr") => (Some(ForwardingMode::Dsr), None),
                Some(other) => (None, Some(other.into())),
            };

        let (metrics, unknown_metrics) = match annotation(ANNOTATION_METRICS).map(str::trim) {
            None | Some("false") => (false, None),
            Some("true") => (true, None),
            Some(other) => (false, Some(other.into())),
        };

        let mut ports = Vec::new();
        let mut seen_ports = BTreeSet::new();
        for (i, port) in spec.ports.iter().flatten().enumerate() {
            let named = port.protocol.as_deref().unwrap_or("TCP");
            let Some(protocol) = Protocol::from_name(named) else {
                warn(&mut warnings, "unsupported-protocol", format!("{name}: port {} is {named}, which the socket load balancer does not handle; skipped", port.port));
                continue;
            };
            let Ok(number) = u16::try_from(port.port) else {
                warn(
                    &mut warnings,
                    "invalid-port",
                    format!(
                        "{name}: spec.ports[{i}].port {} is out of range; skipped",
                        port.port
                    ),
                );
                continue;
            };
            if number == 0 || !seen_ports.insert((number, protocol)) {
                warn(
                    &mut warnings,
                    "invalid-port",
                    format!(
                        "{name}: spec.ports[{i}].port {number}/{} is zero or listed twice; skipped",
                        protocol.as_str()
                    ),
                );
                continue;
            }
            let node_port = match port
                .node_port
                .filter(|_| matches!(svc_type, "NodePort" | "LoadBalancer"))
            {
                None => None,
                Some(node_port) => match u16::try_from(node_port) {
                    Ok(np) if np != 0 => Some(np),
                    _ => {
                        warn(
                            &mut warnings,
                            "invalid-port",
                            format!("{name}: nodePort {node_port} is out of range; skipped"),
                        );
                        None
                    }
                },
            };
            ports.push(PortRecord {
                index: i as u16,
                name: names.get(port.name.as_deref().unwrap_or("")),
                port: number,
                protocol,
                node_port,
            });
        }
        let rare = Rare {
            source_ranges: source_ranges.into_boxed_slice(),
            maglev_table_size,
            unknown_algorithm,
            forwarding,
            unknown_forwarding,
            unknown_metrics,
            warnings: warnings.into_boxed_slice(),
        };
        Some(Self {
            load_balancer,
            addresses: addresses.into_boxed_slice(),
            ports: ports.into_boxed_slice(),
            affinity_timeout_s,
            internal_local,
            external_local,
            algorithm,
            health_check_node_port: (load_balancer && external_local)
                .then_some(spec.health_check_node_port)
                .flatten()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p != 0),
            metrics,
            rare: (rare != Rare::default()).then(|| Box::new(rare)),
        })
    }
}

/// Translates `svc` and its slices as they came from the apiserver (the
/// store keeps records instead and calls `translate_records`).
pub fn translate<'a>(
    svc: &K8sService,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node: &NodeContext,
) -> Translation {
    let mut names = PortNames::default();
    let Some(record) = ServiceRecord::new(svc, &mut names) else {
        return Translation::default();
    };
    let slices: Vec<SliceRecord> = slices
        .into_iter()
        .map(|s| SliceRecord::new(s, &node.name, &mut names))
        .collect();
    translate_records(&service_name(svc), &record, &slices, node)
}

pub fn translate_records<'a>(
    name: &ServiceName,
    svc: &ServiceRecord,
    slices: impl IntoIterator<Item = &'a SliceRecord>,
    node: &NodeContext,
) -> Translation {
    let rare = svc.rare.as_deref();
    let mut warnings: Vec<Warning> = rare.map(|r| r.warnings.to_vec()).unwrap_or_default();
    if let Some(other) = rare.and_then(|r| r.unknown_algorithm.as_deref()) {
        warn(&mut warnings, "invalid-annotation", format!("{name}: {ANNOTATION_ALGORITHM}: {other:?} is not random or maglev; using the default ({:?})", node.default_algorithm));
    }
    if let Some(other) = rare.and_then(|r| r.unknown_forwarding.as_deref()) {
        warn(&mut warnings, "invalid-annotation", format!("{name}: {ANNOTATION_FORWARDING_MODE}: {other:?} is not snat or dsr; using the agent's --lb-mode"));
    }
    if let Some(other) = rare.and_then(|r| r.unknown_metrics.as_deref()) {
        warn(&mut warnings, "invalid-annotation", format!("{name}: {ANNOTATION_METRICS}: {other:?} is not \"true\" or \"false\"; its counters are not exported"));
    }
    let algorithm = svc.algorithm.unwrap_or(node.default_algorithm);
    let maglev_table_size = match rare.and_then(|r| r.maglev_table_size.as_deref()) {
        None => None,
        Some(_) if algorithm != Algorithm::Maglev => {
            warn(&mut warnings, "invalid-annotation", format!("{name}: {ANNOTATION_MAGLEV_TABLE_SIZE} is set but the service does not use Maglev (set {ANNOTATION_ALGORITHM}: maglev); ignored"));
            None
        }
        Some(v) => match v.parse::<u32>() {
            Ok(m) if crate::desired::maglev::valid_size(m) => Some(m),
            _ => {
                warn(&mut warnings, "invalid-annotation", format!("{name}: {ANNOTATION_MAGLEV_TABLE_SIZE}: {v:?} is not one of {:?}; using the agent's --maglev-table-size", lb_common::maps::MAGLEV_PRIMES));
                None
            }
        },
    };

    let slices: Vec<&SliceRecord> = slices.into_iter().collect();
    let shape = Shape {
        addresses: &svc.addresses,
        nodeport_addresses: &node.nodeport_addresses,
        algorithm,
        maglev_table_size,
        affinity_timeout_s: svc.affinity_timeout_s,
        internal_local: svc.internal_local,
        external_local: svc.external_local,
        source_ranges: rare.map_or(&[][..], |r| &r.source_ranges),
        forwarding: rare.and_then(|r| r.forwarding),
    };
    let mut frontends = Vec::new();
    for port in &svc.ports {
        let hinted = backends_for_port(&slices, &port.name, port.protocol, name, &mut warnings);
        // (backend, allowed by topology for cluster traffic)
        let all = apply_topology(hinted, node);
        let p = Port {
            index: port.index,
            port: port.port,
            protocol: port.protocol,
            node_port: port.node_port,
        };
        port_frontends(&shape, &p, &all, &mut frontends);
    }
    frontends.sort_by_key(|a| (a.address, a.port, a.protocol));
    frontends.dedup_by(|a, b| (a.address, a.port, a.protocol) == (b.address, b.port, b.protocol));
    let mut service = Service {
        frontends,
        health_check_node_port: svc.health_check_node_port,
        metrics: svc.metrics,
    };
    // Shrunk here, as it is made: the spare room a shrink gives back is a
    // hole the next service's allocations fill. Shrunk later, when the
    // reconciler takes the whole model (`Model::shrink_to_fit`), every
    // service left a hole between live blocks that no page-sized trim can
    // return: 360 B of RSS per service at 100 000 services.
    service.shrink_to_fit();
    Translation {
        service: Some(service),
        warnings,
    }
}

/// An endpoint's topology hints (EndpointSlice `hints.forZones` /
/// `hints.forNodes`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Hints {
    zones: Vec<String>,
    nodes: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TopologyMode {
    None,
    SameNode,
    SameZone,
}

/// kube-proxy's topologyModeFromHints: over the ready endpoints, node hints
/// count when every one has some and one is for this node; then zone hints
/// the same way; else none.
fn topology_mode(eps: &[(Backend, Hints)], node: &NodeContext) -> TopologyMode {
    let ready: Vec<&Hints> = eps
        .iter()
        .filter(|(b, _)| b.state == BackendState::Active)
        .map(|(_, h)| h)
        .collect();
    if ready.is_empty() {
        return TopologyMode::None;
    }
    let all_node = ready.iter().all(|h| !h.nodes.is_empty());
    let for_node = ready.iter().any(|h| h.nodes.contains(&node.name));
    if all_node && for_node && !node.name.is_empty() {
        return TopologyMode::SameNode;
    }
    let all_zone = ready.iter().all(|h| !h.zones.is_empty());
    let for_zone = ready.iter().any(|h| h.zones.contains(&node.zone));
    if all_zone && for_zone && !node.zone.is_empty() {
        return TopologyMode::SameZone;
    }
    TopologyMode::None
}

/// Marks the endpoints cluster traffic from this node may use: the ready
/// ones that topology allows (terminating ones stay, used only when none is
/// ready, and then without topology, as kube-proxy's CategorizeEndpoints).
fn apply_topology(eps: Vec<(Backend, Hints)>, node: &NodeContext) -> Vec<(Backend, bool)> {
    let mode = topology_mode(&eps, node);
    eps.into_iter()
        .map(|(b, h)| {
            let allowed = b.state != BackendState::Active
                || match mode {
                    TopologyMode::None => true,
                    TopologyMode::SameNode => h.nodes.contains(&node.name),
                    TopologyMode::SameZone => h.zones.contains(&node.zone),
                };
            (b, allowed)
        })
        .collect()
}

/// Backends of one service port from every slice, deduplicated (an endpoint
/// can sit in two slices while they are being rebalanced: the most usable
/// state wins), with their topology hints.
fn backends_for_port(
    slices: &[&SliceRecord],
    port_name: &str,
    protocol: Protocol,
    name: &ServiceName,
    warnings: &mut Vec<Warning>,
) -> Vec<(Backend, Hints)> {
    let mut by_addr: BTreeMap<(IpAddr, u16), (Backend, Hints)> = BTreeMap::new();
    for slice in slices {
        let Some(port) = slice
            .ports
            .iter()
            .find(|p| &*p.name == port_name && p.protocol == Some(protocol))
        else {
            continue;
        };
        let Some(number) = port.port else {
            continue;
        };
        for text in slice.invalid.iter().flatten() {
            warn(
                warnings,
                "invalid-address",
                format!("{name}: endpoint address {text:?} is not an IP address; skipped"),
            );
        }
        for ep in &slice.endpoints {
            let b = Backend {
                address: ep.address,
                port: number,
                state: ep.state,
                local: ep.local,
                weight: 1,
            };
            let hints = ep.hints.as_deref().cloned().unwrap_or_default();
            by_addr
                .entry((ep.address, number))
                .and_modify(|old| {
                    if b.state < old.0.state {
                        *old = (b.clone(), hints.clone());
                    }
                })
                .or_insert((b, hints));
        }
    }
    let mut out: Vec<(Backend, Hints)> = by_addr.into_values().collect();
    if out.len() > crate::model::MAX_BACKENDS_PER_FRONTEND {
        // Keep the most usable ones.
        out.sort_by(|(a, _), (b, _)| {
            (a.state, a.address, a.port).cmp(&(b.state, b.address, b.port))
        });
        warn(
            warnings,
            "too-many-endpoints",
            format!(
                "{name}: port {port_name:?} has {} endpoints; only the first {} are used",
                out.len(),
                crate::model::MAX_BACKENDS_PER_FRONTEND
            ),
        );
        out.truncate(crate::model::MAX_BACKENDS_PER_FRONTEND);
        out.sort_by(|(a, _), (b, _)| a.cmp(b));
    }
    out
}
