//! What the watches have seen, and what changed since the last output.
//!
//! * Nothing is output before the Service, EndpointSlice and Node lists are
//!   all complete: a partial view must never prune.
//! * A (re)list replaces a resource's objects at its `InitDone`; the next
//!   output is then a full model, so the reconciler prunes what the relist no
//!   longer has.
//! * Otherwise the output is the changes of the services touched since the
//!   last one (debouncing is the caller's job).
//! * Two services claiming the same frontend (an externalIP, say): the
//!   service whose name sorts first keeps it, the other gets a warning; when
//!   the owner lets go, the other takes over (`crate::model::claims`).
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    time::SystemTime,
};

use k8s_openapi::api::core::v1::Node;
use smallvec::SmallVec;

use super::slim::{EndpointSlice, Service as K8sService};
use kube::runtime::watcher::Event;

use super::port_names::PortNames;
use super::translate::{
    self, service_name, slice_service, NodeContext, ServiceRecord, SliceRecord, Warning,
};
use crate::model::{
    claims::{frontend_id, FrontendClaims, FrontendId},
    Model, Service, ServiceName,
};

use crate::maps::Family;
use crate::source::{nodeports::NodePortAddresses, Trigger};

struct Relist<K> {
    buffer: Option<Vec<K>>,
    synced: bool,
}

impl<K> Default for Relist<K> {
    fn default() -> Self {
        Self {
            buffer: None,
            synced: false,
        }
    }
}

/// A slice as the store files it: its key, the service it belongs to (from
/// its label) and its record.
struct Filed {
    key: ServiceName,
    owner: Option<ServiceName>,
    record: SliceRecord,
    /// The slice's address type (None: FQDN), for its trigger time only:
    /// not kept in the record.
    family: Option<Family>,
}

pub struct Store {
    node_name: String,
    nodeports: NodePortAddresses,
    /// This node's Node as last seen: its addresses are picked again when
    /// the node's own addresses change (`set_local_addresses`).
    node_object: Option<Node>,
    node: NodeContext,
    /// The services that are for us (not headless, ExternalName or another
    /// proxy's), as records: what the translation reads, parsed.
    services: HashMap<ServiceName, ServiceRecord>,
    /// service → its slices by name
    slices: HashMap<ServiceName, SliceSet>,
    /// slice (its namespace and name, as a `ServiceName`) → the service it
    /// was filed under
    slice_owner: HashMap<ServiceName, ServiceName>,
    svc_relist: Relist<(ServiceName, Option<ServiceRecord>)>,
    slice_relist: Relist<Filed>,
    node_relist: Relist<Node>,
    dirty: BTreeSet<ServiceName>,
    full_pending: bool,
    /// frontend → services that want it; the first by name owns it.
    claims: FrontendClaims,
    /// What each service asked for and was given last.
    sent: HashMap<ServiceName, Sent>,
    warnings: Vec<Warning>,
    eligible: Option<bool>,
    /// Port names, one copy each, shared by the records.
    port_names: PortNames,
    /// When this store started: trigger times before it are not ours to
    /// measure (kube-proxy's endpointsChangeTracker.trackerStartTime).
    started: SystemTime,
    /// `last-change-trigger-time`s of slices changed since the last take.
    triggers: Vec<Trigger>,
}

/// The EndpointSlice controller's stamp of when the change that produced a
/// slice happened (a Pod or Service write), kube-proxy's start point for
/// `network_programming_duration_seconds`.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The node label topology hints are matched against.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

/// kube-proxy's NodeEligible (pkg/proxy/healthcheck/proxy_health.go): no
/// deletionTimestamp, no ToBeDeletedByClusterAutoscaler taint.
pub fn node_eligible(n: &Node) -> bool {
    n.metadata.deletion_timestamp.is_none()
        && !n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|t| t.key == "ToBeDeletedByClusterAutoscaler")
}

impl Store {
    /// The algorithm of Services without the annotation (--lb-algorithm).
    pub fn with_default_algorithm(mut self, algorithm: crate::model::Algorithm) -> Self {
        self.node.default_algorithm = algorithm;
        self
    }

    pub fn new(node_name: &str, nodeports: NodePortAddresses) -> Self {
        Self {
            node_name: node_name.to_string(),
            nodeports,
            node_object: None,
            node: NodeContext {
                name: node_name.to_string(),
                nodeport_addresses: Vec::new(),
                zone: String::new(),
                default_algorithm: Default::default(),
            },
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_owner: HashMap::new(),
            svc_relist: Relist::default(),
            slice_relist: Relist::default(),
            node_relist: Relist::default(),
            dirty: BTreeSet::new(),
            full_pending: false,
            claims: FrontendClaims::default(),
            sent: HashMap::new(),
            warnings: Vec::new(),
            eligible: None,
            port_names: PortNames::default(),
            started: SystemTime::now(),
            triggers: Vec::new(),
        }
    }

    /// Trigger times of the slice changes output so far (taken once): the
    /// agent measures from each to the moment the maps hold the change.
    pub fn take_triggers(&mut self) -> Vec<Trigger> {
        std::mem::take(&mut self.triggers)
    }

    /// Notes `new`'s trigger time when it is not the one the stored version
    /// of the slice has, and not older than the store.
    fn note_trigger(&mut self, new: &Filed) {
        let (Some(t), Some(family)) = (new.record.trigger, new.family) else {
            return;
        };
        let old = self.stored_slice(&new.key).and_then(|s| s.trigger);
        if old != Some(t) && t >= self.started {
            self.triggers.push(Trigger { at: t, family });
        }
    }

    fn stored_slice(&self, key: &ServiceName) -> Option<&SliceRecord> {
        let owner = self.slice_owner.get(key)?;
        self.slices.get(owner)?.get(key.name())
    }

    /// Every list has completed at least once.
    pub fn ready(&self) -> bool {
        self.svc_relist.synced && self.slice_relist.synced && self.node_relist.synced
    }

    /// Something is waiting to be output.
    pub fn has_output(&self) -> bool {
        self.ready() && (self.full_pending || !self.dirty.is_empty())
    }

    pub fn node(&self) -> &NodeContext {
        &self.node
    }

    /// A Service event. What the store keeps of a Service is its record,
    /// made as the object arrives (a list's objects too): the object itself
    /// goes at once.
    pub fn on_service(&mut self, ev: Event<K8sService>) {
        match ev {
            Event::Apply(s) => {
                let name = self.held_name(service_name(&s));
                self.dirty.insert(name.clone());
                match ServiceRecord::new(&s, &mut self.port_names) {
                    Some(r) => self.services.insert(name, r),
                    None => self.services.remove(&name),
                };
            }
            Event::Delete(s) => {
                let name = service_name(&s);
                self.dirty.insert(name.clone());
                self.services.remove(&name);
            }
            Event::Init => self.svc_relist.buffer = Some(Vec::new()),
            Event::InitApply(s) => self.svc_relist.buffer.get_or_insert_with(Vec::new).push((
                service_name(&s),
                ServiceRecord::new(&s, &mut self.port_names),
            )),
            Event::InitDone => {
                let items = self.svc_relist.buffer.take().unwrap_or_default();
                // Sized once for the list: a map grown by doubling leaves its
                // old tables as holes in the heap.
                let mut services = HashMap::with_capacity(items.len());
                for (name, r) in items {
                    if let Some(r) = r {
                        services.insert(self.held_name(name), r);
                    }
                }
                self.services = services;
                self.svc_relist.synced = true;
                self.full_pending = true;
            }
        }
    }

    /// `name`, or the same name as the store already holds it (a service's
    /// key, else its slices' owner): one shared text per service instead of
    /// a copy for each map, whichever of the lists arrives first.
    fn held_name(&self, name: ServiceName) -> ServiceName {
        if let Some((held, _)) = self.services.get_key_value(&name) {
            return held.clone();
        }
        match self.slices.get_key_value(&name) {
            Some((held, _)) => held.clone(),
            None => name,
        }
    }

    /// Takes slice `key` out of `owner`'s set, and the set out of the map
    /// when it was the last: an empty set would keep a deleted service's
    /// name until the next relist, and a churn of services with new names
    /// would grow the map without bound.
    fn unfile(&mut self, owner: &ServiceName, key: &ServiceName) {
        if let Some(m) = self.slices.get_mut(owner) {
            m.remove(key.name());
            if m.0.is_empty() {
                self.slices.remove(owner);
            }
        }
    }

    /// The record of a slice, filed under its service.
    fn file(&mut self, s: &EndpointSlice) -> Filed {
        Filed {
            key: slice_key(s),
            owner: slice_service(s),
            record: SliceRecord::new(s, &self.node_name, &mut self.port_names),
            family: match s.address_type.as_str() {
                "IPv4" => Some(Family::V4),
                "IPv6" => Some(Family::V6),
                _ => None,
            },
        }
    }

    pub fn on_slice(&mut self, ev: Event<EndpointSlice>) {
        match ev {
            Event::Apply(s) => {
                let f = self.file(&s);
                drop(s);
                self.note_trigger(&f);
                self.put_slice(f);
            }
            Event::Delete(s) => {
                let key = slice_key(&s);
                if let Some(owner) = self.slice_owner.remove(&key) {
                    self.unfile(&owner, &key);
                    self.dirty.insert(owner);
                }
            }
            Event::Init => self.slice_relist.buffer = Some(Vec::new()),
            Event::InitApply(s) => {
                let f = self.file(&s);
                drop(s);
                self.slice_relist
                    .buffer
                    .get_or_insert_with(Vec::new)
                    .push(f);
            }
            Event::InitDone => {
                let items = self.slice_relist.buffer.take().unwrap_or_default();
                // A relist after a broken watch carries the changes the
                // watch missed: their trigger times count too.
                if self.slice_relist.synced {
                    for s in &items {
                        self.note_trigger(s);
                    }
                }
                self.slices = HashMap::with_capacity(items.len());
                self.slice_owner = HashMap::with_capacity(items.len());
                for s in items {
                    self.put_slice(s);
                }
                self.slice_relist.synced = true;
                self.full_pending = true;
            }
        }
    }

    fn put_slice(&mut self, f: Filed) {
        let Filed {
            key, owner, record, ..
        } = f;
        // A slice can move to another service only by a label change: file it anew.
        if let Some(old) = self.slice_owner.remove(&key) {
            self.unfile(&old, &key);
            self.dirty.insert(old);
        }
        if let Some(owner) = owner {
            let owner = self.held_name(owner);
            self.dirty.insert(owner.clone());
            self.slices
                .entry(owner.clone())
                .or_default()
                .insert(&key, record);
            self.slice_owner.insert(key, owner);
        }
    }

    pub fn on_node(&mut self, ev: Event<Node>) {
        match ev {
            Event::Apply(n) | Event::InitApply(n) => {
                if n.metadata.name.as_deref() == Some(self.node_name.as_str()) {
                    self.set_node_addresses(node_addresses(&n, &self.nodeports));
                    self.node_object = Some(n.clone());
                    let zone = n
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_ZONE))
                        .cloned()
                        .unwrap_or_default();
                    self.set_zone(zone);
                    self.eligible = Some(node_eligible(&n));
                }
            }
            Event::Delete(n) => {
                if n.metadata.name.as_deref() == Some(self.node_name.as_str()) {
                    self.set_node_addresses(Vec::new());
                    self.node_object = None;
                    self.eligible = Some(false);
                }
            }
            Event::Init => {}
            Event::InitDone => self.node_relist.synced = true,
        }
    }

    fn set_zone(&mut self, zone: String) {
        if zone != self.node.zone {
            self.node.zone = zone;
            // Topology hints of every service may now select differently.
            self.dirty.extend(self.services.keys().cloned());
        }
    }

    /// Whether this node should take traffic from cloud load balancers, as
    /// kube-proxy's NodeEligible: not being deleted, not marked by the
    /// cluster autoscaler. None until the Node was seen.
    pub fn node_eligible(&self) -> Option<bool> {
        self.eligible
    }

    /// This node's own addresses changed (an address added to a device or
    /// removed): the NodePorts follow, picked again from the Node as last
    /// seen. True when the NodePort addresses changed.
    pub fn set_local_addresses(&mut self, local: Vec<IpAddr>) -> bool {
        self.nodeports = self.nodeports.with_local(local);
        match &self.node_object {
            Some(n) => {
                let picked = node_addresses(n, &self.nodeports);
                self.set_node_addresses(picked)
            }
            None => false,
        }
    }

    /// True when they changed.
    fn set_node_addresses(&mut self, addresses: Vec<IpAddr>) -> bool {
        if addresses == self.node.nodeport_addresses {
            return false;
        }
        self.node.nodeport_addresses = addresses;
        // NodePort frontends of every service may change.
        self.dirty.extend(self.services.keys().cloned());
        true
    }

    /// Warnings gathered since the last call.
    pub fn take_warnings(&mut self) -> Vec<Warning> {
        std::mem::take(&mut self.warnings)
    }

    /// The full model (after a (re)list) or the changed services. None while
    /// not ready or when nothing changed.
    pub fn take_output(&mut self) -> Option<Output> {
        if !self.ready() {
            return None;
        }
        if self.full_pending {
            self.full_pending = false;
            self.dirty.clear();
            self.claims.clear();
            self.sent.clear();
            let mut names: Vec<ServiceName> = self.services.keys().cloned().collect();
            names.sort();
            // Claims settle in name order, and a full build claims in name
            // order from nothing: no service takes a frontend from one built
            // before it, nothing is woken, one pass builds all. The
            // map is built from the sorted pairs at once: full B-tree nodes,
            // where inserting one by one leaves them half full.
            let mut built = Vec::with_capacity(names.len());
            for name in names {
                if let Some(svc) = self.build(&name, &mut BTreeSet::new()) {
                    built.push((name, svc));
                }
            }
            let model = Model {
                services: built.into_iter().collect(),
            };
            for (name, svc) in &model.services {
                self.sent.entry(name.clone()).or_default().print = Some(fingerprint(svc));
            }
            // After a relist: names only deleted objects had.
            self.port_names.prune();
            return Some(Output::Full(model));
        }
        if self.dirty.is_empty() {
            return None;
        }
        let mut todo = std::mem::take(&mut self.dirty);
        let mut changes = BTreeMap::new();
        while let Some(name) = todo.pop_first() {
            let mut woken = BTreeSet::new();
            let svc = self.build(&name, &mut woken);
            todo.extend(woken);
            let now = svc.as_ref().map(fingerprint);
            if self.sent.get(&name).and_then(|s| s.print) != now {
                match now {
                    Some(f) => self.sent.entry(name.clone()).or_default().print = Some(f),
                    None => {
                        self.sent.remove(&name);
                    }
                }
                changes.insert(name, svc);
            }
        }
        if changes.is_empty() {
            return None;
        }
        Some(Output::Changes(changes.into_iter().collect()))
    }

    /// Translates one service and resolves frontend claims. Services whose
    /// ownership of a frontend changes because of this one go to `woken`.
    fn build(&mut self, name: &ServiceName, woken: &mut BTreeSet<ServiceName>) -> Option<Service> {
        let translated = self.services.get(name).and_then(|svc| {
            let slices = self.slices.get(name).into_iter().flat_map(SliceSet::values);
            let t = translate::translate_records(name, svc, slices, &self.node);
            self.warnings.extend(t.warnings);
            t.service
        });
        let wanted: Vec<FrontendId> = translated
            .iter()
            .flat_map(|s| s.frontends.iter().map(frontend_id))
            .collect();
        // Let go of frontends no longer wanted; the next claimant takes over.
        let asked = self
            .sent
            .get_mut(name)
            .map(|s| std::mem::take(&mut s.asked))
            .unwrap_or_default();
        for &id in &asked {
            if !wanted.contains(&id) {
                woken.extend(self.claims.release(id, name));
            }
        }
        let mut svc = translated?;
        for id in &wanted {
            // We sort first: the previous owner loses the frontend.
            woken.extend(self.claims.claim(*id, name));
        }
        // (From a slice: exact room, where `from_vec` would keep the vector's spare.)
        self.sent.entry(name.clone()).or_default().asked = SmallVec::from_slice(&wanted);
        let claims = &self.claims;
        let mut lost = Vec::new();
        svc.frontends.retain(|f| {
            let owner = claims.owner(&frontend_id(f));
            let ours = owner == Some(name);
            if !ours {
                lost.push(format!(
                    "{}:{}/{} (owned by {})",
                    f.address,
                    f.port,
                    f.protocol.as_str(),
                    owner.map_or("?".into(), std::string::ToString::to_string)
                ));
            }
            ours
        });
        for l in lost {
            self.warnings.push(Warning {
                reason: "frontend-conflict",
                message: format!("{name}: frontend {l} is already taken; skipped"),
            });
        }
        Some(svc)
    }
}

/// What the store last asked and output for a service.
#[derive(Default)]
struct Sent {
    /// The frontends it claimed (one inline: most services have one port
    /// and one address, and a block per service is 48 B of RSS).
    asked: SmallVec<[FrontendId; 1]>,
    /// A fingerprint of the service as output, to skip no-op changes (the
    /// reconciler holds the service itself: no second copy here).
    print: Option<u64>,
}

/// A service's slices by name: almost always one, so a small vector, not a
/// map (a B-tree's first node alone would take a dozen slices' room). Each
/// slice is named by its key, the text `slice_owner` holds too (shared).
#[derive(Default)]
struct SliceSet(Vec<(ServiceName, SliceRecord)>);

impl SliceSet {
    fn get(&self, name: &str) -> Option<&SliceRecord> {
        self.0
            .iter()
            .find(|(n, _)| n.name() == name)
            .map(|(_, s)| s)
    }

    fn insert(&mut self, key: &ServiceName, slice: SliceRecord) {
        match self.0.iter_mut().find(|(n, _)| n.name() == key.name()) {
            Some((_, old)) => *old = slice,
            None => {
                // Room for exactly one more: a first push would reserve four
                // (320 B where one slice of a service is the rule).
                self.0.reserve_exact(1);
                self.0.push((key.clone(), slice));
                // Sorted by name, as the map was: the translation's order.
                self.0.sort_by(|a, b| a.0.name().cmp(b.0.name()));
            }
        }
    }

    fn remove(&mut self, name: &str) {
        self.0.retain(|(n, _)| n.name() != name);
    }

    fn values(&self) -> impl Iterator<Item = &SliceRecord> {
        self.0.iter().map(|(_, s)| s)
    }
}

/// A fingerprint of a translated service: equal services, equal prints
/// (SipHash with fixed keys; a collision, 2^-64 for one change, would hold
/// that one change back until the service changes again or is relisted).
fn fingerprint(s: &Service) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::hash::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

pub enum Output {
    Full(Model),
    Changes(Vec<(ServiceName, Option<Service>)>),
}

/// A slice's namespace and name (in one shared string, as a service's).
fn slice_key(s: &EndpointSlice) -> ServiceName {
    ServiceName::new(
        s.metadata.namespace.as_deref().unwrap_or_default(),
        s.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The addresses that serve NodePorts, like kube-proxy's
/// --nodeport-addresses: `primary`, the node's first InternalIP of each
/// family; otherwise every local address of the node (or, when they are not
/// known, its InternalIP and ExternalIP addresses), limited to the CIDRs
/// when some are given.
pub fn node_addresses(node: &Node, cfg: &NodePortAddresses) -> Vec<IpAddr> {
    let listed = |types: &[&str]| -> Vec<IpAddr> {
        node.status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| types.contains(&a.type_.as_str()))
            .filter_map(|a| a.address.parse().ok())
            .collect()
    };
    let internal = listed(&["InternalIP"]);
    cfg.pick(&internal, &listed(&["InternalIP", "ExternalIP"]))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn svc(name: &str, ip: &str, external: &[&str]) -> K8sService {
        // The apiserver never hands out a nodePort twice: derive one per name.
        let node_port = 30000 + name.bytes().map(u32::from).sum::<u32>() % 2000;
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": ip, "externalIPs": external, "type": "NodePort",
                     "ports": [{"name": "http", "port": 80, "nodePort": node_port}]}
        }))
        .unwrap()
    }

    fn slice(name: &str, service: &str, ips: &[&str]) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": ips.iter().map(|ip| json!({"addresses": [ip]})).collect::<Vec<_>>(),
            "ports": [{"name": "http", "port": 8080}]
        }))
        .unwrap()
    }

    fn node(ips: &[&str]) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "node-a"},
            "status": {"addresses": ips.iter().map(|ip| json!({"type": "InternalIP", "address": ip})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn a_service_and_its_slices_share_one_copy_of_its_name_whichever_list_comes_first() {
        let shared = |s: &Store| {
            let (key, _) = s.services.iter().next().expect("a service");
            let (owner, _) = s.slices.iter().next().expect("a slice set");
            let filed = s.slice_owner.values().next().expect("a slice's owner");
            key.shares_text_with(owner) && owner.shares_text_with(filed)
        };
        // Services listed first, then slices (the usual order).
        let s = synced(
            vec![svc("a", "10.96.0.1", &[])],
            vec![slice("a-1", "a", &["10.244.0.1"])],
        );
        assert!(shared(&s), "slices listed after the service");
        // Slices first: the service takes the name its slices hold.
        let mut s = Store::new("node-a", NodePortAddresses::default());
        s.on_slice(Event::Init);
        s.on_slice(Event::InitApply(slice("a-1", "a", &["10.244.0.1"])));
        s.on_slice(Event::InitDone);
        s.on_service(Event::Init);
        s.on_service(Event::InitApply(svc("a", "10.96.0.1", &[])));
        s.on_service(Event::InitDone);
        assert!(shared(&s), "service listed after its slices");
        // A service created by a watch event after its slice.
        let mut s = synced(vec![], vec![slice("a-1", "a", &["10.244.0.1"])]);
        s.on_service(Event::Apply(svc("a", "10.96.0.1", &[])));
        assert!(shared(&s), "service watched after its slice");
    }

    /// Services created and deleted with their slices, each with a new
    /// name, leave nothing behind in any of the store's maps.
    #[test]
    fn a_churn_of_services_with_new_names_leaves_no_entry_behind() {
        let mut s = synced(vec![], vec![]);
        for i in 0..50 {
            let name = format!("churn-{i}");
            let svc = svc(&name, &format!("10.96.1.{i}"), &[]);
            let sl = slice(&format!("{name}-1"), &name, &["10.244.0.1"]);
            s.on_service(Event::Apply(svc.clone()));
            s.on_slice(Event::Apply(sl.clone()));
            let _ = s.take_output();
            s.on_slice(Event::Delete(sl));
            s.on_service(Event::Delete(svc));
            let _ = s.take_output();
        }
        assert_eq!(
            (
                s.services.len(),
                s.slices.len(),
                s.slice_owner.len(),
                s.sent.len(),
                s.claims.len()
            ),
            (0, 0, 0, 0, 0),
            "services, slice sets, slice owners, sent, claims"
        );
    }

    fn synced(services: Vec<K8sService>, slices: Vec<EndpointSlice>) -> Store {
        let mut s = Store::new("node-a", NodePortAddresses::default());
        s.on_service(Event::Init);
        for x in services {
            s.on_service(Event::InitApply(x));
        }
        s.on_service(Event::InitDone);
        s.on_slice(Event::Init);
        for x in slices {
            s.on_slice(Event::InitApply(x));
        }
        s.on_slice(Event::InitDone);
        s.on_node(Event::Init);
        s.on_node(Event::InitApply(node(&["192.168.1.10"])));
        s.on_node(Event::InitDone);
        s
    }

    fn n(name: &str) -> ServiceName {
        ServiceName::new("default", name)
    }

    fn stamped(mut s: EndpointSlice, at: SystemTime) -> EndpointSlice {
        s.metadata.annotations = Some(
            [(
                ANNOTATION_TRIGGER_TIME.to_string(),
                humantime::format_rfc3339_nanos(at).to_string(),
            )]
            .into(),
        );
        s
    }

    #[test]
    fn trigger_times_are_taken_once_per_new_stamp_and_never_from_before_the_start() {
        let before = SystemTime::now() - std::time::Duration::from_secs(60);
        let mut s = synced(
            vec![svc("a", "10.96.0.1", &[])],
            vec![stamped(slice("a-1", "a", &["10.244.0.1"]), before)],
        );
        assert!(
            s.take_triggers().is_empty(),
            "the initial list is not a change of ours to time"
        );
        s.on_slice(Event::Apply(stamped(
            slice("a-1", "a", &["10.244.0.2"]),
            before,
        )));
        assert!(
            s.take_triggers().is_empty(),
            "a change made before the agent started"
        );
        let t = SystemTime::now();
        s.on_slice(Event::Apply(stamped(slice("a-1", "a", &["10.244.0.3"]), t)));
        let got = s.take_triggers();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].family, Family::V4, "the slice's address type");
        let skew = got[0].at.duration_since(t).unwrap_or_else(|e| e.duration());
        assert!(
            skew < std::time::Duration::from_millis(1),
            "parsed back to {got:?}, wrote {t:?}"
        );
        assert!(s.take_triggers().is_empty(), "taken once");
        // The same stamp again (a label edit, a resync) is not a new change.
        s.on_slice(Event::Apply(stamped(slice("a-1", "a", &["10.244.0.3"]), t)));
        assert!(s.take_triggers().is_empty());
        // A relist that brings a change the watch missed counts it.
        let later = SystemTime::now() + std::time::Duration::from_millis(5);
        s.on_slice(Event::Init);
        s.on_slice(Event::InitApply(stamped(
            slice("a-1", "a", &["10.244.0.4"]),
            later,
        )));
        s.on_slice(Event::InitDone);
        assert_eq!(s.take_triggers().len(), 1);
    }

    /// The store keeps records, not objects: a change to what the
    /// translation does not read (kubectl's last-applied annotation, other
    /// labels, a selector) outputs nothing; a change it reads outputs the
    /// service; a service that stops being ours (headless) is removed.
    #[test]
    fn only_changes_the_translation_reads_are_output_and_a_service_made_headless_goes() {
        let mut s = synced(
            vec![svc("a", "10.96.0.1", &[])],
            vec![slice("a-1", "a", &["10.244.0.1"])],
        );
        assert!(matches!(s.take_output(), Some(Output::Full(_))));
        // The same spec, with kubectl's annotation, other labels and
        // managedFields: decoded without them, nothing to output.
        let node_port = 30000 + "a".bytes().map(u32::from).sum::<u32>() % 2000;
        let noisy: K8sService = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "default",
                         "labels": {"app": "web", "tier": "x"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"clusterIP": "10.96.0.1", "externalIPs": [], "type": "NodePort",
                     "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "nodePort": node_port}]}
        }))
        .unwrap();
        assert_eq!(noisy.metadata.labels, None, "unknown labels are not kept");
        assert_eq!(noisy.metadata.annotations, None);
        s.on_service(Event::Apply(noisy));
        assert!(s.take_output().is_none(), "a no-op change was output");
        // A new endpoint: the service goes out.
        s.on_slice(Event::Apply(slice(
            "a-1",
            "a",
            &["10.244.0.1", "10.244.0.2"],
        )));
        match s.take_output() {
            Some(Output::Changes(c)) => {
                assert_eq!(c.len(), 1);
                assert_eq!(c[0].1.as_ref().unwrap().frontends[0].backends.len(), 2);
            }
            _ => panic!("the endpoint change was not output"),
        }
        // Headless now: not ours any more, removed.
        let headless: K8sService = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}
        }))
        .unwrap();
        s.on_service(Event::Apply(headless));
        match s.take_output() {
            Some(Output::Changes(c)) => assert_eq!(c, vec![(n("a"), None)]),
            _ => panic!("the headless service was not removed"),
        }
    }

    #[test]
    fn nothing_is_output_until_every_list_is_complete() {
        let mut s = Store::new("node-a", NodePortAddresses::default());
        s.on_service(Event::Init);
        s.on_service(Event::InitApply(svc("a", "10.96.0.1", &[])));
        s.on_service(Event::InitDone);
        s.on_slice(Event::Init);
        s.on_slice(Event::InitApply(slice("a-1", "a", &["10.244.0.1"])));
        assert!(
            s.take_output().is_none(),
            "slices not listed yet: no prune on a partial view"
        );
        s.on_slice(Event::InitDone);
        assert!(s.take_output().is_none(), "node not listed yet");
        s.on_node(Event::Init);
        s.on_node(Event::InitApply(node(&["192.168.1.10"])));
        s.on_node(Event::InitDone);
        let Some(Output::Full(model)) = s.take_output() else {
            panic!("full model expected")
        };
        let fe = &model.services[&n("a")].frontends;
        assert_eq!(
            fe.len(),
            3,
            "ClusterIP, and NodePorts on the node address and on 127.0.0.1"
        );
        assert_eq!(fe[0].backends.len(), 1);
        assert!(s.take_output().is_none());
    }

    #[test]
    fn a_slice_change_outputs_only_its_service() {
        let mut s = synced(
            vec![svc("a", "10.96.0.1", &[]), svc("b", "10.96.0.2", &[])],
            vec![slice("a-1", "a", &["10.244.0.1"])],
        );
        s.take_output();
        s.on_slice(Event::Apply(slice(
            "a-1",
            "a",
            &["10.244.0.1", "10.244.0.2"],
        )));
        let Some(Output::Changes(changes)) = s.take_output() else {
            panic!()
        };
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].0, n("a"));
        assert_eq!(
            changes[0].1.as_ref().unwrap().frontends[0].backends.len(),
            2
        );
        // The same object again is not a change.
        s.on_slice(Event::Apply(slice(
            "a-1",
            "a",
            &["10.244.0.1", "10.244.0.2"],
        )));
        assert!(s.take_output().is_none());
        s.on_service(Event::Delete(svc("b", "10.96.0.2", &[])));
        let Some(Output::Changes(changes)) = s.take_output() else {
            panic!()
        };
        assert_eq!(changes, vec![(n("b"), None)]);
    }

    #[test]
    fn a_relist_outputs_a_full_model_without_what_it_lost() {
        let mut s = synced(
            vec![svc("a", "10.96.0.1", &[]), svc("b", "10.96.0.2", &[])],
            vec![],
        );
        s.take_output();
        // e.g. after 410 Gone: b was deleted while the watch was down.
        s.on_service(Event::Init);
        s.on_service(Event::InitApply(svc("a", "10.96.0.1", &[])));
        assert!(s.take_output().is_none(), "mid-relist: nothing");
        s.on_service(Event::InitDone);
        let Some(Output::Full(model)) = s.take_output() else {
            panic!()
        };
        assert_eq!(
            model.services.keys().cloned().collect::<Vec<_>>(),
            vec![n("a")]
        );
    }

    #[test]
    fn a_contested_external_ip_goes_to_the_first_service_and_passes_on_when_released() {
        let mut s = synced(
            vec![
                svc("a", "10.96.0.1", &["203.0.113.5"]),
                svc("b", "10.96.0.2", &["203.0.113.5"]),
            ],
            vec![],
        );
        let Some(Output::Full(model)) = s.take_output() else {
            panic!()
        };
        let has_ext = |m: &Service| {
            m.frontends
                .iter()
                .any(|f| f.address.to_string() == "203.0.113.5")
        };
        assert!(has_ext(&model.services[&n("a")]));
        assert!(!has_ext(&model.services[&n("b")]));
        assert_eq!(
            s.take_warnings()
                .iter()
                .filter(|w| w.reason == "frontend-conflict")
                .count(),
            1
        );

        s.on_service(Event::Delete(svc("a", "10.96.0.1", &["203.0.113.5"])));
        let Some(Output::Changes(changes)) = s.take_output() else {
            panic!()
        };
        let map: BTreeMap<_, _> = changes.into_iter().collect();
        assert_eq!(map[&n("a")], None);
        assert!(
            has_ext(map[&n("b")].as_ref().unwrap()),
            "b takes the released frontend over"
        );
    }

    #[test]
    fn node_address_change_moves_nodeport_frontends_and_cidrs_filter_them() {
        let mut s = synced(vec![svc("a", "10.96.0.1", &[])], vec![]);
        s.take_output();
        s.on_node(Event::Apply(node(&["192.168.1.10", "10.0.0.5"])));
        let Some(Output::Changes(changes)) = s.take_output() else {
            panic!()
        };
        let fe = &changes[0].1.as_ref().unwrap().frontends;
        // The two node addresses and 127.0.0.1 (a localhost NodePort; no
        // ::1 for an IPv4 service).
        let mut nodeports: Vec<IpAddr> = fe
            .iter()
            .filter(|f| f.kind == crate::model::FrontendKind::NodePort)
            .map(|f| f.address)
            .collect();
        nodeports.sort();
        assert_eq!(
            nodeports,
            ["10.0.0.5", "127.0.0.1", "192.168.1.10"].map(|a| a.parse::<IpAddr>().unwrap())
        );

        let mut s = Store::new(
            "node-a",
            NodePortAddresses {
                cidrs: vec!["10.0.0.0/8".parse().unwrap()],
                ..Default::default()
            },
        );
        s.on_node(Event::InitApply(node(&["192.168.1.10", "10.0.0.5"])));
        assert_eq!(
            s.node().nodeport_addresses,
            vec!["10.0.0.5".parse::<IpAddr>().unwrap()]
        );
    }

    /// An address added to the node at run time serves NodePorts, one
    /// removed stops: the NodePort addresses are picked again from the
    /// Node as last seen, and every service is sent again.
    #[test]
    fn the_nodes_own_addresses_changing_moves_its_nodeport_addresses() {
        let ips = |l: &[&str]| -> Vec<IpAddr> { l.iter().map(|a| a.parse().unwrap()).collect() };
        let mut s = Store::new(
            "node-a",
            NodePortAddresses::from_flags(&[], ips(&["192.168.1.10"])),
        );
        s.on_service(Event::Init);
        s.on_service(Event::InitApply(svc("a", "10.96.0.1", &[])));
        s.on_service(Event::InitDone);
        s.on_slice(Event::Init);
        s.on_slice(Event::InitDone);
        s.on_node(Event::Init);
        s.on_node(Event::InitApply(node(&["192.168.1.10"])));
        s.on_node(Event::InitDone);
        assert!(s.take_output().is_some());
        assert_eq!(
            s.node().nodeport_addresses,
            ips(&["127.0.0.1", "192.168.1.10", "::1"])
        );
        s.set_local_addresses(ips(&["192.168.1.10", "192.168.1.11", "fe80::1"]));
        assert_eq!(
            s.node().nodeport_addresses,
            ips(&["127.0.0.1", "192.168.1.10", "192.168.1.11", "::1"])
        );
        assert!(s.has_output(), "the services are sent again");
        s.take_output();
        s.set_local_addresses(ips(&["192.168.1.11"]));
        assert_eq!(
            s.node().nodeport_addresses,
            ips(&["127.0.0.1", "192.168.1.11", "::1"])
        );
        // The same addresses again: nothing to send.
        s.take_output();
        s.set_local_addresses(ips(&["192.168.1.11"]));
        assert!(!s.has_output());
    }
}
