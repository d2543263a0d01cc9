//! Desired state: what the maps must hold for a set of services, computed
//! from the model, the stable ids and the current slot layout.
pub mod ids;
pub mod maglev;
pub mod slots;

use std::{collections::BTreeSet, sync::Arc};

use crate::collections::HashMap;

use lb_common::{
    backend::{
        BACKEND_FLAG_LOCAL, BACKEND_STATE_ACTIVE, BACKEND_STATE_MAINTENANCE,
        BACKEND_STATE_TERMINATING,
    },
    service::{
        ALG_MAGLEV, ALG_RANDOM, SCOPE_ALL, SCOPE_LOCAL, SVC_FLAG_AFFINITY, SVC_FLAG_CLUSTER_IP,
        SVC_FLAG_EXTERNAL_IP, SVC_FLAG_FOREIGN_EXTERNAL_IP, SVC_FLAG_LOAD_BALANCER,
        SVC_FLAG_NODE_PORT, SVC_FLAG_SOURCE_RANGES, SVC_FLAG_TWO_SCOPES,
    },
};

pub use ids::Ids;

use crate::{
    maps::{BackendEntry, MapState, RevNatEntry, ServiceValue, SvcKey},
    model::{Algorithm, BackendState, Frontend, FrontendKind, Service},
    net::Cidr,
};

/// Everything one frontend needs in the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    /// Master key (slot 0).
    pub key: SvcKey,
    /// Master value, counts included.
    pub value: ServiceValue,
    /// Backend id of slot i+1.
    pub slots: Vec<u32>,
    pub revnat: RevNatEntry,
    /// sessionAffinity: the backends the service may select now (the active
    /// ones, or the terminating ones when none is active); empty without affinity.
    pub affinity: Vec<u32>,
    /// sessionAffinity: the id a client's memory of its backend is kept
    /// under (LB_AFFINITY_GROUP), shared by every frontend of the same
    /// service port (its ClusterIP, NodePorts, LoadBalancer and external
    /// IPs), as kube-proxy keeps one per service port: the lowest service
    /// id among them. None without affinity.
    pub affinity_group: Option<u32>,
    /// The Maglev table, for services that use Maglev (built from the same
    /// selectable backends).
    pub maglev: Option<Arc<Vec<u32>>>,
    /// loadBalancerSourceRanges of a LoadBalancer frontend, in LB4_SRC_RANGES
    /// or LB6_SRC_RANGES under this frontend's service id.
    pub source_ranges: BTreeSet<Cidr>,
}

/// Settings the desired state depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildConfig {
    /// Size M of the Maglev tables of services that do not ask for one
    /// (`Frontend::maglev_table_size`).
    pub maglev_m: u32,
    /// What the node's own sockets and pods get for an external IP.
    pub external_ips_in_cluster: ExternalIpsInCluster,
    /// This node's own addresses: with `ExternalIpsInCluster::OwnedOnly`, an
    /// external IP among them is translated for sockets and pods too; any
    /// other is marked `SVC_FLAG_FOREIGN_EXTERNAL_IP` (CVE-2020-8554).
    pub node_addresses: std::sync::Arc<std::collections::BTreeSet<std::net::IpAddr>>,
    /// The cluster-wide seed of the Maglev tables (`--maglev-hash-seed`).
    pub maglev_seed: maglev::Seed,
    /// Frontends are marked `SVC_FLAG_STATS`: the programs count their
    /// traffic (`--service-stats`).
    pub service_stats: bool,
}

impl Default for BuildConfig {
    fn default() -> Self {
        Self {
            maglev_m: lb_common::maps::DEFAULT_MAGLEV_M,
            external_ips_in_cluster: ExternalIpsInCluster::default(),
            node_addresses: Default::default(),
            maglev_seed: maglev::Seed::default(),
            service_stats: true,
        }
    }
}

/// Whether a Service's `spec.externalIPs` are translated for the node's own
/// sockets and for pods (traffic from outside the node is served either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExternalIpsInCluster {
    /// Every external IP, owned by a node or not: Kubernetes' semantics and
    /// kube-proxy's (its KUBE-SERVICES rules match the address for every
    /// packet), which the upstream test "should be possible to connect to a
    /// service via ExternalIP when the external IP is not assigned to a
    /// node" checks. Who may write `externalIPs` is left to admission
    /// (`DenyServiceExternalIPs` or a policy), Kubernetes' answer to
    /// CVE-2020-8554.
    #[default]
    Translate,
    /// Only the external IPs this node owns; any other reaches the real
    /// address it names (Cilium's `sock4_skip_xlate`): a Service cannot
    /// take over an outside address for in-cluster clients (CVE-2020-8554),
    /// but pods also cannot reach a Service by an external IP that outside
    /// routers deliver to the nodes without a node holding it.
    OwnedOnly,
}

impl ExternalIpsInCluster {
    /// Whether this node's addresses decide anything (the agent only reads
    /// them, every round, when they do).
    pub fn needs_node_addresses(self) -> bool {
        self == Self::OwnedOnly
    }
}

impl DesiredFrontend {
    pub fn is_cluster_ip(&self) -> bool {
        self.value.flags & SVC_FLAG_CLUSTER_IP != 0
    }

    /// The value of slot `slot` (1-based).
    pub fn slot_value(&self, slot: usize) -> ServiceValue {
        ServiceValue {
            backend_id: self.slots[slot - 1],
            service_id: self.value.service_id,
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub frontends: Vec<DesiredFrontend>,
    /// Every backend the frontends above name.
    pub backends: HashMap<u32, BackendEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum DesiredError {
    #[error(transparent)]
    Ids(#[from] ids::IdsExhausted),
    /// The sources and the agent's flag check sizes first: a bug if seen.
    #[error("Maglev table size {0} is not one of {primes:?}", primes = lb_common::maps::MAGLEV_PRIMES)]
    MaglevSize(u32),
}

pub fn kind_flag(kind: FrontendKind) -> u16 {
    match kind {
        FrontendKind::ClusterIP => SVC_FLAG_CLUSTER_IP,
        FrontendKind::NodePort => SVC_FLAG_NODE_PORT,
        FrontendKind::LoadBalancer => SVC_FLAG_LOAD_BALANCER,
        FrontendKind::ExternalIP => SVC_FLAG_EXTERNAL_IP,
    }
}

fn state_byte(state: BackendState) -> u8 {
    match state {
        BackendState::Active => BACKEND_STATE_ACTIVE,
        BackendState::Terminating => BACKEND_STATE_TERMINATING,
        BackendState::Maintenance => BACKEND_STATE_MAINTENANCE,
    }
}

/// Adds the desired entries of `services` to `out`.
pub fn build<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    current: &MapState,
    ids: &mut Ids,
    cfg: &BuildConfig,
    out: &mut Desired,
) -> Result<(), DesiredError> {
    for service in services {
        let first = out.frontends.len();
        // The service port each new desired frontend belongs to, for
        // sessionAffinity (per family: a dual-stack port's IPv4 and IPv6
        // frontends reach different backends).
        let mut ports: Vec<Option<AffinityPort>> = Vec::new();
        for fe in &service.frontends {
            let port = fe.affinity_timeout_s.map(|_| AffinityPort::of(fe));
            let mut all = build_frontend(
                fe,
                SCOPE_ALL,
                &fe.backends,
                current,
                ids,
                cfg,
                &mut out.backends,
            )?;
            // externalTrafficPolicy: Local: a second, node-local view for
            // traffic from outside the node (the tc/XDP path reads scope 1).
            if fe.external_traffic_local {
                all.value.flags |= SVC_FLAG_TWO_SCOPES;
                let local: Vec<_> = fe.backends.iter().filter(|b| b.local).cloned().collect();
                let view = build_frontend(
                    fe,
                    SCOPE_LOCAL,
                    &local,
                    current,
                    ids,
                    cfg,
                    &mut out.backends,
                )?;
                // The local view first: the scope-0 master that names it
                // (SVC_FLAG_TWO_SCOPES) must never point at nothing.
                out.frontends.push(view);
                out.frontends.push(all);
                ports.push(port.clone());
                ports.push(port);
            } else {
                out.frontends.push(all);
                ports.push(port);
            }
        }
        let mut groups: HashMap<&AffinityPort, u32> = HashMap::default();
        for (i, port) in ports.iter().enumerate() {
            if let Some(p) = port {
                let id = out.frontends[first + i].value.service_id;
                let g = groups.entry(p).or_insert(id);
                *g = (*g).min(id);
            }
        }
        for (i, port) in ports.iter().enumerate() {
            out.frontends[first + i].affinity_group = port.as_ref().map(|p| groups[p]);
        }
    }
    Ok(())
}

/// What makes frontends of one service one service port for sessionAffinity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AffinityPort {
    port_index: u16,
    ipv4: bool,
}

impl AffinityPort {
    fn of(fe: &Frontend) -> Self {
        Self {
            port_index: fe.port_index,
            ipv4: fe.address.is_ipv4(),
        }
    }
}

fn build_frontend(
    fe: &Frontend,
    scope: u8,
    fe_backends: &[crate::model::Backend],
    current: &MapState,
    ids: &mut Ids,
    cfg: &BuildConfig,
    backends: &mut HashMap<u32, BackendEntry>,
) -> Result<DesiredFrontend, DesiredError> {
    let proto = fe.protocol.number();
    let key = SvcKey::new(fe.address, fe.port, proto, scope);
    let service_id = ids.service_id(&key)?;

    let mut maintenance = Vec::new();
    let mut active = Vec::new();
    let mut terminating = Vec::new();
    // For Maglev: stable name and weight of each selectable backend.
    let mut active_named = Vec::new();
    let mut terminating_named = Vec::new();
    for b in fe_backends {
        // A frontend only reaches backends of its own family.
        if b.address.is_ipv4() != fe.address.is_ipv4() {
            continue;
        }
        let entry = BackendEntry {
            address: b.address,
            port: b.port,
            proto,
            state: state_byte(b.state),
            flags: if b.local { BACKEND_FLAG_LOCAL } else { 0 },
        };
        let id = ids.backend_id(&entry)?;
        // The same endpoint in several services: the most usable state wins.
        backends
            .entry(id)
            .and_modify(|e| e.state = e.state.min(entry.state))
            .or_insert(entry);
        let (ids_list, named_list) = match b.state {
            BackendState::Active => (&mut active, &mut active_named),
            BackendState::Terminating => (&mut terminating, &mut terminating_named),
            BackendState::Maintenance => {
                // Graceful drain: in the table for the flows that have it,
                // never chosen (no Maglev entry, no affinity, no selectable slot).
                maintenance.push(id);
                continue;
            }
        };
        ids_list.push(id);
        // Names only where a table is built: formatting one per backend
        // is measurable in a full sync of a big cluster.
        if fe.algorithm == Algorithm::Maglev {
            named_list.push(maglev::MaglevBackend {
                name: format!("{}:{}/{}", b.address, b.port, fe.protocol.as_str()),
                id,
                weight: b.weight.max(1),
            });
        }
    }
    let previous = current.slots_of(&key);
    let mut slots = slots::plan(&previous, &active, &terminating);
    // Maintenance backends park after the selectable slots, in the order
    // they had (a backend staying in maintenance is not rewritten).
    if !maintenance.is_empty() {
        let had: HashMap<u32, usize> = previous
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, i))
            .collect();
        maintenance.sort_by_key(|id| (had.get(id).copied().unwrap_or(usize::MAX), *id));
        maintenance.dedup();
    }
    slots.extend(&maintenance);

    // The service's own table size, else the agent's (--maglev-table-size).
    let maglev_m = fe.maglev_table_size.unwrap_or(cfg.maglev_m);
    let mut flags = kind_flag(fe.kind);
    if fe.affinity_timeout_s.is_some() {
        flags |= SVC_FLAG_AFFINITY;
    }
    if fe.kind == FrontendKind::ExternalIP
        && cfg.external_ips_in_cluster == ExternalIpsInCluster::OwnedOnly
        && !cfg.node_addresses.contains(&fe.address)
    {
        flags |= SVC_FLAG_FOREIGN_EXTERNAL_IP;
    }
    if fe.kind == FrontendKind::NodePort && fe.address.is_loopback() {
        flags |= lb_common::service::SVC_FLAG_HOST_LOOPBACK;
    }
    // LB4_SRC_RANGES or LB6_SRC_RANGES by the frontend's family (the model
    // keeps only ranges of that family).
    let source_ranges: BTreeSet<Cidr> = fe.source_ranges.iter().copied().collect();
    if !source_ranges.is_empty() {
        flags |= SVC_FLAG_SOURCE_RANGES;
    }
    if cfg.service_stats {
        flags |= lb_common::service::SVC_FLAG_STATS;
    }
    flags |= match fe.forwarding {
        None => 0,
        Some(crate::model::ForwardingMode::Snat) => lb_common::service::SVC_FLAG_FORWARD_SNAT,
        Some(crate::model::ForwardingMode::Dsr) => lb_common::service::SVC_FLAG_FORWARD_DSR,
    };
    let value = ServiceValue {
        backend_id: maintenance.len() as u32,
        service_id,
        count: active.len() as u16,
        terminating_count: terminating.len() as u16,
        flags,
        algorithm: match fe.algorithm {
            Algorithm::Random => ALG_RANDOM,
            Algorithm::Maglev => ALG_MAGLEV,
        },
        maglev_size: if fe.algorithm == Algorithm::Maglev {
            lb_common::maps::maglev_size_code(maglev_m).ok_or(DesiredError::MaglevSize(maglev_m))?
        } else {
            0
        },
        affinity_timeout_s: fe.affinity_timeout_s.unwrap_or(0),
    };
    // No selectable backend, no table: the kernel refuses an empty array
    // (EINVAL), and the programs answer "no backend" from the counts first.
    let maglev_set = if active_named.is_empty() {
        &terminating_named
    } else {
        &active_named
    };
    let maglev = (fe.algorithm == Algorithm::Maglev && !maglev_set.is_empty())
        .then(|| Arc::new(maglev::build_seeded(maglev_set, maglev_m, &cfg.maglev_seed)));
    let affinity = match fe.affinity_timeout_s {
        None => Vec::new(),
        Some(_) if !active.is_empty() => active,
        Some(_) => terminating,
    };
    Ok(DesiredFrontend {
        key,
        value,
        slots,
        revnat: RevNatEntry {
            address: fe.address,
            port: fe.port,
        },
        affinity,
        affinity_group: None,
        maglev,
        source_ranges,
    })
}
